"""Launch and restart of runs behind checks, step by step, and the budget guard.

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
3. ``stop`` - the old process is stopped by identity (``Engine.kill``) and its exit confirmed
   (``probe``), then its lock on the host is seen released.
4. ``gpu-release`` - where the host has nvidia-smi, wait until no process of the stopped run
   holds GPU memory (bounded by ``DEFAULT_GPU_WAIT_S``).
5. ``data-repair`` - the tails are checked again now that no writer is alive: blocking files are
   moved aside (``move_aside``), a torn last line is repaired (``.broken`` backup, truncate, fsync).
6. ``launch`` - detached, holding one lock per dataset (``.runwatch/<dataset>.lock``) for its
   lifetime, with the API key in the environment; confirmed by
   the host (alive with the expected identity after a settle time) or reported with its log tail.

A launch is the same plan without steps 3 and 4 (it refuses when the run is already running).

API for front ends (the CLI and the TUI use only these)::

    plan = await make_plan(engine, "eagle3-kimi", action="restart",
                           overrides=["token-budget=10000000"], move_aside=False,
                           allow_change=[])
    plan.describe()          # lines for humans: steps, old -> new argv (masked), flag diff
    result = await execute(engine, plan, dry_run=False, on_step=callback)
    result.to_json()         # {"ok", "action", "run", "host", "steps": [{"name", "ok",
                             #  "detail"}], "identity", "argv", "argv_diff", "dry_run"}

``launch(...)`` and ``restart(...)`` do both at once. ``tail_log(engine, run, lines)`` gives the
last lines of a run's log on its host (for a live log pane).

``on_step(step)`` is called (it may be a coroutine function) every time a step changes state:
``running`` when it starts, then ``ok``, ``failed`` or ``skipped`` with its ``detail`` - so a
front end can show each check's result live. The same ``Step`` object is passed each time;
copy what you keep (``step.to_json()``). ``result.ok`` is true only when the new run is confirmed
running (for a dry run: when every check passed). Steps after a failed one stay ``pending``.

Every executed (not dry-run) launch and restart is appended to the audit log with each step's
outcome; so are the move-asides and repairs it does, and the budget guard's actions.

Budget guard: ``BudgetGuard(config).observe(snapshot)`` returns the budget events not yet acted
on (a run without ``--token-budget`` whose dataset passed its budget) with the action its policy
asks for; ``await guard.act(engine, event)`` carries it out exactly once (an ``O_EXCL`` marker in
the state dir, keyed by host, run, process identity and dataset, survives restarts of runwatch and
keeps two runwatch instances from both acting); ``await guard.enforce(engine, snapshot)`` does
both. ``warn`` events are audited once and otherwise left to the front ends to show.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import os
import posixpath
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from supervisor import audit
from supervisor.config import Config, RunConfig, flag_value
from supervisor.errors import (
    HostError,
    LaunchError,
    OutcomeUnknown,
    RunwatchError,
    UsageError,
)
from supervisor.hostops import (
    FINGERPRINT_NAME,
    LOCK_NAME,
    SIDECAR_DIR,
    mask_argv,
    mask_text,
)
from supervisor.model import Identity, ProcessInfo, RunView, Snapshot
from supervisor.paths import state_dir

if TYPE_CHECKING:
    from supervisor.engine import Engine

Action = Literal["launch", "restart"]
StepState = Literal["pending", "running", "ok", "failed", "skipped"]

BLOCKING_VERDICTS = ("legacy", "mixed", "unknown", "corrupt")
"""Verdicts that make resuming on a file unsafe."""
SAMPLING_FLAGS = (
    "--temperature",
    "--top-p",
    "--top-k",
    "--min-p",
    "--max-tokens",
    "--max-new-tokens",
    "--presence-penalty",
    "--frequency-penalty",
    "--repetition-penalty",
    "--seed",
    "--reasoning-effort",
    "--chat-template",
    "--system-prompt",
)
"""Flags whose change alters what the run generates (fingerprinted)."""
MODEL_FLAGS = ("--model", "--model-name")
PROMPT_DIR_FLAGS = ("--prompts-dir", "--prompt-dir", "--prompts")
DEFAULT_GPU_WAIT_S = 120.0
DEFAULT_LOCK_WAIT_S = 30.0
STEP_TITLES = {
    "format-check": "check every dataset file against the run's format",
    "fingerprint": "compare the launch fingerprint (model, sampling, prompts)",
    "stop": "stop the old process by identity and confirm it is gone",
    "gpu-release": "wait until no process of the run holds GPU memory",
    "data-repair": "re-check tails with no writer alive; move aside / repair",
    "launch": "launch detached, holding the run's dataset locks, and confirm",
}
_KEY_RE = re.compile(r"^-{0,2}([A-Za-z0-9][A-Za-z0-9_.\-]*)$")

OnStep = Callable[["Step"], "Awaitable[None] | None"]


# --------------------------------------------------------------------------- steps and results


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
        else:
            lines.append("  running now: nothing")
        if self.old_argv is not None:
            lines.append("  old argv: " + " ".join(mask_argv(self.old_argv, self.secrets)))
        lines.append("  new argv: " + " ".join(mask_argv(self.argv, self.secrets)))
        for d in self.argv_diff():
            lines.append(f"    {d['flag']}: {_show(d['old'])} -> {_show(d['new'])}")
        if self.secret_env:
            lines.append(f"  environment: {', '.join(self.secret_env)} passed from this machine")
        lines.append(f"  log: {self.paths['log']}")
        for i, s in enumerate(self.steps, 1):
            lines.append(f"  {i}. {s.name}: {s.title}")
        return lines


def _show(v: Any) -> str:
    if v is None:
        return "(absent)"
    if v is True:
        return "(set)"
    return str(v)


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


# --------------------------------------------------------------------------- argv overrides


def parse_sets(values: Iterable[str]) -> list[tuple[str, str]]:
    """``["token-budget=10000000"]`` -> ``[("--token-budget", "10000000")]``."""
    out: list[tuple[str, str]] = []
    for v in values:
        key, eq, value = v.partition("=")
        m = _KEY_RE.match(key.strip())
        if not eq or not m:
            raise UsageError(
                f"--set {v!r}: expected KEY=VALUE",
                "for example --set token-budget=10000000 (becomes --token-budget 10000000)",
            )
        out.append(("--" + m.group(1), value))
    return out


def apply_overrides(argv: Sequence[str], overrides: Iterable[tuple[str, str]]) -> list[str]:
    """argv with each ``(flag, value)`` replacing every ``flag VALUE`` / ``flag=VALUE`` (or added).

    The argv is a list; values are never split or quoted, so any string stays one argument.
    """
    out = list(argv)
    for flag, value in overrides:
        found = False
        i = 0
        while i < len(out):
            arg = out[i]
            if arg == flag and i + 1 < len(out):
                out[i + 1] = value
                found = True
                i += 2
                continue
            if arg.startswith(flag + "="):
                out[i] = f"{flag}={value}"
                found = True
            i += 1
        if not found:
            out += [flag, value]
    return out


def _flag_map(argv: Sequence[str]) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg.partition("=")
            if eq:
                flags[name] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                flags[name] = argv[i + 1]
                i += 1
            else:
                flags[name] = True
        i += 1
    return flags


def argv_diff(old: Sequence[str], new: Sequence[str]) -> list[dict[str, Any]]:
    """Flags that differ between two argvs: ``[{"flag", "old", "new"}]`` (None: absent)."""
    a, b = _flag_map(old), _flag_map(new)
    diff = [
        {"flag": k, "old": a.get(k), "new": b.get(k)}
        for k in list(a) + [k for k in b if k not in a]
        if a.get(k) != b.get(k)
    ]
    lead_a = [x for x in old if not x.startswith("--")][:2]
    lead_b = [x for x in new if not x.startswith("--")][:2]
    if lead_a != lead_b:
        diff.insert(0, {"flag": "(command)", "old": " ".join(lead_a), "new": " ".join(lead_b)})
    return diff


# --------------------------------------------------------------------------- fingerprint


def fingerprint_of(run: RunConfig, argv: Sequence[str], config: Config) -> dict[str, Any]:
    """What makes the run's data what it is (without the prompt hashes, which the host adds)."""
    model = None
    for f in MODEL_FLAGS:
        model = flag_value(list(argv), f) or model
    if model is None and run.endpoint is not None:
        model = config.endpoint(run.endpoint).model
    sampling = {}
    for f in SAMPLING_FLAGS:
        v = flag_value(list(argv), f)
        if v is not None:
            sampling[f.lstrip("-")] = v
    return {
        "argv": mask_argv(list(argv)),
        "model": model,
        "sampling": sampling,
        "format": run.format,
        "run": run.name,
    }


