"""Events: what changed in the fleet that a person should be told about, with the command that acts.

One detector for every front end: ``runwatch watch`` turns events into alerts, the dashboard into
notifications and its events panel. ``EventTracker(config).update(snapshot, expected_stops)``
returns the events of one refresh:

- conditions, reported once when they start and again only after they have cleared: a dataset
  over its budget (while its writer runs without ``--token-budget``), projected waste above a
  threshold, stalled, duplicate ids, all done, host lost (its clearing is ``host-back``);
- transitions between two refreshes, from facts: a run seen running is gone and it ``finished``
  (exit 0, or every dataset done) or died (a non-zero or signalled exit, or unknown, with its
  datasets not done), unless it was stopped through runwatch (its unit says ``stopped``;
  ``expected_stops`` holds :func:`stop_key` keys of processes runwatch stopped and
  :func:`busy_key` keys of runs an action holds now); a dataset done, once per figure with its
  final figure (see :meth:`EventTracker._done`); a data file shrank; a run's Slurm job requeued
  (the same job id and nonce listed with another submit time: ``job-requeued``, once per
  requeue).

Stops through runwatch from any front end are ``stopped`` events made from their audit records
(:func:`audited_stop_event`: who and from where); a restart a previous watcher intended and this
one cannot keep is ``restart-abandoned`` (:func:`abandoned_event`).

A host that does not answer keeps its conditions as they were (nothing clears, nothing fires on
stale values). With ``report_initial=False`` (the dashboard) the conditions already true at the
first refresh are taken as known and not reported; ``runwatch watch`` reports problems found at
start, but not datasets already done (nor all done).

Events of actions are made by ``guard.budget_event`` (the budget policy's) and
:func:`restart_event` (automatic restarts); a start the gate refused (a rollback, a restart on
failure: it would overwrite the run's output) is a critical ``start-refused`` naming the command
that starts the run keeping its output (:func:`start_refused_event`).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import msgspec

from supervisor.agent.slurm import split_tag
from supervisor.config import AlertsConfig, Config, command_prefix
from supervisor.errors import RunwatchError
from supervisor.model import DatasetView, HostView, JobView, ProcessInfo, RunView, Snapshot
from supervisor.secrets import mask_text

if TYPE_CHECKING:
    from supervisor.plan import ActionResult

Severity = Literal["info", "warning", "critical"]
EventKind = Literal[
    "run-died",
    "finished",
    "stopped",
    "stalled",
    "over-budget",
    "waste",
    "dataset-done",
    "all-done",
    "host-lost",
    "host-back",
    "restart-done",
    "restart-failed",
    "restart-rolled-back",
    "restart-gave-up",
    "restart-abandoned",
    "start-refused",
    "budget-policy",
    "duplicates",
    "data-shrank",
    "config-reloaded",
    "config-refused",
    "job-requeued",
]
EVENT_KINDS: tuple[str, ...] = get_args(EventKind)
SEVERITIES: tuple[str, ...] = get_args(Severity)
EVENTS_KEPT = 1000
"""Events (and alert deliveries) a long-lived front end keeps in memory: the newest; it runs for
days, and the ones before are in its output, the alerts sent and the audit log."""
QUIET_AT_START = ("all-done",)
"""Conditions true at the first refresh that ``runwatch watch`` does not report (old news)."""


def severity_rank(severity: str) -> int:
    """0 for info, 1 warning, 2 critical."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else 0


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """One thing that happened, where, how serious, and the command that acts on it."""

    kind: EventKind
    severity: Severity
    host: str
    run: str | None = None
    dataset: str | None = None
    title: str
    """Short: the run (``eagle3-kimi``), the run and dataset (``eagle3-kimi B2``) or the host."""
    message: str
    command: str | None = None
    """The exact command that acts on it (``runwatch kill eagle3-kimi``)."""
    key: str
    """Names the condition or transition; an alert is sent once per key until it clears."""
    time: float
    lines: list[str] = []
    """Extra lines: the last lines of a dead run's log."""

    def __post_init__(self) -> None:
        # Every event is shown, written and sent: its texts are masked once, here.
        for name in ("title", "message", "command"):
            value = getattr(self, name)
            if value:
                msgspec.structs.force_setattr(self, name, mask_text(value))
        if self.lines:
            msgspec.structs.force_setattr(self, "lines", [mask_text(x) for x in self.lines])

    def text(self) -> str:
        """One line for humans: ``CRITICAL eagle3-kimi: Run died ... -> runwatch launch ...``."""
        act = f"  -> {self.command}" if self.command else ""
        return f"{self.severity.upper()} {self.title}: {self.message}{act}"


