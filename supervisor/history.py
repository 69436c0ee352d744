"""Rate history: bounded rings of points per dataset, run, endpoint and GPU, kept by the engine
and persisted in the state dir so that a one-shot ``status`` or ``compare`` answers with rates at
once and the dashboard opens with the last hours.

A ring holds points ``(t, v1, v2, ...)`` at least ``STEP_S`` apart, at most ``MAX_POINTS`` of them
(``STEP_S x MAX_POINTS`` = 3 hours); the newest point is always the latest observation (it replaces
the previous newest while that one is less than ``STEP_S`` after the one before it). Rings whose
newest point is older than ``MAX_AGE_S`` are dropped.

On disk: ``$XDG_STATE_HOME/runwatch/configs/<config key>/history.db`` (``Config.key``), a SQLite
database (standard library) in WAL mode, mode 0600, one row per point keyed by (ring, time).
A save writes only what changed since the last one (the points appended, the newest replaced,
the points a full ring let go), so its cost follows the refresh, not how long the fleet has been
watched; a ring is read from disk when it is first asked for, so a one-shot ``status`` reads the
rings it shows and no others. Several processes of one config (a watcher, a dashboard, a
``status``) share the file: SQLite serialises their writes, and a point two of them wrote is one
row. A file that cannot be read is ignored (history is a convenience, never a source of truth)
and replaced on the next save; the ``history.json`` of an older runwatch is not read.
"""

from __future__ import annotations

import contextlib
import math
import os
import sqlite3
import sys
import time
from array import array
from collections.abc import Iterator
from pathlib import Path

from supervisor.errors import RunwatchError
from supervisor.paths import config_state, open_private

STEP_S = 10.0
MAX_POINTS = 1080
MAX_AGE_S = 24 * 3600.0
BUSY_S = 0.25
"""How long a save waits for another process's write to the file before it leaves its points to
the next save."""
TRIM_EVERY = 64
"""A full ring's rows older than its oldest point are deleted once this many are."""
PRUNE_EVERY_S = 3600.0
"""How often a process drops the rings of the file that are older than ``MAX_AGE_S`` (a scan of
the whole file, done at the first save and then at most this often)."""

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
    return config_state(key) / "history.db"


def saved_at(path: Path) -> int:
    """When the history at ``path`` was last written to (ns; 0: never): a save lands in the
    database's write-ahead log first."""
    stamps = [0]
    for name in (f"{path}-wal", str(path)):
        with contextlib.suppress(FileNotFoundError):
            stamps.append(os.stat(name).st_mtime_ns)
    return max(stamps)


