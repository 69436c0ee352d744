"""``runwatch ps``, ``kill`` and ``adopt``: the runs on each host, stopping one with proof, and
taking a Slurm job runwatch did not submit as a run's."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any

import click

from supervisor import display
from supervisor.cli._common import (
    Finite,
    config_option,
    get_config,
    json_option,
    named_config_path,
    print_json,
)
from supervisor.errors import KillRefused, RunwatchError, UsageError

if TYPE_CHECKING:
    from supervisor.config import Config, HostConfig
    from supervisor.engine import Engine, KillReport
    from supervisor.model import ProcessInfo

# --------------------------------------------------------------------------- ps


def process_json(p: ProcessInfo) -> dict[str, Any]:
    """One process of ``ps --json``."""
    import msgspec

    return {
        "pid": p.identity.pid,
        "start_time": p.identity.start_time,
        "boot_id": p.identity.boot_id,
        "uid": p.identity.uid,
        "user": p.user,
        "argv": list(p.argv_masked or p.identity.argv),
        "run": p.run,
        "flags": msgspec.to_builtins(p.flags),
        "children": list(p.children),
        "gpu_memory_mb": p.gpu_memory_mb,
        "cpu_percent": p.cpu_percent,
        "rss_mb": p.rss_mb,
        "uptime_s": p.uptime_s,
        "state": p.state,
        "cwd": p.cwd,
        "killable": p.killable,
        "evidence": p.evidence,
        "held_by": held_by(p),
        "launch_id": p.unit.launch_id if p.unit is not None else None,
    }


def held_by(p: ProcessInfo) -> str | None:
    """``cgroup``/``token`` for a run runwatch launched (its unit), ``adopted`` for a process
    matched to a config run by evidence, None for a process of no config run."""
    if p.unit is not None:
        return p.unit.held_by
    return "adopted" if p.run is not None else None


async def _ps_host(engine: Engine, name: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "connected": False, "error": None, "processes": []}
    try:
        if engine.config.host(name).kind == "slurm":  # a login node: its runs are jobs
            entry["jobs"] = await engine.list_jobs(name)
        else:
            entry["processes"] = await engine.list_processes(name)
        entry["connected"] = True
    except RunwatchError as e:
        entry["error"] = e.message
    return entry


def _hosts_of(config: Config, host_name: str | None) -> list[HostConfig]:
    if host_name is not None:
        return [config.host(host_name)]
    if not config.hosts:
        raise UsageError(f"{config.path}: no hosts configured", "add a [[hosts]] entry")
    return list(config.hosts)


def host_of_pid(config: Config, pid: int, config_path: str | None = None) -> HostConfig:
    """The host of ``kill --pid PID`` given without ``--host``: the config's only host; with
    several, a UsageError that lists them and the exact command for each."""
    if len(config.hosts) == 1:
        return config.hosts[0]
    import shlex

    named = named_config_path(config_path)
    where = f" -c {shlex.quote(named)}" if named else ""
    names = ", ".join(h.name for h in config.hosts)
    commands = [
        f"`runwatch kill{where} --host {shlex.quote(h.name)} --pid {pid}`" for h in config.hosts
    ]
    raise UsageError(
        f"--pid {pid} names a process on one host, and the config has {len(config.hosts)} hosts "
        f"({names}): say which with --host",
        "run " + " or ".join(commands) + f" (`runwatch ps{where}` shows where it runs)",
    )


def _error_text(name: str, error: str) -> str:
    """The error without the host name it starts with (the line names the host already)."""
    return error[len(name) + 2 :] if error.startswith(f"{name}: ") else error


def _print_ps(config: Config, entries: list[dict[str, Any]]) -> None:
    from supervisor.engine import engine_budget_flag

    for entry in entries:
        procs: list[ProcessInfo] = entry["processes"]
        if entry["error"]:
            click.echo(
                f"{entry['name']}: unreachable: {_error_text(entry['name'], entry['error'])}"
            )
            continue
        if "jobs" in entry:
            _print_jobs(entry["name"], entry["jobs"])
            continue
        click.echo(f"{entry['name']}: {len(procs)} run{'' if len(procs) == 1 else 's'}")
        for p in procs:
            flags = p.flags
            gpu = (
                f"  gpu {display.mebibytes(p.gpu_memory_mb)}" if p.gpu_memory_mb is not None else ""
            )
            mark = " (other user)" if not p.killable else ""
            if held_by(p) is not None:
                mark += f"  {display.held(held_by(p))}"
            kids = len(p.children)
            click.echo(
                f"  pid {p.identity.pid:<7} {p.run or '(not in config)'}  {p.user}{mark}  "
                f"up {display.duration(p.uptime_s)}  cpu {display.percent(p.cpu_percent)}  "
                f"rss {display.mebibytes(p.rss_mb)}{gpu}  "
                f"{kids} child{'' if kids == 1 else 'ren'}  backend {flags.backend}"
            )
            details = [f"client {flags.client}"] if flags.client else []
            if flags.datasets:
                details.append("datasets " + ",".join(flags.datasets))
            for label, value in (
                ("output", flags.output_file),
                ("input", flags.input_file),
                ("samples", flags.max_samples),
                ("token-budget", flags.token_budget),
                ("concurrency", flags.concurrency),
                ("model", flags.model),
            ):
                if value is not None:
                    details.append(f"{label} {value}")
            if flags.resume is not None:
                details.append("resume" if flags.resume else "NO resume flag")
            budget_flag = engine_budget_flag(config, flags.client)
            if flags.token_budget is None and budget_flag is not None:
                details.append(f"NO {budget_flag}")
            click.echo("    " + "  ".join(details))
            click.echo("    " + display.command_line(p.argv_masked or p.identity.argv))


def _print_jobs(name: str, jobs: list[dict[str, Any]]) -> None:
    """The Slurm jobs of a login node that are runs' or carry a runwatch tag, one line each."""
    click.echo(f"{name}: {len(jobs)} Slurm job{'' if len(jobs) == 1 else 's'}")
    for j in jobs:
        run = (
            j.get("run")
            or f"(tagged {j.get('comment')}, not submitted or adopted by this runwatch)"
        )
        why = f" ({j['reason']})" if j.get("reason") else ""
        where = f" on {j['nodes']}" if j.get("nodes") else ""
        up = f"  up {display.duration(j['elapsed_s'])}" if j.get("elapsed_s") is not None else ""
        limit = j.get("time_limit_s")
        click.echo(
            f"  job {j.get('job_id'):<9} {run}  {j.get('state')}{why}{where}{up}"
            f"  limit {display.duration(limit) if limit is not None else 'none'}  {j.get('user')}"
        )
        if j.get("stdout"):
            click.echo(f"    output {j['stdout']}")


