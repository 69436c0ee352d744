"""Launching runs: a detached start under the run's locks, lock status and launch fingerprints.

Standard library only, Python >= 3.8 (runs on the host inside the agent). Every path, argument and
environment value arrives as data in a JSON request and goes to the kernel as data
(``subprocess.Popen`` with a list, ``os.open``...); nothing is ever shell text.

Ops:
- ``launch``: start a run detached (new session, stdin from /dev/null, stdout and stderr appended
  to its log) while holding ``flock`` on the run's lock file. The lock's file descriptor is passed
  to the child, so the lock lives exactly as long as the run (and its descendants that keep it);
  a second launch sees the lock taken and reports the holder written in the lock file. The launch
  is confirmed after a settle time: the child is alive with the identity read back from /proc,
  or it died and the result carries the last lines it wrote to the log.
- ``lock_status``: whether a run's lock is held, and by whom.
- ``read_fingerprint`` / ``write_fingerprint``: the ``.runwatch/launch.json`` sidecar.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from supervisor.agent import safefs, unit
from supervisor.agent.datafiles import (
    file_holders,
    resolve,
    sha256_file,
    tail_bytes,
)
from supervisor.agent.masking import (
    argv_secret_values,
    env_secret_values,
    mask_argv,
    mask_json_text,
    mask_text,
    register,
    register_secret_flags,
)
from supervisor.agent.proc import boot_id, identity_of, is_alive, poll_until
from supervisor.agent.protocol import (
    FINGERPRINT_VERSION,
    AgentOpError,
    FileHash,
    Identity,
    LaunchResult,
    LockState,
    LockStatusResult,
    ReadFingerprintResult,
    StoredFingerprint,
    WriteFingerprintResult,
    owner_text,
    param_flag_table,
    param_number,
    param_str,
    param_str_dict,
    param_str_list,
)

if TYPE_CHECKING:
    pass


# --------------------------------------------------------------------------- lock

MIN_SETTLE_S = 0.5
"""The shortest settle time a launch waits, whatever it is asked."""
EXIT_RECORD_WAIT_S = 2.0
"""How long a launch waits, after its settle time, for the exit record of a client already
gone."""


def _read_holder(lock_path: str) -> dict[str, Any] | None:
    try:
        with os.fdopen(safefs.open_file(lock_path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            raw = f.read(65536)
    except (OSError, safefs.UnsafePath):
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


def _lock_one(lock_path: str) -> LockState:
    holder = _read_holder(lock_path)
    try:
        fd = safefs.open_file(lock_path, os.O_RDONLY | os.O_NONBLOCK)
    except safefs.UnsafePath as e:
        raise AgentOpError(str(e), "unsafe-path") from None
    except FileNotFoundError:
        return {"lock_path": lock_path, "held": False, "holder": None, "holder_alive": False}
    except OSError as e:
        raise AgentOpError(f"cannot open lock {lock_path}: {e.strerror}", "unreadable") from None
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
        return [resolve(param_str(params, "lock_path"), base)]
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) and p for p in raw):
        raise AgentOpError(
            "parameter 'lock_paths': expected a non-empty list of paths", "bad-params"
        )
    return sorted({resolve(p, base) for p in raw})


def lock_status(params: dict[str, Any]) -> LockStatusResult:
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


def launch(params: dict[str, Any]) -> LaunchResult:
    """Start a run detached under its lock and confirm it.

    Params: ``workdir``, ``argv`` (list), ``env`` (extra variables; secrets go here, never in argv),
    ``log`` and ``lock_paths`` (a list; or one ``lock_path``; relative to workdir unless absolute:
    one lock per dataset the run writes, so two runs sharing an output dir never block each other
    while two writers of one dataset do), ``settle_s`` (default 2), ``lock_wait_s`` (default 3:
    how long to wait for a concurrent launcher to name its child), ``tail_lines`` (default 30),
    ``fingerprints`` (optional list of ``{"path", "data", "hash_files"}``, or one
    ``fingerprint``, written once the child is confirmed), ``secret_env`` (names of ``env``
    entries that are secrets: their values are masked in every line returned), ``secret_flags``
    (the profile's secret flags: their values are masked in the unit record, the locks, the
    fingerprints and every line returned, as those of built-in secret flags), ``data_files`` (the
    run's data files: while any process, of any user, holds one open for writing the launch is
    refused, checked under the locks).

    Result: ``{"started": true, "identity", "log", "lock_path", "log_offset", "argv_matches"}``, or
    ``{"started": false, "reason": "already-running" | "writer-alive" | "exited" | "exec-failed",
    ...}`` with the holder (already-running), the writers (writer-alive), the exit code and last
    log lines (exited), or the error. ``uninspected`` and ``warning`` name the users whose
    processes could not be looked at (a non-root agent). Locks, fingerprints and the log are
    created mode 0600 and hold masked command lines only.
    """
    workdir = resolve(param_str(params, "workdir"))
    argv = param_str_list(params, "argv")
    env_extra = param_str_dict(params, "env")
    secret_names = params.get("secret_env") or []
    flags = params.get("secret_flags") or []
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise AgentOpError("parameter 'secret_flags': expected a list of flags", "bad-params")
    register_secret_flags(flags)
    for script, short in param_flag_table(params, "script_secret_flags", "bad-params").items():
        register_secret_flags(short, [script])
    secrets = [v for k, v in env_extra.items() if k in secret_names and v]
    secrets += env_secret_values(env_extra) + argv_secret_values(argv)
    register(secrets)
    log = resolve(param_str(params, "log"), workdir)
    lock_paths = _lock_paths(params, workdir)
    raw_files = params.get("data_files") or []
    if not isinstance(raw_files, list) or not all(isinstance(p, str) for p in raw_files):
        raise AgentOpError("parameter 'data_files': expected a list of paths", "bad-params")
    data_files = [resolve(p, workdir) for p in raw_files]
    for path in data_files:  # the client would write through another user's link
        try:
            safefs.stat_file(path)
        except safefs.UnsafePath as e:
            raise AgentOpError(f"{e}; nothing was started", "unsafe-path") from None
        except OSError:
            pass  # missing (the client creates it) or unreadable: the gate says
    # Never shorter than an interpreter's start and its argument parsing: a client that dies
    # rejecting its argv must not be reported running because it had not died yet.
    settle_s = max(param_number(params, "settle_s", 2.0), MIN_SETTLE_S)
    lock_wait_s = param_number(params, "lock_wait_s", 3.0)
    tail_lines = int(param_number(params, "tail_lines", 30))
    try:  # the client's relative paths would be another user's choice
        safefs.stat_file(workdir)
    except safefs.UnsafePath as e:
        raise AgentOpError(f"{e}; nothing was started", "unsafe-path") from None
    except OSError:
        pass  # missing: said just below
    if not os.path.isdir(workdir):
        raise AgentOpError(f"workdir {workdir} is not a directory", "bad-params")
    fds: dict[str, int] = {}
    try:
        safefs.make_dirs(os.path.dirname(log), private_parents=False)
        for path in lock_paths:
            safefs.make_dirs(os.path.dirname(path), private_parents=False)
            fds[path] = safefs.open_private(path, os.O_RDWR)
    except safefs.UnsafePath as e:
        for fd in fds.values():
            os.close(fd)
        raise AgentOpError(str(e), "unsafe-path") from None
    except OSError as e:
        for fd in fds.values():
            os.close(fd)
        raise AgentOpError(f"cannot create {e.filename}: {e.strerror}", "io") from None
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
            held = file_holders([], [busy])
            return {
                "started": False,
                "reason": "already-running",
                "detail": f"already running: {_describe(busy)} holds {busy}"
                + (f" ({held['detail']})" if held["detail"] else ""),
                "holder": _read_holder(busy),
                "lock_path": busy,
            }
        # Under the locks, so no runwatch launch can slip in between the check and the start.
        running = unit.live_unit(str(params.get("config_id") or ""), str(params.get("run") or ""))
        if running is not None:
            return {
                "started": False,
                "reason": "already-running",
                "detail": f"already running: unit {running['launch_id']} of this run still has "
                f"processes ({', '.join(str(p) for p in unit.members(running))})",
                "holder": None,
                "lock_path": lock_path,
            }
        # A unit of any run started on these files (a run renamed in the config, another
        # config naming them) writes them whatever its members did with their descriptors.
        others = unit.units_on(data_files)
        if others:
            return {
                "started": False,
                "reason": "already-running",
                "detail": "already running: " + unit.writers_text(others),
                "holder": None,
                "lock_path": lock_path,
            }
        users = file_holders(data_files)
        if users["pids"]:
            return {
                "started": False,
                "reason": "writer-alive",
                "detail": "refused: a data file of this run is open for writing: "
                + mask_text(users["detail"], secrets),
                "holders": users["holders"],
                "uninspected": users["uninspected"],
                "lock_path": lock_path,
            }
        owner = {
            "config_id": str(params.get("config_id") or ""),
            "config_path": str(params.get("config_path") or ""),
            "run": str(params.get("run") or ""),
        }
        write_all(
            dict(
                owner,
                state="launching",
                agent_pid=os.getpid(),
                boot_id=boot_id(),
                time=time.time(),
            )
        )
        try:
            log_fd = safefs.open_private(log, os.O_WRONLY | os.O_APPEND)
        except safefs.UnsafePath as e:
            write_all({"state": "failed", "time": time.time()})
            raise AgentOpError(str(e), "unsafe-path") from None
        except OSError as e:
            raise AgentOpError(f"cannot open log {log}: {e.strerror}", "io") from None
        log_offset = os.fstat(log_fd).st_size
        env = dict(os.environ)
        env.update(env_extra)
        try:
            pid, unit_data = unit.start(
                argv,
                workdir,
                env,
                log_fd,
                tuple(fds.values()),
                str(params.get("config_id") or ""),
                str(params.get("run") or ""),
                secrets,
                owner["config_path"],
                data_files,
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
            seen[0] = identity_of(pid)
            return seen[0] is None or bool(seen[0]["argv"])

        poll_until(argv_ready, 2.0, 0.005)
        identity = seen[0]
        if identity is None:  # it exited before it could be read: still report what it wrote
            identity = {
                "boot_id": boot_id(),
                "pid": pid,
                "start_time": 0,
                "uid": os.getuid(),
                "argv": argv,
            }
        # From here the client runs: a record of the launch that cannot be written (a disk the
        # client filled at once) is a warning of the start, never a failed launch that a retry
        # or a rollback would act on while the client writes.
        unwritten: list[str] = []
        _recorded(
            unwritten,
            "the lock's holder",
            write_all,
            {
                "state": "running",
                "identity": dict(identity, argv=mask_argv(identity["argv"], secrets)),
                "argv": mask_argv(argv, secrets),
                "workdir": workdir,
                "log": log,
                "launch_id": unit_data["launch_id"],
                "time": time.time(),
                **owner,
            },
        )
    finally:
        # The child holds its own copies of the locks (and releases them when it ends); ours go.
        for fd in fds.values():
            os.close(fd)
    # Settled: the client still runs after ``settle_s``, or its exit is recorded by the waiter.
    # A client that exits while its unit still has members (it daemonised, or its main thread
    # ended while others write) is running: the unit is the run.
    launch_id = unit_data["launch_id"]
    poll_until(lambda: unit.exit_status(launch_id) is not None, settle_s, 0.02)
    if unit.exit_status(launch_id) is None and not is_alive(identity):
        # The client is gone but its waiter has not written the exit yet (it died at the end
        # of a short settle time): a dead client is never reported running.
        poll_until(lambda: unit.exit_status(launch_id) is not None, EXIT_RECORD_WAIT_S, 0.02)
    ended = unit.exit_status(launch_id)
    record = unit.read_record(launch_id)
    if ended is not None and record is not None and unit.members(record):
        ended = None
    code = ended.get("code") if ended is not None else None
    masked_tail = [
        mask_text(line, secrets)
        for line in tail_bytes(log, tail_lines, 64 * 1024, start=log_offset)
    ]
    if ended is not None:
        return {
            "started": False,
            "reason": "exited",
            "exit_code": code,
            "launch_id": launch_id,
            "identity": _identity(identity, mask_argv(identity["argv"], secrets)),
            "detail": (f"the process exited with status {code}" if code is not None else "it died")
            + f" within {settle_s:.1f} s of its start"
            + (f" (killed by signal {ended['signal']})" if ended and ended.get("signal") else ""),
            "log_tail": masked_tail,
            "log": log,
            "lock_path": lock_path,
        }
    cmd = identity["argv"]
    result: LaunchResult = {
        "started": True,
        "identity": _identity(identity, mask_argv(cmd, secrets)),
        "argv_matches": _same_command(cmd, argv),
        "launch_id": launch_id,
        "held_by": unit_data["held_by"],
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
        data["launch_id"] = launch_id  # the unit that writes the data: is it still there?
        if isinstance(data.get("argv"), list):
            data["argv"] = mask_argv([str(a) for a in data["argv"]], secrets)
        fp_params["data"] = data
        fp_written = _recorded(unwritten, "the launch fingerprint", write_fingerprint, fp_params)
        if fp_written is not None:
            written.append(fp_written["path"])
    result["fingerprints"] = written
    warnings = []
    if users["uninspected"]:
        result["uninspected"] = users["uninspected"]
        warnings.append(users["detail"])
    if unwritten:
        warnings.append(
            "started, but not recorded: "
            + "; ".join(unwritten)
            + " (the next start compares the data with the last fingerprint on disk)"
        )
    if warnings:
        result["warning"] = "; ".join(warnings)
    return result


_T = TypeVar("_T")


def _recorded(unwritten: list[str], what: str, write: Callable[[Any], _T], arg: Any) -> _T | None:
    """``write(arg)``, or None with ``what`` and the reason added to ``unwritten`` when the
    file cannot be written (a full disk, a quota, a path made unsafe meanwhile)."""
    try:
        return write(arg)
    except OSError as e:
        unwritten.append(f"{what} ({e.strerror or e})")
    except AgentOpError as e:
        unwritten.append(f"{what} ({e})")
    return None


def _identity(ident: dict[str, Any], argv: list[str]) -> Identity:
    """The protocol's identity of a process read by ``proc.identity_of``, with ``argv``."""
    return {
        "boot_id": ident["boot_id"],
        "pid": ident["pid"],
        "start_time": ident["start_time"],
        "uid": ident["uid"],
        "argv": argv,
    }


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
        return "pid {} (started at tick {}, boot {}){}".format(
            ident.get("pid"),
            ident.get("start_time"),
            str(ident.get("boot_id", ""))[:8],
            owner_text(holder.get("run"), holder.get("config_id"), holder.get("config_path")),
        )
    return "a launch in progress (agent pid {}){}".format(
        holder.get("agent_pid"),
        owner_text(holder.get("run"), holder.get("config_id"), holder.get("config_path")),
    )