def prompt_files(run: RunConfig, argv: Sequence[str], config: Config) -> dict[str, str]:
    """Prompt file of each dataset (relative to workdir): from config, else ``--prompts-dir``."""
    out: dict[str, str] = {}
    pdir = None
    for f in PROMPT_DIR_FLAGS:
        pdir = flag_value(list(argv), f) or pdir
    for ds in config.run_datasets(run):
        dc = config.datasets.get(ds)
        if dc is not None and dc.prompts:
            out[ds] = dc.prompts
        elif pdir:
            out[ds] = posixpath.join(pdir, f"{ds}.jsonl")
    return out


def compare_fingerprints(
    stored: dict[str, Any] | None,
    new: dict[str, Any],
    hashes: dict[str, Any],
    allow: Iterable[str] = (),
) -> tuple[list[str], list[str]]:
    """(blocking changes, allowed changes) between the stored fingerprint and the new launch.

    Keys: ``model``, ``format``, ``sampling`` (or one parameter: ``temperature``...), ``prompts``
    (or ``prompts:B1``). ``hashes`` are the prompt files' hashes now (``read_fingerprint``).
    """
    allowed = {a.strip().lstrip("-") for a in allow}
    changes: list[tuple[set[str], str]] = []
    if stored is None:
        return [], []
    if stored.get("model") != new.get("model"):
        changes.append(({"model"}, f"model {stored.get('model')!r} -> {new.get('model')!r}"))
    if stored.get("format") is not None and stored.get("format") != new.get("format"):
        changes.append(({"format"}, f"format {stored.get('format')} -> {new.get('format')}"))
    old_s = stored.get("sampling") or {}
    new_s = new.get("sampling") or {}
    for k in sorted(set(old_s) | set(new_s)):
        if old_s.get(k) != new_s.get(k):
            changes.append(({"sampling", k}, f"{k} {_show(old_s.get(k))} -> {_show(new_s.get(k))}"))
    old_p = stored.get("prompts") or {}
    for ds in sorted(set(old_p) | set(hashes)):
        before = (old_p.get(ds) or {}).get("sha256")
        now = (hashes.get(ds) or {}).get("sha256")
        if ds in old_p and ds in hashes and before != now:
            changes.append(
                (
                    {"prompts", f"prompts:{ds}"},
                    f"prompts of {ds} changed ({_short(before)} -> {_short(now)})",
                )
            )
    blocking = [text for keys, text in changes if not keys & allowed]
    allowed_changes = [text for keys, text in changes if keys & allowed]
    return blocking, allowed_changes