@click.command()
@config_option
@click.option("--host", "host_name", default=None, help="Only this host.")
@json_option
def ps(config_path: str | None, host_name: str | None, as_json: bool) -> None:
    """List the runs on every host: identity, owner, CPU, memory, GPU, children and flags."""
    config = get_config(config_path, need="hosts")
    targets = _hosts_of(config, host_name)

    async def gather() -> list[dict[str, Any]]:
        from supervisor.engine import Engine

        async with Engine(config) as engine:
            return list(await asyncio.gather(*(_ps_host(engine, h.name) for h in targets)))

    entries = asyncio.run(gather())
    if as_json:
        print_json(
            {
                "hosts": [
                    {**e, "processes": [process_json(p) for p in e["processes"]]} for e in entries
                ]
            }
        )
    else:
        _print_ps(config, entries)
    if any(e["error"] for e in entries):
        sys.exit(1)


# --------------------------------------------------------------------------- kill


def describe(host: str, p: ProcessInfo) -> str:
    """The identity of a kill target, as the confirmation shows it."""
    ident = p.identity
    return (
        f"host {host}  pid {ident.pid}  run {p.run or '(not in config)'}  user {p.user} "
        f"(uid {ident.uid})\n"
        f"  started at tick {ident.start_time} of boot {ident.boot_id[:8]}, up "
        f"{display.duration(p.uptime_s)}, {len(p.children)} descendant(s)\n"
        f"  argv: {display.command_line(p.argv_masked or ident.argv)}"
    )