def moved_key(path: str) -> str:
    """The key, among the expected changes, of a data file runwatch itself moved aside: the new
    file at its path is smaller, and that is no data loss."""
    return f"moved|{path}"


def busy_key(host: str, run: str) -> str:
    """The key, among the expected stops, of a run an action holds (its lock, see
    ``supervisor.runlock``): a stop may be under way, its audit record not written yet."""
    return f"busy|{host}/{run}"


def stop_key(host: str, run: str, pid: int) -> str:
    """Names one process of one run: ``host/run#pid`` (a deliberate stop is keyed by this)."""
    return f"{host}/{run}#{pid}"


STOPS = ("max_samples", "token_budget", "prompts")
"""The stop conditions of a dataset a client enforces itself (``Projection.etas``)."""


def dataset_done(ds: DatasetView) -> bool:
    """True when a dataset reached a stop condition (its samples, its budget or its prompts),
    whether its writer still runs or not (a stopped writer has no ETA, but the condition it
    reached is still in ``projection.etas``)."""
    if ds.state != "ok":
        return False
    done = ds.unique_ids or ds.records
    reached = any(ds.projection.etas.get(stop) == 0 for stop in STOPS)
    return reached or ds.projection.eta_s == 0 or bool(ds.max_samples and done >= ds.max_samples)


def run_done(run: RunView) -> bool:
    """True when every dataset of a run is done (a run that exits then has finished)."""
    return bool(run.datasets) and all(dataset_done(d) for d in run.datasets)


@dataclass
class Thresholds:
    """When projected waste or a quiet file becomes an event (``[alerts]`` of the config)."""

    waste_tokens: int | None = None
    waste_usd: float | None = None
    stall_multiple: float = 0.0

    @classmethod
    def of(cls, alerts: AlertsConfig) -> Thresholds:
        return cls(alerts.waste_tokens, alerts.waste_usd, alerts.stall_multiple)


