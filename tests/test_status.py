"""``runwatch status``: exact counts over SSH and locally, --json, --watch, a host that is down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from supervisor.cli import cli
from supervisor.cli.status import CLEAR, duration, human, render
from supervisor.model import DatasetView, HostView, Projection, RunView, Snapshot
from tests.fixtures_data import make_raw
from tests.fixtures_procs import FakeRuns
from tests.fixtures_sshd import SshdServer, free_port

ARGV = ["python3", "run_inference.py", "--datasets", "B1,B2", "--max-samples", "7000"]


def _q(value: Any) -> str:
    return json.dumps(value)


def write_config(path: Path, hosts: list[dict[str, Any]], runs: list[dict[str, Any]]) -> Path:
    lines = []
    for h in hosts:
        lines.append("[[hosts]]")
        lines.extend(f"{k} = {_q(v)}" for k, v in h.items())
        lines.append("")
    for r in runs:
        lines.append("[[runs]]")
        lines.extend(f"{k} = {_q(v)}" for k, v in r.items())
        lines.append("")
    lines += ["[datasets.B1]", "token_budget = 500", "max_samples = 7000", ""]
    lines += ["[datasets.B2]", "token_budget = 10000000", ""]
    path.write_text("\n".join(lines))
    return path


def ssh_host_table(server: SshdServer, name: str, **kw: Any) -> dict[str, Any]:
    table = {
        "name": name,
        "address": server.host,
        "port": server.port,
        "user": server.user,
        "known_hosts": str(server.known_hosts),
        "identity_files": [str(server.client_key)],
        "python": sys.executable,
        "ssh_config": str(server.dir / "empty_ssh_config"),
        "connect_timeout": 5.0,
    }
    table.update(kw)
    return table


def _run_block(text: str, run: str) -> list[str]:
    """The lines of one run in ``status`` text: its header and the indented lines under it."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"  {run}  "))
    block = [lines[start]]
    for ln in lines[start + 1 :]:
        if not ln.startswith("    "):
            break
        block.append(ln)
    return block


@pytest.fixture
def dataset_dir(tmp_path: Path) -> tuple[Path, Any]:
    work = tmp_path / "work"
    (work / "out" / "B1").mkdir(parents=True)
    truth = make_raw(work / "out" / "B1" / "raw_responses.jsonl", 64, seed=11, dup_every=9)
    return work, truth


@pytest.mark.ssh
def test_status_json_over_ssh_gives_exact_counts(
    sshd: SshdServer, tmp_path: Path, dataset_dir: tuple[Path, Any], fake_runs: FakeRuns
) -> None:
    work, truth = dataset_dir
    fake_runs.start(*ARGV[2:], cwd=work)
    cfg = write_config(
        tmp_path / "rw.toml",
        [ssh_host_table(sshd, "gpu")],
        [{"name": "gen", "host": "gpu", "workdir": str(work), "argv": ARGV}],
    )
    result = CliRunner().invoke(cli, ["status", "-c", str(cfg), "--json"])
    assert result.exit_code == 0, result.output
    snap = msgspec.json.decode(result.stdout.encode(), type=Snapshot)
    (host,) = snap.hosts
    assert host.connected and host.error is None
    (run,) = [r for r in host.runs if r.configured]  # other runs may exist on this machine
    assert run.state == "running" and run.process is not None
    b1, b2 = run.datasets
    assert (b1.records, b1.unique_ids, b1.duplicates) == (
        truth.records,
        len(truth.ids),
        truth.duplicates,
    )
    assert b1.completion_tokens == truth.completion_tokens
    assert b1.prompt_tokens == truth.prompt_tokens
    assert b1.finish_reasons == dict(truth.finish_reasons)
    assert b1.over_budget and b1.token_budget == 500
    assert b2.state == "missing"


