"""``runwatch launch``, ``runwatch restart``, ``runwatch guard``, ``runwatch audit`` and
``runwatch restore``.

``launch`` and ``restart`` show the plan, ask for confirmation (``--yes`` skips it; without a
terminal and without ``--yes`` they refuse with exit status 2), then run it step by step, printing
each step's outcome as it completes. Exit status 0 only when the new run is confirmed running (for
``--dry-run``: when every check passed, or when the client had nothing left to do), 1 otherwise.
Overrides (``--set``, ``--unset``) become the run's launch spec, kept for later launches until
changed or dropped (``--reset``); a failed relaunch after the stop is rolled back.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from supervisor.cli._common import (
    DEFAULT_CANDIDATES,
    Finite,
    config_option,
    get_config,
    json_option,
    print_json,
    resolve_config_path,
)
from supervisor.errors import RunwatchError, UsageError

if TYPE_CHECKING:
    from supervisor.config import Config
    from supervisor.engine import ActionResult, Plan, Step

__all__ = ["audit", "guard", "launch", "restart", "restore"]

_MARK = {"ok": "ok", "failed": "FAILED", "skipped": "skip", "running": "..", "pending": "  "}


def _print_step(step: Step) -> None:
    if step.state == "running":
        click.echo(f"  [..] {step.name}: {step.title}")
        return
    detail = step.detail.replace("\n", "\n       ")
    click.echo(f"  [{_MARK[step.state]}] {step.name}: {detail}")


def _confirm_allowed(yes: bool, dry_run: bool) -> None:
    if yes or dry_run:
        return
    if not sys.stdin.isatty():
        raise UsageError(
            "refusing to act without confirmation: no terminal to ask on",
            "pass --yes to confirm, or --dry-run to see the plan and the checks",
        )


def _run_action(
    config: Config,
    action: str,
    run: str,
    sets: tuple[str, ...],
    dry_run: bool,
    yes: bool,
    as_json: bool,
    move_aside: bool = False,
    allow_change: tuple[str, ...] = (),
    unsets: tuple[str, ...] = (),
    reset: bool = False,
    force: bool = False,
    pid: int | None = None,
    script: str | None = None,
) -> None:
    import asyncio

    from supervisor.engine import Engine, parse_sets, parse_unsets

    overrides = parse_sets(sets)  # a bad --set fails before anything is contacted
    removed = parse_unsets(unsets)
    _confirm_allowed(yes, dry_run)

    async def main() -> ActionResult | None:
        engine = Engine(config)
        try:
            plan: Plan = await engine.plan(
                run,
                action="launch" if action == "launch" else "restart",
                overrides=overrides,
                unsets=removed,
                reset=reset,
                force=force,
                move_aside=move_aside,
                allow_change=allow_change,
                pid=pid,
                script=script,
            )
            if not as_json:
                click.echo("\n".join(plan.describe()))
            if not (yes or dry_run) and not click.confirm(f"{action} {run}?", default=False):
                click.echo("nothing done", err=True)
                return None
            if not as_json:
                click.echo("dry run: checks only, nothing changes" if dry_run else "running:")
            return await engine.execute(
                plan, dry_run=dry_run, on_step=None if as_json else _print_step
            )
        finally:
            await engine.aclose()

    result = asyncio.run(main())
    if result is None:
        sys.exit(1)
    if as_json:
        print_json(result.to_json())
    else:
        _print_outcome(result)
    sys.exit(0 if result.ok else 1)


def _print_outcome(result: ActionResult) -> None:
    failed = result.failed_step
    if result.dry_run:
        click.echo("checks passed" if result.ok else f"blocked at {failed.name if failed else '?'}")
        return
    if result.ok and result.nothing_to_do:
        click.echo(f"{result.run}: nothing to do: all datasets done")
    elif result.ok and result.identity:
        ident = result.identity
        click.echo(
            f"{result.run} is running on {result.host}: pid {ident.get('pid')} "
            f"(start tick {ident.get('start_time')}, boot {str(ident.get('boot_id'))[:8]})"
        )
    elif failed is not None:
        click.echo(f"{result.action} {result.run}: stopped at {failed.name}", err=True)
    if result.rollback is not None:
        click.echo(f"{result.run}: {result.rollback['detail']}", err=True)


_set_option = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a flag of the run's argv: --set token-budget=10000000 -> --token-budget "
    "10000000 (replaces the flag or adds it); --set resume -> --resume (a flag without value). "
    "Kept in the run's launch spec for later launches. Repeatable.",
)
_unset_option = click.option(
    "--unset",
    "unsets",
    multiple=True,
    metavar="KEY",
    help="Remove a flag (and its value) from the run's argv: --unset temperature. Kept in the "
    "run's launch spec for later launches. Repeatable.",
)
_reset_option = click.option(
    "--reset",
    is_flag=True,
    help="Forget the run's launch spec (earlier --set / --unset): start from the config's argv.",
)
_force_option = click.option(
    "--force",
    is_flag=True,
    help="Launch even when a dataset is already over its budget with no budget flag, with a "
    "--set / --unset flag that neither the client's profile nor its argparse source (read, "
    "never run) confirms, or with a --set value outside the type or choices that source "
    "declares (a client profile's value types are never overridden).",
)
_move_aside_option = click.option(
    "--move-aside",
    is_flag=True,
    help="Rename data files in another format to <file>.<format>-<timestamp> (nothing deleted).",
)
_allow_change_option = click.option(
    "--allow-change",
    "allow_change",
    multiple=True,
    metavar="KEY",
    help="Allow a change of model, sampling (or one parameter: temperature...), prompts or "
    "format since the last launch. Repeatable.",
)
_script_option = click.option(
    "--script",
    "script",
    default=None,
    metavar="PATH",
    help="A newer version of the run's script (a local file): its options are checked before "
    "anything stops, then it replaces the host's script (the old one kept beside it as "
    "<script>.runwatch-<sha12>) right before the launch; put back if the launch fails.",
)
_dry_option = click.option(
    "--dry-run", is_flag=True, help="Show the plan and run the checks; change nothing."
)
_yes_option = click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")


@click.command()
@click.argument("run")
@_set_option
@_unset_option
@_reset_option
@_force_option
@_move_aside_option
@_allow_change_option
@_script_option
@_dry_option
@_yes_option
@json_option
@config_option
def launch(
    run: str,
    sets: tuple[str, ...],
    unsets: tuple[str, ...],
    reset: bool,
    force: bool,
    move_aside: bool,
    allow_change: tuple[str, ...],
    script: str | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    config_path: str | None,
) -> None:
    """Launch RUN on its host, detached, after checking its data; confirm it runs.

    The API key (the endpoint's api_key_env) goes in the run's environment, never in its argv.
    """
    _run_action(
        get_config(config_path, need="runs", act=True),
        "launch",
        run,
        sets,
        dry_run,
        yes,
        as_json,
        move_aside=move_aside,
        allow_change=allow_change,
        unsets=unsets,
        reset=reset,
        force=force,
        script=script,
    )


@click.command()
@click.argument("run")
@_set_option
@_unset_option
@_reset_option
@_force_option
@_move_aside_option
@_allow_change_option
@click.option(
    "--pid", type=int, default=None, help="Which process RUN is, when several could be it."
)
@_script_option
@_dry_option
@_yes_option
@json_option
@config_option
def restart(
    run: str,
    sets: tuple[str, ...],
    unsets: tuple[str, ...],
    reset: bool,
    force: bool,
    move_aside: bool,
    allow_change: tuple[str, ...],
    pid: int | None,
    script: str | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    config_path: str | None,
) -> None:
    """Check RUN's data and settings, stop it by identity, repair a torn tail, relaunch it.

    Checks come first, while the old run is alive: a blocked restart kills nothing; the new
    command line's flags are checked against the client's profile and its argparse source
    (read, never run) before the stop; a relaunch that fails after the stop is rolled back to
    the previous command line. When several processes could each be RUN, nothing is stopped
    until one is named with --pid.
    """
    _run_action(
        get_config(config_path, need="runs", act=True),
        "restart",
        run,
        sets,
        dry_run,
        yes,
        as_json,
        move_aside=move_aside,
        allow_change=allow_change,
        unsets=unsets,
        reset=reset,
        force=force,
        pid=pid,
        script=script,
    )


@click.command()
@click.option("--limit", type=int, default=50, show_default=True, help="Last N records; 0: all.")
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Every config's records, and those of an older runwatch (which name no config).",
)
@json_option
@config_option
def audit(limit: int, show_all: bool, as_json: bool, config_path: str | None) -> None:
    """Show the audit log: every kill, launch, restart, move-aside, repair and budget action.

    The records of this config (-c; --all: of every config, and those of an older runwatch,
    which name none). With no config named and none here, every record."""
    from supervisor.engine import audit_line, audit_location, audit_records
    from supervisor.secrets import mask_record

    path = resolve_config_path(config_path)
    no_config = path == DEFAULT_CANDIDATES[0] and not Path(path).exists()
    # The config is read for --all too: its secrets are masked in records written before they
    # were declared (every record is masked as shown, with what is known now).
    config = None
    try:
        config = None if no_config else get_config(config_path)
    except RunwatchError as unread:
        if not show_all:
            raise
        click.echo(
            f"note: {unread.message}: records masked by this environment's secrets", err=True
        )
    key = None if show_all or config is None else config.key
    if no_config and not show_all and not as_json:
        click.echo("note: no config here (-c PATH): every config's records are shown", err=True)
    entries = [
        mask_record(e) for e in audit_records(limit=None if limit <= 0 else limit, config=key)
    ]
    if key is not None and not as_json:
        older = sum(1 for e in audit_records(config=None) if not e.get("config"))
        if older:
            click.echo(
                f"note: {older} record(s) of an older runwatch name no config: --all shows them",
                err=True,
            )
    if as_json:
        print_json(entries)
        return
    if not entries:
        click.echo(f"no audit records in {audit_location()}")
        return
    for e in entries:
        click.echo(audit_line(e))


@click.command()
@click.option(
    "--watch",
    "watch",
    type=Finite(min=0.1),
    default=None,
    metavar="SECONDS",
    help="Keep refreshing every SECONDS and act on new events until Ctrl-C.",
)
@click.option("--dry-run", is_flag=True, help="Show the budget events; act on none.")
@json_option
@config_option
def guard(watch: float | None, dry_run: bool, as_json: bool, config_path: str | None) -> None:
    """Apply each run's budget_policy (warn, stop, restart-with-budget) to runs without
    --token-budget whose datasets passed their budget. Each event is acted on once, ever."""
    import asyncio

    from supervisor.engine import Engine

    config = get_config(config_path, need="runs", act=True)

    async def main() -> list[dict[str, Any]]:
        engine = Engine(config)
        seen: list[dict[str, Any]] = []
        try:
            while True:
                new: list[dict[str, Any]] = []
                if dry_run:
                    for e in engine.budget_events(await engine.refresh()):
                        new.append({"event": e.to_json(), "acted": False, "ok": True})
                        if not as_json:
                            click.echo(f"{e.host}/{e.run}: would {e.policy}: {e.message}")
                else:
                    for outcome in (await engine.tick(events=False)).outcomes:
                        new.append(outcome.to_json())
                        if not as_json:
                            ev = outcome.event
                            state = "done" if outcome.ok else "FAILED"
                            click.echo(f"{ev.host}/{ev.run}: {ev.policy} {state}: {outcome.detail}")
                if as_json and watch is not None:
                    for item in new:  # one JSON line per outcome, as it happens
                        print_json(item)
                seen.extend(new)
                if watch is None:
                    return seen
                await asyncio.sleep(watch)  # the refresh interval the user asked for
        finally:
            await engine.aclose()

    try:
        seen = asyncio.run(main())
    except KeyboardInterrupt:
        return
    if as_json and watch is None:
        print_json(seen)
    elif not seen and not as_json:
        click.echo("no budget events to act on")
    sys.exit(0 if all(o.get("ok", True) for o in seen) else 1)


@click.command()
@click.argument("run")
@click.option(
    "--snapshot",
    "snapshot_id",
    default=None,
    metavar="ID",
    help="Put this snapshot back (its ID as listed); without it, list the snapshots.",
)
@click.option(
    "--file",
    "files",
    multiple=True,
    metavar="PATH",
    help="Only this file of the snapshot (repeatable; default: every file).",
)
@json_option
@config_option
def restore(
    run: str,
    snapshot_id: str | None,
    files: tuple[str, ...],
    as_json: bool,
    config_path: str | None,
) -> None:
    """List the snapshots taken of RUN's data before its starts, or put one back (--snapshot).

    Each start over existing data first keeps a copy of every data file (a reflink, else a
    copy within backup_max_bytes) in <out>/.runwatch/snapshots/RUN/, the newest snapshot_keep
    of them. --snapshot ID puts that snapshot's files back, only while RUN is stopped and no
    process has one of them open for writing; each file found in its place is moved aside to
    <file>.after-<stamp>, never deleted. Audited."""
    import asyncio
    import time

    from supervisor import display
    from supervisor.engine import Engine

    config = get_config(config_path, need="runs", act=snapshot_id is not None)
    if files and snapshot_id is None:
        raise UsageError("--file needs --snapshot ID", "list the snapshots first")

    async def go() -> Any:
        async with Engine(config) as engine:
            if snapshot_id is None:
                return await engine.snapshots(run)
            return await engine.restore_snapshot(run, snapshot_id, list(files) or None)

    out = asyncio.run(go())
    if as_json:
        print_json(out)
        return
    if snapshot_id is not None:
        for r in out["restored"]:
            aside = f"; the file found there kept as {r['aside']}" if r["aside"] else ""
            click.echo(f"restored {r['path']} ({display.size(r['bytes'])}){aside}")
        if not out["restored"]:
            click.echo(f"snapshot {snapshot_id} holds no file to put back")
        return
    if not out:
        click.echo(f"no snapshot of {run} yet (one is taken before each start over its data)")
        return
    for s in out:
        when = display.ago(time.time(), s["time"])
        click.echo(f"{s['id']}  ({when})  before a {s['reason'] or 'start'}  {s['dir']}")
        for f in s["files"]:
            kept = f"{f['method']} {f['copy']}" if f.get("copy") else "NOT kept"
            click.echo(f"    {f['path']}  {display.size(f['bytes'])}  {kept}")
        for u in s["unprotected"]:
            click.echo(f"    UNPROTECTED {u}")
    click.echo(f"put one back: runwatch restore {run} --snapshot ID")
