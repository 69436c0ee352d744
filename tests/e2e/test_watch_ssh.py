"""The watcher over a real SSH host (OpenSSH sshd on 127.0.0.1): frozen sessions (SIGSTOP) and a
restarted sshd each give one host-lost and one host-back alert; the watcher keeps going and says
it reconnects."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from supervisor.config import AlertsConfig, Config, DatasetConfig, RunConfig
from supervisor.engine import Engine
from supervisor.watch import Watcher, WatchLock, watch
from tests.fixtures_alerts import Receiver
from tests.fixtures_data import make_raw
from tests.fixtures_sshd import SshdPool
from tests.waiting import wait_for

pytestmark = pytest.mark.ssh


def count(receiver: Receiver, text: str) -> int:
    return sum(text in m for m in receiver.messages())


async def test_the_watcher_survives_a_frozen_and_a_restarted_sshd(
    sshd_pool: SshdPool, tmp_path: Path, state_home: Path, receiver: Receiver
) -> None:
    server = sshd_pool.start("watch-flaky")
    work = tmp_path / "w"
    (work / "out" / "B1").mkdir(parents=True)
    make_raw(work / "out" / "B1" / "raw_responses.jsonl", 21, seed=3)
    config = Config(
        hosts=[server.host_config("gpu-box", command_timeout=8.0)],
        runs=[
            RunConfig(
                name="gen",
                host="gpu-box",
                workdir=str(work),
                argv=["python3", "run_inference.py", "--datasets", "B1"],
            )
        ],
        datasets={"B1": DatasetConfig(token_budget=10**9, max_samples=1000)},
        alerts=AlertsConfig(urls=[receiver.url()]),
    )
    lines: list[str] = []
    stop = asyncio.Event()
    try:
        async with Engine(config) as engine:
            watcher = Watcher(engine, emit=lines.append, interval=0.3)
            lock = WatchLock("", tmp_path / "locks")
            task = asyncio.ensure_future(watch(engine, stop, lock=lock, watcher=watcher))
            await wait_for(
                lambda: engine.last is not None and engine.last.hosts[0].connected,
                30,
                what="the first answer",
            )
            assert receiver.bodies == []  # nothing to say about a healthy host

            # 1. The sessions freeze (the host stops answering, TCP stays up): lost, then back.
            stopped = server.signal_sessions(signal.SIGSTOP)
            assert stopped
            await wait_for(lambda: count(receiver, "Host lost") == 1, 60, what="host lost")
            server.signal_sessions(signal.SIGCONT)
            await wait_for(lambda: count(receiver, "Host is back") == 1, 60, what="host back")

            # 2. sshd goes away (the host reboots) and comes back on the same port and key.
            server.stop()
            await wait_for(lambda: count(receiver, "Host lost") == 2, 60, what="lost again")
            ticks = watcher.ticks
            await wait_for(lambda: watcher.ticks >= ticks + 3, 60, what="refreshes while down")
            assert count(receiver, "Host lost") == 2  # once per loss, not per refresh
            server.restart()
            await wait_for(lambda: count(receiver, "Host is back") == 2, 90, what="back again")
            assert not task.done()
            stop.set()
            await asyncio.wait_for(task, 60)
    finally:
        server.stop()
    assert len(receiver.bodies) == 4, receiver.messages()
    lost = [m for m in receiver.messages() if "Host lost" in m]
    assert all("Act: runwatch ps gpu-box" in m for m in lost)
    text = "\n".join(lines)
    assert text.count("reconnecting to gpu-box with backoff") == 2
    assert text.count("INFO gpu-box: Host is back.") == 2
