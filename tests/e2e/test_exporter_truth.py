"""The exporter tells what runwatch knows (``supervisor.exporter``): a host that does not answer is
unknown, not down; counters count every event; the exporter as a surface (idle connections,
processes outside the config, the key file)."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import Config, HostConfig, RunConfig, load_config
from supervisor.engine import Engine
from supervisor.errors import ConfigError
from supervisor.exporter import FleetCollector, serve
from supervisor.metricsserver import WORKERS
from tests.e2e.test_exporter import (
    collected,
    fetch,
    full_config,
    series,
    start_watcher,
    value,
)
from tests.fixtures_actions import DemoRun, raw_record, runwatch
from tests.fixtures_alerts import Receiver
from tests.fixtures_procs import FakeRuns
from tests.waiting import SCALE, wait_until

ARGV = ["python3", "run_inference.py", "--datasets", "B1", "--max-samples", "70"]


async def test_x5_a_running_run_on_a_host_that_does_not_answer_is_unknown_not_down(
    tmp_path: Path, fake_runs: FakeRuns
) -> None:
    """A real run on a host whose agent is frozen (SIGSTOP): the host is not up, its staleness
    grows, and the run has no ``runwatch_run_up`` (neither 0 nor its last 1) and the state
    ``unknown``; the rules page "host unreachable" for it (runwatch-rules.test.yml)."""
    work = tmp_path / "work"
    (work / "out" / "B1").mkdir(parents=True)
    proc = fake_runs.start(*ARGV[2:], cwd=work)
    config = Config(
        hosts=[HostConfig(name="there", local=True, command_timeout=60.0)],
        runs=[RunConfig(name="gen", host="there", workdir=str(work), argv=list(ARGV))],
    )
    collector = FleetCollector(config)
    async with Engine(config) as engine:
        snap = await engine.refresh()
        collector.publish(snap, [], 0)
        body = collected(collector)
        assert value(body, "runwatch_host_up", host="there") == 1
        assert value(body, "runwatch_run_up", run="gen") == 1, proc.pid
        fresh = value(body, "runwatch_host_staleness_seconds", host="there")
        hello = engine.host("there").hello
        assert hello is not None
        os.kill(int(hello["pid"]), signal.SIGSTOP)
        try:
            frozen = await engine.refresh(wait=1.0)
        finally:
            os.kill(int(hello["pid"]), signal.SIGCONT)
    collector.publish(frozen, [], 0)
    body = collected(collector)
    assert value(body, "runwatch_host_up", host="there") == 0
    assert value(body, "runwatch_run_up", run="gen") is None
    assert value(body, "runwatch_run_state", run="gen", state="unknown") == 1
    assert value(body, "runwatch_run_state", run="gen", state="running") == 0
    staleness = value(body, "runwatch_host_staleness_seconds", host="there")
    assert fresh == 0 and staleness is not None and staleness > 0


def test_x6_every_failed_delivery_attempt_counts(
    tmp_path: Path, state_home: Path, spawn: Callable[..., Any]
) -> None:
    """A real watcher whose alerts go to a receiver that answers 500 to every POST: each retry
    of the message is one more failed delivery, and the exported counter follows the receiver's
    count of POSTs (not the one message that failed)."""
    refusing = Receiver(status=500)
    try:
        demo = DemoRun(tmp_path, "http://127.0.0.1:9/v1")  # never launched: files written here
        b1 = demo.data_file("B1")
        b1.parent.mkdir(parents=True)
        b1.write_bytes(raw_record("B1-1", 7) + raw_record("B1-1", 9))  # a duplicate: an alert
        text = demo.config_path.read_text()
        text += f'\n[alerts]\nurls = ["{refusing.url()}"]\n'
        text += '\n[exporter]\nlisten = "127.0.0.1:0"\n'
        demo.config_path.write_text(text)
        url = start_watcher(spawn, demo.config_path, tmp_path / "watch.out")

        def counted_every_post() -> float | None:
            posts = len(refusing.bodies)
            failed = value(fetch(url), "runwatch_alert_deliveries_failed_total")
            return failed if posts >= 3 and failed == posts else None

        # Retries come 2, 4, 8 s apart: three POSTs within 14 s, each counted by the next tick.
        failed = wait_until(counted_every_post, 90, what="the counter at every failed POST")
        assert failed >= 3
    finally:
        refusing.close()


async def test_x7_a_stranger_with_many_datasets_is_one_count_and_no_pid_is_a_label(
    tmp_path: Path, fake_runs: FakeRuns
) -> None:
    """A process outside the config (another client with 40 datasets, each with a file) beside
    a configured run: only the configured run's series are exported, the stranger is one
    ``runwatch_strangers`` count on its host, and no label value holds a pid."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    (work / "out" / "B1").mkdir(parents=True)
    names = [f"S{i}" for i in range(40)]
    for name in names:
        (elsewhere / "out" / name).mkdir(parents=True)
        (elsewhere / "out" / name / "raw_responses.jsonl").write_bytes(raw_record(f"{name}-1"))
    ours = fake_runs.start(*ARGV[2:], cwd=work)
    stranger = fake_runs.start("--datasets", ",".join(names), "--output-dir", "out", cwd=elsewhere)
    config = Config(
        hosts=[HostConfig(name="here", local=True, command_timeout=60.0)],
        runs=[RunConfig(name="gen", host="here", workdir=str(work), argv=list(ARGV))],
    )
    collector = FleetCollector(config)
    async with Engine(config) as engine:
        snap = await engine.refresh()
    (host,) = snap.hosts
    assert any(not r.configured and r.datasets for r in host.runs), "the stranger is seen"
    collector.publish(snap, [], 0)
    body = collected(collector)
    assert value(body, "runwatch_run_up", run="gen") == 1, ours.pid
    by_name = series(body)
    runs = {
        labels["run"] for samples in by_name.values() for labels, _ in samples if "run" in labels
    }
    assert runs == {"gen"}
    datasets = {labels["dataset"] for labels, _ in by_name["runwatch_dataset_records"]}
    assert datasets == {"B1"}
    pids = [
        (name, labels)
        for name, samples in by_name.items()
        for labels, _ in samples
        if any(str(stranger.pid) in v or "(pid " in v for v in labels.values())
    ]
    assert pids == []
    # Other clients on this machine are strangers too: the count is the host's, one each.
    strangers = sum(1 for r in host.runs if not r.configured)
    assert strangers >= 1 and value(body, "runwatch_strangers", host="here") == strangers


