"""``runwatch watch``: the engine headless, turning what happens into alerts, and acting.

Every ``refresh_seconds`` the watcher runs one turn of the engine's supervision loop
(``Engine.tick``: refresh every host, the engine reconnecting a lost host with backoff and
showing its last values meanwhile; each run's budget policy; the events), restarts
runs that opted in (``supervisor.autorestart``), prints one line per event (or one JSON object
with ``--json``) and hands them to ``supervisor.alerts``, whose deliveries run off this loop (a
hung receiver never delays a refresh). Every refresh also prints one line of its own (``tick``):
a watcher that prints nothing for two refreshes is stuck, not quiet.

Two watchers on one config would both act: :class:`WatchLock` takes an ``flock`` on
``configs/<config key>/watch.lock`` in the state dir (``Config.key``: the config's resolved path
or its ``project``), held for the watcher's life; the second watcher is told who holds it (pid,
machine, since when). Watchers of two configs share nothing: each reads only its config's audit
records and sees only its config's runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from supervisor.alerts import Alerter, Delivery, check_alerts
from supervisor.autorestart import AutoRestart
from supervisor.errors import RunwatchError
from supervisor.events import EVENTS_KEPT, Event, EventKind, EventTracker, with_lines
from supervisor.paths import config_key, config_state, open_private, read_private, state_dir
from supervisor.reload import ConfigFile
from supervisor.stops import StopLedger

if TYPE_CHECKING:
    from supervisor.config import Config
    from supervisor.engine import Engine
    from supervisor.model import Snapshot

LOG_LINES = 10
"""Lines of a dead run's log attached to its alert."""
LOG_WAIT_MIN_S = 2.0
"""A dead run's log tail is waited for one refresh interval (at least this, at most the host's
``command_timeout``): a host that stops answering after it told of the death delays neither the
alert nor the refresh (W21)."""
CLOSE_GRACE_S = 2.0
"""Seconds a stopping watcher waits for the deliveries under way."""
RESTART_GRACE_S = 60.0
"""Seconds a stopping watcher waits for the automatic restarts under way (their intents stay for
the next watcher when they do not end in time)."""


def alert_spool(config: Config) -> Path:
    """``state_dir()/alerts/<config key>``: where undelivered alerts wait for the next watcher
    (``Config.key``: a config's ``project`` survives moving its file, W26)."""
    return state_dir() / "alerts" / config.key


class WatchLocked(RunwatchError):
    """Another watcher holds the lock of this config."""

    exit_code = 3


class WatchLock:
    """The lock that keeps two watchers of one config from both acting (see module docstring)."""

    def __init__(
        self, config_path: str, directory: Path | None = None, key: str | None = None
    ) -> None:
        real = os.path.realpath(config_path) if config_path else ""
        key = key or config_key(config_path)
        self.directory = directory or config_state(key)
        name = f"{key}.lock" if directory else "watch.lock"
        self.paths = [self.directory / name]
        self.config_path = real
        self._fds: list[int] = []

    def holder(self) -> str:
        """Who holds the lock, as recorded in its file."""
        for path in self.paths:
            try:
                info = json.loads(read_private(path) or b"{}")
            except (OSError, ValueError, RunwatchError):
                continue
            if info:
                since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("since", 0)))
                return (
                    f"pid {info.get('pid')} on {info.get('host')} since {since} "
                    f"(config {info.get('config')})"
                )
        return "another runwatch watch"

    def try_acquire(self) -> bool:
        """Take every lock file, or none; False when another watcher holds one."""
        fds: list[int] = []
        for path in self.paths:
            fd = open_private(path, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                for held in fds:
                    os.close(held)
                return False
            fds.append(fd)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.time(),
            "config": self.config_path,
        }
        for fd in fds:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fds = fds
        return True

    def acquire(self) -> None:
        """Take the lock or raise WatchLocked naming the holder."""
        if not self.try_acquire():
            raise WatchLocked(
                f"another watcher acts on this config already: {self.holder()}",
                "stop it first, or pass --standby to take over when it stops",
            )

    def release(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)
        self._fds = []


