"""The waiter: the small process that starts a run inside its unit and outlives the launch.

Standard library only, Python >= 3.8, and self-contained (it imports nothing of runwatch): the
agent starts it as ``python -I -S -c BOOT runwatch-waiter <launch id>`` and sends this module's
source and the launch spec as one JSON document on its stdin (:data:`BOOT` reads them), so no
value ever becomes shell text and nothing needs to be installed on the host.

What it does, in order:

0. shrugs off every catchable signal (a client may signal its parent; only SIGKILL ends the
   waiter), with handlers its client's exec resets, so the client starts as if by hand;
1. makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, as tini and s6 do), so every
   descendant of the run that is orphaned — a SIGTERM handler's ``setsid`` child, a double-forked
   daemon — is re-parented to it rather than to init, and the tree stays whole without privileges;
2. starts the client in its own session with the launch token in its environment and, where the
   host gave the launch a cgroup, inside that cgroup (joined between fork and exec, so not one
   instruction of the client runs outside it);
3. answers the agent with the client's pid (one JSON line on stdout), then detaches from it;
4. reaps: records the client's exit status and time in the unit's record the moment it ends,
   read without reaping it (its zombie keeps the client's pid, group and session id from reuse
   while anything of the unit lives, and until a stop under way is over), the first orphaned
   descendant that crashed, and a stop through runwatch (SIGUSR1 from the agent, a process
   outside the tree); records every member it has seen that still lives every second, wherever
   it went; goes on reaping re-parented descendants, by pid, until it has no child but the
   client's zombie, the cgroup, if any, is empty and no process of the run's user carries the
   token; then reaps the client, records the end, removes the cgroup and exits. A launch the
   agent stopped waiting for starts nothing, or kills at once what it started.

The record is written atomically (rename) and 0600, first before the client starts (a record
that cannot be written refuses the start: nothing runs). Later writes that fail (a full disk)
never end the waiter: the record is kept in memory and written again every second, and the
waiter ends only once its end is on disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

BOOT = (
    "import json,sys;d=json.loads(sys.stdin.buffer.read().decode());"
    "exec(compile(d['source'],'<runwatch-waiter>','exec'),"
    "{'__name__':'__runwatch_waiter__','SPEC':d['spec']})"
)
"""The ``-c`` program of the waiter: this module's source and the spec, read from stdin."""

_PR_SET_CHILD_SUBREAPER = 36
_CGROUP_POLL_S = 0.5
_TRACK_S = 1.0
"""How often the waiter records its tree's members (and wakes when no child ends)."""
_STOP_HOLD_S = 600.0
"""Seconds at most the waiter keeps its client's zombie for a stop under way."""


def _subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return int(raw[raw.rindex(b")") + 2 :].split()[19])


