"""The dashboard applies each run's budget policy: with ``stop``, a real run past its dataset's
budget (and without ``--token-budget``) is stopped exactly once, audited, and a notification says
so; the deliberate stop is not reported as a death."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.config import load_config
from supervisor.engine import Engine
from tests.fixtures_actions import over_budget_stop_run
from tests.fixtures_procs import FakeRuns, gone
from tests.waiting import wait_for
from tui.app import make_app


async def test_dashboard_stops_an_over_budget_run_exactly_once(
    tmp_path: Path, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    run, cfg = over_budget_stop_run(tmp_path, fake_runs, seed=5, top="refresh_seconds = 0.3")
    config = load_config(cfg)
    app = make_app(config, Engine(config))
    async with app.run_test(size=(120, 36)):
        await wait_for(lambda: gone(run.pid, run.start_time), timeout=60, what="the stop")
        await wait_for(
            lambda: any(a.kind == "budget-policy" for a in app.alerts), 30, what="the notification"
        )
        seen = app.refreshes
        await wait_for(lambda: app.refreshes >= seen + 3, 30, what="three more refreshes")
    policy = [a for a in app.alerts if a.kind == "budget-policy"]
    assert len(policy) == 1, app.alerts
    assert "stop" in policy[0].title and policy[0].severity == "info"
    assert not any(a.kind == "run-died" for a in app.alerts), app.alerts
    records = [json.loads(line) for line in (state / "runwatch" / "audit.jsonl").open()]
    assert [r["action"] for r in records] == ["kill", "budget"], records
    assert records[0]["identity"]["pid"] == run.pid


async def test_the_dashboard_keeps_refreshing_while_the_policy_stops_a_run(
    tmp_path: Path, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy acts inside a tick of the engine's loop (``Engine.tick``); a run that ignores
    SIGTERM takes its whole grace to stop, and meanwhile the screen still refreshes. Once it is
    gone: one notification of the policy, no death."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    run, cfg = over_budget_stop_run(
        tmp_path, fake_runs, seed=6, top="refresh_seconds = 0.3", ignore_term=True
    )
    config = load_config(cfg)
    app = make_app(config, Engine(config))
    async with app.run_test(size=(120, 36)):
        await wait_for(lambda: run.term_count() >= 1, timeout=60, what="the policy's SIGTERM")
        seen = app.refreshes
        await wait_for(
            lambda: app.refreshes >= seen + 2 or gone(run.pid, run.start_time),
            timeout=30,
            what="refreshes during the stop",
        )
        assert not gone(run.pid, run.start_time), "no refresh shown while the stop was under way"
        assert app.refreshes >= seen + 2
        await wait_for(lambda: gone(run.pid, run.start_time), timeout=60, what="the stop")
        await wait_for(
            lambda: any(a.kind == "budget-policy" for a in app.alerts), 30, what="the notification"
        )
        seen = app.refreshes
        await wait_for(lambda: app.refreshes >= seen + 3, 30, what="three more refreshes")
    assert [a.kind for a in app.alerts].count("budget-policy") == 1, app.alerts
    assert not any(a.kind == "run-died" for a in app.alerts), app.alerts