class Watcher:
    """One watcher over one engine; :meth:`tick` is one refresh, :meth:`run` loops."""

    def __init__(
        self,
        engine: Engine,
        *,
        emit: Callable[[str], None] = print,
        as_json: bool = False,
        alerter: Alerter | None = None,
        interval: float | None = None,
    ) -> None:
        self.engine = engine
        config = engine.config
        check_alerts(config.alerts, f"{config.path or 'config'}: [alerts]")
        self.emit = emit
        self.as_json = as_json
        self.alerter = alerter or Alerter(config.alerts, spool=alert_spool(config))
        self.interval = interval or config.refresh_seconds
        self._interval_given = interval is not None
        self.config_file = ConfigFile(config)
        self.supervision = engine.supervise(report_initial=True, others=True)
        self.restarts = AutoRestart(engine)
        self.events: list[Event] = []
        """The events so far, oldest first (the newest ``EVENTS_KEPT``)."""
        self.deliveries: list[Delivery] = []
        self.observers: list[Callable[[Snapshot, list[Event], int], None]] = []
        """Called at the end of every tick with its snapshot, its events and the failed alert
        delivery attempts so far, every retry counted (the Prometheus exporter,
        ``supervisor.exporter``)."""
        self.ticks = 0
        self.doing = ""
        """What the refresh under way is doing (for the notes of a long one)."""
        self.started = self.supervision.stops.started
        self._audit_error: str | None = None
        self._half_seen: float | None = None
        """The half-applied plan said and audited (its intent's time), if any."""

    @property
    def stops(self) -> StopLedger:
        """What runwatch processes stopped or moved (``supervisor.stops``), as the loop sees it."""
        return self.supervision.stops

    @property
    def tracker(self) -> EventTracker:
        """The event tracker of the loop (``supervisor.events``)."""
        return self.supervision.tracker

    def note(self, text: str) -> None:
        """A line about the watcher itself (not an event): plain text, or JSON with ``--json``."""
        if self.as_json:
            self.emit(json.dumps({"note": text, "time": time.time()}))
        else:
            self.emit(f"{time.strftime('%H:%M:%S')} {text}")

    async def run(self, stop: asyncio.Event) -> None:
        """Tick every ``interval`` seconds until ``stop`` is set."""
        cfg = self.engine.config
        targets = ", ".join(self.alerter.targets()) or "none (no [alerts] urls)"
        self.note(
            f"watching {len(cfg.hosts)} host(s), {len(cfg.runs)} run(s) every "
            f"{self.interval:g} s; alerts to {targets}"
        )
        # Restarts a previous watcher of this config intended and did not make (it was killed
        # during a backoff): taken over, or abandoned with the reason as a critical event.
        taken, abandoned = self.restarts.take_over()
        for text in taken:
            self.note(text)
        self.supervision.pending.extend(abandoned)
        while not stop.is_set():
            started = time.monotonic()
            beat = asyncio.ensure_future(self._beat(started))
            try:
                await self.tick()
                if self.ticks == 1:
                    self.note(self._first_look())
            except RunwatchError as e:
                self.note(f"refresh failed: {e}")
            except Exception as e:  # a watcher keeps going: say what failed, try again next tick
                self.note(f"refresh failed: {type(e).__name__}: {e}")
            finally:
                beat.cancel()
            left = max(0.0, self.interval - (time.monotonic() - started))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), left)
        # Restarts under way end (or keep their intents for the next watcher), and are said.
        if self.restarts.under_way():
            self.note(f"waiting for the restart of {', '.join(self.restarts.under_way())}")
        ended = await self.restarts.settle(RESTART_GRACE_S)
        for ev in ended:
            self._show(ev)
        self.events.extend(ended)
        if ended:
            self._report(await self.alerter.submit(ended))
        # Deliveries under way get a moment to end; the rest stay spooled for the next watcher.
        await asyncio.to_thread(self.alerter.close, CLOSE_GRACE_S)
        self._report(self.alerter.collect())
        if self.alerter.waiting:
            self.note(f"{self.alerter.waiting} alert(s) not delivered: kept for the next watcher")
        self.note("stopped")

    async def _beat(self, started: float) -> None:
        """While one refresh takes longer than the interval, a note each interval saying what
        it is doing: the output never goes quiet for two intervals."""
        while True:
            await asyncio.sleep(self.interval)
            took = time.monotonic() - started
            self.note(f"refresh {self.ticks + 1} still under way after {took:.0f} s: {self.doing}")

    async def tick(self) -> list[Event]:
        """One refresh (``Engine.tick``: snapshot, budget policy, events), then automatic
        restarts, output and alerts."""
        engine = self.engine
        self.doing = "reading the config file"
        reloaded = await self._reload()
        self.doing = "asking the hosts"

        def asked(snap: Snapshot) -> None:
            self.doing = "budget policy and events"

        # A host that does not answer within most of the interval shows its last values,
        # marked stale (the engine takes its answer at a later refresh): the others go on, and
        # the rest of the refresh has the remaining quarter. The first refresh waits for every
        # host: a host not asked yet has no last values (it is neither up nor lost).
        tick = await engine.tick(
            wait=0.75 * self.interval if self.ticks else None, on_snapshot=asked
        )
        snap = tick.snapshot
        self._audit_log_state()
        events = list(await asyncio.gather(*(self._with_log(ev) for ev in tick.events)))
        events[:0] = reloaded
        self.doing = "restarts on failure"
        # What the refresh saw is shown and alerted whatever the restarts meet (W22).
        held = self._half_applied(snap)
        try:
            events += self.restarts.observe(e for e in events if e.run not in held)
            # A kill from any runwatch process cancels a pending restart (in memory too).
            self.restarts.cancelled(self.stops.take_cancels())
            # Started off this loop; the events of the ones that ended since the last refresh.
            events += await self.restarts.step(snap)
        except Exception as e:  # said, and the events of this refresh still go out
            self.note(f"restarts on failure: {type(e).__name__}: {e}")
        for text in self.restarts.notes:
            self.note(text)
        self.restarts.notes.clear()
        for ev in events:
            self._show(ev)
        self.events.extend(events)
        del self.events[:-EVENTS_KEPT]
        self.alerter.keep_only(self.supervision.tracker.active())
        deliveries = await self.alerter.submit(events)
        self._report(deliveries)
        for observe in self.observers:
            observe(snap, events, self.alerter.failed_attempts)
        self.ticks += 1
        self._tick_line(snap)
        return events

    def _half_applied(self, snap: Snapshot) -> set[str]:
        """The runs of a rebalance plan an apply left half-applied: said and audited once per
        plan; no restart on failure of them is made against it (``rebalance --apply --resume``
        puts them back as they were)."""
        from supervisor import audit

        plan = snap.plan
        if plan is None or not plan.half_applied:
            self._half_seen = None
            return set()
        if plan.applied_at != self._half_seen:
            self._half_seen = plan.applied_at
            self.note(f"{plan.text}; no restart on failure of {', '.join(plan.runs)} until then")
            audit.record(
                "rebalance-half-applied",
                config=self.engine.config.key,
                host="-",
                run=None,
                ok=False,
                runs=plan.runs,
                detail=plan.text,
            )
        return set(plan.runs)

    async def _reload(self) -> list[Event]:
        """The config file read again when it changed (``supervisor.reload``): taken, with what
        changed, or kept as it was, with why (a ``config-refused`` event once per version)."""
        engine = self.engine
        reloaded = self.config_file.poll(engine.config)
        if reloaded is None:
            return []
        kind: EventKind = "config-refused"
        message = reloaded.refused or "unreadable"
        if reloaded.config is not None:
            new = reloaded.config
            await engine.reconfigure(new)
            self.alerter.config = new.alerts
            if not self._interval_given:
                self.interval = new.refresh_seconds
            kind = "config-reloaded"
            message = f"{self.config_file.path} read again: {'; '.join(reloaded.changes)}"
        now = time.time()
        return [
            Event(
                kind=kind,
                severity="warning" if kind == "config-refused" else "info",
                host="*",
                title="config",
                message=message,
                command=self.tracker.cmd("status"),
                key=f"{kind}|{self.config_file.path}|{now}",
                time=now,
            )
        ]

    def _audit_log_state(self) -> None:
        """Say once when the audit log cannot be read (and when it can again): the stops made
        through runwatch since are not known, so one may show as a death (W22)."""
        error = self.stops.error
        if error == self._audit_error:
            return
        if error is None:
            self.note("the audit log can be read again")
        elif self._audit_error is None:
            self.note(
                f"the audit log cannot be read ({error}): a stop through runwatch from now on may "
                "show as a death; deaths, data loss and the rest are still watched"
            )
        self._audit_error = error

    def _report(self, deliveries: list[Delivery]) -> None:
        """Notes on the deliveries that came in (off this loop) and on failing URLs."""
        for d in deliveries:
            if not d.ok:
                retry = "" if d.final else "; retrying with backoff"
                self.note(f"alert not delivered to {d.target} ({d.title}): {d.error}{retry}")
            elif d.attempts > 1:
                self.note(f"alert delivered to {d.target} after {d.attempts} attempts")
        for text in self.alerter.notes:
            self.note(text)
        self.alerter.notes.clear()
        self.deliveries.extend(deliveries)
        del self.deliveries[:-EVENTS_KEPT]

    def _tick_line(self, snap: Snapshot) -> None:
        """One line per refresh: hosts reached, runs running, alerts waiting."""
        up = sum(1 for h in snap.hosts if h.connected)
        running = sum(
            1 for h in snap.hosts for r in h.runs if r.configured and r.state == "running"
        )
        waiting = self.alerter.waiting
        if self.as_json:
            tick = {"tick": self.ticks, "time": time.time(), "hosts_up": up}
            tick |= {"hosts": len(snap.hosts), "running": running, "alerts_waiting": waiting}
            self.emit(json.dumps(tick))
            return
        alerts = f"; {waiting} alert(s) waiting" if waiting else ""
        self.emit(
            f"{time.strftime('%H:%M:%S')} refresh {self.ticks}: {up}/{len(snap.hosts)} host(s) "
            f"up, {running} run(s) running{alerts}"
        )

    def _first_look(self) -> str:
        """``first refresh: running demo; stopped other``: what the watcher starts from."""
        snap = self.engine.last
        runs = [r for h in (snap.hosts if snap else []) for r in h.runs if r.configured]
        states: dict[str, list[str]] = {}
        for r in runs:
            states.setdefault(r.state, []).append(r.name)
        said = "; ".join(f"{state} {', '.join(names)}" for state, names in sorted(states.items()))
        return f"first refresh: {said or 'no configured run seen'}"

    async def _with_log(self, ev: Event) -> Event:
        if ev.kind != "run-died" or ev.run is None:
            return ev
        wait = self._log_timeout(ev.host)
        try:
            tail = await asyncio.wait_for(self.engine.tail_log(ev.host, ev.run, LOG_LINES), wait)
        except asyncio.TimeoutError:
            return with_lines(ev, [f"its log not read: {ev.host} gave no answer within {wait:g} s"])
        except (RunwatchError, OSError):
            return ev
        if not tail.exists or not tail.lines:
            return ev
        return with_lines(ev, [f"last lines of {tail.path}:", *tail.lines])

    def _log_timeout(self, host: str) -> float:
        return min(
            self.engine.config.host(host).command_timeout, max(LOG_WAIT_MIN_S, self.interval)
        )

    def _show(self, ev: Event) -> None:
        if self.as_json:
            self.emit(msgspec.json.encode(ev).decode())
            return
        stamp = time.strftime("%H:%M:%S", time.localtime(ev.time))
        self.emit(f"{stamp} {ev.text()}")
        if ev.kind == "host-lost":
            self.emit(f"{stamp}   reconnecting to {ev.host} with backoff; its runs keep running")
        for line in ev.lines:
            self.emit(f"         | {line}")


async def watch(
    engine: Engine,
    stop: asyncio.Event,
    *,
    emit: Callable[[str], None] = print,
    as_json: bool = False,
    standby: bool = False,
    lock: WatchLock | None = None,
    interval: float | None = None,
    watcher: Watcher | None = None,
) -> Watcher:
    """Take the config's lock (waiting for it with ``standby``), then watch until ``stop``.

    ``watcher``: the one to run (default: a new one with ``emit``, ``as_json``, ``interval``)."""
    lock = lock or WatchLock(engine.config.path, key=engine.config.key)
    watcher = watcher or Watcher(engine, emit=emit, as_json=as_json, interval=interval)
    if not lock.try_acquire():
        if not standby:
            lock.acquire()  # raises WatchLocked naming the holder
        watcher.note(f"standing by: {lock.holder()} holds the lock")
        while not lock.try_acquire():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if stop.is_set():
                return watcher
        watcher.note("the other watcher stopped: taking over")
    try:
        watcher.started = watcher.stops.started = time.time()
        await watcher.run(stop)
    finally:
        lock.release()
    return watcher
