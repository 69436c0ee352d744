"""Alert delivery off the watch loop: one queue, one worker thread and one spool per destination.

:meth:`Outbox.post` only writes the message to the destination's spool (``<state>/alerts/<config
key>/<url key>/``, files 0600 in 0700 directories) and wakes its worker: detection, budget policy
and restarts never wait on a delivery. The worker sends the oldest message first, each attempt on
a thread of its own under a deadline (a receiver that accepts and never answers costs that
deadline, no more), and retries a failed message with exponential backoff until it is delivered or
:data:`MAX_AGE_S` old. A delivered message's spool file is removed; what is still in the spool
when the watcher stops is sent by the next one. The results (:class:`Delivery`) are collected by
the watch loop with :meth:`Outbox.collect`.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from supervisor.errors import RunwatchError
from supervisor.events import Event
from supervisor.paths import write_private

BACKOFF_FIRST_S = 2.0
"""Wait after a destination's first failed attempt; doubled after each further one."""
BACKOFF_MAX_S = 60.0
"""Longest wait between two attempts."""
MAX_AGE_S = 24 * 3600.0
"""A message not delivered for this long is given up (and said so)."""

Send = Callable[[str, str, str], bool]
"""``send(title, body, severity) -> delivered`` to one destination."""


class Message(msgspec.Struct, kw_only=True):
    """One message for one destination, as spooled."""

    title: str
    body: str
    severity: str
    created: float
    """Unix time it was composed."""
    events: list[Event] = []


@dataclass
class Delivery:
    """One message sent to one destination (or not, yet)."""

    ok: bool
    title: str
    events: list[Event]
    error: str | None = None
    target: str = ""
    """The destination, masked (``json://127.0.0.1/***``)."""
    attempts: int = 1
    final: bool = True
    """False for a failed attempt that will be retried."""


_seq = itertools.count()


def url_key(url: str) -> str:
    """A destination's name in the spool: 16 hex digits of its URL's sha256 (URLs hold tokens)."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


@dataclass
class Outbox:
    """The queue, worker and spool of one destination (see the module docstring)."""

    target: str
    """The destination, masked, for messages."""
    send: Send
    spool: Path | None = None
    """Where its undelivered messages are kept (None: in memory only)."""
    deadline_s: float = 20.0
    clock: Callable[[], float] = time.time
    failing_since: float | None = None
    """Unix time of the first failed attempt since the last delivery (None: not failing)."""
    last_error: str | None = None
    failing_reported: bool = False
    spool_error: str | None = None
    """Why the last message could not be written to the spool (None: it was, or no spool)."""
    spool_error_said: bool = False
    attempts: int = 0
    """Tries made so far (a wait for a hung one included)."""
    failed: int = 0
    """Tries that did not deliver, so far (every retry counts: the exporter's counter)."""
    _hung: tuple[threading.Thread, list[tuple[bool, str | None]], Message, float] | None = None
    """The try still under way after its deadline: its thread, outcome, message, start."""
    _queue: deque[tuple[Path | None, Message, int]] = field(default_factory=deque)
    _results: list[Delivery] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _stopped: bool = False
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Load what an earlier watcher left in the spool and start the worker."""
        if self.spool is not None:
            for path in sorted(self.spool.glob("*.json")):
                try:
                    msg = msgspec.json.decode(path.read_bytes(), type=Message)
                except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                    # Not ours or torn: set aside, never lost silently, never retried forever.
                    with contextlib.suppress(OSError):
                        path.rename(path.with_suffix(".bad"))
                    continue
                self._queue.append((path, msg, 0))
        self._thread = threading.Thread(
            target=self._work, name=f"alerts {self.target}", daemon=True
        )
        self._thread.start()

    def post(self, msg: Message) -> None:
        """Spool ``msg`` and wake the worker; never waits on the destination."""
        path = None
        if self.spool is not None:
            path = self.spool / f"{time.time_ns():020d}-{os.getpid()}-{next(_seq):06d}.json"
            try:
                write_private(path, msgspec.json.encode(msg))
            except (OSError, RunwatchError) as e:
                # A full or read-only state dir: still sent, just not kept across a restart
                # (said once by the alerter, W22).
                path = None
                self.spool_error = str(e)
            else:
                self.spool_error = None
        with self._cond:
            self._queue.append((path, msg, 0))
            self._cond.notify()

    @property
    def waiting(self) -> int:
        """Messages not delivered yet."""
        with self._cond:
            return len(self._queue)

    def collect(self) -> list[Delivery]:
        """The results since the last call."""
        with self._cond:
            out, self._results = self._results, []
        return out

    def close(self) -> None:
        """Stop the worker after its current attempt; the spool keeps the rest."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the worker to end (after :meth:`close`)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _attempt(self, msg: Message) -> tuple[bool, str | None]:
        """One try of ``msg``, on a thread of its own, bounded by the deadline. A send that is
        still under way at the deadline (a receiver that drips its answer never times out a
        read) is left to end by itself, and is the only one: the next try waits for it again
        instead of starting another, so a destination never holds more than one thread and one
        connection (W25); when it ends, its outcome is that try's."""
        self.attempts += 1
        if self._hung is not None:
            th, outcome, was, since = self._hung
            th.join(self.deadline_s)
            if th.is_alive():
                ago = time.monotonic() - since
                return False, f"no answer within {self.deadline_s:g} s (still waiting, {ago:.0f} s)"
            self._hung = None
            if was is msg and outcome:
                return outcome[0]
            # It ended without an outcome, or for a message given up since: a fresh try.
        outcome = []

        def go() -> None:
            try:
                ok = self.send(msg.title, msg.body, msg.severity)
                outcome.append((ok, None if ok else "not delivered"))
            except Exception as e:  # a notifier's failure is a failed delivery, nothing more
                outcome.append((False, type(e).__name__))

        th = threading.Thread(target=go, name=f"alert to {self.target}", daemon=True)
        started = time.monotonic()
        th.start()
        th.join(self.deadline_s)
        if not outcome:
            self._hung = (th, outcome, msg, started)
            return False, f"no answer within {self.deadline_s:g} s"
        return outcome[0]

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                path, msg, tries = self._queue[0]
            ok, error = self._attempt(msg)
            tries += 1
            delivery = Delivery(
                ok=ok, title=msg.title, events=msg.events, error=error, target=self.target,
                attempts=tries,
            )  # fmt: skip
            now = self.clock()
            given_up = not ok and now - msg.created > MAX_AGE_S
            with self._cond:
                self._queue.popleft()
                if ok or given_up:
                    if path is not None:
                        with contextlib.suppress(OSError):
                            path.unlink()
                else:
                    self._queue.appendleft((path, msg, tries))
                if ok:
                    self.failing_since = None
                    self.failing_reported = False
                    self.last_error = None
                else:
                    self.failed += 1
                    if self.failing_since is None:
                        self.failing_since = now
                    self.last_error = error
                    delivery.final = given_up
                    if given_up:
                        delivery.error = f"{error}; given up after {tries} attempts"
                # A delivery, a first failure and a give-up are news; a retry that fails again
                # is not (the destination's failing state says it).
                if ok or given_up or tries == 1:
                    self._results.append(delivery)
                if not ok and not given_up:
                    backoff = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (tries - 1))
                    self._cond.wait_for(lambda: self._stopped, backoff)
