"""The exporter tells what runwatch knows (``supervisor.exporter``): a host that does not answer is
unknown, not down; counters count every event; the exporter as a surface (idle connections,
processes outside the config, the key file)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from supervisor.config import Config, HostConfig, RunConfig
from supervisor.engine import Engine
from supervisor.exporter import FleetCollector
from tests.e2e.test_exporter import collected, value
from tests.fixtures_procs import FakeRuns

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
        collector.publish(snap, [], [])
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
    collector.publish(frozen, [], [])
    body = collected(collector)
    assert value(body, "runwatch_host_up", host="there") == 0
    assert value(body, "runwatch_run_up", run="gen") is None
    assert value(body, "runwatch_run_state", run="gen", state="unknown") == 1
    assert value(body, "runwatch_run_state", run="gen", state="running") == 0
    staleness = value(body, "runwatch_host_staleness_seconds", host="there")
    assert fresh == 0 and staleness is not None and staleness > 0
