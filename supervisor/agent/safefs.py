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

Links on the way (:func:`walk`): every path runwatch opens, creates, truncates, renames, links,
chmods, copies or reads to report on a host -- run data, logs, locks, its own state, the files a
scan counts, a run's workdir -- is reached one directory descriptor at a time from ``/``
(``openat`` with ``O_NOFOLLOW``, ``O_PATH`` where the kernel has it), and a symbolic link on
the way is followed only when it is the invoking user's or root's: the owner of a link chose its
target, so another user's link in a shared (0777) dataset directory or in a world-writable
parent of the state dir is refused (:class:`UnsafePath`, naming the path, the link and its
target), never followed. The last name is then opened, linked, renamed or removed relative to
that descriptor, so it cannot be swapped for a link between the check and the use.

Standard library only: the host agent uses it for the run logs and ``<out>/.runwatch``.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Iterable, Iterator

_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW
_PATH = getattr(os, "O_PATH", 0)
"""Linux's ``O_PATH``: a descriptor that names a directory (or a link) without reading it."""
_STEP = (_PATH or os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)) | _FLAGS
_MAX_LINKS = 40
"""Links followed in one path at most (the kernel's own bound, ``ELOOP``)."""


class UnsafePath(Exception):
    """A path runwatch keeps is a link, another user's, or writable by others: refused."""

    def __init__(self, path: str, why: str, fix: str) -> None:
        super().__init__(f"refusing {path}: {why}")
        self.path = path
        self.why = why
        self.fix = fix

    def __str__(self) -> str:
        return f"refusing {self.path}: {self.why}; {self.fix}"


def _user(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def trusted_link(st: os.stat_result) -> bool:
    """A link runwatch follows: the invoking user's or root's (who owns a link chose its
    target)."""
    return st.st_uid in (os.geteuid(), 0)


def refuse_link(path: str, link: str, st: os.stat_result, target: str) -> UnsafePath:
    """The refusal of another user's link ``link`` met on the way to ``path``."""
    where = "it is" if link == path else f"{link} on its way is"
    return UnsafePath(
        path,
        f"{where} a symbolic link to {target} owned by {_user(st.st_uid)}, not by you "
        f"(uid {os.geteuid()}) or root: runwatch never follows another user's link",
        f"look at it, then name the real path in the config, or remove the link (rm {link})",
    )


def _read_link(cur: int, name: str, fd: int) -> tuple[os.stat_result, str]:
    """The stat and target of the link ``name`` in ``cur`` (``fd``: an ``O_PATH`` descriptor of
    the link itself, or -1): read from the one inode, never from a link swapped in between."""
    if fd >= 0:
        return os.fstat(fd), os.readlink("", dir_fd=fd)
    before = os.stat(name, dir_fd=cur, follow_symlinks=False)
    target = os.readlink(name, dir_fd=cur)
    after = os.stat(name, dir_fd=cur, follow_symlinks=False)
    if (before.st_dev, before.st_ino) != (after.st_dev, after.st_ino):
        raise OSError(errno.EAGAIN, "the link changed while it was read", name)
    return after, target


def walk(path: str, follow_last: bool = True) -> tuple[int, str]:
    """``(descriptor of path's directory, last name)``, reached from ``/`` one directory at a
    time without following any link but the invoking user's or root's (:func:`trusted_link`);
    another user's link raises :class:`UnsafePath`. With ``follow_last`` a trusted link as the
    last name is followed too (the returned name is then its target's); without, the last name
    is returned as it is (for ``unlinkat``, ``linkat``, ``renameat``, ``mkdirat``). The caller
    closes the descriptor and uses the name relative to it with ``O_NOFOLLOW``
    (:func:`open_file`). Missing directories raise FileNotFoundError; a missing last name is
    returned (to be created)."""
    path = os.path.abspath(path)
    parts = [p for p in path.split("/") if p not in ("", ".")]
    shown = "/"
    cur = os.open("/", _STEP)
    links = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == "..":
                up = os.open("..", _STEP, dir_fd=cur)
                os.close(cur)
                cur, shown = up, os.path.dirname(shown)
                continue
            last = not parts
            here = os.path.join(shown, name)
            if last and not follow_last:
                break
            try:
                fd = os.open(name, _STEP, dir_fd=cur)
            except FileNotFoundError:
                if last:
                    break
                raise
            except OSError as e:
                if e.errno != errno.ELOOP:  # no O_PATH: a link is refused by O_NOFOLLOW
                    raise
                fd = -1
            try:
                st = os.fstat(fd) if fd >= 0 else os.stat(name, dir_fd=cur, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    st, target = _read_link(cur, name, fd)
                    if not trusted_link(st):
                        raise refuse_link(path, here, st, target)
                    links += 1
                    if links > _MAX_LINKS:
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                    if target.startswith("/"):
                        root = os.open("/", _STEP)
                        os.close(cur)
                        cur, shown = root, "/"
                    parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                    continue
                if last:
                    break
                if not stat.S_ISDIR(st.st_mode):
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), here)
                if fd < 0:
                    fd = os.open(name, _STEP | os.O_DIRECTORY, dir_fd=cur)
                os.close(cur)
                cur, fd, shown = fd, -1, here
            finally:
                if fd >= 0:
                    os.close(fd)
        else:
            name = "."
        return cur, name
    except BaseException:
        os.close(cur)
        raise


