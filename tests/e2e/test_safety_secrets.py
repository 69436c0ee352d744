"""Invariant 9: secrets never leave the host in clear and never rest in readable files. The values
runwatch knows (every endpoint's ``api_key_env`` value) are masked wherever they appear, besides
masking by pattern; files that may hold a command line are mode 0600; a ``.broken`` copy keeps
the original's mode and owner; only values are masked, never a flag's or a variable's name.
Real processes, the real agent, the real CLI, a second Unix user."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from supervisor import audit
from supervisor.agent.masking import mask_argv, mask_text
from supervisor.config import Config, EndpointConfig
from supervisor.hosts import Host
from supervisor.kill import kill
from supervisor.model import Identity
from supervisor.secrets import note_secrets
from tests.fixtures_procs import FakeRuns, gone
from tests.fixtures_users import OtherUser
from tests.waiting import wait_until

KEY = "plain-key-value-42"  # not key-shaped: only knowing the value can mask it


def test_inv9_only_values_are_masked_never_names() -> None:
    argv = [
        "python", "run_inference.py", "--api-key-env", "OPENAI_API_KEY", "--token-buget", "50000",
        "--max-tokens", "5", "--token-budget", "9", "--hf-token", "abc", "--api-token=def",
        "--key", "ghi", "DB_PASSWORD=jkl", "--tokenizer", "/m", "--client-secret", "mno",
    ]  # fmt: skip
    assert mask_argv(argv) == [
        "python", "run_inference.py", "--api-key-env", "OPENAI_API_KEY", "--token-buget", "50000",
        "--max-tokens", "5", "--token-budget", "9", "--hf-token", "***", "--api-token=***",
        "--key", "***", "DB_PASSWORD=***", "--tokenizer", "/m", "--client-secret", "***",
    ]  # fmt: skip
    assert mask_text("restart --set token-buget=50000 --api-key-env OPENAI_API_KEY") == (
        "restart --set token-buget=50000 --api-key-env OPENAI_API_KEY"
    )
    assert mask_text('{"apiKey": "abc", "maxTokens": 5}') == '{"apiKey": "***", "maxTokens": 5}'
    assert mask_argv(["run.py", "--header", f"X-Org:{KEY}"], [KEY]) == [
        "run.py", "--header", "X-Org:***",
    ]  # fmt: skip


def _config_file(tmp_path: Path, workdir: Path) -> Path:
    path = tmp_path / "rw.toml"
    path.write_text(
        f"""
scripts = ["run_inference.py"]

[[hosts]]
name = "local"
local = true

[[endpoints]]
name = "api"
kind = "api"
base_url = "https://api.example.com/v1"
api_key_env = "RW_SAFETY_KEY"

[[runs]]
name = "gen"
host = "local"
workdir = "{workdir}"
argv = ["python3", "run_inference.py", "--datasets", "B1"]
endpoint = "api"
"""
    )
    return path


def test_inv9_known_values_are_masked_in_json_outputs(tmp_path: Path, fake_runs: FakeRuns) -> None:
    work = tmp_path / "w"
    work.mkdir()
    run = fake_runs.start("--datasets", "B1", "--header", f"X-Org:{KEY}", cwd=work)
    config = _config_file(tmp_path, work)
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "RW_SAFETY_KEY": KEY}
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "ps", "--json", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert KEY not in done.stdout + done.stderr
    (listed,) = [p for p in json.loads(done.stdout)["hosts"][0]["processes"] if p["pid"] == run.pid]
    assert "X-Org:***" in listed["argv"]
    status = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "status", "--json", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    assert KEY not in status.stdout + status.stderr
    assert "X-Org:***" in status.stdout


async def test_inv9_lock_fingerprint_and_log_are_private_and_hold_no_key(
    host: Host, tmp_path: Path
) -> None:
    work = tmp_path / "w"
    work.mkdir()
    old_lock = work / "out" / ".runwatch" / "B1.lock"
    old_lock.parent.mkdir(parents=True)
    old_lock.write_text("")
    old_lock.chmod(0o644)  # left by an older runwatch
    argv = [sys.executable, "-c", "import signal\nsignal.pause()", "--header", f"X-Org:{KEY}"]
    reply = await host.request(
        "launch",
        {
            "workdir": str(work),
            "argv": argv,
            "env": {"RW_SAFETY_KEY": KEY},
            "secret_env": ["RW_SAFETY_KEY"],
            "log": "out/.runwatch/run.log",
            "lock_paths": ["out/.runwatch/B1.lock"],
            "settle_s": 0.3,
            "fingerprints": [{"path": "out/.runwatch/B1.launch.json", "data": {"argv": argv}}],
        },
    )
    pid = reply.get("identity", {}).get("pid")
    try:
        assert reply["started"], reply
        assert KEY not in json.dumps(reply)
        for name in ("B1.lock", "B1.launch.json", "run.log"):
            path = work / "out" / ".runwatch" / name
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
            assert KEY not in path.read_text(), name
        assert "X-Org:***" in (work / "out" / ".runwatch" / "B1.lock").read_text()
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: gone(pid), 10)


async def test_inv9_a_broken_copy_keeps_the_mode_and_owner(
    host: Host, tmp_path: Path, second_user: OtherUser
) -> None:
    data = tmp_path / "raw_responses.jsonl"
    data.write_bytes(b'{"a": 1}\n{"a": 2')
    os.chown(data, second_user.uid, second_user.gid)
    data.chmod(0o600)
    reply = await host.request("repair_tail", {"path": str(data)})
    assert reply["repaired"], reply
    backup = Path(reply["backup"])
    st = backup.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert (st.st_uid, st.st_gid) == (second_user.uid, second_user.gid)
    assert backup.read_bytes() == b'{"a": 1}\n{"a": 2'


def test_inv9_the_audit_log_masks_known_values_and_is_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("RW_SAFETY_KEY", KEY)
    note_secrets(
        Config(
            endpoints=[
                EndpointConfig(
                    name="api", kind="api", base_url="https://x/v1", api_key_env="RW_SAFETY_KEY"
                )
            ]
        )
    )
    path = audit.audit_path()
    path.parent.mkdir(parents=True)
    path.write_text("")
    path.chmod(0o644)  # written by an older runwatch
    audit.record(
        "kill",
        host="local",
        run="gen",
        ok=True,
        argv=["run.py", "--header", f"X-Org:{KEY}", "--api-key-env", "RW_SAFETY_KEY"],
        steps=[{"name": "stop", "ok": True, "detail": f"stopped run with X-Org:{KEY}"}],
    )
    text = path.read_text()
    assert KEY not in text
    assert "RW_SAFETY_KEY" in text  # the name is kept
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_inv9_the_host_masks_key_values_before_a_listing_leaves_it(
    host: Host, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key is in the run's environment on the host only (not the laptop's, not the agent's):
    the agent reads it there and masks it in the argv it sends."""
    monkeypatch.setenv("RW_SAFETY_KEY", KEY)  # in the run's environment (inherited)
    run = fake_runs.start("--datasets", "B1", "--header", f"X-Org:{KEY}")
    monkeypatch.delenv("RW_SAFETY_KEY")
    reply = await host.request(
        "ps", {"scripts": ["run_inference.py"], "secret_env": ["RW_SAFETY_KEY"]}
    )
    assert KEY not in json.dumps(reply)
    (listed,) = [p for p in reply["processes"] if p["identity"]["pid"] == run.pid]
    assert "X-Org:***" in listed["identity"]["argv"]
    report = await kill(host, msgspec.convert(listed["identity"], Identity), grace=2.0)
    assert report.all_gone, report.results  # the masked identity still names the process
