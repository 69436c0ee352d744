"""Alerts: events sent through apprise (ntfy, Slack, Telegram, email, desktop, JSON webhooks...).

``Alerter(config.alerts)`` filters events (``events``, ``min_severity``), drops an event whose key
was sent already and not forgotten since (the watcher forgets a condition's key when it clears,
:meth:`Alerter.keep_only`), sends at most
``max_per_minute`` messages a minute (the rest wait for the next :meth:`Alerter.flush`) and folds
more than ``digest_over`` events at once into one digest message. Every message ends with the
command that acts on the event. The URLs usually hold tokens: they are only ever shown through
:func:`mask_url`, and apprise's own log is silenced (its messages can quote a URL).

Sending never blocks the caller: each URL has its own :class:`~supervisor.outbox.Outbox` (queue,
worker, deadline per delivery, retries with backoff, spool in the state dir); :meth:`Alerter.submit`
hands messages over and returns the results that came in since. A URL that has failed for
``failing_minutes`` is reported to the other URLs (:meth:`Alerter.collect`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from supervisor.config import AlertsConfig
from supervisor.errors import ConfigError
from supervisor.events import EVENT_KINDS, EVENTS_KEPT, Event, severity_rank
from supervisor.outbox import Delivery, Message, Outbox, url_key
from supervisor.secrets import mask_text

Sender = Callable[[str, str, str], bool]
"""``send(title, body, severity) -> delivered``."""

__all__ = ["Alerter", "Delivery", "Sender", "check_alerts", "compose", "mask_url"]


def mask_url(url: str) -> str:
    """``scheme://host/***``: an alert URL without its credentials, path or query (tokens)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return "***"
    if not parts.scheme:
        return "***"
    hidden = bool(parts.username or parts.password or parts.path.strip("/") or parts.query)
    return f"{parts.scheme}://{host}{'/***' if hidden else ''}"


def check_alerts(alerts: AlertsConfig, where: str = "[alerts]") -> None:
    """Raise ConfigError for an unknown event kind or a URL apprise does not understand."""
    unknown = sorted(set(alerts.events) - set(EVENT_KINDS))
    if unknown:
        raise ConfigError(
            f"{where}.events: unknown event kind(s): {', '.join(unknown)}",
            f"known: {', '.join(EVENT_KINDS)}",
        )
    if alerts.urls:
        _apprise_for(alerts.urls, where)


