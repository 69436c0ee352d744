"""Host-side actions of the agent: detached launch under a lock, torn-tail repair, move-aside,
launch fingerprints, lock status and log tails.

Standard library only and Python >= 3.8: this module travels to the host inside the agent bundle.
Every path, argument and environment value arrives as data in a JSON request and goes to the
kernel as data (``subprocess.Popen`` with a list, ``os.open``...); nothing is ever shell text.

``OPS`` maps an op name to a function ``params -> result``; the agent merges it into its dispatch.
Each op may also be called directly in-process (the tests do). An op raises ``OpError`` (with a
``kind``) for a request it cannot carry out; expected outcomes such as "already running" or "the
child died at once" are results, not errors, so the caller can show them in full.

Ops:
- ``launch``: start a run detached (new session, stdin from /dev/null, stdout and stderr appended
  to its log) while holding ``flock`` on the run's lock file. The lock's file descriptor is passed
  to the child, so the lock lives exactly as long as the run (and its descendants that keep it);
  a second launch sees the lock taken and reports the holder written in the lock file. The launch
  is confirmed after a settle time: the child is alive with the identity read back from /proc,
  or it died and the result carries the last lines it wrote to the log.
- ``repair_tail``: the only write to run data. Copies the file to a byte-identical ``.broken``
  backup (verified by hashing both), truncates at the last newline, fsyncs file and directory.
  Refused while any process has the file open for writing.
- ``move_aside``: rename ``<file>`` to ``<file>.<format>-<UTC timestamp>``; never overwrites.
- ``read_fingerprint`` / ``write_fingerprint``: the ``.runwatch/launch.json`` sidecar.
- ``lock_status``: whether a run's lock is held, and by whom.
- ``tail_log``: the last lines of a log file, bounded in bytes.
- ``tail_records``: the last complete records of a JSONL data file, bounded in bytes.
- ``gpu_holders``: which processes hold GPU memory (nvidia-smi), for the restart's GPU wait.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import hashlib
import json
import os
import re
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from supervisor import processes as _procs

if TYPE_CHECKING:
    from collections.abc import Callable

FINGERPRINT_VERSION = 1
SIDECAR_DIR = ".runwatch"
"""runwatch's own files in a run's output dir: ``<dataset>.lock``, ``<dataset>.launch.json``."""
LOCK_NAME = "run.lock"
"""Lock of a run whose datasets are unknown."""
FINGERPRINT_NAME = "launch.json"
"""Fingerprint of a run whose datasets are unknown."""
MASK = _procs.MASK
_CHUNK = 1 << 20


class OpError(Exception):
    """A request the host cannot carry out. ``kind`` names the reason for the laptop."""

    def __init__(self, message: str, kind: str = "failed") -> None:
        super().__init__(message)
        self.kind = kind


# --------------------------------------------------------------------------- small helpers


def mask_argv(argv: list[str], secrets: list[str] | None = None) -> list[str]:
    """argv with secrets replaced by ``***`` (``processes.mask_argv``), and any of the given
    ``secrets`` masked wherever it appears inside an argument."""
    known = [s for s in (secrets or []) if s]
    out = []
    for arg in _procs.mask_argv(argv):
        for s in known:
            arg = arg.replace(s, MASK)
        out.append(arg)
    return out


def mask_text(text: str, secrets: list[str] | None = None) -> str:
    """Free text (a log line, a message) with the given ``secrets`` masked, and everything
    ``processes.mask_text`` masks (``KEY=...``, ``--api-key ...``, ``sk-...``, ``Bearer ...``,
    ``Authorization:`` values). Ordinary words ("token budget 10") are left alone."""
    for s in secrets or []:
        if s:
            text = text.replace(s, MASK)
    return _procs.mask_text(text)


def _str(params: dict[str, Any], key: str, default: str | None = None) -> str:
    value = params.get(key, default)
    if not isinstance(value, str) or not value:
        raise OpError(f"parameter {key!r}: expected a non-empty string", "bad-params")
    return value


def _str_list(params: dict[str, Any], key: str) -> list[str]:
    value = params.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise OpError(f"parameter {key!r}: expected a non-empty list of strings", "bad-params")
    return list(value)


def _str_dict(params: dict[str, Any], key: str) -> dict[str, str]:
    value = params.get(key) or {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise OpError(f"parameter {key!r}: expected a table of strings", "bad-params")
    return dict(value)


def _number(params: dict[str, Any], key: str, default: float) -> float:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise OpError(f"parameter {key!r}: expected a non-negative number", "bad-params")
    return float(value)


def resolve(path: str, base: str | None = None) -> str:
    """``~`` expanded; relative paths taken from ``base`` (else the agent's working directory)."""
    p = os.path.expanduser(path)
    if not os.path.isabs(p) and base is not None:
        p = os.path.join(os.path.expanduser(base), p)
    return os.path.abspath(p)


def poll_until(cond: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Wait until ``cond()`` is true or ``timeout`` seconds passed; return the last value."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return False
        threading.Event().wait(interval)


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _utc_stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def sha256_file(path: str, limit: int | None = None) -> str:
    """sha256 of a file's bytes (the first ``limit`` bytes when given)."""
    h = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as f:
        while remaining is None or remaining > 0:
            n = _CHUNK if remaining is None else min(_CHUNK, remaining)
            block = f.read(n)
            if not block:
                break
            h.update(block)
            if remaining is not None:
                remaining -= len(block)
    return h.hexdigest()


# --------------------------------------------------------------------------- process identity


def boot_id() -> str:
    return _procs.boot_id()


def identity_of(pid: int) -> dict[str, Any] | None:
    """``{boot_id, pid, start_time, uid, argv}`` of a live process, or None when it is gone."""
    st = _procs.read_stat(pid)
    argv = _procs.read_argv(pid)
    uid = _procs.read_uid(pid)
    if st is None or argv is None or uid is None or st.state in "ZX":
        return None  # gone, or a zombie: it has exited
    return {"boot_id": boot_id(), "pid": pid, "start_time": st.start_time, "uid": uid, "argv": argv}


def is_alive(identity: dict[str, Any]) -> bool:
    """True when the process named by ``identity`` (same boot, pid and start time) still runs."""
    pid = identity.get("pid")
    if not isinstance(pid, int):
        return False
    now = identity_of(pid)
    return (
        now is not None
        and now["start_time"] == identity.get("start_time")
        and now["boot_id"] == identity.get("boot_id", now["boot_id"])
    )


def writers_of(path: str) -> list[int]:
    """PIDs (of those this user can see) that hold ``path`` open for writing."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    found: list[int] = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                fst = os.stat(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
                continue
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    info = f.read()
            except OSError:
                continue
            m = re.search(r"^flags:\s*([0-7]+)", info, re.M)
            if m and int(m.group(1), 8) & (os.O_WRONLY | os.O_RDWR):
                found.append(pid)
                break
    return found


# --------------------------------------------------------------------------- lock


def _read_holder(lock_path: str) -> dict[str, Any] | None:
    try:
        with open(lock_path, "rb") as f:
            raw = f.read(65536)
    except OSError:
        return None
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_holder(fd: int, holder: dict[str, Any]) -> None:
    data = (json.dumps(holder, sort_keys=True) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def _holder_is_live(holder: dict[str, Any] | None) -> bool:
    if not holder:
        return False
    ident = holder.get("identity")
    return bool(isinstance(ident, dict) and is_alive(ident))


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _lock_one(lock_path: str) -> dict[str, Any]:
    holder = _read_holder(lock_path)
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return {"lock_path": lock_path, "held": False, "holder": None, "holder_alive": False}
    except OSError as e:
        raise OpError(f"cannot open lock {lock_path}: {e.strerror}", "unreadable") from None
    try:
        # A shared probe: it conflicts with the launcher's exclusive lock, never with another probe.
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            held = False
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            held = True
    finally:
        os.close(fd)
    return {
        "lock_path": lock_path,
        "held": held,
        "holder": holder,
        "holder_alive": _holder_is_live(holder),
    }


def _lock_paths(params: dict[str, Any], base: str | None) -> list[str]:
    """``lock_paths`` (a list) or ``lock_path``, resolved, without duplicates, in sorted order
    (every launcher takes them in the same order)."""
    raw = params.get("lock_paths")
    if raw is None:
        return [resolve(_str(params, "lock_path"), base)]
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) and p for p in raw):
        raise OpError("parameter 'lock_paths': expected a non-empty list of paths", "bad-params")
    return sorted({resolve(p, base) for p in raw})


def lock_status(params: dict[str, Any]) -> dict[str, Any]:
    """``{lock_path}`` or ``{lock_paths: [...]}`` (``workdir`` optional) -> whether any is held.

    Result: ``{"held", "lock_path", "holder", "holder_alive", "locks": [per lock the same]}``;
    the top-level ``lock_path``/``holder`` are those of the first held lock.
    """
    locks = [_lock_one(p) for p in _lock_paths(params, params.get("workdir"))]
    held = [lk for lk in locks if lk["held"]]
    first = held[0] if held else locks[0]
    return {
        "held": bool(held),
        "lock_path": first["lock_path"],
        "holder": first["holder"] if held else None,
        "holder_alive": any(lk["holder_alive"] for lk in held),
        "locks": locks,
    }


# --------------------------------------------------------------------------- launch


def _tail_bytes(path: str, lines: int, max_bytes: int, start: int = 0) -> list[str]:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            begin = max(start, size - max_bytes)
            f.seek(begin)
            data = f.read(size - begin)
    except OSError:
        return []
    text = data.decode("utf-8", "replace")
    parts = text.splitlines()
    if begin > start and parts:
        parts = parts[1:]  # the first line is cut
    return parts[-lines:] if lines > 0 else []


def launch(params: dict[str, Any]) -> dict[str, Any]:
    """Start a run detached under its lock and confirm it.

    Params: ``workdir``, ``argv`` (list), ``env`` (extra variables; secrets go here, never in argv),
    ``log`` and ``lock_paths`` (a list; or one ``lock_path``; relative to workdir unless absolute:
    one lock per dataset the run writes, so two runs sharing an output dir never block each other
    while two writers of one dataset do), ``settle_s`` (default 2), ``lock_wait_s`` (default 3:
    how long to wait for a concurrent launcher to name its child), ``tail_lines`` (default 30),
    ``fingerprints`` (optional list of ``{"path", "data", "hash_files"}``, or one
    ``fingerprint``, written once the child is confirmed), ``secret_env`` (names of ``env``
    entries that are secrets: their values are masked in every line returned).

    Result: ``{"started": true, "identity", "log", "lock_path", "log_offset", "argv_matches"}``, or
    ``{"started": false, "reason": "already-running" | "exited" | "exec-failed", ...}`` with the
    holder (already-running), the exit code and last log lines (exited), or the error.
    """
    workdir = resolve(_str(params, "workdir"))
    argv = _str_list(params, "argv")
    env_extra = _str_dict(params, "env")
    secret_names = params.get("secret_env") or []
    secrets = [v for k, v in env_extra.items() if k in secret_names and v]
    log = resolve(_str(params, "log"), workdir)
    lock_paths = _lock_paths(params, workdir)
    settle_s = _number(params, "settle_s", 2.0)
    lock_wait_s = _number(params, "lock_wait_s", 3.0)
    tail_lines = int(_number(params, "tail_lines", 30))
    if not os.path.isdir(workdir):
        raise OpError(f"workdir {workdir} is not a directory", "bad-params")
    fds: dict[str, int] = {}
    try:
        os.makedirs(os.path.dirname(log), exist_ok=True)
        for path in lock_paths:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fds[path] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        for fd in fds.values():
            os.close(fd)
        raise OpError(f"cannot create {e.filename}: {e.strerror}", "io") from None
    lock_path = lock_paths[0]
    taken: set[str] = set()
    conflict: list[str | None] = [None]

    def acquired_or_live_holder() -> bool:
        for path in lock_paths:
            if path in taken:
                continue
            if not _try_flock(fds[path]):
                conflict[0] = path
                return _holder_is_live(_read_holder(path))
            taken.add(path)
        conflict[0] = None
        return True

    def write_all(holder: dict[str, Any]) -> None:
        for fd in fds.values():
            _write_holder(fd, holder)

    try:
        poll_until(acquired_or_live_holder, lock_wait_s)
        busy = conflict[0]
        if busy is not None:
            return {
                "started": False,
                "reason": "already-running",
                "detail": f"already running: {_describe(busy)} holds {busy}",
                "holder": _read_holder(busy),
                "lock_path": busy,
            }
        write_all(
            {
                "state": "launching",
                "agent_pid": os.getpid(),
                "boot_id": boot_id(),
                "time": time.time(),
            }
        )
        try:
            log_fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise OpError(f"cannot open log {log}: {e.strerror}", "io") from None
        log_offset = os.fstat(log_fd).st_size
        env = dict(os.environ)
        env.update(env_extra)
        try:
            proc = subprocess.Popen(
                argv,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                start_new_session=True,
                close_fds=True,
                pass_fds=tuple(fds.values()),
            )
        except OSError as e:
            write_all({"state": "failed", "time": time.time()})
            return {
                "started": False,
                "reason": "exec-failed",
                "detail": mask_text(f"cannot start {argv[0]}: {e.strerror}", secrets),
                "lock_path": lock_path,
            }
        finally:
            os.close(log_fd)
        # Popen returns as soon as the child's exec has begun (vfork), possibly before the
        # kernel has set up its new argv: wait for the argv (bounded), so the identity is whole.
        seen: list[dict[str, Any] | None] = [None]

        def argv_ready() -> bool:
            seen[0] = identity_of(proc.pid)
            return seen[0] is None or bool(seen[0]["argv"])

        poll_until(argv_ready, 2.0, 0.005)
        identity = seen[0]
        if identity is None:  # it exited before it could be read: still report what it wrote
            identity = {
                "boot_id": boot_id(),
                "pid": proc.pid,
                "start_time": 0,
                "uid": os.getuid(),
                "argv": argv,
            }
        write_all(
            {
                "state": "running",
                "identity": identity,
                "argv": mask_argv(argv, secrets),
                "workdir": workdir,
                "log": log,
                "time": time.time(),
            }
        )
    finally:
        # The child holds its own copies of the locks (and releases them when it ends); ours go.
        for fd in fds.values():
            os.close(fd)
    try:
        code: int | None = proc.wait(timeout=settle_s)
    except subprocess.TimeoutExpired:
        code = None
    if code is None:
        # Reap it when it ends, so a finished run never lingers as a zombie of the agent.
        threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    masked_tail = [
        mask_text(line, secrets)
        for line in _tail_bytes(log, tail_lines, 64 * 1024, start=log_offset)
    ]
    if code is not None or not is_alive(identity):
        return {
            "started": False,
            "reason": "exited",
            "exit_code": code,
            "identity": dict(identity, argv=mask_argv(identity["argv"], secrets)),
            "detail": (f"the process exited with status {code}" if code is not None else "it died")
            + f" within {settle_s:.1f} s of its start",
            "log_tail": masked_tail,
            "log": log,
            "lock_path": lock_path,
        }
    cmd = identity["argv"]
    result: dict[str, Any] = {
        "started": True,
        "identity": identity,
        "argv_matches": _same_command(cmd, argv),
        "log": log,
        "log_offset": log_offset,
        "lock_path": lock_path,
        "log_tail": masked_tail,
    }
    fps = params.get("fingerprints")
    if not isinstance(fps, list):
        fps = [params["fingerprint"]] if isinstance(params.get("fingerprint"), dict) else []
    written = []
    for fp in fps:
        if not isinstance(fp, dict):
            continue
        fp_params = dict(fp)
        fp_params.setdefault("workdir", workdir)
        data = dict(fp_params.get("data") or {})
        data["identity"] = dict(identity, argv=mask_argv(identity["argv"], secrets))
        fp_params["data"] = data
        written.append(write_fingerprint(fp_params)["path"])
    result["fingerprints"] = written
    return result


def _same_command(cmdline: list[str], argv: list[str]) -> bool:
    """The process runs ``argv``: exactly, or through an interpreter named by a ``#!`` line."""
    if cmdline == argv:
        return True
    rest = argv[1:]
    return len(cmdline) > len(argv) and cmdline[len(cmdline) - len(rest) :] == rest


def _describe(lock_path: str) -> str:
    holder = _read_holder(lock_path)
    if not holder:
        return "another launch"
    ident = holder.get("identity")
    if isinstance(ident, dict):
        return "pid {} (started at tick {}, boot {})".format(
            ident.get("pid"),
            ident.get("start_time"),
            str(ident.get("boot_id", ""))[:8],
        )
    return "a launch in progress (agent pid {})".format(holder.get("agent_pid"))


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


def _free_name(base: str) -> str:
    if not os.path.lexists(base):
        return base
    n = 2
    while os.path.lexists(f"{base}.{n}"):
        n += 1
    return f"{base}.{n}"


def repair_tail(params: dict[str, Any]) -> dict[str, Any]:
    """``{path}`` -> repair a torn last line; refused while a writer has the file open.

    Result: ``{"path", "repaired": false, "reason": "clean"|"empty"}`` or ``{"path",
    "repaired": true, "backup", "sha256", "size_before", "size_after", "removed_bytes"}``.
    """
    path = resolve(_str(params, "path"))
    writers = writers_of(path)
    if writers:
        raise OpError(
            f"{path} is open for writing by pid {', '.join(str(p) for p in writers)}; "
            "a torn tail is repaired only with no writer alive",
            "writer-alive",
        )
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        raise OpError(f"{path} does not exist", "missing") from None
    except OSError as e:
        raise OpError(f"cannot open {path}: {e.strerror}", "unreadable") from None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return {"path": path, "repaired": False, "reason": "empty", "size_before": 0}
        if os.pread(fd, 1, size - 1) == b"\n":
            return {"path": path, "repaired": False, "reason": "clean", "size_before": size}
        keep = _last_newline(fd, size)
        backup = _free_name(path + ".broken")
        src_hash = hashlib.sha256()
        bfd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
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
        _fsync_dir(backup)
        digest = src_hash.hexdigest()
        if off != size or os.fstat(fd).st_size != size:
            raise OpError(
                f"{path} changed size while it was copied; a writer is alive. "
                f"The backup {backup} is kept.",
                "writer-alive",
            )
        backup_digest = sha256_file(backup)
        if backup_digest != digest or os.stat(backup).st_size != size:
            raise OpError(
                f"the backup {backup} does not match {path} "
                f"(sha256 {backup_digest} != {digest}); nothing was truncated",
                "io",
            )
        os.ftruncate(fd, keep)
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(path)
    return {
        "path": path,
        "repaired": True,
        "backup": backup,
        "sha256": digest,
        "size_before": size,
        "size_after": keep,
        "removed_bytes": size - keep,
    }


def move_aside(params: dict[str, Any]) -> dict[str, Any]:
    """``{path, format}`` -> rename to ``<path>.<format>-<UTC timestamp>``; never overwrites.
    Refused while a process has the file open for writing.

    Result: ``{"path", "moved": bool, "to", "size", "inode"}`` (``moved`` false when the file does
    not exist).
    """
    path = resolve(_str(params, "path"))
    fmt = _str(params, "format")
    if "/" in fmt or fmt in (".", ".."):
        raise OpError(f"format {fmt!r} cannot be part of a file name", "bad-params")
    stamp = params.get("timestamp") or _utc_stamp()
    if not isinstance(stamp, str) or "/" in stamp:
        raise OpError("parameter 'timestamp': expected a string without '/'", "bad-params")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"path": path, "moved": False, "to": None, "reason": "missing"}
    writers = writers_of(path)
    if writers:
        # A live writer would go on appending to the moved file: stop it first.
        raise OpError(
            f"{path} is open for writing by pid {', '.join(str(p) for p in writers)}; "
            "files are moved aside only with no writer alive",
            "writer-alive",
        )
    target = _free_name(f"{path}.{fmt}-{stamp}")
    try:
        # link + unlink never replaces an existing file, unlike rename
        os.link(path, target, follow_symlinks=False)
        os.unlink(path)
    except FileExistsError:
        raise OpError(f"{target} appeared while moving {path}; nothing moved", "io") from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise OpError(f"cannot move {path}: {e.strerror}", "io") from None
        if os.path.lexists(target):
            raise OpError(f"{target} exists; nothing moved", "io") from None
        os.rename(path, target)
    _fsync_dir(path)
    return {"path": path, "moved": True, "to": target, "size": st.st_size, "inode": st.st_ino}


# --------------------------------------------------------------------------- fingerprint


def _hashes(files: dict[str, str], base: str | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, raw in sorted(files.items()):
        p = resolve(raw, base)
        try:
            out[key] = {"path": raw, "sha256": sha256_file(p), "size": os.path.getsize(p)}
        except OSError as e:
            out[key] = {"path": raw, "sha256": None, "error": e.strerror or str(e)}
    return out


def read_fingerprint(params: dict[str, Any]) -> dict[str, Any]:
    """``{path | paths: {key: path}, workdir?, hash_files?: {key: path}}`` -> the stored
    sidecar(s) and current hashes.

    Result: ``{"path", "exists", "fingerprint": dict | None, "error": str | None,
    "hashes": {key: {"path", "sha256" | None, ...}}}``; with ``paths``, ``{"fingerprints": {key:
    {"path", "exists", "fingerprint", "error"}}, "hashes": ...}``. ``hashes`` lets the laptop
    compare the prompt files as they are now with those recorded at the last launch, in one round
    trip.
    """
    workdir = params.get("workdir")
    files = _str_dict(params, "hash_files")
    many = _str_dict(params, "paths")
    if many:
        result: dict[str, Any] = {
            "fingerprints": {k: _read_one(resolve(p, workdir)) for k, p in many.items()}
        }
    else:
        result = _read_one(resolve(_str(params, "path"), workdir))
    result["hashes"] = _hashes(files, workdir)
    return result


def _read_one(path: str) -> dict[str, Any]:
    result: dict[str, Any] = {"path": path, "exists": False, "fingerprint": None, "error": None}
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 20)
        result["exists"] = True
        value = json.loads(raw.decode("utf-8"))
        if isinstance(value, dict):
            result["fingerprint"] = value
        else:
            result["error"] = "not a JSON object"
    except FileNotFoundError:
        pass
    except OSError as e:
        result["error"] = e.strerror or str(e)
    except (UnicodeDecodeError, ValueError) as e:
        result["error"] = f"not JSON: {e}"
    return result


def write_fingerprint(params: dict[str, Any]) -> dict[str, Any]:
    """``{path, data, workdir?, hash_files?}`` -> write ``data`` (plus ``prompts`` hashes, a
    version and the time) atomically to the sidecar. Result ``{"path", "fingerprint"}``."""
    workdir = params.get("workdir")
    path = resolve(_str(params, "path"), workdir)
    data = params.get("data")
    if not isinstance(data, dict):
        raise OpError("parameter 'data': expected a table", "bad-params")
    fingerprint = dict(data)
    fingerprint["version"] = FINGERPRINT_VERSION
    fingerprint["time"] = time.time()
    files = _str_dict(params, "hash_files")
    if files:
        fingerprint["prompts"] = _hashes(files, workdir)
    if isinstance(fingerprint.get("argv"), list):
        fingerprint["argv"] = mask_argv([str(a) for a in fingerprint["argv"]])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (json.dumps(fingerprint, sort_keys=True, indent=1) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path)
    return {"path": path, "fingerprint": fingerprint}


# --------------------------------------------------------------------------- log tail


def tail_log(params: dict[str, Any]) -> dict[str, Any]:
    """``{path, lines?=50, max_bytes?=65536}`` -> ``{"path", "exists", "size", "lines"}``.

    Reads at most ``max_bytes`` from the end; key-shaped tokens are masked.
    """
    path = resolve(_str(params, "path"), params.get("workdir"))
    lines = int(_number(params, "lines", 50))
    max_bytes = int(_number(params, "max_bytes", 65536))
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return {"path": path, "exists": False, "size": 0, "lines": []}
    except OSError as e:
        raise OpError(f"cannot read {path}: {e.strerror}", "unreadable") from None
    tail = [mask_text(line) for line in _tail_bytes(path, lines, max_bytes)]
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


def tail_records(params: dict[str, Any]) -> dict[str, Any]:
    """``{path, workdir?, count?=3, max_bytes?=4 MiB}`` -> the last complete records of a JSONL
    data file: ``{"path", "exists", "size", "records": [objects, oldest first], "bad_lines",
    "complete"}``.

    Reads backwards from the end, doubling a window from 64 KiB up to ``max_bytes``, until
    ``count`` records are found: only lines ending in a newline count (a line still being written
    is skipped), lines that are not JSON objects are counted in ``bad_lines``. ``complete`` is
    false when fewer than ``count`` records fit in ``max_bytes`` although the file holds more.
    Records are data, returned as written (not masked): the laptop masks what it shows.
    """
    path = resolve(_str(params, "path"), params.get("workdir"))
    count = max(0, int(_number(params, "count", 3)))
    max_bytes = max(1, int(_number(params, "max_bytes", 4 << 20)))
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            records, bad, begin = _last_records(f, size, count, max_bytes)
    except FileNotFoundError:
        return {"path": path, "exists": False, "size": 0, "records": [], "bad_lines": 0,
                "complete": True}  # fmt: skip
    except OSError as e:
        raise OpError(f"cannot read {path}: {e.strerror}", "unreadable") from None
    return {
        "path": path,
        "exists": True,
        "size": size,
        "records": records,
        "bad_lines": bad,
        "complete": len(records) >= count or begin == 0,
    }


# --------------------------------------------------------------------------- GPU


def gpu_holders(params: dict[str, Any]) -> dict[str, Any]:
    """``{pids?: [int]}`` -> ``{"available": bool, "holders": {pid: MiB}}``.

    ``available`` is false where the host has no working nvidia-smi. With ``pids``, only those
    processes are reported (the laptop passes the stopped run's process tree).
    """
    wanted = params.get("pids")
    if wanted is not None and (
        not isinstance(wanted, list) or not all(isinstance(p, int) for p in wanted)
    ):
        raise OpError("parameter 'pids': expected a list of integers", "bad-params")
    apps, summary = _procs.query_gpu()
    if apps is None:
        return {"available": False, "holders": {}, "detail": (summary or {}).get("error")}
    holders = {str(pid): mb for pid, mb in apps.items() if wanted is None or pid in wanted}
    return {"available": True, "holders": holders}


OPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "launch": launch,
    "repair_tail": repair_tail,
    "move_aside": move_aside,
    "read_fingerprint": read_fingerprint,
    "write_fingerprint": write_fingerprint,
    "lock_status": lock_status,
    "tail_log": tail_log,
    "tail_records": tail_records,
    "gpu_holders": gpu_holders,
}
