"""The engine: every configured host polled concurrently, one ``model.Snapshot`` per refresh.

Each refresh sends ONE ``refresh`` request per host (processes and every dataset file of every run
on that host, in one round trip), matches the processes to the configured runs and builds the
datasets' numbers with ``supervisor.rates`` (one tracker per dataset, kept across refreshes).

One host never stalls the others: each host's refresh is bounded by its own connect and command
timeouts. A host that fails keeps its last values, marked stale, and is retried with exponential
backoff (1 s, 2 s, 4 s ... up to ``MAX_BACKOFF_S``); between retries the refresh answers at once
with the stale values.

The TUI and every CLI command use only this class (``Engine``) and ``run_once``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from supervisor import rates
from supervisor.agent.match import parse_flags, script_index
from supervisor.config import Config, HostConfig, RunConfig
from supervisor.errors import ConfigError, HostError, RunwatchError
from supervisor.hosts import (
    Host,
    assign_runs,
    make_host,
    match_run,
    run_backend,
    run_files,
    run_specs,
    secret_env_names,
    set_backend,
)
from supervisor.kill import KillReport, kill_or_reconcile
from supervisor.model import (
    DatasetView,
    HostView,
    Identity,
    ProcessInfo,
    RunFlags,
    RunState,
    RunView,
    Snapshot,
)
from supervisor.runenv import note_secrets

MAX_BACKOFF_S = 30.0
"""Longest wait between reconnection attempts to a failing host."""

T = TypeVar("T")


@dataclass
class _HostState:
    view: HostView
    failures: int = 0
    next_try: float = 0.0
    discovered: dict[str, dict[str, Any]] = field(default_factory=dict)


def dataset_path(run: RunConfig, dataset: str, local: bool) -> str:
    """``<workdir>/<output_dir>/<dataset>/<data_file>`` as seen on the run's host."""
    workdir = os.path.expanduser(run.workdir) if local else run.workdir
    out = os.path.expanduser(run.output_dir) if local else run.output_dir
    return posixpath.normpath(posixpath.join(workdir, out, dataset, run.data_file))