def _grouped(changes: dict[str, list[str]]) -> str:
    """``{"model 'a' -> 'b'": ["B1", "B2"]}`` -> ``model 'a' -> 'b' (B1, B2)``."""
    return "; ".join(
        f"{text} ({', '.join(d for d in dss if d != '*')})" if dss != ["*"] else text
        for text, dss in changes.items()
    )


def _short(digest: Any) -> str:
    return str(digest)[:12] if digest else "missing"


# --------------------------------------------------------------------------- planning


def _host_path(hc_local: bool, path: str) -> str:
    return os.path.expanduser(path) if hc_local else path


def run_paths(config: Config, run: RunConfig) -> dict[str, str]:
    """Paths of a run on its host: workdir, output dir, lock, fingerprint sidecar, log."""
    hc = config.host(run.host)
    workdir = _host_path(hc.local, run.workdir)
    out = posixpath.normpath(posixpath.join(workdir, _host_path(hc.local, run.output_dir)))
    side = posixpath.join(out, SIDECAR_DIR)
    log = (
        posixpath.join(workdir, _host_path(hc.local, run.log))
        if run.log
        else posixpath.join(side, "run.log")
    )
    return {"workdir": workdir, "out": out, "log": posixpath.normpath(log)}


def run_sidecars(config: Config, run: RunConfig) -> tuple[list[str], dict[str, str]]:
    """(lock files, fingerprint file per dataset) of a run, in ``<out>/.runwatch/``.

    One lock per dataset (``<dataset>.lock``), so that two runs sharing an output dir never block
    each other while two writers of one dataset can never both start; one fingerprint per dataset
    (``<dataset>.launch.json``), so that a change of model or sampling is caught even when another
    run writes the dataset next. A run whose datasets are unknown uses ``run.lock`` and
    ``launch.json``.
    """
    side = posixpath.join(run_paths(config, run)["out"], SIDECAR_DIR)
    datasets = config.run_datasets(run)
    if not datasets:
        return [posixpath.join(side, LOCK_NAME)], {"*": posixpath.join(side, FINGERPRINT_NAME)}
    locks = [posixpath.join(side, f"{ds}.lock") for ds in datasets]
    return locks, {ds: posixpath.join(side, f"{ds}.launch.json") for ds in datasets}


