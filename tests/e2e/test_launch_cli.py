"""``runwatch launch``, ``restart`` and ``audit`` as a user runs them (real processes)."""

from __future__ import annotations

import json
import shlex
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_actions import (
    API_KEY,
    DemoRun,
    legacy_record,
    pid_alive,
    run_pids,
    runwatch,
    sha256_of,
)
from tests.waiting import wait_until


def test_no_terminal_and_no_yes_refuses(
    tmp_path: Path, state_home: Path, slow_endpoint: Any
) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url)
    for cmd in ("launch", "restart"):
        out = runwatch(cmd, "demo", "-c", str(demo.config_path))
        assert out.returncode == 2, out.stderr
        assert "no terminal" in out.stderr and "--yes" in out.stderr
    assert run_pids(demo.workdir) == []
    bad = runwatch("launch", "demo", "-c", str(demo.config_path), "--set", "token-budget", "--yes")
    assert bad.returncode == 1 and "--token-budget: needs a value" in bad.stdout, bad.stdout
    assert run_pids(demo.workdir) == []


def test_dry_run_json_changes_nothing(tmp_path: Path, state_home: Path, slow_endpoint: Any) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url)
    out = runwatch("launch", "demo", "-c", str(demo.config_path), "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["ok"] is True and result["dry_run"] is True and result["identity"] is None
    assert [(s["name"], s["ok"]) for s in result["steps"]] == [
        ("preflight", True),
        ("format-check", True),
        ("fingerprint", True),
        ("writers", True),
        ("quiet", True),
        ("data-repair", True),
        ("launch", True),
    ]
    assert result["steps"][-1]["detail"].startswith("dry run: would launch")
    assert run_pids(demo.workdir) == []
    assert not (demo.workdir / "data").exists()
    assert not (state_home / "audit.jsonl").exists()


def test_the_plan_quotes_the_command_line_it_shows(
    tmp_path: Path, state_home: Path, slow_endpoint: Any
) -> None:
    """A value with shell metacharacters is shown quoted, so that what a user reads (or pastes
    into a shell) is the argv that would run, and nothing else."""
    demo = DemoRun(tmp_path, slow_endpoint.url)
    value = "a;touch pwned $(id) `x` 'q"
    args = ("launch", "demo", "-c", str(demo.config_path), "--set", f"model={value}", "--dry-run")
    as_json = json.loads(runwatch(*args, "--json").stdout)
    text = runwatch(*args).stdout
    (shown,) = [ln for ln in text.splitlines() if ln.startswith("  new argv: ")]
    assert shlex.split(shown.removeprefix("  new argv: ")) == as_json["argv"]
    assert value in as_json["argv"]
    (would,) = [ln for ln in text.splitlines() if "would launch " in ln]
    assert shlex.split(would.split("would launch ", 1)[1]) == as_json["argv"]
    assert run_pids(demo.workdir) == []


def test_the_story_from_the_cli(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    cfg = str(demo.config_path)
    launched = runwatch("launch", "demo", "-c", cfg, "--yes", "--json")
    assert launched.returncode == 0, launched.stderr + launched.stdout
    first = json.loads(launched.stdout)
    pid = first["identity"]["pid"]
    assert pid_alive(pid) and first["ok"] is True
    assert API_KEY not in launched.stdout + launched.stderr
    assert API_KEY.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    wait_until(lambda: len(demo.complete_ids("B1")) >= 1, timeout=60)

    twice = runwatch("launch", "demo", "-c", cfg, "--yes")
    assert twice.returncode == 1 and "already running" in twice.stderr
    assert "runwatch restart demo" in twice.stderr

    # older data of B2 blocks the restart: the old run keeps running, the file keeps its bytes
    legacy = demo.data_file("B2")
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"".join(legacy_record(f"B2-{i:06d}") for i in range(3)))
    digest = sha256_of(legacy)
    blocked = runwatch("restart", "demo", "-c", cfg, "--yes", "--set", "token-budget=10000000")
    assert blocked.returncode == 1
    text = blocked.stdout
    assert "new argv:" in text and "--token-budget: (absent) -> 10000000" in text
    assert "[FAILED] format-check" in text and str(legacy) in text and "legacy" in text
    assert "--move-aside" in text
    assert pid_alive(pid) and sha256_of(legacy) == digest

    # moved aside, it kills, proves the exit, relaunches and confirms
    done = runwatch(
        "restart", "demo", "-c", cfg, "--yes", "--move-aside", "--set", "token-budget=10000000"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("format-check", "fingerprint", "writers", "stop", "data-repair", "launch"):
        assert f"[ok] {name}" in done.stdout
    assert "[skip] gpu-release: no nvidia-smi on the host" in done.stdout
    assert "demo is running on local: pid" in done.stdout
    assert not pid_alive(pid)
    (moved,) = legacy.parent.glob("raw_responses.jsonl.legacy-*")
    assert sha256_of(moved) == digest
    assert API_KEY not in done.stdout + done.stderr

    log = runwatch("audit", "--json")
    entries = json.loads(log.stdout)
    assert [e["action"] for e in entries] == ["launch", "restart", "move-aside", "restart"]
    assert [e["ok"] for e in entries] == [True, False, True, True]
    assert API_KEY not in (state_home / "audit.jsonl").read_text()
    human = runwatch("audit", "--limit", "2")
    lines = human.stdout.strip().splitlines()
    assert len(lines) == 2 and "restart" in lines[-1] and "local/demo" in lines[-1]
    assert "move-aside" in lines[0]


def test_no_terminal_refuses_before_any_host_is_contacted(tmp_path: Path) -> None:
    """kill, launch and restart without a terminal and without --yes refuse before they connect
    (issue 38: they used to connect first, 11-15 s, then say "pass --yes"). The host is a real
    TCP listener that never speaks: a command that connected would be seen there."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    config = tmp_path / "runwatch.toml"
    config.write_text(
        f'[[hosts]]\nname = "far"\naddress = "127.0.0.1"\nport = {port}\n\n'
        f'[[runs]]\nname = "r"\nhost = "far"\nworkdir = "{tmp_path}"\n'
        'argv = ["python3", "run_inference.py", "--datasets", "B1", "--output-dir", "out"]\n'
    )
    config.chmod(0o600)
    with listener:
        for cmd in (["kill", "r"], ["kill", "--pid", "1"], ["launch", "r"], ["restart", "r"]):
            out = runwatch(*cmd, "-c", str(config))
            assert out.returncode == 2, (cmd, out.stdout, out.stderr)
            assert "--yes" in out.stderr, (cmd, out.stderr)
            with pytest.raises(BlockingIOError):
                listener.accept()  # nobody connected
