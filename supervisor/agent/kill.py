"""Stopping a run: the ``kill`` and ``probe`` ops, process pinning with pidfds.

Standard library only, Python >= 3.8 (runs on the host inside the agent). A kill names the run by
its identity (boot id, pid, start time, uid, masked argv); it is refused when the live process
differs, and every process of the tree is pinned with a pidfd before it is signalled, so a
recycled PID is never hit. Each process is reported with its outcome and the proof of its exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from supervisor.agent import proc as procs
from supervisor.agent.argflags import DEFAULT_SCRIPTS
from supervisor.agent.masking import masked_equal
from supervisor.agent.match import script_index
from supervisor.agent.protocol import (
    AGENT_LOADER,
    KILL_CONFIRM_S,
    AgentOpError,
    KillResult,
    KillTarget,
    ProbeResult,
    param_number,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from supervisor.agent.server import Agent

_FALLBACK_POLL_S = 0.005


# --------------------------------------------------------------------------- pidfd


def _libc_syscall() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn: Callable[..., int] = libc.syscall
        return fn
    except (OSError, AttributeError):  # pragma: no cover - exotic libc
        return None


_NR_PIDFD_SEND_SIGNAL = 424  # same number on every architecture since Linux 5.1
_NR_PIDFD_OPEN = 434


def pidfd_open(pid: int) -> int | None:
    """A pidfd for ``pid``, or None where the kernel or Python has none.

    Raises ProcessLookupError when the process does not exist. ``RUNWATCH_AGENT_NO_PIDFD=1`` in
    the agent's environment forces the fallback (as on kernels before 5.3), for tests.
    """
    if os.environ.get("RUNWATCH_AGENT_NO_PIDFD") == "1":
        if not os.path.exists(f"{procs.PROC}/{pid}"):
            raise ProcessLookupError(pid)
        return None
    if hasattr(os, "pidfd_open"):
        try:
            fd: int = os.pidfd_open(pid)
            return fd
        except ProcessLookupError:
            raise
        except OSError:
            return None
    call = _libc_syscall()  # Python 3.8: no os.pidfd_open
    if call is None:
        return None
    import ctypes

    fd = call(_NR_PIDFD_OPEN, ctypes.c_int(pid), ctypes.c_uint(0))
    if fd < 0:
        if ctypes.get_errno() == 3:  # ESRCH
            raise ProcessLookupError(pid)
        return None
    return fd


def pidfd_send_signal(fd: int, sig: int) -> None:
    """Signal the process a pidfd refers to (never a recycled PID). Raises ProcessLookupError."""
    if hasattr(signal, "pidfd_send_signal"):
        signal.pidfd_send_signal(fd, sig)  # novermin
        return
    call = _libc_syscall()
    if call is None:  # pragma: no cover - pidfd_open would have returned None
        raise OSError("pidfd_send_signal unavailable")
    import ctypes

    if call(_NR_PIDFD_SEND_SIGNAL, ctypes.c_int(fd), ctypes.c_int(sig), None, ctypes.c_uint(0)):
        err = ctypes.get_errno()
        if err == 3:
            raise ProcessLookupError(fd)
        raise OSError(err, os.strerror(err))


def has_pidfd() -> bool:
    """Whether this kernel and Python give pidfds (a kill then never signals a recycled PID)."""
    try:
        fd = pidfd_open(os.getpid())
    except OSError:
        return False
    if fd is None:
        return False
    os.close(fd)
    return True


# --------------------------------------------------------------------------- kill


class _Target:
    """One process of a kill: the run or one of its descendants, pinned by (pid, start time)."""

    def __init__(self, pid: int, start_time: int, role: str) -> None:
        self.pid = pid
        self.start_time = start_time
        self.role = role
        self.fd: int | None = None
        self.signals: list[str] = []
        self.gone_at: float | None = None
        self.exit_code: int | None = None
        self.detail = ""
        self.not_permitted = False
        self.exiting = False
        """Already exiting when the kill arrived (argv released): waited for, never signalled."""

    def open(self) -> bool:
        """Pin the process with a pidfd; False when it is already gone or no longer this one."""
        try:
            self.fd = pidfd_open(self.pid)
        except ProcessLookupError:
            return False
        # The pidfd names whatever held the pid at open time: check it is still our process.
        return not self.check_gone()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def check_gone(self) -> bool:
        """True (and remembered) once the process has exited; a zombie has exited."""
        if self.gone_at is not None:
            return True
        st = procs.read_stat(self.pid)
        if st is not None and st.start_time == self.start_time and _running(st):
            return False
        if st is not None and st.start_time == self.start_time and st.ppid == os.getpid():
            self._reap()
        self.gone_at = time.monotonic()
        return True

    def _reap(self) -> None:
        """Collect the exit status of our own child (a zombie of the agent must be reaped)."""
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == self.pid:
            if os.WIFEXITED(status):
                self.exit_code = os.WEXITSTATUS(status)
            elif os.WIFSIGNALED(status):
                self.exit_code = -os.WTERMSIG(status)

    def send(self, sig: int) -> bool:
        """Send ``sig``; False when the process turned out to be gone (nothing was sent)."""
        if self.exiting or self.check_gone():
            return False
        try:
            if self.fd is not None:
                pidfd_send_signal(self.fd, sig)
            else:
                # No pidfd: the start time was re-checked just above, as close to the signal
                # as user space can get.
                os.kill(self.pid, sig)
        except ProcessLookupError:
            self.check_gone()
            return False
        except PermissionError:  # a descendant that changed user (setuid): not ours to stop
            self.not_permitted = True
            return False
        self.signals.append(signal.Signals(sig).name)
        return True


def _running(st: procs.Stat) -> bool:
    """Not exited yet: not a zombie, or a zombie thread-group leader whose other threads still
    run (its main thread ended; the process has not)."""
    return st.state not in "ZX" or (st.state == "Z" and st.threads > 1)


def _wait_gone(
    targets: Sequence[_Target],
    deadline: float,
    tick: Callable[[], None] | None = None,
    sweep: _Sweep | None = None,
) -> None:
    """Wait until every target has exited or ``deadline`` (monotonic) passes; ``tick`` runs
    every ``SWEEP_EVERY_S`` meanwhile (and may add targets), only while a target is alive: the
    exit of the last one (a pidfd becoming readable) returns at once, without a walk of the
    host's processes in between (the caller's sweep after the wait looks for what is left)."""
    while True:
        alive = [t for t in targets if not t.not_permitted and not t.check_gone()]
        if (
            alive
            and tick is not None
            and sweep is not None
            and time.monotonic() - sweep.last >= SWEEP_EVERY_S
        ):
            tick()
            alive = [t for t in targets if not t.not_permitted and not t.check_gone()]
        now = time.monotonic()
        if not alive or now >= deadline:
            return
        with_fd = [t.fd for t in alive if t.fd is not None]
        # Without a pidfd for every process, poll /proc at a fine interval; with them, the poll
        # wakes at the exit and the cap only re-reads /proc now and then.
        cap = _FALLBACK_POLL_S if len(with_fd) < len(alive) else 0.5
        if tick is not None:
            cap = min(cap, SWEEP_EVERY_S)
        timeout = min(deadline - now, cap)
        if with_fd:
            poller = select.poll()
            for fd in with_fd:
                poller.register(fd, select.POLLIN)
            poller.poll(max(timeout, 0.0) * 1000.0)
        else:
            time.sleep(timeout)  # no pidfd to wait on: poll /proc at a fine interval


def until_exits(
    cond: Callable[[], bool],
    timeout: float,
    interval: float,
    targets: Callable[[], Sequence[_Target]],
) -> bool:
    """Wait until ``cond()`` is true or ``timeout`` seconds passed (the last value), checking it
    every ``interval`` and at once when one of ``targets()`` that is still running exits (its
    pidfd becomes readable): the wait ends at a member's exit, not at the next interval."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        fds = [t.fd for t in targets() if t.fd is not None and not t.check_gone()]
        wait = min(interval, deadline - now)
        if fds:
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            poller.poll(wait * 1000.0)
        else:
            time.sleep(wait)


