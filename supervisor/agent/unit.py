"""Units: what runwatch starts, it holds; what it holds, it can stop whole.

Standard library only, Python >= 3.8 (runs on the host inside the agent).

Every launch starts inside a unit, in the manner of systemd's ``KillMode=control-group``:

* a **launch token** ``RUNWATCH_LAUNCH=<config id>:<run>:<launch id>`` in the client's
  environment, which every descendant inherits (read back from ``/proc/PID/environ``);
* a **waiter** (``supervisor.agent.waiter``), a child subreaper that starts the client, records
  its exit status and reaps every orphaned descendant, so the tree stays whole;
* where the host allows it, a **cgroup v2 leaf** per launch (``<cgroup2 mount>/runwatch/<launch
  id>``; as root, or wherever the agent may write). A process cannot leave a cgroup by
  ``setsid``, a double fork, closing its descriptors or exec'ing under another name.

The members of a unit are the cgroup's processes and the waiter's descendants (or, once a member
killed the waiter, every member it last recorded that still lives), plus every process of the
run's user that carries the token, anywhere. The waiter keeps its client's zombie until the unit
is over, so the client's pid is its group's id for a ``killpg`` all along; a waiter a member
stopped is continued by the stop. Stopping a unit freezes it (so nothing forks or exits between
the listing and the signal), sends TERM to every member, thaws it, waits the grace period, then
kills what is left (``cgroup.kill``, or SIGKILL to each frozen member); the stop is confirmed
only when the unit is empty (without a cgroup: the waiter has no child but its client's
zombie), never when a member killed the waiter. Its record (``<state dir>/units/<launch
id>.json``, 0600) says who started it, how it is held, and how it ended (exit status and time,
and whether runwatch stopped it).

Ops: ``units`` (every unit with its members and exit), ``unit_stop``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from supervisor.agent import proc as procs
from supervisor.agent import safefs
from supervisor.agent.kill import _running, _Target, pidfd_open, pidfd_send_signal, until_exits
from supervisor.agent.masking import mask_argv
from supervisor.agent.match import file_keys
from supervisor.agent.protocol import KILL_CONFIRM_S, AgentOpError, param_number, param_str

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

TOKEN_VAR = "RUNWATCH_LAUNCH"
"""The environment variable that names a process's launch: ``<config id>:<run>:<launch id>``."""

NO_CGROUP_VAR = "RUNWATCH_AGENT_NO_CGROUP"
"""``1`` in the agent's environment: never use a cgroup (the token path, for tests)."""

CGROUP_SUBTREE = "runwatch"
_ENDED_KEEP_S = 7 * 24 * 3600.0
_ANSWER_S = 10.0
ANSWER_VAR = "RUNWATCH_AGENT_ANSWER_S"
"""Seconds the agent waits for a launch's waiter to answer (default 10; set small in tests)."""
_ABANDON_S = 5.0
"""Seconds an unanswered launch waits for its waiter to give up (it starts nothing then)."""
WAITER_END_S = 5.0
"""Seconds a confirmed stop waits for the unit's waiter to record the end and exit."""
STOP_CHILDREN_ROUNDS = 1000
"""Rounds of ``_stop_children`` at most: each stops what the previous round's children forked."""


# --------------------------------------------------------------------------- where units live


def state_dir() -> str:
    """``$XDG_STATE_HOME/runwatch`` (default ``~/.local/state/runwatch``) of the agent's user."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(base, "runwatch")


def units_dir(create: bool = False) -> str:
    """The directory of unit records, created 0700 (each level runwatch makes) when asked."""
    path = os.path.join(state_dir(), "units")
    if create:
        try:
            safefs.make_dirs(path, state_dir())
        except safefs.UnsafePath as e:
            raise AgentOpError(str(e), "unsafe-path") from None
        except OSError as e:
            raise AgentOpError(f"cannot create {e.filename}: {e.strerror}", "io") from None
    return path


def _cgroup2_mount() -> str | None:
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "cgroup2":
            return parts[1].replace("\\040", " ")
    return None


def cgroup_base() -> str | None:
    """The cgroup directory under which launches get a leaf, or None (the token path).

    ``<cgroup2 mount>/runwatch`` when this agent may create and populate it (root, or a mount
    delegated to its user), else None. ``cgroup.kill`` (Linux 5.14) is not required: without
    it the stop kills each frozen member."""
    if os.environ.get(NO_CGROUP_VAR) == "1":
        return None
    mount = _cgroup2_mount()
    if mount is None or not os.access(mount, os.W_OK):
        return None
    base = os.path.join(mount, CGROUP_SUBTREE)
    try:
        os.mkdir(base, 0o755)
    except FileExistsError:
        pass
    except OSError:
        return None
    if not os.access(os.path.join(base, "cgroup.procs"), os.W_OK):
        return None
    return base


# --------------------------------------------------------------------------- records


def record_path(launch_id: str) -> str:
    if not launch_id or not all(c.isalnum() or c == "-" for c in launch_id):
        raise AgentOpError(f"not a launch id: {launch_id!r}", "bad-params")
    return os.path.join(units_dir(), launch_id + ".json")


def _read_json(path: str, limit: int) -> Any:
    """A record or marker the waiter or the agent wrote: never through a link, another user's
    or writable by others (``safefs.open_existing``: a forged one is no record)."""
    with os.fdopen(safefs.open_existing(path), "rb") as f:
        return json.loads(f.read(limit).decode("utf-8"))


def read_record(launch_id: str) -> dict[str, Any] | None:
    try:
        value = _read_json(record_path(launch_id), 1 << 20)
    except (OSError, ValueError, safefs.UnsafePath):
        return None
    return value if isinstance(value, dict) else None


def exit_status(launch_id: str) -> dict[str, Any] | None:
    """The recorded exit of a unit's client (``{code, signal}``), None while it runs."""
    rec = read_record(launch_id)
    ex = rec.get("exit") if rec is not None else None
    return ex if isinstance(ex, dict) else None


