"""What the soak's checker reads from /proc: argv, start ticks, state, owner, open writers."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_ACCMODE = 0o3  # O_ACCMODE: O_RDONLY 0, O_WRONLY 1, O_RDWR 2


def argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]


def stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of ``pid``, or None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[19])


def ppid(pid: int) -> int | None:
    """The parent of ``pid``, or None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descendants(root: int) -> list[tuple[int, int, list[str]]]:
    """(pid, start ticks, argv) of every live descendant of ``root``."""
    children: dict[int, list[int]] = {}
    for pid in pids():
        parent = ppid(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        st = stat(pid)
        if st is not None and st[0] != "Z":
            out.append((pid, st[1], argv(pid)))
        todo += children.get(pid, [])
    return out


def uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def alive(pid: int, start: int | None = None) -> bool:
    """``pid`` exists, is not a zombie, and (when given) started at ``start`` ticks."""
    s = stat(pid)
    return s is not None and s[0] != "Z" and (start is None or s[1] == start)


def pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


@dataclass(frozen=True)
class Writer:
    """One process holding a file open for writing."""

    pid: int
    start: int
    uid: int
    fd: int
    path: str
    flags: str
    argv: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "start_ticks": self.start,
            "uid": self.uid,
            "fd": self.fd,
            "path": self.path,
            "flags": self.flags,
            "argv": list(self.argv),
        }


def writers_under(root: str, name_prefix: str) -> dict[tuple[int, int], list[Writer]]:
    """Every open-for-write descriptor on a file under ``root`` whose name starts with
    ``name_prefix``, grouped by the file's (dev, inode). One entry per process and file."""
    out: dict[tuple[int, int], dict[int, Writer]] = {}
    prefix = root.rstrip("/") + "/"
    for pid in pids():
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if not target.startswith(prefix):
                continue
            if not os.path.basename(target.removesuffix(" (deleted)")).startswith(name_prefix):
                continue
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    info = f.read()
                st = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            flags = next(
                (ln.split()[1] for ln in info.splitlines() if ln.startswith("flags:")), "0"
            )
            if int(flags, 8) & _ACCMODE == 0:
                continue
            s = stat(pid)
            if s is None:
                continue
            key = (st.st_dev, st.st_ino)
            out.setdefault(key, {})[pid] = Writer(
                pid, s[1], uid(pid) or 0, int(fd), target, flags, tuple(argv(pid))
            )
    return {k: list(v.values()) for k, v in out.items()}


def launch_token(pid: int) -> str | None:
    """The ``RUNWATCH_LAUNCH`` token in ``pid``'s environment (inherited by every descendant of a
    launch, whatever it did), or None."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    for var in raw.split(b"\0"):
        if var.startswith(b"RUNWATCH_LAUNCH="):
            return var.split(b"=", 1)[1].decode(errors="replace")
    return None


def cgroup(pid: int) -> str | None:
    """``pid``'s cgroup v2 path (``0::/...``), or None."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    return next((ln[3:] for ln in lines if ln.startswith("0::")), None)


CLK_TCK = os.sysconf("SC_CLK_TCK")


def start_wall(ticks: int) -> float:
    """The wall-clock time of a process start given in clock ticks since boot (``/proc/uptime``
    has hundredths of a second, the boot time in ``/proc/stat`` whole seconds only)."""
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - (uptime - ticks / CLK_TCK)
