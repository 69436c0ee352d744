"""The watcher on a real demo run: an over-budget run and a killed run each give exactly one
alert naming the command to act; ``on_exit = "restart"`` brings a killed run back through the
launch gate, and gives up on one that keeps dying."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from supervisor import audit
from supervisor.engine import Engine
from supervisor.watch import Watcher, WatchLock, watch
from tests import fixtures_actions as actions
from tests.fixtures_actions import DemoRun, pid_alive, run_pids
from tests.fixtures_alerts import Receiver
from tests.waiting import wait_for

BUDGET = 1200
RESTART_TOML = """on_exit = "restart"
restart_backoff_seconds = 0.2
restart_max = 2
restart_window_seconds = 600
settle_seconds = 0.5"""


def with_alerts(demo: DemoRun, receiver: Receiver) -> None:
    """Send the demo config's alerts to ``receiver``."""
    text = demo.config_path.read_text()
    demo.config_path.write_text(text + f'\n[alerts]\nurls = ["{receiver.url()}"]\n')


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
    assert lines[0].endswith(" run(s) every 0.3 s; alerts to json://127.0.0.1/***")
    assert lines[-1].endswith("stopped")


def running_pid(engine: Engine, run: str = "demo") -> int | None:
    """The pid the watcher's last refresh saw the run running as."""
    snap = engine.last
    for h in snap.hosts if snap else []:
        for r in h.runs:
            if r.name == run and r.state == "running" and r.process is not None:
                return r.process.identity.pid
    return None


async def test_over_budget_and_a_killed_run_alert_once_each_with_the_command(
    tmp_path: Path,
    state_home: Path,
    mock_endpoint: Any,
    kill_runs_in: list[Path],
    receiver: Receiver,
) -> None:
    demo = DemoRun(
        tmp_path, mock_endpoint.url, datasets=("B2",), max_samples=300, budgets={"B2": BUDGET}
    )
    kill_runs_in.append(demo.workdir)
    with_alerts(demo, receiver)
    cfg_path = str(demo.config_path.resolve())
    async with actions.engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok, actions.why(launched)
        pid = (launched.identity or {})["pid"]
        async with watching(engine, tmp_path) as (watcher, lines):
            await wait_for(
                lambda: any("demo B2" in m for m in receiver.messages()),
                90,
                what="the over-budget alert",
            )
            over = [m for m in receiver.messages() if "demo B2" in m]
            assert len(over) == 1
            assert (
                f"Act: runwatch -c {cfg_path} restart demo --set token-budget={BUDGET}" in over[0]
            )
            assert pid_alive(pid)  # warn: nothing was done to it

            os.kill(pid, signal.SIGKILL)
            await wait_for(
                lambda: any("Run stopped" in m for m in receiver.messages()),
                60,
                what="the run-died alert",
            )
            died = [m for m in receiver.messages() if "Run stopped" in m]
            assert len(died) == 1 and f"Act: runwatch -c {cfg_path} launch demo" in died[0]
            assert f"pid {pid}" in died[0]
            assert "last lines of" in died[0] and "run.log" in died[0]
            # Later refreshes add nothing: one alert per event.
            seen = watcher.ticks
            await wait_for(lambda: watcher.ticks >= seen + 4, 60, what="four more refreshes")
            assert len(receiver.bodies) == 2, receiver.messages()
            assert not run_pids(demo.workdir)  # on_exit is "alert": not restarted
    text = "\n".join(lines)
    assert "WARNING demo B2" in text
    assert "CRITICAL demo: Run stopped" in text


