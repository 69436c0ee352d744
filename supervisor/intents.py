"""Durable restart intents: a restart on failure that waits for its backoff survives its watcher.

Before a restart's backoff the watcher writes what it means to do: the run, the attempt, when it
may start (``not_before``, Unix seconds) and why, in
``state_dir()/intents/<config key>/<run>.json`` (0600, written atomically; the key is
``Config.key``: the config file's, or its ``project``'s, which survives moving the file). The
intent is removed once the restart is made, given up, or the run is seen running again. A watcher
that starts on the config reads the intents left by one that died (``kill -9``, a reboot of the
laptop) and takes each over, or says why it abandons it (the run is gone from the config, no
longer ``on_exit = "restart"``, the file is unreadable): a watcher's death never leaves a run
silently down.

A kill of the run (from any front end, through ``Engine.kill`` or ``Engine.cancel_restarts``)
cancels its intent (:func:`cancel`), audited as ``restart-cancelled``; a restart checks, under the
run's lock, that its intent is still the one it wrote (``Engine.execute(intent=...)``), so a
cancelled restart never starts, in this watcher or the next. A restart about to start is marked
``started`` first: a watcher killed at that instant leaves an intent that the next watcher
audits (the run found running: the restart was made; not running: it was interrupted, and is
made again).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from supervisor.errors import UnsafeState
from supervisor.paths import private_dir, read_private, state_dir, write_private

if TYPE_CHECKING:
    from supervisor.config import Config

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class Intent(msgspec.Struct, kw_only=True):
    """One pending restart on failure."""

    run: str
    host: str
    attempt: int
    """The restart's number in its window (1 for the first)."""
    not_before: float
    """Unix seconds: the end of its backoff."""
    reason: str
    written: float
    by: str
    """The watcher that wrote it (``supervisor.audit.actor``)."""
    started: float | None = None
    """Unix seconds: when its watcher began the restart (None while it waits)."""
    started_by: str | None = None


def directory(config: Config) -> Path:
    """``state_dir()/intents/<config key>`` (``Config.key``: a config's ``project`` survives
    moving its file, W26)."""
    return state_dir() / "intents" / config.key


def path_of(config: Config, run: str) -> Path:
    return directory(config) / f"{_SAFE.sub('_', run) or '_'}.json"


def write(config: Config, intent: Intent) -> None:
    """Keep ``intent`` (replacing the run's previous one)."""
    private_dir(directory(config))
    write_private(path_of(config, intent.run), msgspec.json.encode(intent) + b"\n")


def remove(config: Config, run: str) -> None:
    """Forget ``run``'s intent (done, given up, or the run is back)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # (never written)
        os.unlink(path_of(config, run))


def read(config: Config, run: str) -> Intent | None:
    """``run``'s intent as kept now (None when there is none)."""
    try:
        return msgspec.json.decode(read_private(path_of(config, run)), type=Intent)
    except (FileNotFoundError, NotADirectoryError):
        return None


def cancel(config: Config, run: str) -> Intent | None:
    """Remove ``run``'s intent and return it (None when there was none; an unreadable one is
    removed too and returned as None)."""
    try:
        found = read(config, run)
    except (OSError, msgspec.DecodeError, UnsafeState):
        found = None
    remove(config, run)
    return found


def describe(intent: Intent, now: float | None = None) -> str:
    """``restart 2 of run-died: ... (due in 41 s, written 9 s ago by root@box ...)``."""
    now = time.time() if now is None else now
    when = (
        f"begun {max(0.0, now - intent.started):.0f} s ago by {intent.started_by}"
        if intent.started is not None
        else f"due in {max(0.0, intent.not_before - now):.0f} s"
    )
    return f"restart {intent.attempt} ({intent.reason}; {when}, {age_text(intent, now)})"


def begun_outcome(intent: Intent, running: bool, now: float | None = None) -> str:
    """The audit detail of a restart its watcher began and never recorded (it ended first), by
    what is found now: the run running (the restart was made) or not (it was interrupted)."""
    how = (
        "the run is running: the restart was made"
        if running
        else "the run is not running: the restart was interrupted"
    )
    return f"{describe(intent, now)}, by a watcher that ended before recording it; {how}"


def pending(config: Config) -> tuple[list[Intent], list[tuple[Path, str]]]:
    """The intents kept for ``config``, and the files that could not be read (with why)."""
    found: list[Intent] = []
    bad: list[tuple[Path, str]] = []
    try:
        names = sorted(os.listdir(directory(config)))
    except FileNotFoundError:
        return found, bad
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = directory(config) / name
        try:
            found.append(msgspec.json.decode(read_private(path), type=Intent))
        except (OSError, msgspec.DecodeError, UnsafeState) as e:
            bad.append((path, str(e)))
    return found, bad


def age_text(intent: Intent, now: float | None = None) -> str:
    """``written 3 s ago by root@box, pid 12, runwatch watch``."""
    ago = max(0.0, (time.time() if now is None else now) - intent.written)
    return f"written {ago:.0f} s ago by {intent.by}"
