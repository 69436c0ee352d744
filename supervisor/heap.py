"""Giving the C heap's free pages back to the system, so that a watcher's resident memory says
what it holds.

CPython hands every object larger than 512 bytes to the C library's ``malloc``. glibc keeps what
is freed inside its heaps and returns memory only from the very top of a heap, so a refresh that
briefly needs a few megabytes more than the ones before (a larger agent reply, more runs on the
screen) leaves those pages resident for good, free but counted. Measured on the dashboard's
60-minute benchmark: its ``[heap]`` grew by 1.6 MB in one refresh at minute 28, and
``malloc_trim(0)`` then gave back 2.0 MB of it. ``malloc_trim`` releases the free pages inside
every heap (with ``madvise``), not only the top; it takes about a millisecond.

Elsewhere than glibc (macOS, musl) there is nothing to call and :func:`release` does nothing.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

TRIM_EVERY_S = 60.0
"""How often a long-lived process gives free heap pages back."""


def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim  # this process's own C library
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_TRIM = _malloc_trim()


def release() -> bool:
    """Give every free page of the C heaps back to the system; False when this C library
    cannot (nothing was done)."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class Trimmer:
    """Calls :func:`release` at most every ``every`` seconds (of the ``now`` it is given)."""

    def __init__(self, every: float = TRIM_EVERY_S) -> None:
        self.every = every
        self._last: float | None = None

    def maybe(self, now: float) -> bool:
        """Release if ``every`` seconds have passed since the last release (or none was made);
        True when it released."""
        if self._last is not None and now - self._last < self.every:
            return False
        self._last = now
        return release()
