"""The step runner: runs a plan's steps in order, stopping at the first failure.

``on_step(step)`` is called (it may be a coroutine function) every time a step changes state:
``running`` when it starts, then ``ok``, ``failed`` or ``skipped`` with its ``detail`` - so a
front end can show each check's result live. The same ``Step`` object is passed each time;
copy what you keep (``step.to_json()``). ``result.ok`` is true only when the new run is confirmed
running (for a dry run: when every check passed). Steps after a failed one stay ``pending``.

Every executed (not dry-run) launch and restart is appended to the audit log with each step's
outcome; so are the move-asides and repairs it does, the rollbacks, and the budget guard's actions.

runwatch never leaves a run down by its own hand: when anything fails after the old process was
confirmed gone (and no other launcher took the run over), the previous command line is launched
again and confirmed; ``result.rollback`` says how that went. A rollback is a launch: it passes
the gate (``supervisor.gate``) like every start, and one that would overwrite the run's output is
refused (``refused``, with the command that resumes the run): the run stays stopped. A confirmed
launch stores the plan's launch spec (``supervisor.launchspec``) with its argv, so later launches
keep the overrides.
"""

from __future__ import annotations

import asyncio
import inspect
import posixpath
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from supervisor import (
    argcheck,
    audit,
    clients,
    display,
    flagcheck,
    gate,
    launchspec,
    quiet,
    snapshots,
)
from supervisor.agent import match, unit
from supervisor.agent.masking import mask_argv, mask_text
from supervisor.agent.proc import WRITING, holding_text
from supervisor.agent.protocol import AGENT_LOADER, MASK, FileSpec, LaunchParams
from supervisor.agentclient import AgentClient, as_data
from supervisor.config import command_prefix
from supervisor.errors import HostError, OutcomeUnknown, RunwatchError
from supervisor.events import stop_key
from supervisor.fingerprint import (
    compare_fingerprints,
    fingerprint_of,
    grouped_changes,
    other_config,
    stop_command,
    written_by,
)
from supervisor.kill import identity_params
from supervisor.layout import RunLayout, layout_of
from supervisor.model import Identity
from supervisor.plan import ActionResult, OnStep, Plan, Step, StepFailed, StepState
from supervisor.replies import (
    LockHolder,
    ScriptFlags,
    ScriptInstalled,
    SnapshotTake,
    UnitOnFiles,
)

if TYPE_CHECKING:
    from supervisor.config import Config
    from supervisor.hosts import Host
    from supervisor.kill import KillReport


class PlanEngine(Protocol):
    """What a plan's steps use of the engine, and nothing more (``Engine`` has it): the
    config, the stops under way, the hosts, the format check, the data-loss alarm, the kill
    inside a plan (under the run's lock the plan holds) and the run's record history."""

    @property
    def config(self) -> Config: ...

    @property
    def stopping(self) -> set[str]:
        """``events.stop_key`` of each process a plan is stopping (a watcher's expected stops)."""
        ...

    def host(self, name: str) -> Host: ...

    async def check_run(
        self, run_name: str, argv: list[str] | None = None, *, tokens: bool = False
    ) -> list[dict[str, Any]]: ...

    def data_loss(
        self, host: str, run: str, path: str, bytes_before: int, bytes_after: int
    ) -> str: ...

    async def kill_within_plan(self, host: str, identity: Identity, grace: float) -> KillReport: ...

    def record_points(self, host: str, run: str) -> list[tuple[float, ...]]: ...


DEFAULT_GPU_WAIT_S = 120.0
DEFAULT_LOCK_WAIT_S = 30.0