class Engine:
    """Polls every configured host; see the module docstring."""

    def __init__(self, config: Config, hosts: dict[str, Host] | None = None) -> None:
        self.config = config
        note_secrets(config)  # their values are masked in everything runwatch prints or writes
        self._hosts: dict[str, Host] = dict(hosts or {})
        for hc in config.hosts:
            if hc.name not in self._hosts:
                self._hosts[hc.name] = make_host(hc)
        # Before the first answer a host shows its configured runs, state unknown.
        self._state: dict[str, _HostState] = {
            hc.name: _HostState(
                view=HostView(
                    name=hc.name,
                    runs=[
                        RunView(name=r.name, host=hc.name, state="unknown")
                        for r in self._runs_of(hc.name)
                    ],
                )
            )
            for hc in config.hosts
        }
        self._trackers = rates.Trackers()
        self._tokenizer: Any = None
        self.last: Snapshot | None = None
        self._inflight: asyncio.Future[Snapshot] | None = None

    # ------------------------------------------------------------------ public API

    def host(self, name: str) -> Host:
        """The Host (``supervisor.hosts`` interface) named ``name``."""
        try:
            return self._hosts[name]
        except KeyError:
            known = ", ".join(self._hosts) or "none"
            raise RunwatchError(f"no host named {name!r} (hosts: {known})") from None

    async def refresh(self) -> Snapshot:
        """Poll all hosts concurrently and build a Snapshot.

        Calls that overlap share one refresh (rates need one observation per refresh, and a
        host is asked once however many front ends ask)."""
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(self._refresh_all())
        return await asyncio.shield(self._inflight)

    async def _refresh_all(self) -> Snapshot:
        names = [hc.name for hc in self.config.hosts]
        views = await asyncio.gather(*(self._refresh_host(n) for n in names))
        snap = Snapshot(time=time.time(), hosts=list(views))
        self.last = snap
        return snap

    async def kill(self, host: str, identity: Identity, grace: float = 10.0) -> KillReport:
        """Stop the process named by ``identity`` on ``host`` (see ``supervisor.kill``), and
        whatever holds the data files or locks of the run it was listed as."""
        files = run_files(self.config, self._listed_run(host, identity))
        return await kill_or_reconcile(self.host(host), identity, grace, self.config.scripts, files)

    def _listed_run(self, host: str, identity: Identity) -> str | None:
        """The config run ``identity`` was matched to at the last refresh."""
        for hv in self.last.hosts if self.last is not None else []:
            for p in hv.processes if hv.name == host else []:
                if p.identity.pid == identity.pid and p.identity.start_time == identity.start_time:
                    return p.run
        return None

    async def check_run(self, run_name: str) -> list[dict[str, Any]]:
        """Scan every dataset file of a run with full validation; returns the scan results."""
        run = self.config.run(run_name)
        hc = self.config.host(run.host)
        files = [{**spec, "validate": "all"} for spec in self._file_specs(run, hc)]
        h = self.host(run.host)
        timeout = max(hc.command_timeout, 300.0)
        # ``fresh``: validated from the first byte, however the refreshes sampled the file.
        result = await h.request("scan", {"files": files, "fresh": True}, timeout=timeout)
        scanned: dict[str, dict[str, Any]] = result.get("files", {})
        return [scanned.get(f["path"], {"path": f["path"], "state": "error"}) for f in files]

    async def aclose(self) -> None:
        """Close every host (a refresh still running is cancelled)."""
        if self._inflight is not None and not self._inflight.done():
            self._inflight.cancel()
            with contextlib.suppress(asyncio.CancelledError, RunwatchError):
                await self._inflight
        await asyncio.gather(*(self._close(h) for h in self._hosts.values()))

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ per host

    @staticmethod
    async def _close(host: Host) -> None:
        with contextlib.suppress(asyncio.TimeoutError, OSError, RunwatchError):
            await asyncio.wait_for(host.close(), 5.0)

    def _file_specs(self, run: RunConfig, hc: HostConfig) -> list[dict[str, Any]]:
        specs = []
        profile = self.config.formats.get(run.format)
        for ds in self.config.run_datasets(run):
            spec: dict[str, Any] = {
                "path": dataset_path(run, ds, hc.local),
                "format": run.format,
                "validate": "sample",
            }
            if profile is not None:
                spec["profile"] = msgspec.to_builtins(profile)
            specs.append(spec)
        return specs

    def _prompt_specs(self, run: RunConfig, hc: HostConfig) -> dict[str, dict[str, Any]]:
        """Dataset -> scan spec of its prompts file (its line count bounds the samples)."""
        specs = {}
        for ds in self.config.run_datasets(run):
            ds_cfg = self.config.datasets.get(ds)
            if ds_cfg is None or not ds_cfg.prompts:
                continue
            workdir = os.path.expanduser(run.workdir) if hc.local else run.workdir
            prompts = os.path.expanduser(ds_cfg.prompts) if hc.local else ds_cfg.prompts
            path = posixpath.normpath(posixpath.join(workdir, prompts))
            specs[ds] = {"path": path, "validate": "sample", "texts": False}
        return specs

    def _runs_of(self, host_name: str) -> list[RunConfig]:
        return [r for r in self.config.runs if r.host == host_name]

    async def _refresh_host(self, name: str) -> HostView:
        hc = self.config.host(name)
        state = self._state[name]
        host = self._hosts[name]
        now = time.monotonic()
        if not host.connected and now < state.next_try:
            return self._stale(
                state, state.view.error or "disconnected", retry_in=state.next_try - now
            )
        runs = self._runs_of(name)
        files = [spec for run in runs for spec in self._file_specs(run, hc)]
        files += [spec for run in runs for spec in self._prompt_specs(run, hc).values()]
        files += list(state.discovered.values())
        params = {
            "scripts": list(self.config.scripts),
            "show_other_users": hc.show_other_users,
            "files": files,
            "runs": run_specs(self.config, name),
            "secret_env": secret_env_names(self.config),
        }
        bound = hc.connect_timeout + hc.command_timeout + 5.0
        try:
            result, rtt = await asyncio.wait_for(self._ask(host, params, hc, runs), bound)
        except asyncio.TimeoutError:
            return self._failed(state, f"{name}: no answer within {bound:g}s")
        except RunwatchError as e:
            return self._failed(state, e.message)
        except (OSError, EOFError) as e:
            return self._failed(state, f"{name}: {e}")
        state.failures = 0
        state.next_try = 0.0
        view = self._build_view(hc, runs, result, rtt)
        state.view = view
        return view

    async def _ask(
        self, host: Host, params: dict[str, Any], hc: HostConfig, runs: list[RunConfig]
    ) -> tuple[dict[str, Any], float]:
        """The host's refresh reply and its round-trip time (connecting first when needed).

        Datasets of a run that is not in the config are known only once its process is listed:
        the first time one appears they are scanned at once with one more request."""
        if not host.connected:
            await host.connect()
        started = time.monotonic()
        result = await host.request("refresh", params, timeout=hc.command_timeout)
        rtt = time.monotonic() - started
        scanned = result.setdefault("files", {})
        new = []
        for raw in result.get("processes", []):
            p = msgspec.convert(raw, ProcessInfo)
            if self._match(hc, runs, p) is not None:
                continue
            for ds in p.flags.datasets:
                path = _process_dataset_path(p, ds)
                if path is not None and path not in scanned:
                    new.append({"path": path, "format": "raw", "validate": "sample"})
        if new:
            extra = await host.request("scan", {"files": new}, timeout=hc.command_timeout)
            scanned.update(extra.get("files", {}))
        return result, rtt

    def _failed(self, state: _HostState, message: str) -> HostView:
        state.failures += 1
        delay = min(MAX_BACKOFF_S, 2.0 ** (state.failures - 1))
        state.next_try = time.monotonic() + delay
        return self._stale(state, message, retry_in=delay)

    def _stale(self, state: _HostState, message: str, retry_in: float) -> HostView:
        last = state.view
        view = msgspec.structs.replace(
            last,
            connected=False,
            stale=last.last_ok is not None,
            error=message,
            runs=[
                msgspec.structs.replace(r, state="unknown" if r.state == "running" else r.state)
                for r in last.runs
            ],
        )
        state.view = view
        return view

    # ------------------------------------------------------------------ building the view

    def _build_view(
        self, hc: HostConfig, runs: list[RunConfig], result: dict[str, Any], rtt: float
    ) -> HostView:
        procs = [msgspec.convert(p, ProcessInfo) for p in result.get("processes", [])]
        scanned: dict[str, dict[str, Any]] = result.get("files", {})
        taken: set[int] = set()
        run_views: list[RunView] = []
        candidates = assign_runs(procs, self.config, hc.name)
        for p in procs:
            set_backend(p, self.config)
        for run in runs:
            cands = candidates.get(run.name, [])
            taken.update(p.identity.pid for p in cands)
            # Two processes that could each be the run: neither is shown as it (ambiguous).
            proc = cands[0] if len(cands) == 1 else None
            if proc is not None:
                flags = proc.flags
            else:
                flags = _config_flags(run, self.config.scripts)
                flags.backend = run_backend(self.config, run.name) or flags.backend
            datasets = []
            for ds, spec in zip(
                self.config.run_datasets(run), self._file_specs(run, hc), strict=True
            ):
                scan = scanned.get(
                    spec["path"], {"path": spec["path"], "state": "error", "error": "not scanned"}
                )
                prompt_spec = self._prompt_specs(run, hc).get(ds)
                prompts = _line_count(scanned.get(prompt_spec["path"])) if prompt_spec else None
                datasets.append(
                    self._dataset_view(hc.name, run, ds, scan, flags, proc, prompts=prompts)
                )
            state: RunState
            if len(cands) > 1:
                state = "ambiguous"
            elif proc is None:
                state = "stopped"
            elif proc.state.startswith("Z"):
                state = "zombie"
            else:
                state = "running"
            run_views.append(
                RunView(
                    name=run.name,
                    host=hc.name,
                    state=state,
                    process=proc,
                    datasets=datasets,
                    candidates=[p.identity.pid for p in cands] if len(cands) > 1 else [],
                )
            )
        discovered: dict[str, dict[str, Any]] = {}
        for proc in procs:
            if proc.identity.pid in taken:
                continue
            name = f"{_script_name(proc, self.config.scripts)} (pid {proc.identity.pid})"
            dsv = []
            for ds in proc.flags.datasets:
                path = _process_dataset_path(proc, ds)
                if path is None:
                    continue
                discovered[path] = {"path": path, "format": "raw", "validate": "sample"}
                found = scanned.get(path)
                if found is None:
                    continue
                pseudo = RunConfig(
                    name=name, host=hc.name, workdir=proc.cwd or "/", argv=list(proc.argv_masked)
                )
                dsv.append(self._dataset_view(hc.name, pseudo, ds, found, proc.flags, proc))
            run_views.append(
                RunView(
                    name=name,
                    host=hc.name,
                    state="zombie" if proc.state.startswith("Z") else "running",
                    process=proc,
                    datasets=dsv,
                    configured=False,
                )
            )
        self._state[hc.name].discovered = discovered
        return HostView(
            name=hc.name,
            connected=True,
            stale=False,
            error=None,
            rtt_ms=round(rtt * 1000.0, 2),
            last_ok=time.time(),
            has_gpu=result.get("gpu") is not None,
            runs=run_views,
            processes=procs,
        )

    def _match(self, hc: HostConfig, runs: list[RunConfig], p: ProcessInfo) -> str | None:
        """The configured run ``p`` could be (``supervisor.hosts.match_run``: the one rule for
        every front end, on the evidence the host reported)."""
        return match_run(p, self.config, hc.name)

    def _dataset_view(
        self,
        host: str,
        run: RunConfig,
        dataset: str,
        scan: dict[str, Any],
        flags: RunFlags,
        proc: ProcessInfo | None,
        prompts: int | None = None,
    ) -> DatasetView:
        endpoint = self.config.endpoint(run.endpoint) if run.endpoint is not None else None
        tracker = self._trackers.get((host, str(scan.get("path") or dataset)))
        counter = self._count_texts if scan.get("texts") else None
        problem = None
        if counter is not None:
            try:
                self._tokenizer_ready()
            except RunwatchError as e:
                counter, problem = None, e.message
        view = rates.build_dataset_view(
            scan,
            self.config.datasets.get(dataset),
            flags,
            tracker,
            rates.CostInfo.from_endpoint(endpoint),
            proc is not None and not proc.state.startswith("Z"),
            time.time(),
            name=dataset,
            stall_seconds=run.stall_seconds,
            prompts=prompts,
            count_texts=counter,
        )
        if problem is not None and view.error is None:
            view.error = f"tokens not counted: {problem}"
        return view

    def _tokenizer_ready(self) -> None:
        if self._tokenizer is not None:
            return
        if self.config.tokenizer is None:
            raise ConfigError(
                "this format counts tokens with a tokenizer, but none is configured",
                "set tokenizer = DIR (a local tokenizer directory) in the config",
            )
        from supervisor.tokens import load_tokenizer

        self._tokenizer = load_tokenizer(
            self.config.tokenizer, trust_remote_code=self.config.trust_remote_code
        )

    def _count_texts(self, texts: list[str]) -> int:
        """Tokens of texts handed back by a scan (formats counted with the tokenizer)."""
        from supervisor.tokens import count_tokens

        self._tokenizer_ready()
        return sum(count_tokens(self._tokenizer, texts))


