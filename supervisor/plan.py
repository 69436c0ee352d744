"""Plans of a launch or restart: the steps, what they will do, and the result they give.

A restart is a plan of seven steps; the checks that can fail come first, while the old run is
still alive, so that a blocked restart kills nothing and changes nothing. Every check is computed
from the *effective* argv (the config's argv, the run's launch spec and this plan's ``--set`` /
``--unset``) through ``supervisor.layout.layout_of``: the files checked, locked and fingerprinted
are the files the new command line will write.

0. ``preflight`` - every flag the plan sets or removes must be one the client accepts: the
   options its argparse source declares, read statically on the host (``script_flags``; the
   client is never run), or, only when they cannot all be read, its profile's known flags, with
   a "did you mean" for a typo; a flag the installed script does not declare is refused (the fix:
   a newer script), one neither source confirms needs ``force``. Every value set must be of
   its type: the profile's ``value_types`` (int, float, str, path, choices), else the int or
   float type and the literal choices the source declares (``supervisor.flagcheck``).
1. ``format-check`` - every dataset file of the run is scanned with full validation (complete
   lines only) against the format the run writes; ``legacy``, ``mixed``, ``unknown`` or
   ``corrupt`` blocks, naming file, line and keys. With ``move_aside`` those files are moved
   aside in step 6 instead (``<file>.<format>-<timestamp>``, nothing deleted).
2. ``fingerprint`` - the launch fingerprint stored at the last launch of each dataset
   (``.runwatch/<dataset>.launch.json`` in the output dir: argv, model, sampling parameters,
   prompt-file hash, format) is compared with the new launch; a change of model, sampling or
   prompts blocks unless allowed. Never launched by runwatch: compared with the running process.
3. ``stop`` - the old process is stopped by identity (``Engine.kill_within_plan``) and its exit
   confirmed (``probe``), then its lock on the host is seen released.
4. ``gpu-release`` - where the host has nvidia-smi, wait until no process of the stopped run
   holds GPU memory (bounded by ``steps.DEFAULT_GPU_WAIT_S``).
5. ``quiet`` - the data files are watched over a quiet window (``supervisor.quiet``): a file that
   grows or changes while no writer of the run is alive is refused, naming the bytes and seconds;
   after a stop, the run stays stopped.
6. ``data-repair`` - the tails are checked again now that no writer is alive: blocking files are
   moved aside (``move_aside``), a torn last line is repaired (``.broken`` backup, truncate, fsync).
   ``script`` - only with ``--script PATH``: the local file (read, never run, by the preflight
   instead of the host's script) replaces the host's script once no writer is alive, when the
   host's is still the one the preflight read (sha256); the old one is kept beside it
   (``<script>.runwatch-<sha12>``), the new one read again on the host, audited with both hashes.
7. ``launch`` - the gate again (``supervisor.gate``: the resume rule, the locks) on the files as
   they are now that no writer is alive; then detached, holding one lock per dataset
   (``.runwatch/<dataset>.lock``) for its lifetime, with the API key in the environment;
   confirmed by the host (alive with the expected identity after a settle time) or reported
   with its log tail.
   A client that exits 0 at once because every dataset is done is "nothing to do", not a failure.

If anything fails after the old run was stopped, the previous command line is launched again and
confirmed ("rolled back", audited) once the gate lets it: a rollback that would overwrite the
run's output is refused and the run stays stopped; a rollback that fails too is reported as such.
A script copied by ``script`` is put back first (the run stays stopped when it cannot be).
A refusal of ``quiet`` is the exception: another writer appends, so the run stays stopped.

A launch is the same plan without steps 3 and 4 (it refuses when the run is already running).

``make_plan(...)`` looks at the run as it is now and builds the plan, changing nothing;
``supervisor.steps.execute`` runs it.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from supervisor import display, launchspec, newscript
from supervisor.agent.masking import mask_argv
from supervisor.argv import argv_diff, parse_sets, parse_unsets, show_value
from supervisor.config import Config, RunConfig, command_prefix
from supervisor.errors import HostError, LaunchError, UsageError
from supervisor.errors import StepFailed as StepFailed  # where the steps take it from
from supervisor.launchspec import LaunchSpec
from supervisor.layout import RunLayout, layout_of
from supervisor.model import HostView, JobView, ProcessInfo, RunView, Snapshot
from supervisor.newscript import NewScript
from supervisor.runenv import launch_env
from supervisor.secrets import note_overrides

Action = Literal["launch", "restart"]
StepState = Literal["pending", "running", "ok", "failed", "skipped"]

STEP_TITLES = {
    "preflight": "check every flag set or removed is one the client accepts",
    "format-check": "check every dataset file against the run's format",
    "fingerprint": "compare the launch fingerprint (model, sampling, prompts)",
    "writers": "check that no other process writes the run's data files",
    "stop": "stop the old process by identity and confirm it is gone",
    "gpu-release": "wait until no process of the run holds GPU memory",
    "quiet": "watch the data files: nothing else may be appending to them",
    "data-repair": "re-check tails with no writer alive; move aside / repair",
    "script": "copy the new script to the host (the old one kept beside it), check its flags",
    "launch": "launch detached, holding the run's dataset locks, and confirm",
}

OnStep = Callable[["Step"], "Awaitable[None] | None"]


@dataclass
class Step:
    """One step of a plan, as it runs."""

    name: str
    """``preflight``, ``format-check``, ``fingerprint``, ``writers``, ``stop``, ``gpu-release``,
    ``quiet``, ``data-repair``, ``script``, ``launch``."""
    title: str
    state: StepState = "pending"
    detail: str = ""
    """What happened (or, for a failed check, what is wrong and what to do)."""
    data: dict[str, Any] = field(default_factory=dict)
    """Machine-readable outcome (scan verdicts, kill results, the launch reply...)."""

    @property
    def ok(self) -> bool | None:
        """True when done or skipped, False when failed, None while pending or running."""
        if self.state in ("ok", "skipped"):
            return True
        if self.state == "failed":
            return False
        return None

    def to_json(self) -> dict[str, Any]:
        detail = self.detail if self.state != "pending" else "not run"
        return {"name": self.name, "ok": self.ok, "state": self.state, "detail": detail}


@dataclass
class Plan:
    """What a launch or restart will do, computed before anything changes."""

    action: Action
    run: RunConfig
    host: str
    argv: list[str]
    """The effective argv: config argv, launch spec, overrides. Shown masked; never holds the
    API key."""
    old_argv: list[str] | None
    """argv of the running process (masked), or None when the run is not running."""
    old: ProcessInfo | None
    steps: list[Step]
    layout: RunLayout
    """Where the new argv writes: datasets, data files, locks, fingerprints, prompts, log."""
    spec: LaunchSpec
    """The launch spec this plan launches with (stored once the launch is confirmed)."""
    overrides: list[tuple[str, str | None]] = field(default_factory=list)
    unsets: list[str] = field(default_factory=list)
    force: bool = False
    """Launch a dataset already over its budget without a budget flag; let by a flag that neither
    the client's profile nor its source (read statically) confirms, and a value outside the type
    or choices its source declares."""
    move_aside: bool = False
    allow_change: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    """Environment for the child (run.env plus the API key). Never printed."""
    secret_env: list[str] = field(default_factory=list)
    budget_reason: str | None = None
    """Set when the budget guard made this plan."""
    job: JobView | None = None
    """The run's queued or running Slurm job (``kind = "slurm"`` hosts; ``old`` is then None)."""
    notes: list[str] = field(default_factory=list)
    """What the user should know that changes nothing (an older runwatch's launch spec)."""
    script: NewScript | None = None
    """``--script``: the local file that replaces the run's script on the host (step
    ``script``, right before the launch); the preflight reads it instead of the host's."""

    @property
    def paths(self) -> dict[str, str]:
        """``workdir``, ``out``, ``log`` as paths on the host."""
        return self.layout.paths

    @property
    def locks(self) -> list[str]:
        """The lock files of the new argv's datasets on the host (one per dataset)."""
        return list(self.layout.locks)

    @property
    def fingerprints(self) -> dict[str, str]:
        """The launch fingerprint file of each dataset of the new argv on the host."""
        return self.layout.fingerprints

    @property
    def datasets(self) -> list[str]:
        return list(self.layout.datasets)

    @property
    def prompt_files(self) -> dict[str, str]:
        return self.layout.prompt_files

    def last_launch_diff(self) -> list[dict[str, Any]] | None:
        """Flags that differ from the last confirmed launch (None: never launched here)."""
        if self.spec.last_argv is None:
            return None
        return argv_diff(self.spec.last_argv, mask_argv(self.argv, self.secrets))

    @property
    def secrets(self) -> list[str]:
        return [self.env[k] for k in self.secret_env if self.env.get(k)]

    def argv_diff(self) -> list[dict[str, Any]]:
        """Flags that change (both sides masked: the running argv is only known masked)."""
        old = self.old_argv if self.old_argv is not None else self.run.argv
        return argv_diff(mask_argv(old, self.secrets), mask_argv(self.argv, self.secrets))

    def describe(self) -> list[str]:
        """Lines for humans: what runs where, the argv change and the steps."""
        lines = [f"{self.action} {self.run.name} on {self.host} (in {self.paths['workdir']})"]
        if self.old is not None:
            ident = self.old.identity
            lines.append(f"  running now: pid {ident.pid} (started at tick {ident.start_time})")
        elif self.job is not None:
            lines.append(f"  running now: Slurm job {self.job.job_id} ({self.job.state})")
        else:
            lines.append("  running now: nothing")
        if self.old_argv is not None:
            lines.append(
                "  old argv: " + display.command_line(mask_argv(self.old_argv, self.secrets))
            )
        lines.append("  new argv: " + display.command_line(mask_argv(self.argv, self.secrets)))
        lines.extend(f"  note: {n}" for n in self.notes)
        if self.script is not None:
            lines.append(
                f"  new script: {self.script.path} (sha256 {self.script.short}) replaces the "
                "host's script once the old run is stopped; the old one is kept beside it"
            )
        for d in self.argv_diff():
            lines.append(f"    {d['flag']}: {show_value(d['old'])} -> {show_value(d['new'])}")
        last = self.last_launch_diff()
        if last is None:
            lines.append("  since the last launch: no launch recorded by runwatch")
        elif not last:
            lines.append("  since the last launch: same command line")
        else:
            lines.append("  since the last launch:")
            for d in last:
                lines.append(f"    {d['flag']}: {show_value(d['old'])} -> {show_value(d['new'])}")
        if not self.spec.empty:
            # Each "--flag=value" masked whole (a secret flag's value too), shown "--flag value".
            kept = [
                f if v is None else mask_argv([f"{f}={v}"], self.secrets)[0].replace("=", " ", 1)
                for f, v in self.spec.sets
            ]
            kept += [f"no {f}" for f in self.spec.unsets]
            lines.append(
                "  launch spec (kept for later launches; --reset drops it): " + ", ".join(kept)
            )
            secret = launchspec.secret_sets(self.spec)
            if secret:
                lines.append(
                    f"  not kept in the launch spec (secret values): {', '.join(secret)}; "
                    "pass them again, or give them through the run's env"
                )
        if self.secret_env:
            lines.append(f"  environment: {', '.join(self.secret_env)} passed from this machine")
        lines.append(f"  log: {self.paths['log']}")
        for i, s in enumerate(self.steps, 1):
            lines.append(f"  {i}. {s.name}: {s.title}")
        return lines


