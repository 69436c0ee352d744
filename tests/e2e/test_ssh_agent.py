"""The host agent over a real sshd: processes, scans, hostile strings (S5), banners and a POSIX
shell (S6), MaxSessions (S7), a silent peer (S3), a lost exit status (S4) and a kill whose
connection drops (P8)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.errors import HostError, OutcomeUnknown
from supervisor.hosts import list_processes
from supervisor.kill import kill, kill_or_reconcile, reconcile
from supervisor.model import Identity
from supervisor.ssh import SSHHost
from tests.fixtures_data import make_raw
from tests.fixtures_sshd import SshdPool, SshdServer
from tests.waiting import wait_until

pytestmark = pytest.mark.ssh

RUN_SCRIPT = """\
import os, signal, sys
if os.environ.get("IGNORE_TERM"):
    # Ignore SIGTERM, but leave a trace that it came.
    signal.signal(signal.SIGTERM, lambda *a: open(os.environ["READY_FILE"] + ".term", "w").close())
open(os.environ["READY_FILE"], "w").close()
while True:
    signal.pause()
"""

HOSTILE = [
    "$(touch {pwned})",
    "`touch {pwned}`",
    "; touch {pwned};",
    "a\nb",
    'it\'s "quoted"',
    "-rf",
    "with space",
    "données-日本",
    "| touch {pwned}",
]


class Runs:
    """Real ``run_inference.py`` processes started for a test; all killed at the end."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ready: dict[int, Path] = {}

    def start(
        self,
        workdir: Path,
        args: list[str],
        ignore_term: bool = False,
        script_dir: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        workdir.mkdir(parents=True, exist_ok=True)
        sdir = script_dir or workdir
        sdir.mkdir(parents=True, exist_ok=True)
        script = sdir / "run_inference.py"
        script.write_text(RUN_SCRIPT)
        ready = self.base / f"ready-{len(self.procs)}-{time.monotonic_ns()}"
        env = {**os.environ, "READY_FILE": str(ready)}
        if ignore_term:
            env["IGNORE_TERM"] = "1"
        proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append(proc)
        self.ready[proc.pid] = ready
        wait_until(ready.exists, timeout=20, what="the run to start")
        return proc

    def got_sigterm(self, proc: subprocess.Popen[bytes]) -> bool:
        return Path(str(self.ready[proc.pid]) + ".term").exists()

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    r = Runs(tmp_path)
    yield r
    r.close()


@pytest.fixture
async def ssh_host(ssh_host_cfg: Any) -> Any:
    host = SSHHost(ssh_host_cfg)
    yield host
    await host.close()


def _config(**kw: Any) -> Any:
    from supervisor.config import Config

    return Config(**kw)


async def test_agent_over_ssh_lists_a_real_run_and_scans_its_files(
    ssh_host: SSHHost, runs: Runs, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    out = work / "out" / "B1"
    out.mkdir(parents=True)
    truth = make_raw(out / "raw_responses.jsonl", 57, seed=3, dup_every=10)
    proc = runs.start(
        work,
        [
            "--datasets",
            "B1",
            "--max-samples",
            "7000",
            "--api-key",
            "sk-secret-123",
            "--output-dir",
            "out",
        ],
    )
    decoy = subprocess.Popen(
        ["tail", "-f", str(out / "raw_responses.jsonl"), "run_inference.py"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        hello = await ssh_host.connect()
        assert hello["hello"] == "runwatch-agent" and hello["uid"] == os.getuid()
        result = await ssh_host.request(
            "refresh",
            {
                "scripts": ["run_inference.py"],
                "files": [
                    {"path": str(out / "raw_responses.jsonl"), "format": "raw", "validate": "all"}
                ],
            },
        )
        pids = {p["identity"]["pid"]: p for p in result["processes"]}
        assert proc.pid in pids and decoy.pid not in pids
        listed = pids[proc.pid]
        assert listed["cwd"] == str(work)
        assert "sk-secret-123" not in repr(listed)
        assert listed["flags"]["datasets"] == ["B1"] and listed["flags"]["max_samples"] == 7000
        truth.check(result["files"][str(out / "raw_responses.jsonl")])
    finally:
        decoy.kill()
        decoy.wait()


async def test_s5_hostile_strings_are_data(
    ssh_host_cfg: Any, runs: Runs, tmp_path: Path, pwned_marker: Path
) -> None:
    hostile = [h.format(pwned=pwned_marker) for h in HOSTILE]
    work = tmp_path / f"$(touch {pwned_marker}) ; `touch {pwned_marker}` 'q' \"dq\" sp ace é"
    files = {}
    for i, name in enumerate(hostile):
        d = work / "out" / name.replace("/", "_")
        d.mkdir(parents=True, exist_ok=True)
        files[str(d / "raw_responses.jsonl")] = make_raw(d / "raw_responses.jsonl", 5 + i, seed=i)
    args = ["--datasets", ",".join(h.replace("/", "_") for h in hostile), "--note", *hostile]
    proc = runs.start(work, args, script_dir=work / f"-scripts; touch {pwned_marker}")
    # A hostile interpreter path is data too: the agent fails to start, nothing runs.
    bad = SSHHost(
        ssh_host_cfg.__class__(
            **{**_fields(ssh_host_cfg), "python": f"python3; touch {pwned_marker}"}
        )
    )
    with pytest.raises(HostError):
        await bad.connect()
    await bad.close()
    # Hostile address and user: there is no command line to inject into, only data.
    for field, value in (
        ("address", f"-oProxyCommand=touch {pwned_marker}"),
        ("user", f"$(touch {pwned_marker})"),
    ):
        odd = SSHHost(ssh_host_cfg.__class__(**{**_fields(ssh_host_cfg), field: value}))
        with pytest.raises(HostError):
            await odd.connect()
        await odd.close()
    host = SSHHost(ssh_host_cfg)
    try:
        result = await host.request(
            "refresh",
            {
                "scripts": ["run_inference.py"],
                "files": [{"path": p, "format": "raw", "validate": "all"} for p in files],
            },
        )
    finally:
        await host.close()
    (listed,) = [p for p in result["processes"] if p["identity"]["pid"] == proc.pid]
    assert listed["identity"]["argv"][2:] == args
    assert listed["cwd"] == str(work)
    for path, truth in files.items():
        truth.check(result["files"][path])
    assert not pwned_marker.exists()


def _fields(cfg: Any) -> dict[str, Any]:
    return {f: getattr(cfg, f) for f in cfg.__struct_fields__}


@pytest.fixture
def banner_sshd(sshd_pool: SshdPool) -> Iterator[SshdServer]:
    banner = sshd_pool.base / "banner.txt"
    banner.write_text("Authorized use only\n")
    # Text on the channel before the agent starts (a chatty login), then the command run by
    # dash, a POSIX shell that is not bash.
    force = (
        'ForceCommand printf \'Welcome to the GPU box\\n{"id": 1, "ok": true}\\nnot json\\n\'; '
        'exec /bin/dash -c "$SSH_ORIGINAL_COMMAND"'
    )
    server = sshd_pool.start("banner", extra=[f"Banner {banner}", force])
    yield server
    server.stop()


async def test_s6_banners_and_a_posix_shell_do_not_break_framing(
    banner_sshd: SshdServer, tmp_path: Path
) -> None:
    d = tmp_path / "out" / "B1"
    d.mkdir(parents=True)
    truth = make_raw(d / "raw_responses.jsonl", 21)
    host = SSHHost(banner_sshd.host_config("chatty"))
    try:
        hello = await host.connect()
        assert hello["hello"] == "runwatch-agent"
        result = await host.request(
            "scan", {"files": [{"path": str(d / "raw_responses.jsonl"), "format": "raw"}]}
        )
        truth.check(result["files"][str(d / "raw_responses.jsonl")])
        assert (await host.request("ping", {}))["pong"] is True
    finally:
        await host.close()


async def test_s7_more_requests_than_max_sessions(sshd_pool: SshdPool, tmp_path: Path) -> None:
    server = sshd_pool.start("one-session", extra=["MaxSessions 1"])
    hosts = [SSHHost(server.host_config(f"h{i}")) for i in range(4)]
    try:
        replies = await asyncio.gather(*(h.request("ping", {}) for h in hosts for _ in range(25)))
        assert len(replies) == 100 and all(r["pong"] is True for r in replies)
        # Every host still serves on its one session.
        assert all(h.connected for h in hosts)
    finally:
        await asyncio.gather(*(h.close() for h in hosts))
        server.stop()


async def test_s3_silent_peer_is_detected_by_keepalive(sshd_pool: SshdPool) -> None:
    server = sshd_pool.start("silent")
    host = SSHHost(
        server.host_config(
            "silent", keepalive_interval=0.5, keepalive_count_max=3, command_timeout=300
        )
    )
    try:
        await host.connect()
        stopped = server.signal_sessions(signal.SIGSTOP)
        assert stopped
        started = time.monotonic()
        with pytest.raises(HostError) as info:
            await asyncio.wait_for(host.request("ping", {}), 60)
        elapsed = time.monotonic() - started
        # Detected by keepalive, not by the 300 s command timeout.
        assert "keepalive" in str(info.value).lower(), str(info.value)
        assert elapsed < 300
        assert not host.connected
    finally:
        server.signal_sessions(signal.SIGCONT)
        await host.close()
        server.stop()


async def test_command_timeout_bounds_every_request(sshd_pool: SshdPool) -> None:
    """With keepalive effectively off, the overall timeout still ends a stuck request."""
    server = sshd_pool.start("stuck")
    host = SSHHost(server.host_config("stuck", keepalive_interval=3600, command_timeout=1.0))
    try:
        await host.connect()
        server.signal_sessions(signal.SIGSTOP)
        with pytest.raises(HostError, match="no reply to ping within 1 s"):
            await asyncio.wait_for(host.request("ping", {}), 60)
    finally:
        server.signal_sessions(signal.SIGCONT)
        await host.close()
        server.stop()


def _identity(p: dict[str, Any]) -> Identity:
    ident = p["identity"]
    return Identity(
        boot_id=ident["boot_id"],
        pid=ident["pid"],
        start_time=ident["start_time"],
        uid=ident["uid"],
        argv=tuple(ident["argv"]),
    )


async def test_s4_p8_kill_whose_connection_drops_is_reconciled(
    sshd_pool: SshdPool, runs: Runs, tmp_path: Path
) -> None:
    """The session dies while a kill waits out its grace period: no exit status comes back, so
    the outcome is unknown (never success); after reconnecting the host is re-listed and the kill
    is reconciled, and sending it again is harmless."""
    server = sshd_pool.start("drop")
    cfg = server.host_config("drop")
    target = runs.start(tmp_path / "w", ["--datasets", "B1"], ignore_term=True)
    host = SSHHost(cfg)
    try:
        from supervisor.config import Config

        config = Config(hosts=[cfg])
        (listed,) = [p for p in await list_processes(host, config) if p.identity.pid == target.pid]
        identity = listed.identity
        pending = asyncio.ensure_future(kill(host, identity, grace=3.0))
        # Wait until the agent has sent SIGTERM (the target ignores it), then cut the session.
        await asyncio.to_thread(
            wait_until, lambda: runs.got_sigterm(target), 20, what="SIGTERM to arrive"
        )
        server.signal_sessions(signal.SIGKILL)
        with pytest.raises(OutcomeUnknown) as info:
            await asyncio.wait_for(pending, 60)
        assert "outcome unknown" in str(info.value)
        assert not host.connected
        # Reconnect, re-list, reconcile: the agent finished the kill although its session died.
        state = await reconcile(host, identity)
        if state.alive:
            await asyncio.wait_for(_until_gone(host, identity), 30)
        assert target.wait(timeout=10) == -signal.SIGKILL
        listed_now = [p.identity.pid for p in await list_processes(host, config)]
        assert target.pid not in listed_now
        again = await kill_or_reconcile(host, identity, grace=1.0)
        assert [r.outcome for r in again.results] == ["already-gone"]
        assert again.all_gone
    finally:
        await host.close()
        server.stop()


async def _until_gone(host: SSHHost, identity: Identity) -> None:
    while (await reconcile(host, identity)).alive:
        await asyncio.sleep(0.05)


async def test_s4_read_whose_session_dies_fails_and_reconnects(sshd_pool: SshdPool) -> None:
    """A request in flight when the session dies (no exit status ever comes) is an error, never
    an empty success; the next request reconnects."""
    server = sshd_pool.start("dies")
    host = SSHHost(server.host_config("dies", keepalive_interval=60))
    try:
        first = await host.connect()
        server.signal_sessions(signal.SIGSTOP)
        pending = asyncio.ensure_future(host.request("ps", {"scripts": ["run_inference.py"]}))
        server.signal_sessions(signal.SIGKILL)
        with pytest.raises(HostError) as info:
            await asyncio.wait_for(pending, 60)
        assert not isinstance(info.value, OutcomeUnknown)
        assert "connection lost during ps" in str(info.value)
        again = await host.request("ping", {})
        assert again["pong"] is True and host.hello is not None
        assert host.hello["pid"] != first["pid"]  # a new agent on a new connection
    finally:
        await host.close()
        server.stop()
