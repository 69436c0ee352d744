"""``restart RUN --script PATH``: the script is part of the run (rows A15-A17 of
``docs/reliability.md``). The incident: the host's script is older than the command line
(no ``--token-budget``); the one-command fix checks the new script's parser before anything
stops, copies it over the host's once the old run is gone (the old one kept beside it), and
puts the old one back when the launch fails. Real sshd, real clients, a real mock endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor import audit
from supervisor.engine import Engine
from tests.fixtures_actions import (
    RUN_INFERENCE,
    DemoRun,
    host_toml,
    launch,
    old_script,
    pid_alive,
    runwatch,
    why,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.ssh, pytest.mark.usefixtures("state_home")]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _old_run(
    tmp_path: Path, url: str, ssh_host_cfg: Any, kill_after: list[int], script_dir: str = ""
) -> Any:
    """The demo run over SSH on the old script (mode 0750), launched and writing: the demo,
    its old source, its script's path and its pid. ``script_dir``: the script is in that
    directory of the workdir, not the workdir itself."""
    demo = DemoRun(
        tmp_path,
        url,
        datasets=("B1",),
        max_samples=300,
        host_toml=host_toml(ssh_host_cfg),
        host_name=ssh_host_cfg.name,
    )
    old = old_script(demo).encode()
    script = demo.workdir / "run_inference.py"
    if script_dir:
        (demo.workdir / script_dir).mkdir()
        script = script.rename(demo.workdir / script_dir / script.name)
        text = demo.config_path.read_text()
        demo.config_path.write_text(
            text.replace('"run_inference.py"', f'"{script_dir}/run_inference.py"')
        )
    script.chmod(0o750)

    async def go() -> Any:
        async with Engine(demo.config) as engine:
            return await launch(engine, "demo")

    launched = asyncio.run(go())
    assert launched.ok, why(launched)
    pid = int(launched.identity["pid"])
    kill_after.append(pid)
    wait_until(lambda: len(demo.complete_ids("B1")) >= 2, timeout=60)
    return demo, old, script, pid


def test_a15_restart_with_a_newer_script_installs_it_and_relaunches_with_the_flag(
    tmp_path: Path, slow_endpoint: Any, ssh_host_cfg: Any, kill_after: list[int]
) -> None:
    """The incident's command is refused on the old script; with ``--script NEW`` (the dry run
    shows the copy) it succeeds: the host's script is the new bytes with the old one's mode, the
    old one kept beside it, the run relaunched with the flag, the data written before the
    relaunch byte-identical, the audit log holding both hashes. The launch fingerprint and
    ``status --json`` hold the new script's sha256, and a later start on a script edited on the
    host lists "script changed" among the allowed changes."""
    demo, old, script, pid = _old_run(tmp_path, slow_endpoint.url, ssh_host_cfg, kill_after)
    cmd = ("-c", str(demo.config_path), "restart", "demo", "--set", "token-budget=10000000")
    refused = runwatch(*cmd, "--yes")
    assert refused.returncode != 0 and "does not declare it" in refused.stdout, refused.stdout
    new = RUN_INFERENCE.read_bytes()
    dry = runwatch(*cmd, "--script", str(RUN_INFERENCE), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"would copy {RUN_INFERENCE} (sha256 {_sha(new)[:12]}) over {script}" in dry.stdout
    assert script.read_bytes() == old and pid_alive(pid)
    before = demo.data_file("B1").read_bytes()
    out = runwatch(*cmd, "--script", str(RUN_INFERENCE), "--yes")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert script.read_bytes() == new, text
    assert os.stat(script).st_mode & 0o777 == 0o750
    kept = script.with_name(f"run_inference.py.runwatch-{_sha(old)[:12]}")
    assert kept.read_bytes() == old
    assert not pid_alive(pid)
    entry = audit.read()[-1]
    assert entry["action"] == "restart" and entry["ok"], entry
    new_pid = int(entry["identity"]["pid"])
    kill_after.append(new_pid)
    argv = Path(f"/proc/{new_pid}/cmdline").read_bytes().split(b"\0")
    assert b"--token-budget" in argv and b"10000000" in argv
    assert demo.data_file("B1").read_bytes()[: len(before)] == before
    copied = [e for e in audit.read() if e["action"] == "script-install"]
    assert len(copied) == 1 and copied[0]["ok"], copied
    assert copied[0]["old_sha256"] == _sha(old) and copied[0]["new_sha256"] == _sha(new)
    assert copied[0]["kept"] == str(kept)
    # The launch fingerprint holds the script as read on the host; a later start on another
    # script lists the change among the allowed ones (never blocking).
    record = json.loads((demo.workdir / "data" / ".runwatch" / "B1.launch.json").read_text())
    assert record["script_sha256"] == _sha(new), record
    status = runwatch("-c", str(demo.config_path), "status", "--json")
    runs = [r for h in json.loads(status.stdout)["hosts"] for r in h["runs"]]
    assert [r["script_sha256"] for r in runs if r["name"] == "demo"] == [_sha(new)], runs
    other = new + b"# a later edit on the host\n"
    script.write_bytes(other)
    again = runwatch("-c", str(demo.config_path), "restart", "demo", "--dry-run")
    assert again.returncode == 0, again.stdout + again.stderr
    changed = f"script changed ({_sha(new)[:12]} -> {_sha(other)[:12]})"
    assert "allowed changes: " + changed in again.stdout, again.stdout


def test_a16_a_new_script_without_the_flag_is_refused_before_the_stop(
    tmp_path: Path, slow_endpoint: Any, ssh_host_cfg: Any, kill_after: list[int]
) -> None:
    """``--script`` names a script whose parser lacks the flag set: refused in the preflight,
    the old run alive under the same pid, the host's script untouched, nothing kept beside it."""
    demo, old, script, pid = _old_run(tmp_path, slow_endpoint.url, ssh_host_cfg, kill_after)
    lacking = tmp_path / "also_old.py"
    lacking.write_bytes(old)
    text = _refused_restart(demo, lacking)
    assert "[FAILED] preflight" in text and "nothing was stopped" in text, text
    assert f"the script given with --script ({lacking}) does not declare --token-budget" in text
    assert "the new run_inference.py does not declare it" in text, text
    assert pid_alive(pid)
    assert script.read_bytes() == old
    assert sorted(p.name for p in script.parent.iterdir() if ".runwatch-" in p.name) == []
    assert [e for e in audit.read() if e["action"].startswith("script-")] == []


