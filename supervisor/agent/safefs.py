"""Files runwatch keeps for itself (state dirs, audit log, run logs, locks, unit records):
private whatever the umask, never written through a link, never kept where another user could
swap them. OpenSSH's ``StrictModes`` is the model.

- A directory runwatch creates is made 0700 (each missing level, ``chmod`` after ``mkdir`` so the
  umask plays no part); a file 0600, created with ``O_EXCL`` when new, opened with ``O_NOFOLLOW``
  always; a whole file is replaced by an atomic rename of a new private file.
- A directory or file runwatch keeps that is a symbolic link, owned by another user than the
  invoking one (root's own files are accepted, as sshd accepts them), or writable by group or
  others is refused (:class:`UnsafePath`) with a message naming it and the fix. A file of ours
  that is merely readable by others (an older runwatch under a loose umask) is made 0600.

Standard library only: the host agent uses it for the run logs and ``<out>/.runwatch``.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Iterable

_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW


class UnsafePath(Exception):
    """A path runwatch keeps is a link, another user's, or writable by others: refused."""

    def __init__(self, path: str, why: str, fix: str) -> None:
        super().__init__(f"refusing {path}: {why}")
        self.path = path
        self.why = why
        self.fix = fix

    def __str__(self) -> str:
        return f"refusing {self.path}: {self.why}; {self.fix}"


def check(path: str, st: os.stat_result, directory: bool) -> None:
    """Raise :class:`UnsafePath` unless ``st`` (an ``lstat``/``fstat`` of ``path``) is a
    directory (or regular file) of the invoking user or root, not writable by group or others."""
    kind = "directory" if directory else "file"
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(
            path,
            "it is a symbolic link",
            f"remove the link (rm {path}) and let runwatch create a {kind} of its own there",
        )
    if directory and not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(path, "it is not a directory", f"move it away (mv {path} {path}.old)")
    if not directory and not stat.S_ISREG(st.st_mode):
        raise UnsafePath(path, "it is not a regular file", f"move it away (mv {path} {path}.old)")
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise UnsafePath(
            path,
            f"it is owned by uid {st.st_uid}, not by you (uid {me}) or root: "
            "another user could have written it",
            f"look at it, then remove it (rm -r {path}) or take it back (chown {me} {path})",
        )
    if st.st_mode & 0o022:
        raise UnsafePath(
            path,
            f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})",
            f"look at it, then make it private (chmod {'700' if directory else '600'} {path})",
        )


def make_dirs(path: str, top: str | None = None, private_parents: bool = True) -> str:
    """``path`` as a private directory: each missing level from ``top`` (default: ``path``
    alone) down to ``path`` made 0700 and every such level checked (:func:`check`), one of ours
    readable by others made 0700. Missing levels above ``top`` are made 0700 too, or, with
    ``private_parents=False`` (a run's output directory, shared as its user wishes), as the
    umask says. Returns ``path``."""
    path = os.path.abspath(path)
    top = os.path.abspath(top) if top else path
    levels = [path]
    while levels[-1] != top and levels[-1].startswith(top + os.sep):
        levels.append(os.path.dirname(levels[-1]))
    first = levels[-1]
    parent = os.path.dirname(first)
    if parent != first and not os.path.lexists(parent):
        if private_parents:
            make_dirs(parent)
        else:
            os.makedirs(parent, exist_ok=True)
    for level in reversed(levels):
        made = False
        try:
            os.mkdir(level, 0o700)
            made = True
        except FileExistsError:
            pass
        try:
            fd = os.open(level, os.O_RDONLY | os.O_DIRECTORY | _FLAGS)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                check(level, os.lstat(level), directory=True)  # raises: a link or a file
            raise
        try:
            st = os.fstat(fd)
            if not made:
                check(level, st, directory=True)
            if made or (st.st_mode & 0o077 and st.st_uid == os.geteuid()):
                os.fchmod(fd, 0o700)  # whatever the umask
        finally:
            os.close(fd)
    return path


def _checked_fd(path: str, fd: int) -> int:
    try:
        st = os.fstat(fd)
        check(path, st, directory=False)
        if st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private(path: str, flags: int) -> int:
    """Open (creating it 0600 with ``O_EXCL`` when it is new) a file runwatch keeps, never
    through a link; an existing one is checked (:func:`check`). ``flags``: the access mode and
    ``O_APPEND``/``O_TRUNC`` as needed (``O_CREAT`` is implied)."""
    flags &= ~(os.O_CREAT | os.O_EXCL)
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | _FLAGS, 0o600)
    except FileExistsError:
        pass
    else:
        os.fchmod(fd, 0o600)
        return fd
    return _checked_fd(path, _open_nofollow(path, flags))


def open_existing(path: str, flags: int = os.O_RDONLY) -> int:
    """Open an existing file runwatch keeps, never through a link, checked
    (:func:`check`). FileNotFoundError when it is missing."""
    return _checked_fd(path, _open_nofollow(path, flags))


def _open_nofollow(path: str, flags: int) -> int:
    try:
        return os.open(path, flags | _FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP:
            check(path, os.lstat(path), directory=False)  # raises: a link
        raise


def read_private(path: str) -> bytes:
    """The bytes of a file runwatch keeps (:func:`open_existing`)."""
    fd = open_existing(path)
    try:
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` by ``data``: a new 0600 file beside it (``O_EXCL``, ``O_NOFOLLOW``),
    fsynced, renamed over it, the directory fsynced."""
    write_atomic_chunks(path, (data,))


def write_atomic_chunks(path: str, chunks: Iterable[bytes]) -> None:
    """:func:`write_atomic` of the concatenation of ``chunks``, written as they come (a large
    file is never held whole in memory)."""
    tmp = f"{os.path.join(os.path.dirname(path), '.' + os.path.basename(path))}.{os.getpid()}"
    tmp += f".{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, 0o600)
    try:
        os.fchmod(fd, 0o600)
        for data in chunks:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
