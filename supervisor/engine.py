"""The engine: every configured host polled concurrently, one ``model.Snapshot`` per refresh.

Each refresh sends ONE ``refresh`` request per host (processes, every dataset file of every run
on that host, the GPUs and the ``/metrics`` of the local serving engines its runs use, in one
round trip), matches the processes to the configured runs and builds the datasets' numbers with
``supervisor.rates`` (one tracker per dataset, kept across refreshes). ``supervisor.live`` adds
each run's rate across its datasets, the serving engines' and GPUs' figures, and the rate
history, persisted in the state dir so that a new engine starts with rates.

One host never stalls the others: each host's refresh is bounded by its own connect and command
timeouts. A host that fails keeps its last values, marked stale, and is retried with exponential
backoff (1 s, 2 s, 4 s ... up to ``MAX_BACKOFF_S``); between retries the refresh answers at once
with the stale values.

This module is the front door of the engine: ``tui/`` and ``supervisor/cli/`` use only it (plus
``supervisor.model``, ``supervisor.config``, ``supervisor.errors`` and the formatting module), an
import contract in ``pyproject.toml`` enforces it. ``Engine`` holds everything that talks to a
host: refresh, list, kill (audited here, a lost reply included), check, plan and execute a launch
or restart (audited by ``supervisor.steps``), the log tail (secrets masked), the latest samples and
the budget policy. The functions below it serve what needs no host connection of its own: bench,
compare, the audit log, scanning local files, tokenizers. The types front ends see are re-exported
here, with the events every front end reports (``supervisor.events``) and the alerts
(``supervisor.alerts``).

The engine is the one layer between the front ends and the services: ``tick`` is the supervision
loop every front end runs (``supervisor.supervision``). The services below it get narrow
interfaces (a ``Protocol`` each: ``plan.Looks``, ``steps.PlanEngine``, ``guard.Acts``,
``autorestart.Relaunches``, ``compare.Refreshes``) and never import this module; the headless
watcher and its exporter (``supervisor.watch``, ``supervisor.exporter``) are front ends above it.
The layers are an import contract in ``pyproject.toml``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import posixpath
import shlex
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import msgspec

from supervisor import audit, clients, display, intents, launchspec, rates, runlock
from supervisor import kill as kill_ops
from supervisor.agent.match import client_path, script_index
from supervisor.agent.protocol import FileSpec
from supervisor.agentclient import AgentClient, as_data
from supervisor.completeness import (
    completeness_line,
    discount_in_flight,
    scan_notes,
    settle_missing,
    sidecar_line,
    with_client_parts,
)
from supervisor.config import Config, HostConfig, RunConfig, bad_name, command_prefix
from supervisor.dataloss import DataLossWatch
from supervisor.errors import (
    ConfigError,
    HostError,
    KillRefused,
    OutcomeUnknown,
    RestartCancelled,
    RunwatchError,
    UsageError,
)
from supervisor.heap import Trimmer
from supervisor.hostfactory import make_host
from supervisor.hosts import (
    AgentHost,
    Host,
    assign_runs,
    list_processes,
    match_run,
    own_only,
    ps_params,
    run_backend,
    run_files,
    set_backend,
)
from supervisor.kill import KillReport, KillResult
from supervisor.launchspec import launch_argv
from supervisor.layout import RunLayout, layout_of
from supervisor.live import Live, metrics_specs
from supervisor.model import (
    DatasetView,
    HostView,
    Identity,
    JobView,
    PlanProgress,
    ProcessInfo,
    RunFlags,
    RunState,
    RunView,
    Snapshot,
    UnitInfo,
)
from supervisor.provisional import provisional_view
from supervisor.secrets import known_secrets, mask_argv, mask_text, note_secrets

if TYPE_CHECKING:
    from supervisor.agent.formats import BUILTIN_FORMATS
    from supervisor.alerts import Alerter, Delivery, mask_url
    from supervisor.argv import parse_sets, parse_unsets
    from supervisor.bench.history import load_history
    from supervisor.bench.results import BenchResult, LevelResult
    from supervisor.bench.runner import Options as BenchOptions
    from supervisor.bench.target import is_url
    from supervisor.compare import Comparison, comparison_from, format_lines
    from supervisor.events import (
        EVENT_KINDS,
        EVENTS_KEPT,
        Event,
        EventTracker,
        moved_key,
        start_refused_event,
        stop_key,
    )
    from supervisor.explain import explain_file
    from supervisor.guard import BudgetEvent, BudgetGuard, GuardOutcome
    from supervisor.plan import Action, ActionResult, OnStep, Plan, Step
    from supervisor.planintent import PlanBusy
    from supervisor.planintent import hold as hold_plan_lock
    from supervisor.planintent import read as pending_plan
    from supervisor.rebalance import Rebalance, parse_deadline
    from supervisor.rebalance import apply as apply_rebalance
    from supervisor.rebalance import checked_plan as plan_rebalance
    from supervisor.rebalance import describe as describe_rebalance
    from supervisor.rebalance import gather as gather_rebalance
    from supervisor.rebalance import resume as resume_rebalance
    from supervisor.samples import LatestSamples, SamplePreview
    from supervisor.slurm import describe as describe_job
    from supervisor.supervision import Supervision, Tick
    from supervisor.tokens import Tokenizer, count_tokens, load_tokenizer

_LAZY: dict[str, str] = {
    "BUILTIN_FORMATS": "supervisor.agent.formats",
    "Alerter": "supervisor.alerts",
    "Delivery": "supervisor.alerts",
    "mask_url": "supervisor.alerts",
    "parse_sets": "supervisor.argv",
    "parse_unsets": "supervisor.argv",
    "load_history": "supervisor.bench.history",
    "BenchResult": "supervisor.bench.results",
    "LevelResult": "supervisor.bench.results",
    "BenchOptions": "supervisor.bench.runner:Options",
    "is_url": "supervisor.bench.target",
    "Comparison": "supervisor.compare",
    "comparison_from": "supervisor.compare",
    "format_lines": "supervisor.compare",
    "explain_file": "supervisor.explain",
    "EVENT_KINDS": "supervisor.events",
    "EVENTS_KEPT": "supervisor.events",
    "Event": "supervisor.events",
    "EventTracker": "supervisor.events",
    "moved_key": "supervisor.events",
    "start_refused_event": "supervisor.events",
    "stop_key": "supervisor.events",
    "Supervision": "supervisor.supervision",
    "Tick": "supervisor.supervision",
    "BudgetEvent": "supervisor.guard",
    "GuardOutcome": "supervisor.guard",
    "Action": "supervisor.plan",
    "ActionResult": "supervisor.plan",
    "OnStep": "supervisor.plan",
    "Plan": "supervisor.plan",
    "Step": "supervisor.plan",
    "Rebalance": "supervisor.rebalance",
    "parse_deadline": "supervisor.rebalance",
    "apply_rebalance": "supervisor.rebalance:apply",
    "describe_rebalance": "supervisor.rebalance:describe",
    "gather_rebalance": "supervisor.rebalance:gather",
    "resume_rebalance": "supervisor.rebalance:resume",
    "PlanBusy": "supervisor.planintent",
    "hold_plan_lock": "supervisor.planintent:hold",
    "pending_plan": "supervisor.planintent:read",
    "plan_rebalance": "supervisor.rebalance:checked_plan",
    "LatestSamples": "supervisor.samples",
    "SamplePreview": "supervisor.samples",
    "describe_job": "supervisor.slurm:describe",
    "Tokenizer": "supervisor.tokens",
    "count_tokens": "supervisor.tokens",
    "load_tokenizer": "supervisor.tokens",
}
"""Names this module re-exports from a module it imports only when one of them is first asked
for (``module`` or ``module:attribute``): starting the engine for a refresh does not pay for the
plans, the bench, the comparison, Slurm and alerts."""


def __getattr__(name: str) -> object:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module), attr or name)
    globals()[name] = value
    return value


MAX_BACKOFF_S = 30.0
"""Longest wait between reconnection attempts to a failing host."""

T = TypeVar("T")


class LogTail(msgspec.Struct, kw_only=True):
    """The last lines of a run's log on its host, secrets masked."""

    path: str
    """The log file on the host: the run's ``log =``, else the launch log
    ``<out>/.runwatch/run.log`` where runwatch's launches write the run's output."""
    exists: bool
    lines: list[str] = []


@dataclass
class _HostState:
    view: HostView
    failures: int = 0
    next_try: float = 0.0
    discovered: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[str, Any] | None = None
    """The last whole Slurm listing of the host (shown, marked stale, when a listing fails)."""
    asking: asyncio.Future[HostView] | None = None
    """The host's refresh under way, when a refresh with ``wait`` went on without it."""
    asked_at: float = 0.0


def started_at(proc: ProcessInfo | None, now: float) -> float | None:
    """When ``proc`` started, on the clock of ``now`` (from its age on its host)."""
    return now - proc.uptime_s if proc is not None else None


