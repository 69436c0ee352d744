"""A snapshot before every start over existing data (A2): the second, independent guarantee.

Real processes of the SpecForge stand-in (it reopens its output with mode ``"w"`` unless given
``--resume``) under a client profile that wrongly says it always resumes (``careless``), so the
gate lets a start without ``--resume`` through, as it would any argument reading that went
wrong. On ``restart``, ``launch`` and the rollback of a failed restart the client truncates its
output at start: the new client is stopped, the file is put back byte for byte, the client's
file kept as ``.after-<stamp>``, audited, and the start fails saying so. A file that cannot be
kept is refused before the stop, or named with ``--force``; ``runwatch restore RUN`` lists and
restores, never while a writer is alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from supervisor import audit
from supervisor.agent import snapshots as host_snapshots
from supervisor.cli import cli
from supervisor.engine import Engine
from supervisor.plan import find_run_view
from tests.fixtures_actions import pid_alive
from tests.fixtures_clients import ClientRun
from tests.waiting import SCALE, wait_for, wait_until

pytestmark = pytest.mark.usefixtures("state_home")

CGROUPS = Path("/sys/fs/cgroup/unified/cgroup.procs")

CARELESS = """
[clients.careless]
scripts = ["regenerate_train_data.py"]
format = "specforge"
resume = "always"
volatile = ["--resume", "--output-file-path", "--server-address"]
[clients.careless.flags]
output_file = ["--output-file-path"]
input_file = ["--input-file-path"]
resume = ["--resume"]
"""
"""A profile that misdescribes the client: it overwrites without ``--resume``."""
DEAD = "127.0.0.1:1"
"""Where nothing listens: the stand-in exits at start (a relaunch that fails after the stop)."""


@pytest.fixture
def clients() -> Any:
    runs: list[ClientRun] = []
    yield runs
    for run in runs:
        for pid in run.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda run=run: not run.pids(), timeout=15)  # type: ignore[misc]


def careless(
    tmp_path: Path, url: str, tokenizer: Path, clients: list[ClientRun], **kw: Any
) -> ClientRun:
    top = kw.pop("top", "") + "\n" + CARELESS  # top-level keys before the tables
    # A relaunch at a dead server must die inside the settle time to be reported failed: the
    # client's start (an interpreter and its imports) is slower on a loaded machine.
    settle = 2.0 * SCALE
    run = ClientRun(tmp_path, "specforge", url, tokenizer, rows=400, settle=settle, top=top, **kw)
    clients.append(run)
    return run


def reflinks_here(path: Path) -> bool:
    """Whether the filesystem of ``path`` shares blocks (then no copy limit applies)."""
    probe = path / "probe"
    probe.write_bytes(b"x" * 4096)
    root = path / ".runwatch" / "snapshots" / "probe"
    found = host_snapshots.snapshot_check(
        {"paths": [str(probe)], "root": str(root), "max_bytes": 0}
    )
    probe.unlink()
    return bool(found["files"][0]["method"] == "reflink")


def steps_of(result: Any) -> dict[str, Any]:
    return {s.name: s for s in result.steps}


@pytest.fixture(params=["cgroup", "token"])
def held_by(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test twice: the new client held in a cgroup v2 leaf, and on the launch-token path."""
    mode = str(request.param)
    if mode == "cgroup" and not (os.geteuid() == 0 and CGROUPS.exists()):
        pytest.skip("needs root and cgroup v2 mounted at /sys/fs/cgroup/unified")
    if mode == "token":
        monkeypatch.setenv("RUNWATCH_AGENT_NO_CGROUP", "1")
    return mode


