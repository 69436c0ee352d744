"""The audit log: masked, append-only JSON lines, safe under concurrent writers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import audit

SECRET = "sk-audit-secret-value-123456"


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "runwatch"


def test_record_masks_secrets_everywhere(state_home: Path) -> None:
    written = audit.record(
        "launch",
        host="gpu-box",
        run="eagle3",
        ok=True,
        identity={"pid": 42, "argv": ["python3", "x.py", "--api-key", SECRET]},
        argv=["python3", "x.py", "--api-key", SECRET, "--note", f"k={SECRET}"],
        steps=[{"name": "launch", "ok": True, "detail": f"env key {SECRET}"}],
        secrets=[SECRET],
        detail=f"started with {SECRET}",
    )
    raw = (state_home / "audit.jsonl").read_text()
    assert SECRET not in raw
    assert raw.count("\n") == 1
    line = json.loads(raw)
    assert line == written
    assert line["argv"] == ["python3", "x.py", "--api-key", "***", "--note", "k=***"]
    assert line["identity"]["argv"][-1] == "***"
    assert line["steps"][0]["detail"] == "env key ***"
    assert line["host"] == "gpu-box" and line["run"] == "eagle3" and line["ok"] is True
    assert isinstance(line["time"], float)


def test_read_returns_oldest_first_with_limit_and_skips_garbage(state_home: Path) -> None:
    for i in range(5):
        audit.record("kill", host="h", run=f"r{i}", ok=i % 2 == 0)
    with (state_home / "audit.jsonl").open("ab") as f:
        f.write(b"not json\n[1, 2]\n")
    audit.record("restart", host="h", run="last", ok=False)
    entries = audit.read()
    assert [e["run"] for e in entries] == ["r0", "r1", "r2", "r3", "r4", "last"]
    assert [e["run"] for e in audit.read(limit=2)] == ["r4", "last"]
    assert audit.read(limit=0) == []


def test_read_without_a_log(state_home: Path) -> None:
    assert audit.read() == []


def test_concurrent_writers_never_interleave(state_home: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from supervisor import audit\n"
        "for i in range(200):\n"
        "    audit.record('repair', host='h', run=sys.argv[1], ok=True, detail='x' * 3000)\n"
    )
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, f"w{n}"], env=env, cwd=Path.cwd())
        for n in range(4)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    lines = (state_home / "audit.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b""
    parsed = [json.loads(line) for line in lines[:-1]]
    assert len(parsed) == 800
    assert {e["run"] for e in parsed} == {"w0", "w1", "w2", "w3"}


def test_format_record_names_the_failing_step(state_home: Path) -> None:
    entry = audit.record(
        "restart",
        host="gpu-box",
        run="eagle3",
        ok=False,
        identity={"pid": 7},
        steps=[
            {"name": "format-check", "ok": True, "detail": "8 files current"},
            {"name": "fingerprint", "ok": False, "detail": "model changed"},
        ],
    )
    text = audit.format_record(entry)
    assert "restart" in text and "gpu-box/eagle3" in text and "FAILED" in text
    assert "pid 7" in text and "fingerprint: model changed" in text


def test_format_record_names_a_failed_rebalance_step_by_its_action_and_run(
    state_home: Path,
) -> None:
    """A rebalance's steps are plan steps (action, run), not gate steps (name): the failing one is
    named by what it did, never as Python's ``None``."""
    entry = audit.record(
        "rebalance",
        host="-",
        run=None,
        ok=False,
        steps=[
            {"run": "local", "action": "stop", "ok": True, "detail": "stopped"},
            {"run": "api", "action": "restart", "ok": False, "detail": "stopped at gate"},
        ],
    )
    text = audit.format_record(entry)
    assert "None" not in text
    assert "-/-" in text and "restart api: stopped at gate" in text