def _targets(
    config: Config, procs: list[ProcessInfo], run: str | None, pid: int | None, host: str
) -> list[ProcessInfo]:
    if run is not None:
        from supervisor.engine import assign_runs

        found = assign_runs(procs, config, host).get(run, [])
        if pid is not None and pid not in {p.identity.pid for p in found}:
            its = ", ".join(str(p.identity.pid) for p in found)
            raise KillRefused(
                f"pid {pid} on {host} is not run {run!r}: neither its command line nor its open "
                "files tie it to the run's data files"
                + (f" (its processes: {its})" if its else ""),
                f"see `runwatch ps --host {host}`",
            )
        if not found:
            raise RunwatchError(
                f"run {run!r} is not running on {host} (no process has its data files in its "
                "command line or open)",
                f"see `runwatch ps --host {host}`",
            )
        from supervisor.engine import refuse_held_elsewhere

        for p in found if pid is None else [p for p in found if p.identity.pid == pid]:
            refuse_held_elsewhere(p, host, run, config)
        if pid is not None:
            return [p for p in found if p.identity.pid == pid]
        if len(found) > 1:
            pids = ", ".join(str(p.identity.pid) for p in found)
            raise KillRefused(
                f"run {run!r} is ambiguous on {host}: pids {pids} could each be it; "
                "nothing was stopped",
                f"name one: `runwatch kill {run} --pid PID` (see `runwatch ps --host {host}`)",
            )
        return found
    found = [p for p in procs if p.identity.pid == pid]
    if not found:
        raise KillRefused(
            f"pid {pid} on {host} is not a run (no listed process executes "
            f"{', '.join(config.scripts)})",
            f"see `runwatch ps --host {host}`",
        )
    from supervisor.engine import refuse_foreign

    for p in found:
        refuse_foreign(p, host)
    return found


async def _kill(
    config: Config, cfg: HostConfig, run: str | None, pid: int | None, grace: float, yes: bool
) -> list[KillReport] | None:
    """The kill reports, or None when the confirmation was declined (nothing was sent)."""
    from supervisor.engine import Engine, run_files

    engine = Engine(config)

    def waiting(text: str) -> None:
        click.echo(text, err=True)

    try:
        # A pid named with its run is listed whatever it executes: a process that holds the
        # run's data files open (``python -m``, a renamed one) is the run's writer by that fact.
        named = [pid] if run is not None and pid is not None else []
        procs = await engine.list_processes(cfg.name, named)
        try:
            targets = _targets(config, procs, run, pid, cfg.name)
        except KillRefused:
            raise
        except RunwatchError as e:
            # Not running: it may be waiting for a watcher's restart on failure. A kill cancels
            # it (audited), so the run does not come back.
            if run is None or run not in {r.name for r in config.runs}:
                raise
            cancelled = await engine.cancel_restarts(run, on_wait=waiting)
            if cancelled is not None:
                click.echo(f"{e.message}; {cancelled}", err=True)
            # The run's lock was waited for: a restart or launch under way meanwhile (its quiet
            # window) may have started it since it was listed; that one is stopped too.
            procs = await engine.list_processes(cfg.name, named)
            try:
                targets = _targets(config, procs, run, pid, cfg.name)
            except KillRefused:
                raise
            except RunwatchError:
                if cancelled is None:
                    click.echo(f"{engine.record_stopped(run)}", err=True)
                    raise e from None
                return []
            click.echo(
                f"run {run} was started by another runwatch action while this kill waited for "
                "it: stopping it",
                err=True,
            )
        for p in targets:
            if not p.killable:
                raise KillRefused(
                    f"pid {p.identity.pid} on {cfg.name} belongs to {p.user}: not killable",
                    "runwatch only stops processes of the user it connects as",
                )
        for p in targets:
            if named and p.unit is None and "argv" not in p.evidence.get(p.run or "", []):
                files = ", ".join(f for f in run_files(config, run) if not f.endswith(".lock"))
                click.echo(
                    f"pid {p.identity.pid} does not run the run's command line but holds one of "
                    f"run {run}'s data files open or works in its directory ({files}): stopping "
                    "it as the run's writer (the host checks that it holds one open for writing, "
                    "maps one or works in its directory, by file identity, before any signal)",
                    err=True,
                )
        if not yes:
            for p in targets:
                click.echo(describe(cfg.name, p), err=True)
            if not click.confirm(
                f"Stop {len(targets)} process(es) and their descendants (SIGTERM, then SIGKILL "
                f"after {grace:g} s)?",
                err=True,
            ):
                return None

        # Each kill is audited by the engine, a lost reply and a refusal included; another
        # action on the run (its lock) is waited for, named.
        return [
            await engine.kill(
                cfg.name, p.identity, grace, run=p.run or run, on_wait=waiting, writer=bool(named)
            )
            for p in targets
        ]
    finally:
        await engine.aclose()


