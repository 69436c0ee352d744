"""The budget guard acts exactly once per event on a real over-budget demo run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from supervisor import audit
from supervisor.guard import BudgetGuard, GuardOutcome
from tests import fixtures_actions as actions
from tests.fixtures_actions import DemoRun, engine_for, pid_alive, run_pids
from tests.waiting import wait_until

BUDGET = 1200


def over_budget_demo(
    tmp_path: Path, url: str, kill_runs_in: list[Path], datasets: tuple[str, ...], policy: str
) -> DemoRun:
    """A demo run of ``datasets`` that goes past ``BUDGET`` tokens on each, under ``policy``;
    its clients are killed at teardown."""
    demo = DemoRun(
        tmp_path,
        url,
        datasets=datasets,
        max_samples=300,
        budgets=dict.fromkeys(datasets, BUDGET),
        policy=policy,
    )
    kill_runs_in.append(demo.workdir)
    return demo


async def until_acted(
    guard: BudgetGuard, engine: Any, timeout: float = 90.0
) -> tuple[Any, list[GuardOutcome]]:
    """Refresh and enforce until the guard acts; return the snapshot it acted on and outcomes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        snap = await engine.refresh()
        outcomes = await guard.enforce(engine, snap)
        if outcomes:
            return snap, outcomes
        assert loop.time() < deadline, "the guard never acted"
        await asyncio.sleep(0.2)  # the next refresh, as status --watch would do