class _Runner:
    def __init__(
        self, engine: PlanEngine, plan: Plan, dry_run: bool, on_step: OnStep | None
    ) -> None:
        self.engine = engine
        self.plan = plan
        self.dry_run = dry_run
        self.on_step = on_step
        self.host: Any = engine.host(plan.host)
        self.agent = AgentClient(self.host)
        self.hc = engine.config.host(plan.host)
        self.blocking: list[dict[str, Any]] = []
        self.identity: dict[str, Any] | None = None
        self.side_records: list[dict[str, Any]] = []
        """Audit records of the move-asides and repairs done by this plan."""
        self.stopped = False
        """The old process is confirmed gone: from here a failure must roll back."""
        self.taken_over = False
        """Another launcher holds the run's lock: the run is not down, nothing to roll back."""
        self.keep_stopped = False
        """Another writer appends to the data after the stop: a rollback would write beside it."""
        self.nothing_to_do = False
        self.rollback_outcome: dict[str, Any] | None = None
        self.sizes: dict[str, int] = {}
        """Data file -> its size before the launch (a smaller one after it is data loss)."""
        self.budget_notes: list[str] = []
        """Datasets whose budget the format check could not check (no tokenizer)."""
        self.records_at_start: dict[str, int] = {}
        """Data file -> its records before the launch."""
        self.installed: frozenset[str] | None = None
        """Option strings of the installed script (its parser read exactly by the preflight)."""
        self.snapshot: dict[str, Any] | None = None
        """The snapshot taken before the launch (for the plan's audit record)."""
        self.snapshot_note = ""
        """How the data files will be kept before the start (the format check's dry check)."""
        self.host_script: ScriptFlags | None = None
        """With ``--script``: the host's script as the preflight read it (its path and hash)."""
        self.script_installed: ScriptInstalled | None = None
        """With ``--script``: the copy done (a rollback puts the old script back)."""
        self.script_sha256: str | None = None
        """sha256 of the run's script as last read on the host (None: not read yet)."""

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

    async def run(self) -> ActionResult:
        plan = self.plan
        steps = {s.name: s for s in plan.steps}
        fns: dict[str, Callable[[Step], Awaitable[None]]] = {
            "preflight": self.preflight,
            "format-check": self.format_check,
            "fingerprint": self.fingerprint,
            "writers": self.writers,
            "quiet": self.observe,
            "stop": self.stop,
            "gpu-release": self.gpu_release,
            "data-repair": self.data_repair,
            "script": self.install_script,
            "launch": self.launch,
        }
        if self.hc.kind == "slurm":
            from supervisor import slurm

            fns.update(slurm.plan_steps(self))
        ok = True
        for s in plan.steps:
            if not ok:
                break
            acting = s.name in ("stop", "gpu-release", "data-repair", "script", "launch")
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
        confirmed = ok and (self.dry_run or self.identity is not None or self.nothing_to_do)
        down = self.stopped and not self.taken_over and not self.keep_stopped
        if not ok and not self.dry_run and down:
            self.rollback_outcome = await self.roll_back()
        elif not ok and not self.dry_run and self.script_installed is not None:
            # Nothing to relaunch (a launch, or a run another launcher took over): the host's
            # script is still put back as it was before this plan.
            not_back = await self.put_script_back()
            failed = next((s for s in plan.steps if s.state == "failed"), None)
            if not_back is not None and failed is not None:
                failed.detail += f"; {not_back}"
        if confirmed and not self.dry_run:
            spec = plan.spec
            spec.last_argv = mask_argv(plan.argv, plan.secrets)
            spec.script_sha256 = self.script_sha256 or None
            if self.identity is not None and "pid" in self.identity:
                spec.started = launchspec.Invocation(
                    pid=int(self.identity["pid"]),
                    start_time=int(self.identity.get("start_time") or 0),
                    records=dict(self.records_at_start),
                )
            launchspec.save(self.engine.config.key, spec)
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
            last_launch_diff=plan.last_launch_diff(),
            dry_run=self.dry_run,
            nothing_to_do=self.nothing_to_do,
            rollback=self.rollback_outcome,
        )
        if not self.dry_run:
            audit.record(
                plan.action,
                config=self.engine.config.key,
                host=plan.host,
                run=plan.run.name,
                ok=confirmed,
                identity=self.identity,
                argv=plan.argv,
                steps=[s.to_json() for s in result.steps],
                secrets=plan.secrets,
                old_identity=result.old_identity,
                argv_diff=result.argv_diff,
                last_launch_diff=result.last_launch_diff,
                reason=plan.budget_reason,
                nothing_to_do=self.nothing_to_do or None,
                rollback=self.rollback_outcome,
                snapshot=self.snapshot,
            )
        if plan.old is not None:
            self.engine.stopping.discard(stop_key(plan.host, plan.run.name, plan.old.identity.pid))
        return result

    def would(self, name: str) -> str:
        p = self.plan
        if self.hc.kind == "slurm":
            from supervisor import slurm

            text = slurm.would(p, name)
            if text is not None:
                return text
        if name == "stop":
            if p.old is None:
                return "nothing running to stop"
            return f"would stop pid {p.old.identity.pid} by identity and confirm its exit"
        if name == "gpu-release":
            return "would wait for the GPU memory of the stopped run to be released"
        if name == "script" and p.script is not None:
            where = self.host_script.path if self.host_script is not None else "the run's script"
            return (
                f"would copy {p.script.path} (sha256 {p.script.short}) over {where} on "
                f"{p.host}, keeping the old one beside it, and check the flags it declares"
            )
        if name == "data-repair":
            moves = [b["path"] for b in self.blocking]
            text = "would repair a torn last line if one is left"
            if moves:
                text = f"would move aside {', '.join(moves)}; " + text
            return text
        return "would launch " + display.command_line(mask_argv(p.argv, p.secrets))

    # ------------------------------------------------------------ 0. preflight

    async def preflight(self, step: Step) -> None:
        plan = self.plan
        if plan.script is not None:
            await self.read_host_script(step)
        flags = plan.spec.flags()
        if not flags:
            how = await self.read_args(step)
            await self.set(
                step, "skipped", f"no flag set or removed: the config's command line (read {how})"
            )
            return
        layout = plan.layout
        types: dict[str, clients.ValueType] = {}
        type_source = ""
        if layout.profiled and layout.profile.value_types:
            types = dict(layout.profile.value_types)
            name = layout.profile.name
            type_source = (
                f"value_types of the client profile {name!r} in {self.engine.config.path}"
                if name in self.engine.config.clients
                else f"value_types of the built-in client profile {name!r}"
            )
        profile = flagcheck.ProfileFlags(
            name=layout.client.name,
            known=layout.client.known_flags,
            switches=layout.client.switches,
            types=types,
            ranges=dict(layout.profile.value_ranges) if layout.profiled else {},
            type_source=type_source,
        )
        # Always read: the installed script (or the one given with --script) says which flags
        # exist, the profile only fills in when it cannot be read.
        read = await self._script_flags(step)
        given = {f for f, _ in plan.overrides}
        out = flagcheck.check(
            flags, plan.spec.sets, lambda f: f not in given, profile, read, self._shown
        )
        flagcheck.hidden_abbreviations(out, plan.argv, flags, profile, read)
        forcible = out.unconfirmed + out.unsure
        if out.problems or (forcible and not plan.force):
            path = read.reply.path if read.reply is not None else plan.argv[0]
            newer = (
                "; " + flagcheck.newer_script(read.script, path, plan.host, out.missing)
                if out.missing and plan.script is None
                else ""
            )
            if out.missing and plan.script is not None:
                newer = (
                    f"; the script given with --script ({plan.script.path}) does not declare "
                    f"{', '.join(out.missing)}: give a version that does"
                )
            raise StepFailed(
                "the new command line would not start: " + "; ".join(out.problems + forcible),
                "nothing was stopped or launched; fix the --set / --unset flags"
                + newer
                + ("; `runwatch clients` shows each flag's type" if out.profile_types else "")
                + (
                    "; if the client does take them, pass --force to launch anyway"
                    if forcible
                    else ""
                ),
            )
        step.detail = f"{len(out.confirmed)} flag(s) accepted by the client"
        if out.sources:
            step.detail += f" ({' and '.join(out.sources)})"
        if out.confirmed:
            step.detail += ": " + ", ".join(out.confirmed)
        if out.typed:
            step.detail += f"; {out.typed} value(s) of the expected type"
        if forcible:
            step.detail += "; NOT checked (--force): " + "; ".join(forcible)
        step.detail += f"; the command line read {await self.read_args(step)}"

    async def read_args(self, step: Step) -> str:
        """The client's own reading of the new command line (``argcheck``), before anything
        stops: a refusal fails the step; else how it was read. With ``--script`` the reading
        is the new script's parser, read on this machine."""
        plan = self.plan
        idx = plan.layout.script_index
        if plan.script is not None and self.host_script is not None and idx is not None:
            reply = plan.script.resolve(
                self.host_script.path, plan.layout.workdir, list(plan.layout.argv[idx + 1 :])
            )
            reading = argcheck.check(plan.layout, reply)
            reading.how += "; the script given with --script, read on this machine"
        else:
            reading = await self.start_gate().read_args(plan.layout)
        step.data["argument_reading"] = reading.how
        if not reading.ok:
            raise StepFailed(
                "the client would not read the new command line as runwatch does: "
                + "; ".join(reading.problems),
                "nothing was stopped or launched; " + "; ".join(reading.hints),
            )
        self.installed = reading.installed
        return reading.how

    def _shown(self, flag: str, value: str) -> str:
        """``value`` quoted for a message, or a placeholder when it is (or holds) a secret: the
        value of a secret-named flag, a key-shaped value, a known key."""
        arg = f"{flag}={value}"
        if mask_argv([arg], self.plan.secrets) != [arg] or mask_text(arg, self.plan.secrets) != arg:
            return "the value given (not shown: it is a secret)"
        return repr(value)

    async def read_host_script(self, step: Step) -> None:
        """With ``--script``: the host's script as it is now (its path and sha256, compared again
        when it is replaced); refused when there is none to replace, or when it could not be
        replaced (its directory read-only, or not this user's to write) once the run is
        stopped."""
        plan = self.plan
        assert plan.script is not None
        idx = plan.layout.script_index
        if idx is None:
            raise StepFailed(
                "--script: the command line names no configured script to replace",
                "nothing was stopped or launched; run the command without --script",
            )
        reply = await self.agent.script_flags(
            workdir=plan.paths["workdir"],
            argv=plan.argv[: idx + 1],
            search_path=plan.env.get("PATH"),
        )
        if not reply.readable or not reply.sha256:
            raise StepFailed(
                f"--script: the run's script on {plan.host} cannot be read: {reply.reason}",
                f"nothing was stopped or launched; copy the script to {reply.path} on "
                f"{plan.host} yourself, then run the same command without --script",
            )
        try:  # what the copy after the stop would meet there, met now
            await self.agent.script_install(
                path=reply.path,
                expect_sha256=reply.sha256,
                check=True,
                timeout=self.hc.command_timeout,
            )
        except RunwatchError as e:
            raise StepFailed(
                f"--script: the run's script on {plan.host} could not be replaced: {e}",
                f"nothing was stopped or launched; copy {plan.script.path} to {reply.path} on "
                f"{plan.host} yourself (or make its directory writable), then run the same "
                "command without --script",
            ) from None
        self.host_script = reply
        self.script_sha256 = reply.sha256
        step.data["host_script"] = {"path": reply.path, "sha256": reply.sha256}

    async def _script_flags(self, step: Step) -> flagcheck.ScriptRead:
        """The options the client's source declares, read statically on the host (the script is
        read, never run), or why they cannot be; with ``--script`` those of the new script,
        read on this machine."""
        plan = self.plan
        idx = plan.layout.script_index
        if plan.script is not None and self.host_script is not None and idx is not None:
            new = plan.script.flags(self.host_script.path)
            step.data["script_flags"] = {
                "path": plan.script.path,
                "found": new.found,
                "reason": new.reason,
                "options": len(new.options),
            }
            return flagcheck.ScriptRead(
                script=posixpath.basename(plan.argv[idx]),
                host="this machine (--script)",
                reply=new,
                reason=new.reason,
                which="the new",
            )
        if idx is None:
            return flagcheck.ScriptRead(
                script="the client",
                host=plan.host,
                reply=None,
                reason="the script of the command line is not one of the configured scripts",
            )
        reply = await self.agent.script_flags(
            workdir=plan.paths["workdir"],
            argv=plan.argv[: idx + 1],
            search_path=plan.env.get("PATH"),
        )
        step.data["script_flags"] = {
            "path": reply.path,
            "found": reply.found,
            "reason": reply.reason,
            "options": len(reply.options),
        }
        self.script_sha256 = reply.sha256
        return flagcheck.ScriptRead(
            script=posixpath.basename(plan.argv[idx]),
            host=plan.host,
            reply=reply,
            reason=reply.reason,
        )

    # ------------------------------------------------------------ 1. format check

    async def scan_all(self) -> list[dict[str, Any]]:
        # The files the NEW command line writes (datasets, output dir from the effective argv).
        run, argv = self.plan.run.name, self.plan.argv
        if self.budget_to_check():
            return list(await self.engine.check_run(run, argv, tokens=True))
        return list(await self.engine.check_run(run, argv))

    def budget_to_check(self) -> bool:
        """Whether the new argv writes a dataset with a configured budget and no budget flag
        (its tokens are then counted, as the dashboard counts them)."""
        plan = self.plan
        if plan.layout.has_budget_flag():
            return False
        datasets = self.engine.config.datasets
        return any(
            (dc := datasets.get(ds)) is not None and dc.token_budget is not None
            for ds in plan.layout.data_files
        )

    def over_budget(self, scans: list[dict[str, Any]]) -> list[str]:
        """Datasets already past their budget that the new argv would write without a budget
        flag (``dataset: tokens / budget``)."""
        plan = self.plan
        if plan.layout.has_budget_flag():
            return []
        by_path = {p: ds for ds, p in plan.layout.data_files.items()}
        over = []
        for scan in scans:
            ds = by_path.get(str(scan.get("path")))
            dc = self.engine.config.datasets.get(ds) if ds else None
            if dc is None or dc.token_budget is None:
                continue
            if scan.get("tokens_error"):
                self.budget_notes.append(f"{ds}: budget not checked: {scan['tokens_error']}")
                continue
            tokens = int(scan.get("tokens_counted", scan.get("completion_tokens")) or 0)
            if tokens >= dc.token_budget:
                over.append(f"{ds}: {tokens} completion tokens, budget {dc.token_budget}")
        return over

    async def format_check(self, step: Step) -> None:
        scans = await self.scan_all()
        step.data["files"] = [_scan_summary(s) for s in scans]
        if not scans:
            raise StepFailed(
                f"no data file to check for {self.plan.run.name}",
                "declare the run's datasets (`datasets = [...]` or --datasets in its argv)",
            )
        self.keep_output(scans, step)
        await self.snapshot_possible(step)
        over = self.over_budget(scans)
        if over:
            flag = self.plan.layout.client.budget_flag
            if not self.plan.force:
                raise StepFailed(
                    "already over budget, and the new command line has no budget flag: "
                    + "; ".join(over),
                    (
                        f"add one (--set {flag.lstrip('-')}=N) or pass --force to launch anyway"
                        if flag
                        else "the client has no budget flag; pass --force to launch anyway"
                    ),
                )
            step.data["over_budget"] = over
        self.blocking = [s for s in scans if gate.blocks(s)]
        if not self.blocking:
            counts: dict[str, int] = {}
            for s in scans:
                v = str(s.get("verdict") or s.get("state"))
                counts[v] = counts.get(v, 0) + 1
            step.detail = f"{len(scans)} file(s): " + ", ".join(
                f"{n} {v}" for v, n in sorted(counts.items())
            )
            if self.budget_notes:
                step.detail += "; " + "; ".join(self.budget_notes)
                step.data["budget_not_checked"] = list(self.budget_notes)
            step.detail += "; " + self.snapshot_note
            return
        problems = "; ".join(gate.explain_block(s) for s in self.blocking)
        if self.plan.move_aside:
            step.detail = f"will move aside once no writer is alive: {problems}"
            return
        raise StepFailed(
            f"{self.plan.action} blocked by data not in format {self.plan.run.format!r}: "
            f"{problems}",
            (
                gate.blocked_hint(self.plan.layout)
                if gate.resumes_from_output(self.plan.layout)
                else "convert or remove those files, or pass --move-aside to rename them to "
                "<file>.<format>-<timestamp> (nothing is deleted) so the run starts them afresh"
            ),
        )

    def keep_output(self, scans: list[dict[str, Any]], step: Step) -> None:
        """No launch loses a byte of existing output (``gate.output_rule``), checked before
        anything stops; the launch step checks again once no writer is alive."""
        verdict = gate.output_rule(
            self.engine.config, self.plan.layout, scans, self.plan.force, self.installed
        )
        if verdict.overwrite:
            step.data["resume_command"] = self.resume_command(gate.resume_argv(self.plan.layout))
        if not verdict.ok:
            raise verdict.failure()

    def start_gate(self) -> gate.Gate:
        return gate.Gate(
            self.agent,
            self.engine.config,
            self.plan.host,
            self.hc.command_timeout,
            search_path=self.plan.env.get("PATH"),
        )

    def resume_command(self, argv: list[str]) -> str:
        """The command that starts the run on ``argv`` (see ``gate.resume_command``)."""
        return gate.resume_command(self.engine.config, self.plan.run, argv, self.plan.secrets)

    async def snapshot_possible(self, step: Step) -> None:
        """Before anything stops: can every data file of the new argv be kept by a snapshot
        (``supervisor.snapshots``)? Refused when one cannot, unless forced (then named)."""
        if self.hc.kind == "slurm":
            self.snapshot_note = "snapshot: not taken for a Slurm job"
            return
        found = await snapshots.check(self.agent, self.engine.config, self.plan.layout)
        step.data["snapshot"] = msgspec.to_builtins(found)
        self.snapshot_note = snapshots.summary(found)
        if found.unprotected and not self.plan.force:
            raise snapshots.refusal(found.unprotected, self.engine.config)
        if found.unprotected:
            self.snapshot_note += " (--force): UNPROTECTED " + "; ".join(found.unprotected)

    async def take_snapshot(self, layout: RunLayout, reason: str) -> SnapshotTake | None:
        """The snapshot of ``layout``'s files right before its launch request (None for a Slurm
        job); the start's own audit record holds it (its launch step's data, the rollback's
        ``snapshot``). A file that cannot be kept refuses the start unless forced."""
        if self.hc.kind == "slurm":
            return None
        snap = await snapshots.take(self.agent, self.engine.config, layout, reason)
        if snap.unprotected and not self.plan.force:
            raise StepFailed(
                "no snapshot could be made of the data before the start (it changed since the "
                "check): " + "; ".join(snap.unprotected),
                "nothing was launched; raise backup_max_bytes, or pass --force to start with "
                "those files unprotected",
            )
        return snap

    async def guard_snapshot(
        self, layout: RunLayout, snap: SnapshotTake | None, identity: Mapping[str, Any]
    ) -> str | None:
        """After a start: when a kept file shrank or was replaced, stop the new client (by its
        unit), put the snapshot back (its file kept as ``<file>.after-<stamp>``), audit and
        alert; the failure's text (None when nothing was lost)."""
        if snap is None:
            return None
        hurt = await snapshots.damaged(self.agent, layout, snap)
        if not hurt:
            return None
        plan = self.plan
        ident = msgspec.convert(dict(identity), Identity, strict=False)
        key = stop_key(plan.host, plan.run.name, ident.pid)
        self.engine.stopping.add(key)
        try:
            await self.engine.kill_within_plan(plan.host, ident, plan.run.stop_grace_seconds)
            alive = (await self._probe(ident)).get("alive")
        finally:
            self.engine.stopping.discard(key)
        if alive:
            self.keep_stopped = True
            raise StepFailed(
                f"{hurt[0].path}: {hurt[0].why} after the start, and the client (pid {ident.pid}) "
                f"is still alive after its stop: snapshot {snap.id} was NOT put back",
                f"stop it (`runwatch kill {plan.run.name}`), then `runwatch restore "
                f"{plan.run.name} --snapshot {snap.id}`",
            )
        alarms = [
            self.engine.data_loss(plan.host, plan.run.name, d.path, d.bytes_before, d.bytes_now)
            for d in hurt
        ]
        what = "; ".join(f"{d.path}: {d.why}" for d in hurt)
        try:
            back = await snapshots.put_back(self.agent, layout, snap)
        except RunwatchError as e:
            detail = (
                f"{what}: {'; '.join(alarms)}; the client (pid {ident.pid}) was stopped, but the "
                "snapshot "
                f"{snap.id} could not be put back: {e}; the run is left stopped (`runwatch "
                f"restore {plan.run.name} --snapshot {snap.id}` once no writer is alive)"
            )
            ok = False
            self.keep_stopped = True  # a rollback would start over data that is not as it was
        else:
            detail = (
                f"{what}: {'; '.join(alarms)}; the client (pid {ident.pid}) was stopped and "
                "snapshot "
                f"{snap.id} put back: "
                + "; ".join(
                    f"{r.path} restored ({r.bytes} bytes), the client's file kept as {r.aside}"
                    for r in back.restored
                )
            )
            ok = True
        self.side_records.append(
            audit.record(
                "snapshot-restore",
                config=self.engine.config.key,
                host=plan.host,
                run=plan.run.name,
                ok=ok,
                snapshot=snap.id,
                dir=snap.dir,
                damaged=[msgspec.to_builtins(d) for d in hurt],
                identity=dict(identity),
                detail=detail,
            )
        )
        return detail

    async def data_sizes(self) -> dict[str, int]:
        """Complete bytes of each data file of the new argv (0: missing), as the host sees it
        now."""
        paths = list(self.plan.layout.data_files.values())
        files: list[FileSpec] = [{"path": p, "validate": "none", "texts": False} for p in paths]
        reply = await self.agent.scan(
            files=files, fresh=True, timeout=max(self.hc.command_timeout, 300)
        )
        scanned = reply.get("files") or {}
        return {p: gate.complete_size(scanned.get(p) or {}) for p in paths}

    async def check_no_loss(self, step: Step) -> None:
        """After the launch: a data file smaller than just before it is data loss (a failure)."""
        if not any(self.sizes.values()):
            return
        now = await self.data_sizes()
        lost = [(p, b, now.get(p, 0)) for p, b in self.sizes.items() if now.get(p, 0) < b]
        if not lost:
            return
        text = "; ".join(
            self.engine.data_loss(self.plan.host, self.plan.run.name, p, b, a) for p, b, a in lost
        )
        raise StepFailed(
            text,
            "the client overwrote its output: its profile's resume rule is wrong "
            "(resume = 'flag' and its resume flag), or another writer truncated the file",
        )

    # ------------------------------------------------------------ 2. fingerprint

    async def writers(self, step: Step) -> None:
        """One writer per data file: refuse, before anything stops, while a process that is not
        the run (another user's, an unrecognised command line, a second copy) holds one of the
        new launch's data files open for writing or holds one of its locks. On a Slurm host the
        same check runs on the login node (where the agent runs), after the user's jobs in the
        run's workdir (``slurm.workdir_jobs``); the processes of the run's own job (a node that
        is both) are the run's."""
        plan = self.plan
        slurm_host = self.hc.kind == "slurm"
        if slurm_host:
            from supervisor import slurm

            await slurm.workdir_jobs(self)
        found = await self.agent.file_holders(
            paths=list(plan.layout.data_files.values()),
            locks=list(plan.layout.locks),
            workdir=plan.layout.workdir,
        )
        ours = {plan.old.identity.pid, *plan.old.children} if plan.old is not None else set()
        # A unit of any run started on these files writes them whatever its members hold open
        # (a run renamed in the config, a second config naming the same files).
        units = [u for u in found.units if not ours & {u.main_pid, *u.members}]
        config = self.engine.config
        same = [u for u in units if u.config_id == config.key and u.run == plan.run.name]
        if same:  # started since this plan looked (another runwatch's launch of this run)
            pids = ", ".join(str(p) for p in same[0].members) or "none listed"
            raise StepFailed(
                f"already running: unit {same[0].launch_id} of this run still has processes "
                f"({pids}); nothing was stopped",
                "another runwatch started it meanwhile; refresh to see the process that runs now",
            )
        if units:
            who = unit.writers_text([msgspec.to_builtins(u) for u in units])
            stop = "; ".join(f"`{self._stop_unit(u)}`" for u in units)
            raise StepFailed(
                f"one writer per data file: {who}; nothing was stopped",
                f"stop it first ({stop}), or launch under its run's name to restart it",
            )
        own_job = plan.job.job_id if plan.job is not None else None
        others = [
            h
            for h in found.holders
            if h.pid not in ours and not (own_job and h.slurm_job == own_job)
        ]
        step.data["holders"] = [msgspec.to_builtins(h) for h in found.holders]
        blind = "; ".join(
            f"could not inspect the processes of {u.user} ({len(u.pids)})"
            for u in found.uninspected
        )
        launching = [h for h in others if h.argv[1:] == ["-c", AGENT_LOADER]]
        if launching:
            raise StepFailed(
                f"already running: a launch in progress (pid {launching[0].pid}, another "
                "runwatch's agent) holds the run's lock; nothing was stopped",
                "another runwatch is launching this run; refresh to see the process that runs now",
            )
        if others:
            who = "; ".join(
                f"pid {h.pid} ({h.user}, {' '.join(h.argv)[:100]}) {holding_text(h.how)}"
                for h in others
            )
            writing = [h for h in others if WRITING.intersection(h.how)]
            stop = "; ".join(
                f"`{slurm.login_kill(self.hc, h.pid)}` on the login node"
                if slurm_host
                else f"`{command_prefix(self.engine.config)} kill {shlex.quote(plan.run.name)} "
                f"--pid {h.pid}`"
                for h in writing
            )
            raise StepFailed(
                f"one writer per data file: {who}; nothing was stopped",
                f"stop it first ({stop}: it holds the run's data file, so it is the run's writer) "
                "or wait until it closes the file"
                if writing
                else "stop that process first (`runwatch ps`) or wait until it closes the lock",
            )
        held = "none"
        if found.holders and plan.old is not None:
            held = f"only the run itself (pid {plan.old.identity.pid})"
        elif found.holders and own_job:
            held = f"only the run's own job {own_job}"
        step.detail = f"writers of the data files: {held}" + (f"; {blind}" if blind else "")

    async def host_script_sha(self, fresh: bool = False) -> str:
        """sha256 of the run's script as read on the host ("" when it cannot be read or the
        command line names no configured script); read again with ``fresh``."""
        plan = self.plan
        idx = plan.layout.script_index
        if idx is None:
            return ""
        if self.script_sha256 is None or fresh:
            reply = await self.agent.script_flags(
                workdir=plan.paths["workdir"],
                argv=plan.argv[: idx + 1],
                search_path=plan.env.get("PATH"),
            )
            self.script_sha256 = reply.sha256
        return self.script_sha256

    def _stop_unit(self, u: UnitOnFiles) -> str:
        """The command that stops unit ``u``: by its run's name in the config that launched it
        when that config still has the run, else by its main pid."""
        config = self.engine.config
        if u.config_id == config.key and u.run in {r.name for r in config.runs}:
            return f"{command_prefix(config)} kill {shlex.quote(u.run)}"
        if u.config_id != config.key and u.config_path:
            return f"runwatch -c {shlex.quote(u.config_path)} kill {shlex.quote(u.run)}"
        host = f" --host {shlex.quote(self.plan.host)}" if len(config.hosts) > 1 else ""
        return f"{command_prefix(config)} kill --pid {u.main_pid}{host}"

    async def observe(self, step: Step) -> None:
        await quiet.check(self, step)

    async def fingerprint(self, step: Step) -> None:
        plan = self.plan
        config = self.engine.config
        new = fingerprint_of(plan.run, plan.argv, config)
        # The script the launch will run: the one given with --script, else the host's.
        script = plan.script.sha256 if plan.script is not None else await self.host_script_sha()
        if script:
            new["script_sha256"] = script
        reply = await self.agent.read_fingerprint(
            paths=plan.fingerprints, workdir=plan.paths["workdir"], hash_files=plan.prompt_files
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
        others: dict[str, list[str]] = {}
        for ds in plan.fingerprints:
            entry = stored_all.get(ds) or {}
            stored = entry.get("fingerprint")
            source = "the last launch"
            other = other_config(stored, config)
            if other is not None:
                live = [int(p) for p in entry.get("live_pids") or []]
                if live:
                    raise StepFailed(
                        f"{ds} is being written by {other} (pids "
                        f"{', '.join(map(str, live))}, recorded in {entry.get('path')}); "
                        "nothing was stopped",
                        f"stop it with its own config ({stop_command(stored or {})}), or give "
                        f"{plan.run.name} an output dir of its own",
                    )
                # Its writer is gone: the record still says how the data in the dataset was
                # made, so it is compared like this config's own (never an owner that blocks).
                source = f"the last launch, by {other} (its processes are gone)"
                others.setdefault(other, []).append(ds)
            if stored is None and from_process is not None:
                stored, source = from_process, process_source
            if stored is None:
                continue
            sources.add(source)
            b, a = compare_fingerprints(
                stored,
                new,
                {ds: hashes[ds]} if ds in hashes else {},
                plan.allow_change,
                config.aliases,
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
                f"the new launch differs from {where}: " + grouped_changes(blocking),
                "data generated with different settings would be mixed in one dataset; "
                "pass --allow-change KEY (model, sampling, temperature..., prompts, format) "
                "if that is intended"
                + (
                    "; if both names are one model, list them in one group of the config's "
                    'aliases (aliases = [["NAME", "OTHER NAME"]])'
                    if any(t.startswith("model ") for t in blocking)
                    else ""
                )
                + (
                    f", or give {plan.run.name} an output dir of its own (the data there is "
                    + "; ".join(f"{o}'s: {', '.join(d)}" for o, d in others.items())
                    + ")"
                    if others
                    else ""
                ),
            )
        step.detail = f"same model, sampling and prompts as {where}" + (
            f" (allowed changes: {grouped_changes(allowed)})" if allowed else ""
        )

    # ------------------------------------------------------------ 3. stop

    async def stop(self, step: Step) -> None:
        plan = self.plan
        if plan.old is None:
            await self.set(step, "skipped", "not running; nothing to stop")
            return
        ident = plan.old.identity
        self.engine.stopping.add(stop_key(plan.host, plan.run.name, ident.pid))
        try:
            res = await self.engine.kill_within_plan(plan.host, ident, plan.run.stop_grace_seconds)
        except OutcomeUnknown as e:
            step.data["kill"] = {"unknown": str(e)}
            res = None  # reconciled below: the probe tells whether it is gone
        outcome = msgspec.to_builtins(res) if res is not None else None
        step.data["kill"] = outcome
        refused = kill_refused(outcome)
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
        self.stopped = True
        lock = await self._wait_lock_free()
        step.detail = f"pid {ident.pid}: {kill_summary(outcome)}; exit confirmed" + (
            f"; {lock}" if lock else ""
        )

    async def _probe(self, ident: Identity) -> Mapping[str, Any]:
        for attempt in range(3):
            try:
                return await self.agent.probe(identity=identity_params(ident))
            except HostError:
                if attempt == 2:
                    raise
                await self.host.connect()
        return {}

    async def _wait_lock_free(self) -> str:
        deadline = time.monotonic() + DEFAULT_LOCK_WAIT_S
        while True:
            st = await self.agent.lock_status(lock_paths=self.plan.locks)
            path = st.lock_path
            if not st.held:
                return ""
            holder = st.holder or LockHolder()
            hid = holder.identity
            old = self.plan.old.identity if self.plan.old else None
            other = hid is not None and (
                old is None or (hid.pid, hid.start_time) != (old.pid, old.start_time)
            )
            if holder.state == "launching" or (other and st.holder_alive):
                self.taken_over = True
                who = holder.who(self.engine.config.key)
                raise StepFailed(
                    f"already running: {who} holds the run's lock {path} (started by another "
                    "runwatch or launch)",
                    "nothing was launched; refresh to see the process that runs now",
                )
            if time.monotonic() > deadline:
                raise StepFailed(
                    f"the run's lock {path} is still held by {msgspec.to_builtins(st.holder)}",
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
            reply = await self.agent.gpu_holders(pids=pids)
            checks += 1
            if not reply.available:
                step.detail = "nvidia-smi gave no answer; not waiting"
                return
            holders = reply.holders
            step.data["holders"] = holders
            if not holders:
                step.detail = "no process of the run holds GPU memory" + (
                    f" (released after {display.latency((time.monotonic() - began) * 1000)}, "
                    f"{checks} checks)"
                    if checks > 1
                    else ""
                )
                return
            if time.monotonic() > deadline:
                raise StepFailed(
                    f"GPU memory still held after {display.duration(DEFAULT_GPU_WAIT_S)} by pid "
                    + ", ".join(f"{p} ({display.mebibytes(mb)})" for p, mb in holders.items()),
                    "the old run is stopped; check nvidia-smi on the host, then launch",
                )
            await asyncio.sleep(0.5)  # polling nvidia-smi for a condition, bounded above

    # ------------------------------------------------------------ 5. data repair

    async def data_repair(self, step: Step) -> None:
        plan = self.plan
        # Touch data only when no run holds the lock (another runwatch may have launched it).
        st = await self.agent.lock_status(lock_paths=plan.locks)
        if st.held:
            self.taken_over = True
            who = (st.holder or LockHolder()).who(self.engine.config.key)
            raise StepFailed(
                f"already running: {who} holds the lock {st.lock_path}",
                "nothing was changed or launched; refresh to see the process that runs now",
            )
        scans = await self.scan_all()
        notes: list[str] = []
        for s in scans:
            path = str(s.get("path"))
            if gate.blocks(s):
                if not plan.move_aside:
                    raise StepFailed(
                        f"{gate.explain_block(s)} appeared after the check",
                        "the old run is stopped and nothing was launched; inspect the file",
                    )
                moved = await self.agent.move_aside(
                    path=path, format=str(s.get("verdict")), timeout=self.hc.command_timeout
                )
                self.side_records.append(
                    audit.record(
                        "move-aside",
                        config=self.engine.config.key,
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
                step.data.setdefault("moved", []).append(path)
                continue
            if int(s.get("partial_tail_bytes") or 0) > 0 and s.get("state") == "ok":
                fixed = await self.agent.repair_tail(
                    path=path, timeout=max(self.hc.command_timeout, 300.0)
                )
                self.side_records.append(
                    audit.record(
                        "repair",
                        config=self.engine.config.key,
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

    # ------------------------------------------------------------ the new script

    async def install_script(self, step: Step) -> None:
        """``--script``: the old run is gone; the new script replaces the host's (only when
        the host's is still the one the preflight read), the old one kept beside it; the one
        installed is read again on the host and must be the new bytes and declare every flag
        set. Audited with both hashes."""
        plan = self.plan
        new, read = plan.script, self.host_script
        assert new is not None and read is not None  # the preflight read both
        try:
            done = await self.agent.script_install(
                path=read.path,
                expect_sha256=read.sha256,
                source_b64=new.source_b64,
                timeout=self.hc.command_timeout,
            )
        except RunwatchError as e:
            self.side_records.append(self._script_record("script-install", False, str(e)))
            raise StepFailed(
                f"the new script was not copied: {e}",
                f"the host's script is as it was; look at {read.path} on {plan.host}",
            ) from None
        self.script_installed = done
        detail = (
            f"{read.path}: sha256 {done.old_sha256[:12]} -> {done.new_sha256[:12]}, the old one "
            f"kept as {done.kept}"
        )
        self.side_records.append(self._script_record("script-install", True, detail))
        step.data["script"] = msgspec.to_builtins(done)
        idx = plan.layout.script_index
        assert idx is not None
        again = await self.agent.script_flags(
            workdir=plan.paths["workdir"],
            argv=plan.argv[: idx + 1],
            search_path=plan.env.get("PATH"),
        )
        self.script_sha256 = again.sha256
        if again.sha256 != new.sha256:
            raise StepFailed(
                f"{again.path} on {plan.host} is not the new script once copied (sha256 "
                f"{again.sha256[:12] or 'unreadable'}, expected {new.short})",
                "the old script is put back and the old command line relaunched",
            )
        declared = {f for o in again.options for f in o.flags}
        missing = [f for f, _ in plan.spec.sets if again.found and f not in declared]
        if missing:
            raise StepFailed(
                f"the script installed on {plan.host} does not declare {', '.join(missing)}",
                "the old script is put back and the old command line relaunched",
            )
        step.detail = (
            detail
            + "; read again on the host: "
            + (
                f"declares {', '.join(f for f, _ in plan.spec.sets)}"
                if plan.spec.sets and again.found
                else "the new bytes"
            )
        )

    def _script_record(
        self, action: str, ok: bool, detail: str, done: ScriptInstalled | None = None
    ) -> dict[str, Any]:
        """The audit record of a copy of the run's script (or of putting the old one back)."""
        plan = self.plan
        done = done or self.script_installed
        read = self.host_script
        return audit.record(
            action,
            config=self.engine.config.key,
            host=plan.host,
            run=plan.run.name,
            ok=ok,
            detail=detail,
            path=read.path if read is not None else None,
            old_sha256=done.old_sha256 if done is not None else read.sha256 if read else None,
            new_sha256=done.new_sha256 if done is not None else None,
            kept=done.kept if done is not None else None,
            source=plan.script.path if plan.script is not None else None,
        )

    async def put_script_back(self) -> str | None:
        """Before a rollback: the old script back in place of the new one (None when done or
        nothing was copied; else why not, and the run is left stopped)."""
        done = self.script_installed
        if done is None:
            return None
        try:
            back = await self.agent.script_install(
                path=done.path,
                expect_sha256=done.new_sha256,
                from_path=done.kept,
                from_sha256=done.old_sha256,
                keep=False,
                timeout=self.hc.command_timeout,
            )
        except RunwatchError as e:
            why = (
                f"the old script could not be put back ({e}); restore it with "
                f"`cp -p {shlex.quote(done.kept)} {shlex.quote(done.path)}` on {self.plan.host}"
            )
            self._script_record("script-restore", False, why)
            return why
        self.script_installed = None
        self._script_record(
            "script-restore",
            True,
            f"{done.path}: sha256 {back.old_sha256[:12]} -> {back.new_sha256[:12]} (the old "
            f"script back, from {done.kept})",
            back,
        )
        return None

    # ------------------------------------------------------------ 6. launch

    def launch_params(self, layout: RunLayout, fingerprints: bool = True) -> LaunchParams:
        """The ``launch`` request of ``layout.argv`` (its locks, log and fingerprints)."""
        from supervisor.secrets import script_secret_flags, secret_flags

        plan = self.plan
        argv = list(layout.argv)
        return {
            "workdir": layout.workdir,
            "argv": argv,
            "config_id": self.engine.config.key,
            "config_path": written_by(self.engine.config)["config_path"],
            "run": plan.run.name,
            "env": plan.env,
            "secret_env": plan.secret_env,
            "secret_flags": secret_flags(self.engine.config),
            "script_secret_flags": script_secret_flags(self.engine.config),
            "log": layout.log,
            "lock_paths": list(layout.locks),
            "data_files": list(layout.data_files.values()),
            "settle_s": plan.run.settle_seconds,
            "lock_wait_s": 3.0,
            "fingerprints": [
                {
                    "path": path,
                    "data": dict(
                        fingerprint_of(plan.run, argv, self.engine.config),
                        dataset=ds,
                        **written_by(self.engine.config),
                        **({"script_sha256": self.script_sha256} if self.script_sha256 else {}),
                    ),
                    "hash_files": (
                        {ds: layout.prompt_files[ds]} if ds in layout.prompt_files else {}
                    ),
                }
                for ds, path in layout.fingerprints.items()
            ]
            if fingerprints
            else [],
        }

    async def launch(self, step: Step) -> None:
        plan = self.plan
        # The gate again, on the files as they are now that no writer is alive (the old run
        # may have written between the checks and its stop).
        verdict = await self.start_gate().check(
            plan.run, plan.layout, validate="none", force=plan.force
        )
        if verdict.overwrite:
            step.data["resume_command"] = self.resume_command(gate.resume_argv(plan.layout))
        if verdict.running:
            self.taken_over = True
        if not verdict.ok:
            raise verdict.failure()
        snap = await self.take_snapshot(plan.layout, plan.action)
        if snap is not None and snap.id:
            step.data["snapshot"] = msgspec.to_builtins(snap)
            self.snapshot = {
                "id": snap.id,
                "dir": snap.dir,
                "files": [
                    {"path": f.path, "bytes": f.bytes, "method": f.method} for f in snap.files
                ],
                "unprotected": snap.unprotected,
            }
        # After runwatch's own moves and repairs: from here the files may only grow.
        self.sizes = verdict.sizes
        self.records_at_start = verdict.records
        if self.script_installed is None:  # the script step read it back just now
            await self.host_script_sha(fresh=True)
        params = self.launch_params(plan.layout)
        started = time.time()
        timeout = plan.run.settle_seconds + 3.0 + self.hc.command_timeout
        try:
            reply = as_data(await self.agent.launch(**params, timeout=timeout))
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
            if reply.get("warning"):
                step.detail += f"; warning: {reply['warning']}"
            if snap is not None and snap.id:
                step.detail += f"; snapshot {snap.id} taken first"
            lost = await self.guard_snapshot(plan.layout, snap, self.identity)
            if lost is not None:
                self.identity = None
                raise StepFailed(
                    lost,
                    "the client truncated or replaced its output at start: its profile's "
                    "resume rule is wrong (resume = 'flag' and its resume flag), or its "
                    f"command line is; `runwatch restore {plan.run.name}` lists the snapshots",
                )
            await self.check_no_loss(step)
            return
        reason = reply.get("reason")
        if reason == "exited" and reply.get("exit_code") == 0:
            # The client says it has nothing left to generate: true when every dataset has
            # reached its target; a dataset known to be short makes it a failed launch.
            last = (reply.get("log_tail") or ["(the log is empty)"])[-1]
            short = await self.unfinished(await self.scan_all())
            if short:
                raise StepFailed(
                    f"the client exited 0 at once, but not every dataset is done: "
                    f"{'; '.join(short)}; its last log line: {last}",
                    "read the run's log: it stopped without generating",
                )
            self.nothing_to_do = True
            step.detail = (
                "nothing to do: all datasets done (the client exited 0 at once; "
                f"its last log line: {last})"
            )
            return
        if reason == "writer-alive":
            raise StepFailed(
                reply.get("detail") or "a data file is open for writing",
                "one writer per data file: stop that process first (`runwatch ps`, "
                "`runwatch kill RUN --pid PID`)",
            )
        if reason == "already-running":
            self.taken_over = True
            raise StepFailed(
                reply.get("detail") or "already running",
                "another runwatch (or a launch in progress) started it; refresh to see it",
            )
        tail = "\n    ".join(reply.get("log_tail") or []) or "(the log is empty)"
        raise StepFailed(
            f"{reply.get('detail') or reason}; last lines of {reply.get('log')}:\n    {tail}",
            "fix the cause shown in the log, then launch again",
        )

    async def unfinished(self, scans: list[dict[str, Any]]) -> list[str]:
        """Datasets known to be short of their target (``B2: 97/400 responses``): fewer
        responses than both the sample target (``--max-samples`` or the config's) and the
        prompts file's lines, and fewer completion tokens than the command line's own token
        budget (where the client stops). Unknown when the prompts file is not known or not
        readable."""
        plan = self.plan
        layout = plan.layout
        start = layout.script_index if layout.script_index is not None else 0
        flags = match.parse_flags(list(plan.argv), start)
        flag_target = flags.get("max_samples")
        flag_budget = flags.get("token_budget")
        prompts = {
            ds: posixpath.normpath(posixpath.join(layout.workdir, rel))
            for ds, rel in layout.prompt_files.items()
        }
        found: dict[str, Any] = {}
        if prompts:
            specs: list[FileSpec] = [
                {"path": p, "validate": "sample", "texts": False} for p in prompts.values()
            ]
            reply = await self.agent.scan(files=specs, timeout=max(self.hc.command_timeout, 60.0))
            found = reply.get("files") or {}
        lines = {
            ds: found[p].get("lines") if (found.get(p) or {}).get("state") == "ok" else None
            for ds, p in prompts.items()
        }
        by_path = {p: ds for ds, p in layout.data_files.items()}
        short = []
        for scan in scans:
            ds = by_path.get(str(scan.get("path")))
            total = lines.get(ds) if ds is not None else None
            if ds is None or not isinstance(total, int):
                continue
            dc = self.engine.config.datasets.get(ds)
            target = flag_target or (dc.max_samples if dc is not None else None)
            want = min(total, target) if isinstance(target, int) else total
            done = int(scan.get("unique_ids") or scan.get("records") or 0)
            tokens = int(scan.get("completion_tokens") or 0)
            if isinstance(flag_budget, int) and tokens >= flag_budget:
                continue
            if done < want:
                short.append(f"{ds}: {done}/{want} responses")
        return short

    # ------------------------------------------------------------ rollback

    def previous_argv(self) -> tuple[list[str], str]:
        """The command line that ran before the stop, and where it was read."""
        plan = self.plan
        assert plan.old is not None
        running = list(plan.old.identity.argv)
        if running and not any(MASK in a for a in running):
            return running, f"the stopped process (pid {plan.old.identity.pid})"
        return launchspec.launch_argv(
            self.engine.config, plan.run
        ), "the run's previous launch spec"

    async def roll_back(self) -> dict[str, Any]:
        """Launch the previous command line again after a failure past the stop; audited. A
        rollback is a launch: the gate may refuse it (``refused``), and the run stays stopped."""
        plan = self.plan
        argv, source = self.previous_argv()
        outcome: dict[str, Any] = {"ok": False, "identity": None, "source": source}
        try:
            not_back = await self.put_script_back()
            if not_back is not None:
                raise StepFailed(f"not relaunched: {not_back}")
            layout = layout_of(self.engine.config, plan.run, argv)
            layout.require_files()
            verdict = await self.start_gate().check(plan.run, layout, force=plan.force)
            if not verdict.ok:
                return self.rollback_refused(argv, source, layout, verdict)
            snap = await self.take_snapshot(layout, "rollback")
            if snap is not None and snap.id:
                outcome["snapshot"] = {"id": snap.id, "dir": snap.dir, "pruned": snap.pruned}
            # The fingerprints on the host stay those of the launch that wrote the data.
            params = self.launch_params(layout, fingerprints=False)
            timeout = plan.run.settle_seconds + 3.0 + self.hc.command_timeout
            try:
                reply = as_data(await self.agent.launch(**params, timeout=timeout))
            except OutcomeUnknown as e:
                reply = await self._reconcile_launch(time.time(), str(e))
            if reply.get("started"):
                lost = await self.guard_snapshot(layout, snap, reply["identity"])
                if lost is not None:
                    reply = {"started": False, "detail": lost}
        except HostError as e:
            reply = {"started": False, "detail": f"cannot reach {plan.host} ({e.message})"}
        except (RunwatchError, OSError, asyncio.TimeoutError) as e:
            reply = {"started": False, "detail": str(e)}
        if reply.get("started"):
            ident = reply["identity"]
            outcome.update(
                ok=True,
                identity=ident,
                detail=f"rolled back: the previous command line (from {source}) runs again "
                f"as pid {ident.get('pid')}",
            )
        elif reply.get("reason") == "exited" and reply.get("exit_code") == 0:
            outcome.update(
                ok=True,
                detail="rolled back: the previous command line exited 0 at once (nothing to do)",
            )
        else:
            tail = "\n    ".join(reply.get("log_tail") or [])
            outcome["detail"] = (
                f"ROLLBACK FAILED: the previous command line (from {source}) did not start: "
                f"{reply.get('detail') or reply.get('reason')}; the run is DOWN - start it with "
                f"`runwatch launch {plan.run.name}`" + (f"\n    {tail}" if tail else "")
            )
        outcome["detail"] = mask_text(str(outcome["detail"]), plan.secrets)
        audit.record(
            "rollback",
            config=self.engine.config.key,
            host=plan.host,
            run=plan.run.name,
            ok=bool(outcome["ok"]),
            identity=outcome["identity"],
            argv=argv,
            secrets=plan.secrets,
            detail=outcome["detail"],
            snapshot=outcome.get("snapshot"),
        )
        return outcome

    def rollback_refused(
        self, argv: list[str], source: str, layout: RunLayout, verdict: gate.Verdict
    ) -> dict[str, Any]:
        """The outcome (audited) of a rollback the gate refused: nothing launched, and the
        command that starts the run keeping its output."""
        plan = self.plan
        why = "; ".join(verdict.problems)
        outcome: dict[str, Any] = {"ok": False, "identity": None, "source": source}
        if verdict.running:
            # Another launcher started the run meanwhile: it is not down.
            outcome["detail"] = f"not rolled back: {why}; nothing was launched"
        else:
            resume = gate.resume_argv(layout)
            command = self.resume_command(resume)
            what = "would overwrite the run's output" if verdict.overwrite else "fails the gate"
            outcome.update(
                refused=True,
                command=command,
                resume_argv=mask_argv(resume, plan.secrets),
                detail=f"ROLLBACK REFUSED: the previous command line (from {source}) {what}: "
                f"{why}. Nothing was launched: the run is STOPPED, its data as it was. "
                f"Resume it with: {command}"
                + ("" if verdict.overwrite else f" ({'; '.join(verdict.hints)})"),
            )
        outcome["detail"] = mask_text(str(outcome["detail"]), plan.secrets)
        audit.record(
            "rollback",
            config=self.engine.config.key,
            host=plan.host,
            run=plan.run.name,
            ok=False,
            argv=argv,
            secrets=plan.secrets,
            detail=outcome["detail"],
            refused=outcome.get("refused"),
            command=outcome.get("command"),
        )
        return outcome

    async def _reconcile_launch(self, started: float, why: str) -> dict[str, Any]:
        await self.host.connect()
        st = await self.agent.lock_status(lock_paths=self.plan.locks)
        holder = st.holder or LockHolder()
        ident = holder.identity
        fresh = holder.time >= started
        if st.held and st.holder_alive and fresh and ident is not None:
            # Ours (it took the lock after this launch began): confirm it stays alive for the
            # settle time, as the host would have before answering.
            deadline = time.monotonic() + self.plan.run.settle_seconds
            while time.monotonic() < deadline:
                probe = await self.agent.probe(identity=identity_params(ident))
                if not probe.get("alive"):
                    return {
                        "started": False,
                        "reason": "exited",
                        "detail": f"the reply was lost ({why}) and the run it started exited",
                        "log": holder.log or self.plan.paths["log"],
                    }
                await asyncio.sleep(0.1)  # polling the host for a condition, bounded above
            return {
                "started": True,
                "identity": identity_params(ident),
                "log": holder.log,
                "reconciled": f"reply lost ({why}); confirmed from the run's lock on the host",
            }
        return {
            "started": False,
            "reason": "unknown",
            "detail": f"the connection dropped during the launch ({why}) and no run holds the "
            "lock now",
            "log": self.plan.paths["log"],
        }


def _scan_summary(s: dict[str, Any]) -> dict[str, Any]:
    keys = ("path", "state", "verdict", "verdict_detail", "records", "partial_tail_bytes")
    return {k: s.get(k) for k in keys}


def kill_refused(outcome: Any) -> str | None:
    """Why the kill of the run's own process was refused, or None when it was not."""
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


def kill_summary(outcome: Any) -> str:
    """``1 terminated, 2 already-gone``: the outcomes of a kill, counted."""
    rs = _results(outcome)
    if not rs:
        return "kill outcome unknown (connection dropped)"
    counts: dict[str, int] = {}
    for r in rs:
        counts[str(r.get("outcome"))] = counts.get(str(r.get("outcome")), 0) + 1
    return ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))


async def execute(
    engine: PlanEngine, plan: Plan, *, dry_run: bool = False, on_step: OnStep | None = None
) -> ActionResult:
    """Run the plan's steps in order, stopping at the first failure; see the module docstring."""
    return await _Runner(engine, plan, dry_run, on_step).run()
