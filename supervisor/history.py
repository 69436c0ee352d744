"""Rate history: bounded rings of points per dataset, run, endpoint and GPU, kept by the engine
and persisted in the state dir so that a one-shot ``status`` or ``compare`` answers with rates at
once and the dashboard opens with the last hours.

A ring holds points ``(t, v1, v2, ...)`` at least ``STEP_S`` apart, at most ``MAX_POINTS`` of them
(``STEP_S x MAX_POINTS`` = 3 hours); the newest point is always the latest observation (it replaces
the previous newest while that one is less than ``STEP_S`` after the one before it). Rings whose
newest point is older than ``MAX_AGE_S`` are dropped.

On disk: ``$XDG_STATE_HOME/runwatch/configs/<config key>/history.json`` (``Config.key``), one
compact JSON object ``{"version": 1, "rings": {key: [[t, v...], ...]}}``, written atomically (a
temporary file in the same directory, fsynced, then renamed over the old one), mode 0600. The
``history/<id>.json`` files of an older runwatch are not read. A file that cannot be read is
ignored (history is a convenience, never a source of truth) and replaced on the next save.
"""

from __future__ import annotations

import json
import math
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path

from supervisor.errors import RunwatchError
from supervisor.paths import config_state, read_private, write_private_chunks

STEP_S = 10.0
MAX_POINTS = 1080
MAX_AGE_S = 24 * 3600.0
VERSION = 1

Point = tuple[float, ...]


class Ring:
    """At most ``MAX_POINTS`` points, oldest first, kept flat in one ``array('d')`` of ``width``
    floats per point (a point shorter than the ring's width, as an older file may hold, is padded
    with NaN and read back without it). A point as a tuple of floats costs five times as much,
    and a watcher keeps a ring per dataset, run, endpoint and GPU for 3 hours."""

    __slots__ = ("_data", "_n", "_start", "width")

    def __init__(self, width: int) -> None:
        self.width = width
        self._data = array("d")
        self._start = 0
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def nbytes(self) -> int:
        """The bytes the array holding the points takes, spare room included."""
        return sys.getsizeof(self._data)

    def _slot(self, i: int) -> int:
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return (self._start + i) % MAX_POINTS * self.width

    def __getitem__(self, i: int) -> Point:
        at = self._slot(i)
        point = self._data[at : at + self.width]
        n = len(point)
        while n > 1 and math.isnan(point[n - 1]):
            n -= 1
        return tuple(point[:n])

    def __setitem__(self, i: int, point: Point) -> None:
        if len(point) > self.width:
            self._widen(len(point))
        at = self._slot(i)
        self._data[at : at + self.width] = self._padded(point)

    def _padded(self, point: Point) -> array[float]:
        return array("d", point[: self.width] + (math.nan,) * (self.width - len(point)))

    def _widen(self, width: int) -> None:
        points = list(self)
        self.width, self._data, self._start, self._n = width, array("d"), 0, 0
        for p in points:
            self.append(p)

    def append(self, point: Point) -> None:
        if len(point) > self.width:
            self._widen(len(point))
        if self._n < MAX_POINTS:
            self._data.extend(self._padded(point))
            self._n += 1
        else:
            at = self._start * self.width
            self._data[at : at + self.width] = self._padded(point)
            self._start = (self._start + 1) % MAX_POINTS

    def __iter__(self) -> Iterator[Point]:
        return (self[i] for i in range(self._n))

    def __reversed__(self) -> Iterator[Point]:
        return (self[i] for i in range(self._n - 1, -1, -1))


def history_path(key: str) -> Path:
    """Where the history of the config ``key`` (``Config.key``) is kept."""
    return config_state(key) / "history.json"


