"""The host agent's protocol: constant bootstrap, banner-proof framing, errors, life cycle."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest

from supervisor import hosts
from supervisor.channel import AgentChannel
from supervisor.errors import AgentError, ConfigError, HostError
from supervisor.hosts import Host, LocalHost, bootstrap_argv, bundle_payload
from tests.fixtures_procs import FakeRuns, gone, local_host_config
from tests.waiting import wait_until


def test_bootstrap_is_constant_and_has_no_shell_hazards() -> None:
    argv = bootstrap_argv()
    assert argv == bootstrap_argv()
    assert argv[:2] == ["sh", "-c"]
    loader = argv[2].split('-c "', 1)[1]
    # Inside the loader: nothing a login shell (sh, csh, fish) would expand or split.
    for ch in "'\"$`\\!":
        assert ch not in loader.rstrip('"')
    assert hosts.bootstrap_command() == f"sh -c '{argv[2]}'"


def test_bundle_carries_the_interpreter_line_then_the_agent() -> None:
    payload = bundle_payload("/opt/py/bin/python3", ["~/out/B1.jsonl"])
    first, length, rest = payload.split(b"\n", 2)
    assert first == b"/opt/py/bin/python3"
    stage2, early = rest[: int(length)], rest[int(length) :]
    assert json.loads(early) == {"count": ["~/out/B1.jsonl"]} and early.endswith(b"\n")
    assert json.loads(bundle_payload("py").split(b"\n")[-2]) == {"count": []}
    rest = stage2
    for module in ("supervisor.agent.server", "supervisor.agent.proc", "supervisor.agent.formats"):
        assert module.encode() in rest
    for bad in ("py\nthon", "", "a\rb", "x\0y"):
        with pytest.raises(ConfigError):
            bundle_payload(bad)


def test_bundled_modules_import_only_the_standard_library() -> None:
    stdlib = set(sys.stdlib_module_names)
    bundle = hosts.bundle_sources()
    for name, source in bundle.items():
        import ast

        for node in ast.walk(ast.parse(source)):
            mods: list[str] = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
            for m in mods:
                top = m.split(".")[0]
                assert top in stdlib or top in ("supervisor", "psutil"), (name, m)
                if top == "supervisor":
                    assert m in bundle, (name, m)


def test_hostile_python_path_is_data_not_shell(tmp_path: Path) -> None:
    """S5: the interpreter path is read by ``read -r`` and used quoted: nothing runs."""
    pwned = tmp_path / "pwned"
    for python in (f"$(touch {pwned})", f"`touch {pwned}`", f"python3; touch {pwned}"):
        proc = subprocess.run(
            bootstrap_argv(), input=bundle_payload(python), capture_output=True, timeout=30
        )
        assert proc.returncode != 0
        assert b"runwatch-agent" not in proc.stdout
    assert not pwned.exists()


class RawAgent:
    """The agent as a plain subprocess, for tests of what crosses its pipes byte for byte."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            bootstrap_argv(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[bytes] = self.proc.stdin
        self.stdout: IO[bytes] = self.proc.stdout
        self.stdin.write(bundle_payload(sys.executable))
        self.stdin.flush()

    def send(self, raw: bytes) -> None:
        self.stdin.write(raw)
        self.stdin.flush()

    def read_json(self) -> dict[str, Any]:
        while True:
            line = self.stdout.readline()
            assert line, "agent closed its output"
            if line.strip():
                msg = json.loads(line)
                assert isinstance(msg, dict)
                return msg

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


@pytest.fixture
def raw_agent() -> Any:
    agent = RawAgent()
    yield agent
    agent.close()


def test_agent_says_hello_then_ignores_garbage_and_answers(raw_agent: RawAgent) -> None:
    hello = raw_agent.read_json()
    assert hello["id"] == 0 and hello["ok"] is True
    assert hello["result"]["hello"] == "runwatch-agent"
    for key in ("boot_id", "python", "has_psutil", "has_nvidia_smi", "uid", "user", "pid"):
        assert key in hello["result"]
    raw_agent.send(
        b"Last login: Mon Nov 30 from 10.0.0.1\n"
        b"\n"
        b"{not json\n"
        b"[1, 2, 3]\n"
        b'{"no": "id"}\n'
        b'{"id": true, "op": "ping"}\n'
        b'{"id": 5, "op": 42}\n'
        b'{"id": 6, "op": "nope", "params": {}}\n'
        b'{"id": 7, "op": "ping"}\n'
    )
    replies = [raw_agent.read_json() for _ in range(3)]
    by_id = {r["id"]: r for r in replies}
    assert by_id[5]["ok"] is False and by_id[5]["kind"] == "bad-request"
    assert by_id[6]["ok"] is False and by_id[6]["kind"] == "unknown-op"
    assert by_id[7]["ok"] is True and by_id[7]["result"]["pong"] is True


def test_agent_exits_when_stdin_closes(raw_agent: RawAgent) -> None:
    assert raw_agent.read_json()["id"] == 0
    raw_agent.send(b'{"id": 1, "op": "ping"}\n')
    assert raw_agent.read_json()["id"] == 1
    raw_agent.stdin.close()
    assert raw_agent.proc.wait(timeout=15) == 0
    assert raw_agent.stdout.read() == b""


