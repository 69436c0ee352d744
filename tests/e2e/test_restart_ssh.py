"""Launch and restart over a real sshd on 127.0.0.1: the same agent, reached through SSH."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from supervisor import audit
from tests import fixtures_actions as actions
from tests.fixtures_actions import (
    API_KEY,
    DemoRun,
    engine_for,
    host_toml,
    pid_alive,
    run_pids,
    sha256_of,
    why,
    write_legacy,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.ssh


def ssh_demo(tmp_path: Path, url: str, ssh_host_cfg: Any, **kw: Any) -> DemoRun:
    return DemoRun(
        tmp_path, url, host_toml=host_toml(ssh_host_cfg), host_name=ssh_host_cfg.name, **kw
    )


async def test_launched_run_outlives_the_ssh_connection(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    ssh_host_cfg: Any,
    sshd: Any,
    kill_runs_in: list[Path],
) -> None:
    demo = ssh_demo(tmp_path, slow_endpoint.url, ssh_host_cfg, max_samples=300)
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        result = await actions.launch(engine, "demo")
        assert result.ok, why(result)
        pid = (result.identity or {})["pid"]
        assert engine.host(ssh_host_cfg.name).connected
    # the engine closed its SSH connection: the agent is gone, the run goes on writing (P10)
    assert pid_alive(pid)
    assert pid not in sshd.session_pids()
    n = len(demo.complete_ids("B1"))
    await asyncio.to_thread(wait_until, lambda: len(demo.complete_ids("B1")) > n + 1, 60)
    assert run_pids(demo.workdir) == [pid]
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert (
        API_KEY.encode() in environ
        and API_KEY.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    )


async def test_restart_over_ssh_counts_every_sample_once(
    tmp_path: Path,
    state_home: Path,
    mock_endpoint: Any,
    ssh_host_cfg: Any,
    kill_runs_in: list[Path],
) -> None:
    demo = ssh_demo(tmp_path, mock_endpoint.url, ssh_host_cfg, max_samples=25)
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        first = await actions.launch(engine, "demo")
        assert first.ok, why(first)
        await asyncio.to_thread(wait_until, lambda: len(demo.complete_ids("B1")) >= 3, 60)
        result = await actions.restart(engine, "demo", ["token-budget=100000000"])
        assert result.ok, why(result)
    new_pid = (result.identity or {})["pid"]
    assert not pid_alive((first.identity or {})["pid"])
    await asyncio.to_thread(wait_until, lambda: not pid_alive(new_pid), 120)
    for ds in demo.datasets:
        raw = demo.data_file(ds).read_bytes()
        assert raw.endswith(b"\n")
        ids = demo.complete_ids(ds)
        assert len(ids) == 25 and len(set(ids)) == 25
    assert [e["action"] for e in audit.read()] == ["launch", "restart"]
    assert all(e["host"] == ssh_host_cfg.name for e in audit.read())


async def test_legacy_blocks_over_ssh_and_move_aside_keeps_bytes(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    ssh_host_cfg: Any,
    kill_runs_in: list[Path],
) -> None:
    demo = ssh_demo(tmp_path, slow_endpoint.url, ssh_host_cfg, max_samples=300)
    kill_runs_in.append(demo.workdir)
    legacy = demo.data_file("B2")
    async with engine_for(demo) as engine:
        first = await actions.launch(engine, "demo")
        assert first.ok, why(first)
        old_pid = (first.identity or {})["pid"]
        write_legacy(legacy, 4)
        digest = sha256_of(legacy)
        blocked = await actions.restart(engine, "demo")
        assert not blocked.ok and blocked.failed_step is not None
        assert (
            blocked.failed_step.name == "format-check" and str(legacy) in blocked.failed_step.detail
        )
        assert pid_alive(old_pid) and sha256_of(legacy) == digest
        moved = await actions.restart(engine, "demo", move_aside=True)
        assert moved.ok, why(moved)
    assert not pid_alive(old_pid)
    (aside,) = legacy.parent.glob("raw_responses.jsonl.legacy-*")
    assert sha256_of(aside) == digest
