"""Launch and restart of runs behind checks, step by step.

A restart checks the run's data and launch fingerprint while the old run is still alive, then
stops it by identity, waits for its GPU memory and lock to be released, repairs the data and
launches detached (``supervisor.plan`` lists the steps; ``supervisor.steps`` runs them). A launch
is the same plan without the stop (it refuses when the run is already running).

API for front ends (the CLI and the TUI use only these; ``make_plan`` is in ``supervisor.plan``,
``execute`` in ``supervisor.steps``)::

    plan = await make_plan(engine, "eagle3-kimi", action="restart",
                           overrides=["token-budget=10000000"], unsets=["temperature"],
                           reset=False, force=False, move_aside=False, allow_change=[])
    plan.describe()          # lines for humans: steps, old -> new argv (masked), flag diff
    result = await execute(engine, plan, dry_run=False, on_step=callback)
    result.to_json()         # {"ok", "action", "run", "host", "steps": [{"name", "ok",
                             #  "detail"}], "identity", "argv", "argv_diff",
                             #  "last_launch_diff", "dry_run", "nothing_to_do", "rollback"}

``launch(...)`` and ``restart(...)`` (here) do both at once. ``supervisor.logtail.tail_log``
gives the last lines of a run's log on its host (for a live log pane).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from supervisor.plan import ActionResult, OnStep, make_plan
from supervisor.steps import execute

if TYPE_CHECKING:
    from supervisor.engine import Engine


async def launch(
    engine: Engine,
    run_name: str,
    overrides: Iterable[str] = (),
    dry_run: bool = False,
    on_step: OnStep | None = None,
    environ: dict[str, str] | None = None,
    *,
    unsets: Iterable[str] = (),
    reset: bool = False,
    force: bool = False,
) -> ActionResult:
    """Check and launch a run that is not running (raises LaunchError when it is)."""
    plan = await make_plan(
        engine,
        run_name,
        action="launch",
        overrides=overrides,
        unsets=unsets,
        reset=reset,
        force=force,
        environ=environ,
    )
    return await execute(engine, plan, dry_run=dry_run, on_step=on_step)


async def restart(
    engine: Engine,
    run_name: str,
    overrides: Iterable[str] = (),
    *,
    move_aside: bool = False,
    allow_change: Iterable[str] = (),
    dry_run: bool = False,
    on_step: OnStep | None = None,
    environ: dict[str, str] | None = None,
    unsets: Iterable[str] = (),
    reset: bool = False,
    force: bool = False,
) -> ActionResult:
    """Check, stop, repair and relaunch a run (launch it when it is not running); a relaunch
    that fails after the stop is rolled back (``result.rollback``)."""
    plan = await make_plan(
        engine,
        run_name,
        action="restart",
        overrides=overrides,
        unsets=unsets,
        reset=reset,
        force=force,
        move_aside=move_aside,
        allow_change=allow_change,
        environ=environ,
    )
    return await execute(engine, plan, dry_run=dry_run, on_step=on_step)
