"""A rebalance plan being applied: one apply at a time per config, and what it did so far.

``rebalance --apply`` holds the config's plan lock (``configs/<key>/rebalance.lock``, an
``flock``: released when its process ends, however it ends) for its whole length; a second apply
of the config refuses at once, naming the holder (:class:`PlanBusy`), and touches nothing.

Before its first step stops or starts anything, the apply writes its plan as an intent
(``configs/<key>/rebalance-intent.json``, 0600, replaced atomically), each step with its state
(``pending``, ``begun``, ``done``, ``failed``), updated before and after each step, removed when
the plan is applied or rolled back. An intent left behind (the apply was SIGKILLed, the laptop
went down) is a plan half-applied: ``status`` and the watcher report it, the watcher does not
restart its runs against it, and ``rebalance --apply --resume`` rolls back what it began.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import msgspec

from supervisor.errors import RunwatchError
from supervisor.paths import config_state, private_dir, read_private, write_private
from supervisor.runlock import holder_written

if TYPE_CHECKING:
    from pathlib import Path

    from supervisor.config import Config


class PlanBusy(RunwatchError):
    """Another apply of the config holds its plan lock."""


class StepState(msgspec.Struct, kw_only=True):
    """One step of the plan and how far it went."""

    run: str
    action: str
    """``restart``, ``launch`` or ``stop`` (as ``rebalance.Step``)."""
    datasets: list[str] = []
    previous: list[str] = []
    """The datasets the run wrote before (what a rollback gives it back)."""
    state: str = "pending"
    """``pending`` (not begun), ``begun`` (its outcome unknown), ``done``, ``failed`` or
    ``rolled back``."""


class PlanIntent(msgspec.Struct, kw_only=True):
    written: float
    by: str
    """The apply that wrote it (``supervisor.audit.actor``)."""
    pid: int
    steps: list[StepState]
    move_aside: bool = False
    allow_model_change: bool = False


def lock_path(config: Config) -> Path:
    return config_state(config.key) / "rebalance.lock"


def intent_path(config: Config) -> Path:
    return config_state(config.key) / "rebalance-intent.json"


@contextlib.contextmanager
def hold(config: Config, what: str, *, resuming: bool = False) -> Iterator[None]:
    """Hold the config's plan lock while the block runs, or raise :class:`PlanBusy` at once
    naming its holder (its pid, who, since when). Unless ``resuming``, a plan half-applied
    (an intent left by an apply that was killed) refuses too, naming the command that rolls it
    back."""
    from supervisor.config import command_prefix

    path = lock_path(config)
    private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raw = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            try:
                info = json.loads(raw) if raw else {}
            except ValueError:
                info = {}
            since = time.strftime("%H:%M:%S", time.localtime(float(info.get("since") or 0)))
            raise PlanBusy(
                f"another rebalance is being applied to this config (pid {info.get('pid', '?')}, "
                f"{info.get('by', '?')}, since {since}): nothing done",
                f"wait for pid {info.get('pid', '?')} to end (its steps are audited: "
                "`runwatch audit`), then plan again",
            ) from None
        left = None if resuming else read(config)
        if left is not None:
            raise PlanBusy(
                f"a rebalance plan is half-applied (written by {left.by}): nothing done",
                f"roll it back first: {command_prefix(config)} rebalance --apply --resume --yes",
            )
        with holder_written(fd, what):
            yield
    finally:
        os.close(fd)


def applying(config: Config) -> bool:
    """Whether an apply of ``config`` holds its plan lock now (its intent is then its own,
    not one left behind)."""
    try:
        fd = os.open(lock_path(config), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def write(config: Config, intent: PlanIntent) -> None:
    """Keep ``intent`` (atomically, 0600), replacing the one before."""
    intent.written = time.time()
    write_private(intent_path(config), msgspec.json.encode(intent) + b"\n")


def read(config: Config) -> PlanIntent | None:
    """The plan half-applied kept for ``config`` (None when there is none)."""
    try:
        return msgspec.json.decode(read_private(intent_path(config)), type=PlanIntent)
    except (FileNotFoundError, NotADirectoryError):
        return None


def remove(config: Config) -> None:
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        os.unlink(intent_path(config))


def runs_of(intent: PlanIntent) -> list[str]:
    """The runs of the steps begun or done: those the plan may have left as it should not."""
    return [s.run for s in intent.steps if s.state != "pending"]


def describe(intent: PlanIntent, resume: str) -> str:
    """``a rebalance plan is half-applied (written 14:02:11 by ..., pid 12, gone): stop local
    done, launch cloud begun -> `runwatch ... rebalance --apply --resume --yes```."""
    stamp = time.strftime("%H:%M:%S", time.localtime(intent.written))
    steps = ", ".join(f"{s.action} {s.run} {s.state}" for s in intent.steps)
    return (
        f"a rebalance plan is half-applied (last written {stamp} by {intent.by}): {steps}; "
        f"roll it back with `{resume}`"
    )
