"""Restart of a real demo run on the local host: checks, kill by identity, repair, relaunch."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from supervisor import audit
from supervisor.argv import apply_overrides, argv_diff, parse_sets
from supervisor.fingerprint import compare_fingerprints
from supervisor.plan import Step, make_plan
from supervisor.steps import execute
from tests import fixtures_actions as actions
from tests.fixtures_actions import (
    API_KEY,
    DemoRun,
    engine_for,
    pid_alive,
    raw_record,
    run_pids,
    sha256_of,
    why,
    write_legacy,
)
from tests.waiting import wait_until


async def wait_async(cond: Any, timeout: float = 60.0) -> None:
    await asyncio.to_thread(wait_until, cond, timeout)


async def started(engine: Any, demo: DemoRun, min_records: int = 3, ds: str = "B1") -> int:
    result = await actions.launch(engine, "demo")
    assert result.ok, why(result)
    pid = result.identity["pid"] if result.identity else 0
    await wait_async(lambda: len(demo.complete_ids(ds)) >= min_records)
    return int(pid)


def assert_exact(demo: DemoRun, ds: str, count: int) -> None:
    raw = demo.data_file(ds).read_bytes()
    assert raw.endswith(b"\n"), f"{ds}: torn last line"
    ids = demo.complete_ids(ds)
    assert len(ids) == count, (ds, len(ids))
    assert len(set(ids)) == count, f"{ds}: duplicate sample ids"
    for line in raw.splitlines():
        rec = json.loads(line)
        assert rec["completion_tokens"] == len(rec["output_ids"])


async def test_restart_mid_flight_counts_every_sample_exactly_once(
    tmp_path: Path, state_home: Path, mock_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    demo = DemoRun(tmp_path, mock_endpoint.url, max_samples=30)
    kill_runs_in.append(demo.workdir)
    seen: list[tuple[str, str]] = []
    async with engine_for(demo) as engine:
        old_pid = await started(engine, demo)
        result = await actions.restart(
            engine,
            "demo",
            ["token-budget=100000000"],
            on_step=lambda s: seen.append((s.name, s.state)),
        )
    assert result.ok, why(result)
    names = [s.name for s in result.steps]
    assert names == [
        "preflight",
        "format-check",
        "fingerprint",
        "writers",
        "stop",
        "gpu-release",
        "quiet",
        "data-repair",
        "launch",
    ]
    # each step was reported live: running, then its outcome
    for name in names:
        states = [st for n, st in seen if n == name]
        assert states[-1] in ("ok", "skipped") and (states[0] == "running" or name == "gpu-release")
    new_pid = result.identity["pid"] if result.identity else None
    assert new_pid is not None and new_pid != old_pid
    assert not pid_alive(old_pid)
    assert result.identity is not None
    assert "--token-budget" in result.identity["argv"], result.identity
    assert {"flag": "--token-budget", "old": None, "new": "100000000"} in result.argv_diff
    # the new run finishes both datasets; every sample exactly once, no torn line
    await wait_async(lambda: not pid_alive(new_pid), timeout=120)
    for ds in demo.datasets:
        assert_exact(demo, ds, 30)
    assert run_pids(demo.workdir) == []
    # audited, and the key never in the audit log
    entries = audit.read()
    assert [e["action"] for e in entries] == ["launch", "restart"]
    assert entries[1]["ok"] is True and entries[1]["identity"]["pid"] == new_pid
    assert entries[1]["old_identity"]["pid"] == old_pid
    assert API_KEY not in (state_home / "audit.jsonl").read_text()
    assert API_KEY not in json.dumps(result.to_json())
    environ = Path(f"/proc/{new_pid}/environ") if pid_alive(new_pid) else None
    assert environ is None or API_KEY.encode() in environ.read_bytes()


async def test_legacy_data_blocks_the_restart_and_changes_nothing(
    tmp_path: Path, state_home: Path, slow_demo: DemoRun
) -> None:
    legacy = slow_demo.data_file("B2")
    async with engine_for(slow_demo) as engine:
        old_pid = await started(engine, slow_demo, min_records=1)
        # older data of a dataset the running process has not reached yet
        write_legacy(legacy, 5)
        b1_before = slow_demo.data_file("B1").read_bytes()
        before = {p: sha256_of(p) for p in (tmp_path / "work").rglob("*") if p.is_file()}
        result = await actions.restart(engine, "demo", ["token-budget=5000"], move_aside=False)
        assert not result.ok
        failed = result.failed_step
        assert failed is not None and failed.name == "format-check"
        assert str(legacy) in failed.detail and "legacy" in failed.detail
        assert "line 1" in failed.detail and "output_ids" in failed.detail
        assert "--move-aside" in failed.detail
        assert [s.state for s in result.steps][:2] == ["ok", "failed"]
        assert [s.state for s in result.steps][2:] == ["pending"] * 7
        # the old run was left alone, every byte is as it was
        assert pid_alive(old_pid) and run_pids(slow_demo.workdir) == [old_pid]
        after = {p: sha256_of(p) for p in (tmp_path / "work").rglob("*") if p.is_file()}
        b1 = slow_demo.data_file("B1")
        grown = {b1, slow_demo.workdir / "logs" / "run.log"}  # written by the live run itself
        assert {p: h for p, h in after.items() if p not in grown} == {
            p: h for p, h in before.items() if p not in grown
        }
        assert b1.read_bytes().startswith(b1_before)
        assert audit.read()[-1]["action"] == "restart" and audit.read()[-1]["ok"] is False


async def test_move_aside_keeps_every_byte_then_restarts(
    tmp_path: Path, state_home: Path, slow_demo: DemoRun, kill_runs_in: list[Path]
) -> None:
    legacy = slow_demo.data_file("B2")
    async with engine_for(slow_demo) as engine:
        old_pid = await started(engine, slow_demo, min_records=1)
        write_legacy(legacy, 5)
        digest = sha256_of(legacy)
        result = await actions.restart(engine, "demo", move_aside=True)
        assert result.ok, why(result)
        new_pid = result.identity["pid"] if result.identity else 0
        kill_runs_in.append(slow_demo.workdir)
    assert not pid_alive(old_pid) and pid_alive(new_pid)
    moved = list(legacy.parent.glob("raw_responses.jsonl.legacy-*"))
    assert len(moved) == 1 and sha256_of(moved[0]) == digest
    assert not legacy.exists()
    repair = next(s for s in result.steps if s.name == "data-repair")
    assert str(moved[0]) in repair.detail
    kinds = [e["action"] for e in audit.read()]
    assert kinds == ["launch", "move-aside", "restart"]


async def test_torn_tail_is_repaired_after_the_writer_is_gone(
    tmp_path: Path, state_home: Path, slow_demo: DemoRun
) -> None:
    torn = slow_demo.data_file("B2")
    complete = b"".join(raw_record(f"B2-{i:06d}") for i in range(4))
    async with engine_for(slow_demo) as engine:
        await started(engine, slow_demo, min_records=1)
        # a torn tail left by an earlier writer, in a dataset the live run has not reached
        torn.parent.mkdir(parents=True)
        torn.write_bytes(complete + raw_record("B2-000004")[:25])
        digest = sha256_of(torn)
        # a dry run checks but changes nothing: the torn tail stays while the run is alive
        dry = await actions.restart(engine, "demo", dry_run=True)
        assert dry.ok and dry.dry_run
        assert [s.state for s in dry.steps] == [
            "skipped",
            "ok",
            "ok",
            "ok",
            "skipped",
            "skipped",
            "skipped",
            "skipped",
            "skipped",
        ]
        assert sha256_of(torn) == digest and not list(torn.parent.glob("*.broken*"))
        result = await actions.restart(engine, "demo")
        assert result.ok, why(result)
    backup = torn.parent / "raw_responses.jsonl.broken"
    assert sha256_of(backup) == digest
    assert torn.read_bytes().startswith(complete)
    assert b"B2-000004" not in torn.read_bytes()[: len(complete)]
    repair = next(s for s in result.steps if s.name == "data-repair")
    assert "repaired" in repair.detail and str(backup) in repair.detail
    assert [e["action"] for e in audit.read()] == ["launch", "repair", "restart"]


async def test_fingerprint_change_blocks_unless_allowed(
    tmp_path: Path, state_home: Path, slow_demo: DemoRun
) -> None:
    async with engine_for(slow_demo) as engine:
        old_pid = await started(engine, slow_demo, min_records=1)
        blocked = await actions.restart(engine, "demo", ["temperature=0.9", "model=other-model"])
        assert not blocked.ok
        step = blocked.failed_step
        assert step is not None and step.name == "fingerprint"
        assert "temperature (absent) -> 0.9" in step.detail
        assert "model 'demo-model' -> 'other-model'" in step.detail
        assert "--allow-change" in step.detail
        assert pid_alive(old_pid)
        partly = await actions.restart(
            engine, "demo", ["temperature=0.9", "model=other-model"], allow_change=["temperature"]
        )
        assert not partly.ok and partly.failed_step is not None
        assert "temperature (absent)" not in partly.failed_step.detail
        assert "model" in partly.failed_step.detail
        allowed = await actions.restart(
            engine, "demo", ["temperature=0.9"], allow_change=["sampling"]
        )
        assert allowed.ok, why(allowed)
        assert not pid_alive(old_pid)
    stored = json.loads((slow_demo.workdir / "data/.runwatch/B1.launch.json").read_text())
    assert stored["sampling"] == {"temperature": "0.9"}
    assert stored["identity"]["pid"] == (allowed.identity or {}).get("pid")
    prompts = slow_demo.workdir / "prompts" / "B1.jsonl"
    assert stored["prompts"]["B1"]["sha256"] == sha256_of(prompts)


async def test_prompt_change_blocks_the_restart(
    tmp_path: Path, state_home: Path, slow_demo: DemoRun
) -> None:
    async with engine_for(slow_demo) as engine:
        old_pid = await started(engine, slow_demo, min_records=1)
        prompts = slow_demo.workdir / "prompts" / "B2.jsonl"
        prompts.write_bytes(prompts.read_bytes() + b'{"sample_id": "new", "messages": []}\n')
        result = await actions.restart(engine, "demo")
        assert result.failed_step is not None and result.failed_step.name == "fingerprint"
        assert "prompts of B2 changed" in result.failed_step.detail
        assert pid_alive(old_pid)


async def test_concurrent_restarts_leave_exactly_one_run(
    tmp_path: Path, state_home: Path, slow_demo: DemoRun
) -> None:
    async with engine_for(slow_demo) as first, engine_for(slow_demo) as second:
        old_pid = await started(first, slow_demo, min_records=1)
        plans = [await make_plan(e, "demo", action="restart") for e in (first, second)]
        results = await asyncio.gather(execute(first, plans[0]), execute(second, plans[1]))
    oks = [r for r in results if r.ok]
    assert len(oks) == 1, [r.to_json() for r in results]
    loser = next(r for r in results if not r.ok)
    assert loser.failed_step is not None
    assert "already running" in loser.failed_step.detail
    assert not pid_alive(old_pid)
    wait_until(lambda: len(run_pids(slow_demo.workdir)) == 1, timeout=15)
    assert run_pids(slow_demo.workdir) == [(oks[0].identity or {}).get("pid")]


async def test_concurrent_launches_start_exactly_one(
    tmp_path: Path, state_home: Path, slow_demo: DemoRun
) -> None:
    async with engine_for(slow_demo) as first, engine_for(slow_demo) as second:
        plans = [await make_plan(e, "demo", action="launch") for e in (first, second)]
        results = await asyncio.gather(execute(first, plans[0]), execute(second, plans[1]))
    assert sorted(r.ok for r in results) == [False, True]
    loser = next(r for r in results if not r.ok)
    assert loser.failed_step is not None, why(loser)
    # refused by the lock: before touching data (lock seen held) or at the launch itself
    assert loser.failed_step.name in ("writers", "quiet", "data-repair", "launch"), why(loser)
    assert "already running" in loser.failed_step.detail
    winner = next(r for r in results if r.ok)
    assert run_pids(slow_demo.workdir) == [(winner.identity or {}).get("pid")]


async def test_launch_refuses_a_running_run_and_survives_the_agent(
    tmp_path: Path, state_home: Path, slow_demo: DemoRun
) -> None:
    from supervisor.errors import LaunchError

    async with engine_for(slow_demo) as engine:
        pid = await started(engine, slow_demo, min_records=1)
        with pytest.raises(LaunchError) as e:
            await actions.launch(engine, "demo")
        assert "already running" in str(e.value) and "restart" in str(e.value)
        agent_pid = engine.host("local").agent_pid
    # the engine is closed: its agent exited, the run did not (P10)
    wait_until(lambda: not pid_alive(agent_pid), timeout=15)
    assert pid_alive(pid)
    n = len(slow_demo.complete_ids("B1"))
    wait_until(lambda: len(slow_demo.complete_ids("B1")) > n, timeout=15)


async def test_a_run_that_dies_at_once_is_reported_with_its_log(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    # a long settle time costs nothing here: the host answers as soon as the process exits
    demo = DemoRun(
        tmp_path,
        slow_endpoint.url,
        extra_argv=("--concurrency", "0"),
        run_toml="settle_seconds = 60",
    )
    async with engine_for(demo) as engine:
        result = await actions.launch(engine, "demo")
    assert not result.ok
    step = result.failed_step
    assert step is not None and step.name == "launch"
    assert "exited with status 2 within 60.0 s" in step.detail
    assert "--concurrency must be at least 1" in step.detail
    assert run_pids(demo.workdir) == []


async def test_missing_api_key_is_a_clear_error(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from supervisor.errors import LaunchError

    monkeypatch.delenv("RW_DEMO_API_KEY")
    demo = DemoRun(tmp_path, slow_endpoint.url)
    async with engine_for(demo) as engine:
        with pytest.raises(LaunchError) as e:
            await actions.launch(engine, "demo")
    assert "RW_DEMO_API_KEY is not set" in str(e.value)
    assert run_pids(demo.workdir) == []


def test_overrides_replace_or_append() -> None:
    argv = ["python3", "run_inference.py", "--max-samples", "7000", "--temperature=0.6"]
    pairs = parse_sets(["token-budget=10000000", "max-samples=10", "--temperature=1"])
    assert apply_overrides(argv, pairs) == [
        "python3",
        "run_inference.py",
        "--max-samples",
        "10",
        "--temperature=1",
        "--token-budget",
        "10000000",
    ]
    hostile = apply_overrides(argv, parse_sets(["note=$(touch /tmp/x); rm -rf ~"]))
    assert hostile[-2:] == ["--note", "$(touch /tmp/x); rm -rf ~"]
    from supervisor.errors import UsageError

    for bad in ("=5", "a b=1", "", "-"):
        with pytest.raises(UsageError):
            parse_sets([bad])
    assert parse_sets(["resume", "--token-budget"]) == [
        ("--resume", None),
        ("--token-budget", None),
    ]


def test_argv_diff() -> None:
    old = ["python3", "r.py", "--max-samples", "7000", "--model", "m"]
    new = ["python3", "r.py", "--max-samples", "7000", "--model", "n", "--token-budget", "5"]
    assert argv_diff(old, new) == [
        {"flag": "--model", "old": "m", "new": "n"},
        {"flag": "--token-budget", "old": None, "new": "5"},
    ]


def test_compare_fingerprints() -> None:
    stored = {
        "model": "m",
        "format": "raw",
        "sampling": {"temperature": "0.6"},
        "prompts": {"B1": {"sha256": "aa"}, "B2": {"sha256": "bb"}},
    }
    new = {"model": "m", "format": "raw", "sampling": {"temperature": "0.6"}}
    same = {"B1": {"sha256": "aa"}, "B2": {"sha256": "bb"}}
    assert compare_fingerprints(stored, new, same) == ([], [])
    changed = {"B1": {"sha256": "aa"}, "B2": {"sha256": "cc"}}
    blocking, allowed = compare_fingerprints(stored, new, changed)
    assert len(blocking) == 1 and "prompts of B2" in blocking[0] and allowed == []
    assert compare_fingerprints(stored, new, changed, ["prompts:B2"])[0] == []
    assert compare_fingerprints(None, new, changed) == ([], [])


def test_step_json() -> None:
    s = Step("launch", "t")
    assert s.to_json() == {"name": "launch", "ok": None, "state": "pending", "detail": "not run"}
    s.state, s.detail = "failed", "why"
    assert s.to_json()["ok"] is False


async def test_launch_whose_reply_is_lost_is_reconciled_never_repeated(
    tmp_path: Path, state_home: Path, slow_demo: DemoRun
) -> None:
    import os
    import signal

    lock = slow_demo.workdir / "data" / ".runwatch" / "B1.lock"

    def holder_running() -> bool:
        try:
            return json.loads(lock.read_text()).get("state") == "running"
        except (OSError, ValueError):
            return False

    async with engine_for(slow_demo) as engine:
        plan = await make_plan(engine, "demo", action="launch")
        host = engine.host("local")
        agent = host.agent_pid
        task = asyncio.create_task(execute(engine, plan))
        # the child is started and holds the lock; the agent dies before it can answer (P8)
        await wait_async(holder_running, timeout=30)
        os.kill(agent, signal.SIGKILL)
        result = await task
        assert result.ok, why(result)
        assert host.agent_pid != agent  # reconnected to ask the host what happened
        launch = result.steps[-1]
        assert "confirmed from the run's lock" in launch.detail
    pid = (result.identity or {})["pid"]
    assert run_pids(slow_demo.workdir) == [pid]
    entries = audit.read()
    assert [e["action"] for e in entries] == ["launch"] and entries[0]["ok"] is True


FAKE_NVIDIA_SMI = """#!/bin/sh
# A stand-in nvidia-smi: the pids listed in $RW_GPU_DIR/holders hold GPU memory for as many
# compute-apps queries as $RW_GPU_DIR/countdown says, then none do.
dir="$RW_GPU_DIR"
case "$1" in
  --query-compute-apps*)
    n=$(cat "$dir/countdown" 2>/dev/null || echo 0)
    if [ "$n" -gt 0 ]; then
      echo $((n - 1)) > "$dir/countdown"
      cat "$dir/holders"
    fi
    ;;
  *) echo "0, Fake GPU, 1000, 80000, 5" ;;