def _refused_restart(demo: Any, new_script: Path) -> str:
    """The incident's restart with ``--script new_script``, which must fail: its output."""
    out = runwatch(
        "-c",
        str(demo.config_path),
        "restart",
        "demo",
        "--set",
        "token-budget=10000000",
        "--script",
        str(new_script),
        "--yes",
    )
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    return text


@contextlib.contextmanager
def _read_only(directory: Path) -> Iterator[None]:
    """``directory`` bind-mounted read-only over itself (as a script in a read-only image or
    a directory the run's user cannot write: not even root makes a file there)."""
    mounts = (
        ["mount", "--bind", str(directory), str(directory)],
        ["mount", "-o", "remount,bind,ro", str(directory)],
    )
    try:
        for cmd in mounts:
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                pytest.skip(f"needs a read-only bind mount: {done.stderr.strip()}")
        yield
    finally:
        subprocess.run(["umount", str(directory)], capture_output=True, check=False)


def test_a16_a_script_whose_directory_cannot_be_written_is_refused_before_the_stop(
    tmp_path: Path, slow_endpoint: Any, ssh_host_cfg: Any, kill_after: list[int]
) -> None:
    """The host's script lies in a directory nothing can be written to: the copy after the
    stop would fail (and the run be stopped for nothing), so the preflight makes the new file
    there before anything stops and refuses, naming the copy to do by hand. The run keeps its
    pid, the host's script untouched, nothing kept beside it."""
    demo, old, script, pid = _old_run(
        tmp_path, slow_endpoint.url, ssh_host_cfg, kill_after, script_dir="bin"
    )
    with _read_only(script.parent):
        text = _refused_restart(demo, RUN_INFERENCE)
        assert "[FAILED] preflight" in text and "could not be replaced" in text, text
        assert f"copy {RUN_INFERENCE} to {script}" in text, text
        assert pid_alive(pid), text
        assert script.read_bytes() == old
        assert sorted(p.name for p in script.parent.iterdir()) == ["run_inference.py"]
    assert [e for e in audit.read() if e["action"].startswith("script-")] == []