class EventTracker:
    """Turns successive snapshots into events; see the module docstring."""

    def __init__(
        self,
        config: Config,
        *,
        report_initial: bool = True,
        thresholds: Thresholds | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.report_initial = report_initial
        self.thresholds = thresholds or Thresholds.of(config.alerts)
        self._prefix = command_prefix(config)
        self._clock = clock
        self._active: dict[str, str] = {}
        """Condition key -> its host."""
        self._running: dict[tuple[str, str], ProcessInfo] = {}
        """The process each configured run was last seen running as."""
        self._records: dict[tuple[str, str, str], int] = {}
        self._launch: dict[tuple[str, str], str] = {}
        """The launch (pid and start time) each configured run was last seen running as."""
        self._jobs: dict[tuple[str, str], JobView] = {}
        """The Slurm job each configured run was last seen with."""
        self._done_figure: dict[tuple[str, str, str], tuple[int, int]] = {}
        """The figure each dataset's last ``dataset-done`` gave (responses, tokens)."""
        self._started = False

    def reconfigure(self, config: Config) -> None:
        """Go on with ``config``: its thresholds, and the runs it no longer has forgotten (a run
        dropped and added again starts afresh, never "died" for having left the config)."""
        self.config = config
        self.thresholds = Thresholds.of(config.alerts)
        names = {r.name for r in config.runs}
        for table in (self._running, self._launch, self._jobs):
            for key in [k for k in table if k[1] not in names]:
                del table[key]
        for rkey in [k for k in self._records if k[1] not in names]:
            del self._records[rkey]
        for dkey in [k for k in self._done_figure if k[1] not in names]:
            del self._done_figure[dkey]

    def active(self) -> set[str]:
        """Keys of the conditions true now (kept as they were for hosts that did not answer)."""
        return set(self._active)

    def cmd(self, *args: str) -> str:
        return " ".join([self._prefix, *(shlex.quote(a) for a in args)])

    def _budget_fix(self, run: RunView, budget: int | None) -> str:
        """What holds a run to its budget: a restart setting its client's budget flag, or, for a
        client without one (SpecForge, Model-Optimizer), stopping it (``budget_policy = 'stop'``
        does it at the budget)."""
        flag = run.budget_flag
        if flag is None:
            return self.cmd("kill", run.name)
        return self.cmd("restart", run.name, "--set", f"{flag.lstrip('-')}={budget or 'N'}")

    def update(self, snapshot: Snapshot, expected_stops: Container[str] = ()) -> list[Event]:
        """The events from the previous snapshot to ``snapshot`` (conditions that started,
        transitions); the first call reports conditions only (see ``report_initial``)."""
        now = self._clock()
        first = not self._started
        self._started = True
        conditions: dict[str, Event] = {}
        answered = {h.name for h in snapshot.hosts if h.connected and not h.stale}
        for host in snapshot.hosts:
            conditions.update(self._conditions(host, now))
        if answered and self._all_done(snapshot):
            ev = Event(
                kind="all-done",
                severity="info",
                host="*",
                title="all done",
                message="every dataset of every configured run is done",
                command=self.cmd("status"),
                key="all-done",
                time=now,
            )
            conditions[ev.key] = ev
        events: list[Event] = []
        for key, ev in conditions.items():
            if key in self._active:
                continue
            if first and (not self.report_initial or ev.kind in QUIET_AT_START):
                continue
            events.append(ev)
        # Conditions of hosts that did not answer stay as they were.
        kept = {k: h for k, h in self._active.items() if h not in answered and h != "*"}
        for key, name in self._active.items():
            if key.startswith("host-lost|") and key not in conditions:
                events.append(
                    Event(
                        kind="host-back",
                        severity="info",
                        host=name,
                        title=name,
                        message="Host is back.",
                        command=self.cmd("status"),
                        key=f"host-back|{name}",
                        time=now,
                    )
                )
        self._active = {**kept, **{k: e.host for k, e in conditions.items()}}
        for host in snapshot.hosts:
            if host.name in answered:
                events.extend(self._transitions(host, expected_stops, now, first))
        return events

    # ------------------------------------------------------------------ conditions

    def _conditions(self, host: HostView, now: float) -> dict[str, Event]:
        out: dict[str, Event] = {}
        if not host.connected:
            why = f": {host.error}" if host.error else ""
            shown = " Showing its last values." if host.stale else ""
            ev = Event(
                kind="host-lost",
                severity="critical",
                host=host.name,
                title=host.name,
                message=f"Host lost{why}.{shown}",
                command=self.cmd("ps", host.name),
                key=f"host-lost|{host.name}",
                time=now,
            )
            out[ev.key] = ev
            return out
        if host.stale:
            return out
        for run in host.runs:
            if not run.configured:
                continue
            for ds in run.datasets:
                for ev in self._dataset_conditions(host.name, run, ds, now):
                    out[ev.key] = ev
        return out

    def _dataset_conditions(
        self, host: str, run: RunView, ds: DatasetView, now: float
    ) -> Iterable[Event]:

        def event(kind: EventKind, severity: Severity, message: str, command: str) -> Event:
            return Event(
                kind=kind,
                severity=severity,
                host=host,
                run=run.name,
                dataset=ds.name,
                title=f"{run.name} {ds.name}",
                message=message,
                command=command,
                key=f"{kind}|{host}|{run.name}|{ds.name}",
                time=now,
            )

        writing = run.state == "running"
        budget = ds.token_budget
        # A run with --token-budget stops each dataset at it (a few in-flight responses over).
        unenforced = run.process is not None and run.process.flags.token_budget is None
        fix = self._budget_fix(run, budget)
        if writing and unenforced and ds.over_budget:
            # The dataset's own figure, then the whole run's, with its time and cost.
            whole = f"; {run.waste.message}" if run.waste is not None else ""
            yield event(
                "over-budget",
                "warning",
                (ds.projection.message or "past its token budget") + whole,
                fix,
            )
        t = self.thresholds
        waste, cost = ds.projection.waste_tokens, ds.projection.waste_cost_usd
        if writing and (
            (t.waste_tokens is not None and waste > t.waste_tokens)
            or (t.waste_usd is not None and cost is not None and cost > t.waste_usd)
        ):
            usd = f" (${cost:,.2f})" if cost is not None else ""
            yield event(
                "waste",
                "warning",
                f"projected {waste:,} tokens{usd} past its budget",
                fix,
            )
        if writing and self._stalled(ds):
            yield event(
                "stalled",
                "warning",
                f"No new responses for {ds.idle_s:.0f} s while it runs: stalled.",
                self.cmd("restart", run.name),
            )
        if ds.duplicates:
            yield event(
                "duplicates",
                "warning",
                f"{ds.duplicates} duplicate sample ids in {ds.path}",
                self.cmd("check", run.name),
            )

    def _stalled(self, ds: DatasetView) -> bool:
        if ds.stalled:
            return True
        multiple = self.thresholds.stall_multiple
        rate = ds.rates.req_per_s_10m or ds.rates.req_per_s_all
        return bool(multiple > 0 and rate and ds.state == "ok" and ds.idle_s > multiple / rate)

    def _all_done(self, snapshot: Snapshot) -> bool:
        runs = [r for h in snapshot.hosts for r in h.runs if r.configured]
        answered = all(h.connected and not h.stale for h in snapshot.hosts)
        return answered and bool(runs) and all(run_done(r) for r in runs)

    # ------------------------------------------------------------------ transitions

    def _transitions(
        self, host: HostView, expected_stops: Container[str], now: float, first: bool
    ) -> Iterable[Event]:
        for run in host.runs:
            if not run.configured:
                continue
            key = (host.name, run.name)
            was = self._running.get(key)
            if run.state == "running" and run.process is not None:
                self._running[key] = run.process
                ident = run.process.identity
                self._launch[key] = f"{ident.pid}@{ident.start_time}"
            elif run.state in ("stopped", "zombie"):
                self._running.pop(key, None)
                if was is not None:
                    yield from self._ended(host.name, run, was, expected_stops, now)
            yield from self._requeued(host.name, run, now)
            yield from self._done(host.name, run, now, first)
            for ds in run.datasets:
                rkey = (host.name, run.name, ds.path)
                before = self._records.get(rkey)
                if ds.state == "ok":
                    self._records[rkey] = ds.records
                moved = moved_key(ds.path) in expected_stops
                if not first and before is not None and ds.state == "ok" and ds.records < before:
                    if moved:  # runwatch moved it aside itself (a restart's --move-aside)
                        continue
                    yield Event(
                        kind="data-shrank",
                        severity="critical",
                        host=host.name,
                        run=run.name,
                        dataset=ds.name,
                        title=f"{run.name} {ds.name}",
                        message=f"{ds.path} shrank from {before:,} to {ds.records:,} records",
                        command=self.cmd("check", run.name),
                        key=f"data-shrank|{host.name}|{run.name}|{ds.name}|{now}",
                        time=now,
                    )

    def _ended(
        self, host: str, run: RunView, was: ProcessInfo, expected: Container[str], now: float
    ) -> Iterable[Event]:
        """A run seen running is gone: stopped through runwatch (no event here: the stop's own
        event says who stopped it), finished by itself, or died.

        Facts first: a run runwatch launched says how it ended (its waiter recorded the exit):
        ``stopped`` means runwatch asked it to stop, from any front end. A stop through runwatch
        is also known from the audit log (``expected``: :func:`stop_key`) and, while the stop is
        still under way, from the run's lock (:func:`busy_key`). A run died only when its exit
        was non-zero or a signal (or unknown) and its datasets are not all done."""
        ending = run.ending
        deliberate = (
            ending == "stopped"
            or stop_key(host, run.name, was.identity.pid) in expected
            or busy_key(host, run.name) in expected
        )
        if deliberate and ending != "died":
            return
        if ending == "finished" or run_done(run):
            yield self._finished(host, run, was, now)
            return
        yield self._died(host, run, was, now)

    def _finished(self, host: str, run: RunView, was: ProcessInfo, now: float) -> Event:
        how = run.state_detail if run.ending in ("finished", "died") else None
        done = "every dataset done" if run_done(run) else "datasets not all done"
        clean = run.ending in (None, "finished")
        return Event(
            kind="finished",
            severity="info" if clean else "warning",
            host=host,
            run=run.name,
            title=run.name,
            message=f"Run finished by itself (pid {was.identity.pid}) on {host}"
            + (f": {how}" if how else "")
            + f", {done}.",
            command=self.cmd("status", run.name),
            key=f"finished|{host}|{run.name}|{was.identity.pid}",
            time=now,
        )

    def _requeued(self, host: str, run: RunView, now: float) -> Iterable[Event]:
        """``job-requeued`` when the run's job is listed again under its id and nonce with another
        submit time (``scontrol requeue``, a node failure): still the run's job, submitted anew."""
        job, key = run.job, (host, run.name)
        was = self._jobs.get(key)
        if job is None:
            return
        self._jobs[key] = job
        nonce = split_tag(job.tag)[1]
        if (
            was is None
            or nonce is None
            or (was.job_id, split_tag(was.tag)[1]) != (job.job_id, nonce)
            or was.submit_time is None
            or job.submit_time is None
            or was.submit_time == job.submit_time
        ):
            return
        then, again = (time.strftime("%H:%M:%S", time.localtime(t))
                       for t in (was.submit_time, job.submit_time))  # fmt: skip
        yield Event(
            kind="job-requeued",
            severity="warning",
            host=host,
            run=run.name,
            title=run.name,
            message=f"Slurm job {job.job_id} was requeued on {host}: submitted again at {again} "
            f"(first at {then}), now {job.state}; it is still the run's job.",
            command=self.cmd("status", run.name),
            key=f"job-requeued|{host}|{run.name}|{job.job_id}|{job.submit_time}",
            time=now,
        )

    def _done(self, host: str, run: RunView, now: float, first: bool) -> Iterable[Event]:
        """``dataset-done`` once per dataset and launch, with its final figure: when its writer
        is gone, or (a client that goes on with other datasets) when the file has been quiet for
        the run's ``stall_seconds`` (responses in flight at the stop condition still land). A
        relaunch that adds nothing to a done dataset is not news again."""
        launch = self._launch.get((host, run.name))
        if launch is None and run.last_unit is not None:
            launch = run.last_unit.launch_id
        try:
            settle = self.config.run(run.name).stall_seconds
        except RunwatchError:  # a run the config does not name: the default
            settle = 300.0
        for ds in run.datasets:
            if not dataset_done(ds):
                continue
            if run.state == "running" and ds.idle_s < settle:
                continue
            figure = (ds.unique_ids or ds.records, ds.completion_tokens)
            dkey = (host, run.name, ds.path)
            if self._done_figure.get(dkey) == figure:
                continue
            self._done_figure[dkey] = figure
            if first:
                continue  # done before this watcher started: old news
            yield Event(
                kind="dataset-done",
                severity="info",
                host=host,
                run=run.name,
                dataset=ds.name,
                title=f"{run.name} {ds.name}",
                message=f"done: {figure[0]:,} responses, {figure[1]:,} tokens",
                command=self.cmd("status"),
                key=f"dataset-done|{host}|{run.name}|{ds.name}|{launch}|{figure[0]}",
                time=now,
            )

    def _died(self, host: str, run: RunView, was: ProcessInfo, now: float) -> Event:
        unit = run.last_unit
        ours = unit is not None and was.unit is not None and was.unit.launch_id == unit.launch_id
        if run.state == "zombie":
            state = "a zombie (exit not collected)"
        elif ours and run.ending in ("died", "lost") and run.state_detail:
            # "died (signal 9, SIGKILL)", "exit unknown (its waiter ended first)": as the waiter
            # of this very launch recorded it.
            state = run.state_detail
        elif ours:
            state = "gone, how it ended unknown (its waiter's record not read yet)"
        else:
            # Not a process runwatch started (the run's last unit, if any, is an earlier
            # launch's): nothing recorded how it ended, and it is not guessed.
            state = "gone, how it ended unknown (runwatch did not start it: no exit recorded)"
        return Event(
            kind="run-died",
            severity="critical",
            host=host,
            run=run.name,
            title=run.name,
            message=f"Run stopped (pid {was.identity.pid}) on {host}: {state}, "
            "not stopped through runwatch, datasets not done.",
            command=self.cmd("launch", run.name),
            key=f"run-died|{host}|{run.name}|{was.identity.pid}",
            time=now,
        )


def with_lines(event: Event, lines: list[str]) -> Event:
    """``event`` with ``lines`` (a log tail) attached."""
    return msgspec.structs.replace(event, lines=list(lines))


def restart_event(
    config: Config, host: str, run: str, result: ActionResult | None, detail: str
) -> Event:
    """The event of an automatic restart: done, failed, rolled back (the launch failed and the
    previous command line was put back), or refused by the gate (``start-refused``, naming the
    command that starts the run keeping its output)."""
    prefix = command_prefix(config)
    now = time.time()
    if result is not None and result.ok:
        pid = (result.identity or {}).get("pid")
        return Event(
            kind="restart-done",
            severity="info",
            message=f"Restarted automatically (on_exit = restart): pid {pid}. {detail}".strip(),
            command=f"{prefix} audit",
            key=f"restart-done|{host}|{run}|{pid}",
            host=host,
            run=run,
            title=run,
            time=now,
        )
    failed = result.failed_step if result is not None else None
    resume = failed.data.get("resume_command") if failed is not None else None
    rollback = (result.rollback if result is not None else None) or {}
    if rollback.get("refused"):
        resume = rollback.get("command")
    if isinstance(resume, str):
        return start_refused_event(
            host,
            run,
            f"Automatic restart refused: {detail}. Not restarted again: the run stays stopped "
            "until started with the command below.",
            resume,
        )
    rolled = bool(rollback.get("ok"))
    kind: EventKind = "restart-rolled-back" if rolled else "restart-failed"
    return Event(
        kind=kind,
        severity="critical",
        message=f"Automatic restart failed: {detail}",
        command=f"{prefix} launch {shlex.quote(run)}",
        key=f"{kind}|{host}|{run}|{now}",
        host=host,
        run=run,
        title=run,
        time=now,
    )


def audited_restart_event(config: Config, record: dict[str, Any]) -> Event | None:
    """The event of a restart made by someone else (``runwatch restart``, the dashboard, a
    restart-with-budget), from its audit record: done, failed or rolled back."""
    if record.get("action") != "restart":
        return None
    host, run = str(record.get("host")), str(record.get("run"))
    steps = [s for s in record.get("steps") or [] if isinstance(s, dict)]
    ident = record.get("identity") if isinstance(record.get("identity"), dict) else {}
    prefix = command_prefix(config)
    failed = next((s for s in steps if s.get("ok") is False), None)
    rollback = record.get("rollback")
    rolled = isinstance(rollback, dict) and bool(rollback.get("ok"))
    where = f" at {failed.get('name')}: {failed.get('detail')}" if failed else ""
    if isinstance(rollback, dict) and rollback.get("refused") and rollback.get("command"):
        return start_refused_event(
            host,
            run,
            f"Restart failed{where}\n{rollback.get('detail')}",
            str(rollback["command"]),
            float(record.get("time") or time.time()),
        )
    kind: EventKind
    severity: Severity
    if record.get("ok"):
        kind, severity = "restart-done", "info"
        message = f"Restarted: pid {(ident or {}).get('pid')}"
    else:
        kind = "restart-rolled-back" if rolled else "restart-failed"
        severity = "critical"
        message = f"Restart failed{where}" + (" (rolled back)" if rolled else "")
    return Event(
        kind=kind,
        severity=severity,
        host=host,
        run=run,
        title=run,
        message=message,
        command=f"{prefix} audit",
        key=f"{kind}|{host}|{run}|{record.get('time')}",
        time=float(record.get("time") or time.time()),
    )


def audited_stop_event(config: Config, record: dict[str, Any]) -> Event | None:
    """The event of a stop through runwatch from any front end (a ``runwatch kill`` in another
    terminal, the dashboard, a Slurm cancel), from its audit record: who stopped it and from
    where (``by``), or that the stop failed."""
    if record.get("action") != "kill" or not record.get("run"):
        return None
    host, run = str(record.get("host")), str(record.get("run"))
    if not any(rc.name == run and rc.host == host for rc in config.runs):
        return None  # the audit log is shared: another config's run of the same name
    ident = record.get("identity") if isinstance(record.get("identity"), dict) else {}
    what = (
        f"job {ident.get('job_id')}"
        if ident and ident.get("job_id")
        else f"pid {(ident or {}).get('pid')}"
    )
    by = record.get("by") or "an older runwatch (who is not recorded)"
    at = float(record.get("time") or time.time())
    if record.get("ok"):
        severity: Severity = "info"
        message = f"Stopped through runwatch ({what}) by {by}."
    else:
        severity = "warning"
        detail = str(record.get("detail") or "see the audit log").split("\n", 1)[0]
        message = f"A stop through runwatch ({what}) by {by} failed: {detail}"
    return Event(
        kind="stopped",
        severity=severity,
        host=host,
        run=run,
        title=run,
        message=message,
        command=f"{command_prefix(config)} audit",
        key=f"stopped|{host}|{run}|{at}",
        time=at,
    )


def start_refused_event(
    host: str, run: str, message: str, command: str, at: float | None = None
) -> Event:
    """A start the gate refused (a rollback, a restart on failure): nothing was launched and the
    run stays stopped; ``command`` starts it keeping its output (``gate.resume_command``)."""
    now = time.time() if at is None else at
    return Event(
        kind="start-refused",
        severity="critical",
        host=host,
        run=run,
        title=run,
        message=message,
        command=command,
        key=f"start-refused|{host}|{run}|{now}",
        time=now,
    )


def abandoned_event(config: Config, host: str, run: str, why: str) -> Event:
    """A restart a previous watcher intended that this one does not make: the run may stay
    down; ``why`` says why and what the intent was."""
    now = time.time()
    return Event(
        kind="restart-abandoned",
        severity="critical",
        host=host,
        run=run,
        title=run,
        message=f"pending restart abandoned: {why}",
        command=f"{command_prefix(config)} launch {shlex.quote(run)}",
        key=f"restart-abandoned|{host}|{run}|{now}",
        time=now,
    )


def gave_up_event(config: Config, host: str, run: str, count: int, window: float) -> Event:
    """A run that keeps dying: no more automatic restarts."""
    prefix = command_prefix(config)
    now = time.time()
    return Event(
        kind="restart-gave-up",
        severity="critical",
        host=host,
        run=run,
        title=run,
        message=f"gave up after {count} restarts in {window:g} s: the run keeps dying; "
        "not restarted again until it is launched by hand",
        command=f"{prefix} launch {shlex.quote(run)}",
        key=f"restart-gave-up|{host}|{run}|{now}",
        time=now,
    )
