"""The laptop's typed client of the host agent: one method per op of ``agent.protocol``.

Every request the laptop sends goes through :class:`AgentClient`: its keyword arguments are the
op's ``<Op>Params`` keys (an argument left at ``None`` is left out of the request, so the agent
applies its own default), ``timeout`` bounds the request (``None``: the host's command timeout).
A reply the laptop reads through a ``supervisor.replies`` Struct is decoded into it here (a reply
that does not fit raises ``AgentError`` naming the op); any other reply is the op's
``<Op>Result`` TypedDict of ``agent.protocol``, as sent. ``tests/unit/test_agentclient.py``
checks the methods against ``protocol.OP_SHAPES`` and the agent's dispatch table.

Raises what the transport raises: ``HostError``, ``AgentError`` or ``OutcomeUnknown`` (an acting
op whose reply was lost: reconcile, never repeat blindly).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from supervisor import replies
from supervisor.agent import protocol as p

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

T = TypeVar("T")

TRANSPORT_ARGS = frozenset(("timeout", "on_progress"))
"""Keyword arguments of the methods that bound or follow the request, not part of its params."""


class Transport(Protocol):
    """What the client needs of a host (``hosts.Host``)."""

    name: str

    async def request(
        self, op: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> dict[str, Any]: ...


class ProgressTransport(Transport, Protocol):
    """A host whose requests can follow the agent's progress lines (``hosts.AgentHost``)."""

    async def request(
        self,
        op: str,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]: ...


def as_data(reply: Mapping[str, Any]) -> dict[str, Any]:
    """``reply`` as plain data (a shallow copy), for code that keeps or passes a reply on whole
    without reading it by its shape (audit records, step data, the refresh's merged reply)."""
    return dict(reply)


def _params(**given: Any) -> dict[str, Any]:
    """The request's params: the arguments given (not ``None``)."""
    return {k: v for k, v in given.items() if v is not None}