def test_x8_two_hundred_idle_connections_hold_no_thread_and_a_scrape_answers(
    tmp_path: Path,
) -> None:
    """200 connections to the real exporter that send nothing: the process's thread count stays
    within the accepting thread and the pool, a scrape is answered meanwhile, and each idle
    connection is closed by the server after its idle timeout."""
    config = full_config(tmp_path)
    before = threads()
    exporter = serve(config, "127.0.0.1:0")
    port = int(exporter.url.rsplit(":", 1)[1].split("/")[0])
    idle: list[socket.socket] = []
    try:
        for _ in range(200):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        body = fetch(exporter.url)  # accepted after the 200: they were all accepted before it
        assert "runwatch_events_total" in body
        assert threads() <= before + 1 + WORKERS, threads()

        def closed_by_server(sock: socket.socket) -> bool:
            sock.settimeout(60)
            return sock.recv(1) == b""  # EOF: the server closed it

        # Each recv blocks until the server closes that connection (its idle timeout).
        assert all(closed_by_server(s) for s in idle)
        assert "runwatch_events_total" in fetch(exporter.url)
    finally:
        for sock in idle:
            sock.close()
        exporter.close()


def threads() -> int:
    """Threads of this process, as the kernel counts them."""
    return len(os.listdir("/proc/self/task"))


async def test_x9_a_wall_clock_step_forward_leaves_the_exported_rates_as_they_were(
    tmp_path: Path, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's file grows while the engine refreshes; then the wall clock steps an hour forward
    and the file grows on at the same pace: the exported rate is still there and still of that
    pace (rates are timed by the monotonic clock), not an hour's worth of nothing.

    The step is injected at ``time.time`` of this process: a real step of the system clock needs
    CAP_SYS_TIME and would move every process on the machine, the host agent and other tests
    included. ``time.time`` is the wall clock every module of the engine reads; the agent, in a
    process of its own, keeps the real clock, as a remote host does when the laptop's steps."""
    work = tmp_path / "work"
    data = work / "out" / "B1" / "raw_responses.jsonl"
    data.parent.mkdir(parents=True)
    data.write_bytes(b"")
    argv = [*ARGV[:-1], "100000"]  # --max-samples far beyond what the test writes
    fake_runs.start(*argv[2:], cwd=work)
    config = Config(
        hosts=[HostConfig(name="here", local=True, command_timeout=60.0)],
        runs=[RunConfig(name="gen", host="here", workdir=str(work), argv=argv)],
    )
    collector = FleetCollector(config)
    written = 0

    async with Engine(config) as engine:

        async def rate_after_one_more() -> float | None:
            nonlocal written
            with data.open("ab") as f:
                f.write(raw_record(f"B1-{written}", 10))
            written += 1
            collector.publish(await engine.refresh(), [], 0)
            return value(
                collected(collector), "runwatch_dataset_output_tokens_per_second", dataset="B1"
            )

        deadline = time.monotonic() + 60 * SCALE
        while (before := await rate_after_one_more()) is None:
            assert time.monotonic() < deadline, "no rate within 60 s"
            await asyncio.sleep(0.05)  # the writer's pace (a record every refresh and 50 ms)
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 3600.0)
        after = await rate_after_one_more()
    assert after is not None, "the rate vanished with the clock step"
    assert before / 2 < after < before * 2, (before, after)


def test_x10_a_key_file_others_can_read_is_refused_naming_the_file_and_chmod_600(
    tmp_path: Path, state_home: Path
) -> None:
    """``[exporter] key_file`` a private key that others may read (0644, openssl's key beside a
    world-readable certificate): the config is refused at load, by ``runwatch watch`` too (exit
    2, no traceback), naming the file and the command that fixes it; once run, it loads."""
    key = tmp_path / "exporter key.pem"  # a space: the fix must still be a command that works
    made = subprocess.run(
        ["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
        capture_output=True,
    )
    assert made.returncode == 0, made.stderr
    key.write_bytes(made.stdout)
    key.chmod(0o644)
    demo = DemoRun(tmp_path, "http://127.0.0.1:9/v1")
    text = demo.config_path.read_text()
    text += f'\n[exporter]\ncert_file = "{tmp_path / "cert.pem"}"\nkey_file = "{key}"\n'
    demo.config_path.write_text(text)

    with pytest.raises(ConfigError) as refused:
        load_config(demo.config_path)
    assert str(key) in refused.value.message and "readable" in refused.value.message
    fix = refused.value.hint
    assert fix == f"chmod 600 {shlex.quote(str(key))}"
    watched = runwatch("-c", str(demo.config_path), "watch", "--metrics-listen", "127.0.0.1:0")
    assert watched.returncode == 2, watched.stdout + watched.stderr
    assert str(key) in watched.stderr and "chmod 600" in watched.stderr
    assert "Traceback" not in watched.stderr

    assert subprocess.run(shlex.split(fix or "")).returncode == 0
    assert load_config(demo.config_path).exporter.key_file == str(key)