def _refuse(pid: int, detail: str) -> KillResult:
    return {
        "results": [
            {
                "pid": pid,
                "role": "run",
                "outcome": "refused",
                "detail": detail,
                "signals": [],
                "exit": {"confirmed": False, "code": None, "after_s": None},
            }
        ]
    }


def check_identity(agent: Agent, ident: dict[str, Any]) -> str | None:
    """Why the live process differs from ``ident`` (None when it is the same, or gone)."""
    pid = ident["pid"]
    if ident.get("boot_id") != agent.boot_id:
        return f"refused: host rebooted (boot id {agent.boot_id}, listed {ident.get('boot_id')})"
    if ident.get("uid") != os.getuid():
        return (
            f"refused: process of another user (uid {ident.get('uid')}; "
            f"this agent runs as uid {os.getuid()})"
        )
    if pid in agent.lister.excluded() or pid <= 1:
        return f"refused: pid {pid} is the agent or one of its ancestors"
    return None


def kill(agent: Agent, params: dict[str, Any]) -> KillResult:
    """Stop the process named by ``identity`` and every descendant; report each with proof."""
    ident = params["identity"]
    pid = int(ident["pid"])
    grace = param_number(params, "grace", 10.0)
    scripts = params.get("scripts") or list(DEFAULT_SCRIPTS)
    files = params.get("files") or []
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise AgentOpError("files: expected a list of paths", "bad-request")
    why = check_identity(agent, ident)
    if why:
        return _refuse(pid, why)
    from supervisor.agent import unit

    held = unit.unit_of(pid, int(ident["start_time"]))
    if held is not None:
        # runwatch started it: the run is its unit, whatever its argv says or its members did
        # (setsid, double forks, a new argv[0], an exited main thread). Stop the unit whole.
        live_argv = procs.read_argv(pid)
        if live_argv and not masked_equal(list(ident.get("argv") or []), live_argv):
            return _refuse(pid, "refused: argv changed (PID reused by another command?)")
        stopped = unit.stop({"launch_id": held["launch_id"], "grace": grace})
        return {
            "results": stopped["results"]
            or [_gone_result(_Target(pid, int(ident["start_time"]), "run"), "already gone")],
            "launch_id": stopped["launch_id"],
            "held_by": stopped["held_by"],
            "confirmed": stopped["confirmed"],
            "detail": stopped["detail"],
        }
    run = _Target(pid, int(ident["start_time"]), "run")
    try:
        if not run.open():
            st = procs.read_stat(pid)
            if st is not None and st.start_time != run.start_time:
                return _refuse(
                    pid,
                    f"refused: PID reused (pid {pid} now started at tick {st.start_time}, "
                    f"listed {run.start_time})",
                )
            return {"results": [_gone_result(run, "already gone: " + _gone_why(st))]}
        live_argv = procs.read_argv(pid)
        uid = procs.read_uid(pid)
        if (live_argv is None or uid is None) and run.check_gone():
            return {"results": [_gone_result(run, "already gone: no such process; no signal sent")]}
        if uid != ident.get("uid"):
            return _refuse(pid, f"refused: owner changed (uid {uid}, listed {ident.get('uid')})")
        if not live_argv:
            # The kernel releases a process's memory, argv included, while it exits, before it
            # becomes a zombie. The pid, start time (checked by ``open``, pinned by the pidfd)
            # and owner are the listed ones: it is the run, on its way out. Wait for it.
            run.exiting = True
            return _kill_tree(run, grace, _Sweep(agent, run, files, []))
        want = list(ident.get("argv") or [])
        if not masked_equal(want, live_argv):
            return _refuse(pid, "refused: argv changed (PID reused by another command?)")
        if script_index(live_argv, scripts) is None:
            why = _not_a_run(pid, scripts, files, bool(params.get("writer")))
            if why:
                return _refuse(pid, why)
        return _kill_tree(run, grace, _Sweep(agent, run, files, live_argv))
    finally:
        run.close()