def launch_env(
    config: Config, run: RunConfig, environ: dict[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """(environment for the child, names of its secret entries). The API key comes from this
    machine's environment variable named by the endpoint's ``api_key_env``."""
    env = dict(run.env)
    secret: list[str] = []
    if run.endpoint is None:
        return env, secret
    ep = config.endpoint(run.endpoint)
    if ep.api_key_env:
        source = os.environ if environ is None else environ
        value = source.get(ep.api_key_env)
        if value:
            env[ep.api_key_env] = value
            secret.append(ep.api_key_env)
        elif ep.kind == "api":
            raise LaunchError(
                f"{run.name}: environment variable {ep.api_key_env} is not set "
                f"(endpoint {ep.name} needs an API key)",
                f"export {ep.api_key_env}=... in this shell; the key is passed to the run's "
                "environment, never its argv",
            )
    return env, secret


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
    )


def _as_pairs(overrides: Iterable[str] | Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    items = list(overrides)
    if all(isinstance(o, str) for o in items):
        return parse_sets([str(o) for o in items])
    return [(str(k), str(v)) for k, v in items]


# --------------------------------------------------------------------------- execution


class _Runner:
    def __init__(self, engine: Engine, plan: Plan, dry_run: bool, on_step: OnStep | None) -> None:
        self.engine = engine
        self.plan = plan
        self.dry_run = dry_run
        self.on_step = on_step
        self.host: Any = engine.host(plan.host)
        self.hc = engine.config.host(plan.host)
        self.blocking: list[dict[str, Any]] = []
        self.identity: dict[str, Any] | None = None
        self.side_records: list[dict[str, Any]] = []
        """Audit records of the move-asides and repairs done by this plan."""

    async def emit(self, step: Step) -> None:
        if self.on_step is None:
            return
        r = self.on_step(step)
        if inspect.isawaitable(r):
            await r

    async def set(self, step: Step, state: StepState, detail: str = "") -> None:
        step.state = state
        step.detail = mask_text(detail, self.plan.secrets)
        await self.emit(step)

    async def request(self, op: str, params: dict[str, Any], timeout: float | None = None) -> Any:
        return await self.host.request(op, params, timeout=timeout)

    async def run(self) -> ActionResult:
        plan = self.plan
        steps = {s.name: s for s in plan.steps}
        fns: dict[str, Callable[[Step], Awaitable[None]]] = {
            "format-check": self.format_check,
            "fingerprint": self.fingerprint,
            "stop": self.stop,
            "gpu-release": self.gpu_release,
            "data-repair": self.data_repair,
            "launch": self.launch,
        }
        ok = True
        for s in plan.steps:
            if not ok:
                break
            acting = s.name in ("stop", "gpu-release", "data-repair", "launch")
            if self.dry_run and acting:
                await self.set(s, "skipped", "dry run: " + self.would(s.name))
                continue
            await self.set(s, "running", s.title)
            try:
                await fns[s.name](s)
            except RunwatchError as e:
                await self.set(s, "failed", str(e))
                ok = False
            except (OSError, asyncio.TimeoutError, KeyError, TypeError, ValueError) as e:
                # Unexpected, but the outcome must still be shown and audited.
                await self.set(s, "failed", f"{type(e).__name__}: {e}")
                ok = False
            else:
                if s.state == "running":
                    await self.set(s, "ok", s.detail)
        confirmed = ok and (self.dry_run or self.identity is not None)
        result = ActionResult(
            action=plan.action,
            run=plan.run.name,
            host=plan.host,
            ok=confirmed,
            steps=[steps[s.name] for s in plan.steps],
            identity=self.identity,
            old_identity=msgspec.to_builtins(plan.old.identity) if plan.old else None,
            argv=mask_argv(plan.argv, plan.secrets),
            argv_diff=plan.argv_diff(),
            dry_run=self.dry_run,
        )
        if not self.dry_run:
            audit.record(
                plan.action,
                host=plan.host,
                run=plan.run.name,
                ok=confirmed,
                identity=self.identity,
                argv=plan.argv,
                steps=[s.to_json() for s in result.steps],
                secrets=plan.secrets,
                old_identity=result.old_identity,
                argv_diff=result.argv_diff,
                reason=plan.budget_reason,
            )
        return result

    def would(self, name: str) -> str:
        p = self.plan
        if name == "stop":
            if p.old is None:
                return "nothing running to stop"
            return f"would stop pid {p.old.identity.pid} by identity and confirm its exit"
        if name == "gpu-release":
            return "would wait for the GPU memory of the stopped run to be released"
        if name == "data-repair":
            moves = [b["path"] for b in self.blocking]
            text = "would repair a torn last line if one is left"
            if moves:
                text = f"would move aside {', '.join(moves)}; " + text
            return text
        return "would launch " + " ".join(mask_argv(p.argv, p.secrets))

    # ------------------------------------------------------------ 1. format check

    async def scan_all(self) -> list[dict[str, Any]]:
        scans = await self.engine.check_run(self.plan.run.name)
        return list(scans)

    async def format_check(self, step: Step) -> None:
        scans = await self.scan_all()
        step.data["files"] = [_scan_summary(s) for s in scans]
        self.blocking = [s for s in scans if _blocks(s)]
        if not self.blocking:
            counts: dict[str, int] = {}
            for s in scans:
                v = str(s.get("verdict") or s.get("state"))
                counts[v] = counts.get(v, 0) + 1
            step.detail = f"{len(scans)} file(s): " + ", ".join(
                f"{n} {v}" for v, n in sorted(counts.items())
            )
            return
        problems = "; ".join(_explain_block(s) for s in self.blocking)
        if self.plan.move_aside:
            step.detail = f"will move aside once no writer is alive: {problems}"
            return
        raise StepFailed(
            f"{self.plan.action} blocked by data not in format {self.plan.run.format!r}: "
            f"{problems}",
            "convert or remove those files, or pass --move-aside to rename them to "
            "<file>.<format>-<timestamp> (nothing is deleted) so the run starts them afresh",
        )

    # ------------------------------------------------------------ 2. fingerprint

    async def fingerprint(self, step: Step) -> None:
        plan = self.plan
        config = self.engine.config
        new = fingerprint_of(plan.run, plan.argv, config)
        reply = await self.request(
            "read_fingerprint",
            {
                "paths": plan.fingerprints,
                "workdir": plan.paths["workdir"],
                "hash_files": plan.prompt_files,
            },
        )
        hashes: dict[str, Any] = reply.get("hashes") or {}
        stored_all: dict[str, Any] = reply.get("fingerprints") or {}
        # Launched without runwatch: compare with what the running process was told.
        from_process = None
        process_source = ""
        if plan.old is not None:
            from_process = fingerprint_of(plan.run, list(plan.old.identity.argv), config)
            from_process.pop("format", None)
            process_source = f"the running process (pid {plan.old.identity.pid})"
        blocking: dict[str, list[str]] = {}
        allowed: dict[str, list[str]] = {}
        sources: set[str] = set()
        for ds in plan.fingerprints:
            stored = (stored_all.get(ds) or {}).get("fingerprint")
            source = "the last launch"
            if stored is None and from_process is not None:
                stored, source = from_process, process_source
            if stored is None:
                continue
            sources.add(source)
            b, a = compare_fingerprints(
                stored, new, {ds: hashes[ds]} if ds in hashes else {}, plan.allow_change
            )
            for text in b:
                blocking.setdefault(text, []).append(ds)
            for text in a:
                allowed.setdefault(text, []).append(ds)
        step.data.update(new=new, stored=stored_all, hashes=hashes)
        if not sources:
            step.detail = "no fingerprint recorded and nothing running; nothing to compare"
            return
        where = " and ".join(sorted(sources))
        if blocking:
            raise StepFailed(
                f"the new launch differs from {where}: " + _grouped(blocking),
                "data generated with different settings would be mixed in one dataset; "
                "pass --allow-change KEY (model, sampling, temperature..., prompts, format) "
                "if that is intended",
            )
        step.detail = f"same model, sampling and prompts as {where}" + (
            f" (allowed changes: {_grouped(allowed)})" if allowed else ""
        )

    # ------------------------------------------------------------ 3. stop

    async def stop(self, step: Step) -> None:
        plan = self.plan
        if plan.old is None:
            await self.set(step, "skipped", "not running; nothing to stop")
            return
        ident = plan.old.identity
        try:
            res = await self.engine.kill(plan.host, ident, plan.run.stop_grace_seconds)
        except OutcomeUnknown as e:
            step.data["kill"] = {"unknown": str(e)}
            res = None  # reconciled below: the probe tells whether it is gone
        outcome = msgspec.to_builtins(res) if res is not None else None
        step.data["kill"] = outcome
        refused = _refused(outcome)
        # A process already exiting when the kill arrived is waited for by the agent itself.
        probe = await self._probe(ident)
        if refused and probe.get("alive"):
            raise StepFailed(
                f"kill refused: {refused}",
                "the process listed is no longer the run (PID reused, host rebooted, other "
                "owner) or is still exiting; refresh and check what runs",
            )
        if refused:
            # The process named by the identity (same boot, pid and start time) is gone: it
            # exited on its own or was stopped by someone else while this plan ran.
            outcome = {"results": [{"outcome": "already-gone", "detail": probe.get("detail")}]}
        if probe.get("alive"):
            raise StepFailed(
                f"pid {ident.pid} is still alive after the kill ({probe.get('detail')})",
                "nothing was launched; look at the process on the host",
            )
        lock = await self._wait_lock_free()
        step.detail = f"pid {ident.pid}: {_kill_summary(outcome)}; exit confirmed" + (
            f"; {lock}" if lock else ""
        )

    async def _probe(self, ident: Identity) -> dict[str, Any]:
        for attempt in range(3):
            try:
                reply: dict[str, Any] = await self.request(
                    "probe", {"identity": msgspec.to_builtins(ident)}
                )
                return reply
            except HostError:
                if attempt == 2:
                    raise
                await self.host.connect()
        return {}

    async def _wait_lock_free(self) -> str:
        deadline = time.monotonic() + DEFAULT_LOCK_WAIT_S
        while True:
            st = await self.request("lock_status", {"lock_paths": self.plan.locks})
            path = st.get("lock_path")
            if not st.get("held"):
                return ""
            holder = st.get("holder") or {}
            hid = holder.get("identity")
            old = self.plan.old.identity if self.plan.old else None
            other = isinstance(hid, dict) and (
                old is None or (hid.get("pid"), hid.get("start_time")) != (old.pid, old.start_time)
            )
            if holder.get("state") == "launching" or (other and st.get("holder_alive")):
                who = f"pid {hid.get('pid')}" if isinstance(hid, dict) else "a launch in progress"
                raise StepFailed(
                    f"already running: {who} holds the run's lock {path} (started by another "
                    "runwatch or launch)",
                    "nothing was launched; refresh to see the process that runs now",
                )
            if time.monotonic() > deadline:
                raise StepFailed(
                    f"the run's lock {path} is still held by {st.get('holder')}",
                    "a process of the old run still holds it; stop it before relaunching",
                )
            await asyncio.sleep(0.2)  # polling the host for a condition, bounded above

    # ------------------------------------------------------------ 4. GPU

    async def gpu_release(self, step: Step) -> None:
        plan = self.plan
        hello = getattr(self.host, "hello", None) or {}
        if not hello.get("has_nvidia_smi"):
            await self.set(step, "skipped", "no nvidia-smi on the host")
            return
        pids = [plan.old.identity.pid, *plan.old.children] if plan.old else []
        if not pids:
            await self.set(step, "skipped", "nothing was running")
            return
        began = time.monotonic()
        deadline = began + DEFAULT_GPU_WAIT_S
        checks = 0
        while True:
            reply = await self.request("gpu_holders", {"pids": pids})
            checks += 1
            if not reply.get("available"):
                step.detail = "nvidia-smi gave no answer; not waiting"
                return
            holders = reply.get("holders") or {}
            step.data["holders"] = holders
            if not holders:
                step.detail = "no process of the run holds GPU memory" + (
                    f" (released after {time.monotonic() - began:.1f} s, {checks} checks)"
                    if checks > 1
                    else ""
                )
                return
            if time.monotonic() > deadline:
                raise StepFailed(
                    f"GPU memory still held after {DEFAULT_GPU_WAIT_S:.0f} s by pid "
                    + ", ".join(f"{p} ({mb:.0f} MiB)" for p, mb in holders.items()),
                    "the old run is stopped; check nvidia-smi on the host, then launch",
                )
            await asyncio.sleep(0.5)  # polling nvidia-smi for a condition, bounded above

    # ------------------------------------------------------------ 5. data repair

    async def data_repair(self, step: Step) -> None:
        plan = self.plan
        # Touch data only when no run holds the lock (another runwatch may have launched it).
        st = await self.request("lock_status", {"lock_paths": plan.locks})
        if st.get("held"):
            hid = (st.get("holder") or {}).get("identity")
            who = f"pid {hid.get('pid')}" if isinstance(hid, dict) else "a launch in progress"
            raise StepFailed(
                f"already running: {who} holds the lock {st.get('lock_path')}",
                "nothing was changed or launched; refresh to see the process that runs now",
            )
        scans = await self.scan_all()
        notes: list[str] = []
        for s in scans:
            path = str(s.get("path"))
            if _blocks(s):
                if not plan.move_aside:
                    raise StepFailed(
                        f"{_explain_block(s)} appeared after the check",
                        "the old run is stopped and nothing was launched; inspect the file",
                    )
                moved = await self.request(
                    "move_aside",
                    {"path": path, "format": str(s.get("verdict"))},
                    timeout=self.hc.command_timeout,
                )
                self.side_records.append(
                    audit.record(
                        "move-aside",
                        host=plan.host,
                        run=plan.run.name,
                        ok=bool(moved.get("moved")),
                        detail=f"{path} -> {moved.get('to')}",
                        path=path,
                        to=moved.get("to"),
                        size=moved.get("size"),
                    )
                )
                notes.append(f"moved {path} -> {moved.get('to')}")
                continue
            if int(s.get("partial_tail_bytes") or 0) > 0 and s.get("state") == "ok":
                fixed = await self.request(
                    "repair_tail", {"path": path}, timeout=max(self.hc.command_timeout, 300.0)
                )
                self.side_records.append(
                    audit.record(
                        "repair",
                        host=plan.host,
                        run=plan.run.name,
                        ok=True,
                        detail=f"{path}: removed {fixed.get('removed_bytes')} bytes of a torn "
                        f"last line; backup {fixed.get('backup')}",
                        path=path,
                        backup=fixed.get("backup"),
                        sha256=fixed.get("sha256"),
                    )
                )
                if fixed.get("repaired"):
                    notes.append(
                        f"repaired {path}: torn last line of {fixed.get('removed_bytes')} bytes "
                        f"kept in {fixed.get('backup')}"
                    )
        step.data["actions"] = notes
        step.detail = "; ".join(notes) if notes else "every tail ends with a complete line"

    # ------------------------------------------------------------ 6. launch

    async def launch(self, step: Step) -> None:
        plan = self.plan
        params = {
            "workdir": plan.paths["workdir"],
            "argv": plan.argv,
            "env": plan.env,
            "secret_env": plan.secret_env,
            "log": plan.paths["log"],
            "lock_paths": plan.locks,
            "settle_s": plan.run.settle_seconds,
            "lock_wait_s": 3.0,
            "fingerprints": [
                {
                    "path": path,
                    "data": dict(
                        fingerprint_of(plan.run, plan.argv, self.engine.config), dataset=ds
                    ),
                    "hash_files": {ds: plan.prompt_files[ds]} if ds in plan.prompt_files else {},
                }
                for ds, path in plan.fingerprints.items()
            ],
        }
        started = time.time()
        timeout = plan.run.settle_seconds + 3.0 + self.hc.command_timeout
        try:
            reply = await self.request("launch", params, timeout=timeout)
        except OutcomeUnknown as e:
            # The reply was lost: never launch again blindly; the lock says what happened.
            reply = await self._reconcile_launch(started, str(e))
        step.data["launch"] = {k: v for k, v in reply.items() if k != "fingerprint"}
        if reply.get("started"):
            self.identity = reply["identity"]
            assert self.identity is not None
            step.detail = f"running as pid {self.identity['pid']} (log {reply.get('log')})"
            if reply.get("reconciled"):
                step.detail += f"; {reply['reconciled']}"
            return
        reason = reply.get("reason")
        if reason == "already-running":
            raise StepFailed(
                reply.get("detail") or "already running",
                "another runwatch (or a launch in progress) started it; refresh to see it",
            )
        tail = "\n    ".join(reply.get("log_tail") or []) or "(the log is empty)"
        raise StepFailed(
            f"{reply.get('detail') or reason}; last lines of {reply.get('log')}:\n    {tail}",
            "fix the cause shown in the log, then launch again",
        )

    async def _reconcile_launch(self, started: float, why: str) -> dict[str, Any]:
        await self.host.connect()
        st = await self.request("lock_status", {"lock_paths": self.plan.locks})
        holder = st.get("holder") or {}
        ident = holder.get("identity")
        fresh = float(holder.get("time", 0)) >= started
        if st.get("held") and st.get("holder_alive") and fresh and isinstance(ident, dict):
            # Ours (it took the lock after this launch began): confirm it stays alive for the
            # settle time, as the host would have before answering.
            deadline = time.monotonic() + self.plan.run.settle_seconds
            while time.monotonic() < deadline:
                probe = await self.request("probe", {"identity": ident})
                if not probe.get("alive"):
                    return {
                        "started": False,
                        "reason": "exited",
                        "detail": f"the reply was lost ({why}) and the run it started exited",
                        "log": holder.get("log") or self.plan.paths["log"],
                    }
                await asyncio.sleep(0.1)  # polling the host for a condition, bounded above
            return {
                "started": True,
                "identity": ident,
                "log": holder.get("log"),
                "reconciled": f"reply lost ({why}); confirmed from the run's lock on the host",
            }
        return {
            "started": False,
            "reason": "unknown",
            "detail": f"the connection dropped during the launch ({why}) and no run holds the "
            "lock now",
            "log": self.plan.paths["log"],
        }


def _blocks(scan: dict[str, Any]) -> bool:
    if scan.get("state") in ("unreadable", "not-a-file", "error"):
        return True
    return scan.get("verdict") in BLOCKING_VERDICTS


def _scan_summary(s: dict[str, Any]) -> dict[str, Any]:
    keys = ("path", "state", "verdict", "verdict_detail", "records", "partial_tail_bytes")
    return {k: s.get(k) for k in keys}


def _explain_block(s: dict[str, Any]) -> str:
    path = s.get("path")
    verdict = s.get("verdict") if s.get("state") == "ok" else s.get("state")
    off = s.get("first_offending")
    parts = [f"{path}: {verdict}"]
    if isinstance(off, dict):
        parts.append(
            f"line {off.get('line')} is {off.get('format') or 'an unknown format'} "
            f"(missing keys: {', '.join(off.get('missing') or []) or 'none'}; "
            f"extra keys: {', '.join(off.get('extra') or []) or 'none'})"
        )
    elif s.get("bad_lines"):
        bad = s["bad_lines"][0]
        parts.append(f"line {bad.get('line')}: {bad.get('reason')}")
    if s.get("verdict_detail") and not isinstance(off, dict):
        parts.append(str(s.get("verdict_detail")))
    elif s.get("error"):
        parts.append(str(s.get("error")))
    return " - ".join(parts)


def _refused(outcome: Any) -> str | None:
    for r in _results(outcome):
        if r.get("outcome") == "refused" and r.get("role", "run") == "run":
            return str(r.get("detail"))
    return None


def _results(outcome: Any) -> list[dict[str, Any]]:
    if isinstance(outcome, dict):
        res = outcome.get("results")
        if isinstance(res, list):
            return [r for r in res if isinstance(r, dict)]
    if isinstance(outcome, list):
        return [r for r in outcome if isinstance(r, dict)]
    return []


def _kill_summary(outcome: Any) -> str:
    rs = _results(outcome)
    if not rs:
        return "kill outcome unknown (connection dropped)"
    counts: dict[str, int] = {}
    for r in rs:
        counts[str(r.get("outcome"))] = counts.get(str(r.get("outcome")), 0) + 1
    return ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))