class AgentClient:
    """The agent of one host, one typed method per op."""

    def __init__(self, host: Transport) -> None:
        self.host = host

    async def _send(self, op: str, params: dict[str, Any], timeout: float | None) -> Any:
        return await self.host.request(op, params, timeout=timeout)

    async def _decoded(
        self, op: str, params: dict[str, Any], timeout: float | None, shape: type[T]
    ) -> T:
        return replies.decode(await self._send(op, params, timeout), shape, self.host.name, op)

    # ------------------------------------------------------------ listing and scanning

    async def ping(self, *, timeout: float | None = None) -> p.PingResult:
        return cast("p.PingResult", await self._send("ping", {}, timeout))

    async def ps(
        self,
        *,
        scripts: list[str] | None = None,
        clients: list[p.ClientSpec] | None = None,
        show_other_users: bool | None = None,
        gpu: bool | None = None,
        runs: list[p.RunSpec] | None = None,
        secret_env: list[str] | None = None,
        secret_flags: list[str] | None = None,
        script_secret_flags: dict[str, list[str]] | None = None,
        config_id: str | None = None,
        pids: list[int] | None = None,
        timeout: float | None = None,
    ) -> p.PsResult:
        params = _params(
            scripts=scripts,
            clients=clients,
            show_other_users=show_other_users,
            gpu=gpu,
            runs=runs,
            secret_env=secret_env,
            secret_flags=secret_flags,
            script_secret_flags=script_secret_flags,
            config_id=config_id,
            pids=pids,
        )
        return cast("p.PsResult", await self._send("ps", params, timeout))

    async def refresh(
        self,
        *,
        scripts: list[str] | None = None,
        clients: list[p.ClientSpec] | None = None,
        show_other_users: bool | None = None,
        gpu: bool | None = None,
        runs: list[p.RunSpec] | None = None,
        secret_env: list[str] | None = None,
        secret_flags: list[str] | None = None,
        script_secret_flags: dict[str, list[str]] | None = None,
        config_id: str | None = None,
        pids: list[int] | None = None,
        files: list[p.FileSpec] | None = None,
        metrics: list[p.MetricsSpec] | None = None,
        progress: bool | None = None,
        timeout: float | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> p.RefreshResult:
        """``on_progress`` gets each progress line (``protocol.Progress``); it needs a host
        that can follow them (``ProgressTransport``)."""
        params = _params(
            scripts=scripts,
            clients=clients,
            show_other_users=show_other_users,
            gpu=gpu,
            runs=runs,
            secret_env=secret_env,
            secret_flags=secret_flags,
            script_secret_flags=script_secret_flags,
            config_id=config_id,
            pids=pids,
            files=files,
            metrics=metrics,
            progress=progress,
        )
        if on_progress is None:
            raw = await self._send("refresh", params, timeout)
        else:
            host = cast("ProgressTransport", self.host)
            raw = await host.request("refresh", params, timeout=timeout, on_progress=on_progress)
        return cast("p.RefreshResult", raw)

    async def scan(
        self,
        *,
        files: list[p.FileSpec] | None = None,
        fresh: bool | None = None,
        session: str | None = None,
        timeout: float | None = None,
    ) -> p.ScanResult:
        params = _params(files=files, fresh=fresh, session=session)
        return cast("p.ScanResult", await self._send("scan", params, timeout))

    async def gpu_holders(
        self, *, pids: list[int] | None = None, timeout: float | None = None
    ) -> replies.GpuHolders:
        return await self._decoded("gpu_holders", _params(pids=pids), timeout, replies.GpuHolders)

    async def file_holders(
        self,
        *,
        paths: list[str],
        locks: list[str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,
    ) -> replies.FileHolders:
        params = _params(paths=paths, locks=locks, workdir=workdir)
        return await self._decoded("file_holders", params, timeout, replies.FileHolders)

    async def observe_files(
        self,
        *,
        paths: list[str],
        workdir: str | None = None,
        window_s: float | None = None,
        interval_s: float | None = None,
        full: bool | None = None,
        recent_factor: float | None = None,
        recent_max_s: float | None = None,
        timeout: float | None = None,
    ) -> replies.ObservedFiles:
        params = _params(
            paths=paths,
            workdir=workdir,
            window_s=window_s,
            interval_s=interval_s,
            full=full,
            recent_factor=recent_factor,
            recent_max_s=recent_max_s,
        )
        return await self._decoded("observe_files", params, timeout, replies.ObservedFiles)

    async def script_flags(
        self,
        *,
        workdir: str,
        argv: list[str],
        search_path: str | None = None,
        timeout: float | None = None,
    ) -> replies.ScriptFlags:
        params = _params(workdir=workdir, argv=argv, search_path=search_path)
        return await self._decoded("script_flags", params, timeout, replies.ScriptFlags)

    async def resolve_args(
        self,
        *,
        workdir: str,
        argv: list[str],
        args: list[str],
        search_path: str | None = None,
        timeout: float | None = None,
    ) -> replies.ResolvedArgs:
        params = _params(workdir=workdir, argv=argv, args=args, search_path=search_path)
        return await self._decoded("resolve_args", params, timeout, replies.ResolvedArgs)

    async def script_install(
        self,
        *,
        path: str,
        expect_sha256: str,
        source_b64: str | None = None,
        from_path: str | None = None,
        from_sha256: str | None = None,
        keep: bool | None = None,
        check: bool | None = None,
        timeout: float | None = None,
    ) -> replies.ScriptInstalled:
        params = _params(
            path=path,
            expect_sha256=expect_sha256,
            source_b64=source_b64,
            from_path=from_path,
            from_sha256=from_sha256,
            keep=keep,
            check=check,
        )
        return await self._decoded("script_install", params, timeout, replies.ScriptInstalled)

    # ------------------------------------------------------------ processes and units

    async def kill(
        self,
        *,
        identity: p.Identity,
        grace: float | None = None,
        scripts: list[str] | None = None,
        files: list[str] | None = None,
        writer: bool | None = None,
        timeout: float | None = None,
    ) -> p.KillResult:
        params = _params(
            identity=identity, grace=grace, scripts=scripts, files=files, writer=writer
        )
        return cast("p.KillResult", await self._send("kill", params, timeout))

    async def probe(self, *, identity: p.Identity, timeout: float | None = None) -> p.ProbeResult:
        return cast("p.ProbeResult", await self._send("probe", {"identity": identity}, timeout))

    async def units(
        self, *, config_id: str | None = None, timeout: float | None = None
    ) -> p.UnitsResult:
        params = _params(config_id=config_id)
        return cast("p.UnitsResult", await self._send("units", params, timeout))

    async def unit_stop(
        self, *, launch_id: str, grace: float | None = None, timeout: float | None = None
    ) -> p.UnitStopResult:
        params = _params(launch_id=launch_id, grace=grace)
        return cast("p.UnitStopResult", await self._send("unit_stop", params, timeout))

    # ------------------------------------------------------------ launch, locks, fingerprints

    async def launch(
        self,
        *,
        workdir: str,
        argv: list[str],
        log: str,
        env: dict[str, str] | None = None,
        secret_env: list[str] | None = None,
        secret_flags: list[str] | None = None,
        script_secret_flags: dict[str, list[str]] | None = None,
        lock_path: str | None = None,
        lock_paths: list[str] | None = None,
        settle_s: float | None = None,
        lock_wait_s: float | None = None,
        tail_lines: int | None = None,
        fingerprint: p.FingerprintSpec | None = None,
        fingerprints: list[p.FingerprintSpec] | None = None,
        data_files: list[str] | None = None,
        config_id: str | None = None,
        run: str | None = None,
        config_path: str | None = None,
        timeout: float | None = None,
    ) -> p.LaunchResult:
        params = _params(
            workdir=workdir,
            argv=argv,
            log=log,
            env=env,
            secret_env=secret_env,
            secret_flags=secret_flags,
            script_secret_flags=script_secret_flags,
            lock_path=lock_path,
            lock_paths=lock_paths,
            settle_s=settle_s,
            lock_wait_s=lock_wait_s,
            tail_lines=tail_lines,
            fingerprint=fingerprint,
            fingerprints=fingerprints,
            data_files=data_files,
            config_id=config_id,
            run=run,
            config_path=config_path,
        )
        return cast("p.LaunchResult", await self._send("launch", params, timeout))

    async def lock_status(
        self,
        *,
        lock_path: str | None = None,
        lock_paths: list[str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,
    ) -> replies.LockStatus:
        params = _params(lock_path=lock_path, lock_paths=lock_paths, workdir=workdir)
        return await self._decoded("lock_status", params, timeout, replies.LockStatus)

    async def read_fingerprint(
        self,
        *,
        path: str | None = None,
        paths: dict[str, str] | None = None,
        workdir: str | None = None,
        hash_files: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> p.ReadFingerprintResult:
        params = _params(path=path, paths=paths, workdir=workdir, hash_files=hash_files)
        return cast(
            "p.ReadFingerprintResult", await self._send("read_fingerprint", params, timeout)
        )

    async def write_fingerprint(
        self,
        *,
        path: str,
        data: dict[str, Any],
        workdir: str | None = None,
        hash_files: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> p.WriteFingerprintResult:
        params = _params(path=path, data=data, workdir=workdir, hash_files=hash_files)
        raw = await self._send("write_fingerprint", params, timeout)
        return cast("p.WriteFingerprintResult", raw)

    # ------------------------------------------------------------ data files and logs

    async def repair_tail(self, *, path: str, timeout: float | None = None) -> p.RepairTailResult:
        return cast("p.RepairTailResult", await self._send("repair_tail", {"path": path}, timeout))

    async def move_aside(
        self,
        *,
        path: str,
        format: str | None = None,
        timestamp: str | None = None,
        timeout: float | None = None,
    ) -> p.MoveAsideResult:
        params = _params(path=path, format=format, timestamp=timestamp)
        return cast("p.MoveAsideResult", await self._send("move_aside", params, timeout))

    async def snapshot_check(
        self, *, root: str, paths: list[str], max_bytes: int, timeout: float | None = None
    ) -> replies.SnapshotCheck:
        params = _params(root=root, paths=paths, max_bytes=max_bytes)
        return await self._decoded("snapshot_check", params, timeout, replies.SnapshotCheck)

    async def snapshot_take(
        self,
        *,
        root: str,
        paths: list[str],
        max_bytes: int,
        keep: int,
        run: str | None = None,
        reason: str | None = None,
        timeout: float | None = None,
    ) -> replies.SnapshotTake:
        params = _params(
            root=root, paths=paths, max_bytes=max_bytes, keep=keep, run=run, reason=reason
        )
        return await self._decoded("snapshot_take", params, timeout, replies.SnapshotTake)

    async def snapshot_verify(
        self, *, root: str, id: str, timeout: float | None = None
    ) -> replies.SnapshotVerify:
        params = _params(root=root, id=id)
        return await self._decoded("snapshot_verify", params, timeout, replies.SnapshotVerify)

    async def snapshot_restore(
        self,
        *,
        root: str,
        id: str,
        paths: list[str] | None = None,
        damaged_only: bool | None = None,
        timeout: float | None = None,
    ) -> replies.SnapshotRestore:
        params = _params(root=root, id=id, paths=paths, damaged_only=damaged_only)
        return await self._decoded("snapshot_restore", params, timeout, replies.SnapshotRestore)

    async def snapshot_list(
        self, *, root: str, timeout: float | None = None
    ) -> replies.SnapshotList:
        return await self._decoded("snapshot_list", {"root": root}, timeout, replies.SnapshotList)

    async def tail_log(
        self,
        *,
        path: str,
        workdir: str | None = None,
        lines: int | None = None,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> p.TailLogResult:
        params = _params(path=path, workdir=workdir, lines=lines, max_bytes=max_bytes)
        return cast("p.TailLogResult", await self._send("tail_log", params, timeout))

    async def tail_records(
        self,
        *,
        path: str,
        workdir: str | None = None,
        count: int | None = None,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> p.TailRecordsResult:
        params = _params(path=path, workdir=workdir, count=count, max_bytes=max_bytes)
        return cast("p.TailRecordsResult", await self._send("tail_records", params, timeout))

    # ------------------------------------------------------------ Slurm

    async def slurm_jobs(
        self,
        *,
        tag_prefix: str | None = None,
        with_ids: list[str] | None = None,
        all_states: bool | None = None,
        all_users: bool | None = None,
        job_ids: list[str] | None = None,
        force_format: bool | None = None,
        deadline_s: float | None = None,
        in_workdir: str | None = None,
        timeout: float | None = None,
    ) -> p.SlurmJobsResult:
        """The listing as sent (the callers keep it whole); ``replies.SlurmJobs`` checks it."""
        params = _params(
            tag_prefix=tag_prefix,
            with_ids=with_ids,
            all_states=all_states,
            all_users=all_users,
            job_ids=job_ids,
            force_format=force_format,
            deadline_s=deadline_s,
            in_workdir=in_workdir,
        )
        return cast("p.SlurmJobsResult", await self._send("slurm_jobs", params, timeout))

    async def slurm_submit(
        self,
        *,
        workdir: str,
        tag: str,
        name: str,
        script_path: str,
        lock_path: str,
        argv: list[str] | None = None,
        tasks: list[list[str]] | None = None,
        options: dict[str, Any] | None = None,
        directives: list[str] | None = None,
        env: dict[str, str] | None = None,
        settle_s: float | None = None,
        timeout: float | None = None,
    ) -> p.SlurmSubmitResult:
        params = _params(
            workdir=workdir,
            tag=tag,
            name=name,
            script_path=script_path,
            lock_path=lock_path,
            argv=argv,
            tasks=tasks,
            options=options,
            directives=directives,
            env=env,
            settle_s=settle_s,
        )
        return cast("p.SlurmSubmitResult", await self._send("slurm_submit", params, timeout))

    async def slurm_cancel(
        self,
        *,
        identity: p.SlurmJobIdentity,
        grace: float | None = None,
        files: list[str] | None = None,
        timeout: float | None = None,
    ) -> p.SlurmCancelResult:
        params = _params(identity=identity, grace=grace, files=files)
        return cast("p.SlurmCancelResult", await self._send("slurm_cancel", params, timeout))