def open_file(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open(path, flags, mode)`` of a path runwatch does not own (run data, a log, a lock),
    never through another user's link (:func:`walk`): the last name is opened with
    ``O_NOFOLLOW`` relative to its directory's descriptor, so a link swapped in after the walk
    is refused too. Raises :class:`UnsafePath` naming the link."""
    for _ in range(_MAX_LINKS):
        dfd, name = walk(path)
        try:
            return os.open(name, flags | _FLAGS, mode, dir_fd=dfd)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            st, target = _read_link(dfd, name, -1)
            if not trusted_link(st):
                raise refuse_link(path, path, st, target) from None
        finally:
            os.close(dfd)
    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)


def lstat(path: str) -> os.stat_result:
    """``os.lstat(path)`` with its directories reached by :func:`walk`."""
    dfd, name = walk(path, follow_last=False)
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    finally:
        os.close(dfd)


def stat_file(path: str) -> os.stat_result:
    """``os.stat(path)`` without following another user's link (:func:`walk`)."""
    dfd, name = walk(path)
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    finally:
        os.close(dfd)


def fsync_dir_fd(dfd: int) -> None:
    """fsync the directory of a descriptor from :func:`walk` (an ``O_PATH`` one is reopened)."""
    fd = os.open(".", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_parent(path: str) -> None:
    """fsync the directory holding ``path`` (a create, rename or unlink made durable)."""
    dfd, _ = walk(path, follow_last=False)
    try:
        fsync_dir_fd(dfd)
    finally:
        os.close(dfd)


def read_file(path: str, limit: int | None = None) -> Iterator[bytes]:
    """The bytes of ``path`` (the first ``limit`` when given) in chunks, opened by
    :func:`open_file`."""
    fd = open_file(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        remaining = limit
        while remaining is None or remaining > 0:
            block = os.read(fd, 1 << 20 if remaining is None else min(1 << 20, remaining))
            if not block:
                return
            if remaining is not None:
                remaining -= len(block)
            yield block
    finally:
        os.close(fd)


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
    if parent != first and not _lexists(parent):
        if private_parents:
            make_dirs(parent)
        else:
            make_shared(parent)
    for level in reversed(levels):
        made = False
        dfd, name = walk(level, follow_last=False)
        try:
            try:
                os.mkdir(name, 0o700, dir_fd=dfd)
                made = True
            except FileExistsError:
                pass
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _FLAGS, dir_fd=dfd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    check(level, st, directory=True)  # raises: a link or a file
                raise
        finally:
            os.close(dfd)
        try:
            st = os.fstat(fd)
            if not made:
                check(level, st, directory=True)
            if made or (st.st_mode & 0o077 and st.st_uid == os.geteuid()):
                os.fchmod(fd, 0o700)  # whatever the umask
        finally:
            os.close(fd)
    return path


def _lexists(path: str) -> bool:
    try:
        lstat(path)
    except FileNotFoundError:
        return False
    return True


def make_shared(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)`` (modes as the umask says) without following another
    user's link on the way (:func:`walk`)."""
    if _lexists(path):
        return
    parent = os.path.dirname(path)
    if parent != path:
        make_shared(parent)
    dfd, name = walk(path, follow_last=False)
    try:
        os.mkdir(name, 0o777, dir_fd=dfd)
    except FileExistsError:
        pass
    finally:
        os.close(dfd)


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
        fd = open_file(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
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
    dfd, name = walk(path, follow_last=False)
    try:
        return os.open(name, flags | _FLAGS, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            check(path, st, directory=False)  # raises: a link
        raise
    finally:
        os.close(dfd)


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


def write_atomic(path: str, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` by ``data``: a new file beside it (``O_EXCL``, ``O_NOFOLLOW``, ``mode``,
    0600 unless told), fsynced, renamed over it, the directory fsynced; all relative to the
    directory's descriptor (:func:`walk`), so no link on the way is another user's."""
    write_atomic_chunks(path, (data,), mode)


def _temp_name(name: str) -> str:
    """The name of the new file :func:`write_atomic` makes beside ``name``."""
    return f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"


def check_replaceable(path: str) -> None:
    """Raise what :func:`write_atomic` of ``path`` would meet in its directory (read-only,
    not writable by this user, another user's link on the way): its new file is made there
    and removed at once, nothing else is touched."""
    dfd, name = walk(path, follow_last=False)
    try:
        tmp = _temp_name(name)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, 0o600, dir_fd=dfd))
        os.unlink(tmp, dir_fd=dfd)
    finally:
        os.close(dfd)


def write_atomic_chunks(path: str, chunks: Iterable[bytes], mode: int = 0o600) -> None:
    """:func:`write_atomic` of the concatenation of ``chunks``, written as they come (a large
    file is never held whole in memory)."""
    dfd, name = walk(path, follow_last=False)
    try:
        tmp = _temp_name(name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, 0o600, dir_fd=dfd)
        try:
            os.fchmod(fd, mode)
            for data in chunks:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        fsync_dir_fd(dfd)
    finally:
        os.close(dfd)