def _stop_path(launch_id: str) -> str:
    return os.path.join(units_dir(), launch_id + ".stop")


def _stop_marker(launch_id: str) -> dict[str, Any] | None:
    try:
        value = _read_json(_stop_path(launch_id), 65536)
    except (OSError, ValueError, safefs.UnsafePath):
        return None
    return value if isinstance(value, dict) else None


def _records() -> list[dict[str, Any]]:
    folder = units_dir()
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out = []
    now = time.time()
    for name in names:
        if not name.endswith(".json"):
            continue
        rec = read_record(name[: -len(".json")])
        if rec is None:
            continue
        if rec.get("state") == "ended" and now - float(rec.get("ended_at") or now) > _ENDED_KEEP_S:
            continue
        out.append(rec)
    return out


# --------------------------------------------------------------------------- start


def _waiter_source() -> str:
    import importlib.util

    spec = importlib.util.find_spec("supervisor.agent.waiter")
    loader = getattr(spec, "loader", None)
    source = loader.get_source("supervisor.agent.waiter") if loader is not None else None
    if not source:
        raise AgentOpError("the waiter's source is not in this agent", "internal")
    return str(source)


def start(
    argv: Sequence[str],
    workdir: str,
    env: dict[str, str],
    log_fd: int,
    keep_fds: Sequence[int],
    config_id: str,
    run: str,
    secrets: Sequence[str],
    config_path: str = "",
    data_files: Sequence[str] = (),
) -> tuple[int, dict[str, Any]]:
    """Start ``argv`` in a new unit; returns the client's pid and the unit's record data.
    ``data_files`` (paths of this host) are recorded by identity (:func:`file_keys`): whatever
    the unit's members do with their descriptors, a launch of any run on those files is refused
    while the unit runs (:func:`units_on`).

    Raises OSError (as ``Popen`` would) when the client cannot be executed."""
    from supervisor.agent.waiter import BOOT

    launch_id = os.urandom(8).hex()
    token = f"{config_id}:{run}:{launch_id}"
    folder = units_dir(create=True)
    base = cgroup_base()
    cgroup = None
    if base is not None:
        cgroup = os.path.join(base, launch_id)
        try:
            os.mkdir(cgroup, 0o755)
        except OSError:
            cgroup = None
    child_env = dict(env)
    child_env[TOKEN_VAR] = token
    data = {
        "launch_id": launch_id,
        "token": token,
        "config_id": config_id,
        "config_path": config_path,
        "run": run,
        "cgroup": cgroup,
        "held_by": "cgroup" if cgroup else "token",
        "argv": mask_argv(list(argv), secrets),
        "workdir": workdir,
        "boot_id": procs.boot_id(),
        "uid": os.getuid(),
        "launched_at": time.time(),
        "files": [{"path": p, "keys": [list(k) for k in sorted(file_keys(p))]} for p in data_files],
    }
    spec = {
        "argv": list(argv),
        "cwd": workdir,
        "env": child_env,
        "log_fd": log_fd,
        "keep_fds": list(keep_fds),
        "cgroup": cgroup,
        "record": os.path.join(folder, launch_id + ".json"),
        "record_data": data,
    }
    waiter = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", BOOT, "runwatch-waiter", launch_id],
        cwd="/",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        pass_fds=(log_fd, *keep_fds),
    )
    # Reaped when it ends (it outlives the unit's last member), never left a zombie of the agent.
    threading.Thread(target=waiter.wait, name=f"waiter-{launch_id}", daemon=True).start()
    assert waiter.stdin is not None and waiter.stdout is not None
    try:
        waiter.stdin.write(json.dumps({"source": _waiter_source(), "spec": spec}).encode())
        waiter.stdin.close()
        ready, _, _ = select.select([waiter.stdout], [], [], _answer_s())
        line = waiter.stdout.readline() if ready else b""
    finally:
        # Closed before anything else: a waiter that has not answered yet sees that nobody
        # waits for its answer and starts nothing (or kills at once what it started).
        waiter.stdout.close()
    try:
        answer = json.loads(line.decode("utf-8")) if line else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise OSError(errno.EIO, _unanswered(launch_id, waiter))
    if not answer.get("ok"):
        raise OSError(errno.ENOEXEC, str(answer.get("error") or "cannot start"))
    return int(answer["pid"]), data