async def test_a_run_that_dies_once_is_restarted_through_the_gate(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    receiver: Receiver,
) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300, run_toml=RESTART_TOML)
    kill_runs_in.append(demo.workdir)
    with_alerts(demo, receiver)
    async with actions.engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok, actions.why(launched)
        pid = (launched.identity or {})["pid"]
        async with watching(engine, tmp_path) as (watcher, _lines):
            await wait_for(lambda: running_pid(engine) == pid, 30, what="the run seen running")
            # Data to hand the restarted client (a start over no data keeps no snapshot).
            await wait_for(lambda: demo.lines("B1"), 60, what="a first record of B1")
            os.kill(pid, signal.SIGKILL)
            done = await wait_for(
                lambda: [e for e in watcher.events if e.kind == "restart-done"],
                90,
                what="the automatic restart",
            )
            assert len(done) == 1
            new = await wait_for(
                lambda: running_pid(engine) not in (None, pid) and running_pid(engine), 30
            )
            assert pid_alive(new) and not pid_alive(pid)
            assert [e.kind for e in watcher.events if e.run == "demo"][:2] == [
                "run-died",
                "restart-done",
            ]
            # Delivered while the watcher runs (what is in flight when it stops stays in its
            # spool for the next one).
            for text in ("Run stopped", "Restarted automatically"):
                await wait_for(
                    lambda t=text: any(t in m for m in receiver.messages()),  # type: ignore[misc]
                    30,
                    what=f"the alert {text!r}",
                )
    records = audit.read()
    launches = [r for r in records if r["action"] == "launch"]
    assert len(launches) == 2 and all(r["ok"] for r in launches)
    # The watcher's restart kept the data it handed the new client, as every start does.
    assert (launches[1].get("snapshot") or {}).get("id"), launches[1]
    # The restart ran the whole gate: the checks first, then the launch.
    assert [s["name"] for s in launches[1]["steps"]] == [
        "preflight",
        "format-check",
        "fingerprint",
        "writers",
        "quiet",
        "data-repair",
        "launch",
    ]
    auto = [r for r in records if r["action"] == "auto-restart"]
    assert len(auto) == 1 and auto[0]["ok"] and "restart 1 of at most 2" in auto[0]["detail"]


async def test_a_run_that_keeps_dying_is_given_up_not_looped(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    receiver: Receiver,
) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300, run_toml=RESTART_TOML)
    kill_runs_in.append(demo.workdir)
    with_alerts(demo, receiver)
    async with actions.engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok, actions.why(launched)
        pid = (launched.identity or {})["pid"]
        async with watching(engine, tmp_path) as (watcher, _lines):
            killed: list[int] = []
            for _ in range(3):  # restart_max = 2: the third death gives up
                await wait_for(
                    lambda: running_pid(engine) not in (None, *killed), 90, what="the run running"
                )
                pid = running_pid(engine) or 0
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            gave_up = await wait_for(
                lambda: [e for e in watcher.events if e.kind == "restart-gave-up"], 60
            )
            assert "gave up after 2 restarts in 600 s" in gave_up[0].message
            seen = watcher.ticks
            await wait_for(lambda: watcher.ticks >= seen + 5, 60, what="five more refreshes")
            assert running_pid(engine) is None and not run_pids(demo.workdir)
    launches = [r for r in audit.read() if r["action"] == "launch"]
    assert len(launches) == 3  # the first by hand, two automatic, no more
    assert sum("gave up after 2 restarts" in m for m in receiver.messages()) == 1


async def test_a_restart_through_runwatch_is_reported_done_not_died(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    receiver: Receiver,
) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300, run_toml=RESTART_TOML)
    kill_runs_in.append(demo.workdir)
    with_alerts(demo, receiver)
    async with actions.engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok, actions.why(launched)
        pid = (launched.identity or {})["pid"]
        async with watching(engine, tmp_path) as (watcher, _lines):
            await wait_for(lambda: running_pid(engine) == pid, 30, what="the run seen running")
            result = await actions.restart(engine, "demo")
            assert result.ok, actions.why(result)
            new = (result.identity or {})["pid"]
            await wait_for(lambda: running_pid(engine) == new, 30, what="the new process seen")
            done = await wait_for(
                lambda: [e for e in watcher.events if e.kind == "restart-done"], 30
            )
            assert f"Restarted: pid {new}" in done[0].message
            seen = watcher.ticks
            await wait_for(lambda: watcher.ticks >= seen + 3, 30, what="three more refreshes")
            # Stopped through runwatch: not a death, and not restarted by the policy.
            assert not [e for e in watcher.events if e.kind in ("run-died", "restart-failed")]
            assert run_pids(demo.workdir) == [new]
    assert [r["action"] for r in audit.read()] == ["launch", "restart"]