async def execute(
    engine: Engine, plan: Plan, *, dry_run: bool = False, on_step: OnStep | None = None
) -> ActionResult:
    """Run the plan's steps in order, stopping at the first failure; see the module docstring."""
    return await _Runner(engine, plan, dry_run, on_step).run()


async def launch(
    engine: Engine,
    run_name: str,
    overrides: Iterable[str] = (),
    dry_run: bool = False,
    on_step: OnStep | None = None,
    environ: dict[str, str] | None = None,
) -> ActionResult:
    """Check and launch a run that is not running (raises LaunchError when it is)."""
    plan = await make_plan(engine, run_name, action="launch", overrides=overrides, environ=environ)
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
) -> ActionResult:
    """Check, stop, repair and relaunch a run (launch it when it is not running)."""
    plan = await make_plan(
        engine,
        run_name,
        action="restart",
        overrides=overrides,
        move_aside=move_aside,
        allow_change=allow_change,
        environ=environ,
    )
    return await execute(engine, plan, dry_run=dry_run, on_step=on_step)


async def tail_log(engine: Engine, run_name: str, lines: int = 50) -> dict[str, Any]:
    """The last ``lines`` of a run's log on its host: ``{"path", "exists", "size", "lines"}``.

    Key-shaped tokens and the run's API key (when set here) are masked.
    """
    config = engine.config
    run = config.run(run_name)
    secrets = [os.environ[n] for n in _key_names(config, run) if os.environ.get(n)]
    path = run_paths(config, run)["log"]
    reply: dict[str, Any] = await engine.host(run.host).request(
        "tail_log", {"path": path, "lines": int(lines)}
    )
    reply["lines"] = [mask_text(str(line), secrets) for line in reply.get("lines") or []]
    return reply


