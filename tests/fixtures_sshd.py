"""A real OpenSSH server on 127.0.0.1 for the tests (and the refresh benchmark).

``SshdPool`` starts Debian's ``/usr/sbin/sshd`` in the foreground (``-D -e -f CONFIG``) at a free
port, with a throwaway host key, one authorized client key for the current user, a known_hosts
file written for it and its own pid file, all in a temporary directory. Nothing of the real
``~/.ssh`` or ``/etc/ssh`` is read or written.

Fixtures:
- ``sshd``: the session's server (skips with a reason where sshd is absent; fails when CI=true).
- ``sshd_pool``: the session's pool, to start more servers (``pool.start(...)``: extra
  sshd_config lines, a fixed host key, ...) and to write ``~/.ssh/config``-style files
  (``pool.write_ssh_config``).
- ``ssh_host_cfg``: a ``supervisor.config.HostConfig`` for ``sshd``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

SSHD_PATH = "/usr/sbin/sshd"
KEYGEN_PATH = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"


def sshd_missing_reason() -> str | None:
    """Why a real sshd cannot be started here, or None when it can."""
    if not os.access(SSHD_PATH, os.X_OK):
        return f"{SSHD_PATH} not found (install openssh-server)"
    if not os.access(KEYGEN_PATH, os.X_OK):
        return "ssh-keygen not found (install openssh-client)"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path, comment: str = "runwatch-test") -> str:
    """Create an ed25519 key pair at ``path`` and return the public key line."""
    subprocess.run(
        [KEYGEN_PATH, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    return Path(str(path) + ".pub").read_text().strip()


def key_fingerprint(pub_path: Path) -> str:
    """``SHA256:...`` of a public key file, as OpenSSH prints it."""
    out = subprocess.run(
        [KEYGEN_PATH, "-l", "-E", "sha256", "-f", str(pub_path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()[1]


def _banner_ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.settimeout(1.0)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


@dataclass
class SshdServer:
    """One running sshd."""

    name: str
    port: int
    dir: Path
    host_key: Path
    known_hosts: Path
    client_key: Path
    user: str
    log: Path
    proc: subprocess.Popen[bytes]
    host: str = "127.0.0.1"
    extra: list[str] = field(default_factory=list)

    @property
    def host_pub(self) -> Path:
        return Path(str(self.host_key) + ".pub")

    @property
    def fingerprint(self) -> str:
        return key_fingerprint(self.host_pub)

    @property
    def known_hosts_line(self) -> str:
        kind, blob = self.host_pub.read_text().split()[:2]
        return f"[{self.host}]:{self.port} {kind} {blob}\n"

    def host_config(self, name: str | None = None, **overrides: Any) -> Any:
        """A ``HostConfig`` for this server (fast timeouts for tests)."""
        from supervisor.config import HostConfig

        values: dict[str, Any] = {
            "name": name or self.name,
            "address": self.host,
            "port": self.port,
            "user": self.user,
            "known_hosts": str(self.known_hosts),
            "identity_files": [str(self.client_key)],
            "python": sys.executable,
            "connect_timeout": 10.0,
            "command_timeout": 30.0,
            "keepalive_interval": 1.0,
            "keepalive_count_max": 3,
            "ssh_config": str(self.dir / "empty_ssh_config"),
        }
        values.update(overrides)
        return HostConfig(**values)

    def session_pids(self) -> list[int]:
        """PIDs of the per-connection sshd processes (every sshd descendant of the listener)."""
        import psutil

        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for c in children:
            with contextlib.suppress(psutil.Error):
                if c.name() == "sshd" or c.exe() == SSHD_PATH:
                    out.append(c.pid)
        return out

    def signal_sessions(self, sig: int) -> list[int]:
        """Send ``sig`` to every per-connection sshd process; returns their pids."""
        pids = self.session_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Stop the listener and every connection it serves."""
        import psutil

        try:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGCONT)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        for p in tree:
            with contextlib.suppress(psutil.Error):
                if p.name() == "sshd":
                    p.kill()

    def restart(self) -> None:
        """Start the same server again (same port, same host key) after ``stop``."""
        assert not self.running
        self.proc = _spawn(self.dir / "sshd_config", self.log)
        _wait_ready(self)


