"""Operations on run data files: torn-tail repair, move-aside, and bounded tails of logs and
JSONL files; plus the path and hashing helpers the other host-side ops share.

Standard library only, Python >= 3.8 (runs on the host inside the agent). Every path arrives as
data in a JSON request and goes to the kernel as data (``os.open``, ``os.link``...).

Ops:
- ``repair_tail``: the only write to run data. Copies the file to a byte-identical ``.broken``
  backup (verified by hashing both), truncates at the last newline, fsyncs file and directory.
  Refused while any process has the file open for writing.
- ``move_aside``: rename ``<file>`` to ``<file>.<format>-<UTC timestamp>``; never overwrites.
- ``tail_log``: the last lines of a log file, bounded in bytes.
- ``tail_records``: the last complete records of a JSONL data file, bounded in bytes.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import os
import stat
from typing import Any, cast

from supervisor.agent import proc as _procs
from supervisor.agent import safefs
from supervisor.agent.masking import mask_argv, mask_text
from supervisor.agent.protocol import (
    AgentOpError,
    FileHoldersResult,
    MoveAsideResult,
    RepairTailResult,
    TailLogResult,
    TailRecordsResult,
    UnitOnFiles,
    param_number,
    param_str,
)

_CHUNK = 1 << 20


# --------------------------------------------------------------------------- helpers


def resolve(path: str, base: str | None = None) -> str:
    """``~`` expanded; relative paths taken from ``base`` (else the agent's working directory).

    A leading ``~`` is always the config's (a workdir, a log): the laptop sends a path of a
    command line, where ``~`` is a directory of that name, under the workdir or as ``./~``
    (``match.client_path``), so it is never taken for the home directory here."""
    p = os.path.expanduser(path)
    if not os.path.isabs(p) and base is not None:
        p = os.path.join(os.path.expanduser(base), p)
    return os.path.abspath(p)


def private(fd: int) -> None:
    """Make a file runwatch wrote (it may hold a command line) readable by its owner only."""
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)


def fsync_dir(path: str) -> None:
    """fsync the directory holding ``path`` (makes a create, rename or unlink durable)."""
    safefs.fsync_parent(path)


def _utc_stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def sha256_file(path: str, limit: int | None = None) -> str:
    """sha256 of a file's bytes (the first ``limit`` bytes when given)."""
    h = hashlib.sha256()
    for block in safefs.read_file(path, limit):  # never through another user's link
        h.update(block)
    return h.hexdigest()


def writers_of(path: str) -> list[int]:
    """PIDs that hold ``path`` open for writing, whoever owns them (see :func:`file_holders`)."""
    return sorted(file_holders([path])["pids"])


def file_holders(
    paths: list[str], locks: list[str] | None = None, workdir: str | None = None
) -> dict[str, Any]:
    """Every process holding one of ``paths`` open for writing (``O_WRONLY``, ``O_RDWR``,
    ``O_APPEND``: ``/proc/PID/fdinfo``), mapping one, with its working directory or root in the
    directory of one (by identity), or holding one of ``locks`` open, whoever owns it and
    whatever its command line; and the processes whose descriptors could not be read. Working
    directories are looked at only with the run's ``workdir`` (the writers check), whose own
    identity is never a data directory's (a process working there is no writer by that alone).

    Result: ``{"pids": [..], "holders": [{"pid", "uid", "user", "argv", "how", "slurm_job"}],
    "uninspected": [{"uid", "user", "pids"}], "detail": str}``; ``detail`` says in one line who
    holds them and which users' processes could not be inspected (empty when neither)."""
    write_inodes = _procs.inodes_of(paths)
    lock_inodes = _procs.inodes_of(locks or [])
    dirs = _procs.dirs_of(paths) - _procs.inodes_of([workdir]) if workdir else set()
    users, blind = _procs.file_users(write_inodes, lock_inodes, None, dirs)
    holders: list[dict[str, Any]] = []
    for pid, how in sorted(users.items()):
        uid = _procs.read_uid(pid)
        holders.append(
            {
                "pid": pid,
                "uid": uid,
                "user": _procs.user_name(uid) if uid is not None else "?",
                "argv": mask_argv(_procs.read_argv(pid) or []),
                "how": how,
                "slurm_job": _procs.job_of_process(pid),
            }
        )
    by_uid: dict[int, list[int]] = {}
    for pid in blind:
        uid = _procs.read_uid(pid)
        if uid is not None and uid != os.getuid():
            by_uid.setdefault(uid, []).append(pid)
    uninspected: list[dict[str, Any]] = [
        {"uid": uid, "user": _procs.user_name(uid), "pids": pids}
        for uid, pids in sorted(by_uid.items())
    ]
    parts = [
        "pid {} ({}, {}) {}".format(
            h["pid"], h["user"], " ".join(h["argv"])[:120], _procs.holding_text(h["how"])
        )
        for h in holders
    ]  # fmt: skip
    if uninspected:
        parts.append(
            "could not inspect the processes of "
            + ", ".join(f"{u['user']} ({len(u['pids'])})" for u in uninspected)
            + " (not permitted to read their descriptors as "
            + _procs.user_name(os.getuid())
            + "; a writer among them would not be seen)"
        )
    return {
        "pids": [h["pid"] for h in holders],
        "holders": holders,
        "uninspected": uninspected,
        "detail": "; ".join(parts),
    }


def holders_op(params: dict[str, Any]) -> FileHoldersResult:
    """The ``file_holders`` op: :func:`file_holders` of ``paths`` (and ``locks``), resolved
    against ``workdir`` on this host (``~`` expanded here), and the units of any run started on
    ``paths`` that still run (``unit.units_on``)."""
    base = params.get("workdir")
    if base is not None and not isinstance(base, str):
        raise AgentOpError("parameter 'workdir': expected a path", "bad-params")
    lists = []
    for key in ("paths", "locks"):
        raw = params.get(key) or []
        if not isinstance(raw, list) or not all(isinstance(p, str) and p for p in raw):
            raise AgentOpError(f"parameter {key!r}: expected a list of paths", "bad-params")
        lists.append([resolve(p, base) for p in raw])
    found = file_holders(lists[0], lists[1], resolve(base, None) if base else None)
    from supervisor.agent import unit

    return {
        "pids": found["pids"],
        "holders": found["holders"],
        "uninspected": found["uninspected"],
        "detail": found["detail"],
        "units": cast("list[UnitOnFiles]", unit.units_on(lists[0])),
    }


def tail_bytes(path: str, lines: int, max_bytes: int, start: int = 0) -> list[str]:
    """The last ``lines`` whole lines of ``path`` after offset ``start``, reading at most
    ``max_bytes`` from the end ([] when the file cannot be read)."""
    try:
        with os.fdopen(safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            begin = max(start, size - max_bytes)
            f.seek(begin)
            data = f.read(size - begin)
    except (OSError, safefs.UnsafePath):
        return []
    text = data.decode("utf-8", "replace")
    parts = text.splitlines()
    if begin > start and parts:
        parts = parts[1:]  # the first line is cut
    return parts[-lines:] if lines > 0 else []


# --------------------------------------------------------------------------- repair and move


def _last_newline(fd: int, size: int) -> int:
    """Offset just past the last ``\\n`` in the file (0 when there is none)."""
    pos = size
    while pos > 0:
        start = max(0, pos - 65536)
        block = os.pread(fd, pos - start, start)
        i = block.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def _lexists(path: str) -> bool:
    try:
        safefs.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _only_name(path: str, st: os.stat_result) -> None:
    """Refuse to write a file that is not a regular file with one name: a hard link to it
    elsewhere (another user's, where the kernel lets them link what they cannot write) would
    be written too."""
    if not stat.S_ISREG(st.st_mode):
        raise AgentOpError(f"{path} is not a regular file; nothing written", "unsafe-path")
    if st.st_nlink != 1:
        raise AgentOpError(
            f"refusing {path}: it has {st.st_nlink} hard links (owner {st.st_uid}); another "
            "name of the same file may be a file that is not run data. Nothing was written; "
            "copy the file (cp --no-preserve=links) if it is yours",
            "unsafe-path",
        )


def _free_name(base: str) -> str:
    if not _lexists(base):
        return base
    n = 2
    while _lexists(f"{base}.{n}"):
        n += 1
    return f"{base}.{n}"


def repair_tail(params: dict[str, Any]) -> RepairTailResult:
    """``{path}`` -> repair a torn last line; refused while a writer has the file open.

    Result: ``{"path", "repaired": false, "reason": "clean"|"empty"}`` or ``{"path",
    "repaired": true, "backup", "sha256", "size_before", "size_after", "removed_bytes"}``.
    """
    path = resolve(param_str(params, "path"))
    writers = writers_of(path)
    if writers:
        raise AgentOpError(
            f"{path} is open for writing by pid {', '.join(str(p) for p in writers)}; "
            "a torn tail is repaired only with no writer alive",
            "writer-alive",
        )
    try:
        fd = safefs.open_file(path, os.O_RDWR | os.O_NONBLOCK)
    except safefs.UnsafePath as e:
        raise AgentOpError(str(e), "unsafe-path") from None
    except FileNotFoundError:
        raise AgentOpError(f"{path} does not exist", "missing") from None
    except OSError as e:
        raise AgentOpError(f"cannot open {path}: {e.strerror}", "unreadable") from None
    try:
        _only_name(path, os.fstat(fd))
        size = os.fstat(fd).st_size
        if size == 0:
            return {"path": path, "repaired": False, "reason": "empty", "size_before": 0}
        if os.pread(fd, 1, size - 1) == b"\n":
            return {"path": path, "repaired": False, "reason": "clean", "size_before": size}
        keep = _last_newline(fd, size)
        backup = _free_name(path + ".broken")
        src_hash = hashlib.sha256()
        # The copy keeps the original's mode and owner: it holds the same data.
        orig = os.fstat(fd)
        bfd = safefs.open_file(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with contextlib.suppress(OSError):
                os.fchown(bfd, orig.st_uid, orig.st_gid)
            os.fchmod(bfd, stat.S_IMODE(orig.st_mode))
            off = 0
            while off < size:
                block = os.pread(fd, min(_CHUNK, size - off), off)
                if not block:
                    break
                src_hash.update(block)
                view = memoryview(block)
                while view:
                    n = os.write(bfd, view)
                    view = view[n:]
                off += len(block)
            os.fsync(bfd)
        finally:
            os.close(bfd)
        fsync_dir(backup)
        digest = src_hash.hexdigest()
        if off != size or os.fstat(fd).st_size != size:
            raise AgentOpError(
                f"{path} changed size while it was copied; a writer is alive. "
                f"The backup {backup} is kept.",
                "writer-alive",
            )
        backup_digest = sha256_file(backup)
        if backup_digest != digest or safefs.lstat(backup).st_size != size:
            raise AgentOpError(
                f"the backup {backup} does not match {path} "
                f"(sha256 {backup_digest} != {digest}); nothing was truncated",
                "io",
            )
        os.ftruncate(fd, keep)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path)
    return {
        "path": path,
        "repaired": True,
        "backup": backup,
        "sha256": digest,
        "size_before": size,
        "size_after": keep,
        "removed_bytes": size - keep,
    }


def move_aside(params: dict[str, Any]) -> MoveAsideResult:
    """``{path, format}`` -> rename to ``<path>.<format>-<UTC timestamp>``; never overwrites.
    Refused while a process has the file open for writing.

    Result: ``{"path", "moved": bool, "to", "size", "inode"}`` (``moved`` false when the file does
    not exist).
    """
    path = resolve(param_str(params, "path"))
    fmt = param_str(params, "format")
    if "/" in fmt or fmt in (".", ".."):
        raise AgentOpError(f"format {fmt!r} cannot be part of a file name", "bad-params")
    stamp = params.get("timestamp") or _utc_stamp()
    if not isinstance(stamp, str) or "/" in stamp:
        raise AgentOpError("parameter 'timestamp': expected a string without '/'", "bad-params")
    try:
        dfd, name = safefs.walk(path, follow_last=False)
    except safefs.UnsafePath as e:
        raise AgentOpError(str(e), "unsafe-path") from None
    try:
        return _move_at(path, dfd, name, fmt, stamp)
    finally:
        os.close(dfd)


def _move_at(path: str, dfd: int, name: str, fmt: str, stamp: str) -> MoveAsideResult:
    """:func:`move_aside` of ``name`` in the directory ``dfd`` (from :func:`safefs.walk`): a
    link there is moved as a link, never followed."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return {"path": path, "moved": False, "to": None, "reason": "missing"}
    if stat.S_ISLNK(st.st_mode) and not safefs.trusted_link(st):
        target = os.readlink(name, dir_fd=dfd)
        raise AgentOpError(str(safefs.refuse_link(path, path, st, target)), "unsafe-path")
    writers = writers_of(path)
    if writers:
        # A live writer would go on appending to the moved file: stop it first.
        raise AgentOpError(
            f"{path} is open for writing by pid {', '.join(str(p) for p in writers)}; "
            "files are moved aside only with no writer alive",
            "writer-alive",
        )
    target = _free_name(f"{path}.{fmt}-{stamp}")
    new = os.path.basename(target)
    try:
        # link + unlink never replaces an existing file, unlike rename
        os.link(name, new, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        os.unlink(name, dir_fd=dfd)
    except FileExistsError:
        raise AgentOpError(f"{target} appeared while moving {path}; nothing moved", "io") from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise AgentOpError(f"cannot move {path}: {e.strerror}", "io") from None
        with contextlib.suppress(FileNotFoundError):
            os.stat(new, dir_fd=dfd, follow_symlinks=False)
            raise AgentOpError(f"{target} exists; nothing moved", "io") from None
        os.rename(name, new, src_dir_fd=dfd, dst_dir_fd=dfd)
    safefs.fsync_dir_fd(dfd)
    return {"path": path, "moved": True, "to": target, "size": st.st_size, "inode": st.st_ino}


# --------------------------------------------------------------------------- tails


def tail_log(params: dict[str, Any]) -> TailLogResult:
    """``{path, lines?=50, max_bytes?=65536}`` -> ``{"path", "exists", "size", "lines"}``.

    Reads at most ``max_bytes`` from the end; key-shaped tokens are masked. A log that is a
    link is refused.
    """
    path = resolve(param_str(params, "path"), params.get("workdir"))
    lines = int(param_number(params, "lines", 50))
    max_bytes = int(param_number(params, "max_bytes", 65536))
    try:
        st = safefs.lstat(path)
    except FileNotFoundError:
        return {"path": path, "exists": False, "size": 0, "lines": []}
    except safefs.UnsafePath as e:
        raise AgentOpError(str(e), "unsafe-path") from None
    except OSError as e:
        raise AgentOpError(f"cannot read {path}: {e.strerror}", "unreadable") from None
    if stat.S_ISLNK(st.st_mode):  # it would show (and alert with) whatever it points at
        try:
            safefs.check(path, st, directory=False)
        except safefs.UnsafePath as e:
            raise AgentOpError(str(e), "unsafe-path") from None
    size = st.st_size
    tail = [mask_text(line) for line in tail_bytes(path, lines, max_bytes)]
    return {"path": path, "exists": True, "size": size, "lines": tail}


def _last_records(f: Any, size: int, count: int, max_bytes: int) -> tuple[list[Any], int, int]:
    """``(records oldest first, bad lines, window start)`` of :func:`tail_records`."""
    window = min(size, max_bytes, 64 << 10)
    while True:
        begin = size - window
        f.seek(begin)
        data = f.read(window)
        # Only newline-terminated lines; the first is cut unless the window starts the file.
        lines = data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]
        if begin > 0 and lines:
            lines = lines[1:]
        records: list[Any] = []
        bad = 0
        for line in reversed(lines):
            if len(records) >= count:
                break
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(record, dict):
                records.append(record)
            else:
                bad += 1
        if len(records) >= count or begin == 0 or window >= max_bytes:
            records.reverse()
            return records, bad, begin
        window = min(size, max_bytes, window * 2)


def tail_records(params: dict[str, Any]) -> TailRecordsResult:
    """``{path, workdir?, count?=3, max_bytes?=4 MiB}`` -> the last complete records of a JSONL
    data file: ``{"path", "exists", "size", "records": [objects, oldest first], "bad_lines",
    "complete"}``.

    Reads backwards from the end, doubling a window from 64 KiB up to ``max_bytes``, until
    ``count`` records are found: only lines ending in a newline count (a line still being written
    is skipped), lines that are not JSON objects are counted in ``bad_lines``. ``complete`` is
    false when fewer than ``count`` records fit in ``max_bytes`` although the file holds more.
    Records are data, returned as written (not masked): the laptop masks what it shows.
    """
    path = resolve(param_str(params, "path"), params.get("workdir"))
    count = max(0, int(param_number(params, "count", 3)))
    max_bytes = max(1, int(param_number(params, "max_bytes", 4 << 20)))
    try:
        with os.fdopen(safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            records, bad, begin = _last_records(f, size, count, max_bytes)
    except safefs.UnsafePath as e:
        raise AgentOpError(str(e), "unsafe-path") from None
    except FileNotFoundError:
        return {"path": path, "exists": False, "size": 0, "records": [], "bad_lines": 0,
                "complete": True}  # fmt: skip
    except OSError as e:
        raise AgentOpError(f"cannot read {path}: {e.strerror}", "unreadable") from None
    return {
        "path": path,
        "exists": True,
        "size": size,
        "records": records,
        "bad_lines": bad,
        "complete": len(records) >= count or begin == 0,
    }
