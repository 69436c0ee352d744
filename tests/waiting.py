"""Waiting on a condition with a timeout: the one way tests (and benchmarks) synchronise.

- ``wait_until(condition, timeout=..., what=..., interval=...)`` polls ``condition()`` in the
  calling thread (run it with ``asyncio.to_thread`` from a coroutine that must not block the loop).
- ``await wait_for(condition, timeout=..., what=..., interval=...)`` polls it from a coroutine,
  yielding to the event loop between polls (for a Textual app driven by Pilot).
- ``await wait_for_async(condition, ...)`` awaits ``condition()`` at each poll (a condition that
  needs the engine: a refresh).

Both return the first truthy value of ``condition()`` and raise ``AssertionError`` naming what
was awaited and the timeout when it does not come in time.

A timeout is a bound on how long a broken test hangs, never a speed the test asserts: every one is
multiplied by ``SCALE`` (``RUNWATCH_TEST_WAIT_SCALE``; by default 3 when ``CI=true``, where a
fresh 2-core machine runs the whole suite under load, else 1).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 20.0
DEFAULT_INTERVAL = 0.02


def _scale() -> float:
    given = os.environ.get("RUNWATCH_TEST_WAIT_SCALE", "")
    if given:
        return max(1.0, float(given))
    return 3.0 if os.environ.get("CI", "").lower() == "true" else 1.0


SCALE = _scale()


def _describe(condition: Callable[..., object]) -> str:
    """The source of ``condition`` (a lambda reads best as its own text), else its repr."""
    try:
        return inspect.getsource(condition).strip()
    except (OSError, TypeError):
        return repr(condition)


def _check(
    condition: Callable[[], T | None], deadline: float, timeout: float, what: str | None
) -> T | None:
    """One poll: the value of ``condition()``; ``AssertionError`` once ``deadline`` has passed."""
    value = condition()
    if not value:
        _past(deadline, timeout, what, condition)
    return value


def _past(
    deadline: float, timeout: float, what: str | None, condition: Callable[..., object]
) -> None:
    """``AssertionError`` naming what was awaited once ``deadline`` has passed."""
    if time.monotonic() > deadline:
        raise AssertionError(
            f"timed out after {timeout:g} s waiting for {what or _describe(condition)}"
        )


def wait_until(
    condition: Callable[[], T | None],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    what: str | None = None,
    interval: float = DEFAULT_INTERVAL,
) -> T:
    """Poll ``condition`` until it returns something truthy (returned, never None) or fail after
    ``timeout``."""
    timeout *= SCALE
    deadline = time.monotonic() + timeout
    while not (value := _check(condition, deadline, timeout, what)):
        time.sleep(interval)  # polling interval of a condition wait, not a synchronisation
    return value


async def wait_for(
    condition: Callable[[], T | None],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    what: str | None = None,
    interval: float = DEFAULT_INTERVAL,
) -> T:
    """``wait_until`` for coroutines: the event loop runs between polls."""
    timeout *= SCALE
    deadline = time.monotonic() + timeout
    while not (value := _check(condition, deadline, timeout, what)):
        await asyncio.sleep(interval)
    return value


async def wait_for_async(
    condition: Callable[[], Awaitable[T | None]],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    what: str | None = None,
    interval: float = DEFAULT_INTERVAL,
) -> T:
    """``wait_for`` of a coroutine function: ``await condition()`` at each poll."""
    timeout *= SCALE
    deadline = time.monotonic() + timeout
    while not (value := await condition()):
        _past(deadline, timeout, what, condition)
        await asyncio.sleep(interval)
    return value