async def test_warn_is_audited_once_and_changes_nothing(
    tmp_path: Path, state_home: Path, mock_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    demo = over_budget_demo(tmp_path, mock_endpoint.url, kill_runs_in, ("B2",), "warn")
    async with engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok
        guard = BudgetGuard(demo.config)
        _snap, outcomes = await until_acted(guard, engine)
        assert [o.event.policy for o in outcomes] == ["warn"]
        event = outcomes[0].event
        assert event.datasets == ["B2"] and event.tokens["B2"] > BUDGET
        assert "past the token budget" in event.message
        assert pid_alive((launched.identity or {})["pid"])
        for _ in range(3):
            assert await guard.enforce(engine, await engine.refresh()) == []
    assert [e["action"] for e in audit.read()] == ["launch", "budget"]


async def test_stop_acts_exactly_once(
    tmp_path: Path, state_home: Path, mock_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    demo = over_budget_demo(tmp_path, mock_endpoint.url, kill_runs_in, ("B2",), "stop")
    async with engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok
        pid = (launched.identity or {})["pid"]
        guard = BudgetGuard(demo.config)
        snap, outcomes = await until_acted(guard, engine)
        assert len(outcomes) == 1 and outcomes[0].acted and outcomes[0].ok, outcomes[0].detail
        assert outcomes[0].event.policy == "stop"
        assert "stopped pid" in outcomes[0].detail
        wait_until(lambda: not pid_alive(pid), timeout=15)
        # the same event seen again - by this guard, or by a new runwatch with the same state dir
        again = BudgetGuard(demo.config)
        assert again.observe(snap) == []
        replay = await again.act(engine, outcomes[0].event)
        assert replay.acted is False
        assert await guard.enforce(engine, await engine.refresh()) == []
    assert [e["action"] for e in audit.read()] == ["launch", "kill", "budget"]
    budget = [e for e in audit.read() if e["action"] == "budget"]
    assert len(budget) == 1
    assert budget[0]["policy"] == "stop" and budget[0]["ok"] is True
    assert budget[0]["identity"]["pid"] == pid and budget[0]["datasets"] == ["B2"]
    assert run_pids(demo.workdir) == []


async def test_restart_with_budget_acts_exactly_once(
    tmp_path: Path, state_home: Path, mock_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    demo = over_budget_demo(
        tmp_path, mock_endpoint.url, kill_runs_in, ("B2", "B3"), "restart-with-budget"
    )
    async with engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok
        old_pid = (launched.identity or {})["pid"]
        guard = BudgetGuard(demo.config)
        snap, outcomes = await until_acted(guard, engine)
        assert len(outcomes) == 1, [o.to_json() for o in outcomes]
        outcome = outcomes[0]
        assert outcome.acted and outcome.ok, outcome.detail
        assert outcome.result is not None and outcome.result.ok
        new = outcome.result.identity or {}
        assert new["argv"][-2:] == ["--token-budget", str(BUDGET)]
        assert not pid_alive(old_pid) and pid_alive(new["pid"])
        b2_after_restart = len(demo.complete_ids("B2"))
        # the restarted run has --token-budget: no new event; the old one is never acted on again
        for _ in range(3):
            assert await guard.enforce(engine, await engine.refresh()) == []
        assert BudgetGuard(demo.config).observe(snap) == []
        # the new run goes on with B3 and never adds to B2, which is past its budget
        wait_until(lambda: len(demo.complete_ids("B3")) >= 2, timeout=60)
        assert len(demo.complete_ids("B2")) == b2_after_restart
    kinds = [e["action"] for e in audit.read()]
    assert kinds == ["launch", "restart", "budget"]
    budget = audit.read()[-1]
    assert budget["policy"] == "restart-with-budget" and budget["ok"] is True
    restart = audit.read()[1]
    assert restart["reason"] and "past the token budget" in restart["reason"]
    # The guard's restart kept the data it handed the new client, as every start does.
    kept = {f["path"] for f in (restart.get("snapshot") or {}).get("files", [])}
    assert restart["snapshot"]["id"] and str(demo.data_file("B2")) in kept, restart.get("snapshot")


def test_guard_command_acts_once(
    tmp_path: Path, state_home: Path, mock_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    import json
    import os
    import subprocess
    import sys

    def runwatch(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "supervisor.cli", *args, "-c", str(demo.config_path)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=180,
            env=dict(os.environ),
            check=False,
        )

    demo = over_budget_demo(tmp_path, mock_endpoint.url, kill_runs_in, ("B2",), "stop")
    launched = json.loads(runwatch("launch", "demo", "--yes", "--json").stdout)
    pid = launched["identity"]["pid"]

    def tokens() -> int:
        return sum(
            json.loads(line)["completion_tokens"]
            for line in demo.lines("B2")
            if line.endswith(b"\n")
        )

    wait_until(lambda: tokens() > BUDGET, timeout=90)
    dry = runwatch("guard", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    (event,) = json.loads(dry.stdout)
    assert event["acted"] is False and event["event"]["policy"] == "stop"
    assert pid_alive(pid)
    acted = runwatch("guard", "--json")
    assert acted.returncode == 0, acted.stderr
    (outcome,) = json.loads(acted.stdout)
    assert outcome["acted"] is True and outcome["ok"] is True
    wait_until(lambda: not pid_alive(pid), timeout=15)
    again = runwatch("guard")
    assert again.returncode == 0 and "no budget events" in again.stdout
    assert [e["action"] for e in audit.read()] == ["launch", "kill", "budget"]


async def test_a_budget_stop_that_failed_is_tried_again_never_dropped(
    tmp_path: Path, state_home: Path, mock_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """The host refuses the guard's first stop (here: the identity names another boot, as after
    a reboot the laptop has not seen yet): the failure is audited, the event stays open, and the
    next refresh stops the run."""
    import dataclasses

    import msgspec

    demo = over_budget_demo(tmp_path, mock_endpoint.url, kill_runs_in, ("B2",), "stop")
    async with engine_for(demo) as engine:
        launched = await actions.launch(engine, "demo")
        assert launched.ok
        pid = (launched.identity or {})["pid"]
        guard = BudgetGuard(demo.config)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while not (events := guard.observe(await engine.refresh())):
            assert loop.time() < deadline, "never over budget"
            await asyncio.sleep(0.2)
        wrong = dataclasses.replace(
            events[0],
            identity=msgspec.structs.replace(events[0].identity, boot_id="another-boot"),
        )
        failed = await guard.act(engine, wrong)
        assert failed.acted and not failed.ok, failed.detail
        assert "try again" in failed.detail
        assert pid_alive(pid)
        _snap, outcomes = await until_acted(guard, engine)
        assert outcomes[0].ok, outcomes[0].detail
        wait_until(lambda: not pid_alive(pid), timeout=15)
    budget = [e for e in audit.read() if e["action"] == "budget"]
    assert [b["ok"] for b in budget] == [False, True]