class History:
    """The rings of one config, read lazily from and saved to the database ``path`` (None:
    memory only)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._rings: dict[str, Ring] = {}
        self._fetched: set[str] = set()
        """Keys whose ring was read from disk (or found absent there) already."""
        self._changed: set[str] = set()
        """Keys whose ring changed since the last save (dropped ones included)."""
        self._saved: dict[str, float] = {}
        """Key -> the time of its newest point on disk, as this process last wrote or read it."""
        self._let_go: dict[str, int] = {}
        """Key -> points its full ring let go since their rows were last deleted."""
        self._db: sqlite3.Connection | None = None
        self._broken = False
        self._pruned_at: float | None = None

    @property
    def dirty(self) -> bool:
        return bool(self._changed)

    # ------------------------------------------------------------------ points

    def _ring(self, key: str) -> Ring | None:
        if key not in self._fetched:
            self._fetched.add(key)
            if key not in self._rings:
                self._read(key)
        return self._rings.get(key)

    def add(self, key: str, t: float, *values: float, keep_newest: bool = False) -> None:
        """``keep_newest``: append even when the newest point is recent (it records a change of
        state that replacing it would hide)."""
        point = (round(t, 2), *(round(v, 4) for v in values))
        ring = self._ring(key)
        if ring is None:
            ring = self._rings[key] = Ring(len(point))
        if ring and t <= ring[-1][0]:
            return
        if not keep_newest and len(ring) >= 2 and ring[-1][0] - ring[-2][0] < STEP_S:
            ring[-1] = point
        else:
            ring.append(point)
        self._changed.add(key)

    def newest(self, key: str) -> Point | None:
        ring = self._ring(key)
        return ring[-1] if ring else None

    def points(self, key: str, since: float | None = None) -> list[Point]:
        ring = self._ring(key)
        if not ring:
            return []
        return [p for p in ring if since is None or p[0] >= since]

    def values(self, key: str, column: int = 1, limit: int = 120) -> list[float]:
        """One column of a ring, oldest first (the last ``limit`` points; only those are read)."""
        ring = self._ring(key)
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
        ring = self._ring(key)
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
        """Every ring's key, in memory or on disk."""
        keys = dict.fromkeys(self._rings)
        db = self._connect()
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                keys.update(dict.fromkeys(k for (k,) in db.execute(_KEYS)))
        return [k for k in keys if k in self._rings or k not in self._fetched]

    def drop(self, key: str) -> None:
        """Forget the ring of ``key`` (it is gone from the file at the next save)."""
        self._fetched.add(key)
        if self._rings.pop(key, None) is not None or key in self._saved:
            self._changed.add(key)

    # ------------------------------------------------------------------ disk

    def load(self) -> None:
        """Open the file (rings are read from it as they are asked for; a missing or unreadable
        file leaves the history empty)."""
        self._connect()

    def _connect(self) -> sqlite3.Connection | None:
        if self.path is None or self._broken:
            return None
        if self._db is None:
            try:
                self._db = _open(self.path)
            except (OSError, sqlite3.Error, RunwatchError):
                self._broken = True  # replaced at the next save
        return self._db

    def _read(self, key: str) -> None:
        db = self._connect()
        if db is None:
            return
        try:
            rows = db.execute(_READ, (key, MAX_POINTS)).fetchall()
        except sqlite3.Error:
            return
        if not rows:
            return
        points = [(t, *array("d", v)) for t, v in reversed(rows)]
        ring = self._rings[key] = Ring(max(len(p) for p in points))
        for point in points:
            ring.append(point)
        self._saved[key] = points[-1][0]

    def save(self, now: float) -> None:
        """Write what changed since the last save, dropping rings older than ``MAX_AGE_S``."""
        for key in [k for k, r in self._rings.items() if not r or r[-1][0] < now - MAX_AGE_S]:
            del self._rings[key]
            self._changed.add(key)
        changed, self._changed = self._changed, set()
        if self.path is None:
            return
        if self._broken:
            self._replace()
        db = self._connect()
        if db is None:
            return
        rows: list[tuple[str, float, bytes]] = []
        deletes: list[tuple[str, float]] = []
        trims: list[tuple[str, float]] = []
        drops: list[tuple[str]] = []
        before = {k: self._saved[k] for k in changed if k in self._saved}
        for key in changed:
            self._changes(key, rows, deletes, trims, drops)

        def undo() -> None:  # tried again at the next save
            self._changed |= changed
            for key in changed:
                self._saved.pop(key, None)
            self._saved.update(before)

        try:
            # One transaction, its write lock taken first: another process of the config that
            # writes now (or was stopped, Ctrl-Z, while it did) costs this save, never a wait.
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            undo()
            return
        try:
            db.executemany(_DROP, drops)
            db.executemany(_DELETE, deletes)
            db.executemany(_WRITE, rows)
            db.executemany(_TRIM, trims)
            if self._pruned_at is None or time.monotonic() - self._pruned_at >= PRUNE_EVERY_S:
                db.execute(_PRUNE, (now - MAX_AGE_S,))
                self._pruned_at = time.monotonic()
            db.execute("COMMIT")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            undo()
            raise OSError(f"{self.path}: history not saved") from None

    def _changes(
        self,
        key: str,
        rows: list[tuple[str, float, bytes]],
        deletes: list[tuple[str, float]],
        trims: list[tuple[str, float]],
        drops: list[tuple[str]],
    ) -> None:
        """What a save writes of the ring ``key``: the points newer than the newest saved, the
        newest saved when it was replaced, the points a full ring let go; or the ring's drop."""
        ring = self._rings.get(key)
        last = self._saved.pop(key, None)
        if ring is None:
            drops.append((key,))
            return
        kept = None
        written = len(rows)
        for p in reversed(ring):
            if last is not None and p[0] <= last:
                kept = p[0]
                break
            rows.append((key, p[0], array("d", p[1:]).tobytes()))
        if last is not None and kept != last:
            deletes.append((key, last))  # the newest saved was replaced
        if len(ring) == MAX_POINTS:
            # What a full ring let go, once TRIM_EVERY points are: a row deleted per point
            # would double what a save writes (a read takes the newest MAX_POINTS rows).
            self._let_go[key] = self._let_go.get(key, 0) + len(rows) - written
            if self._let_go[key] >= TRIM_EVERY:
                trims.append((key, ring[0][0]))
                self._let_go[key] = 0
        self._saved[key] = ring[-1][0]

    def _replace(self) -> None:
        """Start a new file in place of one that could not be read."""
        self.close()
        assert self.path is not None
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")
        self._broken = False
        self._saved.clear()
        self._changed = set(self._rings)

    def close(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS points (key TEXT NOT NULL, t REAL NOT NULL, v BLOB NOT NULL, "
    "PRIMARY KEY (key, t)) WITHOUT ROWID"
)
_KEYS = "SELECT DISTINCT key FROM points"
_READ = "SELECT t, v FROM points WHERE key = ? ORDER BY t DESC LIMIT ?"
_WRITE = "INSERT OR REPLACE INTO points (key, t, v) VALUES (?, ?, ?)"
_DELETE = "DELETE FROM points WHERE key = ? AND t = ?"
_TRIM = "DELETE FROM points WHERE key = ? AND t < ?"
_DROP = "DELETE FROM points WHERE key = ?"
_PRUNE = "DELETE FROM points WHERE key IN (SELECT key FROM points GROUP BY key HAVING max(t) < ?)"


def _open(path: Path) -> sqlite3.Connection:
    """The database at ``path``, made a private file (0600, never through a link) before SQLite
    opens it; its journal files take the same mode."""
    os.close(open_private(path, os.O_RDWR | os.O_CREAT))
    db = sqlite3.connect(str(path), timeout=BUSY_S, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(_SCHEMA)
    except sqlite3.Error:
        db.close()
        raise
    return db