def _import_apprise() -> Any:
    """apprise, imported late (it is slow to import) and without its deprecation warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import apprise
    return apprise


def _apprise_for(urls: Iterable[str], where: str = "[alerts]") -> Any:
    """An ``apprise.Apprise`` for ``urls`` (its plugins load here, on the calling thread)."""
    apprise = _import_apprise()
    logging.getLogger("apprise").setLevel(logging.CRITICAL + 1)
    app = apprise.Apprise()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for url in urls:
            if not app.add(url):
                raise ConfigError(
                    f"{where}.urls: apprise does not understand {mask_url(url)}",
                    "see https://github.com/caronc/apprise/wiki for the URL of each service",
                )
    return app


def compose(events: list[Event]) -> tuple[str, str, str]:
    """The title, body and severity of one message for ``events`` (one event, or a digest)."""
    worst = max(events, key=lambda e: severity_rank(e.severity)).severity
    if len(events) == 1:
        ev = events[0]
        body = [ev.message, *ev.lines]
        if ev.command:
            body.append(f"Act: {ev.command}")
        return f"runwatch {ev.severity}: {ev.title}", "\n".join(body), worst
    lines = [f"{len(events)} events:"]
    for ev in events:
        act = f"  ->  {ev.command}" if ev.command else ""
        lines.append(f"- {ev.severity.upper()} {ev.kind} {ev.title}: {ev.message}{act}")
    return f"runwatch {worst}: {len(events)} events", "\n".join(lines), worst


@dataclass
class Alerter:
    """Filters, deduplicates, rate-limits and hands events to the outboxes; see the module
    docstring."""

    config: AlertsConfig
    send: Sender | None = None
    """How a message goes out (default: apprise to each configured URL, one outbox each)."""
    clock: Callable[[], float] = time.monotonic
    spool: Path | None = None
    """The directory of the outboxes' spools (None: undelivered messages live in memory)."""
    pending: list[Event] = field(default_factory=list)
    """Events waiting for the rate limit."""
    deliveries: list[Delivery] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the alerter says about itself since the last :meth:`collect` (a URL failing)."""
    _sent_at: deque[float] = field(default_factory=deque)
    _keys: dict[str, float] = field(default_factory=dict)
    _outboxes: list[Outbox] | None = None
    _held: bool = False
    """Events waited for the rate limit: they go out as one digest."""

    @property
    def enabled(self) -> bool:
        return bool(self.config.urls) or self.send is not None

    def targets(self) -> list[str]:
        """The configured URLs, masked."""
        return [mask_url(u) for u in self.config.urls]

    def wanted(self, event: Event) -> bool:
        """True when the filters let ``event`` through."""
        if self.config.events and event.kind not in self.config.events:
            return False
        return severity_rank(event.severity) >= severity_rank(self.config.min_severity)

    def outboxes(self) -> list[Outbox]:
        """One outbox per URL (or one for ``send``), started at the first call: what an
        earlier watcher left in the spool goes out now."""
        if self._outboxes is None:
            self._outboxes = []
            if self.send is not None:
                self._outboxes.append(self._outbox("custom", "custom", self.send))
            else:
                apps = [(url, _apprise_for([url])) for url in self.config.urls]
                for url, app in apps:
                    self._outboxes.append(self._outbox(mask_url(url), url_key(url), _notify(app)))
            for box in self._outboxes:
                box.start()
        return self._outboxes

    def _outbox(self, target: str, key: str, send: Sender) -> Outbox:
        spool = None if self.spool is None else self.spool / key
        timeout = self.config.delivery_timeout_seconds
        return Outbox(target=target, send=send, spool=spool, deadline_s=timeout)

    async def submit(self, events: Iterable[Event]) -> list[Delivery]:
        """Queue the wanted, not recently sent events, hand what the rate limit allows to the
        outboxes, and return the results that came in since the last call (never waits on a
        delivery)."""
        now = self.clock()
        for ev in events:
            if not self.enabled or not self.wanted(ev):
                continue
            if ev.key in self._keys:
                continue
            self._keys[ev.key] = now
            self.pending.append(ev)
        return await self.flush()

    def keep_only(self, active: Iterable[str]) -> None:
        """Forget the sent keys not in ``active`` (conditions that cleared: news again when
        they come back)."""
        keep = set(active)
        self._keys = {k: t for k, t in self._keys.items() if k in keep}

    async def flush(self) -> list[Delivery]:
        """Hand pending events to the outboxes within the rate limit (one message each, or one
        digest); the results since the last call. The outboxes start at the first call, so that
        what an earlier watcher left in the spool goes out without waiting for news."""
        if self.enabled:
            self.outboxes()
        self._post_pending()
        return self.collect()

    def _post_pending(self) -> None:
        now = self.clock()
        while self._sent_at and now - self._sent_at[0] >= 60.0:
            self._sent_at.popleft()
        room = self.config.max_per_minute - len(self._sent_at)
        if not self.pending:
            return
        if room <= 0:
            self._held = True
            return
        batches: list[list[Event]]
        many = len(self.pending) > max(1, self.config.digest_over) or len(self.pending) > room
        if len(self.pending) > 1 and (many or self._held):
            batches = [list(self.pending)]
        else:
            batches = [[e] for e in self.pending]
        self.pending = []
        self._held = False
        for batch in batches:
            title, body, severity = compose(batch)
            title, body = mask_text(title), mask_text(body)  # a payload never carries a secret
            self._sent_at.append(now)
            msg = Message(
                title=title, body=body, severity=severity, created=time.time(), events=batch
            )
            for box in self.outboxes():
                box.post(msg)

    def collect(self) -> list[Delivery]:
        """The results of the outboxes since the last call; a URL failing for
        ``failing_minutes`` is reported to the others (once, until it delivers again)."""
        out: list[Delivery] = []
        boxes = self._outboxes or []
        now = time.time()
        for box in boxes:
            out += box.collect()
            if box.spool_error is None:
                box.spool_error_said = False
            elif not box.spool_error_said:
                box.spool_error_said = True
                self.notes.append(
                    f"alert spool of {box.target} not written ({box.spool_error}): alerts are "
                    "still sent, but one not delivered when this watcher stops is lost"
                )
            since = box.failing_since
            if since is None or box.failing_reported:
                continue
            if now - since < 60.0 * self.config.failing_minutes:
                continue
            box.failing_reported = True
            minutes = (now - since) / 60.0
            title = f"runwatch warning: alerts to {box.target} failing"
            body = (
                f"Alerts to {box.target} have failed for {minutes:.0f} min "
                f"({box.waiting} waiting; last error: {box.last_error}). They are retried with "
                "backoff and kept in the state dir until delivered.\n"
                "Act: check the receiver, or change [alerts] urls"
            )
            self.notes.append(f"alerts to {box.target} failing for {minutes:.0f} min")
            msg = Message(title=title, body=body, severity="warning", created=now)
            for other in boxes:
                if other is not box:
                    other.post(msg)
        self.deliveries.extend(out)
        del self.deliveries[:-EVENTS_KEPT]
        return out

    @property
    def waiting(self) -> int:
        """Messages not delivered yet, over every URL."""
        return sum(box.waiting for box in self._outboxes or [])

    @property
    def failed_attempts(self) -> int:
        """Delivery attempts that failed so far, over every URL, each retry counted."""
        return sum(box.failed for box in self._outboxes or [])

    async def drain(self, timeout: float) -> list[Delivery]:
        """Wait until every outbox is empty or ``timeout`` passes; the results since the last
        call (for a one-shot sender and for tests)."""
        deadline = time.monotonic() + timeout
        while self.waiting and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.collect()

    def close(self, grace: float = 0.0) -> None:
        """Stop the workers, giving the attempts under way up to ``grace`` seconds in all; what
        is not delivered stays in the spool."""
        deadline = time.monotonic() + grace
        for box in self._outboxes or []:
            box.close()
        for box in self._outboxes or []:
            box.join(max(0.0, deadline - time.monotonic()))


def _notify(app: Any) -> Sender:
    """``send`` through one ``apprise.Apprise`` (of one URL)."""

    def send(title: str, body: str, severity: str) -> bool:
        apprise = _import_apprise()
        kind = {
            "info": apprise.NotifyType.INFO,
            "warning": apprise.NotifyType.WARNING,
            "critical": apprise.NotifyType.FAILURE,
        }[severity]
        return bool(app.notify(body=body, title=title, notify_type=kind))

    return send