def write_record(path: str, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` atomically, mode 0600; on a failure (a full disk) the old
    record stays whole and no temporary file is left."""
    tmp = f"{path}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            data = (json.dumps(record, sort_keys=True) + "\n").encode()
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _Record:
    """The unit's record as the waiter keeps it: in memory first, on disk when it can be.

    The record is bookkeeping; holding the tree is the waiter's job. A write that fails (a
    full disk, a quota) never ends the waiter: the record stays pending and is written again
    at every tick until it is on disk, and the waiter ends only once its last state is. While
    the waiter lives it is the record's keeper: a record removed (the state dir cleared under a
    live run), replaced or edited on disk is written again, whole, at the next tick, so the run
    is found as its unit again (never taken for processes runwatch did not start)."""

    def __init__(self, path: str, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data
        self.pending = True
        self.stamp: tuple[int, int, int] | None = None
        self.error = 0

    def save(self) -> bool:
        try:
            _private_dirs(os.path.dirname(self.path))
            write_record(self.path, self.data)
            st = os.stat(self.path)
        except OSError as e:
            self.pending = True
            self.error = e.errno or errno.EIO
            return False
        self.stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        self.pending = False
        return True

    def keep(self) -> None:
        """At each tick: write the record again if it is pending or not as it was written."""
        try:
            st = os.stat(self.path)
            intact = self.stamp == (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            intact = False
        if self.pending or not intact:
            self.save()


def _private_dirs(path: str) -> None:
    """``path`` and each missing level above it made 0700 (the state dir cleared under a run)."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for level in reversed(missing):
        try:
            os.mkdir(level, 0o700)
        except FileExistsError:
            continue
        os.chmod(level, 0o700)


def _populated(cgroup: str) -> bool:
    try:
        with open(os.path.join(cgroup, "cgroup.events"), "rb") as f:
            for line in f.read().decode().splitlines():
                key, _, value = line.partition(" ")
                if key == "populated":
                    return value.strip() != "0"
    except OSError:
        return False
    return False


def _joiner(cgroup: str | None) -> Any:
    if cgroup is None:
        return None
    procs = os.path.join(cgroup, "cgroup.procs")

    def join() -> None:  # runs in the child between fork and exec; the waiter has one thread
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)

    return join


def _heard() -> bool:
    """Does the agent still wait for this launch's answer (its end of stdout still open)?"""
    poller = select.poll()
    poller.register(1, select.POLLOUT)
    return not any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def _reply(obj: dict[str, Any]) -> bool:
    """Answer the agent; False when nobody read it (the agent stopped waiting: EPIPE)."""
    try:
        os.write(1, (json.dumps(obj) + "\n").encode())
        heard = True
    except OSError:
        heard = False
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    return heard


def _abort(client: int, cgroup: str | None) -> None:
    """The agent stopped waiting for the answer, so it reports the launch failed: nothing of it
    may run. Kill the client's session and cgroup at once, then whatever of the tree is left."""
    if cgroup:
        with contextlib.suppress(OSError), open(os.path.join(cgroup, "cgroup.kill"), "wb") as f:
            f.write(b"1")
    with contextlib.suppress(OSError):
        os.killpg(client, signal.SIGKILL)
    for _ in range(100):
        tree = [pid for pid, _ in _tree(os.getpid())]
        if not tree:
            return
        for pid in tree:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def _exit_of(status: int) -> dict[str, Any]:
    if os.WIFSIGNALED(status):
        return {"code": None, "signal": os.WTERMSIG(status)}
    return {"code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None, "signal": None}


def run(spec: dict[str, Any]) -> int:
    """Start ``spec``'s client in its unit, answer, reap until the unit is empty."""
    _shrug_signals()
    cgroup = spec.get("cgroup")
    keep = [int(fd) for fd in spec.get("keep_fds", [])]
    log_fd = int(spec["log_fd"])
    record = _Record(spec["record"], dict(spec["record_data"]))
    record.data.update(
        # ``on_stop``: the signal this waiter takes as "runwatch stops the unit" (a waiter of an
        # older agent has none, and SIGUSR1 would end it: it is never sent one).
        waiter={"pid": os.getpid(), "start_time": _start_ticks(os.getpid()), "on_stop": "SIGUSR1"},
        subreaper=_subreaper(),
        state="starting",
    )

    def refuse(error: str) -> int:
        for fd in keep:  # the locks are free the moment the launch is answered
            with contextlib.suppress(OSError):
                os.close(fd)
        if cgroup:
            _rmdir(cgroup)
        _reply({"ok": False, "error": error})
        return 127

    # The record first: a unit nobody could find again (its token, its cgroup, its waiter) is
    # never started. A record that cannot be written refuses the start before the client runs.
    if not record.save():
        return refuse(f"cannot write the unit's record {record.path}: {os.strerror(record.error)}")
    if not _heard():  # the agent gave up waiting and reported the launch failed: start nothing
        record.data.update(state="ended", ended_at=time.time(), exit=None, error="unanswered")
        record.save()
        return refuse("the agent stopped waiting for this launch")
    env = dict(spec["env"])
    try:
        child = subprocess.Popen(
            spec["argv"],
            cwd=spec["cwd"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(keep),
            preexec_fn=_joiner(cgroup),
        )
    except (OSError, subprocess.SubprocessError) as e:
        record.data.update(state="ended", exit=None, error=str(getattr(e, "strerror", None) or e))
        record.data["ended_at"] = time.time()
        record.save()
        return refuse(record.data["error"])
    os.close(log_fd)
    # The client holds the locks (and its descendants that keep them); the unit itself keeps a
    # second launch of the run out (``unit.live_unit``), so the waiter keeps no copy.
    for fd in keep:
        with contextlib.suppress(OSError):
            os.close(fd)
    record.data.update(
        state="running",
        child={"pid": child.pid, "start_time": _start_ticks(child.pid)},
        started_at=time.time(),
    )
    record.save()  # the "starting" record already names the unit; pending until written
    if not _reply({"ok": True, "pid": child.pid}):
        record.data.update(error="unanswered", stopped_at=time.time())
        record.save()
        _abort(child.pid, cgroup)
    _reap(child.pid, record, cgroup)
    # Nothing of the unit is left but its client's zombie, kept until a stop under way is over:
    # until then the client's pid, its process group and session id are never reused, so the
    # stop's ``killpg`` of them reaches only the unit. Reaped now, the unit ends.
    _hold_for_stop(record)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(child.pid, 0)
    record.data.update(state="ended", ended_at=time.time())
    # The end is written before the waiter ends (while it lives, the unit is not over): on a
    # full disk or over quota, again every tick until it is; on any other error, for a minute.
    tries = 0
    while not record.save() and (record.error in (errno.ENOSPC, errno.EDQUOT) or tries < 60):
        tries += 1
        _pause(record, _TRACK_S)
    if cgroup:
        _rmdir(cgroup)
    return 0


def _reap(client: int, record: _Record, cgroup: str | None) -> None:
    """Reap every orphaned descendant, by pid, until the unit is empty; the client is never
    reaped here (``waitid(..., WNOWAIT)`` reads its status and leaves its zombie).

    "Empty" is the kernel's answer, not a listing: this subreaper has no child but the client's
    zombie (every live descendant is re-parented to it when its parent ends, so a member that
    forks and exits faster than any listing is still its child), the cgroup, if any, has no
    process, and no process of the run's user carries the launch token (a writer started for
    the client by a daemon outside the tree, with the client's environment, is the run's).

    Records the client's exit status the moment it ends, the first descendant reaped that died
    of a signal or a non-zero exit (a worker that crashed after its parent exited 0: the run
    did not finish), and, every ``_TRACK_S``, every member it has seen that still lives, as
    (pid, start time), wherever it went since (out of the tree or the cgroup), so that they are
    still known if this waiter is killed. A record that could not be written is written again at
    the next tick."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
    me = os.getpid()
    seen: dict[int, int] = {}
    tracked = 0.0
    data = record.data
    exited = False
    token = str(data.get("token") or "")
    uid = data.get("uid")
    while True:
        if not exited:
            end = _peek(client)
            if end is not None:
                exited = True
                data.update(exit=end, exited_at=time.time())
                record.save()
        for pid in _kids(me):
            if pid == client:
                continue
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if got == pid and "failed" not in data and not _clean(status):
                data["failed"] = dict(_exit_of(status), pid=pid)
                record.save()
        if time.monotonic() - tracked >= _TRACK_S:
            tracked = time.monotonic()
            if _track(seen, me, cgroup):
                data["known"] = sorted([pid, ticks] for pid, ticks in seen.items())
                record.save()
            else:
                record.keep()
        if exited and not [p for p in _kids(me) if p != client]:
            if not (cgroup and _populated(cgroup)) and not _holders(token, uid):
                return
            _pause(record, _CGROUP_POLL_S)
            continue
        _pause(record, _TRACK_S)


def _peek(pid: int) -> dict[str, Any] | None:
    """The exit of the child ``pid`` once it has ended, read without reaping it (its zombie
    keeps the pid); None while it runs."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return {"code": None, "signal": None}
    if info is None or info.si_pid == 0:
        return None
    if info.si_code == os.CLD_EXITED:
        return {"code": info.si_status, "signal": None}
    return {"code": None, "signal": info.si_status}


def _kids(me: int) -> list[int]:
    """This process's children, zombies included, as the kernel lists them (one small file per
    thread); where the kernel has no such file, from one pass over /proc."""
    out: list[int] = []
    found = False
    try:
        tids = os.listdir(f"/proc/{me}/task")
    except OSError:
        tids = []
    for tid in tids:
        try:
            with open(f"/proc/{me}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
            found = True
        except (OSError, ValueError):
            continue
    if found:
        return out
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            if int(raw[raw.rindex(b")") + 2 :].split()[1]) == me:
                out.append(int(name))
    return out


def _track(seen: dict[int, int], me: int, cgroup: str | None) -> bool:
    """Add the tree's and the cgroup's processes to ``seen`` (pid -> start time) and drop those
    that ended (a pid with another start time is another process); True when it changed."""
    before = dict(seen)
    for pid, ticks in _tree(me):
        seen[pid] = ticks
    for pid in _cgroup_members(cgroup):
        start = _start_ticks(pid)
        if start is not None:
            seen[pid] = start
    for pid, ticks in list(seen.items()):
        if _start_ticks(pid) != ticks:
            del seen[pid]
    return seen != before


def _cgroup_members(cgroup: str | None) -> list[int]:
    if not cgroup:
        return []
    try:
        with open(os.path.join(cgroup, "cgroup.procs"), "rb") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def _holders(token: str, uid: Any) -> list[int]:
    """The processes of user ``uid`` (real or effective) whose environment carries ``token``."""
    if not token or not isinstance(uid, int):
        return []
    wanted = f"RUNWATCH_LAUNCH={token}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read()
            if wanted not in environ.split(b"\0"):
                continue
            if uid not in _uids(int(name)):
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            out.append(int(name))
    return out


def _uids(pid: int) -> tuple[int, ...]:
    """The real and effective uid of ``pid`` (``/proc/PID/status``), empty when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f.read().splitlines():
                if line.startswith(b"Uid:"):
                    return tuple(int(x) for x in line.split()[1:3])
    except (OSError, ValueError):
        pass
    return ()


def _hold_for_stop(record: _Record) -> None:
    """While a stop of the unit is under way (its marker, ``<launch id>.stop`` beside the
    record, names a live agent, by pid and start time, and is not marked over), keep the
    client's zombie: the stop may still ``killpg`` its group. At most ``_STOP_HOLD_S``: an
    agent that hangs holds nothing."""
    marker = record.path[: -len(".json")] + ".stop" if record.path.endswith(".json") else ""
    deadline = time.monotonic() + _STOP_HOLD_S
    while marker and time.monotonic() < deadline:
        try:
            with open(marker, "rb") as f:
                stop = json.loads(f.read(65536).decode("utf-8"))
        except (OSError, ValueError):
            return
        if not isinstance(stop, dict) or stop.get("over"):
            return
        agent = stop.get("agent_pid")
        if (
            not isinstance(agent, int)
            or not _alive(agent)
            or _start_ticks(agent) != stop.get("agent_start")
        ):
            return  # its agent is gone (its pid may be another process's now)
        _pause(record, _CGROUP_POLL_S)
        record.keep()


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


_WAITED = {signal.SIGCHLD, signal.SIGUSR1}
"""Blocked while the waiter reaps, and taken with their sender by :func:`_pause`."""

_SHRUGGED = [
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGUSR1",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGVTALRM",
    "SIGPROF",
    "SIGIO",
    "SIGPWR",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGTRAP",
    "SIGSYS",
]


def _shrug_signals() -> None:
    """No catchable signal ends the waiter: its client is its child, and a client may signal
    its parent (readiness as SIGUSR1, "stop the launcher" as SIGTERM); a waiter that ended would
    leave the exit unrecorded and the tree unheld (only SIGKILL can end it). Handlers, not
    ``SIG_IGN``: the client's exec resets them, so it starts with every signal at its default,
    as when started by hand (an ignored SIGINT or SIGHUP would stay ignored in it)."""

    def shrug(*_: Any) -> None:
        return None

    names = [getattr(signal, n) for n in _SHRUGGED if hasattr(signal, n)]
    rt = range(signal.SIGRTMIN, signal.SIGRTMAX + 1) if hasattr(signal, "SIGRTMIN") else []
    for sig in [*names, *rt]:
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            signal.signal(sig, shrug)


def _pause(record: _Record, timeout: float) -> None:
    """Wait up to ``timeout`` for a child's end or the agent's stop notice (SIGUSR1 from a
    process outside the unit's tree: runwatch stops the unit, recorded even when the agent's
    marker file cannot be written). A SIGUSR1 from the run itself is no stop."""
    info = signal.sigtimedwait(_WAITED, timeout)
    if info is None or info.si_signo != signal.SIGUSR1 or "stopped_at" in record.data:
        return
    if not _in_tree(info.si_pid, os.getpid()):
        record.data["stopped_at"] = time.time()
        record.save()


def _in_tree(pid: int, root: int) -> bool:
    """Is ``pid`` ``root``'s descendant (or gone, so that nobody can tell)?"""
    seen = 0
    while pid > 1 and seen < 4096:
        if pid == root:
            return True
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            return True
        pid, seen = int(raw[raw.rindex(b")") + 2 :].split()[1]), seen + 1
    return False


def _clean(status: int) -> bool:
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _tree(root: int) -> list[list[int]]:
    """``[pid, start time]`` of every descendant of ``root``, from one pass over /proc."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()
        parent[int(name)] = int(fields[1])
        ticks[int(name)] = int(fields[19])
    out = []
    for pid in sorted(parent):
        p, seen = parent.get(pid), 0
        while p is not None and p != root and p > 1 and seen < 4096:
            p, seen = parent.get(p), seen + 1
        if p == root:
            out.append([pid, ticks[pid]])
    return out


def _rmdir(path: str) -> None:
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except OSError as e:
            if e.errno == errno.ENOENT:
                return
            time.sleep(0.1)


if __name__ == "__runwatch_waiter__":  # started by the agent (see BOOT)
    sys.exit(run(globals()["SPEC"]))
