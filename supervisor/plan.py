"""Plans of a launch or restart: the steps, what they will do, and the result they give.

A restart is a plan of six steps; the checks that can fail come first, while the old run is still
alive, so that a blocked restart kills nothing and changes nothing:

1. ``format-check`` - every dataset file of the run is scanned with full validation (complete
   lines only) against the format the run writes; ``legacy``, ``mixed``, ``unknown`` or
   ``corrupt`` blocks, naming file, line and keys. With ``move_aside`` those files are moved
   aside in step 5 instead (``<file>.<format>-<timestamp>``, nothing deleted).
2. ``fingerprint`` - the launch fingerprint stored at the last launch of each dataset
   (``.runwatch/<dataset>.launch.json`` in the output dir: argv, model, sampling parameters,
   prompt-file hash, format) is compared with the new launch; a change of model, sampling or
   prompts blocks unless allowed. Never launched by runwatch: compared with the running process.
3. ``stop`` - the old process is stopped by identity (``Engine.kill_within_plan``) and its exit
   confirmed (``probe``), then its lock on the host is seen released.
4. ``gpu-release`` - where the host has nvidia-smi, wait until no process of the stopped run
   holds GPU memory (bounded by ``steps.DEFAULT_GPU_WAIT_S``).
5. ``data-repair`` - the tails are checked again now that no writer is alive: blocking files are
   moved aside (``move_aside``), a torn last line is repaired (``.broken`` backup, truncate, fsync).
6. ``launch`` - detached, holding one lock per dataset (``.runwatch/<dataset>.lock``) for its
   lifetime, with the API key in the environment; confirmed by
   the host (alive with the expected identity after a settle time) or reported with its log tail.

A launch is the same plan without steps 3 and 4 (it refuses when the run is already running).

``make_plan(...)`` looks at the run as it is now and builds the plan, changing nothing;
``supervisor.steps.execute`` runs it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from supervisor.agent.masking import mask_argv
from supervisor.argv import apply_overrides, argv_diff, parse_sets, show_value
from supervisor.config import RunConfig
from supervisor.errors import HostError, LaunchError, RunwatchError
from supervisor.fingerprint import prompt_files
from supervisor.model import JobView, ProcessInfo, RunView, Snapshot
from supervisor.runenv import launch_env
from supervisor.runpaths import run_paths, run_sidecars

if TYPE_CHECKING:
    from supervisor.engine import Engine

Action = Literal["launch", "restart"]
StepState = Literal["pending", "running", "ok", "failed", "skipped"]

STEP_TITLES = {
    "format-check": "check every dataset file against the run's format",
    "fingerprint": "compare the launch fingerprint (model, sampling, prompts)",
    "stop": "stop the old process by identity and confirm it is gone",
    "gpu-release": "wait until no process of the run holds GPU memory",
    "data-repair": "re-check tails with no writer alive; move aside / repair",
    "launch": "launch detached, holding the run's dataset locks, and confirm",
}

OnStep = Callable[["Step"], "Awaitable[None] | None"]


@dataclass
class Step:
    """One step of a plan, as it runs."""

    name: str
    """``format-check``, ``fingerprint``, ``stop``, ``gpu-release``, ``data-repair``, ``launch``."""
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
    """The new argv (config argv with overrides). Shown masked; never contains the API key."""
    old_argv: list[str] | None
    """argv of the running process (masked), or None when the run is not running."""
    old: ProcessInfo | None
    steps: list[Step]
    overrides: list[tuple[str, str]] = field(default_factory=list)
    move_aside: bool = False
    allow_change: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    """Environment for the child (run.env plus the API key). Never printed."""
    secret_env: list[str] = field(default_factory=list)
    paths: dict[str, str] = field(default_factory=dict)
    """``workdir``, ``out``, ``log`` as paths on the host."""
    locks: list[str] = field(default_factory=list)
    """The run's lock files on the host (one per dataset)."""
    fingerprints: dict[str, str] = field(default_factory=dict)
    """The launch fingerprint file of each dataset on the host."""
    datasets: list[str] = field(default_factory=list)
    prompt_files: dict[str, str] = field(default_factory=dict)
    budget_reason: str | None = None
    """Set when the budget guard made this plan."""
    job: JobView | None = None
    """The run's queued or running Slurm job (``kind = "slurm"`` hosts; ``old`` is then None)."""

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
            lines.append("  old argv: " + " ".join(mask_argv(self.old_argv, self.secrets)))
        lines.append("  new argv: " + " ".join(mask_argv(self.argv, self.secrets)))
        for d in self.argv_diff():
            lines.append(f"    {d['flag']}: {show_value(d['old'])} -> {show_value(d['new'])}")
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
    dry_run: bool = False

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
        }