@click.command()
@config_option
@click.argument("run", required=False)
@click.option(
    "--host", "host_name", default=None, help="Host of --pid (default: the config's only host)."
)
@click.option(
    "--pid", type=int, default=None, help="PID of a run on --host, or which process RUN is."
)
@click.option(
    "--grace", type=Finite(min=0), default=10.0, show_default=True, help="Seconds before SIGKILL."
)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def kill(
    config_path: str | None,
    run: str | None,
    host_name: str | None,
    pid: int | None,
    grace: float,
    yes: bool,
    as_json: bool,
) -> None:
    """Stop RUN (or --pid PID, with --host NAME when the config has several hosts) and every
    descendant, and prove they are gone.

    When several processes could each be RUN (it is ambiguous), nothing is stopped until one is
    named with --pid.

    The process is named by its identity (boot id, pid, start time, uid, argv): the host refuses
    when the PID was reused, the host rebooted or the owner differs. Exit status 0 only when
    every targeted process is confirmed gone.
    """
    if run is None and pid is None:
        raise UsageError(
            "name a RUN (and --pid PID when it is ambiguous), or --pid PID "
            "(with --host NAME when the config has several hosts)",
            "runwatch kill --help",
        )
    config = get_config(config_path, need="hosts", act=True)
    if run is not None:
        run_cfg = config.run(run)
        cfg = config.host(host_name or run_cfg.host)
    elif host_name is not None:
        cfg = config.host(host_name)
    else:
        assert pid is not None
        cfg = host_of_pid(config, pid, config_path)
    if not yes and not sys.stdin.isatty():
        raise UsageError(
            "refusing to kill without confirmation: stdin is not a terminal",
            "pass --yes to confirm on the command line",
        )
    if cfg.kind == "slurm":
        _kill_job(config, run, grace, yes, as_json)
        return
    reports = asyncio.run(_kill(config, cfg, run, pid, grace, yes))
    if reports is None:
        click.echo("not confirmed: nothing was stopped", err=True)
        sys.exit(1)
    results = [r for rep in reports for r in rep.results]
    if as_json:
        print_json(
            {
                "results": [
                    {
                        "host": cfg.name,
                        "pid": r.pid,
                        "role": r.role,
                        "outcome": r.outcome,
                        "detail": r.detail,
                        "confirmed": r.confirmed,
                        "signals": r.signals,
                        "exit_code": r.exit_code,
                        "after_s": r.after_s,
                    }
                    for r in results
                ]
            }
        )
    else:
        for r in results:
            proof = "exit confirmed" if r.confirmed else "EXIT NOT CONFIRMED"
            click.echo(f"{cfg.name} pid {r.pid} ({r.role}): {r.outcome} - {r.detail} [{proof}]")
    if not all(rep.all_gone for rep in reports):
        sys.exit(1)


