"""A connection lost while the channel reads or writes surfaces as HostError (or OutcomeUnknown
for an acting op), never as the transport's own exception. The transport here raises asyncssh's
real ``ConnectionLost`` exactly where an SSH stream raises it (``readline``, ``drain``); the
real-sshd drops are in tests/e2e/test_ssh_agent.py."""

from __future__ import annotations

import asyncio
import gc
import json
from typing import Any

import asyncssh
import pytest

from supervisor.agentclient import AgentClient
from supervisor.channel import AgentChannel, LineReader, LineWriter
from supervisor.errors import HostError, OutcomeUnknown
from supervisor.hosts import AgentHost, LocalHost
from tests.fixtures_procs import local_host_config
from tests.waiting import wait_for

HELLO = json.dumps({"id": 0, "ok": True, "result": {"hello": "runwatch-agent"}}) + "\n"


class Stream:
    """Both ends of an agent transport: lines (or an exception) fed to ``readline``; ``drain``
    raises ``drain_error`` once it is set."""

    def __init__(self) -> None:
        self.lines: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
        self.drain_error: BaseException | None = None
        self.sent: list[bytes] = []

    async def readline(self) -> bytes:
        item = await self.lines.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    async def drain(self) -> None:
        if self.drain_error is not None:
            raise self.drain_error


def lost() -> asyncssh.ConnectionLost:
    return asyncssh.ConnectionLost("Connection lost")


class LostHost(AgentHost):
    """An AgentHost whose transport loses its connection before the agent's hello."""

    def __init__(self, stream: Stream) -> None:
        super().__init__(local_host_config(connect_timeout=5.0, command_timeout=5.0))
        self.stream = stream

    async def _open_transport(self) -> tuple[LineReader, LineWriter, Any]:
        return self.stream, self.stream, lambda: ""

    async def _close_transport(self) -> None:
        pass


async def test_connection_lost_before_the_hello_is_a_host_error() -> None:
    stream = Stream()
    stream.lines.put_nowait(b"Welcome to the login banner\n")
    stream.lines.put_nowait(lost())
    with pytest.raises(HostError, match="connection lost before the agent was ready"):
        await LostHost(stream).connect()


async def test_connection_lost_while_sending_the_agent_is_a_host_error() -> None:
    stream = Stream()
    stream.drain_error = lost()
    with pytest.raises(HostError, match="could not start the agent"):
        await LostHost(stream).connect()


async def _started() -> tuple[Stream, AgentChannel]:
    stream = Stream()
    channel = AgentChannel(stream, stream, name="h")
    stream.lines.put_nowait(HELLO.encode())
    await channel.start(5.0)
    return stream, channel


@pytest.mark.parametrize(("op", "error"), [("ps", HostError), ("kill", OutcomeUnknown)])
async def test_connection_lost_during_a_read(op: str, error: type[Exception]) -> None:
    stream, channel = await _started()
    task = asyncio.ensure_future(channel.request(op, {}, timeout=30.0))
    while not stream.sent:  # the request is on its way before the connection goes
        await asyncio.sleep(0)
    stream.lines.put_nowait(lost())
    with pytest.raises(error, match="connection lost during " + op + ": Connection lost"):
        await asyncio.wait_for(task, 10)
    assert not channel.connected
    with pytest.raises(HostError, match="not connected"):
        await channel.request("ping", {}, timeout=1.0)
    await channel.close()


@pytest.mark.parametrize(("op", "error"), [("ps", HostError), ("kill", OutcomeUnknown)])
async def test_connection_lost_during_a_send(op: str, error: type[Exception]) -> None:
    stream, channel = await _started()
    stream.drain_error = lost()
    with pytest.raises(error, match="could not send " + op):
        await channel.request(op, {}, timeout=5.0)
    await channel.close()


class KillLostStream(Stream):
    """An agent transport that answers like a host whose kill went through but whose reply was
    lost: the hello to every (re)connection, the connection lost after ``kill``, and ``probe``
    answered with ``probe_result``."""

    def __init__(self, probe_result: dict[str, Any]) -> None:
        super().__init__()
        self.probe_result = probe_result
        self.ops: list[str] = []

    def write(self, data: bytes) -> None:
        super().write(data)
        try:
            msg = json.loads(data)
        except ValueError:  # the agent's bundle: a (re)connection
            self.lines.put_nowait(HELLO.encode())
            return
        self.ops.append(msg["op"])
        if msg["op"] == "kill":
            self.lines.put_nowait(lost())
        elif msg["op"] == "probe":
            reply = {"id": msg["id"], "ok": True, "result": self.probe_result}
            self.lines.put_nowait((json.dumps(reply) + "\n").encode())


def _identity() -> Any:
    from supervisor.model import Identity

    return Identity(boot_id="b" * 32, pid=4242, start_time=777, uid=1000, argv=("python", "x.py"))


@pytest.mark.parametrize("alive", [False, True])
async def test_engine_kill_whose_reply_was_lost_is_audited_unknown_then_reconciled(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, alive: bool
) -> None:
    from supervisor import audit
    from supervisor.config import Config
    from supervisor.engine import Engine

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    probe = {"state": "alive" if alive else "gone", "alive": alive, "detail": "re-checked"}
    stream = KillLostStream(probe)
    host = LostHost(stream)
    engine = Engine(Config(path="t.toml", hosts=[host.cfg]), hosts={host.cfg.name: host})
    ident = _identity()
    try:
        if alive:
            with pytest.raises(OutcomeUnknown, match="still running"):
                await engine.kill(host.cfg.name, ident, 1.0, run="demo")
        else:
            report = await engine.kill(host.cfg.name, ident, 1.0, run="demo")
            assert report.reconciled and report.all_gone
    finally:
        await engine.aclose()
    assert stream.ops == ["kill", "probe"]  # reconciled, never sent again
    records = audit.read()
    assert [r["action"] for r in records] == ["kill", "kill"]
    first, second = records
    assert first["outcome"] == "unknown" and first["ok"] is False and not first["reconciled"]
    assert first["identity"]["pid"] == 4242 and first["run"] == "demo"
    assert second["reconciled"] is True
    if alive:
        assert second["outcome"] == "unknown" and second["ok"] is False
    else:
        assert second["ok"] is True and "already-gone" in second["steps"][0]["detail"]


async def test_a_cancelled_request_leaves_no_unretrieved_error_at_close(tmp_path: Any) -> None:
    """A request cancelled while the real agent works on it (a front end stopping cancels its
    refresh), then the host closed: nothing reports "Future exception was never retrieved"
    (W35; issue 38: `runwatch watch` printed it after "stopped")."""
    reported: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    data = tmp_path / "data.jsonl"
    data.write_text("")
    host = LocalHost(local_host_config(command_timeout=60.0))
    await host.connect()
    try:
        asking = asyncio.ensure_future(
            AgentClient(host).observe_files(paths=[str(data)], window_s=30.0, interval_s=0.5)
        )
        await wait_for(lambda: host._channel is not None and host._channel._pending, 20)
        asking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
    finally:
        await host.close()
    del asking
    gc.collect()  # a done future's unretrieved error is reported as it is collected
    assert not [c for c in reported if "never retrieved" in str(c.get("message"))], reported
