"""Restart on failure (opt-in, ``on_exit = "restart"`` per run), for ``runwatch watch``.

A run is restarted only after a ``run-died`` event (``supervisor.events``): runwatch saw it
running, then saw it gone, nobody stopped it through runwatch (the audit log says who did) and
its datasets are not all done (a client that finished is not restarted). The restart waits
``restart_backoff_seconds`` (doubled for each restart already made in the window), then goes
through the same gate as ``runwatch launch``: ``Engine.plan(action="launch")`` then
``Engine.execute`` (format check, fingerprint, locks, repair, a confirmed launch), audited as a
launch, plus one ``auto-restart`` record saying why. A run that dies again after
``restart_max`` restarts within ``restart_window_seconds`` is not restarted again: a
``restart-gave-up`` event says so and a launch by hand (the run seen running again) resets it.

Uptime is never bought with data: a restart the gate refuses because the client would overwrite
its output (``supervisor.gate``: a client that resumes only with its flag, started without it)
is not tried again; a critical ``start-refused`` event names the command that starts the run
keeping its output, and the run stays stopped until someone does.

A restart waiting for its backoff is written down first (``supervisor.intents``): a watcher
killed meanwhile leaves it in the state dir, and the next watcher of the config takes it over
(:meth:`AutoRestart.take_over`) or says why it abandons it. A state dir that refuses the write
(read-only, full, a file in the way) never costs the restart or the events around it (W22): the
restart is kept in memory and :attr:`AutoRestart.notes` tells the user, once per run, that it will
not survive this watcher; an audit record that cannot be written is said the same way.

A restart runs off the watch loop (W18): the launch's checks take seconds to minutes (the quiet
window, the settle time), and a refresh that waited for them would see no other run's death,
alert nothing and restart nothing meanwhile. :meth:`AutoRestart.step` starts each due restart as a
task of its own and returns the events of the ones that ended since; a run whose restart is under
way is not restarted twice. A stopping watcher waits for them (:meth:`AutoRestart.settle`); one it
gives up on keeps its intent for the next watcher.

A kill of the run cancels its intent (``Engine.cancel_restarts``): the restart checks under the
run's lock that its intent is still on disk (``Engine.execute(intent=...)``) and is dropped when
it is not, in this watcher and the next. A kill of a run whose death this watcher has not seen
yet (nothing pending) is recorded too (``Engine.record_stopped``): that death is not restarted,
unless a process of the run started after the kill is seen first. A restart is marked
``started`` in its intent under the same lock, before anything starts: a watcher killed from
that instant leaves it for the next one, which audits it (made: the run is found running;
interrupted: it is made again).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from supervisor import audit, intents
from supervisor.config import command_prefix
from supervisor.errors import RestartCancelled, RunwatchError
from supervisor.events import Event, abandoned_event, gave_up_event, restart_event
from supervisor.model import Snapshot

if TYPE_CHECKING:
    from supervisor.config import Config
    from supervisor.plan import Action, ActionResult, Plan


class Relaunches(Protocol):
    """What a restart on failure uses (``Engine`` has it): the config, then the run's launch
    plan and its execution through the gate, as ``runwatch launch`` does."""

    @property
    def config(self) -> Config: ...

    async def plan(self, run: str, *, action: Action = "restart") -> Plan: ...

    async def execute(self, plan: Plan, *, intent: float | None = None) -> ActionResult: ...


@dataclass
class _Restarts:
    host: str
    times: deque[float] = field(default_factory=deque)
    """When each automatic restart of the window was attempted (monotonic seconds)."""
    due: float | None = None
    gave_up: bool = False
    reason: str = ""
    written: float | None = None
    """The ``written`` time of its intent on disk (None: kept in memory only)."""
    begun: intents.Intent | None = None
    """A taken-over intent whose restart a previous watcher had begun (to be audited)."""
    seen_running: float = 0.0
    """Unix seconds: when the newest process this watcher saw running as the run started (a
    kill since is of its death, even one made before the death was seen)."""


class AutoRestart:
    """Schedules and carries out automatic restarts; see the module docstring."""

    def __init__(self, engine: Relaunches, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.clock = clock
        self._runs: dict[str, _Restarts] = {}
        self._tasks: dict[str, asyncio.Task[list[Event]]] = {}
        """Restarts under way, by run."""
        self._killed: dict[str, dict[str, Any]] = {}
        """Runs a kill recorded as stopped while nothing was pending (``restart-cancelled``), by
        run: a death seen afterwards is not restarted; forgotten once the run is seen running."""
        self.notes: list[str] = []
        """What the user should be told about the state dir (a write refused), for the watcher
        to print and clear; each said once."""
        self._said: set[str] = set()

    def _tell(self, key: str, text: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.notes.append(text)

    def _audit(self, name: str, /, **record: Any) -> None:
        """An ``auto-restart`` audit record; one that cannot be written is said, never raised
        (the restart and its event go on)."""
        try:
            audit.record("auto-restart", **record)
        except (OSError, RunwatchError) as e:
            self._tell(
                f"audit|{name}",
                f"audit record of the automatic restart of {name} not written ({e}): "
                "`runwatch audit` will not show it",
            )

    def wants(self, run: str) -> bool:
        try:
            return self.engine.config.run(run).on_exit == "restart"
        except RunwatchError:
            return False

    def pending(self) -> dict[str, float]:
        """Runs waiting for their restart -> seconds until it."""
        now = self.clock()
        return {n: max(0.0, r.due - now) for n, r in self._runs.items() if r.due is not None}

    def observe(self, events: Iterable[Event]) -> list[Event]:
        """Schedule a restart for each ``run-died`` of a run with ``on_exit = "restart"``;
        returns the ``restart-gave-up`` events of runs that died too often."""
        out = []
        now = self.clock()
        for ev in events:
            if ev.kind != "run-died" or ev.run is None or not self.wants(ev.run):
                continue
            killed = self._killed.pop(ev.run, None)
            if killed is not None:
                self.notes.append(
                    f"{ev.run}: not restarted: stopped by {killed.get('by')} before its death "
                    f"was seen ({killed.get('detail')})"
                )
                continue
            rc = self.engine.config.run(ev.run)
            st = self._runs.setdefault(ev.run, _Restarts(host=ev.host))
            while st.times and now - st.times[0] > rc.restart_window_seconds:
                st.times.popleft()
            if st.gave_up:
                continue
            if len(st.times) >= rc.restart_max:
                st.gave_up, st.due = True, None
                out.append(self._gave_up(ev.host, ev.run, len(st.times)))
                continue
            st.due = now + rc.restart_backoff_seconds * (2 ** len(st.times))
            self._intend(ev.run, st, f"run-died: {ev.message}")
        return out

    def _intend(self, run: str, st: _Restarts, reason: str) -> None:
        """Write the restart's intent before its backoff (``supervisor.intents``)."""
        if st.due is None:
            return
        st.reason = reason
        now = time.time()
        intent = intents.Intent(
            run=run,
            host=st.host,
            attempt=len(st.times) + 1,
            not_before=now + max(0.0, st.due - self.clock()),
            reason=reason,
            written=now,
            by=audit.actor(),
        )
        st.written = None
        try:
            intents.write(self.engine.config, intent)
            st.written = intent.written
        except (OSError, RunwatchError) as e:
            self._tell(
                f"write|{run}",
                f"restart intent of {run} not written ({e}): the restart is kept in memory "
                "only and will not survive this watcher",
            )
        else:
            self._said.discard(f"write|{run}")

    def _forget(self, run: str) -> None:
        try:
            intents.remove(self.engine.config, run)
        except (OSError, RunwatchError) as e:
            self._tell(
                f"remove|{run}",
                f"restart intent of {run} not removed ({e}): a later watcher may take over a "
                "restart already made (it finds the run running and drops it)",
            )

    def take_over(self) -> tuple[list[str], list[Event]]:
        """The restarts a previous watcher of this config intended and did not make: each one
        scheduled here (its attempt count and time kept), or abandoned with the reason. Returns
        notes (taken over) and events (abandoned: the run may stay down)."""
        cfg = self.engine.config
        notes: list[str] = []
        events: list[Event] = []
        try:
            found, bad = intents.pending(cfg)
        except (OSError, RunwatchError) as e:
            # Unreadable as a whole: whether a previous watcher left a restart is unknown.
            notes.append(f"pending restarts not read from {intents.directory(cfg)}: {e}")
            unread = f"the restarts a previous watcher intended cannot be read: {e}"
            ev = abandoned_event(cfg, "*", "*", unread)
            command = f"{command_prefix(cfg)} status"
            events.append(msgspec.structs.replace(ev, run=None, command=command))
            return notes, events
        for path, error in bad:
            with contextlib.suppress(OSError):
                os.unlink(path)
            events.append(
                abandoned_event(cfg, "*", path.stem, f"its intent {path} is unreadable: {error}")
            )
        now, mono = time.time(), self.clock()
        for it in found:
            why: str | None = None
            try:
                rc = cfg.run(it.run)
            except RunwatchError:
                rc = None
                why = "the run is no longer in the config"
            if rc is not None and rc.on_exit != "restart":
                why = f'the run\'s on_exit is now "{rc.on_exit}", not "restart"'
            elif rc is not None and rc.host != it.host:
                why = f"the run moved to host {rc.host} (the intent was for {it.host})"
            if why is not None:
                self._forget(it.run)
                events.append(
                    abandoned_event(
                        cfg, it.host, it.run, f"{why}; {it.reason} ({intents.age_text(it, now)})"
                    )
                )
                continue
            st = self._runs.setdefault(it.run, _Restarts(host=it.host))
            st.times = deque([mono] * max(0, it.attempt - 1))
            # Never longer than the backoff it was written with: a wall clock stepped back
            # since must not keep the run down for the size of the step (W23).
            wait = max(0.0, min(it.not_before - now, it.not_before - it.written))
            st.due = mono + wait
            st.gave_up = False
            st.reason = it.reason
            st.written = it.written
            if it.started is not None:  # its watcher ended while it was being made
                st.begun = it
                st.times.append(mono)
                st.due = mono
                notes.append(
                    f"{it.run}: {intents.describe(it, now)} was begun by a watcher that ended "
                    "before it was recorded; it is audited at the next refresh"
                )
                continue
            notes.append(
                f"took over the pending restart of {it.run} (attempt {it.attempt}, due in "
                f"{wait:.0f} s; {it.reason}; {intents.age_text(it, now)})"
            )
        return notes, events

    def cancelled(self, records: Iterable[dict[str, Any]]) -> None:
        """Drop the pending restarts that a kill cancelled (its ``restart-cancelled`` audit
        records, from any runwatch process, ``supervisor.stops``): the one this watcher holds
        is dropped at once, not when its backoff ends; a kill of the run made after it was last
        seen running and before its death was seen (``Engine.record_stopped``) drops the restart
        of that death. A restart under way checks its intent
        under the run's lock (``Engine.execute(intent=...)``)."""
        for rec in records:
            name = str(rec.get("run"))
            st = self._runs.get(name)
            if name in self._tasks:
                continue
            if st is None or (st.due is None and st.begun is None):
                # Nothing pending: a kill of a run whose death is not seen yet (or of one not
                # running at all); honoured by :meth:`observe` until the run is seen running.
                self._killed[name] = rec
                continue
            if float(rec.get("time") or 0) < st.seen_running:
                continue  # a kill of an earlier death: the run was seen running since
            if st.begun is not None and st.times:
                st.times.pop()  # counted when taken over; a waiting one is counted as it starts
            st.due, st.written, st.begun = None, None, None
            # The kill may have come before this death was seen (nothing pending then): the
            # intent written for it since is removed too.
            self._forget(name)
            self.notes.append(
                f"{name}: its pending restart on failure was cancelled by {rec.get('by')} "
                f"({rec.get('detail')}); nothing will be started"
            )

    def under_way(self) -> list[str]:
        """The runs whose restart is under way."""
        return sorted(self._tasks)

    async def step(self, snapshot: Snapshot) -> list[Event]:
        """Start the restart of every run whose time has come (and that is still not running),
        off the caller's loop; returns the events of the restarts that ended since the last
        call."""
        out = self._ended()
        now = self.clock()
        running = {
            r.name for h in snapshot.hosts for r in h.runs if r.state == "running" and r.configured
        }
        # When the process seen running started (a stale answer still shows the one that died).
        since = {
            r.name: snapshot.time - r.process.uptime_s
            for h in snapshot.hosts
            for r in h.runs
            if r.name in running and r.process is not None
        }
        for name, rec in list(self._killed.items()):
            if since.get(name, 0.0) > float(rec.get("time") or 0):
                del self._killed[name]  # running a process started since: that kill is history
        for name, st in self._runs.items():
            if name in self._tasks:
                continue  # its restart is under way
            begun_again = st.begun is not None
            if st.begun is not None:
                self._audit_begun(name, st, name in running)
            if name in running:
                st.seen_running = max(st.seen_running, since.get(name, 0.0))
                # Back: by the restart just made (its count stays), or by hand after a give-up
                # (a later death starts a new count).
                if st.gave_up:
                    st.gave_up = False
                    st.times.clear()
                if st.due is not None:
                    self._forget(name)
                st.due = None
                continue
            if st.due is None or now < st.due:
                continue
            st.due = None
            if not begun_again:
                st.times.append(now)
            self._tasks[name] = asyncio.ensure_future(self._restart(name, st))
        return out

    def _audit_begun(self, name: str, st: _Restarts, running: bool) -> None:
        """The audit record of a restart a previous watcher began and never recorded."""
        it, st.begun = st.begun, None
        assert it is not None
        again = "" if running else " and is made again"
        self._audit(
            name,
            config=self.engine.config.key,
            host=it.host,
            run=name,
            ok=running,
            reconciled=True,
            detail=intents.begun_outcome(it, running) + again,
        )

    def _ended(self) -> list[Event]:
        out: list[Event] = []
        for name, task in list(self._tasks.items()):
            if task.done():
                del self._tasks[name]
                out.extend(task.result())
        return out

    async def settle(self, timeout: float) -> list[Event]:
        """Wait up to ``timeout`` seconds for the restarts under way (a watcher stopping);
        returns their events. One still under way then is cancelled: its intent stays for the
        next watcher, which finds the run running, or restarts it."""
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=timeout)
        out = self._ended()
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        return out

    async def _restart(self, name: str, st: _Restarts) -> list[Event]:
        rc = self.engine.config.run(name)
        count = len(st.times)
        why = f"on_exit = restart: restart {count} of at most {rc.restart_max}"
        result = None
        command = None
        try:
            plan = await self.engine.plan(name, action="launch")
            result = await self.engine.execute(plan, intent=st.written)
        except RestartCancelled as e:
            # A kill cancelled it (audited there): no attempt, no retry, nothing to forget.
            if st.times:
                st.times.pop()
            st.due, st.written = None, None
            self._tell(f"cancelled|{name}|{count}", f"{name}: {e.message}")
            return []
        except RunwatchError as e:
            detail = str(e)
        except Exception as e:  # off the loop: say what failed, like a failed refresh does
            detail = f"{type(e).__name__}: {e}"
        else:
            failed = result.failed_step
            command = failed.data.get("resume_command") if failed is not None else None
            pid = (result.identity or {}).get("pid")
            detail = (
                f"pid {pid}"
                if result.ok
                else f"{failed.name if failed else 'launch'}: {failed.detail if failed else ''}"
            )
        ok = result is not None and result.ok
        self._forget(name)
        self._audit(
            name,
            config=self.engine.config.key,
            host=st.host,
            run=name,
            ok=ok,
            identity=result.identity if result is not None else None,
            detail=f"{why}; {detail}",
            refused=True if command is not None else None,
            command=command,
        )
        events = [restart_event(self.engine.config, st.host, name, result, f"{why}; {detail}")]
        if ok:
            return events
        if command is not None:
            # Refused by the gate: another try would be refused the same way.
            st.gave_up = True
            return events
        if len(st.times) < rc.restart_max:
            st.due = self.clock() + rc.restart_backoff_seconds * (2 ** len(st.times))
            self._intend(name, st, f"{why} failed: {detail}")
        else:
            st.gave_up = True
            events.append(self._gave_up(st.host, name, len(st.times)))
        return events

    def _gave_up(self, host: str, run: str, count: int) -> Event:
        rc = self.engine.config.run(run)
        self._audit(
            run,
            config=self.engine.config.key,
            host=host,
            run=run,
            ok=False,
            detail=f"gave up after {count} restarts in {rc.restart_window_seconds:g} s",
        )
        return gave_up_event(self.engine.config, host, run, count, rc.restart_window_seconds)