async def test_the_budget_policy_stop_is_alerted_once_and_is_not_a_death(
    tmp_path: Path, state_home: Path, fake_runs: Any, receiver: Receiver
) -> None:
    from supervisor.config import load_config
    from tests.fixtures_actions import over_budget_stop_run
    from tests.fixtures_procs import gone

    run, cfg = over_budget_stop_run(tmp_path, fake_runs, seed=7)
    cfg.write_text(cfg.read_text() + f'\n[alerts]\nurls = ["{receiver.url()}"]\n')
    engine = Engine(load_config(cfg))
    try:
        async with watching(engine, tmp_path) as (watcher, _lines):
            await wait_for(lambda: gone(run.pid, run.start_time), 60, what="the stop")
            await wait_for(lambda: [e for e in watcher.events if e.kind == "budget-policy"], 30)
            seen = watcher.ticks
            await wait_for(lambda: watcher.ticks >= seen + 3, 30, what="three more refreshes")
    finally:
        await engine.aclose()
    kinds = [e.kind for e in watcher.events]
    assert kinds.count("budget-policy") == 1 and "run-died" not in kinds
    assert kinds.count("over-budget") <= 1
    policy = [m for m in receiver.messages() if "Budget policy stop: gen" in m]
    assert len(policy) == 1 and "stopped pid" in policy[0]
    assert not [m for m in receiver.messages() if "Run stopped" in m]


async def test_a_run_killed_through_runwatch_or_finished_is_not_restarted(
    tmp_path: Path,
    state_home: Path,
    mock_endpoint: Any,
    kill_runs_in: list[Path],
    receiver: Receiver,
) -> None:
    # Ten responses: it finishes (exit 0) a few seconds after its launch.
    demo = DemoRun(
        tmp_path, mock_endpoint.url, datasets=("B1",), max_samples=10, run_toml=RESTART_TOML
    )
    kill_runs_in.append(demo.workdir)
    with_alerts(demo, receiver)
    async with actions.engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok, actions.why(launched)
        async with watching(engine, tmp_path) as (watcher, _lines):
            await wait_for(
                lambda: [e for e in watcher.events if e.kind == "all-done"], 60, what="all done"
            )
            # Its last record is counted before it exits: the exit comes a refresh later.
            await wait_for(lambda: running_pid(engine) is None, 30, what="its exit")
            relaunched = await actions.launch(engine, "demo", ["max-samples=400"])
            assert relaunched.ok, actions.why(relaunched)
            pid = (relaunched.identity or {})["pid"]
            await wait_for(lambda: running_pid(engine) == pid, 30, what="the run seen running")
            identity = next(
                r.process.identity
                for h in (engine.last.hosts if engine.last else [])
                for r in h.runs
                if r.name == "demo" and r.process is not None
            )
            report = await engine.kill("local", identity, 5.0, run="demo")
            assert report.results
            await wait_for(lambda: running_pid(engine) is None, 30, what="the run seen gone")
            seen = watcher.ticks
            await wait_for(lambda: watcher.ticks >= seen + 4, 30, what="four more refreshes")
    kinds = [e.kind for e in watcher.events]
    assert "run-died" not in kinds and "restart-done" not in kinds, kinds
    assert "dataset-done" in kinds
    assert [r["action"] for r in audit.read()] == ["launch", "launch", "kill"]
    assert not run_pids(demo.workdir)