# --------------------------------------------------------------------------- fingerprint


def _hashes(files: dict[str, str], base: str | None) -> dict[str, FileHash]:
    out: dict[str, FileHash] = {}
    for key, raw in sorted(files.items()):
        p = resolve(raw, base)
        try:
            out[key] = {"path": raw, "sha256": sha256_file(p), "size": os.path.getsize(p)}
        except OSError as e:
            out[key] = {"path": raw, "sha256": None, "error": e.strerror or str(e)}
    return out


def read_fingerprint(params: dict[str, Any]) -> ReadFingerprintResult:
    """``{path | paths: {key: path}, workdir?, hash_files?: {key: path}}`` -> the stored
    sidecar(s) and current hashes.

    Result: ``{"path", "exists", "fingerprint": dict | None, "error": str | None,
    "hashes": {key: {"path", "sha256" | None, ...}}}``; with ``paths``, ``{"fingerprints": {key:
    {"path", "exists", "fingerprint", "error"}}, "hashes": ...}``. ``hashes`` lets the laptop
    compare the prompt files as they are now with those recorded at the last launch, in one round
    trip.
    """
    workdir = params.get("workdir")
    files = param_str_dict(params, "hash_files")
    many = param_str_dict(params, "paths")
    result: ReadFingerprintResult
    if many:
        seen: dict[str, list[int]] = {}  # launch id -> its live pids: one look per unit
        result = {
            "fingerprints": {k: _read_one(resolve(p, workdir), seen) for k, p in many.items()}
        }
    else:
        one = _read_one(resolve(param_str(params, "path"), workdir))
        result = {
            "path": one["path"],
            "exists": one["exists"],
            "fingerprint": one["fingerprint"],
            "error": one["error"],
        }
    result["hashes"] = _hashes(files, workdir)
    return result