def _key_names(config: Config, run: RunConfig) -> list[str]:
    if run.endpoint is None:
        return []
    name = config.endpoint(run.endpoint).api_key_env
    return [name] if name else []


# --------------------------------------------------------------------------- budget guard


@dataclass
class BudgetEvent:
    """A run without ``--token-budget`` whose dataset(s) passed their token budget."""

    policy: Literal["warn", "stop", "restart-with-budget"]
    host: str
    run: str
    identity: Identity
    datasets: list[str]
    budget: int
    """The budget to enforce (``--token-budget`` of a restart-with-budget): the smallest budget
    among the over-budget datasets, since the flag sets one budget for every dataset."""
    tokens: dict[str, int]
    """Completion tokens of each over-budget dataset."""
    waste_tokens: int
    message: str
    keys: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "host": self.host,
            "run": self.run,
            "pid": self.identity.pid,
            "datasets": self.datasets,
            "budget": self.budget,
            "tokens": self.tokens,
            "waste_tokens": self.waste_tokens,
            "message": self.message,
        }


@dataclass
class GuardOutcome:
    event: BudgetEvent
    acted: bool
    """False when another runwatch (or an earlier run of this one) already acted."""
    ok: bool
    detail: str
    result: ActionResult | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "event": self.event.to_json(),
            "acted": self.acted,
            "ok": self.ok,
            "detail": self.detail,
            "result": self.result.to_json() if self.result else None,
        }