async def test_a2_a_restart_that_truncates_is_stopped_and_the_snapshot_put_back(
    tmp_path: Path,
    client_server: Any,
    demo_tokenizer: Path,
    clients: list[ClientRun],
    held_by: str,
) -> None:
    run = careless(tmp_path, client_server.url, demo_tokenizer, clients)
    at_stop: dict[str, bytes] = {}
    at_failure: dict[str, bytes] = {}

    def on_step(s: Any) -> None:
        if s.name == "stop" and s.state == "ok":
            at_stop["out"] = run.output.read_bytes()
        if s.name == "launch" and s.state == "failed":
            at_failure["out"] = run.output.read_bytes()  # before the rollback starts

    async with Engine(run.config) as engine:
        first = await engine.execute(await engine.plan("sf", action="launch"))
        assert first.ok, [s.to_json() for s in first.steps]
        await wait_for(lambda: len(run.lines()) >= 6, 90, what="6 records")
        plan = await engine.plan("sf", action="restart", unsets=["resume"])
        result = await engine.execute(plan, on_step=on_step)
    assert not result.ok
    launch = steps_of(result)["launch"]
    assert launch.state == "failed"
    # The new client was stopped, the file put back byte for byte before anything else ran.
    assert len(at_stop["out"].splitlines()) >= 6
    assert at_failure["out"] == at_stop["out"]
    new_pid = launch.data["launch"]["identity"]["pid"]
    assert launch.data["launch"]["held_by"] == held_by, launch.data["launch"]
    assert not pid_alive(new_pid)
    assert "DATA LOSS" in launch.detail and "was stopped and snapshot" in launch.detail
    assert "runwatch restore sf" in launch.detail
    [aside] = run.output.parent.glob("regen.jsonl.after-*")
    # What the client left: its fresh start (shorter, or rewritten past the old size).
    assert aside.read_bytes()[: len(at_stop["out"])] != at_stop["out"]
    assert f"kept as {aside}" in launch.detail
    # Audited: the snapshot before the start and its putting back.
    records = audit.read()
    restart = next(r for r in records if r["action"] == "restart")
    assert str(run.output) in {f["path"] for f in restart["snapshot"]["files"]}
    [back] = [r for r in records if r["action"] == "snapshot-restore"]
    assert back["ok"] is True and back["damaged"][0]["path"] == str(run.output)
    assert back["identity"]["pid"] == new_pid
    assert any(r["action"] == "data-loss" for r in records)
    # The rollback (with --resume, as before) appends to the restored data.
    rb = result.rollback
    assert rb is not None and rb["ok"] is True, rb
    await_bytes = len(at_stop["out"])
    wait_until(lambda: run.output.stat().st_size > await_bytes, timeout=60)
    assert run.output.read_bytes().startswith(at_stop["out"])


async def _until_stopped(engine: Engine, name: str) -> None:
    """Until the engine sees ``name`` stopped: a killed process leaves the run's unit only once
    its parent has reaped it, and a launch over a unit that still has processes is refused."""
    deadline = asyncio.get_running_loop().time() + 30 * SCALE
    while True:
        snap = await engine.refresh()
        rv = find_run_view(snap, "local", name)
        if rv is None or rv.state != "running":
            return
        assert asyncio.get_running_loop().time() < deadline, f"{name} still running: {rv}"
        await asyncio.sleep(0.2)  # polling interval of a condition wait


async def test_a2_a_launch_over_existing_data_that_truncates_is_put_back(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path, clients: list[ClientRun]
) -> None:
    run = careless(tmp_path, client_server.url, demo_tokenizer, clients, resume=False)
    run.output.write_bytes(b"".join(run.lines()))  # nothing yet
    async with Engine(run.config) as engine:
        first = await engine.execute(await engine.plan("sf", action="launch"))
        assert first.ok, [s.to_json() for s in first.steps]
        await wait_for(lambda: len(run.lines()) >= 5, 90, what="5 records")
        for pid in run.pids():
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not run.pids(), timeout=15)
        await _until_stopped(engine, "sf")  # its unit empty too, once the dead are reaped
        before = run.output.read_bytes()
        result = await engine.execute(await engine.plan("sf", action="launch"))
    assert not result.ok and result.rollback is None  # nothing was stopped: nothing to roll back
    launch = steps_of(result)["launch"]
    assert launch.state == "failed" and "DATA LOSS" in launch.detail
    assert "snapshot" in launch.detail and "put back" in launch.detail
    assert run.output.read_bytes() == before
    assert not pid_alive(launch.data["launch"]["identity"]["pid"]) and not run.pids()
    [aside] = run.output.parent.glob("regen.jsonl.after-*")
    assert aside.read_bytes()[: len(before)] != before
    assert any(r["action"] == "snapshot-restore" and r["ok"] for r in audit.read())


async def test_a2_the_rollback_is_snapshotted_and_put_back_too(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path, clients: list[ClientRun]
) -> None:
    """Launched without ``--resume`` on no data (fine), restarted with ``--resume`` and a server
    where nothing listens: the relaunch dies, and the rollback (the previous command line, no
    ``--resume``) truncates: it is stopped and its snapshot put back."""
    run = careless(tmp_path, client_server.url, demo_tokenizer, clients, resume=False)
    at_stop: dict[str, bytes] = {}

    def on_step(s: Any) -> None:
        if s.name == "stop" and s.state == "ok":
            at_stop["out"] = run.output.read_bytes()

    async with Engine(run.config) as engine:
        first = await engine.execute(await engine.plan("sf", action="launch"))
        assert first.ok, [s.to_json() for s in first.steps]
        await wait_for(lambda: len(run.lines()) >= 5, 90, what="5 records")
        plan = await engine.plan(
            "sf", action="restart", overrides=["resume", f"server-address={DEAD}"]
        )
        result = await engine.execute(plan, on_step=on_step)
    assert not result.ok
    rb = result.rollback
    assert rb is not None and rb["ok"] is False, rb
    assert "ROLLBACK FAILED" in rb["detail"] and "put back" in rb["detail"]
    assert run.output.read_bytes() == at_stop["out"] and len(at_stop["out"].splitlines()) >= 5
    assert not run.pids()
    records = audit.read()
    [roll] = [r for r in records if r["action"] == "rollback"]
    assert roll["ok"] is False and roll["snapshot"]["id"], roll
    assert roll["snapshot"]["dir"].startswith(str(run.output.parent / ".runwatch" / "snapshots"))
    assert any(r["action"] == "snapshot-restore" and r["ok"] for r in records)