class Engine:
    """Polls every configured host; see the module docstring."""

    def __init__(self, config: Config, hosts: dict[str, Host] | None = None) -> None:
        self.config = config
        note_secrets(config)  # their values are masked in everything runwatch prints or writes
        self._hosts: dict[str, Host] = dict(hosts or {})
        self.stopping: set[str] = set()
        """``events.stop_key`` of each process a plan of this engine is stopping, until the
        plan's audit record is written: a restart's run is down for its quiet window, and a
        watcher of this engine must not take that for a death."""
        for hc in config.hosts:
            if hc.name not in self._hosts:
                self._hosts[hc.name] = make_host(hc)
        # Before the first answer a host shows its configured runs, state unknown.
        self._state: dict[str, _HostState] = {
            hc.name: _HostState(
                view=HostView(
                    name=hc.name,
                    runs=[
                        RunView(name=r.name, host=hc.name, state="unknown")
                        for r in self._runs_of(hc.name)
                    ],
                )
            )
            for hc in config.hosts
        }
        self._trackers = rates.Trackers()
        self._now = rates.SteadyClock()
        """The time of every rate, ETA and rate window (a wall-clock step never moves it)."""
        self._dataloss = DataLossWatch(config.key)
        self._tokenizer: Any = None
        self.last: Snapshot | None = None
        self._inflight: asyncio.Future[Snapshot] | None = None
        self._on_progress: Callable[[Snapshot], None] | None = None
        self._provisional: dict[str, HostView] = {}
        self._guard: BudgetGuard | None = None
        self._supervision: Supervision | None = None
        self._live = Live(config)
        self._trimmer = Trimmer()  # a watcher lives for days: free heap pages go back

    # ------------------------------------------------------------------ public API

    def host(self, name: str) -> Host:
        """The Host (``supervisor.hosts`` interface) named ``name``."""
        try:
            return self._hosts[name]
        except KeyError:
            known = ", ".join(self._hosts) or "none"
            raise RunwatchError(f"no host named {name!r} (hosts: {known})") from None

    async def refresh(
        self, on_progress: Callable[[Snapshot], None] | None = None, wait: float | None = None
    ) -> Snapshot:
        """Poll all hosts concurrently and build a Snapshot.

        Calls that overlap share one refresh (rates need one observation per refresh, and a
        host is asked once however many front ends ask).

        ``wait``: seconds to wait for the hosts (default: until each answers or times out).
        A host that has not answered by then is shown with its last values, marked stale and
        with a note saying for how long it has been asked; its refresh goes on, and a later
        refresh takes its answer (the watcher: one slow host never holds up the others).

        While a host's first scan runs (its agent just started), ``on_progress`` gets
        provisional snapshots: at once the line count of every dataset of that host as its
        ``records`` (``DatasetView.provisional``), then how far the scan is
        (``HostView.progress``), at most every half second, until the refresh returns."""
        if on_progress is not None:
            self._on_progress = on_progress
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(self._refresh_all(wait))
        try:
            return await asyncio.shield(self._inflight)
        finally:
            if on_progress is not None and self._on_progress is on_progress:
                self._on_progress = None

    async def _refresh_all(self, wait: float | None = None) -> Snapshot:
        names = [hc.name for hc in self.config.hosts]
        if wait is None and not any(self._state[n].asking for n in names):
            views = list(await asyncio.gather(*(self._refresh_host(n) for n in names)))
        else:
            views = await self._refresh_within(names, wait)
        snap = Snapshot(time=time.time(), hosts=views)
        snap.plan = self._plan_progress(snap)
        self.last = snap
        self._live.prune(self._trackers)
        self._live.maybe_save()
        self._trimmer.maybe(time.monotonic())
        return snap

    async def _refresh_within(self, names: list[str], wait: float | None) -> list[HostView]:
        """Each host's refresh (one under way is taken over), waited for ``wait`` seconds; a
        host still asked then shows its last values, stale, with a note."""
        now = time.monotonic()
        for n in names:
            state = self._state[n]
            if state.asking is None:
                state.asking = asyncio.ensure_future(self._refresh_host(n))
                state.asked_at = now
        asking = [self._state[n].asking for n in names]
        await asyncio.wait([a for a in asking if a is not None], timeout=wait)
        views = []
        for n in names:
            state = self._state[n]
            task = state.asking
            assert task is not None
            if task.done():
                state.asking = None
                views.append(task.result())
                continue
            late = time.monotonic() - state.asked_at
            note = f"no answer for {display.duration(late)} yet: showing its last values"
            views.append(
                msgspec.structs.replace(state.view, stale=True, notes=[*state.view.notes, note])
            )
        return views

    def _plan_progress(self, snap: Snapshot) -> PlanProgress | None:
        """The applied rebalance plan against this snapshot (None when there is none)."""
        from supervisor import rebalance

        half = rebalance.half_applied(self.config)
        if half is not None:
            return half
        if not rebalance.plan_path(self.config).exists():
            return None
        from supervisor.bench.history import load_history
        from supervisor.compare import comparison_from

        comparison = comparison_from(self.config, snap, load_history())
        return rebalance.progress(self.config, snap, comparison)

    async def list_processes(self, host: str, pids: Sequence[int] = ()) -> list[ProcessInfo]:
        """The runs on ``host`` (every process executing a configured script, and ``pids``
        whatever they execute), each matched to the configured run it is (``ProcessInfo.run``);
        bounded by the host's timeouts."""
        h = self.host(host)
        hc = self.config.host(host)
        bound = hc.connect_timeout + hc.command_timeout
        try:
            return await asyncio.wait_for(list_processes(h, self.config, pids), bound)
        except asyncio.TimeoutError:
            raise HostError(f"{host}: no answer within {bound:g} s") from None

    def _listed(self, host: str, identity: Identity) -> ProcessInfo | None:
        """The process ``identity`` names in the last refresh, if it was listed."""
        for hv in self.last.hosts if self.last is not None else []:
            for p in hv.processes if hv.name == host else []:
                if p.identity.pid == identity.pid and p.identity.start_time == identity.start_time:
                    return p
        return None

    def _listed_run(self, host: str, identity: Identity) -> str | None:
        """The config run ``identity`` was matched to at the last refresh."""
        for hv in self.last.hosts if self.last is not None else []:
            for p in hv.processes if hv.name == host else []:
                if p.identity.pid == identity.pid and p.identity.start_time == identity.start_time:
                    return p.run
        return None

    async def kill(
        self,
        host: str,
        identity: Identity,
        grace: float = 10.0,
        *,
        run: str | None = None,
        on_wait: Callable[[str], None] | None = None,
        writer: bool = False,
    ) -> KillReport:
        """Stop the process named by ``identity`` on ``host`` and audit it (action ``kill``).
        ``writer``: the user named it as a writer of ``run`` (``kill RUN --pid``): it may execute
        no configured script if the host sees it hold the run's data files open for writing.

        A kill whose reply was lost is audited with outcome ``unknown`` at once, then the host is
        re-checked: gone gives a reconciled report (audited too); still alive is audited again
        and raised as OutcomeUnknown. ``run`` names the run in the audit record (default: the
        run the latest snapshot shows with that pid). A configured run's kill holds the run's
        lock (``supervisor.runlock``); ``on_wait`` is told when another action holds it. Every
        failure is audited.
        """
        listed = self._listed(host, identity)
        if listed is not None:
            try:
                refuse_foreign(listed, host)
            except KillRefused as e:
                kill_ops.audit_kill_failed(
                    host, identity, run, f"refused: {e.message}", config=self.config.key
                )
                raise
        run = run if run is not None else self._listed_run(host, identity)
        if run is None or run not in {r.name for r in self.config.runs}:
            return await self._kill(host, identity, grace, run, writer)
        # One action on a run at a time (``supervisor.runlock``): a second kill waits for the
        # first (then finds the process gone), and refuses after a bound, naming the holder.
        wait = grace + 2 * self.config.host(host).command_timeout
        try:
            async with runlock.hold(self.config, run, wait, "kill", on_wait):
                self._cancel_restarts_before_kill(run)
                return await self._kill(host, identity, grace, run, writer)
        except runlock.RunBusy as e:
            kill_ops.audit_kill_failed(
                host, identity, run, f"refused: {e.message}", config=self.config.key
            )
            raise

    async def _kill(
        self, host: str, identity: Identity, grace: float, run: str | None, writer: bool = False
    ) -> KillReport:
        h = self.host(host)
        # Whatever holds the run's data files or locks once it is stopped is stopped too.
        files = run_files(self.config, run)
        try:
            report = await kill_ops.kill(
                h, identity, grace, clients.all_scripts(self.config), files, writer
            )
        except OutcomeUnknown as lost:
            kill_ops.audit_kill_unknown(host, identity, run, lost.message, config=self.config.key)
            try:
                report = await kill_ops.after_lost_reply(h, identity, lost)
            except OutcomeUnknown as alive:
                kill_ops.audit_kill_unknown(
                    host, identity, run, alive.message, config=self.config.key, reconciled=True
                )
                raise
        except (RunwatchError, OSError, asyncio.TimeoutError) as e:
            kill_ops.audit_kill_failed(
                host, identity, run, str(e) or type(e).__name__, config=self.config.key
            )
            raise
        kill_ops.audit_kill(report, run, self.config.key)
        return report

    async def kill_within_plan(self, host: str, identity: Identity, grace: float) -> KillReport:
        """The stop step of a restart: :meth:`kill` without its own audit record (the plan's
        record holds the stop); a lost reply is reconciled the same way."""
        files = run_files(self.config, self._listed_run(host, identity))
        return await kill_ops.kill_or_reconcile(
            self.host(host), identity, grace, clients.all_scripts(self.config), files
        )

    async def snapshots(self, run_name: str) -> list[dict[str, Any]]:
        """The snapshots taken before the starts of ``run_name``, newest first
        (``supervisor.snapshots``)."""
        from supervisor import snapshots

        run = self.config.run(run_name)
        layout = layout_of(self.config, run, launch_argv(self.config, run))
        agent = AgentClient(self.host(run.host))
        return [msgspec.to_builtins(s) for s in await snapshots.listing(agent, layout)]

    async def restore_snapshot(
        self, run_name: str, snapshot_id: str, files: list[str] | None = None
    ) -> dict[str, Any]:
        """Put the files of snapshot ``snapshot_id`` of ``run_name`` back (every one, or
        ``files``), each current file moved aside to ``<file>.after-<stamp>``; audited (action
        ``restore``). Refused while the run runs or any process has one of the files open for
        writing; held under the run's lock, so no start comes in between."""
        from supervisor import snapshots

        run = self.config.run(run_name)
        hc = self.config.host(run.host)
        layout = layout_of(self.config, run, launch_argv(self.config, run))
        agent = AgentClient(self.host(run.host))
        async with runlock.hold(self.config, run.name, 2 * hc.command_timeout, "restore"):
            snap = await self.refresh()
            view = next((r for h in snap.hosts for r in h.runs if r.name == run.name), None)
            if view is not None and view.process is not None:
                raise RunwatchError(
                    f"{run.name} is running (pid {view.process.identity.pid}): a snapshot is put "
                    "back only while no writer is alive; nothing was changed",
                    f"stop it first (`runwatch kill {run.name}`), then restore",
                )
            st = await agent.lock_status(lock_paths=list(layout.locks))
            if st.held and st.holder_alive:
                raise RunwatchError(
                    f"{run.name}'s lock {st.lock_path} is held by a live process: a snapshot is "
                    "put back only while no writer is alive; nothing was changed",
                    "stop that process first, then restore",
                )
            try:
                done = await snapshots.restore_by_hand(agent, layout, snapshot_id, files)
            except RunwatchError as e:
                audit.record(
                    "restore",
                    config=self.config.key,
                    host=run.host,
                    run=run.name,
                    ok=False,
                    snapshot=snapshot_id,
                    detail=str(e),
                )
                raise
        restored = [msgspec.to_builtins(r) for r in done.restored]
        audit.record(
            "restore",
            config=self.config.key,
            host=run.host,
            run=run.name,
            ok=True,
            snapshot=snapshot_id,
            restored=restored,
            detail=f"snapshot {snapshot_id} put back by hand: "
            + "; ".join(f"{r.path} (the file found kept as {r.aside})" for r in done.restored),
        )
        return {"snapshot": snapshot_id, "restored": restored}

    async def list_jobs(self, host: str) -> list[dict[str, Any]]:
        """The Slurm jobs a ``kind = "slurm"`` host's queue holds (the agent's ``slurm_jobs``:
        the tagged ones and the ones runs adopted), each with ``run``: the run that submitted
        or adopted it, None for a job that only carries a tag; bounded by the host's
        timeouts."""
        from supervisor import slurm

        hc = self.config.host(host)
        bound = hc.connect_timeout + hc.command_timeout
        owned = slurm.owned_jobs(self.config, host)
        try:
            agent = AgentClient(self.host(host))
            reply = await asyncio.wait_for(agent.slurm_jobs(with_ids=sorted(owned)), bound)
        except asyncio.TimeoutError:
            raise HostError(f"{host}: no answer within {bound:g} s") from None
        return [dict(j, run=slurm.owner(j, owned)) for j in reply.get("jobs") or []]

    async def cancel_restarts(
        self, run: str, why: str = "kill", on_wait: Callable[[str], None] | None = None
    ) -> str | None:
        """Cancel the pending restart on failure of ``run`` (``supervisor.intents``), under the
        run's lock, so that no watcher, this one or a later one, starts it: a kill of a run that
        is not running (waiting for its restart's backoff). Audited (``restart-cancelled``).
        Returns what was cancelled, or None when nothing was pending."""
        rc = self.config.run(run)
        wait = rc.stop_grace_seconds + 2 * self.config.host(rc.host).command_timeout
        async with runlock.hold(self.config, run, wait, why, on_wait):
            return self._cancel_restarts(run, why, running=False)

    def record_stopped(self, run: str, why: str = "kill") -> str:
        """A kill of ``run`` found it not running and nothing pending: recorded all the same
        (``restart-cancelled``), so that a watcher that has yet to see it gone does not
        restart it (``AutoRestart.cancelled``). Returns what the user is told."""
        text = (
            f"no restart of {run} pending; recorded as stopped by {why}: a watcher that has yet "
            "to see it gone does not restart it"
        )
        audit.record(
            "restart-cancelled",
            config=self.config.key,
            host=self.config.run(run).host,
            run=run,
            ok=True,
            detail=text,
        )
        return text

    def _cancel_restarts_before_kill(self, run: str) -> None:
        """A kill cancels the run's pending restart; a state dir that refuses it (its intent
        or its audit record) never keeps the kill from being sent."""
        with contextlib.suppress(OSError, RunwatchError):
            self._cancel_restarts(run, "kill", running=True)

    def _cancel_restarts(self, run: str, why: str, *, running: bool) -> str | None:
        """:meth:`cancel_restarts` with the run's lock held by the caller. ``running``: the
        run is being killed as running. A restart its watcher began and never recorded (that
        watcher ended) is audited first with its outcome (``auto-restart``, ``reconciled``):
        made, when the run is running; else interrupted, and cancelled."""
        try:
            found = intents.read(self.config, run)
        except (OSError, msgspec.DecodeError, RunwatchError):
            found = None  # unreadable: removed all the same, said as unknown
        exists = found is not None or intents.path_of(self.config, run).exists()
        if not exists:
            return None
        intents.remove(self.config, run)
        if found is not None and found.started is not None:
            if audit.actor_alive(found.started_by or ""):
                return None  # a live watcher's restart, just made under this lock: it audits it
            audit.record(
                "auto-restart",
                config=self.config.key,
                host=found.host,
                run=run,
                ok=running,
                reconciled=True,
                detail=intents.begun_outcome(found, running),
            )
            if running:
                return None  # made, not pending: nothing was cancelled
        what = (
            intents.describe(found)
            if found is not None
            else f"an unreadable intent ({intents.path_of(self.config, run)})"
        )
        text = f"cancelled the pending restart of {run} ({why}): {what}"
        audit.record(
            "restart-cancelled",
            config=self.config.key,
            host=found.host if found is not None else self.config.run(run).host,
            run=run,
            ok=True,
            detail=text,
        )
        return text

    async def cancel_job(
        self,
        run_name: str,
        grace: float | None = None,
        *,
        expect: str | None = None,
        on_wait: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """``scancel`` the Slurm job of a run on a ``kind = "slurm"`` host (TERM, KILL after
        ``grace``, default the run's ``stop_grace_seconds``) and confirm it ended: the agent's
        ``slurm_cancel`` result (``outcome``, ``confirmed``...). Only a job the run submitted or
        adopted; ``expect`` is the id of the job the caller showed (see
        ``supervisor.slurm.cancel_run``); ``on_wait`` is told when another action on the run
        holds its lock. Audited, failures included."""
        run = self.config.run(run_name)
        hc = self.config.host(run.host)
        if hc.kind != "slurm":
            raise RunwatchError(
                f"run {run_name!r} is not on a Slurm host", f"`runwatch kill {run_name}`"
            )
        from supervisor import slurm

        files = [spec["path"] for spec in self._file_specs(run, hc)]
        wait = run.stop_grace_seconds if grace is None else grace
        self._cancel_restarts_before_kill(run_name)
        return await slurm.cancel_run(
            self.config, self.host(run.host), run, wait, files, expect=expect, on_wait=on_wait
        )

    async def find_job(self, run_name: str, job_id: str) -> JobView:
        """The Slurm job ``job_id`` on the host of ``run_name``, checked for adoption by it (a
        job of this user, queued or running, not any run's yet; the run has no active job)."""
        run = self.config.run(run_name)
        if self.config.host(run.host).kind != "slurm":
            raise UsageError(f"run {run_name!r} is not on a Slurm host: it has no jobs to adopt")
        from supervisor import slurm

        return await slurm.find_job(self.config, self.host(run.host), run, job_id)

    async def adopt_job(self, run_name: str, job: JobView) -> dict[str, Any]:
        """Record ``job`` (as :meth:`find_job` gave it) as the run's, so that kill and restart
        act on it; audited."""
        from supervisor import slurm

        run = self.config.run(run_name)
        return await slurm.adopt(self.config, self.host(run.host), run, job)

    async def check_run(
        self, run_name: str, argv: list[str] | None = None, *, tokens: bool = False
    ) -> list[dict[str, Any]]:
        """Scan every dataset file of a run with full validation; returns the scan results.

        The files are those ``argv`` writes (default: the run's launch argv, ``launch_argv``);
        ConfigError when they cannot be determined: a check never passes on nothing. With
        ``tokens``, each result's ``tokens_counted`` is its completion tokens as the dashboard
        counts them (a tokenizer-counted format's answers and reasoning, every text of the file
        counted, over as many replies as its texts need; ``tokens_error`` says why not)."""
        run = self.config.run(run_name)
        hc = self.config.host(run.host)
        layout = layout_of(
            self.config, run, argv if argv is not None else launch_argv(self.config, run)
        )
        layout.require_files()
        files = [
            {**spec, "validate": "all", "texts": tokens}
            for spec in self._file_specs(run, hc, layout)
        ]
        h = self.host(run.host)
        timeout = max(hc.command_timeout, 300.0)
        # ``fresh``: validated from the first byte, however the refreshes sampled the file; a
        # ``session`` goes on where a reply full of texts stopped.
        params: dict[str, Any] = {"files": files, "fresh": True}
        if tokens:
            params["session"] = f"check-{os.getpid()}-{id(params)}-{time.time()}"
        counted: dict[str, int] = {}
        errors: dict[str, str] = {}
        while True:
            result = as_data(await AgentClient(h).scan(**params, timeout=timeout))
            scanned: dict[str, dict[str, Any]] = result.get("files", {})
            for path, scan in scanned.items():
                texts = [*(scan.get("texts") or []), *(scan.get("reasoning_texts") or [])]
                if tokens and texts and path not in errors:
                    try:
                        counted[path] = counted.get(path, 0) + self._count_texts(texts)
                    except RunwatchError as e:
                        errors[path] = e.message
            if not tokens or not any(s.get("texts_more") for s in scanned.values()):
                break
        out = [scanned.get(f["path"], {"path": f["path"], "state": "error"}) for f in files]
        if tokens:
            for scan in out:
                path = str(scan.get("path"))
                scan["tokens_counted"] = int(scan.get("completion_tokens") or 0) + counted.get(
                    path, 0
                )
                if path in errors:
                    scan["tokens_error"] = errors[path]
        return out

    def record_points(self, host: str, run: str) -> list[tuple[float, ...]]:
        """The run's history of ``(time, records, tokens, alive)`` points, oldest first (empty
        when runwatch has not watched it): the gate sizes its quiet window from it."""
        return self._live.history.points(f"run|{host}|{run}")

    def data_loss(self, host: str, run: str, path: str, bytes_before: int, bytes_after: int) -> str:
        """Raise the data-loss alarm of ``path`` (shown on its dataset from now on, audited once):
        a launch made it shrink. Returns the alarm's message."""
        return self._dataloss.raise_alarm(
            host, run, path, bytes_before, bytes_after, "shrank after a launch"
        )

    async def plan(
        self,
        run: str,
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
        """Look at ``run`` as it is now and build its launch or restart plan (changes nothing;
        see ``supervisor.plan``). ``overrides``: ``KEY=VALUE`` strings or ``(--flag, value)``;
        ``unsets``: flags to drop; ``reset``: forget the stored launch spec; ``force``: launch
        over a budget, or with flags or values that cannot be confirmed; ``pid``: which process
        is the run when several could be (an ambiguous run); ``script``: a local file that
        replaces the run's script on the host once the old run is stopped."""
        from supervisor.plan import make_plan

        return await make_plan(
            self,
            run,
            action=action,
            overrides=overrides,
            unsets=unsets,
            reset=reset,
            force=force,
            move_aside=move_aside,
            allow_change=allow_change,
            environ=environ,
            pid=pid,
            script=script,
        )

    async def execute(
        self,
        plan: Plan,
        *,
        dry_run: bool = False,
        on_step: OnStep | None = None,
        intent: float | None = None,
    ) -> ActionResult:
        """Run ``plan`` step by step, stopping at the first failure; audited (one record per
        launch or restart, and per move-aside or repair). ``dry_run``: the checks only.
        ``intent``: an automatic restart's intent (its ``written`` time): under the run's lock
        it must still be on disk, else a kill cancelled it and :class:`RestartCancelled` is
        raised with nothing started."""
        from supervisor.steps import execute as execute_plan

        hc = self.config.host(plan.host)
        if dry_run or hc.kind == "slurm":  # Slurm's steps hold the run's lock themselves
            if intent is not None and not dry_run:
                self._still_intended(plan.run.name, intent)
            return await execute_plan(self, plan, dry_run=dry_run, on_step=on_step)
        # One action on a run at a time (``supervisor.runlock``): a restart waits for a kill or
        # another restart of the run in any runwatch, then refuses naming the holder.
        wait = plan.run.stop_grace_seconds + 2 * hc.command_timeout
        try:
            async with runlock.hold(self.config, plan.run.name, wait, plan.action):
                if intent is not None:
                    self._still_intended(plan.run.name, intent)
                return await execute_plan(self, plan, dry_run=dry_run, on_step=on_step)
        except runlock.RunBusy as e:
            audit.record(
                plan.action, config=self.config.key, host=plan.host, run=plan.run.name,
                ok=False, refused=True, detail=f"refused: {e.message}",
            )  # fmt: skip
            raise

    def _still_intended(self, run: str, written: float) -> None:
        """With the run's lock held: the automatic restart's intent must still be the one its
        watcher wrote (a kill removes it under the same lock), and is marked ``started`` before
        anything is started, so that a watcher killed from here on leaves it for the next
        watcher to audit."""
        try:
            now = intents.read(self.config, run)
        except (OSError, msgspec.DecodeError, RunwatchError):
            return  # unreadable: a cancel removes the file, so it was not cancelled
        if now is None or now.written != written:
            raise RestartCancelled(
                f"the automatic restart of {run} was cancelled (its intent is gone: a kill of "
                "the run, see `runwatch audit`); nothing was started",
                f"`runwatch launch {run}` starts it again",
            )
        # Not marked (the state dir refuses writes): the restart goes ahead; a watcher killed
        # during it leaves the intent as it was, taken over as a pending restart.
        with contextlib.suppress(OSError, RunwatchError):
            intents.write(
                self.config,
                msgspec.structs.replace(now, started=time.time(), started_by=audit.actor()),
            )

    async def tail_log(self, host: str, run: str, lines: int = 50) -> LogTail:
        """The last ``lines`` lines of ``run``'s log on ``host``.

        The log is the run's ``log =``, else the launch log ``<out>/.runwatch/run.log``. Key-shaped
        tokens and the value of every endpoint's ``api_key_env`` set here are masked. Raises
        UsageError for a run that is not configured (its log is unknown).
        """
        try:
            rc = self.config.run(run)
        except RunwatchError:
            raise UsageError(
                f"{run} is not a configured run: its log is unknown",
                "add it to the config with log = PATH",
            ) from None
        if rc.host != host:
            raise UsageError(f"run {run} is on host {rc.host}, not {host}")
        path = layout_of(self.config, rc).log
        if self.config.host(rc.host).kind == "slurm":  # the job's output file (its StdOut)
            from supervisor import slurm

            path = slurm.job_output(self.last, run) or path
        reply = await AgentClient(self.host(host)).tail_log(path=path, lines=int(lines))
        secrets = self.secret_values()
        return LogTail(
            path=str(reply.get("path", path)),
            exists=bool(reply.get("exists", False)),
            lines=[mask_text(str(line), secrets) for line in reply.get("lines") or []],
        )

    def secret_values(self) -> list[str]:
        """The values of every endpoint's ``api_key_env`` set in this environment (masked
        wherever host text is shown), longest first (``secrets.known_secrets``)."""
        return known_secrets(self.config)

    async def samples(self, run: RunView, dataset: str, count: int) -> LatestSamples:
        """The last ``count`` complete records of ``dataset`` of ``run``, newest first, decoded
        for a preview (see ``supervisor.samples``)."""
        from supervisor.samples import latest_samples

        return await latest_samples(self, run, dataset, count)

    def supervise(
        self, *, report_initial: bool = True, others: bool = True, started: float | None = None
    ) -> Supervision:
        """Start the state :meth:`tick` keeps (``supervisor.supervision.Supervision``): whether
        conditions true at the first tick are reported (``report_initial``: the watcher, not
        the dashboard) and whether the stops and restarts other runwatch processes recorded
        since ``started`` are (``others``)."""
        from supervisor.supervision import Supervision

        self._supervision = Supervision(
            self.config, report_initial=report_initial, others=others, started=started
        )
        return self._supervision

    @property
    def supervision(self) -> Supervision:
        """The state of the supervision loop (:meth:`supervise` with its defaults if not yet):
        a front end tells it the stops and moves it makes (``expect_stop``, ``expect_moved``)."""
        return self._supervision or self.supervise()

    async def tick(
        self,
        *,
        wait: float | None = None,
        on_progress: Callable[[Snapshot], None] | None = None,
        on_snapshot: Callable[[Snapshot], None] | None = None,
        snapshot: Snapshot | None = None,
        act: bool = True,
        events: bool = True,
    ) -> Tick:
        """One turn of the supervision loop every front end runs: refresh (``wait`` and
        ``on_progress`` as :meth:`refresh`; ``snapshot``: one already taken instead), each
        run's budget policy (:meth:`enforce_budget`; ``act`` False: not applied), then the
        events of what changed (``events``). ``on_snapshot`` gets the snapshot before the
        policy acts (a screen shows it at once)."""

        async def refresh() -> Snapshot:
            if snapshot is not None:
                return snapshot
            return await self.refresh(on_progress=on_progress, wait=wait)

        return await self.supervision.tick(
            refresh,
            self._enforce if act else None,
            stopping=self.stopping,
            on_snapshot=on_snapshot,
            events=events,
        )

    async def _enforce(
        self, snapshot: Snapshot, before_act: Callable[[BudgetEvent], None]
    ) -> list[GuardOutcome]:
        return await self.enforce_budget(snapshot, before_act=before_act)

    def budget_events(self, snapshot: Snapshot) -> list[BudgetEvent]:
        """Budget events in ``snapshot`` not acted on yet (changes nothing)."""
        return self._budget_guard().observe(snapshot)

    async def enforce_budget(
        self,
        snapshot: Snapshot,
        on_step: OnStep | None = None,
        *,
        before_act: Callable[[BudgetEvent], None] | None = None,
    ) -> list[GuardOutcome]:
        """Apply each run's ``budget_policy`` to the budget events of ``snapshot``, each event
        once ever (``supervisor.guard``), audited: ``warn`` is recorded, ``stop`` kills by
        identity, ``restart-with-budget`` restarts with ``--token-budget``. ``before_act`` is
        called with each event just before it is acted on (a front end marks the stop as
        deliberate); ``on_step`` follows a restart's steps. The one implementation, applied at
        each :meth:`tick` (``status --watch``, ``guard``, ``runwatch watch``, the dashboard)."""
        guard = self._budget_guard()
        outcomes = []
        for event in guard.observe(snapshot):
            if before_act is not None:
                before_act(event)
            outcomes.append(await guard.act(self, event, on_step))
        return outcomes

    def _budget_guard(self) -> BudgetGuard:
        if self._guard is None:
            from supervisor.guard import BudgetGuard

            self._guard = BudgetGuard(self.config)
        return self._guard

    async def aclose(self) -> None:
        """Close every host (a refresh still running is cancelled)."""
        if self._inflight is not None and not self._inflight.done():
            self._inflight.cancel()
            with contextlib.suppress(asyncio.CancelledError, RunwatchError):
                await self._inflight
        for state in self._state.values():
            if state.asking is not None and not state.asking.done():
                state.asking.cancel()
                with contextlib.suppress(asyncio.CancelledError, RunwatchError):
                    await state.asking
        await asyncio.gather(*(self._close(h) for h in self._hosts.values()))
        self._live.close()

    async def reconfigure(self, config: Config) -> None:
        """Go on with ``config`` in place of the engine's (``supervisor.reload``: the watcher's
        config file changed; same state key). A host whose settings did not change keeps its
        connection and its last view; a changed or new host connects at the next refresh; a
        dropped host is closed. Runs dropped from the config are forgotten by the event tracker
        (re-added later, they start afresh)."""
        old = {hc.name: hc for hc in self.config.hosts}
        kept = {hc.name for hc in config.hosts if old.get(hc.name) == hc}
        closing = [h for name, h in self._hosts.items() if name not in kept]
        self.config = config
        note_secrets(config)
        for name in [n for n in self._hosts if n not in kept]:
            del self._hosts[name]
            state = self._state.pop(name, None)
            if state is not None and state.asking is not None:
                state.asking.cancel()
        for hc in config.hosts:
            if hc.name not in self._hosts:
                self._hosts[hc.name] = make_host(hc)
            if hc.name not in self._state:
                runs = [
                    RunView(name=r.name, host=hc.name, state="unknown")
                    for r in self._runs_of(hc.name)
                ]
                self._state[hc.name] = _HostState(view=HostView(name=hc.name, runs=runs))
        self._live.config = config
        if self._guard is not None:
            self._guard.config = config
        if self._supervision is not None:
            self._supervision.reconfigure(config)
        await asyncio.gather(*(self._close(h) for h in closing))

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ per host

    @staticmethod
    async def _close(host: Host) -> None:
        with contextlib.suppress(asyncio.TimeoutError, OSError, RunwatchError):
            await asyncio.wait_for(host.close(), 5.0)

    def _file_specs(
        self, run: RunConfig, hc: HostConfig, layout: RunLayout | None = None
    ) -> list[dict[str, Any]]:
        """Scan specs of the run's data files (``supervisor.layout``), one per dataset."""
        specs = []
        profile = self.config.formats.get(run.format)
        if layout is None:
            layout = layout_of(self.config, run, launch_argv(self.config, run))
        for ds, path in layout.data_files.items():
            spec: dict[str, Any] = {
                "path": path,
                "format": run.format,
                "validate": "sample",
            }
            if profile is not None:
                spec["profile"] = msgspec.to_builtins(profile)
            # The client profile's error/skipped files and input (completeness).
            if ds in layout.sidecars:
                spec["sidecars"] = layout.sidecars[ds]
            if ds in layout.inputs:
                spec["input"] = layout.inputs[ds]
            specs.append(spec)
        return specs

    def _prompt_specs(self, run: RunConfig, hc: HostConfig) -> dict[str, dict[str, Any]]:
        """Dataset -> scan spec of its prompts file (its line count bounds the samples)."""
        specs = {}
        layout = layout_of(self.config, run, launch_argv(self.config, run))
        if clients.single_file(layout.profile):
            # A single-file client's input file bounds its one dataset.
            for ds, rel in layout.prompt_files.items():
                path = posixpath.normpath(posixpath.join(layout.workdir, rel))
                specs[ds] = {"path": path, "validate": "sample", "texts": False}
            return specs
        for ds in layout.datasets:
            ds_cfg = self.config.datasets.get(ds)
            if ds_cfg is None or not ds_cfg.prompts:
                continue
            workdir = os.path.expanduser(run.workdir) if hc.local else run.workdir
            prompts = os.path.expanduser(ds_cfg.prompts) if hc.local else ds_cfg.prompts
            path = posixpath.normpath(posixpath.join(workdir, prompts))
            specs[ds] = {"path": path, "validate": "sample", "texts": False}
        return specs

    def _runs_of(self, host_name: str) -> list[RunConfig]:
        return [r for r in self.config.runs if r.host == host_name]

    async def _refresh_host(self, name: str) -> HostView:
        hc = self.config.host(name)
        state = self._state[name]
        host = self._hosts[name]
        now = time.monotonic()
        if not host.connected and now < state.next_try:
            return self._stale(
                state, state.view.error or "disconnected", retry_in=state.next_try - now
            )
        runs = self._runs_of(name)
        files = [spec for run in runs for spec in self._file_specs(run, hc)]
        files += [spec for run in runs for spec in self._prompt_specs(run, hc).values()]
        files += list(state.discovered.values())
        params: dict[str, Any] = {**ps_params(self.config, hc), "files": files}
        if metrics_specs(self.config, name):
            params["metrics"] = metrics_specs(self.config, name)
        if not host.connected:  # a new agent scans every file from its first byte
            params["progress"] = True
        bound = hc.connect_timeout + hc.command_timeout + 5.0
        try:
            result, rtt = await asyncio.wait_for(self._ask(host, params, hc, runs), bound)
        except asyncio.TimeoutError:
            return self._failed(state, f"{name}: no answer within {bound:g}s")
        except RunwatchError as e:
            return self._failed(state, e.message)
        except (OSError, EOFError) as e:
            return self._failed(state, f"{name}: {e}")
        finally:
            self._provisional.pop(name, None)
        state.failures = 0
        state.next_try = 0.0
        view = self._build_view(hc, runs, result, rtt)
        state.view = view
        return view

    async def _ask(
        self, host: Host, params: dict[str, Any], hc: HostConfig, runs: list[RunConfig]
    ) -> tuple[dict[str, Any], float]:
        """The host's refresh reply and its round-trip time (connecting first when needed).

        Datasets of a run that is not in the config are known only once its process is listed:
        the first time one appears they are scanned at once with one more request."""
        if not host.connected:
            if params.get("progress") and isinstance(host, AgentHost) and hc.kind != "slurm":
                # The new agent counts the files' lines while it starts (the provisional counts).
                host.count_first = [spec["path"] for spec in params.get("files", [])]
            await host.connect()
        started = time.monotonic()
        if hc.kind == "slurm":
            from supervisor import slurm

            owned = slurm.owned_jobs(self.config, hc.name)
            state = self._state[hc.name]
            result = await slurm.refresh(host, params, hc.command_timeout, owned, state.jobs)
            if not result["notes"]:
                state.jobs = result["slurm"]
            return result, time.monotonic() - started
        if params.get("progress") and isinstance(host, AgentHost):
            reply = await AgentClient(host).refresh(
                **params,
                timeout=hc.command_timeout,
                on_progress=lambda msg: self._progressed(hc, runs, msg),
            )
            result = as_data(reply)
        else:
            result = as_data(await AgentClient(host).refresh(**params, timeout=hc.command_timeout))
        rtt = time.monotonic() - started
        scanned = result.setdefault("files", {})
        new: list[FileSpec] = []
        for raw in result.get("processes", []):
            p = msgspec.convert(raw, ProcessInfo)
            if self._match(hc, runs, p) is not None:
                continue
            for ds in p.flags.datasets:
                path = _process_dataset_path(self.config, p, ds)
                if path is not None and path not in scanned:
                    new.append({"path": path, "format": "raw", "validate": "sample"})
        if new:
            extra = await AgentClient(host).scan(files=new, timeout=hc.command_timeout)
            scanned.update(extra.get("files", {}))
        return result, rtt

    def _progressed(self, hc: HostConfig, runs: list[RunConfig], msg: dict[str, Any]) -> None:
        """A progress line of ``hc``'s refresh: a provisional snapshot to the listener."""
        last = self._provisional.get(hc.name, self._state[hc.name].view)
        paths = []
        for run in runs:
            # The datasets of the layout (a single-file client's one, the launch's --set ones).
            layout = layout_of(self.config, run, launch_argv(self.config, run))
            paths.append((run.name, list(layout.data_files.items())))
        self._provisional[hc.name] = provisional_view(
            last, msg, paths, lambda p: self._match(hc, runs, p)
        )
        listener = self._on_progress
        if listener is not None:
            hosts = [
                self._provisional.get(h.name, self._state[h.name].view) for h in self.config.hosts
            ]
            listener(Snapshot(time=time.time(), hosts=hosts))

    def _failed(self, state: _HostState, message: str) -> HostView:
        state.failures += 1
        delay = min(MAX_BACKOFF_S, 2.0 ** (state.failures - 1))
        state.next_try = time.monotonic() + delay
        return self._stale(state, message, retry_in=delay)

    def _stale(self, state: _HostState, message: str, retry_in: float) -> HostView:
        # A first scan cut short keeps the provisional counts it already showed (still marked
        # provisional): what a lost host shows never depends on how far its scan had got.
        last = self._provisional.get(state.view.name, state.view)
        view = msgspec.structs.replace(
            last,
            connected=False,
            stale=last.last_ok is not None,
            error=message,
            progress=None,
            # Nothing is known of a run on a host that does not answer: not "stopped".
            runs=[
                msgspec.structs.replace(r, state="unknown", state_detail="host unreachable")
                for r in last.runs
            ],
        )
        state.view = view
        return view

    # ------------------------------------------------------------------ building the view

    def _build_view(
        self, hc: HostConfig, runs: list[RunConfig], result: dict[str, Any], rtt: float
    ) -> HostView:
        procs = [msgspec.convert(p, ProcessInfo) for p in result.get("processes", [])]
        scanned: dict[str, dict[str, Any]] = result.get("files", {})
        taken: set[int] = set()
        run_views: list[RunView] = []
        candidates = assign_runs(procs, self.config, hc.name)
        if hc.only_own_runs:
            procs = own_only(procs, hc)
            candidates = {r: [p for p in c if p in procs] for r, c in candidates.items()}
        for p in procs:
            set_backend(p, self.config)
        jobs: dict[str, JobView] = {}
        foreign: dict[str, list[JobView]] = {}
        if hc.kind == "slurm":  # the Slurm helpers are imported for a Slurm host only
            from supervisor import slurm

            jobs, foreign = slurm.job_views(
                result.get("slurm"), slurm.owned_jobs(self.config, hc.name)
            )
        units: dict[str, UnitInfo] = {}
        for raw in result.get("units") or []:  # the newest first
            u = msgspec.convert(raw, UnitInfo, strict=False)
            units.setdefault(u.run, u)
        for run in runs:
            cands = candidates.get(run.name, [])
            taken.update(p.identity.pid for p in cands)
            # Two processes that could each be the run: neither is shown as it (ambiguous).
            proc = cands[0] if len(cands) == 1 else None
            job = jobs.get(run.name)
            run_ds = self.config.run_datasets(run)
            if proc is not None:
                flags = proc.flags
                profile = clients.client_of(self.config, run)
                if flags.client != profile.name:  # named by the run, not by its script
                    raw = clients.read_flags(
                        profile, proc.identity.argv, clients.all_scripts(self.config)
                    )
                    flags = msgspec.convert({**raw, "api_base": flags.api_base}, RunFlags)
            else:
                flags = _config_flags(self.config, run)
                flags.backend = run_backend(self.config, run.name) or flags.backend
            datasets = []
            layout = layout_of(self.config, run, launch_argv(self.config, run))
            prompt_specs = self._prompt_specs(run, hc)
            for ds, spec in zip(layout.data_files, self._file_specs(run, hc, layout), strict=True):
                scan = scanned.get(
                    spec["path"], {"path": spec["path"], "state": "error", "error": "not scanned"}
                )
                prompt_spec = prompt_specs.get(ds)
                prompts = _line_count(scanned.get(prompt_spec["path"])) if prompt_spec else None
                rows = _input_rows(scan)
                if rows is not None:
                    prompts = rows  # the input's rows as the client reads them (a JSON array too)
                alive = slurm.dataset_alive(job, ds, run_ds) if hc.kind == "slurm" else None
                datasets.append(
                    self._dataset_view(
                        hc.name, run, ds, scan, flags, proc, prompts=prompts, alive=alive
                    )
                )
            state: RunState
            if hc.kind == "slurm":
                state = slurm.run_state(job)
            elif len(cands) > 1:
                state = "ambiguous"
            elif proc is None:
                state = "stopped"
            elif proc.state.startswith("Z") and proc.unit is None:
                state = "zombie"
            else:
                # In a unit, a zombie leader whose threads or other members still run is running.
                state = "running"
            last_unit = units.get(run.name)
            held_by: Literal["cgroup", "token", "adopted"] | None = None
            if state == "running" and proc is not None:
                held_by = proc.unit.held_by if proc.unit is not None else "adopted"
            unit_note = None
            owner = None
            if state == "running" and proc is not None and proc.unit is not None:
                theirs = proc.unit
                if not theirs.mine or theirs.run != run.name:  # started on this run's files
                    owner = theirs
                    unit_note = theirs.held_text(proc.identity.pid)
            if (
                held_by == "adopted"
                and proc is not None
                and "identity" in proc.evidence.get(run.name, ())
            ):
                unit_note = (
                    "by file identity: it reaches the run's data files by another path (a bind "
                    "mount, a link) or works in their directory"
                )
            if state == "stopped" and last_unit is not None and last_unit.state == "running":
                # Its unit still holds processes that no listing could pin (they fork and exit
                # faster than a listing): the run is running, never "stopped".
                state, held_by = "running", last_unit.held_by
                unit_note = f"unit {last_unit.launch_id} has processes that could not be listed"
            if last_unit is not None and not last_unit.tracked and last_unit.state == "running":
                unit_note = (
                    "its unit's waiter was killed: a process that left the tree and dropped the "
                    "launch token cannot be found"
                )
            # This config's unit of another run writing this one's files (two runs that share
            # data files): this run is stopped, and the files are that run's, never torn.
            sibling = (
                next(
                    (
                        p
                        for p in procs
                        if p.unit is not None
                        and p.unit.mine
                        and p.unit.run != run.name
                        and "files" in p.evidence.get(run.name, ())
                    ),
                    None,
                )
                if state == "stopped"
                else None
            )
            if sibling is not None and sibling.unit is not None:
                unit_note = (
                    f"its data files are written by this config's run {sibling.unit.run!r} "
                    f"(pid {sibling.identity.pid}, unit {sibling.unit.launch_id})"
                )
            finished = (
                state == "stopped" and last_unit is not None and (last_unit.ending == "finished")
            )
            for dv in datasets:
                settle_missing(dv, finished)
                if state == "running" and proc is not None:
                    discount_in_flight(dv, proc.flags.concurrency)
            if state in ("stopped", "zombie") and sibling is None:  # no writer: a torn tail
                for dv in datasets:
                    if dv.state == "ok" and dv.partial_tail_bytes > 0:
                        dv.torn_tail = torn_tail_note(dv.path, dv.partial_tail_bytes)
            profile = clients.client_of(self.config, run)
            # Nothing is scanned for such a run: say so rather than show no datasets.
            detail = f"data files unknown: {layout.problem}" if layout.problem else None
            if detail is None and state == "stopped" and sibling is None:
                detail = ending_text(last_unit)
            detail = detail or unit_note
            if hc.kind == "slurm":  # a job that only carries the run's tag is not the run's
                detail = detail or slurm.not_ours(foreign.get(run.name, []))
            rv = RunView(
                name=run.name,
                host=hc.name,
                state=state,
                state_detail=detail,
                held_by=held_by,
                last_unit=last_unit,
                owner=owner,
                process=proc,
                datasets=datasets,
                job=job,
                candidates=[p.identity.pid for p in cands] if len(cands) > 1 else [],
                endpoint=run.endpoint,
                client=profile.name,
                budget_flag=profile.flags.budget[0] if profile.flags.budget else None,
                samples_flag=profile.flags.samples[0] if profile.flags.samples else None,
                script_sha256=self._launched_script(run),
            )
            alive = state == "running"
            now = self._now()
            self._live.moved_on(hc.name, rv, self._trackers, alive, now)
            self._live.run_rates(hc.name, rv, alive, now, started_at(proc, now))
            endpoint = self.config.endpoint(run.endpoint) if run.endpoint is not None else None
            rv.waste = rates.run_waste(rv, rates.CostInfo.from_endpoint(endpoint))
            run_views.append(rv)
        discovered: dict[str, dict[str, Any]] = {}
        for proc in procs:
            if proc.identity.pid in taken:
                continue
            name = (
                f"{_script_name(proc, clients.all_scripts(self.config))} (pid {proc.identity.pid})"
            )
            dsv = []
            for ds in proc.flags.datasets:
                path = _process_dataset_path(self.config, proc, ds)
                if path is None:
                    continue
                discovered[path] = {"path": path, "format": "raw", "validate": "sample"}
                found = scanned.get(path)
                if found is None:
                    continue
                pseudo = RunConfig(
                    name=name, host=hc.name, workdir=proc.cwd or "/", argv=list(proc.argv_masked)
                )
                dsv.append(
                    self._dataset_view(hc.name, pseudo, ds, found, proc.flags, proc, ours=False)
                )
            run_views.append(
                RunView(
                    name=name,
                    host=hc.name,
                    state="zombie" if proc.state.startswith("Z") else "running",
                    process=proc,
                    datasets=dsv,
                    configured=False,
                )
            )
        self._state[hc.name].discovered = discovered
        gpus, gpu_error = self._live.gpus(hc.name, result.get("gpu"), run_views, self._now())
        return HostView(
            name=hc.name,
            connected=True,
            stale=False,
            error=None,
            rtt_ms=round(rtt * 1000.0, 2),
            last_ok=time.time(),
            has_gpu=result.get("gpu") is not None,
            runs=run_views,
            processes=procs,
            endpoints=self._live.endpoints(hc.name, result.get("metrics"), self._now(), run_views),
            gpus=gpus,
            gpu_error=gpu_error,
            notes=list(result.get("notes") or []),
        )

    def _match(self, hc: HostConfig, runs: list[RunConfig], p: ProcessInfo) -> str | None:
        """The configured run ``p`` could be (``supervisor.hosts.match_run``: the one rule for
        every front end, on the evidence the host reported)."""
        return match_run(p, self.config, hc.name)

    def _dataset_view(
        self,
        host: str,
        run: RunConfig,
        dataset: str,
        scan: dict[str, Any],
        flags: RunFlags,
        proc: ProcessInfo | None,
        prompts: int | None = None,
        alive: bool | None = None,
        ours: bool = True,
    ) -> DatasetView:
        """``alive``: whether the dataset's writer runs (default: ``proc`` is alive). ``ours``:
        the dataset is a configured run's; a process the config does not know gets none of the
        ``[datasets.NAME]`` limits (a dataset of the same name elsewhere is not ours), only its
        own flags (``--token-budget``, ``--max-samples``)."""
        endpoint = self.config.endpoint(run.endpoint) if run.endpoint is not None else None
        tracker = self._live.dataset_tracker(self._trackers, host, str(scan.get("path") or dataset))
        now = self._now()
        counter = self._count_texts if scan.get("texts") else None
        problem = None
        if counter is not None:
            try:
                self._tokenizer_ready()
            except RunwatchError as e:
                counter, problem = None, e.message
        view = rates.build_dataset_view(
            scan,
            self.config.datasets.get(dataset) if ours else None,
            total_flags(self.config, flags, self._started_records(run, proc, scan)),
            tracker,
            rates.CostInfo.from_endpoint(endpoint),
            alive if alive is not None else proc is not None and not proc.state.startswith("Z"),
            now,
            name=dataset,
            stall_seconds=run.stall_seconds,
            prompts=prompts,
            count_texts=counter,
            budget_flag=engine_budget_flag(self.config, flags.client),
            writer=(proc.identity.pid, proc.identity.start_time) if proc is not None else None,
            writer_since=started_at(proc, now),
        )
        with_client_parts(view, scan)
        alive = proc is not None and not proc.state.startswith("Z")
        # Data loss is judged for this config's runs only (W20): another config's run is moved
        # aside or repaired by its own runwatch, whose audit records this one never reads.
        view.alarm = self._dataloss.observe(host, run.name, scan, alive) if ours else None
        if problem is not None and view.error is None:
            view.error = f"tokens not counted: {problem}"
        self._live.record_dataset(host, view, tracker, ours=ours)
        return view

    def _launched_script(self, run: RunConfig) -> str | None:
        """sha256 of the script of ``run``'s last confirmed launch (its launch spec), or None."""
        try:
            return launchspec.load(self.config.key, run.name).script_sha256
        except RunwatchError:
            return None

    def _started_records(
        self, run: RunConfig, proc: ProcessInfo | None, scan: dict[str, Any]
    ) -> int | None:
        """The records the dataset's file held when runwatch launched ``proc`` (None: it did
        not launch it, or does not know)."""
        profile = clients.profiles(self.config).get(proc.flags.client or "") if proc else None
        if proc is None or profile is None or profile.samples_scope != "invocation":
            return None
        try:
            started = launchspec.load(self.config.key, run.name).started
        except RunwatchError:
            return None
        if (
            started is None
            or started.pid != proc.identity.pid
            or started.start_time != proc.identity.start_time
        ):
            return None
        return started.records.get(str(scan.get("path") or ""))

    def _tokenizer_ready(self) -> None:
        if self._tokenizer is not None:
            return
        if self.config.tokenizer is None:
            raise ConfigError(
                "this format counts tokens with a tokenizer, but none is configured",
                "set tokenizer = DIR (a local tokenizer directory) in the config",
            )
        from supervisor.tokens import load_tokenizer

        self._tokenizer = load_tokenizer(
            self.config.tokenizer, trust_remote_code=self.config.trust_remote_code
        )

    def _count_texts(self, texts: list[str]) -> int:
        """Tokens of texts handed back by a scan (formats counted with the tokenizer)."""
        from supervisor.tokens import count_tokens

        self._tokenizer_ready()
        return sum(count_tokens(self._tokenizer, texts))


def signal_name(number: int) -> str:
    """``9, SIGKILL``: a signal's number and, where this system knows it, its name."""
    try:
        return f"{number}, {signal.Signals(number).name}"
    except ValueError:
        return str(number)


def ending_text(unit: UnitInfo | None) -> str | None:
    """How a stopped run's last launch ended, for its state: ``finished (exit 0)``, ``died
    (signal 9, SIGKILL)``, ``stopped by runwatch``; None when runwatch did not launch it."""
    if unit is None or unit.ending is None:
        return None
    ex = unit.exit
    if unit.ending == "lost":
        return "exit unknown (its waiter ended first)"
    if unit.ending == "stopped":
        return "stopped by runwatch"
    assert ex is not None
    how = f"signal {signal_name(ex.signal)}" if ex.signal is not None else f"exit {ex.code}"
    if ex.failed is not None and ex.code == 0 and ex.signal is None:
        what = ex.failed.get("signal")
        how += f"; its process {ex.failed.get('pid')} " + (
            f"died of signal {signal_name(what)}"
            if what is not None
            else f"exited {ex.failed.get('code')}"
        )
    return f"{unit.ending} ({how})"


def torn_tail_note(path: str, partial_bytes: int) -> str:
    """What a stopped run's partial last line is and what the ``data-repair`` step of the next
    launch or restart does with it (``supervisor.agent.datafiles.repair_tail``)."""
    return (
        f"torn last line: {display.count(partial_bytes)} bytes, no final newline (the run "
        "stopped mid-record); the next launch or restart cuts it off, keeping a byte-identical "
        f"copy in {posixpath.basename(path)}.broken"
    )


def _input_rows(scan: dict[str, Any]) -> int | None:
    """The distinct rows of the run's input as its completeness read them, or None."""
    c = scan.get("completeness")
    if not isinstance(c, dict) or c.get("error") is not None:
        return None
    rows = c.get("input")
    return rows if isinstance(rows, int) else None


def _line_count(scan: dict[str, Any] | None) -> int | None:
    if scan is None or scan.get("state") != "ok":
        return None
    lines = scan.get("lines")
    return int(lines) if isinstance(lines, int) else None


def _config_flags(config: Config, run: RunConfig) -> RunFlags:
    """The flags of the argv the run's next launch uses (its configured argv with its stored
    launch spec: a budget set by a restart holds for the stopped run too), read with its client
    profile."""
    profile = clients.client_of(config, run)
    raw = clients.read_flags(profile, launch_argv(config, run), clients.all_scripts(config))
    return msgspec.convert(raw, RunFlags)


def _script_name(proc: ProcessInfo, scripts: list[str]) -> str:
    argv = list(proc.identity.argv)
    idx = script_index(argv, scripts)
    return posixpath.basename(argv[idx]) if idx is not None else (argv[0] if argv else "?")


def _process_dataset_path(config: Config, proc: ProcessInfo, dataset: str) -> str | None:
    """The data file of ``dataset`` of a process no run owns, as its client resolves it: its
    output dir flag, else its profile's default (neither: None, not a guess)."""
    if not proc.cwd or bad_name(dataset) is not None:
        return None
    profile = clients.profiles(config).get(proc.flags.client or "")
    out = proc.flags.output_dir
    if out is None and profile is not None:
        out = clients.default_of(profile, "output_dir")
    if out is None:
        return None
    data_file = profile.data_file if profile is not None else "raw_responses.jsonl"
    return client_path(proc.cwd, posixpath.join(out, dataset, data_file))


async def run_once(config: Config, action: Callable[[Engine], Awaitable[T]]) -> T:
    """Open an Engine, run ``action`` on it, close it (for CLI commands)."""
    engine = Engine(config)
    try:
        return await action(engine)
    finally:
        await engine.aclose()


def run_sync(config: Config, action: Callable[[Engine], Awaitable[T]]) -> T:
    """``asyncio.run(run_once(config, action))``."""
    return asyncio.run(run_once(config, action))


# ---------------------------------------------------------------------- without a host of its own


async def bench(
    config: Config | None,
    endpoint_or_url: str,
    *,
    options: BenchOptions | None = None,
    prompts: str | None = None,
    max_tokens: int | None = None,
    api_key_env: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    save: bool = True,
    tokenizer: Tokenizer | None = None,
) -> BenchResult:
    """Measure an endpoint (a config endpoint's name, or a URL with ``config`` None) with the
    runs' own prompts; the result is appended to the bench history (``save``). See
    ``supervisor.bench.runner``."""
    from supervisor.bench.runner import run_bench

    return await run_bench(
        config,
        endpoint_or_url,
        prompts=prompts,
        options=options,
        max_tokens=max_tokens,
        api_key_env=api_key_env,
        progress=progress,
        save=save,
        tokenizer=tokenizer,
    )


async def gather_comparison(
    config: Config, *, sample_s: float = 0.0, engine: Engine | None = None
) -> Comparison:
    """Refresh the hosts (through ``engine``, else an engine of its own) and compare: where
    should the rest run (``supervisor.compare.gather_comparison``)."""
    from supervisor.compare import gather_comparison as gather

    if engine is not None:
        return await gather(config, engine=engine, sample_s=sample_s)
    async with Engine(config) as own:
        return await gather(config, engine=own, sample_s=sample_s)


class ScanProgress(Protocol):
    """Shows how far the scan of one file is, then goes away."""

    def __call__(self, done: int, total: int) -> None: ...

    def close(self) -> None: ...


def scan_local_files(
    files: list[str],
    fmt: str | None,
    validate: str,
    profile: dict[str, Any] | None,
    tokenizer: Tokenizer | None = None,
    texts: bool = True,
    progress: Callable[[str], ScanProgress] | None = None,
) -> list[dict[str, Any]]:
    """Cold-scan each local file to its end with the agent's scanner, run here (one result per
    file, as the agent's ``scan`` op gives it); a tokenizer format's completion tokens are
    counted with ``tokenizer`` (answers and reasoning alike, as the dashboard counts them), else
    None. ``progress(path)`` makes what shows the scan of ``path``."""
    from supervisor.agent.scan import Scanner
    from supervisor.tokens import count_tokens

    scanner = Scanner()
    results = []
    for path in files:
        shown = progress(path) if progress is not None else None
        extra = 0
        try:
            while True:
                r = scanner.scan(
                    path, fmt, validate=validate, profile=profile, texts=texts, progress=shown
                )
                counted = [*(r.get("texts") or []), *(r.get("reasoning_texts") or [])]
                if tokenizer is not None and counted:
                    extra += sum(count_tokens(tokenizer, counted))
                if not r.get("texts_more"):
                    break
        finally:
            if shown is not None:
                shown.close()
        if r.get("token_source") == "tokenizer":
            r["completion_tokens"] = extra if tokenizer is not None else None
        results.append(r)
    return results


def client_profiles(config: Config) -> list[dict[str, Any]]:
    """Every client profile (built-in and configured) as ``runwatch clients --json`` shows it."""
    return [{**i.as_dict(), "name": i.name} for i in clients.list_clients(config)]


def client_lines(config: Config) -> list[list[str]]:
    """Every client profile as lines for humans, one list per profile."""
    return [clients.describe(i) for i in clients.list_clients(config)]


def total_flags(config: Config, flags: RunFlags, started: int | None) -> RunFlags:
    """The run's flags with its sample flag as a bound on the dataset's records. A client whose
    sample flag counts this invocation's rows after those its resume skipped (SpecForge's
    ``--num-samples``) stops at the records its file held when it started (``started``) plus its
    flag; when that is not known (a run started by hand with its resume flag) there is no bound:
    never ``47/40 done`` while the script makes 40 more."""
    profile = clients.profiles(config).get(flags.client or "")
    if (
        profile is None
        or profile.samples_scope != "invocation"
        or flags.max_samples is None
        or not (flags.resume or profile.resume == "always")
    ):
        return flags
    total = None if started is None else started + flags.max_samples
    return msgspec.structs.replace(flags, max_samples=total)


def engine_budget_flag(config: Config, client: str | None) -> str | None:
    """The token-budget flag of a client profile (None: it has none); no name: the reference's."""
    profile = clients.profiles(config).get(client or "", clients.BUILTIN_CLIENTS["run_inference"])
    return profile.flags.budget[0] if profile.flags.budget else None


def audit_records(limit: int | None = None, config: str | None = None) -> list[dict[str, Any]]:
    """The audit log's records, oldest first (the last ``limit`` when given), of the config
    ``config`` (its ``Config.key``; None: every record)."""
    return audit.read(limit=limit, config=config)


def set_origin(origin: str) -> None:
    """Name the front end this process acts from; every audit record says who acted and from
    where (``supervisor.audit.set_origin``)."""
    audit.set_origin(origin)


def audit_line(record: dict[str, Any]) -> str:
    """One audit record as one line for humans."""
    return audit.format_record(record)


def audit_location() -> str:
    """Where the audit log is kept."""
    return str(audit.audit_path())


def refuse_foreign(process: ProcessInfo, host: str) -> None:
    """Raise KillRefused when ``process`` is in a unit another config launched: that config
    stops it, so its unit, watcher and audit log record a stop, not a death."""
    theirs = process.unit
    if theirs is None or theirs.mine:
        return
    raise KillRefused(
        f"pid {process.identity.pid} on {host} is another config's run{theirs.owner()}; "
        "nothing was stopped",
        "stop it through the config that launched it: its unit, watcher and audit log then "
        "record a stop, not a death",
    )


def refuse_held_elsewhere(process: ProcessInfo, host: str, run: str, config: Config) -> None:
    """Raise KillRefused when ``process`` is ``run`` only as another run's unit started on its
    data files (``RunView.owner``): another config's (:func:`refuse_foreign`), or this config's
    under another name, stopped by that name or, once the config has none, by its pid."""
    theirs = process.unit
    if theirs is None or (theirs.mine and theirs.run == run):
        return
    refuse_foreign(process, host)
    named = theirs.run in {r.name for r in config.runs}
    how = f"kill {shlex.quote(theirs.run)}" if named else f"kill --pid {process.identity.pid}"
    raise KillRefused(
        f"pid {process.identity.pid} on {host} is unit {theirs.launch_id} of run "
        f"{theirs.run!r}, started on {run}'s data files; nothing was stopped",
        f"stop it as that run: `{command_prefix(config)} {how}`",
    )


__all__ = [
    "BUILTIN_FORMATS",
    "EVENTS_KEPT",
    "EVENT_KINDS",
    "MAX_BACKOFF_S",
    "Action",
    "ActionResult",
    "Alerter",
    "BenchOptions",
    "BenchResult",
    "BudgetEvent",
    "Comparison",
    "Delivery",
    "Engine",
    "Event",
    "EventTracker",
    "GuardOutcome",
    "HostError",
    "KillReport",
    "KillResult",
    "LatestSamples",
    "LevelResult",
    "LogTail",
    "OnStep",
    "Plan",
    "PlanBusy",
    "Rebalance",
    "SamplePreview",
    "ScanProgress",
    "Step",
    "Supervision",
    "Tick",
    "Tokenizer",
    "apply_rebalance",
    "assign_runs",
    "audit_line",
    "audit_location",
    "audit_records",
    "bench",
    "comparison_from",
    "completeness_line",
    "count_tokens",
    "describe_job",
    "describe_rebalance",
    "explain_file",
    "format_lines",
    "gather_comparison",
    "gather_rebalance",
    "hold_plan_lock",
    "is_url",
    "load_history",
    "load_tokenizer",
    "mask_argv",
    "mask_url",
    "moved_key",
    "parse_deadline",
    "parse_sets",
    "parse_unsets",
    "pending_plan",
    "plan_rebalance",
    "refuse_foreign",
    "refuse_held_elsewhere",
    "resume_rebalance",
    "run_files",
    "run_once",
    "run_sync",
    "scan_local_files",
    "scan_notes",
    "set_origin",
    "sidecar_line",
    "start_refused_event",
    "stop_key",
]