def _answer_s() -> float:
    try:
        return max(float(os.environ.get(ANSWER_VAR) or _ANSWER_S), 0.0)
    except ValueError:
        return _ANSWER_S


def _unanswered(launch_id: str, waiter: subprocess.Popen[bytes]) -> str:
    """A launch whose waiter did not answer is no launch: nothing of it may run once the launch
    is reported failed (a retry or a rollback would start a second writer beside it).

    The waiter gives up by itself (it sees its answer's pipe closed: before its client, it
    starts nothing; after, it kills the client's session and cgroup at once). One that answered
    into the closed pipe does not know: its unit is stopped here. Returns what happened."""
    procs.poll_until(lambda: waiter.poll() is not None, _ABANDON_S, 0.02)
    rec = read_record(launch_id) or {}
    head = f"the launch's waiter did not answer within {_answer_s():g} s"
    if waiter.poll() is None and rec.get("state") == "running" and "error" not in rec:
        done = stop({"launch_id": launch_id, "grace": 0.0})
        if done.get("confirmed"):
            return f"{head}; its unit {launch_id} was stopped at once: nothing of it runs"
        return f"{head}; stopping its unit {launch_id} at once: {done.get('detail')}"
    if waiter.poll() is None:
        return (
            f"{head}; its waiter (pid {waiter.pid}) has not started the client, and starts "
            "nothing now that nobody waits for its answer"
        )
    if isinstance(rec.get("child"), dict):
        return f"{head}; the client it started was killed at once: nothing of it runs"
    return f"{head}; nothing was started"


# --------------------------------------------------------------------------- members


