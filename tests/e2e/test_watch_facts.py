"""Events from facts, on real demo runs under a real watcher (W12-W15): a run that ends at its own
``--token-budget`` finished (no death), its dataset is done once with the final figure and is at
its budget, not over it; a relaunch that adds nothing is not news; a stop with ``runwatch kill``
from another terminal is ``stopped`` with who and from where; a second action on a run waits for
the first, or refuses naming it, audited."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor import audit, runlock
from supervisor.engine import Engine
from tests import fixtures_actions as actions
from tests.e2e.test_watch import running_pid, watching, with_alerts
from tests.fixtures_actions import API_KEY, KEY_ENV, DemoRun, run_pids
from tests.fixtures_alerts import Receiver
from tests.waiting import wait_for, wait_until

TOKENS = 40
"""Every response of the even server is exactly this long."""


@pytest.fixture
def even_endpoint() -> Iterator[Any]:
    """A mock server whose responses all have ``TOKENS`` tokens (about 0.3 s each)."""
    from supervisor.demo.server import MockSettings, serve_in_thread

    settings = MockSettings(decode_tps=150.0, mean_tokens=TOKENS, length_sigma=0.0, api_key=API_KEY)
    with serve_in_thread(settings) as handle:
        yield handle


def kinds(events: list[Any], kind: str) -> list[Any]:
    return [e for e in events if e.kind == kind]


def b1(engine: Engine) -> Any:
    snap = engine.last
    assert snap is not None
    return next(d for h in snap.hosts for r in h.runs if r.name == "demo" for d in r.datasets)


async def test_w12_a_run_at_its_own_token_budget_finished_at_budget_and_done_once(
    tmp_path: Path,
    state_home: Path,
    even_endpoint: Any,
    kill_runs_in: list[Path],
    receiver: Receiver,
) -> None:
    # Budget 390 with 40-token responses: the client stops after the response that reaches it,
    # at 400 tokens: 10 past the budget, less than one record: at budget, not over it.
    demo = DemoRun(
        tmp_path, even_endpoint.url, datasets=("B1",), max_samples=300, concurrency=1,
        extra_argv=("--token-budget", "390"), budgets={"B1": 390},
    )  # fmt: skip
    kill_runs_in.append(demo.workdir)
    with_alerts(demo, receiver)
    async with actions.engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok, actions.why(launched)
        async with watching(engine, tmp_path) as (watcher, _lines):
            await wait_for(lambda: kinds(watcher.events, "finished"), 90, what="its end")
            await wait_for(lambda: kinds(watcher.events, "dataset-done"), 30, what="done")
            final = demo.complete_ids("B1")
            assert "all datasets done" in demo.log_text()
            ds = b1(engine)
            assert ds.completion_tokens == len(final) * TOKENS == 400
            assert not ds.over_budget and "over budget" not in (ds.projection.message or "")

            # Relaunched as it was: the client finds its dataset done and exits at once.
            again = await actions.launch(engine, "demo")
            assert again.ok or "already" in actions.why(again), actions.why(again)
            await wait_for(lambda: not run_pids(demo.workdir), 60, what="the relaunch's end")
            seen = watcher.ticks
            await wait_for(lambda: watcher.ticks >= seen + 4, 60, what="four more refreshes")
            assert running_pid(engine) is None
    (done,) = kinds(watcher.events, "dataset-done")
    assert done.message == f"done: {len(final):,} responses, {len(final) * TOKENS:,} tokens"
    assert not kinds(watcher.events, "run-died"), [e.message for e in watcher.events]
    assert not kinds(watcher.events, "over-budget")
    (fin,) = kinds(watcher.events, "finished")[:1]
    assert fin.severity == "info" and "every dataset done" in fin.message


def kill_cli(demo: DemoRun, *extra: str, stderr: Path | None = None) -> subprocess.Popen[str]:
    """``runwatch kill demo --yes --json`` from another terminal."""
    return subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "-c", str(demo.config_path), "kill", "demo",
         "--yes", "--json", *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
        stderr=subprocess.PIPE if stderr is None else stderr.open("w"),
    )  # fmt: skip


def text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def test_w13_a_kill_from_another_terminal_is_stopped_with_who_not_died(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    receiver: Receiver,
) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    with_alerts(demo, receiver)
    async with actions.engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok, actions.why(launched)
        pid = (launched.identity or {})["pid"]
        async with watching(engine, tmp_path) as (watcher, _lines):
            await wait_for(lambda: running_pid(engine) == pid, 30, what="the run seen running")
            proc = kill_cli(demo)
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, out + err
            await wait_for(lambda: kinds(watcher.events, "stopped"), 60, what="the stop event")
            seen = watcher.ticks
            await wait_for(lambda: watcher.ticks >= seen + 3, 30, what="three more refreshes")
    (stopped,) = kinds(watcher.events, "stopped")
    assert stopped.severity == "info"
    assert f"Stopped through runwatch (pid {pid}) by " in stopped.message
    assert f", pid {proc.pid}, runwatch kill." in stopped.message
    assert not kinds(watcher.events, "run-died"), [e.message for e in watcher.events]
    (kill,) = [r for r in audit.read() if r["action"] == "kill"]
    assert kill["ok"] is True and kill["by"].endswith(f"pid {proc.pid}, runwatch kill")


async def test_w14_a_second_action_on_a_run_waits_then_refuses_naming_the_holder_audited(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    # Short bounds: the kill waits stop_grace_seconds + 2 x command_timeout = 5 s at most.
    demo = DemoRun(
        tmp_path, slow_endpoint.url, max_samples=300, run_toml="stop_grace_seconds = 1.0",
        host_toml='[[hosts]]\nname = "local"\nlocal = true\ncommand_timeout = 2.0\n',
    )  # fmt: skip
    kill_runs_in.append(demo.workdir)
    config = demo.config
    async with actions.engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok, actions.why(launched)
        pid = (launched.identity or {})["pid"]
        # Another action holds the run (a restart in the dashboard, say) for longer.
        async with runlock.hold(config, "demo", 1.0, "restart"):
            holder = runlock.holder(config, "demo")
            assert holder is not None and holder["action"] == "restart"
            proc = kill_cli(demo, "--grace", "1")
            out, err = proc.communicate(timeout=120)
        assert proc.returncode != 0, out
        assert "another runwatch action on it (restart by " in err, err
        assert "has held its lock for more than" in json.loads(out)["error"], (out, err)
        assert run_pids(demo.workdir) == [pid]  # nothing was done to it
        refused = [r for r in audit.read() if r["action"] == "kill"]
        assert len(refused) == 1 and refused[0]["ok"] is False
        assert refused[0]["detail"].startswith("refused: run demo: another runwatch action")

        # Two kills that both saw the run running wait for the holder, then go one at a time:
        # the first stops it, the second finds it gone; both audited with their outcome.
        errs = [tmp_path / "kill1.err", tmp_path / "kill2.err"]
        async with runlock.hold(config, "demo", 1.0, "restart"):
            procs = [kill_cli(demo, "--grace", "3", stderr=e) for e in errs]
            wait_until(
                lambda: all("waiting for another runwatch action" in text(e) for e in errs),
                60,
                what="both kills waiting for the run's lock",
            )
        outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
        assert run_pids(demo.workdir) == []
    outcomes = sorted(r["outcome"] for o in outs for r in o["results"])
    assert outcomes == ["already-gone", "terminated"], outs
    kills = [r for r in audit.read() if r["action"] == "kill"][1:]
    assert len(kills) == 2 and all(r["ok"] for r in kills), kills
    wait_until(lambda: runlock.holder(config, "demo") is None, 10, what="the lock released")


async def test_w16_rows_not_attempted_are_not_missing_unless_the_run_claims_its_input(
    tmp_path: Path,
    state_home: Path,
    even_endpoint: Any,
    kill_runs_in: list[Path],
    receiver: Receiver,
) -> None:
    # B1 has 30 prompts; the run stops at --max-samples 10: 20 rows never attempted.
    demo = DemoRun(
        tmp_path, even_endpoint.url, datasets=("B1",), max_samples=10, prompts=30, concurrency=1
    )
    kill_runs_in.append(demo.workdir)
    with_alerts(demo, receiver)
    async with actions.engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok, actions.why(launched)
        async with watching(engine, tmp_path) as (watcher, _lines):
            await wait_for(
                lambda: (c := b1(engine).completeness) is not None and 0 < c.done < 10,
                60,
                what="the run part way",
            )
            running = b1(engine).completeness
            assert running is not None and running.missing == 0
            assert running.not_reached == 30 - running.done
            await wait_for(lambda: kinds(watcher.events, "finished"), 90, what="its end")
            ended = b1(engine)
    c = ended.completeness
    assert c is not None and (c.input, c.done) == (30, 10)
    assert c.missing == 0 and c.not_reached == 20
    from supervisor.engine import completeness_line

    line = completeness_line(c)
    assert "10 / 30 done" in line and "20 not attempted yet" in line and "missing" not in line


async def test_w17_compare_keeps_an_endpoints_last_rate_with_its_age_after_the_run_ends(
    tmp_path: Path,
    state_home: Path,
    even_endpoint: Any,
    kill_runs_in: list[Path],
    receiver: Receiver,
) -> None:
    demo = DemoRun(tmp_path, even_endpoint.url, datasets=("B1", "B2"), max_samples=12)
    kill_runs_in.append(demo.workdir)
    with_alerts(demo, receiver)
    from supervisor.engine import comparison_from, format_lines

    async with actions.engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok, actions.why(launched)
        async with watching(engine, tmp_path) as (watcher, _lines):
            await wait_for(lambda: kinds(watcher.events, "finished"), 90, what="its end")
        snap = engine.last
        assert snap is not None
        result = comparison_from(demo.config, snap, [])
    (mock,) = [r for r in result.rates if r.endpoint == "mock"]
    # Measured while it ran (about 2 x 150 tok/s), kept with its age once it finished.
    assert mock.out_tok_per_s is not None and 50 < mock.out_tok_per_s < 1000
    assert mock.source.startswith("last live rate, measured ")
    assert "(run demo: " in mock.source and "not running now" in mock.source
    assert mock.measured_at is not None and mock.measured_at <= snap.time
    assert not any(line.rstrip().endswith(": -") for line in format_lines(result))


async def test_w12_done_is_said_with_the_final_figure_not_at_the_budget_with_requests_in_flight(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    receiver: Receiver,
) -> None:
    # Four requests in flight, of varied lengths, when the budget is reached: they land after it.
    demo = DemoRun(
        tmp_path, slow_endpoint.url, datasets=("B1",), max_samples=300, concurrency=4,
        extra_argv=("--token-budget", "500"),
    )  # fmt: skip
    kill_runs_in.append(demo.workdir)
    with_alerts(demo, receiver)
    async with actions.engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok, actions.why(launched)
        async with watching(engine, tmp_path) as (watcher, lines):
            assert any("first refresh: running demo" in line for line in lines), lines
            await wait_for(lambda: kinds(watcher.events, "finished"), 90, what="its end")
            await wait_for(lambda: kinds(watcher.events, "dataset-done"), 30, what="done")
            ds = b1(engine)
    final = demo.complete_ids("B1")
    assert ds.records == len(final) and ds.completion_tokens >= 500
    (done,) = kinds(watcher.events, "dataset-done")
    assert done.message == f"done: {len(final):,} responses, {ds.completion_tokens:,} tokens"
    assert not kinds(watcher.events, "run-died")


async def test_w13_the_dashboard_takes_a_kill_from_another_terminal_for_a_stop_not_a_death(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    spawn: Any,
) -> None:
    """A run started by hand (adopted: no unit records how it ended) is stopped with `runwatch
    kill` in another terminal while the dashboard is open: the audit log says runwatch stopped
    it, so the dashboard raises no "run died"."""
    import os

    from supervisor.engine import Engine as RealEngine
    from tui.app import make_app

    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    env = {**os.environ, KEY_ENV: API_KEY}
    by_hand = spawn(demo.argv, cwd=demo.workdir, env=env, stdout=subprocess.DEVNULL)
    config = demo.config
    app = make_app(config, RealEngine(config), refresh_seconds=0.3)
    async with app.run_test(size=(120, 36)):

        def state() -> str | None:
            snap = app.snapshot
            runs = [r for h in (snap.hosts if snap else []) for r in h.runs if r.name == "demo"]
            return runs[0].state if runs else None

        await wait_for(lambda: state() == "running", 60, what="the dashboard sees it running")
        proc = kill_cli(demo)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
        assert by_hand.wait(30) is not None
        await wait_for(lambda: state() == "stopped", 30, what="the dashboard sees it stopped")
        seen = app.refreshes
        await wait_for(lambda: app.refreshes >= seen + 3, 30, what="three more refreshes")
    assert not [a for a in app.alerts if a.kind == "run-died"], [a.message for a in app.alerts]
    (kill,) = [r for r in audit.read() if r["action"] == "kill"]
    assert kill["ok"] is True and kill["identity"]["pid"] == by_hand.pid
