"""Alerts: events sent through apprise (ntfy, Slack, Telegram, email, desktop, JSON webhooks...).

``Alerter(config.alerts)`` filters events (``events``, ``min_severity``), drops an event whose key
was sent already and not forgotten since (the watcher forgets a condition's key when it clears,
:meth:`Alerter.keep_only`), sends at most
``max_per_minute`` messages a minute (the rest wait for the next :meth:`Alerter.flush`) and folds
more than ``digest_over`` events at once into one digest message. Every message ends with the
command that acts on the event. The URLs usually hold tokens: they are only ever shown through
:func:`mask_url`, and apprise's own log is silenced (its messages can quote a URL).
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from supervisor.config import AlertsConfig
from supervisor.errors import ConfigError
from supervisor.events import EVENT_KINDS, EVENTS_KEPT, Event, severity_rank
from supervisor.secrets import mask_text

SEND_TIMEOUT_S = 20.0

Sender = Callable[[str, str, str], bool]
"""``send(title, body, severity) -> delivered``."""


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
class Delivery:
    """One message sent (or not)."""

    ok: bool
    title: str
    events: list[Event]
    error: str | None = None


@dataclass
class Alerter:
    """Filters, deduplicates, rate-limits and sends events; see the module docstring."""

    config: AlertsConfig
    send: Sender | None = None
    """How a message goes out (default: apprise to every configured URL)."""
    clock: Callable[[], float] = time.monotonic
    pending: list[Event] = field(default_factory=list)
    """Events waiting for the rate limit."""
    deliveries: list[Delivery] = field(default_factory=list)
    _sent_at: deque[float] = field(default_factory=deque)
    _keys: dict[str, float] = field(default_factory=dict)
    _apprise: Any = None
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

    async def submit(self, events: Iterable[Event]) -> list[Delivery]:
        """Queue the wanted, not recently sent events and send what the rate limit allows."""
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
        """Send pending events within the rate limit: one message each, or one digest."""
        now = self.clock()
        while self._sent_at and now - self._sent_at[0] >= 60.0:
            self._sent_at.popleft()
        room = self.config.max_per_minute - len(self._sent_at)
        if not self.pending:
            return []
        if room <= 0:
            self._held = True
            return []
        if self.send is None and self._apprise is None:
            self._apprise = _apprise_for(self.config.urls)
        batches: list[list[Event]]
        many = len(self.pending) > max(1, self.config.digest_over) or len(self.pending) > room
        if len(self.pending) > 1 and (many or self._held):
            batches = [list(self.pending)]
        else:
            batches = [[e] for e in self.pending]
        self.pending = []
        self._held = False
        out = []
        for batch in batches:
            title, body, severity = compose(batch)
            title, body = mask_text(title), mask_text(body)  # a payload never carries a secret
            self._sent_at.append(now)
            try:
                ok = await asyncio.wait_for(
                    asyncio.to_thread(self._deliver, title, body, severity), SEND_TIMEOUT_S
                )
                error = None if ok else "not delivered to every URL"
            except asyncio.TimeoutError:
                ok, error = False, f"no answer within {SEND_TIMEOUT_S:g} s"
            except Exception as e:  # a notifier's failure must not stop the watcher
                ok, error = False, type(e).__name__
            delivery = Delivery(ok=ok, title=title, events=batch, error=error)
            self.deliveries.append(delivery)
            del self.deliveries[:-EVENTS_KEPT]
            out.append(delivery)
        return out

    def _deliver(self, title: str, body: str, severity: str) -> bool:
        if self.send is not None:
            return self.send(title, body, severity)
        apprise = _import_apprise()
        kind = {
            "info": apprise.NotifyType.INFO,
            "warning": apprise.NotifyType.WARNING,
            "critical": apprise.NotifyType.FAILURE,
        }[severity]
        return bool(self._apprise.notify(body=body, title=title, notify_type=kind))
