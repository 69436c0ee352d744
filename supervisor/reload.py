"""The watcher follows its config file: a changed file is read again at the next refresh.

A watcher lives for days, and a config changes under it (a run added for a switch to the API, a
budget raised). :class:`ConfigFile` notices a change by the file's identity, size and mtime (an
editor that writes a new file and renames it over the old one is a change too), reads it through
``config.load_config`` (every check of a fresh start), and says what differs (:func:`changes`).

- A valid edit is taken at once (``Engine.reconfigure``): hosts whose settings did not change
  keep their connection, a changed or new one connects at the next refresh, a dropped one is
  closed; runs and datasets are those of the new file.
- A broken edit (a TOML error, an unknown key, a run naming no host) keeps the config the watcher
  has, and says why with the file and key, once per version of the file.
- What cannot change under a running watcher (its state key: the config's ``project`` or path;
  the alert URLs and their delivery timeout, whose outboxes and spools are per URL; the exporter,
  already listening) is refused the same way, naming the fix: restart the watcher.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from supervisor.alerts import check_alerts
from supervisor.config import load_config
from supervisor.errors import ConfigError, RunwatchError

if TYPE_CHECKING:
    from supervisor.config import Config


Signature = tuple[int, int, int, int]
"""``(st_dev, st_ino, st_size, st_mtime_ns)`` of the config file; zeros when it is missing."""


def signature(path: str) -> Signature:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0, 0, 0)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class Reloaded:
    """One version of the file read: the new config, or why it was not taken."""

    config: Config | None
    changes: list[str]
    """What differs from the config in use (``run api added``), when taken."""
    refused: str | None = None
    """Why the file was not taken (the old config stays), naming the fix."""


class ConfigFile:
    """The config file a watcher was started with; :meth:`poll` once per refresh."""

    def __init__(self, config: Config) -> None:
        self.path = config.path
        self._seen = signature(config.path) if config.path else None

    def poll(self, current: Config) -> Reloaded | None:
        """None when the file has not changed since the last poll (or the watcher has no file),
        else the new version read and compared with ``current``."""
        if not self.path:
            return None
        now = signature(self.path)
        if now == self._seen:
            return None
        self._seen = now
        try:
            new = load_config(self.path)
            check_alerts(new.alerts, f"{self.path}: [alerts]")
        except RunwatchError as e:
            why = f"{e.message} ({e.hint})" if e.hint else e.message
            if not isinstance(e, ConfigError):
                why = f"{self.path}: {why}"
            return Reloaded(None, [], f"{why}; the watcher keeps the config it has")
        fixed = unchangeable(current, new)
        if fixed:
            return Reloaded(
                None,
                [],
                f"{self.path}: {fixed} cannot change under a running watcher; the watcher keeps "
                "the config it has: restart it (`runwatch watch`) to take the new one",
            )
        return Reloaded(new, changes(current, new))


def unchangeable(old: Config, new: Config) -> str:
    """What differs between ``old`` and ``new`` that a running watcher cannot take ('' if none)."""
    if old.key != new.key:
        return "its state key (`project`)"
    if list(old.alerts.urls) != list(new.alerts.urls):
        return "[alerts] urls"
    if old.alerts.delivery_timeout_seconds != new.alerts.delivery_timeout_seconds:
        return "[alerts] delivery_timeout_seconds"
    if old.exporter != new.exporter:
        return "[exporter]"
    return ""


_BY_NAME = ("hosts", "runs", "datasets", "endpoints", "path")
"""Config fields compared item by item (the rest as a whole)."""


def changes(old: Config, new: Config) -> list[str]:
    """``host gpu-2 added``, ``run api added``, ``run local changed``, ...: what differs."""
    out: list[str] = []
    for what, before, after in (
        ("host", {h.name: h for h in old.hosts}, {h.name: h for h in new.hosts}),
        ("run", {r.name: r for r in old.runs}, {r.name: r for r in new.runs}),
        ("dataset", dict(old.datasets), dict(new.datasets)),
        ("endpoint", {e.name: e for e in old.endpoints}, {e.name: e for e in new.endpoints}),
    ):
        out += [f"{what} {n} added" for n in after if n not in before]
        out += [f"{what} {n} dropped" for n in before if n not in after]
        out += [f"{what} {n} changed" for n in after if n in before and after[n] != before[n]]
    rest = [f.name for f in msgspec.structs.fields(new) if f.name not in _BY_NAME]
    out += [f"{name} changed" for name in rest if getattr(old, name) != getattr(new, name)]
    return out or ["nothing that runwatch uses changed"]