class BudgetGuard:
    """Acts on budget events once each; see the module docstring."""

    def __init__(self, config: Config, marker_dir: Path | None = None) -> None:
        self.config = config
        self.marker_dir = marker_dir or (state_dir() / "guard")

    def _key(self, host: str, run: str, ident: Identity, dataset: str) -> str:
        raw = json.dumps([host, run, ident.boot_id, ident.pid, ident.start_time, dataset])
        return hashlib.sha256(raw.encode()).hexdigest()[:32]

    def _marked(self, key: str) -> bool:
        return (self.marker_dir / f"{key}.json").exists()

    def _claim(self, event: BudgetEvent) -> bool:
        """Atomically claim every key of the event; False when any was claimed before."""
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"time": time.time(), **event.to_json()}).encode()
        first = self.marker_dir / f"{event.keys[0]}.json"
        try:
            fd = os.open(first, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        for key in event.keys[1:]:
            try:
                fd = os.open(self.marker_dir / f"{key}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                continue
            try:
                os.write(fd, body)
            finally:
                os.close(fd)
        return True

    def observe(self, snapshot: Snapshot) -> list[BudgetEvent]:
        """Budget events in ``snapshot`` not acted on yet (pure: changes nothing)."""
        events: list[BudgetEvent] = []
        runs = {r.name: r for r in self.config.runs}
        for hv in snapshot.hosts:
            if not hv.connected or hv.stale:
                continue
            for rv in hv.runs:
                rc = runs.get(rv.name)
                proc = rv.process
                if rc is None or proc is None or rv.state != "running":
                    continue
                if proc.flags.token_budget is not None:
                    continue  # the run enforces its own budget
                over: dict[str, int] = {}
                budgets: dict[str, int] = {}
                waste = 0
                for dv in rv.datasets:
                    dc = self.config.datasets.get(dv.name)
                    budget = dv.token_budget or (dc.token_budget if dc else None)
                    if budget is None or dv.completion_tokens <= budget:
                        continue
                    key = self._key(hv.name, rv.name, proc.identity, dv.name)
                    if self._marked(key):
                        continue
                    over[dv.name] = dv.completion_tokens
                    budgets[dv.name] = budget
                    waste += max(dv.projection.waste_tokens, dv.completion_tokens - budget)
                if not over:
                    continue
                names = sorted(over)
                budget = min(budgets.values())
                parts = [f"{d} {over[d] / 1e6:.1f} M / {budgets[d] / 1e6:.1f} M" for d in names]
                events.append(
                    BudgetEvent(
                        policy=rc.budget_policy,
                        host=hv.name,
                        run=rv.name,
                        identity=proc.identity,
                        datasets=names,
                        budget=budget,
                        tokens=over,
                        waste_tokens=waste,
                        message=f"{rv.name}: past the token budget with no --token-budget: "
                        + ", ".join(parts),
                        keys=[self._key(hv.name, rv.name, proc.identity, d) for d in names],
                    )
                )
        return events

    async def act(
        self, engine: Engine, event: BudgetEvent, on_step: OnStep | None = None
    ) -> GuardOutcome:
        """Carry out the event's policy once (claimed atomically first) and audit it."""
        if not self._claim(event):
            return GuardOutcome(event, acted=False, ok=True, detail="already acted on")
        result: ActionResult | None = None
        if event.policy == "warn":
            ok, detail = True, event.message
        elif event.policy == "stop":
            try:
                grace = self.config.run(event.run).stop_grace_seconds
                res = await engine.kill(event.host, event.identity, grace)
                from supervisor.kill import audit_kill

                audit_kill(res, event.run)
                outcome = msgspec.to_builtins(res)
                refused = _refused(outcome)
                ok = refused is None
                detail = f"stopped pid {event.identity.pid}: {_kill_summary(outcome)}"
                if refused:
                    detail = f"kill refused: {refused}"
            except RunwatchError as e:
                ok, detail = False, f"stop failed: {e}"
        else:
            try:
                plan = await make_plan(
                    engine,
                    event.run,
                    action="restart",
                    overrides=[("--token-budget", str(event.budget))],
                )
                if plan.old is None or plan.old.identity != event.identity:
                    ok, detail = False, "the run changed since the event; not restarted"
                else:
                    plan.budget_reason = event.message
                    result = await execute(engine, plan, on_step=on_step)
                    ok = result.ok
                    failed = result.failed_step
                    detail = (
                        f"restarted with --token-budget {event.budget}: pid "
                        f"{(result.identity or {}).get('pid')}"
                        if ok
                        else f"restart with budget failed at {failed.name if failed else '?'}: "
                        f"{failed.detail if failed else ''}"
                    )
            except RunwatchError as e:
                ok, detail = False, f"restart with budget failed: {e}"
        audit.record(
            "budget",
            host=event.host,
            run=event.run,
            ok=ok,
            identity=msgspec.to_builtins(event.identity),
            policy=event.policy,
            datasets=event.datasets,
            budget=event.budget,
            tokens=event.tokens,
            waste_tokens=event.waste_tokens,
            detail=detail,
        )
        return GuardOutcome(event, acted=True, ok=ok, detail=detail, result=result)

    async def enforce(
        self, engine: Engine, snapshot: Snapshot, on_step: OnStep | None = None
    ) -> list[GuardOutcome]:
        """``observe`` then ``act`` on each event."""
        return [await self.act(engine, e, on_step) for e in self.observe(snapshot)]