def _not_a_run(pid: int, scripts: Sequence[str], files: Sequence[str], writer: bool) -> str:
    """Why a process that executes none of ``scripts`` is refused ('' when it is not): only a
    process the user named as a writer of the run that holds one of ``files`` open for writing
    now (the kernel's fact, read here at the kill, not the listing's) passes."""
    runs = "no argv element executes " + ", ".join(scripts)
    if not writer:
        return f"refused: not a run ({runs})"
    data = [os.path.expanduser(f) for f in files if not f.endswith(".lock")]
    users, _ = procs.file_users(procs.inodes_of(data), set(), [pid], procs.dirs_of(data))
    if procs.WRITING.intersection(users.get(pid, ())):
        return ""
    return (
        f"refused: not a run ({runs}) and it holds none of the run's files open for writing, "
        "maps none, and has its working directory in none of their directories"
    )


def _gone_why(st: procs.Stat | None) -> str:
    if st is not None and st.state in "ZX":
        return "zombie (exited, not yet reaped by its parent); no signal sent"
    return "no such process; no signal sent"


def _gone_result(t: _Target, detail: str) -> KillTarget:
    return {
        "pid": t.pid,
        "role": t.role,
        "outcome": "already-gone",
        "detail": detail,
        "signals": [],
        "exit": {"confirmed": True, "code": t.exit_code, "after_s": None},
    }


