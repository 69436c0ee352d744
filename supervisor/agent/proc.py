"""Process listing and identity, read from ``/proc`` (psutil where a host has no ``/proc``).

Standard library only and Python >= 3.8 (runs on the host inside the agent). It reads ``/proc``
on Linux; where ``/proc`` is absent it uses psutil when the host has it. On Linux ``/proc`` is
read even when psutil is installed: a process identity is defined in ``/proc`` terms (start time
in clock ticks since boot, boot id) and psutil only exposes the start time as a float of
wall-clock seconds, which cannot be compared exactly. Which processes are runs is decided by
:mod:`supervisor.agent.match`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import threading
import time
from typing import TYPE_CHECKING, Any

from supervisor.agent import safefs
from supervisor.agent.argflags import DEFAULT_SCRIPTS
from supervisor.agent.masking import argv_secret_values, env_secret_values, mask_argv, register
from supervisor.agent.match import (
    RunFiles,
    client_for,
    find_runs,
    parse_flags,
    place_of,
    run_evidence,
    script_index,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from collections.abc import Set as AbstractSet

HAS_PSUTIL = importlib.util.find_spec("psutil") is not None
"""Whether the host has psutil (optional). It is imported only where there is no ``/proc``, the
one place it is read (see :func:`uses_proc`)."""
if HAS_PSUTIL and not os.path.exists("/proc/self/stat"):  # pragma: no cover - hosts without /proc
    import psutil  # type: ignore[import-untyped,unused-ignore]
else:
    psutil = None  # type: ignore[assignment,unused-ignore]

PROC = "/proc"


def clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 100


CLK_TCK = clock_ticks()


def boot_id() -> str:
    """The kernel's boot id (changes on every boot); empty where the kernel has none."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def uses_proc() -> bool:
    return os.path.exists(PROC + "/self/stat")


class Stat:
    """The fields of ``/proc/PID/stat`` the listing uses."""

    __slots__ = (
        "pgrp", "ppid", "rss_pages", "session", "start_time", "state", "stime", "threads", "utime"
    )  # fmt: skip

    def __init__(self, raw: bytes) -> None:
        # comm may contain spaces and parentheses: the fields start after the LAST ')'.
        fields = raw[raw.rfind(b")") + 2 :].split()
        self.state = fields[0].decode("ascii", "replace")
        self.ppid = int(fields[1])
        self.pgrp = int(fields[2])
        self.session = int(fields[3])
        self.utime = int(fields[11])
        self.stime = int(fields[12])
        self.threads = int(fields[17])
        self.start_time = int(fields[19])
        self.rss_pages = int(fields[21])


def read_stat(pid: int) -> Stat | None:
    """``/proc/PID/stat`` parsed, or None when the process is gone."""
    return read_stat_path(f"{PROC}/{pid}/stat")


def read_stat_path(path: str) -> Stat | None:
    try:
        with open(path, "rb") as f:
            return Stat(f.read())
    except (OSError, IndexError, ValueError):
        return None