def _line_count(scan: dict[str, Any] | None) -> int | None:
    if scan is None or scan.get("state") != "ok":
        return None
    lines = scan.get("lines")
    return int(lines) if isinstance(lines, int) else None


def _config_flags(run: RunConfig, scripts: list[str]) -> RunFlags:
    idx = script_index(run.argv, scripts)
    raw = parse_flags(run.argv, idx if idx is not None else 0)
    return msgspec.convert(raw, RunFlags)


def _script_name(proc: ProcessInfo, scripts: list[str]) -> str:
    argv = list(proc.identity.argv)
    idx = script_index(argv, scripts)
    return posixpath.basename(argv[idx]) if idx is not None else (argv[0] if argv else "?")


def _process_dataset_path(proc: ProcessInfo, dataset: str) -> str | None:
    if not proc.cwd or not dataset or "/" in dataset or dataset in (".", ".."):
        return None
    out = proc.flags.output_dir or "out"
    return posixpath.normpath(posixpath.join(proc.cwd, out, dataset, "raw_responses.jsonl"))


async def run_once(config: Config, action: Callable[[Engine], Awaitable[T]]) -> T:
    """Open an Engine, run ``action`` on it, close it (for CLI commands)."""
    engine = Engine(config)
    try:
        return await action(engine)
    finally:
        await engine.aclose()


def run_sync(config: Config, action: Callable[[Engine], Awaitable[T]]) -> T:
    """``asyncio.run(run_once(config, action))``."""
    return asyncio.run(run_once(config, action))


__all__ = ["MAX_BACKOFF_S", "Engine", "HostError", "dataset_path", "run_once", "run_sync"]