def _collect_children(parents: Sequence[_Target], known: set[int]) -> list[_Target]:
    table = procs.process_table()
    found: list[_Target] = []
    for parent in parents:
        for kid in procs.descendants(table, parent.pid):
            if kid in known:
                continue
            st = procs.read_stat(kid)
            if st is None or st.state in "ZX":
                continue
            t = _Target(kid, st.start_time, "child")
            if t.open():
                found.append(t)
                known.add(kid)
            else:
                t.close()
    return found


SWEEP_EVERY_S = 0.1
"""How often a kill looks for processes started during its grace period."""
_SWEEP_ROUNDS = 3
"""How many times a kill looks again for what is left of the run before it reports."""


class _Sweep:
    """What else belongs to a run being killed, beyond the tree it had when the kill began.

    Looked for during the grace period, after it and again before confirming: descendants of
    any target (also of one that has exited since: its children were collected while they were
    still its children); members of the run's session or process group when the run leads it
    (a launched run does), started after the run; processes of the run's user with the run's
    argv started since the kill began (a SIGTERM handler that forks, a child that called
    ``setsid``); and every process of the run's user holding the run's data files open for
    writing or its locks open (``files`` from the request, plus the runwatch locks the tree held
    when the kill began). Never another user's process (it is not the run's; a launch refuses
    while it writes), never the agent or its ancestors, never another runwatch agent, and never
    what another launch owns: a process a lock file names as its run (another identity than the
    one being killed), or the agent that is launching under that lock, and their descendants (a
    concurrent restart's new run writes the same files).
    """

    def __init__(self, agent: Agent, run: _Target, files: Sequence[str], argv: Sequence[str]):
        self.run = run
        self.excluded = agent.lister.excluded() | {0, 1}
        self.argv = list(argv)
        # The run's owner: what the sweep stops is the run's user's (never another user's
        # process that holds the files: that one blocks a launch, it is not part of the run).
        owner = procs.read_uid(run.pid)
        self.uid = owner if owner is not None else os.getuid()
        self.kill_ticks = int(procs.uptime_s() * procs.CLK_TCK) - 1
        st = procs.read_stat(run.pid)
        self.session = st is not None and st.session == run.pid
        self.group = st is not None and st.pgrp == run.pid
        paths = [os.path.expanduser(f) for f in files]
        self.data = procs.inodes_of(p for p in paths if not p.endswith(".lock"))
        self.lock_paths = {p for p in paths if p.endswith(".lock")}
        self.locks = procs.inodes_of(self.lock_paths)
        self.last = 0.0

    def note_tree_locks(self, targets: Sequence[_Target]) -> None:
        """Remember runwatch's lock files the tree holds (``.runwatch/*.lock``): whoever holds
        them later holds the run's lock."""
        for t in targets:
            for d in procs.fd_dirs(t.pid):
                with contextlib.suppress(OSError):
                    for fd in os.listdir(d):
                        with contextlib.suppress(OSError):
                            link = os.readlink(f"{d}/{fd}")
                            if "/.runwatch/" in link and link.endswith(".lock"):
                                self.locks |= procs.inodes_of([link])
                                self.lock_paths.add(link)

    def _launched_elsewhere(self, table: dict[int, procs.ProcRow]) -> set[int]:
        """Processes another launch owns, by the records in the run's lock files."""
        roots: set[int] = set()
        for path in self.lock_paths:
            try:
                with open(path, "rb") as f:
                    holder = json.loads(f.read(65536).decode("utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(holder, dict):
                continue
            ident = holder.get("identity")
            ours = (self.run.pid, self.run.start_time)
            if (
                isinstance(ident, dict)
                and isinstance(ident.get("pid"), int)
                and (ident["pid"], ident.get("start_time")) != ours
            ):
                roots.add(ident["pid"])
            agent_pid = holder.get("agent_pid")
            if holder.get("state") == "launching" and isinstance(agent_pid, int):
                roots.add(agent_pid)
        owned = set(roots)
        for pid in roots:
            owned.update(procs.descendants(table, pid))
        return owned

    def find(self, targets: list[_Target], holders: bool) -> list[_Target]:
        """New processes of the run (pinned and added to ``targets``).

        One read of ``/proc/PID/stat`` per process of the host, argv only of a process started
        since the kill began (a fork keeps its parent's argv) and of a candidate; with
        ``holders``, the descriptors of every process (``proc.file_users``)."""
        self.last = time.monotonic()
        known = {t.pid for t in targets}
        stats = procs.stat_table()
        table = {pid: procs.ProcRow(pid, st.ppid, []) for pid, st in stats.items()}
        cand: dict[int, str] = {}
        for t in targets:
            for kid in procs.descendants(table, t.pid):
                cand.setdefault(kid, "child")
        for pid, st in stats.items():
            if pid in cand or pid in known:
                continue
            if not _running(st) or st.start_time < self.run.start_time:
                continue
            in_session = (self.session and st.session == self.run.pid) or (
                self.group and st.pgrp == self.run.pid
            )
            # A fork keeps its parent's argv: one started since the kill began is the run's.
            forked = (
                bool(self.argv)
                and st.start_time >= self.kill_ticks
                and procs.read_argv(pid) == self.argv
                and procs.read_uid(pid) == self.uid
            )
            if in_session or forked:
                cand[pid] = "child"
        if holders and (self.data or self.locks):
            users, _ = procs.file_users(self.data, self.locks)
            for pid in users:
                if procs.read_uid(pid) == self.uid:
                    cand.setdefault(pid, "holder")
        found: list[_Target] = []
        elsewhere = self._launched_elsewhere(table) if cand else set()
        for pid, role in sorted(cand.items()):
            if pid in known or pid in self.excluded or pid in elsewhere:
                continue
            argv = procs.read_argv(pid) or []
            if argv[1:] == ["-c", AGENT_LOADER]:
                continue  # a runwatch agent (launching under the run's lock): never a target
            now = procs.read_stat(pid)
            if now is None or not _running(now):
                continue
            t = _Target(pid, now.start_time, role)
            if t.open():
                found.append(t)
                known.add(pid)
            else:
                t.close()
        targets.extend(found)
        return found


def _kill_tree(run: _Target, grace: float, sweep: _Sweep) -> KillResult:
    # Collect the whole tree first: once the run dies its workers are re-parented and lost.
    targets = [run, *_collect_children([run], {run.pid})]
    sweep.note_tree_locks(targets)
    try:
        started = time.monotonic()
        for t in targets:
            if not t.send(signal.SIGTERM) and not t.exiting:
                t.detail = "already gone; no signal sent"

        def during_grace() -> None:
            # Forked during the grace period (before its parent exits): TERM, and the rest of
            # the grace period.
            for t in sweep.find(targets, holders=False):
                t.send(signal.SIGTERM)

        # The tree was walked just now (``_collect_children``): the first sweep of the grace
        # period comes a sweep interval later, not between the TERM and a quick exit.
        sweep.last = time.monotonic()
        _wait_gone(targets, started + max(grace, 0.0), during_grace, sweep)
        for _ in range(_SWEEP_ROUNDS):
            # After the grace period, and again before confirming: what is left is killed.
            sweep.find(targets, holders=True)
            alive = [t for t in targets if not t.not_permitted and not t.check_gone()]
            if not any(not t.exiting for t in alive):
                break
            for t in alive:
                t.send(signal.SIGKILL)
            _wait_gone(targets, time.monotonic() + KILL_CONFIRM_S)
        results = [_result(t, started) for t in targets]
    finally:
        for t in targets:
            t.close()
    return {"results": results}


def _result(t: _Target, started: float) -> KillTarget:
    gone = t.check_gone()
    after = round(t.gone_at - started, 4) if t.gone_at is not None and t.signals else None
    if t.exiting:
        # Never signalled: its argv could no longer be checked against the listed one.
        after = round(t.gone_at - started, 4) if t.gone_at is not None else None
        outcome = "already-gone" if gone else "refused"
        detail = (
            f"was already exiting (argv released); exit confirmed after {after} s; no signal sent"
            if gone
            else "refused: exiting (argv released) but still there after the grace period; "
            "no signal sent; run the kill again"
        )
    elif t.not_permitted and not gone:
        outcome = "refused"
        detail = "not permitted to signal it (another user's process)"
    elif not t.signals:
        outcome = "already-gone"
        detail = t.detail or "already gone; no signal sent"
    elif "SIGKILL" in t.signals:
        outcome = "killed"
        detail = (
            "ignored SIGTERM; killed with SIGKILL"
            if gone
            else f"SIGKILL sent; exit NOT confirmed within {KILL_CONFIRM_S:.0f} s"
        )
    else:
        outcome = "terminated"
        detail = "exited after SIGTERM"
    return {
        "pid": t.pid,
        "role": t.role,
        "outcome": outcome,
        "detail": detail,
        "signals": list(t.signals),
        "exit": {"confirmed": gone, "code": t.exit_code, "after_s": after},
    }


def probe(agent: Agent, params: dict[str, Any]) -> ProbeResult:
    """Is the process named by ``identity`` still there? (How a dropped kill is reconciled.)"""
    ident = params["identity"]
    pid = int(ident["pid"])
    if ident.get("boot_id") != agent.boot_id:
        return {"state": "rebooted", "alive": False, "children": [], "detail": "host rebooted"}
    from supervisor.agent import unit

    held = unit.unit_of(pid, int(ident.get("start_time") or 0))
    if held is not None:
        # Its unit is the run: alive while any member is (a client that exited may leave some).
        left = unit.members(held)
        if left:
            return {
                "state": "alive",
                "alive": True,
                "children": [p for p in left if p != pid],
                "detail": f"unit {held['launch_id']} still has {len(left)} process(es)",
            }
    st = procs.read_stat(pid)
    if st is None:
        return {"state": "gone", "alive": False, "children": [], "detail": "no such process"}
    if st.start_time != ident.get("start_time"):
        return {
            "state": "gone",
            "alive": False,
            "children": [],
            "detail": f"exited; pid {pid} reused by another process",
        }
    if not _running(st):
        return {"state": "zombie", "alive": False, "children": [], "detail": "exited (zombie)"}
    table = procs.process_table()
    return {
        "state": "alive",
        "alive": True,
        "children": procs.descendants(table, pid),
        "detail": "still running",
    }