def _kill_job(config: Config, run: str | None, grace: float, yes: bool, as_json: bool) -> None:
    """``kill RUN`` on a Slurm host: scancel its job with grace and confirm it ended (only a job
    the run submitted or adopted: one that merely carries its tag is refused)."""
    from supervisor.engine import describe_job, run_sync

    if run is None:
        raise UsageError("on a Slurm host, name the RUN (its job is the one runwatch submitted)")

    async def act(engine: Engine) -> dict[str, Any] | None:
        snap = await engine.refresh()
        rv = next((r for h in snap.hosts for r in h.runs if r.name == run), None)
        shown = rv.job if rv is not None and rv.state in ("running", "pending") else None
        if shown is not None and not yes:
            click.echo(f"run {run}: Slurm {describe_job(shown)}", err=True)
            if not click.confirm(
                f"scancel job {shown.job_id} (SIGTERM, then SIGKILL after {grace:g} s)?",
                err=True,
            ):
                return None

        def waiting(text: str) -> None:
            click.echo(text, err=True)

        # The engine lists again under the run's lock: a kill that ran meanwhile leaves this
        # one the job's end to confirm (already-gone), and only the job shown is cancelled.
        expect = shown.job_id if shown is not None else ("" if not yes else None)
        return await engine.cancel_job(run, grace, expect=expect, on_wait=waiting)

    out = run_sync(config, act)
    if out is None:
        click.echo("not confirmed: nothing was cancelled", err=True)
        sys.exit(1)
    if as_json:
        print_json({"results": [out]})
    else:
        proof = "end confirmed" if out.get("confirmed") else "END NOT CONFIRMED"
        click.echo(f"job {out.get('job_id')}: {out.get('outcome')} - {out.get('detail')} [{proof}]")
    if not out.get("confirmed"):
        sys.exit(1)


# --------------------------------------------------------------------------- adopt


@click.command()
@config_option
@click.argument("run")
@click.option(
    "--job",
    "job_id",
    required=True,
    help="Id of the Slurm job to take as RUN's (of an array: the array's id).",
)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def adopt(config_path: str | None, run: str, job_id: str, yes: bool, as_json: bool) -> None:
    """Take a Slurm job that runwatch did not submit as RUN's, so that kill and restart act on it.

    A run's jobs are the ones runwatch submitted for it: a job that only carries its tag
    (``--comment runwatch:RUN``, which anyone can write) is shown as not the run's and never
    cancelled. The job is shown first; once confirmed its id is recorded as RUN's and the
    adoption is audited. Only a job of yours that is queued or running can be adopted, and only
    while RUN has no other.
    """
    from supervisor.engine import describe_job, run_sync

    if not yes and not sys.stdin.isatty():
        raise UsageError(
            "refusing to adopt without confirmation: stdin is not a terminal",
            "pass --yes to confirm on the command line",
        )
    config = get_config(config_path, need="runs", act=True)

    async def act(engine: Engine) -> dict[str, Any] | None:
        job = await engine.find_job(run, job_id)
        click.echo(
            f"job {job.job_id}: {describe_job(job)}, name {job.name!r}, comment {job.tag!r}",
            err=True,
        )
        if not yes and not click.confirm(f"adopt job {job.job_id} as run {run}'s?", err=True):
            return None
        return await engine.adopt_job(run, job)

    out = run_sync(config, act)
    if out is None:
        click.echo("not confirmed: nothing was adopted", err=True)
        sys.exit(1)
    if as_json:
        print_json(out)
    else:
        click.echo(f"job {out['job_id']}: {out['detail']}")
