"""One gate for every start (O5): a rollback and a restart on failure are launches, and a start
that would overwrite a flag-resume client's output is refused, whoever makes it.

Real processes of the SpecForge stand-in (which reopens its output with mode ``"w"`` unless given
``--resume``) against the demo's mock server, supervised through the engine: the refused
rollback leaves every byte in place, the run stopped, a critical event and an audit record naming
the command that resumes it; a rollback that keeps the output still goes ahead; an automatic
restart without the flag is refused once and never retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from supervisor import audit, gate
from supervisor.engine import Engine
from supervisor.layout import layout_of
from supervisor.watch import Watcher, WatchLock, watch
from tests.fixtures_alerts import Receiver
from tests.fixtures_clients import ClientRun
from tests.waiting import wait_for, wait_until

pytestmark = pytest.mark.usefixtures("state_home")

SETTLE = 3.0
DEAD = "127.0.0.1:1"
"""A server address where nothing listens: the SpecForge stand-in finds no server and exits at
start, a failure no preflight can foresee (a value the profile rules out, such as a
``--temperature`` outside 0..1, is refused before the stop: V13)."""
"""Long enough that a client refusing its flags exits within it (the host answers at once)."""
RESTART_TOML = """on_exit = "restart"
restart_backoff_seconds = 0.2
restart_max = 3
restart_window_seconds = 600"""


@pytest.fixture
def clients() -> Any:
    """Append ClientRuns; every process of theirs still alive is killed at teardown."""
    runs: list[ClientRun] = []
    yield runs
    for run in runs:
        for pid in run.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda run=run: not run.pids(), timeout=15)  # type: ignore[misc]


def specforge(
    tmp_path: Path, url: str, tokenizer: Path, clients: list[ClientRun], **kw: Any
) -> Any:
    run = ClientRun(tmp_path, "specforge", url, tokenizer, rows=400, settle=SETTLE, **kw)
    clients.append(run)
    return run


def files(run: ClientRun) -> dict[str, bytes]:
    """The output and its error/skipped files, byte for byte."""
    paths = [run.output, run.sidecar("error"), run.sidecar("skipped")]
    return {p.name: p.read_bytes() for p in paths if p.exists()}


def expected_command(run: ClientRun, *args: str) -> str:
    return f"runwatch -c {shlex.quote(str(run.config_path.resolve()))} " + shlex.join(args)


async def view(engine: Engine, name: str) -> Any:
    snap = await engine.refresh()
    return next(r for h in snap.hosts for r in h.runs if r.name == name)


@contextlib.asynccontextmanager
async def watching(engine: Engine, tmp_path: Path) -> AsyncIterator[tuple[Watcher, list[str]]]:
    """``runwatch watch`` in this process (every 0.3 s) until the block ends."""
    lines: list[str] = []
    stop = asyncio.Event()
    watcher = Watcher(engine, emit=lines.append, interval=0.3)
    lock = WatchLock(str(engine.config.path), tmp_path / "locks")
    task = asyncio.ensure_future(watch(engine, stop, lock=lock, watcher=watcher))
    try:
        await wait_for(lambda: watcher.ticks > 0 or task.done(), 30, what="the first refresh")
        if task.done():
            task.result()
        yield watcher, lines
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def test_o5_a_rollback_that_would_overwrite_is_refused_and_keeps_every_byte(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path, clients: list[ClientRun]
) -> None:
    """The SpecForge case: launched without ``--resume`` (fine on no data), restarted with
    ``--set resume`` and a ``--server-address`` where no server answers: the relaunch fails
    after the stop, and the previous command line (no ``--resume``) must not run."""
    run = specforge(tmp_path, client_server.url, demo_tokenizer, clients, resume=False)
    at_stop: dict[str, bytes] = {}

    def on_step(s: Any) -> None:
        if s.name == "stop" and s.state == "ok":
            at_stop.update(files(run))  # the old run is gone: from here nothing may change

    async with Engine(run.config) as engine:
        first = await engine.execute(await engine.plan("sf", action="launch"))
        assert first.ok, [s.to_json() for s in first.steps]
        await wait_for(lambda: len(run.lines()) >= 8, 90, what="8 records")
        async with watching(engine, tmp_path) as (watcher, lines):
            plan = await engine.plan(
                "sf",
                action="restart",
                overrides=["resume", f"server-address={DEAD}"],
            )
            result = await engine.execute(plan, on_step=on_step)
            after = files(run)
            seen = watcher.ticks
            await wait_for(lambda: watcher.ticks >= seen + 3, 30, what="three more refreshes")
            refused = [e for e in watcher.events if e.kind == "start-refused"]
            rv = await view(engine, "sf")
        # Refused: not launched, every byte as it was at the stop, the run stopped.
        assert len(at_stop["regen.jsonl"].splitlines()) >= 8
        assert after == at_stop
        assert rv.state == "stopped" and rv.process is None
        command = expected_command(run, "launch", "sf", "--set", "resume")
        # The command named resumes the run: it appends to the output as it was.
        resumed = await engine.execute(
            await engine.plan("sf", action="launch", overrides=["resume"])
        )
        assert resumed.ok, [s.to_json() for s in resumed.steps]
        await wait_for(lambda: len(run.lines()) > len(at_stop["regen.jsonl"].splitlines()), 60)
    assert not result.ok
    failed = result.failed_step
    assert failed is not None and failed.name == "launch"
    assert "No server address is available" in failed.detail
    rb = result.rollback
    assert rb is not None and rb["ok"] is False and rb["refused"] is True
    assert rb["identity"] is None
    assert rb["command"] == command
    assert rb["resume_argv"][-1] == "--resume" and DEAD not in rb["resume_argv"]
    assert "ROLLBACK REFUSED" in rb["detail"] and "would overwrite" in rb["detail"]
    assert "without --resume" in rb["detail"] and f"Resume it with: {command}" in rb["detail"]
    assert "the run is STOPPED" in rb["detail"]
    # Audited as refused, not "ok"; the restart record carries it.
    records = audit.read()
    rolls = [r for r in records if r["action"] == "rollback"]
    assert len(rolls) == 1 and rolls[0]["ok"] is False and rolls[0]["refused"] is True
    assert rolls[0]["command"] == command and "--resume" not in rolls[0]["argv"]
    shown = audit.format_record(rolls[0])
    assert " local/sf " in shown and " REFUSED - ROLLBACK REFUSED" in shown and command in shown
    restart = next(r for r in records if r["action"] == "restart")
    assert restart["ok"] is False and restart["rollback"]["refused"] is True
    # A critical event that names the command; shown by the watcher as one.
    [event] = refused
    assert event.severity == "critical" and event.run == "sf" and event.command == command
    assert "ROLLBACK REFUSED" in event.message
    assert any(line.endswith(f"CRITICAL sf: {event.message}  -> {command}") for line in lines)
    # Resumed by the command: appended, nothing lost.
    assert run.output.read_bytes().startswith(at_stop["regen.jsonl"])


async def test_o5_a_rollback_that_keeps_the_output_goes_ahead(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path, clients: list[ClientRun]
) -> None:
    run = specforge(tmp_path, client_server.url, demo_tokenizer, clients, resume=True)
    at_stop: dict[str, bytes] = {}

    def on_step(s: Any) -> None:
        if s.name == "stop" and s.state == "ok":
            at_stop.update(files(run))

    async with Engine(run.config) as engine:
        first = await engine.execute(await engine.plan("sf", action="launch"))
        assert first.ok, [s.to_json() for s in first.steps]
        await wait_for(lambda: len(run.lines()) >= 4, 90, what="4 records")
        plan = await engine.plan("sf", action="restart", overrides=[f"server-address={DEAD}"])
        result = await engine.execute(plan, on_step=on_step)
        rb = result.rollback
        assert rb is not None and rb["ok"] is True, rb
        pid = rb["identity"]["pid"]
        rv = await view(engine, "sf")
        size = len(at_stop["regen.jsonl"])
        await wait_for(lambda: run.output.stat().st_size > size, 60, what="the rollback writing")
    assert not result.ok and result.failed_step is not None
    assert result.failed_step.name == "launch"
    assert rb["detail"].startswith("rolled back") and "refused" not in rb
    assert rv.state == "running" and rv.process is not None and rv.process.identity.pid == pid
    assert DEAD not in rv.process.identity.argv  # the previous command line
    assert run.pids() == [pid]
    assert run.output.read_bytes().startswith(at_stop["regen.jsonl"])  # appended
    rolls = [r for r in audit.read() if r["action"] == "rollback"]
    assert len(rolls) == 1 and rolls[0]["ok"] is True


async def test_o5_data_written_between_the_checks_and_the_stop_is_not_overwritten(
    tmp_path: Path, demo_tokenizer: Path, clients: list[ClientRun]
) -> None:
    """``restart --unset resume`` while the output is still empty passes the checks; the old run
    writes its first records before it is stopped: the launch's own gate sees them, refuses, and
    the rollback (with ``--resume``) appends to them."""
    from supervisor.demo.server import MockSettings, serve_in_thread

    at_stop: dict[str, bytes] = {}
    # About 13 s per response: the first record comes well after the checks.
    with serve_in_thread(MockSettings(decode_tps=3.0, mean_tokens=40, length_sigma=0.1)) as srv:
        run = ClientRun(tmp_path, "specforge", srv.url, demo_tokenizer, rows=400, resume=True)
        clients.append(run)

        async def on_step(s: Any) -> None:
            if s.name == "format-check" and s.state == "ok":
                assert not any(files(run).values()), "a record came before the check"
                await wait_for(lambda: any(files(run).values()), 60, what="the first record")
            if s.name == "stop" and s.state == "ok":
                at_stop.update(files(run))

        async with Engine(run.config) as engine:
            first = await engine.execute(await engine.plan("sf", action="launch"))
            assert first.ok, [s.to_json() for s in first.steps]
            plan = await engine.plan("sf", action="restart", unsets=["resume"])
            result = await engine.execute(plan, on_step=on_step)
            rv = await view(engine, "sf")
    assert not result.ok
    failed = result.failed_step
    assert failed is not None and failed.name == "launch", [s.to_json() for s in result.steps]
    assert "without --resume" in failed.detail and "would overwrite" in failed.detail
    assert not [s for s in result.steps if "DATA LOSS" in s.detail]
    assert at_stop and any(at_stop.values())
    rb = result.rollback
    assert rb is not None and rb["ok"] is True, rb
    assert rv.state == "running" and rv.process is not None
    assert "--resume" in rv.process.identity.argv
    for name, data in at_stop.items():  # appended to, never reopened with "w"
        assert (run.output.parent / name).read_bytes().startswith(data), name


async def test_o5_restart_on_failure_without_the_resume_flag_is_refused_not_retried(
    tmp_path: Path,
    client_server: Any,
    demo_tokenizer: Path,
    clients: list[ClientRun],
    receiver: Receiver,
) -> None:
    run = specforge(
        tmp_path, client_server.url, demo_tokenizer, clients, resume=False, run_toml=RESTART_TOML
    )
    run.config_path.write_text(
        run.config_path.read_text() + f'\n[alerts]\nurls = ["{receiver.url()}"]\n'
    )
    command = expected_command(run, "launch", "sf", "--set", "resume")
    async with Engine(run.config) as engine:
        first = await engine.execute(await engine.plan("sf", action="launch"))
        assert first.ok, [s.to_json() for s in first.steps]
        pid = (first.identity or {})["pid"]
        await wait_for(lambda: len(run.lines()) >= 4, 90, what="4 records")
        async with watching(engine, tmp_path) as (watcher, lines):
            await wait_for(lambda: engine.last is not None and run.pids() == [pid], 30)
            os.kill(pid, signal.SIGKILL)
            await wait_for(lambda: not run.pids(), 15, what="the run gone")
            before = files(run)
            refused = await wait_for(
                lambda: [e for e in watcher.events if e.kind == "start-refused"],
                60,
                what="the start-refused event",
            )
            seen = watcher.ticks
            await wait_for(lambda: watcher.ticks >= seen + 5, 60, what="five more refreshes")
            rv = await view(engine, "sf")
    assert files(run) == before and len(before["regen.jsonl"].splitlines()) >= 4
    assert rv.state == "stopped" and not run.pids()
    kinds = [e.kind for e in watcher.events if e.run == "sf"]
    assert kinds[:2] == ["run-died", "start-refused"] and kinds.count("start-refused") == 1
    [event] = refused
    assert event.severity == "critical" and event.command == command
    assert "without --resume" in event.message and "Not restarted again" in event.message
    records = audit.read()
    launches = [r for r in records if r["action"] == "launch"]
    assert [r["ok"] for r in launches] == [True, False]  # refused once, never retried
    failed = next(s for s in launches[1]["steps"] if s["ok"] is False)
    assert failed["name"] == "format-check" and "--set resume" in failed["detail"]
    auto = [r for r in records if r["action"] == "auto-restart"]
    assert len(auto) == 1 and auto[0]["ok"] is False
    assert auto[0]["refused"] is True and auto[0]["command"] == command
    alerts = receiver.wait(2)
    assert any("without --resume" in m and command in m for m in alerts), alerts
    assert any("CRITICAL sf: " in line and line.endswith(f"-> {command}") for line in lines)


def test_o5_the_resume_command_reproduces_the_previous_command_line(
    tmp_path: Path, demo_tokenizer: Path
) -> None:
    """A run started by hand with other flags than its config's: the command named keeps them,
    and the plan of that command launches exactly the previous argv plus ``--resume``."""
    from supervisor.argv import apply_overrides, parse_sets, parse_unsets, remove_flags
    from supervisor.launchspec import LaunchSpec

    run = ClientRun(tmp_path, "specforge", "http://127.0.0.1:9/v1", demo_tokenizer, resume=False)
    config = run.config
    rc = config.run("sf")
    by_hand = apply_overrides(remove_flags(run.argv, ["--reasoning"]), [("--concurrency", "4")])
    layout = layout_of(config, rc, by_hand)
    wanted = gate.resume_argv(layout)
    assert wanted == [*by_hand, "--resume"]
    command = gate.resume_command(config, rc, wanted, [])
    prefix = expected_command(run)
    assert command == (prefix + "launch sf --set concurrency=4 --set resume --unset reasoning"), (
        command
    )
    args = shlex.split(command)
    sets = parse_sets(args[i + 1] for i, a in enumerate(args) if a == "--set")
    unsets = parse_unsets(args[i + 1] for i, a in enumerate(args) if a == "--unset")
    assert LaunchSpec(run="sf").merged(sets, unsets).argv(rc.argv) == wanted
    # An argv no --set can give back (another interpreter): the argv itself, and where.
    other = ["/usr/bin/python3", *wanted[1:]]
    assert gate.resume_command(config, rc, other, []) == (
        f"on local in {rc.workdir}: " + shlex.join(other)
    )


async def test_o5_the_dashboard_rings_when_the_rollback_of_its_restart_is_refused(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path, clients: list[ClientRun]
) -> None:
    from textual.widgets import Input, Static

    from tui.app import make_app
    from tui.screens.confirm import ConfirmScreen
    from tui.screens.restart import RestartScreen
    from tui.widgets.dataset_table import DatasetTable

    run = specforge(tmp_path, client_server.url, demo_tokenizer, clients, resume=False)
    async with Engine(run.config) as engine:
        first = await engine.execute(await engine.plan("sf", action="launch"))
        assert first.ok, [s.to_json() for s in first.steps]
    await wait_for(lambda: len(run.lines()) >= 4, 90, what="4 records")
    command = expected_command(run, "launch", "sf", "--set", "resume")
    app = make_app(run.config, Engine(run.config))
    async with app.run_test(size=(100, 40)) as pilot:

        def table() -> DatasetTable | None:
            found = [t for t in app.screen.query(DatasetTable) if t.run_key == "local/sf"]
            return found[0] if found and app.refreshes >= 1 else None

        (await wait_for(table, 30, what="the run on the dashboard")).focus()
        await pilot.pause()
        await pilot.press("R")
        screen = await wait_for(
            lambda: app.screen if isinstance(app.screen, RestartScreen) else None, 10
        )
        await wait_for(lambda: screen.plan is not None, 20, what="the plan")
        screen.query_one("#flags", Input).value = f"resume server-address={DEAD}"
        screen.query_one("#allow", Input).focus()
        await pilot.press("enter")
        await wait_for(
            lambda: screen.plan is not None and ("--server-address", DEAD) in screen.plan.overrides,
            20,
            what="the plan with the flags",
        )
        await pilot.press("x")
        await wait_for(lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        await pilot.click("#confirm")
        await wait_for(
            lambda: screen.result is not None and not screen.result.dry_run, 90, what="the restart"
        )
        restarted = screen.result
        assert restarted is not None
        rb = restarted.rollback
        refused = [a for a in app.alerts if a.kind == "start-refused"]
        problem = str(screen.query_one("#problem", Static).content)
    assert rb is not None and rb["refused"] is True and not run.pids()
    assert "ROLLBACK REFUSED" in problem and command in problem
    [event] = refused
    assert event.severity == "critical" and event.title == "sf" and event.command == command