def _read_one(path: str, seen: dict[str, list[int]] | None = None) -> StoredFingerprint:
    result: StoredFingerprint = {
        "path": path,
        "exists": False,
        "fingerprint": None,
        "error": None,
        "live_pids": [],
    }
    try:
        with os.fdopen(safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            raw = f.read(1 << 20)
        result["exists"] = True
        value = json.loads(raw.decode("utf-8"))
        if isinstance(value, dict):
            result["fingerprint"] = value
            result["live_pids"] = _writer_pids(value, {} if seen is None else seen)
        else:
            result["error"] = "not a JSON object"
    except FileNotFoundError:
        pass
    except safefs.UnsafePath as e:
        result["error"] = str(e)
    except OSError as e:
        result["error"] = e.strerror or str(e)
    except (UnicodeDecodeError, ValueError) as e:
        result["error"] = f"not JSON: {e}"
    return result


def _writer_pids(fingerprint: dict[str, Any], seen: dict[str, list[int]]) -> list[int]:
    """The live processes of the launch that wrote ``fingerprint``: its process (same boot, pid
    and start time) and the members of its unit. Empty: the writer is provably gone (a unit of
    this user whose record is gone, or of another boot, has no members; its process is
    checked by identity, whoever it belongs to)."""
    found: set[int] = set()
    ident = fingerprint.get("identity")
    if isinstance(ident, dict) and is_alive(ident):
        found.add(int(ident["pid"]))
    launch_id = fingerprint.get("launch_id")
    if isinstance(launch_id, str) and launch_id:
        if launch_id not in seen:
            try:
                rec = unit.read_record(launch_id)
            except AgentOpError:  # not a launch id: nothing of ours
                rec = None
            seen[launch_id] = unit.members(rec) if rec is not None else []
        found.update(seen[launch_id])
    return sorted(found)


def write_fingerprint(params: dict[str, Any]) -> WriteFingerprintResult:
    """``{path, data, workdir?, hash_files?}`` -> write ``data`` (plus ``prompts`` hashes, a
    version and the time) atomically to the sidecar. Result ``{"path", "fingerprint"}``."""
    workdir = params.get("workdir")
    path = resolve(param_str(params, "path"), workdir)
    data = params.get("data")
    if not isinstance(data, dict):
        raise AgentOpError("parameter 'data': expected a table", "bad-params")
    fingerprint = dict(data)
    fingerprint["version"] = FINGERPRINT_VERSION
    fingerprint["time"] = time.time()
    files = param_str_dict(params, "hash_files")
    if files:
        fingerprint["prompts"] = _hashes(files, workdir)
    if isinstance(fingerprint.get("argv"), list):
        fingerprint["argv"] = mask_argv([str(a) for a in fingerprint["argv"]])
    fingerprint = json.loads(mask_json_text(json.dumps(fingerprint)))
    try:
        safefs.make_dirs(os.path.dirname(path), private_parents=False)
        safefs.write_atomic(
            path, (json.dumps(fingerprint, sort_keys=True, indent=1) + "\n").encode()
        )
    except safefs.UnsafePath as e:
        raise AgentOpError(str(e), "unsafe-path") from None
    return {"path": path, "fingerprint": fingerprint}