def _spawn(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as err:
        return subprocess.Popen(
            [SSHD_PATH, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            start_new_session=True,
        )


def _wait_ready(server: SshdServer, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not _banner_ready(server.port):
        if server.proc.poll() is not None:
            tail = server.log.read_text()[-2000:]
            raise RuntimeError(f"sshd exited with status {server.proc.returncode}: {tail}")
        if time.monotonic() > deadline:
            server.stop()
            raise TimeoutError(f"sshd on port {server.port} did not answer within {timeout}s")
        time.sleep(0.02)


class SshdPool:
    """Starts and stops sshd instances that share one client key and one temporary directory."""

    def __init__(self, base: Path | None = None) -> None:
        reason = sshd_missing_reason()
        if reason:
            raise RuntimeError(reason)
        self._owned_base = base is None
        self.base = Path(tempfile.mkdtemp(prefix="runwatch-sshd-")) if base is None else base
        self.base.mkdir(parents=True, exist_ok=True)
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.client_key = self.base / "client_ed25519"
        self.client_pub = keygen(self.client_key)
        self.authorized_keys = self.base / "authorized_keys"
        self.authorized_keys.write_text(self.client_pub + "\n")
        (self.base / "empty_ssh_config").write_text("")
        self.servers: list[SshdServer] = []
        if os.getuid() == 0:
            # sshd refuses to start without its privilege separation directory.
            Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)

    def start(
        self,
        name: str | None = None,
        extra: Sequence[str] = (),
        host_key: Path | None = None,
        port: int | None = None,
    ) -> SshdServer:
        """Start one sshd. ``extra``: more sshd_config lines (e.g. ``MaxSessions 2``)."""
        name = name or f"sshd{len(self.servers)}"
        d = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.base))
        (d / "empty_ssh_config").write_text("")
        key = d / "host_ed25519"
        if host_key is None:
            keygen(key, comment=f"{name}-host")
        else:
            shutil.copyfile(host_key, key)
            shutil.copyfile(str(host_key) + ".pub", str(key) + ".pub")
            key.chmod(0o600)
        last_error: Exception | None = None
        for _attempt in range(5):
            p = port or free_port()
            lines = [
                f"Port {p}",
                "ListenAddress 127.0.0.1",
                f"HostKey {key}",
                f"PidFile {d / 'sshd.pid'}",
                f"AuthorizedKeysFile {self.authorized_keys}",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "StrictModes no",
                "UsePAM no",
                "PrintMotd no",
                "PrintLastLog no",
                "LogLevel VERBOSE",
                "MaxStartups 100:30:200",
                # The agent's own state (its units) stays in the test's directory, never the
                # user's: a session gets its XDG directories here. sshd takes the first SetEnv
                # line only, so those that ``extra`` asks for join this one.
                " ".join(
                    [
                        "SetEnv",
                        f"XDG_STATE_HOME={d / 'state'}",
                        f"XDG_CACHE_HOME={d / 'cache'}",
                        *(e.split(None, 1)[1] for e in extra if e.startswith("SetEnv ")),
                    ]
                ),
                *(e for e in extra if not e.startswith("SetEnv ")),
            ]
            (d / "sshd_config").write_text("\n".join(lines) + "\n")
            log = d / "sshd.log"
            proc = _spawn(d / "sshd_config", log)
            server = SshdServer(
                name=name,
                port=p,
                dir=d,
                host_key=key,
                known_hosts=d / "known_hosts",
                client_key=self.client_key,
                user=self.user,
                log=log,
                proc=proc,
                extra=list(extra),
            )
            server.known_hosts.write_text(server.known_hosts_line)
            try:
                _wait_ready(server)
            except RuntimeError as e:  # most likely the port was taken meanwhile: try another
                last_error = e
                if port is not None:
                    raise
                continue
            self.servers.append(server)
            return server
        raise RuntimeError(f"could not start sshd: {last_error}")

    def write_ssh_config(
        self, entries: Mapping[str, Mapping[str, str]], name: str = "ssh_config"
    ) -> Path:
        """Write an OpenSSH client config: ``{alias: {"HostName": ..., "Port": ...}}``."""
        path = Path(tempfile.mkdtemp(prefix="sshcfg-", dir=self.base)) / name
        out = []
        for alias, opts in entries.items():
            out.append(f"Host {alias}")
            out.extend(f"    {k} {v}" for k, v in opts.items())
            out.append("")
        path.write_text("\n".join(out))
        return path

    def alias_entry(self, server: SshdServer, **more: str) -> dict[str, str]:
        """The ``~/.ssh/config`` options that reach ``server``."""
        entry = {
            "HostName": server.host,
            "Port": str(server.port),
            "User": server.user,
            "IdentityFile": str(server.client_key),
            "UserKnownHostsFile": str(server.known_hosts),
        }
        entry.update(more)
        return entry

    def stop(self, server: SshdServer) -> None:
        server.stop()

    def close(self) -> None:
        for s in self.servers:
            s.stop()
        self.servers.clear()
        if self._owned_base:
            shutil.rmtree(self.base, ignore_errors=True)


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"sshd tests cannot run on CI: {reason}")
    pytest.skip(f"needs a real OpenSSH sshd: {reason}")


@pytest.fixture(scope="session")
def sshd_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdPool]:
    reason = sshd_missing_reason()
    if reason:
        _skip_or_fail(reason)
    # A short base path: unix socket paths and sshd's own limits prefer it.
    pool = SshdPool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def sshd(sshd_pool: SshdPool) -> SshdServer:
    """The session's sshd on 127.0.0.1 (shared: tests must not stop it; start their own instead)."""
    return sshd_pool.start("sshd-main", extra=["MaxSessions 10"])


@pytest.fixture
def ssh_host_cfg(sshd: SshdServer) -> Any:
    """A ``supervisor.config.HostConfig`` for the session's sshd."""
    return sshd.host_config("sshbox")


@pytest.fixture
def pwned_marker() -> Iterator[Path]:
    """A path that hostile strings try to create; the test asserts it never exists."""
    path = Path(tempfile.gettempdir()) / f"pwned-{os.getpid()}-{time.monotonic_ns()}"
    yield path
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
