"""``runwatch rebalance``: split the remaining datasets between the runs' endpoints to finish by
a deadline under a cost cap, and carry the split out through the gate."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import sys
from collections.abc import Iterator
from typing import Any

import click

from supervisor.cli._common import Finite, config_option, get_config, json_option, print_json
from supervisor.errors import UsageError


@click.command()
@config_option
@click.option(
    "--by",
    "by",
    default=None,
    metavar="DURATION",
    help="Finish within this long (45m, 2h, 1h30m, 90s): the cheapest split that meets it. "
    "Without it: the fastest split.",
)
@click.option(
    "--max-usd", type=Finite(min=0), default=None, help="Spend at most this much on what is left."
)
@click.option(
    "--sample",
    "sample_s",
    type=Finite(min=0),
    default=10.0,
    show_default=True,
    help="Seconds at most spent refreshing when a running run has no rate yet (as compare).",
)
@click.option(
    "--move-aside",
    is_flag=True,
    help="Let a run restart over data of an earlier format by renaming it aside "
    "(<file>.<format>-<timestamp>; nothing is deleted): such a dataset starts afresh. Without "
    "it, a run that writes such data keeps what it has.",
)
@click.option(
    "--allow-change",
    "allow_change",
    type=click.Choice(["model"]),
    multiple=True,
    help="`model`: let a dataset move to a run of another model (by default a dataset stays "
    "with runs of its own model: one data set, one model).",
)
@click.option(
    "--apply",
    "do_apply",
    is_flag=True,
    help="Carry the plan out: restart or launch each run with the datasets it keeps or takes "
    "(runs that give datasets away first); a failed step rolls back the steps before it.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="With --apply: take up the plan an apply left half-applied (it was killed) and roll "
    "back what it began, each run as it was before the plan.",
)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation (with --apply).")
@json_option
def rebalance(
    config_path: str | None,
    by: str | None,
    max_usd: float | None,
    sample_s: float,
    move_aside: bool,
    allow_change: tuple[str, ...],
    do_apply: bool,
    resume: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Split the datasets left between the runs' endpoints to finish by a deadline under a
    cost cap; --apply carries it out.

    The plan: the cheapest split that finishes within --by under --max-usd, else the fastest
    under the cap (the local GPU run or runs, the API run or runs).

    Times and costs come from `runwatch compare`'s measurements, each with its error; "as now"
    and "all on <endpoint>" are shown beside the plan. A run moves whole datasets, through its
    client's dataset flag, and a dataset resumes from its records in the run that takes it.
    Every start of the plan passes the gate's checks (dry) before the plan is shown: a move they
    refuse is listed with their reason, never proposed.

    One apply at a time per config. An apply keeps its plan on disk while it runs: one that was
    killed leaves it half-applied, and `--apply --resume` rolls it back. Ctrl-C during an apply
    rolls back the steps done (exit status 130).
    """
    from supervisor.engine import (
        Engine,
        apply_rebalance,
        describe_rebalance,
        gather_rebalance,
        hold_plan_lock,
        parse_deadline,
    )

    deadline = parse_deadline(by) if by is not None else None
    if do_apply and not yes and not sys.stdin.isatty():
        raise UsageError(
            "refusing to apply without confirmation: no terminal to ask on",
            "pass --yes to confirm, or leave out --apply to see the plan",
        )
    if resume and not do_apply:
        raise UsageError("--resume goes with --apply", "runwatch rebalance --apply --resume --yes")
    config = get_config(config_path, need="runs", act=do_apply)
    stop = _Interrupt()

    async def main() -> int:
        async with Engine(config) as engine:
            if resume:
                return await _resume(engine, as_json)
            result = await gather_rebalance(
                config,
                engine,
                deadline_s=deadline,
                max_usd=max_usd,
                sample_s=sample_s,
                move_aside=move_aside,
                allow_model_change="model" in allow_change,
            )
            if not do_apply or result.refused or not result.steps:
                if as_json:
                    print_json(result)
                else:
                    click.echo("\n".join(describe_rebalance(result)))
                return 1 if result.refused else 0
            if not as_json:
                click.echo("\n".join(describe_rebalance(result)))
            if not yes and not click.confirm("apply these steps?", default=False):
                click.echo("nothing done", err=True)
                return 1
            with stop.caught(asyncio.get_running_loop()):
                outcomes = await apply_rebalance(
                    engine,
                    result,
                    on_step=None if as_json else click.echo,
                    interrupted=lambda: stop.seen,
                )
            ok = all(o.ok for o in outcomes)
            if as_json:
                print_json({"plan": result, "steps": outcomes, "ok": ok})
            else:
                click.echo(_closing(outcomes, ok))
            return 130 if stop.seen else (0 if ok else 1)

    if not do_apply:
        sys.exit(asyncio.run(main()))
    what = "rebalance --apply" + (" --resume" if resume else "")
    with hold_plan_lock(config, what, resuming=resume):
        sys.exit(asyncio.run(main()))


async def _resume(engine: Any, as_json: bool) -> int:
    from supervisor.engine import resume_rebalance

    outcomes = await resume_rebalance(engine, on_step=None if as_json else click.echo)
    if outcomes is None:
        if as_json:
            print_json({"resumed": False, "steps": [], "ok": True})
        else:
            click.echo("no rebalance plan is half-applied: nothing to resume")
        return 0
    ok = all(o.ok for o in outcomes)
    if as_json:
        print_json({"resumed": True, "steps": outcomes, "ok": ok})
    else:
        click.echo(
            "plan rolled back: every run it began to change is as it was"
            if ok
            else "the rollback FAILED for "
            + ", ".join(o.run for o in outcomes if not o.ok)
            + f": see above; try again with {_resume_command(engine.config)}"
        )
    return 0 if ok else 1


def _resume_command(config: Any) -> str:
    where = f" -c {shlex.quote(os.path.abspath(config.path))}" if config.path else ""
    return f"runwatch{where} rebalance --apply --resume --yes"


class _Interrupt:
    """Ctrl-C (SIGINT) or SIGTERM during an apply: noted, and the apply rolls back once the step
    under way has ended; a second one is told to wait for that."""

    def __init__(self) -> None:
        self.seen = False

    def _note(self) -> None:
        if self.seen:
            click.echo("still rolling back: the runs are put back as they were", err=True)
            return
        self.seen = True
        click.echo(
            "interrupted: the step under way ends, then the steps done are rolled back", err=True
        )

    @contextlib.contextmanager
    def caught(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._note)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


def _closing(outcomes: list[Any], ok: bool) -> str:
    if ok:
        return "plan applied: every run it gives datasets to is confirmed running"
    acted = [o for o in outcomes if o.ok]
    if not acted:
        return "plan NOT applied: nothing was changed"
    stuck = [o.run for o in acted if not o.rolled_back]
    if stuck:
        return f"plan NOT applied, and the rollback FAILED for {', '.join(stuck)}: see above"
    return "plan NOT applied: every step done was rolled back"
