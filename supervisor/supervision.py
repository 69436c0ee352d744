"""The supervision loop, written once: refresh, budget policy, events.

Every front end does the same at each refresh: take a snapshot, apply each run's budget policy
(``supervisor.guard``, through the function the engine passes in), then turn what changed into
events (``supervisor.events``) knowing what runwatch itself stopped or moved (``supervisor.stops``:
the run locks and the audit log of every runwatch process; the stops this front end is making; a
plan's stops). ``Engine.tick`` runs :meth:`Supervision.tick` with the engine's refresh and budget
policy; the dashboard, ``runwatch watch``, ``status --watch`` and ``guard`` all call it.

This module never sees the engine: it gets the refresh and the policy as functions.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from supervisor.config import Config
from supervisor.events import Event, EventTracker, moved_key, stop_key
from supervisor.model import Snapshot
from supervisor.stops import StopLedger

if TYPE_CHECKING:  # the guard loads when a budget policy first acts, not at start-up
    from supervisor.guard import BudgetEvent, GuardOutcome

MOVE_EXPECTED_S = 120.0
"""How long after a restart moved a data file aside a smaller file at its path is expected."""

Refresh = Callable[[], Awaitable[Snapshot]]
"""Takes one snapshot of every host."""
Enforce = Callable[[Snapshot, Callable[["BudgetEvent"], None]], Awaitable[list["GuardOutcome"]]]
"""Applies each run's budget policy to a snapshot, calling its second argument with each event
just before acting on it (``Engine.enforce_budget``)."""


@dataclass
class Tick:
    """What one turn of the supervision loop saw and did."""

    snapshot: Snapshot
    outcomes: list[GuardOutcome] = field(default_factory=list)
    """What the budget policy did (``GuardOutcome``; empty when it was not applied)."""
    events: list[Event] = field(default_factory=list)
    """What someone should be told, oldest first (empty when events were not asked for)."""


class Supervision:
    """The state the loop keeps between ticks for one front end.

    ``report_initial``: report conditions already true at the first tick (the watcher), or take
    them as the starting point (the dashboard). ``others``: also report the restarts and stops
    other runwatch processes recorded in the audit log since ``started`` (the watcher)."""

    def __init__(
        self,
        config: Config,
        *,
        report_initial: bool = True,
        others: bool = True,
        started: float | None = None,
    ) -> None:
        self.config = config
        self.tracker = EventTracker(config, report_initial=report_initial)
        self.stops = StopLedger(config, started)
        self.others = others
        self.pending: list[Event] = []
        """Events to report at the next tick (the watcher's restarts it could not take over)."""
        self._stops: set[str] = set()
        self._moves: dict[str, float] = {}
        """Data files a restart moved aside, until when (monotonic) their shrinking is expected."""

    def reconfigure(self, config: Config) -> None:
        """Go on with ``config`` (``Engine.reconfigure``; same state key, so the same ledger)."""
        self.config = config
        self.stops.config = config
        self.tracker.reconfigure(config)

    def expect_stop(self, host: str, run: str, pid: int) -> None:
        """Process ``pid`` of a run is being stopped on purpose: its end is not a death. Kept
        until that process is seen gone (or replaced)."""
        self._stops.add(stop_key(host, run, pid))

    def expect_moved(self, path: str) -> None:
        """A restart moved data file ``path`` aside: a new, smaller file there is not data loss."""
        self._moves[moved_key(path)] = time.monotonic() + MOVE_EXPECTED_S

    async def tick(
        self,
        refresh: Refresh,
        enforce: Enforce | None = None,
        *,
        stopping: Iterable[str] = (),
        on_snapshot: Callable[[Snapshot], None] | None = None,
        events: bool = True,
    ) -> Tick:
        """One turn: ``refresh``, then ``enforce`` (None: no budget policy), then the events
        (``events``). ``stopping``: the ``stop_key`` of each process a plan is stopping now;
        ``on_snapshot`` gets the snapshot as soon as it is taken (before the policy acts)."""
        snap = await refresh()
        if on_snapshot is not None:
            on_snapshot(snap)
        outcomes = await enforce(snap, self._deliberate) if enforce is not None else []
        found = self.events(snap, outcomes, stopping) if events else []
        return Tick(snap, outcomes, found)

    def events(
        self, snap: Snapshot, outcomes: Iterable[GuardOutcome] = (), stopping: Iterable[str] = ()
    ) -> list[Event]:
        """The events of ``snap`` (what changed since the last one), then the budget policy's."""
        now = time.monotonic()
        self._moves = {k: t for k, t in self._moves.items() if t > now}
        # What runwatch stopped or moved, from any process (``supervisor.stops``).
        expected = self._stops | set(self._moves) | self.stops.expected() | set(stopping)
        found = self.tracker.update(snap, expected)
        found += self.pending
        self.pending = []
        if self.others:
            found += self.stops.take_events()
        # A deliberate stop is expected until that process is seen gone (or replaced).
        self._stops &= {
            stop_key(h.name, r.name, r.process.identity.pid)
            for h in snap.hosts
            for r in h.runs
            if r.state == "running" and r.process is not None
        }
        for outcome in outcomes:
            from supervisor.guard import budget_event

            # None when another runwatch (or an earlier one) acted, or for warn (the over-budget
            # event says it already).
            event = budget_event(outcome, self.config)
            if event is not None:
                found.append(event)
        return found

    def _deliberate(self, event: BudgetEvent) -> None:
        # A stop by the policy is deliberate: not a "run died" event.
        if event.policy != "warn":
            self.expect_stop(event.host, event.run, event.identity.pid)