@dataclass
class ActionResult:
    """The outcome of a launch or restart."""

    action: Action
    run: str
    host: str
    ok: bool
    steps: list[Step]
    identity: dict[str, Any] | None = None
    """The new process (``boot_id, pid, start_time, uid, argv``) once confirmed."""
    old_identity: dict[str, Any] | None = None
    argv: list[str] = field(default_factory=list)
    argv_diff: list[dict[str, Any]] = field(default_factory=list)
    last_launch_diff: list[dict[str, Any]] | None = None
    """Flags changed since the last confirmed launch (None: none recorded)."""
    dry_run: bool = False
    nothing_to_do: bool = False
    """The client exited 0 at once: every dataset was already done."""
    rollback: dict[str, Any] | None = None
    """Set when the new launch failed after the stop: ``{"ok", "identity", "detail"}`` of the
    relaunch of the previous command line."""

    @property
    def failed_step(self) -> Step | None:
        return next((s for s in self.steps if s.state == "failed"), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "action": self.action,
            "run": self.run,
            "host": self.host,
            "dry_run": self.dry_run,
            "steps": [s.to_json() for s in self.steps],
            "identity": self.identity,
            "old_identity": self.old_identity,
            "argv": self.argv,
            "argv_diff": self.argv_diff,
            "last_launch_diff": self.last_launch_diff,
            "nothing_to_do": self.nothing_to_do,
            "rollback": self.rollback,
        }