@pytest.mark.ssh
def test_status_text_over_ssh(
    sshd: SshdServer, tmp_path: Path, dataset_dir: tuple[Path, Any]
) -> None:
    work, truth = dataset_dir
    cfg = write_config(
        tmp_path / "rw.toml",
        [ssh_host_table(sshd, "gpu")],
        [{"name": "gen", "host": "gpu", "workdir": str(work), "argv": ARGV}],
    )
    result = CliRunner().invoke(cli, ["status", "-c", str(cfg)])
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert text.startswith("gpu  connected  rtt ")
    assert "  gen  stopped" in text
    block = _run_block(text, "gen")  # other runs of this machine may write a B1 too
    (b1_line,) = [ln for ln in block if ln.strip().startswith("B1 ")]
    assert f"{len(truth.ids)}/7,000" in b1_line
    assert human(truth.completion_tokens) in b1_line
    assert "OVER BUDGET" in b1_line and f"{truth.duplicates} dup" in b1_line
    (b2_line,) = [ln for ln in block if ln.strip().startswith("B2 ")]
    assert "missing" in b2_line


@pytest.mark.ssh
def test_status_with_a_host_down_exits_1_and_shows_the_rest(
    sshd: SshdServer, tmp_path: Path, dataset_dir: tuple[Path, Any]
) -> None:
    work, truth = dataset_dir
    port = free_port()
    cfg = write_config(
        tmp_path / "rw.toml",
        [ssh_host_table(sshd, "gpu"), ssh_host_table(sshd, "gone", port=port)],
        [
            {"name": "gen", "host": "gpu", "workdir": str(work), "argv": ARGV},
            {"name": "other", "host": "gone", "workdir": str(work), "argv": ARGV},
        ],
    )
    result = CliRunner().invoke(cli, ["status", "-c", str(cfg)])
    assert result.exit_code == 1
    assert "gpu  connected" in result.stdout
    assert f"gone  DISCONNECTED\n  error: gone: connection refused by 127.0.0.1:{port}" in (
        result.stdout
    )
    assert human(truth.completion_tokens) in result.stdout


def test_status_watch_redraws_until_ctrl_c(tmp_path: Path, dataset_dir: tuple[Path, Any]) -> None:
    work, truth = dataset_dir
    cfg = write_config(
        tmp_path / "rw.toml",
        [{"name": "here", "local": True}],
        [{"name": "gen", "host": "here", "workdir": str(work), "argv": ARGV}],
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "status", "-c", str(cfg), "--watch", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parent.parent,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + 60
    try:
        while seen.count(CLEAR.encode()) < 3 and time.monotonic() < deadline:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            seen += chunk
        assert seen.count(CLEAR.encode()) >= 3, seen.decode(errors="replace")
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err
    frame = seen.decode().split(CLEAR)[-2]
    assert frame.startswith("here  connected")
    assert human(truth.completion_tokens) in frame


def test_render_shows_projection_and_stale_host() -> None:
    ds = DatasetView(
        name="B2",
        path="/d/out/B2/raw_responses.jsonl",
        records=2912,
        unique_ids=2912,
        completion_tokens=10_700_000,
        token_budget=10_000_000,
        max_samples=7000,
        over_budget=True,
        verdict="current",
        projection=Projection(
            eta_s=25_200.0, message="10.7 M / 10 M, +14 M projected over 7 h - no --token-budget"
        ),
    )
    now = 1_000_000.0
    snap = Snapshot(
        time=now,
        hosts=[
            HostView(
                name="gpu-box",
                connected=False,
                stale=True,
                error="gpu-box: connection lost during refresh: Keepalive timeout",
                last_ok=now - 42,
                runs=[RunView(name="eagle3-kimi", host="gpu-box", state="unknown", datasets=[ds])],
            )
        ],
    )
    text = render(snap)
    assert "gpu-box  DISCONNECTED  (stale: last ok 42 s ago)" in text
    assert "error: gpu-box: connection lost during refresh: Keepalive timeout" in text
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith("B2 ")]
    assert "2,912/7,000" in line and "10.7 M" in line and "107%" in line
    assert "7 h 00 m" in line and "OVER BUDGET" in line
    assert "! 10.7 M / 10 M, +14 M projected over 7 h - no --token-budget" in text
    assert duration(59) == "59 s" and duration(61) == "1 m 01 s" and human(None) == "-"
