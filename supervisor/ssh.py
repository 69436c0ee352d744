"""``SSHHost``: the host agent over one asyncssh connection per host.

The remote command is the constant bootstrap of ``supervisor.hosts`` (no config or host value is
ever shell text); the interpreter path and the agent's modules travel on stdin as data, then the
JSON-lines protocol of ``supervisor.channel`` runs on the same channel. One long-lived agent
channel per host carries every request.

Host keys are always verified: against the host's configured ``known_hosts``, else the
``UserKnownHostsFile`` of the OpenSSH client config, else ``~/.ssh/known_hosts``. runwatch reads
those files itself and hands asyncssh their content, so nothing (not even ``UserKnownHostsFile
none`` in ``~/.ssh/config``) turns verification off except the per-host
``insecure_skip_host_key_check`` flag, which warns on every connection. An unknown key (S1) and a
changed key (S2) fail before authentication, so nothing is sent to the host.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import asyncssh
import msgspec

from supervisor.channel import LineReader, LineWriter
from supervisor.config import HostConfig
from supervisor.errors import AgentError, HostError, HostKeyError, OutcomeUnknown
from supervisor.hosts import AgentHost, bootstrap_command

log = logging.getLogger(__name__)

_DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")


class _Client(asyncssh.SSHClient):
    """Remembers the host key the server presented and why the connection ended."""

    def __init__(self, owner: SSHHost) -> None:
        self._owner = owner
        self._conn: asyncssh.SSHClientConnection | None = None

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self._conn = conn

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        # Only reached when the key is NOT in known_hosts: record it for the error message and
        # refuse, so the connection fails before authentication.
        self._owner._presented_key = key
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None and self._owner._conn is self._conn:
            self._owner._on_connection_lost(exc)


class SSHHost(AgentHost):
    """A host reached over SSH, running the host agent on one long-lived channel."""

    def __init__(self, cfg: HostConfig, extra_known_hosts: list[Path] | None = None) -> None:
        super().__init__(cfg)
        self._extra_known = list(extra_known_hosts or [])
        self._proxy_jump: str | None = None
        self._jumps: list[asyncssh.SSHClientConnection] = []
        self.last_error: str | None = None
        self._conn: asyncssh.SSHClientConnection | None = None
        self._proc: asyncssh.SSHClientProcess[bytes] | None = None
        self._presented_key: asyncssh.SSHKey | None = None
        self._lost_reason: str | None = None
        self._target = (cfg.address or cfg.name, cfg.port or 22)
        self._user = cfg.user or ""
        self._known_files: list[Path] = []
        self._stderr: collections.deque[str] = collections.deque(maxlen=20)
        self._stderr_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ interface

    async def connect(self) -> dict[str, Any]:
        """Connect, verify the host key, start the agent; returns its hello."""
        # Bounded as a whole: a peer that stops answering mid-bootstrap never hangs a caller.
        bound = 2 * self.cfg.connect_timeout + self.cfg.command_timeout + 5.0
        try:
            hello = await asyncio.wait_for(super().connect(), bound)
        except asyncio.TimeoutError:
            self.last_error = (
                f"{self.name}: could not connect and start the agent within {bound:g}s"
            )
            raise HostError(self.last_error, "check the network path to the host") from None
        except HostError as e:
            self.last_error = e.message
            raise
        self.last_error = None
        return hello

    async def request(
        self,
        op: str,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """One agent request. Raises HostError, AgentError or OutcomeUnknown.

        A dropped connection (keepalive timeout, sshd gone) fails the request at once; the next
        request reconnects.
        """
        try:
            return await super().request(op, params, timeout, on_progress)
        except (AgentError, OutcomeUnknown):
            raise
        except HostError as e:
            if self.connected or self._lost_reason is None:
                self.last_error = e.message
                raise
            why = self._lost_reason
            self.last_error = f"{self.name}: connection lost during {op}: {why}"
            raise HostError(self.last_error, "runwatch reconnects on the next request") from None

    # ------------------------------------------------------------------ transport

    async def _open_transport(self) -> tuple[LineReader, LineWriter, Callable[[], str]]:
        try:
            conn = await self._open_connection()
        except BaseException:
            await self._close_transport()  # jump hosts already connected
            raise
        self._conn = conn
        limit = self.cfg.connect_timeout + self.cfg.command_timeout
        try:
            # Constant text: the bootstrap never contains a config or host value.
            proc = await asyncio.wait_for(
                conn.create_process(bootstrap_command(), encoding=None), limit
            )
        except asyncio.TimeoutError:
            await self._close_transport()
            raise HostError(
                f"{self.name}: could not open an SSH session within {limit:g}s"
            ) from None
        except (asyncssh.Error, OSError) as e:
            await self._close_transport()
            raise HostError(
                f"{self.name}: could not open an SSH session: {_describe_exc(e)}",
                "check MaxSessions and the login shell on the host",
            ) from None
        self._proc = proc
        self._stderr.clear()
        self._stderr_task = asyncio.get_running_loop().create_task(self._read_stderr(proc))
        return _Reader(proc.stdout), proc.stdin, self._diagnostics

    async def _close_transport(self) -> None:
        proc, conn, task = self._proc, self._conn, self._stderr_task
        self._proc = self._conn = None
        self._stderr_task = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if proc is not None:
            with contextlib.suppress(asyncssh.Error, OSError):
                proc.stdin.write_eof()  # the agent exits when its stdin closes
            proc.close()
        jumps, self._jumps = self._jumps, []
        for c in [conn, *reversed(jumps)]:
            if c is None:
                continue
            c.close()
            with contextlib.suppress(asyncio.TimeoutError, asyncssh.Error, OSError):
                await asyncio.wait_for(c.wait_closed(), 5.0)
        self._lost_reason = None

    def _on_connection_lost(self, exc: Exception | None) -> None:
        self._lost_reason = _describe_exc(exc) if exc is not None else "connection closed"

    def client_options(self) -> dict[str, Any]:
        """``asyncssh.connect`` arguments: the host's SSH config, keys and known_hosts content."""
        cfg = self.cfg
        config_paths: Any = [str(Path(cfg.ssh_config).expanduser())] if cfg.ssh_config else ()
        address = cfg.address or cfg.name
        base = asyncssh.SSHClientConnectionOptions(
            config=config_paths,
            host=address,
            port=cfg.port if cfg.port is not None else (),
            username=cfg.user if cfg.user is not None else (),
        )
        self._target = (str(base.host), int(base.port))
        jump = base.config.get("ProxyJump", None)
        self._proxy_jump = str(jump) if jump and str(jump).lower() != "none" else None
        self._user = str(base.username)
        extra: dict[str, Any] = {}
        if cfg.identity_files:
            keys = [str(Path(p).expanduser()) for p in cfg.identity_files]
            from_config = cast("list[str] | None", base.config.get("IdentityFile", None)) or [
                str(Path.home() / ".ssh" / k) for k in _DEFAULT_KEYS
            ]
            keys += [str(Path(str(p)).expanduser()) for p in from_config]
            extra["client_keys"] = [
                k for i, k in enumerate(keys) if os.path.exists(k) and k not in keys[:i]
            ]
        if cfg.insecure_skip_host_key_check:
            known_hosts: Any = None
        else:
            known_hosts = asyncssh.import_known_hosts(self._known_hosts_text(base))
        return dict(
            host=address,
            config=config_paths,
            port=cfg.port if cfg.port is not None else (),
            username=cfg.user if cfg.user is not None else (),
            known_hosts=known_hosts,
            connect_timeout=cfg.connect_timeout,
            keepalive_interval=cfg.keepalive_interval,
            keepalive_count_max=cfg.keepalive_count_max,
            agent_forwarding=False,
            client_factory=lambda: _Client(self),
            **extra,
        )

    def known_hosts_files(
        self, base: asyncssh.SSHClientConnectionOptions | None = None
    ) -> list[Path]:
        """The known_hosts files this host is verified against."""
        if self.cfg.known_hosts:
            return [Path(self.cfg.known_hosts).expanduser(), *self._extra_known]
        if base is not None:
            listed = cast("list[str] | None", base.config.get("UserKnownHostsFile", None))
            if listed and [str(p).lower() for p in listed] != ["none"]:
                return [Path(str(p)).expanduser() for p in listed] + self._extra_known
        return [Path.home() / ".ssh" / "known_hosts", *self._extra_known]

    def _known_hosts_text(self, base: asyncssh.SSHClientConnectionOptions) -> str:
        self._known_files = self.known_hosts_files(base)
        parts = []
        for path in self._known_files:
            try:
                parts.append(path.read_text(encoding="utf-8", errors="replace"))
            except FileNotFoundError:
                continue
            except OSError as e:
                raise HostKeyError(
                    f"{self.name}: cannot read known_hosts file {path}: {e.strerror}",
                    "fix its permissions; host keys are always verified",
                ) from None
        return "\n".join(parts)

    async def _open_jumps(self, spec: str) -> asyncssh.SSHClientConnection:
        """Connect through every ProxyJump hop, each host key verified like any host's."""
        conn: asyncssh.SSHClientConnection | None = None
        for hop in spec.split(","):
            user, address, port = _parse_hop(hop.strip())
            hop_cfg = msgspec.structs.replace(
                self.cfg,
                name=f"{self.name} (jump host {hop.strip()})",
                address=address,
                port=port,
                user=user,
                known_hosts="",  # the hop's own files (its config's, else the default) ...
                insecure_skip_host_key_check=False,
            )
            # ... plus the target's configured file, which may list the jump host too.
            extra = [Path(self.cfg.known_hosts).expanduser()] if self.cfg.known_hosts else []
            hop_host = SSHHost(hop_cfg, extra_known_hosts=extra)
            conn = await hop_host._open_connection(tunnel=conn, follow_jump=False)
            self._jumps.append(conn)
        assert conn is not None
        return conn

    async def _open_connection(
        self, tunnel: asyncssh.SSHClientConnection | None = None, follow_jump: bool = True
    ) -> asyncssh.SSHClientConnection:
        cfg = self.cfg
        try:
            options = self.client_options()
        except (ValueError, asyncssh.Error, OSError) as e:
            raise HostError(f"{self.name}: bad SSH settings: {_describe_exc(e)}") from None
        host, port = self._target
        where = f"{host}:{port}"
        if cfg.insecure_skip_host_key_check:
            warning = (
                f"WARNING: {self.name}: host key NOT verified "
                "(insecure_skip_host_key_check = true); "
                "anyone on the path can impersonate this host"
            )
            log.warning(warning)
            print(f"runwatch: {warning}", file=sys.stderr, flush=True)
        self._presented_key = None
        self._lost_reason = None
        try:
            if tunnel is None and follow_jump and self._proxy_jump:
                tunnel = await self._open_jumps(self._proxy_jump)
            if tunnel is not None:
                options["tunnel"] = tunnel  # replaces asyncssh's own ProxyJump handling
            return await asyncio.wait_for(asyncssh.connect(**options), cfg.connect_timeout + 5.0)
        except asyncssh.HostKeyNotVerifiable:
            raise self._host_key_error(host, port) from None
        except asyncssh.PermissionDenied:
            raise HostError(
                f"{self.name}: authentication failed for user {self._user!r} at {where}",
                "check identity_files, your ssh-agent and the host's authorized_keys",
            ) from None
        except socket.gaierror:
            raise HostError(
                f"{self.name}: cannot resolve host name {host!r}",
                "check the host's address in the config or in ~/.ssh/config",
            ) from None
        except ConnectionRefusedError:
            raise HostError(
                f"{self.name}: connection refused by {where}",
                "is sshd running there, on that port?",
            ) from None
        except (asyncio.TimeoutError, TimeoutError):
            raise HostError(
                f"{self.name}: no SSH answer from {where} within {cfg.connect_timeout:g}s",
                "check the network path and the host's address",
            ) from None
        except (asyncssh.Error, OSError) as e:
            raise HostError(f"{self.name}: cannot connect to {where}: {_describe_exc(e)}") from None

    def _host_key_error(self, host: str, port: int) -> HostKeyError:
        key = self._presented_key
        shown = f"[{host}]:{port}" if port != 22 else host
        files = ", ".join(str(p) for p in getattr(self, "_known_files", [])) or "known_hosts"
        if key is None:
            return HostKeyError(
                f"{self.name}: the host key of {shown} could not be verified; nothing was sent",
                f"check {files}",
            )
        got = key.get_fingerprint("sha256")
        kind = key.get_algorithm()
        known = self._known_keys(host, port)
        if known:
            expected = ", ".join(k.get_fingerprint("sha256") for k in known)
            return HostKeyError(
                f"{self.name}: HOST KEY CHANGED for {shown}: known_hosts has {expected}, "
                f"the host presented {kind} {got}; nothing was sent",
                f"if the host was reinstalled, verify the new key out of band and update {files} "
                f"(ssh-keygen -R '{shown}'); otherwise someone may be impersonating it",
            )
        return HostKeyError(
            f"{self.name}: unknown host key for {shown}: {kind} {got}; nothing was sent",
            f"verify the fingerprint out of band, then add the host to {files} "
            "(for example by connecting once with ssh)",
        )

    def _known_keys(self, host: str, port: int) -> list[asyncssh.SSHKey]:
        text = "\n".join(
            p.read_text(encoding="utf-8", errors="replace")
            for p in getattr(self, "_known_files", [])
            if p.exists()
        )
        if not text.strip():
            return []
        try:
            addr = socket.gethostbyname(host)
        except OSError:
            addr = host
        matched = asyncssh.match_known_hosts(asyncssh.import_known_hosts(text), host, addr, port)
        return list(matched[0])

    async def _read_stderr(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        try:
            while True:
                line = await proc.stderr.readline()
                if not line:
                    return
                self._stderr.append(line.decode("utf-8", "replace").rstrip()[:300])
        except (asyncssh.Error, OSError, ConnectionError):
            return

    def _diagnostics(self) -> str:
        parts = []
        if self._stderr:
            parts.append("agent stderr: " + " | ".join(list(self._stderr)[-5:]))
        proc = self._proc
        if proc is not None and proc.exit_status is not None:
            parts.append(f"remote exit status {proc.exit_status}")
        elif self._lost_reason:
            parts.append(f"connection: {self._lost_reason}")
        return "; ".join(parts)


class _Reader:
    """The agent's stdout; a lost connection reads as ConnectionError, which the channel expects."""

    def __init__(self, stream: asyncssh.SSHReader[bytes]) -> None:
        self._stream = stream

    async def readline(self) -> bytes:
        try:
            line: bytes = await self._stream.readline()
        except asyncssh.Error as e:
            raise ConnectionError(_describe_exc(e)) from None
        return line


def _parse_hop(hop: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` of a ProxyJump hop (``[v6addr]:port`` too)."""
    user: str | None = None
    if "@" in hop:
        user, hop = hop.rsplit("@", 1)
    port: int | None = None
    if hop.startswith("[") and "]" in hop:
        host, _, rest = hop[1:].partition("]")
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
        return user, host, port
    if hop.count(":") == 1:
        host, _, p = hop.partition(":")
        if p.isdigit():
            return user, host, int(p)
    return user, hop, port


def _describe_exc(exc: BaseException | None) -> str:
    if exc is None:
        return "closed"
    if isinstance(exc, asyncssh.DisconnectError):
        return exc.reason or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