def find_run_view(snapshot: Snapshot, host: str, run: str) -> RunView | None:
    for hv in snapshot.hosts:
        if hv.name != host:
            continue
        for rv in hv.runs:
            if rv.name == run:
                return rv
    return None


class Looks(Protocol):
    """What a plan needs to look at the run as it is now: the config and a fresh snapshot
    (``Engine`` has both; the plan never sees more of it)."""

    @property
    def config(self) -> Config: ...

    async def refresh(self) -> Snapshot: ...


async def make_plan(
    engine: Looks,
    run_name: str,
    *,
    action: Action = "restart",
    overrides: Iterable[str] | Iterable[tuple[str, str | None]] = (),
    unsets: Iterable[str] = (),
    reset: bool = False,
    force: bool = False,
    move_aside: bool = False,
    allow_change: Iterable[str] = (),
    environ: dict[str, str] | None = None,
    pid: int | None = None,
    script: str | None = None,
) -> Plan:
    """Look at the run as it is now and build the plan (changes nothing).

    The new argv is the config's argv with the run's launch spec (``supervisor.launchspec``;
    dropped with ``reset``) and then ``overrides`` / ``unsets`` applied. Raises ConfigError for an
    unknown run or one whose data files cannot be determined, HostError when its host cannot be
    reached, LaunchError for a launch of a run that is already running (restart it instead),
    UsageError for a ``script`` that cannot be read or a run on a Slurm host.
    """
    config = engine.config
    run = config.run(run_name)
    new_script = newscript.load(script) if script is not None else None
    if new_script is not None and config.host(run.host).kind == "slurm":
        raise UsageError(
            f"--script: {run.name} runs on the Slurm host {run.host}, whose script runwatch "
            "does not install",
            f"copy the script to {run.host} yourself, then run the same command without --script",
        )
    pairs = _as_pairs(overrides)
    note_overrides(pairs, [f for c in config.clients.values() for f in c.secret_flags])
    removed = parse_unsets(unsets)
    stored = launchspec.load(config.key, run.name)
    base = launchspec.LaunchSpec(run=run.name, last_argv=stored.last_argv) if reset else stored
    spec = base.merged(pairs, removed)
    argv = spec.argv(run.argv, launchspec.switches_of(config, run))
    layout = layout_of(config, run, argv)
    layout.require_files()  # nothing is checked on nothing
    env, secret_env = launch_env(config, run, environ)
    snap = await engine.refresh()
    hv = next((h for h in snap.hosts if h.name == run.host), None)
    if hv is None or not hv.connected:
        why = hv.error if hv is not None and hv.error else "not connected"
        raise HostError(f"{run.host}: cannot reach the host: {why}", "check the host and retry")
    rv = find_run_view(snap, run.host, run.name)
    # A zombie has exited (its parent has not reaped it yet): nothing to stop.
    # Another run's unit writing this run's files is that run's to stop (the fingerprint and
    # writers steps refuse, naming the command of its own config), never this plan's.
    old = rv.process if rv is not None and rv.state == "running" and rv.owner is None else None
    old = _named_process(hv, rv, run.name, pid) if pid is not None or _ambiguous(rv) else old
    if action == "launch" and old is not None:
        raise LaunchError(
            f"{run.name} is already running on {run.host}: pid {old.identity.pid}"
            + (f" ({rv.state_detail})" if rv is not None and rv.state_detail else ""),
            f"use `runwatch restart {run.name}` to stop it and start it again, or stop it: "
            f"`{command_prefix(config)} kill {shlex.quote(run.name)} --pid {old.identity.pid}`",
        )
    unit = rv.last_unit if rv is not None and rv.state == "running" else None
    if old is None and unit is not None and unit.state == "running":
        # Its unit still has processes, none of which a listing could pin: never a second copy.
        raise LaunchError(
            f"{run.name} is already running on {run.host}: unit {unit.launch_id} still has "
            "processes",
            f"stop it first (`runwatch kill {run.name}`), or see `runwatch status {run.name}`",
        )
    job = rv.job if rv is not None and rv.state in ("running", "pending") else None
    if action == "launch" and job is not None:
        raise LaunchError(
            f"{run.name} is already {rv.state if rv else 'queued'} on {run.host}: "
            f"Slurm job {job.job_id}",
            f"use `runwatch restart {run.name}` to cancel it and submit it again",
        )
    names = ["preflight", "format-check", "fingerprint", "writers"]
    if action == "restart":
        names += ["stop", "gpu-release"]
    names += ["quiet", "data-repair"]
    names += ["script"] if new_script is not None else []
    names += ["launch"]
    return Plan(
        action=action,
        run=run,
        host=run.host,
        argv=argv,
        old_argv=list(old.argv_masked or old.identity.argv) if old is not None else None,
        old=old,
        steps=[Step(n, STEP_TITLES[n]) for n in names],
        layout=layout,
        spec=spec,
        notes=[n for n in (launchspec.legacy_note(run.name),) if n],
        overrides=pairs,
        unsets=removed,
        force=force,
        move_aside=move_aside,
        allow_change=list(allow_change),
        env=env,
        secret_env=secret_env,
        job=job,
        script=new_script,
    )


