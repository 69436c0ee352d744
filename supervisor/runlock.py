"""One action on a run at a time: the run's lock in the state dir, for processes and Slurm jobs.

Every action that stops or starts a run (a kill, a plan's execution, a Slurm cancel, submit or
adoption) holds ``state_dir()/runs/<config key>/<run>.lock`` (an ``flock``) for its whole length,
from any runwatch of this user: the dashboard, ``runwatch kill`` in another terminal, the
watcher's restart on failure. A second action waits for it, up to a bound, then refuses naming
the holder: what it does, who and from where (``supervisor.audit.actor``), since when. The lock
file holds that description while it is held; :func:`holder` reads it without taking the lock, so
the watcher knows a stop is under way before its audit record is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.errors import RunwatchError
from supervisor.paths import private_dir, state_dir

if TYPE_CHECKING:
    from supervisor.config import Config

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
POLL_S = 0.05
"""How often a waiting action tries the lock again (the holder's end is not signalled)."""


class RunBusy(RunwatchError):
    """Another action holds the run's lock past the wait."""


def lock_path(config: Config, run: str, *, make: bool = True) -> Path:
    """``state_dir()/runs/<config key>/<run>.lock``: held by every action on ``run``. ``make``:
    its directory made (an action); a reader (:func:`holder`) makes nothing, so a state dir that
    refuses writes never stops a refresh from seeing who holds a run (W22)."""
    directory = state_dir() / "runs" / config.key  # (a project's, wherever its file is: W26)
    if make or directory.is_dir():
        private_dir(directory)  # made if missing; refused when a link, another user's, ...
    return directory / f"{_SAFE.sub('_', run) or '_'}.lock"


def describe(info: dict[str, Any]) -> str:
    """``kill by root@box, pid 12, runwatch kill, since 14:02:11``."""
    if not info.get("since"):
        return str(info.get("by") or "holder unknown")
    since = time.strftime("%H:%M:%S", time.localtime(float(info.get("since") or 0)))
    return f"{info.get('action') or 'an action'} by {info.get('by') or '?'}, since {since}"


def _read(fd: int) -> dict[str, Any]:
    raw = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    try:
        info = json.loads(raw) if raw else {}
    except ValueError:
        return {"by": raw}
    return info if isinstance(info, dict) else {}


def holder(config: Config, run: str) -> dict[str, Any] | None:
    """Who holds ``run``'s lock now (what its file says), or None when nobody does."""
    try:
        path = lock_path(config, run, make=False)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read(fd) or {"by": "?"}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def holder_written(fd: int, action: str) -> Iterator[None]:
    """The holder's record in the lock file ``fd`` that it holds (what it does, who and from
    where, its pid, since when) while the block runs; emptied after it."""
    from supervisor.audit import actor

    info = {"action": action, "by": actor(), "pid": os.getpid(), "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)


@contextlib.asynccontextmanager
async def hold(
    config: Config,
    run: str,
    wait_s: float,
    action: str,
    on_wait: Callable[[str], None] | None = None,
) -> AsyncIterator[None]:
    """Hold the lock of ``run`` while the block runs. Waits up to ``wait_s`` for another holder
    (told to ``on_wait`` once, naming it), then raises :class:`RunBusy` naming it."""
    path = lock_path(config, run)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                other = describe(_read(fd))
                if time.monotonic() > deadline:
                    raise RunBusy(
                        f"run {run}: another runwatch action on it ({other}) has held its lock "
                        f"for more than {wait_s:g} s",
                        f"wait for it to end and try again; the lock is {path}",
                    ) from None
                if on_wait is not None and not told:
                    on_wait(f"run {run}: waiting for another runwatch action on it ({other})")
                    told = True
                await asyncio.sleep(POLL_S)
        with holder_written(fd, action):
            yield
    finally:
        os.close(fd)
