"""A kill cancels the watcher's intents (W31), a restart begun by a watcher SIGKILLed at that
instant is audited by the next one (W32), a signalled death says its signal (W33), and a kill
that waits for a restart under way stops the run it started (W36).

Real watchers (``runwatch watch`` processes), real demo runs, the real ``runwatch kill`` CLI and
the audit log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from supervisor import audit
from tests.e2e.test_watch_cli import start, text
from tests.e2e.test_watch_intents import intent_file, launch
from tests.fixtures_actions import DemoRun, run_pids
from tests.waiting import wait_until

BACKOFF = """on_exit = "restart"
restart_backoff_seconds = {backoff}
restart_max = 3
restart_window_seconds = 600
settle_seconds = 0.5"""


def runwatch(demo: DemoRun, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "-c", str(demo.config_path), *args],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def test_w31_a_kill_during_the_backoff_cancels_the_restart_in_this_watcher_and_the_next(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    spawn: Callable[..., Any],
) -> None:
    # The kill must start inside the backoff: 20 s leave room for a loaded machine's slow start
    # of the CLI (6 s were passed once, and the kill then met the watcher's restart).
    demo = DemoRun(
        tmp_path, slow_endpoint.url, max_samples=300, run_toml=BACKOFF.format(backoff=20)
    )
    kill_runs_in.append(demo.workdir)
    pid = launch(demo)
    out = tmp_path / "first.out"
    watcher = start(spawn, demo.config_path, out)
    wait_until(lambda: "first refresh: running demo" in text(out), 60, what="a refresh")
    os.kill(pid, signal.SIGKILL)
    wait_until(intent_file(demo).exists, 60, what="the restart intent before the backoff")
    due = json.loads(intent_file(demo).read_text())["not_before"]
    # A signalled death says its signal, by number and name (the intent is written inside the
    # tick, its event printed when the tick ends).
    wait_until(lambda: "Run stopped" in text(out), 30, what="the death's event")
    line = next(li for li in text(out).splitlines() if "Run stopped" in li)
    assert "died (signal 9, SIGKILL)" in line, line

    killed = runwatch(demo, "kill", "demo", "--yes")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "is not running" in killed.stderr
    assert "cancelled the pending restart of demo (kill): restart 1 (run-died:" in killed.stderr
    assert not intent_file(demo).exists()
    cancelled = [r for r in audit.read() if r["action"] == "restart-cancelled"]
    assert len(cancelled) == 1 and cancelled[0]["run"] == "demo" and cancelled[0]["ok"] is True
    assert "restart 1" in cancelled[0]["detail"]

    # The watcher reads the kill's record and drops the restart it held in memory, before its
    # backoff ends; the restart is never made.
    wait_until(
        lambda: "demo: its pending restart on failure was cancelled by" in text(out),
        90,
        what="the watcher dropping the cancelled restart",
    )
    assert "restart 1 (run-died:" in text(out).split("its pending restart on failure")[1]
    # Well past its backoff (ten refreshes of 0.3 s), nothing was started.
    wait_until(lambda: time.time() > due + 3.0, 60, what="the end of the cancelled backoff")
    assert run_pids(demo.workdir) == []
    assert not [r for r in audit.read() if r["action"] == "auto-restart"]
    assert len([r for r in audit.read() if r["action"] == "launch"]) == 1, "a restart was made"
    watcher.send_signal(signal.SIGTERM)
    assert watcher.wait(30) == 0

    # A new watcher finds nothing to take over.
    second_out = tmp_path / "second.out"
    second = start(spawn, demo.config_path, second_out)
    wait_until(lambda: "first refresh" in text(second_out), 60, what="the second watcher")
    assert "took over" not in text(second_out)
    assert run_pids(demo.workdir) == [] and not intent_file(demo).exists()
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 0
    assert "Traceback" not in text(out) + text(second_out)


def test_w31_a_kill_of_a_running_run_cancels_a_pending_intent_too(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
) -> None:
    """An intent left by a dead watcher while the run was started again by hand: a kill of the
    running run removes it (audited), so no later watcher restarts what was killed."""
    from supervisor import intents
    from supervisor.config import load_config

    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300, run_toml=BACKOFF.format(backoff=6))
    kill_runs_in.append(demo.workdir)
    launch(demo)
    config = load_config(demo.config_path)
    intents.write(
        config,
        intents.Intent(
            run="demo", host="local", attempt=2, not_before=0.0, reason="run-died: earlier",
            written=1.0, by="a watcher that died",
        ),
    )  # fmt: skip
    killed = runwatch(demo, "kill", "demo", "--yes")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert run_pids(demo.workdir) == [] and not intent_file(demo).exists()
    (rec,) = [r for r in audit.read() if r["action"] == "restart-cancelled"]
    assert (
        "restart 2 (run-died: earlier" in rec["detail"] and "a watcher that died" in rec["detail"]
    )


def test_w32_a_restart_begun_by_a_watcher_killed_at_that_instant_is_audited_by_the_next(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    spawn: Callable[..., Any],
) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300, run_toml=BACKOFF.format(backoff=2))
    kill_runs_in.append(demo.workdir)
    pid = launch(demo)
    first_out = tmp_path / "first.out"
    first = start(spawn, demo.config_path, first_out)
    wait_until(lambda: "first refresh: running demo" in text(first_out), 60, what="a refresh")
    os.kill(pid, signal.SIGKILL)

    def begun() -> dict[str, Any] | None:
        try:
            it = json.loads(intent_file(demo).read_text())
        except (OSError, ValueError):
            return None
        return it if it.get("started") is not None else None

    it = wait_until(begun, 90, what="the intent marked started", interval=0.002)
    first.send_signal(signal.SIGKILL)  # at the instant the restart begins
    first.wait(30)
    assert it["attempt"] == 1 and it["started_by"]
    assert not [r for r in audit.read() if r["action"] == "auto-restart"]

    second_out = tmp_path / "second.out"
    second = start(spawn, demo.config_path, second_out)
    wait_until(
        lambda: "was begun by a watcher that ended" in text(second_out), 60, what="the takeover"
    )
    wait_until(
        lambda: [r for r in audit.read() if r["action"] == "auto-restart" and r.get("reconciled")],
        90,
        what="the begun restart audited by the next watcher",
    )
    (rec,) = [r for r in audit.read() if r["action"] == "auto-restart" and r.get("reconciled")]
    assert "by a watcher that ended before recording it" in rec["detail"]
    assert "restart 1 (run-died:" in rec["detail"]
    # Made, or interrupted and made again: either way the run ends up running, once.
    wait_until(lambda: len(run_pids(demo.workdir)) == 1, 120, what="the run running again")
    wait_until(lambda: not intent_file(demo).exists(), 60, what="the intent removed")
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 0
    assert "Traceback" not in text(first_out) + text(second_out)


def test_w36_a_kill_that_waits_for_a_restart_under_way_stops_the_run_it_started(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    spawn: Callable[..., Any],
) -> None:
    """A restart on failure under way (begun, in its quiet window: the run not up yet, its lock
    held) when ``runwatch kill`` lists the host: the kill waits for the lock, then stops the run
    the restart started, instead of saying "not running" and leaving it up."""
    import asyncio
    import threading

    from supervisor import intents, runlock
    from supervisor.config import load_config
    from supervisor.engine import Engine
    from supervisor.steps import execute as execute_plan

    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300, run_toml=BACKOFF.format(backoff=6))
    kill_runs_in.append(demo.workdir)
    config = load_config(demo.config_path)
    now = time.time()
    intents.write(
        config,
        intents.Intent(
            run="demo", host="local", attempt=1, not_before=now, reason="run-died: earlier",
            written=now - 6, by="a watcher", started=now, started_by=audit.actor(),
        ),
    )  # fmt: skip
    held, go = threading.Event(), threading.Event()
    launched: list[Any] = []

    async def restart_under_way() -> None:
        # What Engine.execute does for a restart: the run's lock, then the plan's steps.
        engine = Engine(config)
        try:
            async with runlock.hold(config, "demo", 60, "launch"):
                held.set()
                while not go.is_set():
                    await asyncio.sleep(0.02)
                plan = await engine.plan("demo", action="launch")
                launched.append(await execute_plan(engine, plan))
        finally:
            await engine.aclose()

    restart = threading.Thread(target=asyncio.run, args=(restart_under_way(),))
    restart.start()
    try:
        held.wait(30)
        err = tmp_path / "kill.err"
        kill = spawn(
            [sys.executable, "-m", "supervisor.cli", "-c", str(demo.config_path),
             "kill", "demo", "--yes"],
            stdout=subprocess.DEVNULL, stderr=err.open("wb"),
        )  # fmt: skip
        wait_until(lambda: "waiting for another runwatch action" in text(err), 60, what="a wait")
        assert run_pids(demo.workdir) == []
    finally:
        go.set()
        restart.join(180)
    assert launched and launched[0].ok, launched
    assert kill.wait(180) == 0, text(err)
    assert run_pids(demo.workdir) == [], text(err)
    assert "started by another runwatch action while this kill waited" in text(err)
    kills = [r for r in audit.read() if r["action"] == "kill"]
    assert [(r["run"], r["ok"]) for r in kills] == [("demo", True)], kills
    assert not intent_file(demo).exists()
    # The restart was made by a live process (this one, as a watcher would be): it audits its
    # own outcome; the kill records no outcome of it and cancelled nothing.
    others = [r for r in audit.read() if r["action"] not in ("kill", "launch")]
    assert not others and not [r for r in audit.read() if r.get("reconciled")], others


def test_w33_a_death_of_a_run_started_by_hand_says_its_end_is_unknown_not_the_last_launchs(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    spawn: Callable[..., Any],
) -> None:
    """Launched by runwatch and killed (its waiter recorded SIGKILL), then started again by hand
    and killed by SIGSEGV: no waiter recorded that end, so the death says it is unknown, never
    the earlier launch's signal. A launched run's SIGSEGV is named as such."""
    from tests.fixtures_actions import API_KEY, KEY_ENV

    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    os.kill(launch(demo), signal.SIGKILL)
    wait_until(lambda: run_pids(demo.workdir) == [], 30, what="the launched run gone")
    by_hand = spawn(
        demo.argv, cwd=demo.workdir, env={**os.environ, KEY_ENV: API_KEY},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_until(lambda: run_pids(demo.workdir) == [by_hand.pid], 30, what="the run by hand")
    out = tmp_path / "watch.out"
    watcher = start(spawn, demo.config_path, out)
    wait_until(lambda: "first refresh: running demo" in text(out), 60, what="a refresh")
    by_hand.send_signal(signal.SIGSEGV)
    wait_until(lambda: "Run stopped" in text(out), 30, what="the death's event")
    line = next(li for li in text(out).splitlines() if "Run stopped" in li)
    assert "how it ended unknown (runwatch did not start it" in line, line
    assert "SIGKILL" not in line and "signal" not in line, line

    # Launched by runwatch: its waiter recorded the signal, named in the event.
    pid = launch(demo)
    wait_until(
        lambda: "1 run(s) running" in text(out).split("Run stopped", 1)[1],
        60,
        what="the launch seen",
    )
    os.kill(pid, signal.SIGSEGV)
    wait_until(lambda: text(out).count("Run stopped") >= 2, 30, what="the second death")
    second = [li for li in text(out).splitlines() if "Run stopped" in li][1]
    assert "died (signal 11, SIGSEGV)" in second, second
    watcher.send_signal(signal.SIGTERM)
    assert watcher.wait(30) == 0


def test_w32_a_kill_before_the_next_watcher_audits_the_begun_restart_by_what_it_finds(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    spawn: Callable[..., Any],
) -> None:
    """The watcher SIGKILLed at the instant its restart begins, then `runwatch kill` before any
    next watcher: the kill audits the begun restart by what it finds (made: the run was running
    and is stopped; interrupted: it was not), once, and no later watcher audits or makes it."""
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300, run_toml=BACKOFF.format(backoff=2))
    kill_runs_in.append(demo.workdir)
    pid = launch(demo)
    first_out = tmp_path / "first.out"
    first = start(spawn, demo.config_path, first_out)
    wait_until(lambda: "first refresh: running demo" in text(first_out), 60, what="a refresh")
    os.kill(pid, signal.SIGKILL)

    def begun() -> dict[str, Any] | None:
        try:
            it = json.loads(intent_file(demo).read_text())
        except (OSError, ValueError):
            return None
        return it if it.get("started") is not None else None

    wait_until(begun, 90, what="the intent marked started", interval=0.002)
    first.send_signal(signal.SIGKILL)
    first.wait(30)

    killed = runwatch(demo, "kill", "demo", "--yes")
    stopped = [r for r in audit.read() if r["action"] == "kill" and r["ok"]]
    assert killed.returncode == 0, killed.stdout + killed.stderr
    (rec,) = [r for r in audit.read() if r["action"] == "auto-restart"]
    assert rec.get("reconciled") is True and rec["ok"] is bool(stopped), rec
    assert "restart 1 (run-died:" in rec["detail"]
    assert "by a watcher that ended before recording it" in rec["detail"]
    made = "the run is running: the restart was made"
    assert (made if stopped else "the restart was interrupted") in rec["detail"], rec
    cancels = [r for r in audit.read() if r["action"] == "restart-cancelled"]
    assert len(cancels) == (0 if stopped else 1), cancels
    assert not intent_file(demo).exists() and run_pids(demo.workdir) == []

    second_out = tmp_path / "second.out"
    second = start(spawn, demo.config_path, second_out)
    wait_until(lambda: "refresh 3:" in text(second_out), 60, what="the second watcher's refreshes")
    assert "begun by a watcher" not in text(second_out) and "took over" not in text(second_out)
    assert len([r for r in audit.read() if r["action"] == "auto-restart"]) == 1
    assert run_pids(demo.workdir) == []
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 0


def test_w31_a_kill_of_a_dead_run_before_the_watcher_saw_it_gone_is_not_restarted(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    spawn: Callable[..., Any],
) -> None:
    """The run dies while the watcher is held up (SIGSTOP: a laptop's suspended process, a
    refresh stuck behind a host), and `runwatch kill` finds it not running with nothing
    pending: the kill is recorded, and the watcher, seeing the death afterwards, alerts it but
    does not restart what the user stopped."""
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300, run_toml=BACKOFF.format(backoff=1))
    kill_runs_in.append(demo.workdir)
    pid = launch(demo)
    out = tmp_path / "watch.out"
    watcher = start(spawn, demo.config_path, out)
    wait_until(lambda: "first refresh: running demo" in text(out), 60, what="a refresh")
    watcher.send_signal(signal.SIGSTOP)
    try:
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: run_pids(demo.workdir) == [], 30, what="the run gone")
        killed = runwatch(demo, "kill", "demo", "--yes")
        assert "is not running" in killed.stderr, killed.stderr
        assert "recorded as stopped by kill" in killed.stderr, killed.stderr
        assert not intent_file(demo).exists()
    finally:
        watcher.send_signal(signal.SIGCONT)
    wait_until(lambda: "Run stopped" in text(out), 60, what="the death seen")
    # Which the watcher reads first on a loaded machine, the death or the kill's record, says
    # which words it uses; either way nothing is started (asserted below).
    wait_until(
        lambda: (
            "demo: not restarted: stopped by" in text(out)
            or "demo: its pending restart on failure was cancelled by" in text(out)
        ),
        60,
        what="the watcher not restarting that death",
    )
    # Well past its 1 s backoff (ten refreshes of 0.3 s): nothing was started, nothing is left.
    ticks = text(out).count("refresh ")
    wait_until(lambda: text(out).count("refresh ") >= ticks + 10, 60, what="ten more refreshes")
    assert run_pids(demo.workdir) == [] and not intent_file(demo).exists()
    assert not [r for r in audit.read() if r["action"] == "auto-restart"]
    assert len([r for r in audit.read() if r["action"] == "launch"]) == 1, "a restart was made"
    watcher.send_signal(signal.SIGTERM)
    assert watcher.wait(30) == 0
    assert "Traceback" not in text(out)