def _cgroup_procs(cgroup: str) -> list[int] | None:
    try:
        with open(os.path.join(cgroup, "cgroup.procs"), "rb") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return []


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` as the kernel lists them (``/proc/PID/task/*/children``);
    empty where the kernel has no such file."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"{procs.PROC}/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"{procs.PROC}/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def _cgroup_flag(cgroup: str, key: str) -> bool | None:
    try:
        with open(os.path.join(cgroup, "cgroup.events"), "rb") as f:
            for line in f.read().decode().splitlines():
                k, _, v = line.partition(" ")
                if k == key:
                    return v.strip() != "0"
    except OSError:
        return None
    return None


def _write(path: str, value: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, value)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def token_holders(tokens: Iterable[str]) -> dict[str, list[int]]:
    """Per launch token, the processes of this agent's user (the runs' user: every unit it
    lists is its own) whose environment carries it. The token is no secret (its launch id is in
    the waiter's command line): a process of another user that carries it is never a member,
    even for root, who may read every environment."""
    wanted = {f"{TOKEN_VAR}={t}".encode() for t in tokens}
    out: dict[str, list[int]] = {}
    if not wanted:
        return out
    me = os.getuid()
    prefix = TOKEN_VAR.encode() + b"="
    for name in os.listdir(procs.PROC):
        if not name.isdigit():
            continue
        try:
            if me != 0 and os.stat(f"{procs.PROC}/{name}").st_uid != me:
                continue
            with open(f"{procs.PROC}/{name}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if prefix not in environ:
            continue
        for entry in environ.split(b"\0"):
            if entry in wanted:
                if me in _uids(int(name)):
                    out.setdefault(entry[len(prefix) :].decode(), []).append(int(name))
                break
    return out


def _uids(pid: int) -> tuple[int, ...]:
    """The real and effective uid of ``pid`` (``/proc/PID/status``); empty when it is gone."""
    try:
        with open(f"{procs.PROC}/{pid}/status", "rb") as f:
            for line in f.read().splitlines():
                if line.startswith(b"Uid:"):
                    return tuple(int(x) for x in line.split()[1:3])
    except (OSError, ValueError):
        pass
    return ()


def _waiter_stat(rec: dict[str, Any]) -> procs.Stat | None:
    """The stat of the unit's recorded waiter while that process (by start time) exists."""
    w = rec.get("waiter") or {}
    st = procs.read_stat(int(w.get("pid") or 0)) if w.get("pid") else None
    return st if st is not None and st.start_time == w.get("start_time") else None


def _waiter_alive(rec: dict[str, Any]) -> bool:
    st = _waiter_stat(rec)
    return st is not None and st.state not in "ZX"


def members(
    rec: dict[str, Any],
    holders: dict[str, list[int]] | None = None,
    table: dict[int, procs.ProcRow] | None = None,
) -> list[int]:
    """The live processes of a unit: its cgroup's (or the waiter's descendants), plus token
    holders. ``holders`` (:func:`token_holders`) and ``table`` (``proc.process_table``): read
    once for many units."""
    found: set[int] = set()
    cgroup = rec.get("cgroup")
    if cgroup:
        found.update(_cgroup_procs(cgroup) or [])
    # The waiter's tree too, with a cgroup or not: a member that moved itself to another cgroup
    # (root may) is still the subreaper's descendant. Without the waiter (a member killed it),
    # the members it last recorded and their descendants.
    table = procs.process_table() if table is None else table
    if _waiter_alive(rec):
        found.update(procs.descendants(table, int(rec["waiter"]["pid"])))
    else:
        for pid, ticks in rec.get("known") or []:
            st = procs.read_stat(int(pid))
            if st is not None and st.start_time == ticks:
                found.add(int(pid))
                found.update(procs.descendants(table, int(pid)))
    token = str(rec.get("token") or "")
    if holders is None:
        holders = token_holders([token])
    found.update(holders.get(token, []))
    waiter = (rec.get("waiter") or {}).get("pid")
    found.discard(waiter if isinstance(waiter, int) else -1)
    alive = []
    for pid in sorted(found):
        st = procs.read_stat(pid)
        if st is not None and _running(st):
            alive.append(pid)
    return alive


def _exit_of(rec: dict[str, Any], live: bool) -> dict[str, Any] | None:
    """How the unit's client ended: ``{code, signal, at, stopped}``, or None while it runs (or
    when nobody saw it end: its waiter died first)."""
    ex = rec.get("exit")
    if not isinstance(ex, dict):
        return None
    stop = _stop_marker(str(rec["launch_id"])) or rec.get("stopped_at")
    failed = rec.get("failed")
    return {
        "code": ex.get("code"),
        "signal": ex.get("signal"),
        "at": rec.get("exited_at"),
        "stopped": bool(stop),
        "failed": dict(failed) if isinstance(failed, dict) else None,
    }


def describe(
    rec: dict[str, Any],
    holders: dict[str, list[int]],
    table: dict[int, procs.ProcRow] | None = None,
) -> dict[str, Any]:
    """A unit as the ``units`` op reports it (an ended one without looking for members)."""
    ended = rec.get("state") == "ended"
    here = rec.get("boot_id") == procs.boot_id()
    live = members(rec, holders, table) if here and not ended else []
    child = rec.get("child") or {}
    main = None
    cpid = child.get("pid")
    if isinstance(cpid, int) and cpid in live:
        st = procs.read_stat(cpid)
        if st is not None and st.start_time == child.get("start_time"):
            main = cpid
    if main is None and live:
        main = live[0]
    waiter = None if ended else _waiter_stat(rec)
    waiter_alive = waiter is not None and waiter.state not in "ZX"
    if waiter is not None and waiter.state == "T":
        # A waiter a member stopped (SIGSTOP) sees nothing end and records nothing: continued at
        # every listing, so that a member's death by any hand (the OOM killer, a `kill -9`) is
        # recorded and the unit ends. A traced one ('t') is continued by the stop.
        _signal_waiter(rec, signal.SIGCONT)
    cgroup = rec.get("cgroup")
    # Running while anything of it is: a member listed, a populated cgroup (members that change
    # faster than a listing), a waiter that has not seen its tree empty.
    busy = not ended and bool(cgroup) and _cgroup_flag(str(cgroup), "populated") is True
    running = live or busy or waiter_alive
    state = "running" if running else "ended"
    return {
        "launch_id": rec.get("launch_id"),
        "config_id": rec.get("config_id"),
        "config_path": rec.get("config_path"),
        "run": rec.get("run"),
        "held_by": rec.get("held_by"),
        "state": state,
        "main_pid": main,
        "members": live,
        "exit": _exit_of(rec, bool(live)),
        "waiter_alive": waiter_alive,
        "tracked": waiter_alive or ended or bool(cgroup),
        "launched_at": rec.get("launched_at"),
        "argv": rec.get("argv") or [],
        "workdir": rec.get("workdir"),
    }


def list_units(params: dict[str, Any]) -> dict[str, Any]:
    """``{config_id?}`` -> ``{"units": [...]}``: every unit of this user on this boot (the
    newest first), or those of one config."""
    return {"units": all_units(params.get("config_id"))}


def all_units(
    config_id: str | None = None, wanted: Mapping[tuple[Any, ...], str] | None = None
) -> list[dict[str, Any]]:
    """Every unit of this user on this boot (the newest first), or those of ``config_id``.
    ``wanted`` (:func:`wanted_keys`: a file identity -> the run of the listing's config whose
    data file it is): each running unit also says which of those runs' files it was started on
    (``writes``, by identity), whatever its config and its run's name."""
    recs = [r for r in _records() if config_id is None or r.get("config_id") == config_id]
    live = [r for r in recs if r.get("state") != "ended" and r.get("boot_id") == procs.boot_id()]
    holders = token_holders(str(r.get("token") or "") for r in live)
    table = procs.process_table() if live else {}
    units = []
    for rec in recs:
        unit = describe(rec, holders, table)
        if wanted and unit["state"] == "running":
            unit["writes"] = runs_written(rec, wanted)
        units.append(unit)
    units.sort(key=lambda u: -float(u.get("launched_at") or 0.0))
    return units


def wanted_keys(files: Mapping[str, Iterable[str]]) -> dict[tuple[Any, ...], str]:
    """Run name -> its data files (paths of this host) into file identity -> run name
    (:func:`file_keys`): what :func:`all_units` compares a unit's recorded files with."""
    return {key: run for run, paths in files.items() for p in paths for key in file_keys(p)}


def runs_written(rec: dict[str, Any], wanted: Mapping[tuple[Any, ...], str]) -> list[str]:
    """The runs of ``wanted`` (:func:`wanted_keys`) whose data files share an identity with a
    file the unit ``rec`` was started on (or with that file's path now)."""
    return sorted(
        {
            wanted[key]
            for f in rec.get("files") or []
            if isinstance(f, dict)
            for key in _keys_of_record(f)
            if key in wanted
        }
    )


def live_unit(config_id: str, run: str) -> dict[str, Any] | None:
    """A unit of ``run`` launched by ``config_id`` that still has members, if any: the run is
    running, whatever its lock or its argv say (its workdir may even have been replaced)."""
    if not config_id or not os.path.isdir(units_dir()):
        return None
    here = procs.boot_id()
    for rec in _records():
        if (
            rec.get("config_id") == config_id
            and rec.get("run") == run
            and rec.get("state") != "ended"
            and rec.get("boot_id") == here
            and describe(rec, token_holders([str(rec.get("token") or "")]))["state"] == "running"
        ):
            return rec
    return None


def _keys_of_record(entry: dict[str, Any]) -> set[tuple[Any, ...]]:
    """A recorded data file's identities: those it had at the launch, and those of its path now
    (a file the client made after the launch, in a directory made after it)."""
    keys = {tuple(k) for k in entry.get("keys") or [] if isinstance(k, list)}
    path = entry.get("path")
    return keys | file_keys(path) if isinstance(path, str) and path else keys


def units_on(paths: Sequence[str]) -> list[dict[str, Any]]:
    """The units of this user on this boot, of any config and any run, that still run and were
    started on one of ``paths`` (by identity, :func:`file_keys`): ``{"launch_id", "config_id",
    "config_path", "run", "main_pid", "members", "path"}`` each (``path``: the one they share)."""
    if not paths or not os.path.isdir(units_dir()):
        return []
    wanted = {k: p for p in paths for k in file_keys(p)}
    here = procs.boot_id()
    out: list[dict[str, Any]] = []
    for rec in _records():
        if rec.get("state") == "ended" or rec.get("boot_id") != here:
            continue
        shared = [
            wanted[key]
            for f in rec.get("files") or []
            if isinstance(f, dict)
            for key in _keys_of_record(f)
            if key in wanted
        ]
        if not shared:
            continue
        unit = describe(rec, token_holders([str(rec.get("token") or "")]))
        if unit["state"] != "running":
            continue
        out.append(
            {
                "launch_id": unit["launch_id"],
                "config_id": unit["config_id"],
                "config_path": unit["config_path"] or "",
                "run": unit["run"],
                "main_pid": unit["main_pid"],
                "members": unit["members"],
                "path": shared[0],
            }
        )
    return out


def writers_text(units: Sequence[dict[str, Any]]) -> str:
    """One line naming each unit of :func:`units_on`: which run, which config, which file."""
    return "; ".join(
        f"unit {u['launch_id']} of run {u['run']!r} ("
        + (u["config_path"] or f"config {u['config_id']}")
        + f") was started on {u['path']} and still has processes ("
        + (", ".join(str(p) for p in u["members"]) or "none listed")
        + ")"
        for u in units
    )


def unit_of(pid: int, start_time: int) -> dict[str, Any] | None:
    """The record of the unit the process ``(pid, start_time)`` is (or was, as its client) a
    member of, on this boot; None when runwatch did not start it. A kill of any member of a
    unit stops the whole unit; a kill of its client after the client exited still stops what
    the client left behind."""
    if not os.path.isdir(units_dir()):
        return None
    here = procs.boot_id()
    recs = [r for r in _records() if r.get("boot_id") == here]
    for rec in recs:
        child = rec.get("child") or {}
        if child.get("pid") == pid and child.get("start_time") == start_time:
            return rec
    st = procs.read_stat(pid)
    if st is None or st.start_time != start_time:
        return None
    live = [r for r in recs if r.get("state") != "ended"]
    holders = token_holders(str(r.get("token") or "") for r in live)
    table = procs.process_table() if live else {}
    for rec in live:
        if pid in members(rec, holders, table):
            return rec
    return None


# --------------------------------------------------------------------------- stop


def _targets(pids: Iterable[int], known: dict[int, _Target], main: int | None) -> list[_Target]:
    """Pin each new pid (by pidfd and start time) as a target; returns those newly added."""
    added = []
    for pid in pids:
        if pid in known:
            continue
        st = procs.read_stat(pid)
        if st is None or not _running(st):
            continue
        t = _Target(pid, st.start_time, "run" if pid == main else "child")
        if t.open():
            known[pid] = t
            added.append(t)
        else:
            t.close()
    return added


def stop(params: dict[str, Any]) -> dict[str, Any]:
    """``{launch_id, grace}`` -> stop every member of the unit; confirmed when it is empty.

    Result: ``{"launch_id", "held_by", "confirmed", "detail", "results": [per process as the
    kill op's]}``. Refused (``confirmed`` false, no signal) for an unknown launch or another boot.
    """
    launch_id = param_str(params, "launch_id")
    grace = max(param_number(params, "grace", 10.0), 0.0)
    rec = read_record(launch_id)
    if rec is None:
        raise AgentOpError(f"no unit {launch_id} on this host", "not-found")
    held_by = str(rec.get("held_by") or "token")
    base = {"launch_id": launch_id, "held_by": held_by}
    if rec.get("boot_id") != procs.boot_id():
        return dict(base, confirmed=True, results=[], detail="the host rebooted since the launch")
    from supervisor.agent.waiter import write_record

    me = procs.read_stat(os.getpid())
    marker = {
        "time": time.time(),
        "agent_pid": os.getpid(),
        "agent_start": me.start_time if me is not None else None,
    }
    with contextlib.suppress(OSError):
        write_record(_stop_path(launch_id), marker)
    # A waiter stopped by a member (SIGSTOP) reaps nothing and records nothing: continued
    # first, and again until it ends (a tracer's death leaves its tracee stopped).
    _signal_waiter(rec, signal.SIGCONT)
    _tell_waiter(rec)
    cgroup = rec.get("cgroup") if rec.get("cgroup") and os.path.isdir(rec["cgroup"]) else None
    main = (rec.get("child") or {}).get("pid")
    reaper = rec if _waiter_alive(rec) else None

    def client_group(sig: int) -> None:
        # The client's pid is its group's id; while it is the client's (alive, or the zombie
        # its waiter keeps until this stop is over) no other process can have it.
        if not cgroup and isinstance(main, int) and _held(rec):
            with contextlib.suppress(OSError):
                os.killpg(main, sig)

    known: dict[int, _Target] = {}
    started = time.monotonic()
    try:

        def listed() -> list[int]:
            return members(rec)

        ours: set[int] = set()
        """Process groups seen holding members only during this stop (``_member_groups``)."""

        def groups_now() -> list[int]:
            found = _member_groups(listed(), main)
            ours.update(found)
            return found

        def remaining() -> list[int]:
            # A populated cgroup, or a group of members that still has a process (the kernel
            # says so at once: ``killpg(g, 0)``), is not empty even when no listing catches a
            # member (one that forks and exits faster than a listing): 0 stands for "unlisted".
            pids = listed()
            if cgroup is not None:
                busy = _cgroup_flag(cgroup, "populated") is True
            elif _waiter_alive(rec):
                # The kernel's answer: the subreaper has a child but its client's zombie (the
                # client's group, whose zombie answers ``killpg(g, 0)``, is all in its tree).
                busy = bool(_unit_children(rec)) or any(_group_alive(g) for g in ours - {main})
            else:
                busy = any(_group_alive(g) for g in ours)
            return pids or ([0] if busy else [])

        # 1. Freeze (cgroup) or stop (token) every member so the set holds still, then TERM.
        if cgroup:
            _write(os.path.join(cgroup, "cgroup.freeze"), b"1")
            procs.poll_until(lambda: _cgroup_flag(cgroup, "frozen") is not False, 2.0, 0.01)
            _targets(listed(), known, main)
            for t in known.values():
                t.send(signal.SIGTERM)
            _write(os.path.join(cgroup, "cgroup.freeze"), b"0")
        else:
            client_group(signal.SIGSTOP)
            _stop_all(listed, known, main, ours, reaper)
            groups = groups_now()
            for t in known.values():
                t.send(signal.SIGTERM)
            for sig in (signal.SIGTERM, signal.SIGCONT):
                client_group(sig)
                for pgid in groups:
                    with contextlib.suppress(OSError):
                        os.killpg(pgid, sig)
            for t in known.values():
                t.send(signal.SIGCONT)

        # 2. The grace period: whatever appears meanwhile (a SIGTERM handler's fork) gets TERM.
        def empty() -> bool:
            for t in _targets(listed(), known, main):
                t.send(signal.SIGTERM)
            return not remaining()

        def pinned() -> list[_Target]:
            return list(known.values())

        until_exits(empty, grace, 0.05, pinned)
        # 3. What is left is killed: cgroup.kill, or SIGKILL to each frozen/stopped member.
        for _ in range(5):
            if not remaining():
                break
            if cgroup and _write(os.path.join(cgroup, "cgroup.kill"), b"1"):
                _targets(listed(), known, main)
                for t in known.values():
                    if not t.check_gone():
                        t.signals.append("SIGKILL")
            else:
                if cgroup:
                    _write(os.path.join(cgroup, "cgroup.freeze"), b"1")
                    procs.poll_until(lambda: _cgroup_flag(cgroup, "frozen") is not False, 2.0, 0.01)
                    _targets(listed(), known, main)
                else:
                    client_group(signal.SIGSTOP)
                    _stop_all(listed, known, main, ours, reaper)
                    groups_now()
                    client_group(signal.SIGKILL)
                    for pgid in sorted(ours):
                        with contextlib.suppress(OSError):
                            os.killpg(pgid, signal.SIGKILL)
                for t in known.values():
                    t.send(signal.SIGKILL)
                if cgroup:
                    _write(os.path.join(cgroup, "cgroup.freeze"), b"0")
            until_exits(lambda: not remaining(), KILL_CONFIRM_S, 0.01, pinned)
        left = remaining()
        results = [_result(t, started, left) for t in known.values()]
        results += [_still_there(pid) for pid in left if pid not in known and pid]
    finally:
        for t in known.values():
            t.close()
        # The stop is over: the waiter may reap its client's zombie now, and end.
        with contextlib.suppress(OSError):
            write_record(_stop_path(launch_id), dict(marker, over=time.time()))
    # The waiter's tree is what holds members that dropped the token and left the cgroup (root
    # may move a process out of it): once a member killed the waiter, such a process cannot be
    # found (its last record's members were stopped above), and the stop is not confirmed.
    now = read_record(launch_id) or rec
    blind = not _waiter_alive(now) and now.get("state") != "ended"
    confirmed = not left and not blind
    if confirmed:
        # The waiter records the exit and ends once it has reaped the tree; until then the unit
        # is listed as running (``describe``) and a launch right after this stop is refused:
        # "gone" is the whole unit's end, the waiter's included. A waiter a member stopped
        # (or a tracer left stopped) is continued until it does.
        def waiter_gone() -> bool:
            _signal_waiter(now, signal.SIGCONT)
            return not _waiter_alive(read_record(launch_id) or now)

        procs.poll_until(waiter_gone, WAITER_END_S, 0.02)
        # Without a cgroup, the kernel's answer to "is the unit empty": the waiter is a
        # subreaper, so a member still alive (one that forked and exited faster than every
        # listing) is in its tree, and the waiter then has a child besides its client's zombie.
        if not cgroup and _waiter_alive(now) and _unit_children(now):
            confirmed = False
            left = [0]
    if left == [0]:
        detail = (
            f"unit {launch_id} NOT empty after the kill: a member that no listing catches (it "
            "forks and exits faster) is still alive"
        )
    elif left:
        detail = f"unit {launch_id} NOT empty after the kill: pids {left} remain"
    elif blind:
        detail = (
            f"unit {launch_id}: every process still traceable is stopped, but a member killed "
            "the unit's waiter, so a process that left its tree (and its cgroup) and dropped "
            "the launch token cannot be found: NOT confirmed (check the data files; the next "
            "start's quiet window watches them)"
        )
    else:
        detail = f"unit {launch_id} empty ({held_by}): {len(known)} process(es) stopped"
    return dict(base, confirmed=confirmed, results=results, detail=detail)


def _tell_waiter(rec: dict[str, Any]) -> None:
    """Tell the unit's waiter that runwatch is stopping it (SIGUSR1): it records the stop in the
    unit's record, and keeps it until it is on disk (the marker file may not be writable)."""
    if (rec.get("waiter") or {}).get("on_stop") == "SIGUSR1":  # an older agent's: it would end
        _signal_waiter(rec, signal.SIGUSR1)


def _held(rec: dict[str, Any]) -> bool:
    """Is the unit's client's pid still its own (the client alive, or its zombie unreaped)?"""
    child = rec.get("child") or {}
    pid = child.get("pid")
    st = procs.read_stat(pid) if isinstance(pid, int) and pid > 1 else None
    return st is not None and st.start_time == child.get("start_time")


def _unit_children(rec: dict[str, Any]) -> list[int]:
    """The waiter's children that still run, its client's zombie aside: none means the unit's
    tree is empty (the waiter is a subreaper: a live descendant is a child of it or of one)."""
    waiter = int((rec.get("waiter") or {}).get("pid") or 0)
    out = []
    for pid in _children(waiter) if waiter else []:
        st = procs.read_stat(pid)
        if st is not None and _running(st):
            out.append(pid)
    return out


def _signal_waiter(rec: dict[str, Any], sig: int) -> None:
    """Send ``sig`` to the unit's waiter, pinned by its pidfd and checked by its start time."""
    pid = (rec.get("waiter") or {}).get("pid")
    if not isinstance(pid, int):
        return
    try:
        fd = pidfd_open(pid)
    except OSError:
        return
    try:
        # Pinned (by its pidfd where the kernel has them), then checked by its start time.
        if not _waiter_alive(rec):
            return
        if fd is not None:
            pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
    except OSError:
        pass
    finally:
        if fd is not None:
            os.close(fd)


def _stop_all(
    listed: Any,
    known: dict[int, _Target],
    main: int | None,
    ours: set[int],
    reaper: dict[str, Any] | None,
) -> None:
    """SIGSTOP every member until no new one appears (a fork between two listings is caught by
    the next), so the set of members holds still without a cgroup. The waiter's own children
    first (``_stop_children``): a member that forks and exits faster than a listing is caught
    there. A process group made of members only is stopped whole (``killpg``): a member that
    forks and exits faster than a listing keeps its group."""
    for _ in range(20):
        if reaper is not None:
            _stop_children(reaper, known, main)
        pids = listed()
        groups = _member_groups(pids, main)
        ours.update(groups)
        for pgid in groups:
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGSTOP)
        added = _targets(pids, known, main)
        if not added:
            return
        for t in added:
            t.send(signal.SIGSTOP)


def _stop_children(rec: dict[str, Any], known: dict[int, _Target], main: int | None) -> None:
    """SIGSTOP the unit's waiter's direct children until no new one appears. The waiter is a
    subreaper, so a member that forks and exits every few milliseconds (faster than any listing
    of /proc) is re-parented to it at once, and the kernel's list of its children (one small
    file per thread) is read in microseconds: the next round finds the fork before it forks
    again. The list is used only when the waiter still lives after it was read (its pid cannot
    have been reused meanwhile), and each child is pinned (pidfd and start time), then checked
    to be the waiter's child, before it is signalled."""
    waiter = int(rec["waiter"]["pid"])
    for _ in range(STOP_CHILDREN_ROUNDS):
        kids = [p for p in _children(waiter) if p not in known]
        if not kids or not _waiter_alive(rec):
            return
        added = _targets(kids, known, main)
        if not added:
            return
        for t in added:
            st = procs.read_stat(t.pid)
            if st is None or st.start_time != t.start_time or st.ppid != waiter:
                del known[t.pid]
                t.close()
                continue
            t.send(signal.SIGSTOP)


def _member_groups(pids: Sequence[int], main: int | None = None) -> list[int]:
    """Process groups that hold members only: those whose every process is one of ``pids``,
    and every group of the client's own session. The waiter starts the client as a session
    leader, so a process in that session descends from the client (a session is joined only by
    inheritance), and the number cannot be reused while a process holds it as its session: a
    group there is the unit's even when a member forks and exits faster than a listing (a
    ``killpg`` reaches the group's processes at once, a fork in flight included)."""
    members = set(pids)
    session = None
    if main:
        for pid in members:
            st = procs.read_stat(pid)
            if st is not None and st.session == main:
                session = main
                break
    groups: dict[int, set[int]] = {}
    ours: set[int] = set()
    for name in os.listdir(procs.PROC):
        if name.isdigit():
            st = procs.read_stat(int(name))
            if st is not None and st.pgrp > 1:
                groups.setdefault(st.pgrp, set()).add(int(name))
                if session is not None and st.session == session:
                    ours.add(st.pgrp)
    return sorted(g for g, who in groups.items() if g in ours or (who and who <= members))


def _group_alive(pgid: int) -> bool:
    """Does process group ``pgid`` still have a live process? The kernel's answer first
    (``killpg(g, 0)``: none, or some), then, since a zombie answers it too (a group's leader
    that its parent, outside the unit, does not reap), a group whose every process is a zombie
    is empty. A group the listing finds no process of is alive (a fork in flight)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # it exists; this user may not signal it
    seen = []
    for name in os.listdir(procs.PROC):
        if name.isdigit():
            st = procs.read_stat(int(name))
            if st is not None and st.pgrp == pgid:
                seen.append(st)
    return not seen or any(_running(st) for st in seen)


def _still_there(pid: int) -> dict[str, Any]:
    return {
        "pid": pid,
        "role": "child",
        "outcome": "refused",
        "detail": "a member of the unit still running after the kill",
        "signals": [],
        "exit": {"confirmed": False, "code": None, "after_s": None},
    }


def _result(t: _Target, started: float, left: Sequence[int]) -> dict[str, Any]:
    gone = t.pid not in left and t.check_gone()
    after = round(t.gone_at - started, 4) if t.gone_at is not None else None
    sent = [s for s in t.signals if s in ("SIGTERM", "SIGKILL")]
    if not gone:
        outcome, detail = "refused", "still running after SIGKILL"
    elif "SIGKILL" in sent:
        outcome, detail = "killed", "ignored SIGTERM; killed"
    elif sent:
        outcome, detail = "terminated", "exited after SIGTERM"
    else:
        outcome, detail = "already-gone", "already gone; no signal sent"
    return {
        "pid": t.pid,
        "role": t.role,
        "outcome": outcome,
        "detail": detail,
        "signals": sorted(set(sent), key=sent.index),
        "exit": {"confirmed": gone, "code": None, "after_s": after},
    }