def _read_cmdline(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def live_tasks(pid: int) -> list[int]:
    """Thread ids of ``pid`` other than its main thread that have not exited."""
    try:
        tids = [int(t) for t in os.listdir(f"{PROC}/{pid}/task") if t.isdigit() and int(t) != pid]
    except OSError:
        return []
    out = []
    for tid in tids:
        st = read_stat_path(f"{PROC}/{pid}/task/{tid}/stat")
        if st is not None and st.state not in "ZX":
            out.append(tid)
    return out


def read_argv(pid: int) -> list[str] | None:
    """argv of a process (None when gone; empty for kernel threads and exited processes).

    A process whose main thread has exited while other threads run keeps its argv in the memory
    of those threads: it is read from a live task's ``cmdline``."""
    raw = _read_cmdline(f"{PROC}/{pid}/cmdline")
    if raw is None:
        return None
    if not raw:
        for tid in live_tasks(pid):
            raw = _read_cmdline(f"{PROC}/{pid}/task/{tid}/cmdline") or b""
            if raw:
                break
        if not raw:
            return []
    parts = raw.split(b"\0")
    if parts[-1] == b"":
        parts.pop()
    # backslashreplace: always valid text for JSON, and the same string on every read.
    return [p.decode("utf-8", "backslashreplace") for p in parts]


def process_state(pid: int, st: Stat) -> str:
    """The state letter of the process: a live thread's when the main thread has exited
    (``Z`` with other threads still running), else the main thread's."""
    if st.state == "Z" and st.threads > 1:
        for tid in live_tasks(pid):
            tst = read_stat_path(f"{PROC}/{pid}/task/{tid}/stat")
            if tst is not None:
                return tst.state
    return st.state


def read_uid(pid: int) -> int | None:
    try:
        with open(f"{PROC}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def uptime_s() -> float:
    try:
        with open(PROC + "/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class ProcRow:
    """One process of the host as seen in one pass."""

    __slots__ = ("argv", "pid", "ppid")

    def __init__(self, pid: int, ppid: int, argv: list[str]) -> None:
        self.pid = pid
        self.ppid = ppid
        self.argv = argv


def process_table() -> dict[int, ProcRow]:
    """Every process of the host: pid -> (ppid, argv); those that vanish mid-read are skipped."""
    table: dict[int, ProcRow] = {}
    if uses_proc():
        for name in os.listdir(PROC):
            if not name.isdigit():
                continue
            pid = int(name)
            st = read_stat(pid)
            if st is None:
                continue
            argv = read_argv(pid)
            if argv is None:
                continue
            table[pid] = ProcRow(pid, st.ppid, argv)
        return table
    if psutil is None:  # pragma: no cover - neither /proc nor psutil
        raise RuntimeError("cannot list processes: no /proc and no psutil on this host")
    for p in psutil.process_iter(["pid", "ppid", "cmdline"]):  # pragma: no cover - non-Linux
        info = p.info
        table[info["pid"]] = ProcRow(info["pid"], info["ppid"] or 0, list(info["cmdline"] or []))
    return table


def stat_table() -> dict[int, Stat]:
    """``/proc/PID/stat`` of every process of the host, one read each (no argv): what a walk
    that looks at argv only for a few of them needs; those that vanish mid-read are skipped."""
    out: dict[int, Stat] = {}
    for name in os.listdir(PROC):
        if name.isdigit():
            st = read_stat_path(f"{PROC}/{name}/stat")
            if st is not None:
                out[int(name)] = st
    return out


def descendants(table: dict[int, ProcRow], pid: int) -> list[int]:
    """Every descendant of ``pid`` in ``table``, breadth first."""
    kids: dict[int, list[int]] = {}
    for row in table.values():
        kids.setdefault(row.ppid, []).append(row.pid)
    out: list[int] = []
    queue = list(kids.get(pid, []))
    seen = {pid}
    while queue:
        p = queue.pop(0)
        if p in seen:
            continue
        seen.add(p)
        out.append(p)
        queue.extend(kids.get(p, []))
    return out


def ancestors_live(pid: int) -> list[int]:
    """Ancestors of ``pid`` read directly from /proc (for the agent's own chain)."""
    out: list[int] = []
    seen = {pid}
    st = read_stat(pid)
    while st is not None and st.ppid > 0 and st.ppid not in seen:
        out.append(st.ppid)
        seen.add(st.ppid)
        st = read_stat(st.ppid)
    return out


def identity_of(pid: int) -> dict[str, Any] | None:
    """``{boot_id, pid, start_time, uid, argv}`` of a live process, or None when it is gone."""
    st = read_stat(pid)
    argv = read_argv(pid)
    uid = read_uid(pid)
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


# --------------------------------------------------------------------------- descriptors


def fd_dirs(pid: int) -> list[str]:
    """The descriptor tables of a process: its own, and its live threads' when its main thread
    has exited (an exited thread's table is empty)."""
    dirs = [f"{PROC}/{pid}/fd"]
    st = read_stat(pid)
    if st is not None and st.state == "Z" and st.threads > 1:
        dirs += [f"{PROC}/{pid}/task/{tid}/fd" for tid in live_tasks(pid)]
    return dirs


def open_inodes(pid: int) -> set[tuple[int, int]] | None:
    """``(dev, inode)`` of every file ``pid`` has open; None when its descriptors cannot be read
    (another user's process, for a non-root agent)."""
    found: set[tuple[int, int]] = set()
    readable = False
    for d in fd_dirs(pid):
        try:
            fds = os.listdir(d)
        except OSError:
            continue
        readable = True
        for fd in fds:
            with contextlib.suppress(OSError):
                st = os.stat(f"{d}/{fd}")
                found.add((st.st_dev, st.st_ino))
    return found if readable else None


def mapped_inodes(pid: int, among: AbstractSet[tuple[int, int]]) -> set[tuple[int, int]]:
    """Those of ``among`` (``(dev, inode)``) that ``pid`` maps: a file mapped is a file it can
    write without a descriptor. ``/proc/PID/maps`` names each mapping's inode number, so only a
    process mapping one of those numbers has its ``/proc/PID/map_files`` entries looked at
    (``os.stat`` of each: the files themselves; readable by root only, else nothing is found)."""
    numbers = {str(ino) for _, ino in among}
    if not numbers:
        return set()
    try:
        with open(f"{PROC}/{pid}/maps", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return set()
    if not any(len(cols) > 4 and cols[4] in numbers for cols in map(str.split, text.splitlines())):
        return set()
    found: set[tuple[int, int]] = set()
    folder = f"{PROC}/{pid}/map_files"
    try:
        entries = os.listdir(folder)
    except OSError:
        return found
    for entry in entries:
        with contextlib.suppress(OSError):
            st = os.stat(f"{folder}/{entry}")
            if (st.st_dev, st.st_ino) in among:
                found.add((st.st_dev, st.st_ino))
    return found


WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND
"""``flags`` bits (``/proc/PID/fdinfo/FD``) of a descriptor open for writing."""


def _fd_flags(fd_dir: str, fd: str) -> int:
    """The open flags of a descriptor (0 when unreadable)."""
    try:
        with open(fd_dir[: -len("fd")] + "fdinfo/" + fd) as f:
            for line in f:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0


WRITING = frozenset(("write", "map", "place"))
"""The ways of holding a data file (:func:`file_users`) that make a process its writer."""


def holding_text(how: list[str]) -> str:
    """How a process holds a run's file, in words (``how`` of :func:`file_users`)."""
    if "write" in how:
        return "has it open for writing"
    if "map" in how:
        return "maps it"
    if "place" in how:
        return "has its working directory (or root) in its directory, by file identity"
    return "has it open (lock)"


def file_users(
    write_inodes: AbstractSet[tuple[int, int]],
    any_inodes: AbstractSet[tuple[int, int]] = frozenset(),
    pids: Iterable[int] | None = None,
    dir_inodes: AbstractSet[tuple[int, int]] = frozenset(),
) -> tuple[dict[int, list[str]], list[int]]:
    """Who holds the given files: ``({pid: [how, ...]}, uninspected pids)``.

    ``how`` is ``write`` for a descriptor on one of ``write_inodes`` opened for writing
    (``O_WRONLY``, ``O_RDWR`` or ``O_APPEND``), ``map`` for a mapping of one of them
    (:func:`mapped_inodes`), ``place`` for a working directory or root that is one of
    ``dir_inodes`` (the data files' directories: a writer that opens and closes the file for each
    record, by whatever path or bind mount, :func:`match.place_of`), and ``open`` for any
    descriptor on one of ``any_inodes`` (a lock file: holding it open may hold the lock). Every
    process of the host is looked at (``pids`` limits that), whoever owns it, through every
    descriptor table it has (see :func:`fd_dirs`); ``uninspected`` are the processes whose
    descriptors could not be read (other users' processes, for a non-root agent).
    """
    found: dict[int, list[str]] = {}
    uninspected: list[int] = []
    if not write_inodes and not any_inodes and not dir_inodes:
        return found, uninspected
    if pids is None:
        try:
            pids = [int(p) for p in os.listdir(PROC) if p.isdigit()]
        except OSError:
            return found, uninspected
    for pid in pids:
        readable = False
        hows: set[str] = set()
        for d in fd_dirs(pid):
            try:
                fds = os.listdir(d)
            except PermissionError:
                continue
            except OSError:
                readable = True  # gone: nothing to inspect
                continue
            readable = True
            for fd in fds:
                try:
                    st = os.stat(f"{d}/{fd}")
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                if key in any_inodes:
                    hows.add("open")
                if key in write_inodes and _fd_flags(d, fd) & WRITE_FLAGS:
                    hows.add("write")
        if dir_inodes and place_of(pid) & dir_inodes:
            hows.add("place")
        if mapped_inodes(pid, write_inodes):
            hows.add("map")
        if not readable and os.path.exists(f"{PROC}/{pid}"):
            uninspected.append(pid)
        if hows:
            found[pid] = sorted(hows)
    return found, uninspected


def inodes_of(paths: Iterable[str]) -> set[tuple[int, int]]:
    """``(dev, inode)`` of each of ``paths`` that exists, never reached through another
    user's link (its target is not the run's file: its holders are no writers of the run)."""
    out: set[tuple[int, int]] = set()
    for path in paths:
        with contextlib.suppress(OSError, safefs.UnsafePath):
            st = safefs.stat_file(path)
            out.add((st.st_dev, st.st_ino))
    return out


def dirs_of(paths: Iterable[str]) -> set[tuple[int, int]]:
    """``(dev, inode)`` of the directory of each of ``paths`` that exists, never reached through
    another user's link (:func:`inodes_of`)."""
    return inodes_of(os.path.dirname(p) or "." for p in paths)


def poll_until(cond: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Wait until ``cond()`` is true or ``timeout`` seconds passed; return the last value."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return False
        threading.Event().wait(interval)


# --------------------------------------------------------------------------- listing


class Lister:
    """Lists runs across refreshes (keeps the CPU time of each process to compute CPU %)."""

    def __init__(self, self_pid: int | None = None) -> None:
        self.self_pid = os.getpid() if self_pid is None else self_pid
        self.boot_id = boot_id()
        self._cpu: dict[tuple[int, int], tuple[float, float]] = {}

    def excluded(self) -> set[int]:
        return {self.self_pid, *ancestors_live(self.self_pid)}

    def list_runs(
        self,
        scripts: Sequence[str] = DEFAULT_SCRIPTS,
        show_other_users: bool = False,
        gpu_per_pid: dict[int, float] | None = None,
        runs: Sequence[RunFiles] = (),
        secret_env: Sequence[str] = (),
        clients: Sequence[dict[str, Any]] | None = None,
        units: Sequence[dict[str, Any]] = (),
        config_id: str | None = None,
        named: Sequence[int] = (),
    ) -> list[dict[str, Any]]:
        """ProcessInfo-shaped dicts of every run on the host, each with its ``evidence`` of
        being one of ``runs`` (see ``match.run_evidence``). The values of the ``secret_env``
        variables (in the process's environment or the agent's) are masked in its argv.
        ``clients`` (client profiles as plain data) say how the flags of each script are read.

        ``units`` (running units, ``unit.list_units``): each is one run, listed by its main
        process whatever its argv (a renamed process, a script of no profile), with every other
        member among its ``children``; its evidence is ``unit`` for its run when it was launched
        by ``config_id``, and ``files`` for each run of this config whose data files it was
        started on (``writes``: by identity, whatever its config and its run's name).

        ``named`` (pids the user named, ``kill RUN --pid``): listed whatever their argv, with
        their evidence (a process that holds a run's data file open is tied to it by ``fd``)."""
        if not uses_proc():  # pragma: no cover - non-Linux hosts
            return self._list_psutil(scripts, show_other_users, gpu_per_pid, runs, clients)
        table = process_table()
        my_uid = os.getuid()
        now_boot = uptime_s()
        now = time.monotonic()
        out: list[dict[str, Any]] = []
        seen: set[tuple[int, int]] = set()
        member_of = {pid: u for u in units for pid in u.get("members") or []}
        run_inodes = {key for r in runs for key in r.inodes}
        listed: list[tuple[int, int, dict[str, Any] | None]] = []
        for u in units:
            main = u.get("main_pid")
            if isinstance(main, int) and main in table:
                idx = script_index(table[main].argv, scripts)
                listed.append((main, 0 if idx is None else idx, u))
        listed += [
            (pid, idx, None)
            for pid, idx in find_runs(table, scripts, self.excluded())
            if pid not in member_of
        ]
        taken = {pid for pid, _, _ in listed} | set(member_of) | set(self.excluded())
        listed += [
            (pid, script_index(table[pid].argv, scripts) or 0, None)
            for pid in sorted(set(named))
            if pid in table and pid not in taken
        ]
        for pid, idx, held in sorted(listed, key=lambda x: x[0]):
            if not table[pid].argv:
                continue  # a kernel thread or an exited process has no argv to read
            st = read_stat(pid)
            uid = read_uid(pid)
            if st is None or uid is None:
                continue  # exited while listing
            if uid != my_uid and not show_other_users:
                continue
            argv = table[pid].argv
            kids = descendants(table, pid)
            if held is not None:
                kids = sorted(set(kids) | (set(held.get("members") or []) - {pid}))
            cpu_s = (st.utime + st.stime) / CLK_TCK
            started_s = st.start_time / CLK_TCK
            age = max(now_boot - started_s, 0.0)
            key = (pid, st.start_time)
            seen.add(key)
            prev = self._cpu.get(key)
            if prev is not None and now > prev[1]:
                cpu_pct = 100.0 * (cpu_s - prev[0]) / (now - prev[1])
            else:
                cpu_pct = 100.0 * cpu_s / age if age > 0 else 0.0
            self._cpu[key] = (cpu_s, now)
            try:
                cwd: str | None = os.readlink(f"{PROC}/{pid}/cwd")
            except OSError:
                cwd = None
            record = process_record(
                self.boot_id,
                pid,
                st.start_time,
                uid,
                my_uid,
                argv,
                idx,
                kids,
                gpu_per_pid,
                env_values(pid, secret_env),
                client_for(argv[idx], clients),
            )
            record.update(
                uptime_s=round(age, 2),
                cpu_percent=round(max(cpu_pct, 0.0), 1),
                rss_mb=round(st.rss_pages * _page_size() / 1048576.0, 1),
                state=process_state(pid, st),
                cwd=cwd,
                ppid=st.ppid,
                threads=st.threads,
                evidence=run_evidence(
                    cwd,
                    argv,
                    idx,
                    runs,
                    (open_inodes(pid) or set()) | mapped_inodes(pid, run_inodes) if runs else None,
                    client_for(argv[idx], clients),
                    pid,
                ),
            )
            if held is not None:
                mine = bool(config_id) and held.get("config_id") == config_id
                own = {str(held.get("run")): ["unit"]} if mine else {}
                # Any unit, of any config and any run name, started on a run's data files (by
                # identity) writes them: the run is running, held by that unit's run.
                shared = {str(r): ["files"] for r in held.get("writes") or [] if r not in own}
                record["evidence"] = {**shared, **own}
                record["unit"] = {
                    "launch_id": held.get("launch_id"),
                    "held_by": held.get("held_by"),
                    "run": held.get("run"),
                    "mine": mine,
                    "config_id": held.get("config_id"),
                    "config_path": held.get("config_path"),
                }
            out.append(record)
        for key in list(self._cpu):
            if key not in seen:
                del self._cpu[key]
        return out

    def _list_psutil(  # pragma: no cover - non-Linux hosts
        self,
        scripts: Sequence[str],
        show_other_users: bool,
        gpu_per_pid: dict[int, float] | None,
        runs: Sequence[RunFiles] = (),
        clients: Sequence[dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        assert psutil is not None
        table = process_table()
        my_uid = os.getuid()
        boot = psutil.boot_time()
        out: list[dict[str, Any]] = []
        for pid, idx in find_runs(table, scripts, self.excluded()):
            try:
                p = psutil.Process(pid)
                with p.oneshot():
                    uid = p.uids().real
                    created = p.create_time()
                    mem = p.memory_info().rss
                    state = p.status()
                    cpu = p.cpu_percent(None)
                    try:
                        cwd: str | None = p.cwd()
                    except psutil.Error:
                        cwd = None
            except psutil.Error:
                continue
            if uid != my_uid and not show_other_users:
                continue
            argv = table[pid].argv
            kids = descendants(table, pid)
            start = psutil_start_ticks(created, boot)
            record = process_record(
                self.boot_id,
                pid,
                start,
                uid,
                my_uid,
                argv,
                idx,
                kids,
                gpu_per_pid,
                client=client_for(argv[idx], clients),
            )
            record.update(
                uptime_s=round(max(time.time() - created, 0.0), 2),
                cpu_percent=cpu,
                rss_mb=round(mem / 1048576.0, 1),
                state=state,
                cwd=cwd,
                evidence=run_evidence(cwd, argv, idx, runs, None, client_for(argv[idx], clients)),
            )
            out.append(record)
        return out


def process_record(
    boot_id: str,
    pid: int,
    start_time: int,
    uid: int,
    my_uid: int,
    argv: list[str],
    idx: int,
    kids: list[int],
    gpu_per_pid: dict[int, float] | None,
    secrets: Sequence[str] = (),
    client: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The parts of a listed run that do not depend on where they were read (/proc or psutil).

    The identity carries the argv masked (by pattern, and the known ``secrets`` values), so
    secrets never leave the host.
    """
    register(argv_secret_values(argv))  # its log may print them: masked in every tail too
    masked = mask_argv(argv, secrets)
    gpu = None
    if gpu_per_pid is not None:
        gpu = sum(gpu_per_pid.get(p, 0.0) for p in [pid, *kids])
    return {
        "identity": {
            "boot_id": boot_id,
            "pid": pid,
            "start_time": start_time,
            "uid": uid,
            "argv": masked,
        },
        "user": user_name(uid),
        "argv_masked": masked,
        "children": kids,
        "flags": parse_flags(argv, idx, client),
        "gpu_memory_mb": gpu,
        "run": None,
        "killable": uid == my_uid,
        "script": os.path.basename(argv[idx]),
    }


def env_values(pid: int, names: Sequence[str]) -> list[str]:
    """The secret values in the environment of process ``pid`` (those this user may read): the
    variables ``names`` and every credential-named variable (``masking.env_secret_values``), and
    the same in the agent's own environment. They are registered: every text this agent sends
    from now on has them masked (a log tail that prints the run's token)."""
    wanted = set(names)
    found = [os.environ[n] for n in wanted if os.environ.get(n)]
    found += env_secret_values(os.environ)
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        register(found)
        return found
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and value:
            env[name.decode("utf-8", "replace")] = value.decode("utf-8", "backslashreplace")
    found += [v for k, v in env.items() if k in wanted]
    found += env_secret_values(env)
    register(found)
    return found


def job_of_process(pid: int) -> str | None:
    """The Slurm job a process of this node belongs to, from its ``SLURM_ARRAY_JOB_ID`` or
    ``SLURM_JOB_ID`` (None: none, or its environment is not readable)."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    env: dict[bytes, bytes] = {}
    for item in raw.split(b"\0"):
        name, _, value = item.partition(b"=")
        env[name] = value
    job = env.get(b"SLURM_ARRAY_JOB_ID") or env.get(b"SLURM_JOB_ID")
    return job.decode() if job and job.isdigit() else None


def psutil_start_ticks(create_time: float, boot_time: float) -> int:
    """Start time in clock ticks from psutil's wall-clock floats (hosts without /proc)."""
    return round((create_time - boot_time) * CLK_TCK)


def _page_size() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 4096