class History:
    """The rings of one config, loaded from and saved to ``path`` (None: memory only)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._rings: dict[str, Ring] = {}
        self.dirty = False

    # ------------------------------------------------------------------ points

    def add(self, key: str, t: float, *values: float, keep_newest: bool = False) -> None:
        """``keep_newest``: append even when the newest point is recent (it records a change of
        state that replacing it would hide)."""
        point = (round(t, 2), *(round(v, 4) for v in values))
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = Ring(len(point))
        if ring and t <= ring[-1][0]:
            return
        if not keep_newest and len(ring) >= 2 and ring[-1][0] - ring[-2][0] < STEP_S:
            ring[-1] = point
        else:
            ring.append(point)
        self.dirty = True

    def newest(self, key: str) -> Point | None:
        ring = self._rings.get(key)
        return ring[-1] if ring else None

    def points(self, key: str, since: float | None = None) -> list[Point]:
        ring = self._rings.get(key)
        if not ring:
            return []
        return [p for p in ring if since is None or p[0] >= since]

    def values(self, key: str, column: int = 1, limit: int = 120) -> list[float]:
        """One column of a ring, oldest first (the last ``limit`` points; only those are read)."""
        ring = self._rings.get(key)
        if not ring:
            return []
        n = len(ring)
        newest = (ring[i] for i in range(max(0, n - limit), n))
        return [p[column] for p in newest if len(p) > column]

    def rates(self, key: str, column: int = 2, limit: int = 120) -> list[float]:
        """Per-interval rate of a cumulative column (tokens/s from token counts), oldest first,
        the last ``limit`` of them; an interval where the count went down (a rescan) is left
        out, and so is the newest one while it is shorter than ``STEP_S`` (a second or two says
        nothing of a rate). Read from the newest point back, as far as ``limit`` needs: every
        refresh asks this of every ring, and a full ring holds 3 hours."""
        ring = self._rings.get(key)
        if not ring:
            return []
        newest = reversed(ring)
        b = next(newest)
        if len(ring) >= 3 and b[0] - ring[-2][0] < STEP_S:
            b = next(newest)
        out = []
        for a in newest:
            dt = b[0] - a[0]
            if dt > 0 and len(a) > column and len(b) > column and b[column] >= a[column]:
                out.append((b[column] - a[column]) / dt)
                if len(out) == limit:
                    break
            b = a
        out.reverse()
        return out[-limit:]

    def keys(self) -> list[str]:
        return list(self._rings)

    def drop(self, key: str) -> None:
        """Forget the ring of ``key`` (it is gone from the file at the next save)."""
        if self._rings.pop(key, None) is not None:
            self.dirty = True

    # ------------------------------------------------------------------ disk

    def load(self) -> None:
        """Read the file (a missing or unreadable one leaves the history empty)."""
        if self.path is None:
            return
        try:
            data = json.loads(read_private(self.path))
        except (OSError, ValueError, RunwatchError):
            return
        if not isinstance(data, dict) or data.get("version") != VERSION:
            return
        rings = data.get("rings")
        if not isinstance(rings, dict):
            return
        for key, pts in rings.items():
            if not isinstance(key, str) or not isinstance(pts, list):
                continue
            good = [
                tuple(float(v) for v in p)
                for p in pts
                if isinstance(p, list)
                and p
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p)
            ]
            if good:
                ring = self._rings[key] = Ring(max(len(p) for p in good))
                for point in good:
                    ring.append(point)

    def save(self, now: float) -> None:
        """Write the file atomically, dropping rings older than ``MAX_AGE_S``."""
        for key in [k for k, r in self._rings.items() if not r or r[-1][0] < now - MAX_AGE_S]:
            del self._rings[key]
        self.dirty = False
        if self.path is None:
            return
        write_private_chunks(self.path, self._body())

    def _body(self) -> Iterator[bytes]:
        """The file, a ring at a time: 3 hours of every ring as one string would take a
        watcher's memory up by megabytes every save."""
        yield b'{"version":%d,"rings":{' % VERSION
        for n, (key, ring) in enumerate(self._rings.items()):
            points = json.dumps([list(p) for p in ring], separators=(",", ":"))
            yield f"{',' if n else ''}{json.dumps(key)}:{points}".encode()
        yield b"}}"