def test_a16_a_script_that_is_the_users_link_is_refused_before_the_stop(
    tmp_path: Path, slow_endpoint: Any, ssh_host_cfg: Any, kill_after: list[int]
) -> None:
    """The run's script is the user's own link into a checkout (``run_inference.py ->
    repo/run_inference.py``): the copy would put a file where the link was, which a failed
    launch's rollback does not put back. Refused at the preflight naming the link's target;
    the run keeps its pid, the link and the checkout's script untouched."""
    demo, old, script, pid = _old_run(
        tmp_path, slow_endpoint.url, ssh_host_cfg, kill_after, script_dir="repo"
    )
    link = demo.workdir / "run_inference.py"
    link.symlink_to("repo/run_inference.py")
    text = demo.config_path.read_text()
    demo.config_path.write_text(text.replace('"repo/run_inference.py"', '"run_inference.py"'))
    text = _refused_restart(demo, RUN_INFERENCE)
    assert "[FAILED] preflight" in text and "nothing was stopped" in text, text
    assert f"{link} is a symbolic link (to {script})" in text, text
    assert pid_alive(pid), text
    assert link.is_symlink() and os.readlink(link) == "repo/run_inference.py"
    assert script.read_bytes() == old
    assert [p.name for p in demo.workdir.glob("**/*.runwatch-*")] == []
    assert [e for e in audit.read() if e["action"].startswith("script-")] == []


def test_a17_a_launch_failing_after_the_copy_puts_the_old_script_back(
    tmp_path: Path, slow_endpoint: Any, ssh_host_cfg: Any, kill_after: list[int]
) -> None:
    """The new script declares the flag but exits at once: the launch fails after the copy,
    the old script is put back (audited) before the old command line is relaunched, and the
    old run runs again."""
    demo, old, script, pid = _old_run(tmp_path, slow_endpoint.url, ssh_host_cfg, kill_after)
    source = RUN_INFERENCE.read_text()
    parse = "    args = parse_args(argv)\n"
    assert parse in source
    broken = tmp_path / "broken.py"
    broken.write_text(source.replace(parse, parse + "    raise SystemExit(3)\n"))

    async def go() -> Any:
        async with Engine(demo.config) as engine:
            plan = await engine.plan(
                "demo", overrides=["token-budget=10000000"], script=str(broken)
            )
            return await engine.execute(plan)

    result = asyncio.run(go())
    assert not result.ok, why(result)
    steps = {s.name: s for s in result.steps}
    assert steps["script"].state == "ok" and steps["launch"].state == "failed", why(result)
    assert result.rollback is not None and result.rollback["ok"], result.rollback
    back = int(result.rollback["identity"]["pid"])
    kill_after.append(back)
    assert script.read_bytes() == old
    assert pid_alive(back) and not pid_alive(pid)
    argv = Path(f"/proc/{back}/cmdline").read_bytes().split(b"\0")
    assert b"--token-budget" not in argv
    actions = [e["action"] for e in audit.read()]
    assert actions[-4:] == ["script-install", "script-restore", "rollback", "restart"], actions
    restored = next(e for e in audit.read() if e["action"] == "script-restore")
    assert restored["ok"] and restored["new_sha256"] == _sha(old), restored


def test_a17_a_failed_launch_with_a_new_script_leaves_the_old_one(
    tmp_path: Path, slow_endpoint: Any, ssh_host_cfg: Any
) -> None:
    """``launch RUN --script NEW`` of a stopped run whose new script exits at once: nothing to
    roll back, and the host's script is still put back as it was (audited)."""
    demo = DemoRun(
        tmp_path,
        slow_endpoint.url,
        datasets=("B1",),
        host_toml=host_toml(ssh_host_cfg),
        host_name=ssh_host_cfg.name,
    )
    old = old_script(demo).encode()
    script = demo.workdir / "run_inference.py"
    source = RUN_INFERENCE.read_text()
    parse = "    args = parse_args(argv)\n"
    broken = tmp_path / "broken.py"
    broken.write_text(source.replace(parse, parse + "    raise SystemExit(3)\n"))

    async def go() -> Any:
        async with Engine(demo.config) as engine:
            plan = await engine.plan(
                "demo", action="launch", overrides=["token-budget=100"], script=str(broken)
            )
            return await engine.execute(plan)

    result = asyncio.run(go())
    assert not result.ok and result.rollback is None, why(result)
    assert script.read_bytes() == old
    restored = [e for e in audit.read() if e["action"] == "script-restore"]
    assert len(restored) == 1 and restored[0]["ok"], restored