def test_agent_finishes_an_in_flight_kill_when_stdin_closes(
    raw_agent: RawAgent, fake_runs: FakeRuns
) -> None:
    """The laptop vanishes mid-kill: the agent still SIGKILLs after the grace, then exits."""
    run = fake_runs.start(ignore_term=True, children=1, child_ignore_term=True)
    hello = raw_agent.read_json()["result"]
    ident = {
        "boot_id": hello["boot_id"],
        "pid": run.pid,
        "start_time": run.start_time,
        "uid": os.getuid(),
        "argv": run.argv,
    }
    request = {"id": 1, "op": "kill", "params": {"identity": ident, "grace": 0.5}}
    raw_agent.send(json.dumps(request).encode() + b"\n")
    wait_until(lambda: run.term_count() >= 1, timeout=15)
    raw_agent.stdin.close()
    assert raw_agent.proc.wait(timeout=30) == 0
    assert gone(run.pid, run.start_time)
    assert all(gone(c) for c in run.children)


async def test_channel_skips_login_banners_and_fake_replies() -> None:
    """S6: banners before the agent starts (even JSON-looking ones, even without a newline)."""
    banner = (
        'echo "Welcome to gpu-box (GNU/Linux)"; '
        'printf \'{"id": 1, "ok": true, "result": {"fake": 1}}\\n\'; '
        'printf \'{"id": 0, "ok": true, "result": {"hello": "not-me"}}\\n\'; '
        "printf 'no newline at the end'; "
        'exec "$@"'
    )
    argv = ["sh", "-c", banner, "sh", *bootstrap_argv()]
    async with LocalHost(local_host_config(), argv=argv) as h:
        assert h.hello is not None and h.hello["hello"] == "runwatch-agent"
        first = await h.request("ping")
        assert first == {"pong": True, "time": first["time"]}


async def test_channel_fails_pending_requests_when_the_stream_ends() -> None:
    reader = asyncio.StreamReader()
    written: list[bytes] = []

    class Writer:
        def write(self, data: bytes) -> None:
            written.append(data)

        async def drain(self) -> None:
            return None

    ch = AgentChannel(reader, Writer(), name="h")
    hello_line = {"id": 0, "ok": True, "result": {"hello": "runwatch-agent"}}
    reader.feed_data(b"banner\n" + json.dumps(hello_line).encode() + b"\n")
    hello = await ch.start(5)
    assert hello["hello"] == "runwatch-agent" and ch.connected
    ping = asyncio.create_task(ch.request("ping", timeout=5))
    act = asyncio.create_task(ch.request("kill", {"identity": {}}, timeout=5))
    for _ in range(100):  # yield to the loop until both requests are written
        if len(written) == 2:
            break
        await asyncio.sleep(0)
    assert len(written) == 2
    reader.feed_data(b'{"id": 99, "ok": true, "result": {}}\n')  # nobody asked: ignored
    reader.feed_eof()
    with pytest.raises(HostError) as e1:
        await ping
    assert type(e1.value) is HostError
    from supervisor.errors import OutcomeUnknown

    with pytest.raises(OutcomeUnknown):
        await act
    assert not ch.connected
    with pytest.raises(HostError):  # type: ignore[unreachable]  # mypy keeps an earlier narrowing
        await ch.request("ping")


async def test_agent_errors_become_agent_error(host: Host) -> None:
    with pytest.raises(AgentError, match="unknown-op"):
        await host.request("no-such-op")
    with pytest.raises(AgentError, match="bad-request"):
        await host.request("kill", {"grace": 1})  # no identity
    with pytest.raises(AgentError, match="bad-request"):
        await host.request("ps", {"scripts": "run_inference.py"})
    assert (await host.request("ping"))["pong"] is True  # the channel survives errors


async def test_requests_overlap_and_match_by_id(host: Host) -> None:
    results = await asyncio.gather(*(host.request("ping") for _ in range(20)))
    assert all(r["pong"] for r in results)


async def test_refresh_scans_files_in_one_round_trip(host: Host, tmp_path: Path) -> None:
    data = tmp_path / "B1" / "raw_responses.jsonl"
    data.parent.mkdir()
    data.write_text(
        json.dumps(
            {
                "sample_id": "a",
                "output_ids": [1, 2, 3],
                "prompt_tokens": 5,
                "completion_tokens": 3,
                "finish_reason": "stop",
            }
        )
        + "\n"
    )
    missing = tmp_path / "B2" / "raw_responses.jsonl"
    result = await host.request(
        "refresh",
        {"scripts": ["run_inference.py"], "files": [{"path": str(data)}, {"path": str(missing)}]},
    )
    assert set(result) >= {"time", "boot_id", "processes", "files", "gpu"}
    assert result["files"][str(data)]["state"] == "ok"
    assert result["files"][str(data)]["records"] == 1
    assert result["files"][str(missing)]["state"] == "missing"


async def test_local_host_close_leaves_no_agent_behind() -> None:
    h = LocalHost(local_host_config())
    await h.connect()
    pid = h.agent_pid
    assert pid is not None
    await h.close()
    assert gone(pid)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
