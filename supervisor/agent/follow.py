"""Following growing files: how far each was read, and whether it is still the same file.

Standard library only, Python >= 3.8: this module runs inside the host agent on GPU hosts. It
knows nothing of records; :mod:`supervisor.agent.scan` parses and counts the bytes that a
:class:`Follower` says are new.

Per file a :class:`Position` is kept between calls:

* ``offset`` - end of the last complete line counted; a partial last line is left for later (D1);
* a fingerprint - ``(st_dev, st_ino)`` and a hash of the first bytes of the file;
* a hash of the bytes just before ``offset`` (the tail of the last complete line).

Before reading, :meth:`Follower.resume` checks the fingerprint, the size and both hashes. A new
inode (replacement, rotation), a size below the offset (truncation, copytruncate) or changed
bytes (truncate-then-regrow past the offset, inode reuse) start a clean rescan from zero with a
fresh position and fresh counters: nothing is ever counted twice (D4, D5). A new inode that
begins with what was read (same head, same bytes before the old offset: an atomic rewrite by
the client) is said as such (:data:`KEPT`): counted again, but nothing was lost (W24). The epoch in
:meth:`Follower.stream` changes on every rescan, so the laptop knows to drop what it accumulated
from earlier results.

A missing, unreadable or non-regular path raises :class:`Unfollowable` with a ``state`` for the
reply, never a bare ``OSError``. Companion files (the error and skipped files beside a dataset)
are followed by their newline count alone (:meth:`Follower.companions`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from supervisor.agent import safefs

HEAD_BYTES = 4096
"""Bytes of the head of a file that fingerprint it."""
TAIL_BYTES = 4096
"""Bytes before the offset whose hash must match for an incremental read."""

if TYPE_CHECKING:  # annotations only: subscripting collections.abc fails on Python 3.8
    from collections.abc import Callable


class Position:
    """Where a followed file was read to and what identifies it; a scanner's per-file state
    extends it with its counters (one flat object: the counting loop sets ``offset`` per line)."""

    def __init__(self, epoch: int, settings: tuple[Any, ...]) -> None:
        self.epoch = epoch
        self.settings = settings
        self.dev = -1
        self.ino = -1
        self.head_len = 0
        self.head_hash = b""
        self.tail_len = 0
        self.tail_hash = b""
        self.offset = 0


P = TypeVar("P", bound=Position)


class Unfollowable(Exception):
    """A path that cannot be read as a file: ``state`` is ``missing``, ``unreadable``,
    ``not-a-file`` or ``error``; ``message`` says why."""

    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.state = state
        self.message = message


def unfollowable(e: OSError) -> Unfollowable:
    """The state and message for an ``OSError`` met while opening or reading a file."""
    if e.errno == errno.ENOENT:
        return Unfollowable("missing", "no such file")
    if e.errno in (errno.EACCES, errno.EPERM):
        return Unfollowable("unreadable", "permission denied")
    if e.errno in (errno.EISDIR, errno.ENOTDIR, errno.ELOOP, errno.ENXIO):
        return Unfollowable("not-a-file", os.strerror(e.errno))
    return Unfollowable("error", e.strerror or str(e))


class Follower(Generic[P]):
    """The positions of many followed files, keyed by path.

    Args:
        chunk_size: bytes per read when counting the lines of companion files.
    """

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self._files: dict[str, P] = {}
        self._epochs: dict[str, int] = {}
        self._token = os.urandom(6).hex()
        self._line_counts: dict[str, tuple[int, int, int, int]] = {}

    def open(self, path: str) -> tuple[Any, os.stat_result]:
        """``path`` opened for unbuffered binary reading, and its stat.

        Raises :class:`Unfollowable` (and forgets the path) when it is missing, unreadable or not
        a regular file. Opening never blocks, even on a FIFO.
        """
        try:  # never through another user's link: its target is not this run's data
            fd = safefs.open_file(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except safefs.UnsafePath as e:
            self.drop(path)
            raise Unfollowable("unreadable", str(e)) from None
        except OSError as e:
            self.drop(path)
            raise unfollowable(e) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Unfollowable("not-a-file", "not a regular file")
            return os.fdopen(fd, "rb", buffering=0), st
        except OSError as e:
            os.close(fd)
            self.drop(path)
            raise unfollowable(e) from None
        except Unfollowable:
            os.close(fd)
            self.drop(path)
            raise

    def get(self, path: str) -> P | None:
        """The position (and what the reader keeps with it) of ``path``, if followed."""
        return self._files.get(path)

    def following(self, path: str) -> bool:
        """Whether a position of ``path`` is kept (its next read starts there, not at zero)."""
        return path in self._files

    def drop(self, path: str) -> None:
        """Forget the position of ``path`` (its next read starts from zero)."""
        self._files.pop(path, None)

    def resume(
        self,
        path: str,
        f: Any,
        st: os.stat_result,
        settings: tuple[Any, ...],
        new: Callable[[int], P],
    ) -> tuple[P, str | None]:
        """The position to read ``path`` on from, and why it starts again from zero (or None).

        ``new(epoch)`` makes a fresh position (with fresh counters) when there is none yet or
        the remembered one no longer applies: other ``settings``, another file, or changed
        bytes. The head of the file is hashed until :data:`HEAD_BYTES` of it exist.
        """
        state = self._files.get(path)
        reason: str | None = None
        if state is not None:
            reason = _changed(state, f, st, settings)
            if reason is not None:
                state = None
        if state is None:
            epoch = self._epochs.get(path, 0) + 1
            self._epochs[path] = epoch
            state = new(epoch)
            self._files[path] = state
            state.dev, state.ino = st.st_dev, st.st_ino
        _remember_head(state, f)
        return state, reason

    def advanced(self, state: Position, f: Any, start: int) -> None:
        """Remember the bytes before the new offset after a read that began at ``start``."""
        if state.offset != start or state.tail_len == 0:
            k = min(state.offset, TAIL_BYTES)
            f.seek(state.offset - k)
            state.tail_len, state.tail_hash = k, hashlib.sha1(f.read(k)).digest()
        _remember_head(state, f)

    def stream(self, state: Position) -> str:
        """The id of the stream of results of one epoch of one file (new on every rescan)."""
        return f"{self._token}:{state.epoch}"

    def companions(self, path: str, words: tuple[str, ...]) -> list[dict[str, Any]]:
        """Line counts of the files beside ``path`` whose names hold one of ``words``."""
        directory = os.path.dirname(path) or "."
        base = os.path.basename(path)
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            return []
        out = []
        for name in names:
            low = name.lower()
            kind = next((w for w in words if w in low), None)
            if kind is None or name == base or not low.endswith(".jsonl"):
                continue
            full = os.path.join(directory, name)
            lines = self.count_lines(full)
            if lines is not None:
                out.append({"path": full, "kind": kind, "lines": lines})
        return out

    def count_lines(self, path: str) -> int | None:
        """Newlines in a file, counting only appended bytes since the last call."""
        try:
            with os.fdopen(safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK), "rb", 0) as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    return None
                dev, ino, offset, lines = self._line_counts.get(path, (-1, -1, 0, 0))
                if (dev, ino) != (st.st_dev, st.st_ino) or st.st_size < offset:
                    offset = lines = 0
                f.seek(offset)
                while offset < st.st_size:
                    data = f.read(min(self.chunk_size, st.st_size - offset))
                    if not data:
                        break
                    lines += data.count(b"\n")
                    offset += len(data)
                self._line_counts[path] = (st.st_dev, st.st_ino, offset, lines)
                return lines
        except (OSError, safefs.UnsafePath):
            return None


def _holds_what_was_read(state: Position, f: Any, st: os.stat_result) -> bool:
    """True when another file at the path begins with the lines read from the old one, by the
    evidence an incremental read of the same file trusts: at least as long, the same head and
    the same bytes before the old offset."""
    if state.offset <= 0 or st.st_size < state.offset:
        return False
    if state.head_len:
        f.seek(0)
        if hashlib.sha1(f.read(state.head_len)).digest() != state.head_hash:
            return False
    if state.tail_len:
        f.seek(state.offset - state.tail_len)
        if hashlib.sha1(f.read(state.tail_len)).digest() != state.tail_hash:
            return False
    return bool(state.head_len or state.tail_len)


def _remember_head(state: Position, f: Any) -> None:
    """Hash the file's first bytes, up to ``HEAD_BYTES`` and never past the offset: a partial
    last line is not part of the file's identity (its repair must not read as a rewrite)."""
    limit = min(state.offset, HEAD_BYTES)
    if state.head_len < limit:
        f.seek(0)
        head = f.read(limit)
        state.head_len, state.head_hash = len(head), hashlib.sha1(head).digest()


KEPT = "new inode holding every line read before (an atomic rewrite)"
"""The rescan reason of a file replaced by one that begins with every line already read (a
client that rewrites its output to a temporary file and renames it over): counted again from
zero, and no data was lost (W24)."""


def _changed(state: Position, f: Any, st: os.stat_result, settings: tuple[Any, ...]) -> str | None:
    """Why the remembered position no longer applies to this file, or None."""
    if state.settings != settings:
        return "format changed"
    if (st.st_dev, st.st_ino) != (state.dev, state.ino):
        return KEPT if _holds_what_was_read(state, f, st) else "file replaced (new inode)"
    if st.st_size < state.offset:
        return "file truncated"
    if state.head_len:
        f.seek(0)
        if hashlib.sha1(f.read(state.head_len)).digest() != state.head_hash:
            return "file rewritten (head changed)"
    if state.tail_len:
        f.seek(state.offset - state.tail_len)
        if hashlib.sha1(f.read(state.tail_len)).digest() != state.tail_hash:
            return "file rewritten (bytes before the offset changed)"
    return None
