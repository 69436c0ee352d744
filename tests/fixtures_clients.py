"""Runs of the SpecForge and Model-Optimizer stand-ins against a real mock server, for any test.

- ``ClientRun(root, kind, server_url, tokenizer, ...)``: a workdir holding the stand-in under its
  real script name (``scripts/regenerate_train_data.py`` or ``server_generate.py``), ShareGPT
  input (with a row the client files as an error and one it skips, for SpecForge), an ``out/``
  directory and a config (``runwatch.toml``) whose one run ``sf`` / ``mo`` is written the obvious
  way: its command line and its output file. ``.argv`` is that command line, ``.output`` the
  output file, ``.spawn()`` starts it as a person would (not through runwatch), ``.pids()`` lists
  its live processes (however started).
- ``client_server``: a paced mock server (about 0.4 s per response, reasoning on request).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.demo.prompts import prompt_records

DEMO = Path(__file__).resolve().parents[1] / "supervisor" / "demo"
STAND_INS = {
    "specforge": (DEMO / "specforge_regenerate.py", "scripts/regenerate_train_data.py"),
    "modelopt": (DEMO / "modelopt_server_generate.py", "server_generate.py"),
}


def _toml(s: str) -> str:
    return json.dumps(s)


class ClientRun:
    """A workdir and config for one run of a stand-in; see the module docstring."""

    def __init__(
        self,
        root: Path,
        kind: str,
        url: str,
        tokenizer: Path,
        *,
        rows: int = 40,
        extra: tuple[str, ...] = (),
        resume: bool = True,
        policy: str = "warn",
        budget: int | None = None,
        top: str = "",
        run_toml: str = "",
        settle: float = 0.5,
    ) -> None:
        self.kind = kind
        self.workdir = root / "work"
        self.workdir.mkdir(parents=True)
        source, script = STAND_INS[kind]
        (self.workdir / script).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, self.workdir / script)
        (self.workdir / "out").mkdir()
        records = prompt_records("B1", rows)
        input_rows: list[dict[str, Any]] = [
            {"id": r["sample_id"], "conversations": r["messages"]} for r in records
        ]
        if kind == "specforge":
            # One row the client files as an error, one it skips (empty conversations).
            input_rows[3] = {
                "id": "B1-000003",
                "conversations": [{"role": "assistant", "content": "hi"}],
            }
            input_rows[5] = {"id": "B1-000005", "conversations": []}
        self.input = self.workdir / "in.jsonl"
        self.input.write_text("".join(json.dumps(r) + "\n" for r in input_rows))
        address = url.split("//", 1)[1].split("/", 1)[0]
        if kind == "specforge":
            self.name, self.dataset = "sf", "regen"
            self.output = self.workdir / "out" / "regen.jsonl"
            self.argv = [
                sys.executable, script,
                "--model", "demo-model",
                "--server-address", address,
                "--input-file-path", "in.jsonl",
                "--output-file-path", "out/regen.jsonl",
                "--concurrency", "2",
                "--max-tokens", "2048",
                "--reasoning", "save",
                *(["--resume"] if resume else []),
                *extra,
            ]  # fmt: skip
        else:
            self.name, self.dataset = "mo", "gen"
            self.output = self.workdir / "out" / "gen.jsonl"
            self.argv = [
                sys.executable, script,
                "--data_path", "in.jsonl",
                "--output_path", "out/gen.jsonl",
                "--num_threads", "2",
                "--url", url,
                "--api_key", "sk-modelopt-secret-0123456789",
                "--model", "demo-model",
                *extra,
            ]  # fmt: skip
        lines = [
            f"tokenizer = {_toml(str(tokenizer))}",
            top,
            "[[hosts]]",
            'name = "local"',
            "local = true",
            f"python = {_toml(sys.executable)}",
            "",
            "[[runs]]",
            f'name = "{self.name}"',
            'host = "local"',
            f"workdir = {_toml(str(self.workdir))}",
            "argv = [" + ", ".join(_toml(a) for a in self.argv) + "]",
            f'log = "logs/{self.name}.log"',
            f'budget_policy = "{policy}"',
            f"settle_seconds = {settle}",
            run_toml,
            "",
        ]
        if budget is not None:
            lines += [f"[datasets.{self.dataset}]", f"token_budget = {budget}", ""]
        self.config_path = root / "runwatch.toml"
        self.config_path.write_text("\n".join(lines))

    @property
    def config(self) -> Any:
        from supervisor.config import load_config

        return load_config(self.config_path)

    def spawn(self, argv: list[str] | None = None) -> subprocess.Popen[bytes]:
        """Start the client as a person would, in the workdir, in its own session."""
        log = open(self.workdir / "manual.log", "ab")  # noqa: SIM115 - owned by the process
        return subprocess.Popen(
            argv or self.argv,
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )

    def pids(self) -> list[int]:
        """Live processes of the stand-in whose working directory is the run's workdir."""
        script = STAND_INS[self.kind][1].encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                cwd = os.readlink(f"/proc/{entry}/cwd")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if script in argv and cwd == str(self.workdir) and state != "Z":
                found.append(int(entry))
        return found

    def lines(self, path: Path | None = None) -> list[bytes]:
        try:
            return (path or self.output).read_bytes().splitlines(keepends=True)
        except FileNotFoundError:
            return []

    def sidecar(self, kind: str) -> Path:
        return self.output.with_name(f"{self.output.stem}_{kind}.jsonl")


@pytest.fixture
def client_server() -> Iterator[Any]:
    """A paced mock server: about 0.4 s per response however many a client sends at once (the
    aggregate rate is capped too), so a run stays mid-flight for a while."""
    from supervisor.demo.server import MockSettings, serve_in_thread

    settings = MockSettings(decode_tps=100.0, capacity_tps=100.0, mean_tokens=40, length_sigma=0.3)
    with serve_in_thread(settings) as handle:
        yield handle
