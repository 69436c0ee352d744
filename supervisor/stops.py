"""What runwatch itself stopped or changed, from any of its processes: no death, no data loss.

A run seen gone was stopped through runwatch when its run's lock is held (an action is under way
in some runwatch: ``supervisor.runlock``) or when the audit log records the stop (a kill, a
restart's stop, a budget stop); a data file runwatch moved aside is expected to shrink. The
locks are read first, then the log: an action holds its run's lock until its audit record is
written, so a stop the refresh saw is in one or the other. :class:`StopLedger` keeps those keys
(``events.stop_key``, ``busy_key``, ``moved_key``) for ``EventTracker.update`` and, for the
watcher, turns the records of other processes into events: restarts, and stops with who and
from where; and hands it the kills that cancelled a pending restart (``restart-cancelled``). The
watcher and the dashboard share it.
"""

from __future__ import annotations

import time
from typing import Any

from supervisor import audit, runlock
from supervisor.config import Config
from supervisor.errors import RunwatchError
from supervisor.events import (
    Event,
    audited_restart_event,
    audited_stop_event,
    busy_key,
    moved_key,
    stop_key,
)

SINCE_SLACK_S = 60.0
"""Stops recorded this long before the ledger started still count (a stop just before it)."""


class StopLedger:
    """The stops and moves runwatch made, for one config; see the module docstring."""

    def __init__(self, config: Config, started: float | None = None) -> None:
        self.config = config
        self._started = time.time() if started is None else started
        self._mark = audit.mark()
        """Where the audit log ended when the ledger started: a record after it is new, whatever
        its time says (the wall clock may be stepped back meanwhile, W23)."""
        self._stamp: tuple[int, int, int, int] | None = None
        self._stops: set[str] = set()
        self._seen: set[tuple[str, float]] = set()
        self._events: list[Event] = []
        self._cancels: list[dict[str, Any]] = []
        self.error: str | None = None
        """Why the audit log could not be read at the last try (None: it was): the stops it
        holds are the last ones read, and a stop since may show as a death (an alarm too many,
        never one too few); the watcher says so (W22)."""

    @property
    def started(self) -> float:
        """Unix time the ledger started (records from then on are news)."""
        return self._started

    @started.setter
    def started(self, value: float) -> None:
        self._started = value
        self._mark = audit.mark()

    def expected(self) -> set[str]:
        """Keys of what runwatch stopped or moved: the runs an action holds now, then the audit
        log since the ledger started (read again only when it changed)."""
        cfg = self.config
        busy = {busy_key(r.host, r.name) for r in cfg.runs if runlock.holder(cfg, r.name)}
        try:
            st = audit.audit_path().stat()
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
        except FileNotFoundError:
            stamp = (0, 0, 0, 0)
        except OSError as e:
            self.error = str(e)
            return busy | self._stops
        if stamp != self._stamp or self.error is not None:
            try:
                self._stops = self._read()
            except (OSError, RunwatchError) as e:
                self.error = str(e)
                return busy | self._stops
            self._stamp = stamp
            self.error = None
        return busy | self._stops

    def take_events(self) -> list[Event]:
        """The events of records written by other processes since the last call: restarts made
        elsewhere, and stops with who and from where."""
        out, self._events = self._events, []
        return out

    def take_cancels(self) -> list[dict[str, Any]]:
        """The ``restart-cancelled`` records (a kill of a run waiting for its restart on
        failure, from any runwatch process) written since the last call, for the watcher to
        drop those restarts (``AutoRestart.cancelled``)."""
        out, self._cancels = self._cancels, []
        return out

    def _read(self) -> set[str]:
        out: set[str] = set()
        for new, rec in audit.read_marked(self._mark, limit=1000, config=self.config.key):
            at = float(rec.get("time") or 0)
            if not new and at < self.started - SINCE_SLACK_S:
                continue
            seen = (str(rec.get("run")), at)
            if (new or at >= self.started) and seen not in self._seen:
                self._seen.add(seen)
                ev = self._event(rec)
                if ev is not None:
                    self._events.append(ev)
                if rec.get("action") == "restart-cancelled":
                    # Kept for a watcher to take; bounded for a dashboard that never does.
                    self._cancels = [*self._cancels[-99:], rec]
            key = _key(rec)
            if key is not None:
                out.add(key)
        return out

    def _event(self, rec: dict[str, Any]) -> Event | None:
        ev = audited_restart_event(self.config, rec)
        if ev is None and not audit.by_this_process(rec):
            ev = audited_stop_event(self.config, rec)
        return ev


def _key(rec: dict[str, Any]) -> str | None:
    """The expected-change key of one audit record, or None."""
    action = rec.get("action")
    if action == "move-aside" and rec.get("path"):
        return moved_key(str(rec["path"]))
    if action == "budget" and rec.get("policy") == "warn":
        return None  # recorded, nothing stopped
    ident = rec.get("old_identity") if action == "restart" else rec.get("identity")
    pid = ident.get("pid") if isinstance(ident, dict) else None
    if action in ("kill", "restart", "budget") and isinstance(pid, int):
        return stop_key(str(rec.get("host")), str(rec.get("run")), pid)
    return None
