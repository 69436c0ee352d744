"""Alert delivery runs off the watch loop: a receiver that accepts and never answers and one on a
closed port never silence `runwatch watch` (a real process), later deaths still reach a working
receiver within two refreshes, a URL failing for `failing_minutes` is reported to the others, and
what was not delivered survives in the state dir (0600 files) for the next watcher. Real HTTP
receivers on loopback, real apprise."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import AlertsConfig
from supervisor.engine import Alerter, Event
from tests import fixtures_actions as actions
from tests.fixtures_actions import DemoRun
from tests.fixtures_alerts import Receiver
from tests.fixtures_sshd import free_port
from tests.waiting import wait_for, wait_until

INTERVAL = 2.0


class Hanging:
    """A listener that accepts every connection and never reads or answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def url(self) -> str:
        return f"json://127.0.0.1:{self.port}/hang"

    def close(self) -> None:
        self.closed.set()
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def hanging() -> Iterator[Hanging]:
    h = Hanging()
    yield h
    h.close()


def event(key: str) -> Event:
    return Event(
        kind="run-died",
        severity="critical",
        host="gpu-box",
        run="eagle3",
        title="eagle3",
        message=f"Run stopped ({key})",
        command="runwatch launch eagle3",
        key=key,
        time=1.0,
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def test_a_hanging_and_a_refusing_receiver_never_silence_the_watcher(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    receiver: Receiver,
    hanging: Hanging,
    spawn: Callable[..., Any],
) -> None:
    """On main the watcher waited on each delivery: after the first failures it printed
    nothing for a minute and more, and later deaths went unreported. Now every refresh prints
    its line, and a death reaches the working receiver before two more refreshes pass."""
    demo = DemoRun(
        tmp_path,
        slow_endpoint.url,
        datasets=("B1",),
        max_samples=400,
        prompts=400,
        budgets={"B1": 300},
    )
    kill_runs_in.append(demo.workdir)
    refused = f"json://127.0.0.1:{free_port()}/refused"
    demo.config_path.write_text(
        demo.config_path.read_text()
        + f'\n[alerts]\nurls = ["{hanging.url()}", "{refused}", "{receiver.url()}"]\n'
        + "delivery_timeout_seconds = 3\nfailing_minutes = 0.1\n"
    )
    import asyncio

    async def launch() -> int:
        async with actions.engine_for(demo) as engine:
            launched = await actions.launch(engine, "demo")
            assert launched.ok, actions.why(launched)
            return int((launched.identity or {})["pid"])

    pid = asyncio.run(launch())
    out = tmp_path / "watch.out"
    argv = [sys.executable, "-m", "supervisor.cli", "-c", str(demo.config_path), "watch"]
    watcher = spawn(
        [*argv, "--json", "--interval", str(INTERVAL)],
        stdout=out.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ},
    )

    def ticks() -> list[dict[str, Any]]:
        return [e for e in _lines(out) if "tick" in e]

    # The run passes its budget (warn): that alert goes to all three URLs; two of them fail,
    # and after failing_minutes the working one is told.
    wait_until(lambda: any("demo B1" in m for m in receiver.messages()), 120, what="over-budget")
    wait_until(
        lambda: sum("failing" in m for m in receiver.messages()) >= 2,
        60,
        what="the alerts that two URLs are failing",
    )
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: any("Run stopped" in m for m in receiver.messages()), 60, what="run-died")
    (arrived,) = [t for m, t in zip(receiver.messages(), receiver.times, strict=True)
                  if "Run stopped" in m]  # fmt: skip
    wait_until(lambda: any(t["time"] > arrived for t in ticks()), 30, what="a later refresh")
    watcher.send_signal(signal.SIGTERM)
    assert watcher.wait(60) == 0

    lines = _lines(out)
    (at,) = [i for i, e in enumerate(lines) if e.get("kind") == "run-died"]
    after = [e for e in lines[at:] if "tick" in e and e["time"] < arrived]
    assert len(after) <= 2, f"{len(after)} refreshes between the death and its alert"
    first = next(i for i, e in enumerate(lines) if "tick" in e)
    stamps = [e["time"] for e in lines[first:] if "tick" in e or "note" in e]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert max(gaps) <= 2 * INTERVAL, f"the watcher was silent for {max(gaps):.1f} s"
    notes = [e["note"] for e in lines if "note" in e]
    assert any(n.startswith("alert not delivered to json://127.0.0.1/***") for n in notes)
    assert any("failing for" in n for n in notes)
    assert notes[-2].endswith("alert(s) not delivered: kept for the next watcher")
    assert notes[-1] == "stopped"
    assert "Traceback" not in out.read_text()


async def test_undelivered_alerts_survive_a_restart_in_private_spool_files(
    tmp_path: Path,
) -> None:
    """Alerts for a receiver that is down stay in the spool (0600 files in 0700 directories)
    after the alerter stops; the next one sends them, in order, once the receiver is up."""
    port = free_port()
    spool = tmp_path / "state" / "alerts" / "cfg"
    cfg = AlertsConfig(urls=[f"json://127.0.0.1:{port}/hook"], delivery_timeout_seconds=3)
    first = Alerter(cfg, spool=spool)
    await first.submit([event("a"), event("b")])
    await wait_for(lambda: first.collect() or first.deliveries, 30, what="a failed attempt")
    first.close()
    files = sorted(spool.rglob("*.json"))
    assert len(files) == 2
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert b"Run stopped" in path.read_bytes()

    receiver = Receiver(port=port)
    try:
        second = Alerter(cfg, spool=spool)
        await second.flush()  # nothing new: the outboxes start with what the spool holds
        messages = receiver.wait(2)
        assert ["Run stopped (a)" in messages[0], "Run stopped (b)" in messages[1]] == [True] * 2
        await wait_for(lambda: not list(spool.rglob("*.json")), 30, what="the spool emptied")
        second.close()
    finally:
        receiver.close()


async def test_a_receiver_that_never_answers_does_not_hold_up_another(
    receiver: Receiver, hanging: Hanging
) -> None:
    """Each URL has its own worker: the working one gets every alert while the other hangs."""
    cfg = AlertsConfig(urls=[hanging.url(), receiver.url()], delivery_timeout_seconds=30)
    alerter = Alerter(cfg)
    for k in range(3):
        await alerter.submit([event(f"k{k}")])
    assert len(receiver.wait(3)) == 3
    assert alerter.waiting >= 1  # the hanging URL's messages, still queued
    alerter.close()