async def test_a2_a_file_over_the_copy_limit_without_reflinks_is_refused_before_the_stop(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path, clients: list[ClientRun]
) -> None:
    if reflinks_here(tmp_path):
        pytest.skip(f"{tmp_path} has reflinks: no copy limit applies there")
    run = ClientRun(
        tmp_path,
        "specforge",
        client_server.url,
        demo_tokenizer,
        rows=400,
        top="backup_max_bytes = 10",
    )
    clients.append(run)
    async with Engine(run.config) as engine:
        first = await engine.execute(await engine.plan("sf", action="launch"))
        assert first.ok, [s.to_json() for s in first.steps]
        await wait_for(lambda: len(run.lines()) >= 3, 90, what="3 records")
        before = run.pids()
        refused = await engine.execute(await engine.plan("sf", action="restart"))
        assert run.pids() == before  # never stopped
        forced = await engine.execute(await engine.plan("sf", action="restart", force=True))
    assert not refused.ok
    fc = steps_of(refused)["format-check"]
    assert fc.state == "failed" and "no snapshot can be made" in fc.detail
    assert str(run.output) in fc.detail and "backup_max_bytes" in fc.detail
    assert "--force" in fc.detail and "nothing was stopped" in fc.detail
    assert steps_of(refused)["stop"].state == "pending"
    # --force starts, and says what goes unprotected.
    assert forced.ok, [s.to_json() for s in forced.steps]
    detail = steps_of(forced)["format-check"].detail
    assert "UNPROTECTED" in detail and str(run.output) in detail


def test_a2_restore_by_hand_lists_refuses_while_running_and_puts_back(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path, clients: list[ClientRun]
) -> None:
    run = ClientRun(
        tmp_path, "specforge", client_server.url, demo_tokenizer, rows=400, top="snapshot_keep = 2"
    )
    clients.append(run)
    cfg = str(run.config_path)
    sizes: list[int] = []

    async def restarts() -> None:
        async with Engine(run.config) as engine:
            assert (await engine.execute(await engine.plan("sf", action="launch"))).ok
            for n in (3, 6, 9):  # three restarts over data: three snapshots, two kept

                def enough(n: int = n) -> bool:
                    return len(run.lines()) >= n

                await wait_for(enough, 90, what=f"{n} records")
                sizes.append(run.output.stat().st_size)
                result = await engine.execute(await engine.plan("sf", action="restart"))
                assert result.ok, [s.to_json() for s in result.steps]

    asyncio.run(restarts())
    cli_runner = CliRunner()
    listed = cli_runner.invoke(cli, ["-c", cfg, "restore", "sf", "--json"])
    assert listed.exit_code == 0, listed.output
    snaps = json.loads(listed.output)
    assert len(snaps) == 2  # pruned to snapshot_keep
    newest = snaps[0]
    # The output and its error/skipped files, each as it was at the last restart.
    [kept] = [f for f in newest["files"] if f["path"] == str(run.output)]
    assert kept["bytes"] >= sizes[-1] and kept["copy"].startswith(newest["dir"] + "/")
    assert {f["path"] for f in newest["files"]} <= {
        str(run.output),
        str(run.sidecar("error")),
        str(run.sidecar("skipped")),
    }
    text = cli_runner.invoke(cli, ["-c", cfg, "restore", "sf"])
    assert newest["id"] in text.output and "runwatch restore sf --snapshot ID" in text.output
    # Refused while the run runs: nothing changed.
    busy = cli_runner.invoke(cli, ["-c", cfg, "restore", "sf", "--snapshot", newest["id"]])
    assert busy.exit_code != 0 and "is running" in str(busy.exception)
    assert not list(run.output.parent.glob("regen.jsonl.after-*"))
    for pid in run.pids():
        os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not run.pids(), timeout=30)
    current = run.output.read_bytes()
    done = cli_runner.invoke(
        cli, ["-c", cfg, "restore", "sf", "--snapshot", newest["id"], "--json"]
    )
    assert done.exit_code == 0, done.output
    [restored] = [r for r in json.loads(done.output)["restored"] if r["path"] == str(run.output)]
    assert run.output.read_bytes() == Path(kept["copy"]).read_bytes()
    assert Path(restored["aside"]).read_bytes() == current  # moved aside, never deleted
    assert any(r["action"] == "restore" and r["ok"] for r in audit.read())