esac
"""


async def test_restart_waits_for_the_gpu_memory_to_be_released(
    tmp_path: Path,
    state_home: Path,
    slow_demo: DemoRun,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(FAKE_NVIDIA_SMI)
    fake.chmod(0o755)
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("RW_GPU_DIR", str(gpu))
    async with engine_for(slow_demo) as engine:
        old_pid = await started(engine, slow_demo, min_records=1)
        assert engine.host("local").hello["has_nvidia_smi"] is True
        plan = await make_plan(engine, "demo", action="restart")
        # the stopped run's memory is released only after three more queries
        (gpu / "holders").write_text(f"{old_pid}, 70000\n")
        (gpu / "countdown").write_text("3\n")
        result = await execute(engine, plan)
        assert result.ok, why(result)
        step = next(s for s in result.steps if s.name == "gpu-release")
        assert step.state == "ok" and "released after" in step.detail and "4 checks" in step.detail
        assert (gpu / "countdown").read_text().strip() == "0"
        tail = await engine.tail_log("local", "demo", 50)
    assert tail.exists and any("datasets B1,B2" in line for line in tail.lines)
    assert all(API_KEY not in line for line in tail.lines)


async def test_two_runs_sharing_an_output_dir_do_not_block_each_other(
    tmp_path: Path, state_home: Path, slow_demo: DemoRun
) -> None:
    from supervisor.demo.prompts import write_prompts

    write_prompts(slow_demo.workdir / "prompts", ["B3"], 50)
    argv = list(slow_demo.argv)
    argv[argv.index("--datasets") + 1] = "B3"
    with slow_demo.config_path.open("a") as f:
        f.write(
            '\n[[runs]]\nname = "demo-b3"\nhost = "local"\n'
            f"workdir = {json.dumps(str(slow_demo.workdir))}\n"
            "argv = [" + ", ".join(json.dumps(a) for a in argv) + "]\n"
            'output_dir = "data"\nlog = "logs/b3.log"\nendpoint = "mock"\n'
        )
    async with engine_for(slow_demo) as engine:
        first = await actions.launch(engine, "demo")
        second = await actions.launch(engine, "demo-b3")
        assert first.ok and second.ok, why(second)
        again = await actions.restart(engine, "demo-b3")
        assert again.ok, why(again)
    side = slow_demo.workdir / "data" / ".runwatch"
    assert sorted(p.name for p in side.glob("*.lock")) == ["B1.lock", "B2.lock", "B3.lock"]
    assert json.loads((side / "B3.launch.json").read_text())["run"] == "demo-b3"
    assert json.loads((side / "B1.launch.json").read_text())["run"] == "demo"
    first_pid = (first.identity or {})["pid"]
    assert pid_alive(first_pid)
    assert sorted(run_pids(slow_demo.workdir)) == sorted([first_pid, (again.identity or {})["pid"]])