class StepFailed(RunwatchError):
    """A step of a plan failed; the message says what happened and the hint what to do."""


def find_run_view(snapshot: Snapshot, host: str, run: str) -> RunView | None:
    for hv in snapshot.hosts:
        if hv.name != host:
            continue
        for rv in hv.runs:
            if rv.name == run:
                return rv
    return None


async def make_plan(
    engine: Engine,
    run_name: str,
    *,
    action: Action = "restart",
    overrides: Iterable[str] | Iterable[tuple[str, str]] = (),
    move_aside: bool = False,
    allow_change: Iterable[str] = (),
    environ: dict[str, str] | None = None,
) -> Plan:
    """Look at the run as it is now and build the plan (changes nothing).

    Raises ConfigError for an unknown run, HostError when its host cannot be reached,
    LaunchError for a launch of a run that is already running (restart it instead).
    """
    config = engine.config
    run = config.run(run_name)
    pairs = _as_pairs(overrides)
    argv = apply_overrides(run.argv, pairs)
    env, secret_env = launch_env(config, run, environ)
    snap = await engine.refresh()
    hv = next((h for h in snap.hosts if h.name == run.host), None)
    if hv is None or not hv.connected:
        why = hv.error if hv is not None and hv.error else "not connected"
        raise HostError(f"{run.host}: cannot reach the host: {why}", "check the host and retry")
    rv = find_run_view(snap, run.host, run.name)
    # A zombie has exited (its parent has not reaped it yet): nothing to stop.
    old = rv.process if rv is not None and rv.state == "running" else None
    if action == "launch" and old is not None:
        raise LaunchError(
            f"{run.name} is already running on {run.host}: pid {old.identity.pid}",
            f"use `runwatch restart {run.name}` to stop it and start it again",
        )
    job = rv.job if rv is not None and rv.state in ("running", "pending") else None
    if action == "launch" and job is not None:
        raise LaunchError(
            f"{run.name} is already {rv.state if rv else 'queued'} on {run.host}: "
            f"Slurm job {job.job_id}",
            f"use `runwatch restart {run.name}` to cancel it and submit it again",
        )
    locks, fingerprints = run_sidecars(config, run)
    names = ["format-check", "fingerprint"]
    if action == "restart":
        names += ["stop", "gpu-release"]
    names += ["data-repair", "launch"]
    return Plan(
        action=action,
        run=run,
        host=run.host,
        argv=argv,
        old_argv=list(old.argv_masked or old.identity.argv) if old is not None else None,
        old=old,
        steps=[Step(n, STEP_TITLES[n]) for n in names],
        overrides=pairs,
        move_aside=move_aside,
        allow_change=list(allow_change),
        env=env,
        secret_env=secret_env,
        paths=run_paths(config, run),
        locks=locks,
        fingerprints=fingerprints,
        datasets=config.run_datasets(run),
        prompt_files=prompt_files(run, argv, config),
        job=job,
    )


def _as_pairs(overrides: Iterable[str] | Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    items = list(overrides)
    if all(isinstance(o, str) for o in items):
        return parse_sets([str(o) for o in items])
    return [(str(k), str(v)) for k, v in items]
