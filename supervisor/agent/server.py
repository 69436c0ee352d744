"""The host agent: one long-lived process per host that answers JSON-line requests on stdin/stdout.

Standard library only and Python >= 3.8. The whole ``supervisor.agent`` package is shipped to the
host as data (see ``supervisor.hosts.bootstrap_argv`` and ``bundle_payload``), and :func:`main`
exits when its stdin closes, so a dropped connection leaves nothing behind (an in-flight kill or
launch is finished first: stopping half-way would leave a run SIGTERMed but never SIGKILLed).

Requests and replies are described in :mod:`supervisor.agent.protocol`. Lines that are not
requests are ignored. Requests run on threads, so a kill waiting out its grace period never delays
a ping; scanner ops are serialized (the scanner keeps per-file state across requests). Every reply
is written as one whole line under a lock. The modules of the ops a refresh does not use (launch,
data-file repairs, metrics, Slurm) are imported at their op's first request, so that the hello and
the first refresh come sooner.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import socket
import sys
import threading
import time
import traceback
from typing import IO, TYPE_CHECKING, Any

from supervisor.agent import bounded, firstpass, gpu, kill
from supervisor.agent import proc as procs
from supervisor.agent.argflags import DEFAULT_SCRIPTS
from supervisor.agent.masking import mask_json_text, register_environ, register_secret_flags
from supervisor.agent.match import resolve_runs
from supervisor.agent.protocol import (
    DURABLE_OPS,
    PROTOCOL,
    AgentOpError,
    Hello,
    PingResult,
    PsResult,
    RefreshResult,
    ScanFile,
    ScanResult,
    param_flag_table,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from supervisor.agent.match import RunFiles

MAX_SESSIONS = 4
"""Scan sessions kept at once (the oldest is dropped)."""

_DEFERRED_OPS = {
    "launch": "launch:launch",
    "lock_status": "launch:lock_status",
    "read_fingerprint": "launch:read_fingerprint",
    "write_fingerprint": "launch:write_fingerprint",
    "units": "unit:list_units",
    "unit_stop": "unit:stop",
    "script_flags": "argspec:script_flags",
    "resolve_args": "argresolve:resolve_args",
    "script_install": "scriptcopy:script_install",
    "repair_tail": "datafiles:repair_tail",
    "move_aside": "datafiles:move_aside",
    "snapshot_check": "snapshots:snapshot_check",
    "snapshot_take": "snapshots:snapshot_take",
    "snapshot_verify": "snapshots:snapshot_verify",
    "snapshot_restore": "snapshots:snapshot_restore",
    "snapshot_list": "snapshots:snapshot_list",
    "tail_log": "datafiles:tail_log",
    "tail_records": "datafiles:tail_records",
    "file_holders": "datafiles:holders_op",
    "observe_files": "observe:observe_files",
    "slurm_jobs": "slurm:slurm_jobs",
    "slurm_submit": "slurm:slurm_submit",
    "slurm_cancel": "slurm:slurm_cancel",
}
"""Op -> ``module:function`` of ``supervisor.agent`` that answers it, imported at its first call."""


def _module(name: str) -> Any:
    """``supervisor.agent.<name>``, imported now if it was not yet."""
    return importlib.import_module("supervisor.agent." + name)


def _deferred(target: str) -> Callable[[dict[str, Any]], Mapping[str, Any]]:
    """The handler of ``module:function``; its module is imported at the first request."""
    module, _, function = target.partition(":")

    def handle(params: dict[str, Any]) -> Mapping[str, Any]:
        result: Mapping[str, Any] = getattr(_module(module), function)(params)
        return result

    return handle


class Agent:
    """State kept across requests: the scanner, the process lister, the output lock."""

    def __init__(self, out: IO[bytes] | None = None) -> None:
        self.out = out
        self.boot_id = procs.boot_id()
        self.lister = procs.Lister()
        self.write_lock = threading.Lock()
        self.scan_lock = threading.Lock()
        self.list_lock = threading.Lock()  # the lister keeps CPU times between calls
        self.gpus = gpu.Poller()
        """nvidia-smi for the refreshes: one query at a time, a refresh waits a bounded time."""
        self.scanner: Any = None
        self.scanner_error: str | None = None
        self.sessions: dict[str, Any] = {}
        """Scanners of fresh scans that go on over several requests (``ScanParams.session``)."""
        self.request = threading.local()
        """``rid``: the id of the request the current thread answers (for progress lines)."""
        self.ops: dict[str, Callable[[dict[str, Any]], Mapping[str, Any]]] = {
            "ping": self.ping,
            "ps": self.ps,
            "refresh": self.refresh,
            "scan": self.scan,
            "kill": lambda p: kill.kill(self, p),
            "probe": lambda p: kill.probe(self, p),
            "gpu_holders": gpu.gpu_holders,
            **{op: _deferred(target) for op, target in _DEFERRED_OPS.items()},
        }
        """Op name -> handler ``params -> result``; the shapes are in ``protocol.OP_SHAPES``."""

    # ------------------------------------------------------------ ops

    def hello(self) -> Hello:
        return {
            "hello": "runwatch-agent",
            "protocol": PROTOCOL,
            "boot_id": self.boot_id,
            "python": platform.python_version(),
            "executable": sys.executable,
            "has_psutil": procs.HAS_PSUTIL,
            "proc_source": "proc" if procs.uses_proc() else "psutil",
            "has_nvidia_smi": gpu.nvidia_smi() is not None,
            "has_pidfd": kill.has_pidfd(),
            "has_scanner": self._get_scanner() is not None,
            "uid": os.getuid(),
            "user": procs.user_name(os.getuid()),
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "ops": sorted(self.ops),
        }

    def ping(self, params: dict[str, Any]) -> PingResult:
        return {"pong": True, "time": time.time()}

    def _list(
        self,
        params: dict[str, Any],
        with_gpu: bool,
        gpu_query: tuple[dict[int, float] | None, dict[str, Any] | None] | None = None,
    ) -> tuple[list[Any], Any, list[Any]]:
        """The run processes, the GPU summary and the units of the listing's ``config_id``;
        ``gpu_query``: nvidia-smi's answer when it was asked already (:class:`gpu.Poller`),
        else it is asked here when ``with_gpu``."""
        scripts = params.get("scripts") or list(DEFAULT_SCRIPTS)
        if not isinstance(scripts, list) or not all(isinstance(s, str) for s in scripts):
            raise AgentOpError("scripts: expected a list of strings", "bad-request")
        clients = params.get("clients") or []
        if not isinstance(clients, list) or not all(isinstance(c, dict) for c in clients):
            raise AgentOpError("clients: expected a list of objects", "bad-request")
        secret_env = params.get("secret_env") or []
        if not isinstance(secret_env, list) or not all(isinstance(s, str) for s in secret_env):
            raise AgentOpError("secret_env: expected a list of variable names", "bad-request")
        flags = params.get("secret_flags") or []
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise AgentOpError("secret_flags: expected a list of flags", "bad-request")
        register_secret_flags(flags)
        for script, short in param_flag_table(params, "script_secret_flags", "bad-request").items():
            register_secret_flags(short, [script])
        try:
            runs = resolve_runs(params.get("runs"))
        except ValueError as e:
            raise AgentOpError(str(e), "bad-request") from None
        if gpu_query is None:
            gpu_query = self.gpus.get() if with_gpu else (None, None)
        gpu_pids, summary = gpu_query
        config_id = params.get("config_id")
        cid = config_id if isinstance(config_id, str) and config_id else None
        named = params.get("pids") or []
        if not isinstance(named, list) or not all(type(x) is int for x in named):
            raise AgentOpError("pids: expected a list of integers", "bad-request")
        units = self.units(runs)
        with self.list_lock:
            found = self.lister.list_runs(
                scripts,
                bool(params.get("show_other_users")),
                gpu_pids,
                runs,
                secret_env,
                clients,
                [u for u in units if u["members"]],
                cid,
                named,
            )
        return found, summary, [u for u in units if cid is not None and u["config_id"] == cid]

    def units(self, runs: Sequence[RunFiles] = ()) -> list[dict[str, Any]]:
        """Every unit of this agent's user (``unit.all_units``), each running one with the
        ``runs`` whose data files it was started on (``writes``, by identity), read only when a
        unit record exists: a host where runwatch never launched pays nothing."""
        unit = _module("unit")
        if not os.path.isdir(unit.units_dir()):
            return []
        wanted = unit.wanted_keys({r.name: sorted(r.files) for r in runs}) if runs else None
        return list(unit.all_units(None, wanted))

    def ps(self, params: dict[str, Any]) -> PsResult:
        found, summary, units = self._list(params, bool(params.get("gpu", True)))
        return {
            "time": time.time(),
            "boot_id": self.boot_id,
            "processes": found,
            "gpu": summary,
            "units": units,
        }

    def refresh(self, params: dict[str, Any]) -> RefreshResult:
        """Processes, GPUs, the files asked for and, with ``metrics``, each serving engine's
        ``/metrics`` text (fetched on a thread of its own while the files are scanned)."""
        fetched: dict[str, Any] = {}
        fetcher = None
        if params.get("metrics"):
            metrics = _module("metrics")
            specs = metrics.parse_specs(params["metrics"])

            def fetch() -> None:
                fetched.update(metrics.fetch_all(specs))

            fetcher = threading.Thread(target=fetch, name="metrics", daemon=True)
            fetcher.start()
        specs = params.get("files") or []
        counting = self._count_lines(specs) if params.get("progress") else None
        with_gpu = bool(params.get("gpu", True))
        reporter = None
        asked: threading.Thread | None = None
        if counting is None:
            found, summary, units = self._list(params, with_gpu)
        else:
            # The line counts go out as soon as they are made, not after nvidia-smi (a second
            # or more on a host of 8 GPUs): the GPUs are asked on a thread of their own, the
            # processes listed without them for the counts and again with them for the reply.
            # nvidia-smi is asked now and waited for (at most the poller's wait) only after
            # the files are scanned.
            asked = self.gpus.ask() if with_gpu else None
            found, summary, units = self._list(params, False)
            reporter = self._first_pass(specs, found, counting)
        files = self._scan_files(specs, reporter=reporter)
        if asked is not None:
            found, summary, units = self._list(params, True, self.gpus.get(asked))
        reply: RefreshResult = {
            "time": time.time(),
            "boot_id": self.boot_id,
            "processes": found,
            "files": files,
            "gpu": summary,
            "units": units,
        }
        if fetcher is not None:
            fetcher.join()
            reply["metrics"] = fetched
        return reply

    def scan(self, params: dict[str, Any]) -> ScanResult:
        """``files`` scanned; with ``fresh``, each from its first byte by a scanner of its own
        (every complete line validated as the specs ask), leaving the incremental state of the
        refreshes untouched."""
        session = params.get("session")
        if not (isinstance(session, str) and params.get("fresh")):
            files = self._scan_files(params.get("files") or [], fresh=bool(params.get("fresh")))
            return {"time": time.time(), "files": files}
        with self.scan_lock:
            scanner = self.sessions.pop(session, None)
            shared = self._get_scanner()
        if scanner is None and shared is not None:
            scanner = type(shared)()
        files = self._scan_files(params.get("files") or [], fresh=True, scanner=scanner)
        if scanner is not None and any(f.get("texts_more") for f in files.values()):
            with self.scan_lock:
                self.sessions[session] = scanner
                while len(self.sessions) > MAX_SESSIONS:
                    self.sessions.pop(next(iter(self.sessions)))
        return {"time": time.time(), "files": files}

    def _get_scanner(self) -> Any:
        if self.scanner is None and self.scanner_error is None:
            try:
                from supervisor.agent.scan import Scanner

                self.scanner = Scanner()
            except Exception as e:  # the scanner module is missing or broken on this build
                self.scanner_error = f"{type(e).__name__}: {e}"
        return self.scanner

    def _count_lines(self, specs: Any) -> tuple[dict[str, str], firstpass.Counting] | None:
        """The counting of the lines of the files never scanned, started at the agent's start
        (``firstpass.start_early``) or now, to run while the processes are listed; with the
        files' paths as asked -> as opened. None outside a request."""
        rid = getattr(self.request, "rid", None)
        scanner = self._get_scanner()
        if rid is None or scanner is None or not isinstance(specs, list):
            return None
        paths: dict[str, str] = {}
        for spec in specs:
            path = spec.get("path") if isinstance(spec, dict) else None
            if isinstance(path, str) and not scanner.following(os.path.expanduser(path)):
                paths[path] = os.path.expanduser(path)
        counting = firstpass.take_early(list(paths.values()))
        if counting is None:
            counting = firstpass.start(list(paths.values()), firstpass.cores())
        return paths, counting

    def _first_pass(
        self, specs: Any, found: list[Any], counting: tuple[dict[str, str], firstpass.Counting]
    ) -> firstpass.Reporter:
        """Send the line counts of ``counting`` and the processes ``found`` as a progress line,
        and return the reporter of the scan's progress."""
        paths, pending = counting
        counted = pending.wait()
        counts: dict[str, Any] = {}
        totals = []
        for spec in specs:
            path = spec.get("path") if isinstance(spec, dict) else None
            lines_size = counted.get(paths.get(path, "")) if isinstance(path, str) else None
            if path is None or lines_size is None:
                totals.append(0)
                continue
            counts[path] = {"lines": lines_size[0], "size": lines_size[1]}
            totals.append(lines_size[1])
        reporter = firstpass.Reporter(self.write, self.request.rid, totals)
        reporter.counts(counts, found)
        return reporter

    def _scan_files(
        self,
        specs: list[Any],
        fresh: bool = False,
        reporter: firstpass.Reporter | None = None,
        scanner: Any = None,
    ) -> dict[str, ScanFile]:
        if not isinstance(specs, list):
            raise AgentOpError("files: expected a list", "bad-request")
        out: dict[str, ScanFile] = {}
        given = scanner
        with self.scan_lock:
            scanner = self._get_scanner()
        if fresh and given is not None:
            scanner = given  # a session's scanner, going on where it stopped
        elif fresh and scanner is not None:
            # A cold scan with a scanner of its own: an earlier sampled scan proves nothing, and
            # a long full validation must not hold up the refreshes (no shared state, no lock).
            scanner = type(scanner)()
        with contextlib.nullcontext() if fresh else self.scan_lock:
            for spec in specs:
                if not isinstance(spec, dict) or not isinstance(spec.get("path"), str):
                    raise AgentOpError("files: each entry needs a string 'path'", "bad-request")
                path = spec["path"]
                if scanner is None:
                    out[path] = {
                        "path": path,
                        "state": "error",
                        "error": f"no scanner: {self.scanner_error}",
                    }
                    continue
                kwargs: dict[str, Any] = {}
                for key, arg in (
                    ("format", "fmt"),
                    ("validate", "validate"),
                    ("profile", "profile"),
                    ("expected", "expected"),
                    ("texts", "texts"),
                    ("sidecars", "sidecars"),
                    ("input", "input_file"),
                ):
                    if spec.get(key) is not None:
                        kwargs[arg] = spec[key]
                if reporter is not None:
                    kwargs["progress"] = reporter.tick
                try:
                    out[path] = scanner.scan(os.path.expanduser(path), **kwargs)
                except Exception as e:  # one bad file never fails the whole refresh
                    out[path] = {
                        "path": path,
                        "state": "error",
                        "error": f"{type(e).__name__}: {e}",
                    }
                if reporter is not None:
                    reporter.file_done()
        return out

    # ------------------------------------------------------------ serving

    def write(self, obj: dict[str, Any]) -> None:
        text = mask_json_text(json.dumps(obj, separators=(",", ":")))
        line = (text + "\n").encode("utf-8")
        with self.write_lock:
            if self.out is None:
                return
            try:
                self.out.write(line)
                self.out.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.out = None  # the laptop went away; finish quietly

    def handle(self, rid: int, op: str, params: dict[str, Any]) -> None:
        fn = self.ops.get(op)
        if fn is None:
            self.write(
                {"id": rid, "ok": False, "error": f"unknown op {op!r}", "kind": "unknown-op"}
            )
            return
        self.request.rid = rid
        try:
            result = fn(params)
        except Exception as e:
            kind = getattr(e, "kind", None)
            if not isinstance(kind, str):
                kind = (
                    "bad-request"
                    if isinstance(e, (KeyError, TypeError, ValueError))
                    else "exception"
                )
            if kind == "exception":
                traceback.print_exc(file=sys.stderr)
            self.write({"id": rid, "ok": False, "error": f"{type(e).__name__}: {e}", "kind": kind})
            return
        self.write({"id": rid, "ok": True, "result": result})

    def serve(self, inp: IO[bytes]) -> None:
        """Answer requests until ``inp`` closes; then finish durable ops and return."""
        durable: list[threading.Thread] = []
        # A newline first ends any partial line a login banner left behind.
        if self.out is not None:
            with contextlib.suppress(OSError):
                self.out.write(b"\n")
        self.write({"id": 0, "ok": True, "result": self.hello()})
        while True:
            raw = inp.readline()
            if not raw:
                break
            line = raw.strip()
            if not line.startswith(b"{"):
                continue
            try:
                msg = json.loads(line.decode("utf-8", "replace"))
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            rid, op, params = msg.get("id"), msg.get("op"), msg.get("params")
            if not isinstance(rid, int) or isinstance(rid, bool):
                continue
            if not isinstance(op, str) or not isinstance(params, (dict, type(None))):
                self.write(
                    {"id": rid, "ok": False, "error": "malformed request", "kind": "bad-request"}
                )
                continue
            th = threading.Thread(
                target=self.handle,
                args=(rid, op, params or {}),
                name=f"op-{op}-{rid}",
                daemon=op not in DURABLE_OPS,
            )
            th.start()
            if op in DURABLE_OPS:
                durable = [t for t in durable if t.is_alive()]
                durable.append(th)
        for th in durable:
            th.join()


def main() -> None:
    """Serve on stdin/stdout; stray prints of any module go to stderr, never into the protocol."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr
    register_environ()  # the host's own credentials never leave it in clear
    agent = Agent(out)
    agent.serve(sys.stdin.buffer)
    with contextlib.suppress(OSError):
        out.flush()
    bounded.kill_all()  # a query under way (a hung nvidia-smi) must not outlive the agent
    os._exit(0)  # do not wait for daemon threads still reading a large file


if __name__ == "__main__":  # pragma: no cover - the bundle calls main()
    main()