def _ambiguous(rv: RunView | None) -> bool:
    return rv is not None and rv.state == "ambiguous"


def _named_process(hv: HostView, rv: RunView | None, run: str, pid: int | None) -> ProcessInfo:
    """The process named by ``pid`` among those that could be ``run``; an ambiguous run without
    a pid is refused (stopping the wrong one would leave the real run writing beside the
    relaunch)."""
    cands = (rv.candidates or ([rv.process.identity.pid] if rv.process else [])) if rv else []
    if pid is None:
        raise LaunchError(
            f"{run} is ambiguous on {hv.name}: pids {', '.join(map(str, cands))} could each be "
            "it; nothing was stopped",
            f"name the one to stop: `runwatch restart {run} --pid PID` (see `runwatch ps --host "
            f"{hv.name}`)",
        )
    found = next((p for p in hv.processes if p.identity.pid == pid and pid in cands), None)
    if found is None:
        raise LaunchError(
            f"pid {pid} on {hv.name} is not {run} (its processes: "
            f"{', '.join(map(str, cands)) or 'none'})",
            f"see `runwatch ps --host {hv.name}`",
        )
    return found


def _as_pairs(
    overrides: Iterable[str] | Iterable[tuple[str, str | None]],
) -> list[tuple[str, str | None]]:
    items = list(overrides)
    if all(isinstance(o, str) for o in items):
        return parse_sets([str(o) for o in items])
    return [(str(k), None if v is None else str(v)) for k, v in items]