async def test_w18_a_death_is_seen_and_alerted_while_another_runs_restart_is_under_way(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    receiver: Receiver,
) -> None:
    # "demo"'s restart takes its settle time (8 s) to confirm its launch: the refreshes meanwhile
    # must still see "other" die and alert it, before the restart is done.
    slow_restart = RESTART_TOML.replace("settle_seconds = 0.5", "settle_seconds = 8.0")
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300, run_toml=slow_restart)
    other = DemoRun(tmp_path / "other", slow_endpoint.url, max_samples=300)
    kill_runs_in += [demo.workdir, other.workdir]
    block = other.config_path.read_text().split("[[runs]]", 1)[1].split("[[endpoints]]", 1)[0]
    with open(demo.config_path, "a") as f:
        f.write("\n[[runs]]" + block.replace('name = "demo"', 'name = "other"'))
    with_alerts(demo, receiver)
    async with actions.engine_for(demo) as engine:
        pids = {}
        for run in ("demo", "other"):
            launched = await actions.launch(engine, run)
            assert launched.ok, actions.why(launched)
            pids[run] = (launched.identity or {})["pid"]
        async with watching(engine, tmp_path) as (watcher, lines):
            for run in ("demo", "other"):
                await wait_for(lambda r=run: running_pid(engine, r) == pids[r], 30)  # type: ignore[misc]
            os.kill(pids["demo"], signal.SIGKILL)
            # The restart's launch is under way: its new process waits out the settle time.
            await wait_for(
                lambda: [p for p in run_pids(demo.workdir) if p != pids["demo"]], 30, what="restart"
            )
            os.kill(pids["other"], signal.SIGKILL)
            await wait_for(
                lambda: [e for e in watcher.events if e.kind == "restart-done"],
                90,
                what="the automatic restart",
            )
    kinds = [(e.kind, e.run) for e in watcher.events if e.kind in ("run-died", "restart-done")]
    assert kinds[:3] == [("run-died", "demo"), ("run-died", "other"), ("restart-done", "demo")]
    died_at = next(i for i, x in enumerate(lines) if "other" in x and "Run stopped" in x)
    done_at = next(i for i, x in enumerate(lines) if "Restarted automatically" in x)
    # The refreshes went on meanwhile: their own lines, not "still under way" notes.
    assert sum(" refresh " in x and "still under way" not in x for x in lines[died_at:done_at]) > 1
    assert any("other" in m and "Run stopped" in m for m in receiver.messages())


async def test_w21_a_host_that_stops_answering_after_a_death_holds_up_neither_alert_nor_refresh(
    tmp_path: Path,
) -> None:
    """The dead run's log tail is asked of its host after the refresh that saw the death: a host
    frozen meanwhile (its agent SIGSTOPped; its command timeout 60 s) costs the event its log lines
    (it says why) after one refresh interval, not the host's command timeout."""
    import time

    from supervisor.config import load_config
    from supervisor.events import Event

    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[[hosts]]\nname = "here"\nlocal = true\n\n'
        '[[hosts]]\nname = "there"\nlocal = true\ncommand_timeout = 60.0\n\n'
        f'[[runs]]\nname = "r"\nhost = "there"\nworkdir = "{tmp_path}"\n'
        'argv = ["python3", "run_inference.py"]\nlog = "run.log"\n'
    )
    (tmp_path / "run.log").write_text("Traceback: CUDA out of memory\n")
    async with Engine(load_config(cfg)) as engine:
        await engine.refresh()
        watcher = Watcher(engine, emit=lambda _: None, interval=0.5)
        died = Event(kind="run-died", severity="critical", host="there", run="r", title="r",
                     message="Run stopped (pid 1) on there", key="k", time=time.time())  # fmt: skip
        answered = await watcher._with_log(died)
        assert answered.lines[1:] == ["Traceback: CUDA out of memory"]
        hello = engine.host("there").hello
        assert hello is not None
        os.kill(int(hello["pid"]), signal.SIGSTOP)
        try:
            # Far below the host's command timeout: the wait is one refresh interval (>= 2 s).
            frozen = await asyncio.wait_for(watcher._with_log(died), 30)
        finally:
            os.kill(int(hello["pid"]), signal.SIGCONT)
    assert frozen.lines == ["its log not read: there gave no answer within 2 s"]
