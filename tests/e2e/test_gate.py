"""The launch and restart gate against the faults it exists to stop (real processes, real files).

Each test is named after the invariant it proves (``docs/reliability.md`` maps them):
1. a plan checks what it will launch; 4. no check passes on nothing; 5. checks come before the
stop and include the new command line; 6. runwatch never leaves a run down by its own hand;
7. no launch silently drops a safety flag; 11. states say what is known; 12. config values are
sane.
"""

from __future__ import annotations

import asyncio
import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor import audit, launchspec
from supervisor.argv import apply_overrides, parse_sets, remove_flags
from supervisor.config import load_config
from supervisor.errors import ConfigError
from supervisor.plan import make_plan
from supervisor.steps import execute
from tests.fixtures_actions import (
    DemoRun,
    engine_for,
    pid_alive,
    raw_record,
    run_pids,
    runwatch,
    sha256_of,
    why,
    write_legacy,
)
from tests.waiting import wait_until


async def launch(
    engine: Any, run: str, overrides: Any = (), *, dry_run: bool = False, **kw: Any
) -> Any:
    plan = await make_plan(engine, run, action="launch", overrides=overrides, **kw)
    return await execute(engine, plan, dry_run=dry_run)


async def restart(
    engine: Any, run: str, overrides: Any = (), *, on_step: Any = None, **kw: Any
) -> Any:
    plan = await make_plan(engine, run, action="restart", overrides=overrides, **kw)
    return await execute(engine, plan, on_step=on_step)


async def wait_async(cond: Any, timeout: float = 60.0) -> None:
    await asyncio.to_thread(wait_until, cond, timeout)


async def launched(engine: Any, demo: DemoRun, min_records: int = 2) -> int:
    result = await launch(engine, "demo")
    assert result.ok, why(result)
    assert result.identity is not None
    await wait_async(lambda: len(demo.complete_ids("B1")) >= min_records)
    return int(result.identity["pid"])


def step(result: Any, name: str) -> Any:
    return next(s for s in result.steps if s.name == name)


# --------------------------------------------------------------------------- 1. effective argv


async def test_inv1_plan_checks_effective_argv_datasets(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """``restart --set datasets=B2`` checks B2's file (legacy here) and stops nothing."""
    demo = DemoRun(tmp_path, slow_endpoint.url, datasets=("B1",), max_samples=300)
    kill_runs_in.append(demo.workdir)
    from supervisor.demo.prompts import write_prompts

    write_prompts(demo.workdir / "prompts", ("B2",), 50)
    legacy = demo.data_file("B2")
    write_legacy(legacy, 4)
    digest = sha256_of(legacy)
    async with engine_for(demo) as engine:
        old_pid = await launched(engine, demo)
        plan = await make_plan(engine, "demo", overrides=["datasets=B2"])
        assert plan.datasets == ["B2"]
        assert plan.layout.data_files == {"B2": str(legacy)}
        assert [Path(p).name for p in plan.locks] == ["B2.lock"]
        assert list(plan.fingerprints) == ["B2"]
        result = await execute(engine, plan)
    assert not result.ok
    failed = result.failed_step
    assert failed is not None and failed.name == "format-check", why(result)
    assert str(legacy) in failed.detail and "legacy" in failed.detail
    assert step(result, "stop").state == "pending"
    assert pid_alive(old_pid) and run_pids(demo.workdir) == [old_pid]
    assert sha256_of(legacy) == digest


async def test_inv1_plan_checks_effective_argv_output_dir(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """``--set output-dir=other`` checks, locks and fingerprints ``other/``, not the config's."""
    demo = DemoRun(tmp_path, slow_endpoint.url, datasets=("B1",))
    kill_runs_in.append(demo.workdir)
    other = demo.workdir / "other" / "B1" / "raw_responses.jsonl"
    write_legacy(other, 3)
    async with engine_for(demo) as engine:
        plan = await make_plan(engine, "demo", action="launch", overrides=["output-dir=other"])
        side = str(demo.workdir / "other" / ".runwatch")
        assert plan.paths["out"] == str(demo.workdir / "other")
        assert all(p.startswith(side) for p in plan.locks)
        assert all(p.startswith(side) for p in plan.fingerprints.values())
        result = await execute(engine, plan)
        # the same launch without the override is fine: the config's output dir is empty
        fine = await launch(engine, "demo", dry_run=True)
    assert not result.ok and result.failed_step is not None
    assert result.failed_step.name == "format-check" and str(other) in result.failed_step.detail
    assert run_pids(demo.workdir) == []
    assert fine.ok, why(fine)


# --------------------------------------------------------------------------- 4. nothing checked


def _no_datasets_config(tmp_path: Path, argv: list[str], extra: str = "") -> Path:
    work = tmp_path / "w"
    work.mkdir(exist_ok=True)
    cfg = tmp_path / "rw.toml"
    cfg.write_text(
        '[[hosts]]\nname = "here"\nlocal = true\n\n[[runs]]\nname = "gen"\nhost = "here"\n'
        f"workdir = {json.dumps(str(work))}\nargv = {json.dumps(argv)}\n{extra}"
    )
    return cfg


def test_inv4_run_without_data_files_is_an_error(tmp_path: Path, state_home: Path) -> None:
    cfg = _no_datasets_config(tmp_path, ["python3", "run_inference.py", "--model", "m"])
    for args in (("check", "gen"), ("launch", "gen", "--dry-run"), ("restart", "gen", "--yes")):
        out = runwatch(*args, "-c", str(cfg))
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "cannot determine the run's data files" in out.stderr, out.stderr
        assert "datasets = [...]" in out.stderr  # how to declare them
    # status says the run's data files are unknown, instead of showing no datasets
    out = runwatch("status", "-c", str(cfg), "--json")
    [run] = [r for r in json.loads(out.stdout)["hosts"][0]["runs"] if r["name"] == "gen"]
    assert run["state"] == "stopped" and run["datasets"] == []
    assert run["state_detail"].startswith("data files unknown: no `datasets` key"), run
    # a dataset name from the argv that escapes the output dir is no data file either
    cfg = _no_datasets_config(tmp_path, ["python3", "run_inference.py", "--datasets", "B1,.."])
    out = runwatch("check", "gen", "-c", str(cfg))
    assert out.returncode == 2 and "escape the output dir" in out.stderr, out.stderr


def test_inv4_check_over_zero_files_fails(tmp_path: Path, state_home: Path) -> None:
    cfg = _no_datasets_config(
        tmp_path, ["python3", "run_inference.py", "--datasets", "B1,B2", "--output-dir", "out"]
    )
    out = runwatch("check", "gen", "-c", str(cfg))
    assert out.returncode == 1, out.stdout
    assert "nothing to check" in out.stdout
    # one file present and valid: the others not started yet are fine
    data = tmp_path / "w" / "out" / "B1" / "raw_responses.jsonl"
    data.parent.mkdir(parents=True)
    data.write_bytes(raw_record("B1-000000"))
    out = runwatch("check", "gen", "-c", str(cfg))
    assert out.returncode == 0, out.stdout


def test_inv4_empty_config_is_an_error(tmp_path: Path, state_home: Path) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text("refresh_seconds = 2.0\n")
    for args in (("status",), ("ps",), ("guard",), ("launch", "x", "--yes")):
        out = runwatch(*args, "-c", str(empty))
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "no [[hosts]]" in out.stderr, out.stderr
    hosts_only = tmp_path / "hosts.toml"
    hosts_only.write_text('[[hosts]]\nname = "here"\nlocal = true\n')
    out = runwatch("guard", "-c", str(hosts_only))
    assert out.returncode == 2 and "no [[runs]]" in out.stderr, out.stderr


# --------------------------------------------------------------------------- 5. preflight


def test_inv5_typo_in_set_is_refused_before_the_stop(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """``restart demo --set token-buget=50000 --yes``: refused with a suggestion, run untouched."""
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    cfg = str(demo.config_path)
    out = runwatch("launch", "demo", "-c", cfg, "--yes")
    assert out.returncode == 0, out.stdout + out.stderr
    [pid] = run_pids(demo.workdir)
    before = len(demo.complete_ids("B1"))
    out = runwatch("restart", "demo", "-c", cfg, "--set", "token-buget=50000", "--yes")
    assert out.returncode == 1
    assert "--token-buget: not a flag of the client" in out.stdout, out.stdout
    assert "did you mean --token-budget?" in out.stdout
    assert "stopped at preflight" in out.stderr
    assert pid_alive(pid) and run_pids(demo.workdir) == [pid]
    # a flag that needs a value, given none; and one that takes none, given one
    out = runwatch("restart", "demo", "-c", cfg, "--set", "max-samples", "--json", "--yes")
    res = json.loads(out.stdout)
    assert out.returncode == 1 and res["steps"][0]["name"] == "preflight"
    assert "--max-samples: needs a value" in res["steps"][0]["detail"]
    out = runwatch("restart", "demo", "-c", cfg, "--set", "legacy-format=1", "--yes")
    assert out.returncode == 1 and "--legacy-format: takes no value" in out.stdout
    # the run kept writing the whole time
    wait_until(lambda: len(demo.complete_ids("B1")) > before, timeout=60)
    assert run_pids(demo.workdir) == [pid]
    # a removed flag is checked too
    out = runwatch("restart", "demo", "-c", cfg, "--unset", "temprature", "--dry-run")
    assert out.returncode == 1 and "did you mean --temperature?" in out.stdout


GEN = """
import argparse
open("ran", "w").close()
p = argparse.ArgumentParser()
p.add_argument("--datasets", required=True)
p.add_argument("--output-dir", default="out")
p.add_argument("--num_threads", type=int)
p.add_argument("--resume", action="store_true")
p.parse_args()
"""


@pytest.mark.ssh
async def test_inv5_flags_come_from_the_script_on_the_host(
    tmp_path: Path, state_home: Path, ssh_host_cfg: Any
) -> None:
    """Over SSH: the script named relative to the run's workdir is read there, statically (it
    would write a marker file if it ever ran)."""
    from tests.fixtures_actions import host_toml

    work = tmp_path / "work"
    work.mkdir()
    (work / "gen.py").write_text(GEN)
    cfg = tmp_path / "rw.toml"
    argv = [sys.executable, "gen.py", "--datasets", "B1"]
    # No profile describes gen.py: the output_dir key says where it writes without --output-dir.
    cfg.write_text(
        'scripts = ["gen.py"]\n'
        + host_toml(ssh_host_cfg)
        + f'[[runs]]\nname = "gen"\nhost = "{ssh_host_cfg.name}"\n'
        f'workdir = {json.dumps(str(work))}\nargv = {json.dumps(argv)}\noutput_dir = "out"\n'
    )
    from supervisor.engine import Engine

    async with Engine(load_config(cfg)) as engine:
        bad = await launch(
            engine, "gen", ["num-threads=4", "resume"], dry_run=True, unsets=["output_dir"]
        )
        good = await launch(
            engine, "gen", ["num_threads=4", "resume"], dry_run=True, unsets=["output-dir"]
        )
    pre = step(bad, "preflight")
    assert pre.state == "failed", why(bad)
    assert "--num-threads: not a flag of the client (did you mean --num_threads?)" in pre.detail
    assert "--output_dir: not a flag of the client (did you mean --output-dir?)" in pre.detail
    assert f"gen.py does not declare it (read statically on {ssh_host_cfg.name})" in pre.detail
    ok = step(good, "preflight")
    assert ok.state == "ok", why(good)
    assert f"(gen.py, read statically on {ssh_host_cfg.name})" in ok.detail
    assert "1 value(s) of the expected type" in ok.detail  # --num_threads 4 is an int
    assert good.ok, why(good)
    assert not (work / "ran").exists()


# --------------------------------------------------------------------------- 6. rollback


async def test_inv6_failed_relaunch_is_rolled_back(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """The new command line passes the preflight (``--concurrency 0`` is an int) but the client
    refuses it at once: the old one runs again."""
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        old_pid = await launched(engine, demo)
        result = await restart(engine, "demo", ["concurrency=0"])
        assert not result.ok
        failed = result.failed_step
        assert failed is not None and failed.name == "launch", why(result)
        assert "--concurrency must be at least 1" in failed.detail
        assert result.rollback is not None and result.rollback["ok"], result.rollback
        assert result.rollback["detail"].startswith("rolled back")
        new_pid = result.rollback["identity"]["pid"]
        assert new_pid != old_pid and not pid_alive(old_pid)
        assert run_pids(demo.workdir) == [new_pid]
        snap = await engine.refresh()
        [rv] = [r for h in snap.hosts for r in h.runs if r.name == "demo"]
        assert rv.state == "running" and rv.process is not None
        assert rv.process.identity.pid == new_pid
        argv = rv.process.identity.argv
        assert argv[argv.index("--concurrency") + 1] == "2"  # the previous command line
    # the spec of the failed launch was not kept; the rollback is in the audit log
    assert launchspec.load(load_config(demo.config_path).key, "demo").sets == []
    rolls = [e for e in audit.read() if e["action"] == "rollback"]
    assert len(rolls) == 1 and rolls[0]["ok"] is True
    restarts = [e for e in audit.read() if e["action"] == "restart"]
    assert restarts[-1]["ok"] is False and restarts[-1]["rollback"]["ok"] is True
    ids = demo.complete_ids("B1")
    assert len(ids) == len(set(ids))


async def test_inv6_a_failed_rollback_says_the_run_is_down(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    prompts = demo.workdir / "prompts"

    def break_prompts_once_stopped(s: Any) -> None:
        # After the stop nothing can start: the prompts are gone (a disk unmounted...).
        if s.name == "stop" and s.state == "ok":
            prompts.rename(demo.workdir / "prompts-gone")

    async with engine_for(demo) as engine:
        await launched(engine, demo)
        result = await restart(
            engine, "demo", ["token-budget=100000000"], on_step=break_prompts_once_stopped
        )
    assert not result.ok and result.failed_step is not None
    assert result.failed_step.name == "launch", why(result)
    assert result.rollback is not None and result.rollback["ok"] is False
    assert "ROLLBACK FAILED" in result.rollback["detail"]
    assert "the run is DOWN" in result.rollback["detail"]
    assert "runwatch launch demo" in result.rollback["detail"]
    assert run_pids(demo.workdir) == []
    rolls = [e for e in audit.read() if e["action"] == "rollback"]
    assert len(rolls) == 1 and rolls[0]["ok"] is False


# --------------------------------------------------------------------------- 7. launch spec


def test_inv7_bare_flags_set_and_unset() -> None:
    argv = ["python3", "gen.py", "--temperature", "0.6", "--top-k=-1", "--resume", "--seed", "-3"]
    assert apply_overrides(argv, parse_sets(["resume"])) == argv
    assert apply_overrides(["gen.py"], parse_sets(["resume"])) == ["gen.py", "--resume"]
    assert apply_overrides(["gen.py", "--resume", "--x"], parse_sets(["resume=1"])) == [
        "gen.py",
        "--resume",
        "1",
        "--x",
    ]
    assert remove_flags(argv, ["--temperature", "--top-k", "--resume", "--seed"]) == [
        "python3",
        "gen.py",
    ]
    assert apply_overrides(argv, [("--temperature", None)])[2:4] == ["--temperature", "--top-k=-1"]
    # a value that reads as an option is joined to its flag, so the client parses it as a value
    assert apply_overrides(["gen.py", "--note", "x"], parse_sets(["note=--evil"])) == [
        "gen.py",
        "--note=--evil",
    ]
    assert apply_overrides(["gen.py"], parse_sets(["seed=-3"])) == ["gen.py", "--seed", "-3"]


async def test_inv7_set_becomes_the_launch_spec(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """A restart's ``--set`` stays for the next plain ``launch``; ``--reset`` drops it."""
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300, extra_argv=("--temperature", "1"))
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        await launched(engine, demo)
        result = await restart(
            engine, "demo", ["token-budget=100000000"], allow_change=["temperature"]
        )
        assert result.ok, why(result)
        assert result.identity is not None and "--token-budget" in result.identity["argv"]
        path = launchspec.spec_path(engine.config.key, "demo")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        snap = await engine.refresh()
        [rv] = [r for h in snap.hosts for r in h.runs if r.name == "demo"]
        assert rv.process is not None
        report = await engine.kill("local", rv.process.identity, 5.0)
        assert report.all_gone
        # a later plain launch keeps the budget, and says what changed since the last launch
        plan = await make_plan(engine, "demo", action="launch")
        assert "--token-budget" in plan.argv
        assert "since the last launch: same command line" in "\n".join(plan.describe())
        # --unset removes a flag of the config's argv, and the diff shows it
        plan = await make_plan(engine, "demo", action="launch", unsets=["temperature"])
        assert "--temperature" not in plan.argv and "--token-budget" in plan.argv
        diff = plan.last_launch_diff()
        assert diff == [{"flag": "--temperature", "old": "1", "new": None}]
        assert "    --temperature: 1 -> (absent)" in plan.describe()
        # --reset: back to the config's argv
        plan = await make_plan(engine, "demo", action="launch", reset=True)
        assert "--token-budget" not in plan.argv
        assert {"flag": "--token-budget", "old": "100000000", "new": None} in (
            plan.last_launch_diff() or []
        )


async def test_inv7_over_budget_launch_needs_a_budget_flag_or_force(
    tmp_path: Path, state_home: Path, slow_endpoint: Any
) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url, datasets=("B1",), budgets={"B1": 20})
    data = demo.data_file("B1")
    data.parent.mkdir(parents=True)
    data.write_bytes(b"".join(raw_record(f"B1-{i:06d}", tokens=10) for i in range(3)))
    async with engine_for(demo) as engine:
        refused = await launch(engine, "demo", dry_run=True)
        assert not refused.ok and refused.failed_step is not None
        assert refused.failed_step.name == "format-check"
        assert "B1: 30 completion tokens, budget 20" in refused.failed_step.detail
        assert "--set token-budget=N" in refused.failed_step.detail
        with_flag = await launch(engine, "demo", ["token-budget=20"], dry_run=True)
        assert with_flag.ok, why(with_flag)
        plan = await make_plan(engine, "demo", action="launch", force=True)
        forced = await execute(engine, plan, dry_run=True)
        assert forced.ok, why(forced)


# --------------------------------------------------------------------------- 11. states


async def test_inv11_unreachable_host_is_unknown(tmp_path: Path, state_home: Path) -> None:
    cfg = tmp_path / "rw.toml"
    cfg.write_text(
        '[[hosts]]\nname = "gone"\naddress = "127.0.0.1"\nport = 1\nconnect_timeout = 2.0\n'
        f"known_hosts = {json.dumps(str(tmp_path / 'known_hosts'))}\n"
        '[[runs]]\nname = "gen"\nhost = "gone"\nworkdir = "/w"\n'
        'argv = ["python3", "run_inference.py", "--datasets", "B1"]\n'
    )
    (tmp_path / "known_hosts").write_text("")
    from supervisor.engine import Engine

    async with Engine(load_config(cfg)) as engine:
        snap = await engine.refresh()
    [run] = snap.hosts[0].runs
    assert run.state == "unknown" and run.state_detail == "host unreachable"
    assert run.state_text == "unknown (host unreachable)"
    out = runwatch("status", "-c", str(cfg))
    assert "gen  unknown (host unreachable)" in out.stdout, out.stdout
    assert "stopped" not in out.stdout
    out = runwatch("status", "-c", str(cfg), "--json")
    runs = json.loads(out.stdout)["hosts"][0]["runs"]
    assert runs[0]["state"] == "unknown" and runs[0]["state_detail"] == "host unreachable"


def test_inv11_done_or_not_started_dataset_is_never_stalled() -> None:
    from supervisor.model import RunFlags
    from supervisor.rates import RateTracker, build_dataset_view

    def view(tracker: RateTracker, records: int, now: float, writer: object = 1) -> Any:
        scan = {
            "path": "/o/B1/raw_responses.jsonl",
            "state": "ok",
            "records": records,
            "completion_tokens": records * 10,
            "size": records * 100,
        }
        flags = RunFlags(max_samples=5)
        return build_dataset_view(
            scan, None, flags, tracker, None, True, now, stall_seconds=10.0, writer=writer
        )

    not_started = RateTracker()  # data from an earlier run; the live writer is elsewhere
    assert not view(not_started, 2, 0.0).stalled
    assert not view(not_started, 2, 100.0).stalled
    stuck = RateTracker()  # grew under this writer, then stopped short of its target
    view(stuck, 1, 0.0)
    view(stuck, 2, 1.0)
    assert view(stuck, 2, 100.0).stalled
    assert not view(stuck, 2, 200.0, writer=2).stalled  # a new process has not reached it yet
    done = RateTracker()  # reached --max-samples: finished, not stalled
    view(done, 4, 0.0)
    view(done, 5, 1.0)
    assert not view(done, 5, 100.0).stalled


async def test_inv11_all_done_client_reports_nothing_to_do(
    tmp_path: Path, state_home: Path, mock_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    demo = DemoRun(tmp_path, mock_endpoint.url, datasets=("B1",), max_samples=3)
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        first = await launch(engine, "demo")
        assert first.ok, why(first)
        await wait_async(lambda: not run_pids(demo.workdir) and len(demo.complete_ids("B1")) == 3)
        again = await launch(engine, "demo")
    assert again.ok and again.nothing_to_do, why(again)
    assert "nothing to do: all datasets done" in step(again, "launch").detail
    assert again.rollback is None
    out = runwatch("launch", "demo", "-c", str(demo.config_path), "--yes")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "demo: nothing to do: all datasets done" in out.stdout


async def test_inv11_exit_0_with_work_left_is_a_failed_launch(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """A client that exits 0 at once while a dataset is short is no success. (Here its own
    prompts dir holds the 2 prompts already answered, the config's prompts file 400; ``--help``
    was the way once, and is now refused before anything starts by the argument reading.)"""
    demo = DemoRun(tmp_path, slow_endpoint.url, datasets=("B1",), max_samples=40)
    kill_runs_in.append(demo.workdir)
    data = demo.data_file("B1")
    data.parent.mkdir(parents=True)
    data.write_bytes(raw_record("B1-000000") + raw_record("B1-000001"))
    few = demo.workdir / "few"
    few.mkdir()
    prompts = (demo.workdir / "prompts" / "B1.jsonl").read_bytes().splitlines(keepends=True)
    (few / "B1.jsonl").write_bytes(b"".join(prompts[:2]))
    with open(demo.config_path, "a") as f:
        f.write('\n[datasets.B1]\nprompts = "prompts/B1.jsonl"\n')
    async with engine_for(demo) as engine:
        helped = await launch(engine, "demo", ["help"])
        assert not helped.ok and helped.failed_step.name == "preflight", why(helped)
        assert "asks for the client's help" in helped.failed_step.detail
        result = await launch(engine, "demo", ["prompts-dir=few"])
    assert not result.ok and not result.nothing_to_do
    failed = result.failed_step
    assert failed is not None and failed.name == "launch", why(result)
    assert "exited 0 at once, but not every dataset is done: B1: 2/40 responses" in failed.detail
    assert (
        launchspec.load(load_config(demo.config_path).key, "demo").sets == []
    )  # a failed launch is not kept


async def test_inv11_a_client_stopped_by_its_own_token_budget_has_nothing_to_do(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """Every dataset has reached the command line's --token-budget (not its sample count): the
    client exits 0 at once with nothing left to generate, which is no failed launch."""
    demo = DemoRun(tmp_path, slow_endpoint.url, datasets=("B1",), max_samples=40)
    kill_runs_in.append(demo.workdir)
    data = demo.data_file("B1")
    data.parent.mkdir(parents=True)
    data.write_bytes(raw_record("B1-000000", tokens=30) + raw_record("B1-000001", tokens=30))
    async with engine_for(demo) as engine:
        result = await launch(engine, "demo", ["token-budget=50"])
    assert result.ok and result.nothing_to_do, why(result)
    assert "nothing to do: all datasets done" in step(result, "launch").detail
    assert run_pids(demo.workdir) == []


def test_inv11_errors_under_json_are_json(tmp_path: Path, state_home: Path) -> None:
    missing = tmp_path / "nope.toml"
    for args in (("status", "--json"), ("check", "gen", "--json"), ("launch", "x", "--json")):
        out = runwatch(*args, "-c", str(missing))
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        err = json.loads(out.stdout)
        assert "no such config file" in err["error"] and err["hint"], err
    out = runwatch("status", "--json", "--watch", "x", "-c", str(missing))
    assert out.returncode == 2 and "error" in json.loads(out.stdout)


def test_inv11_an_unknown_option_under_json_is_a_json_error(state_home: Path) -> None:
    """click stops at an unknown option before the --json option is processed."""
    for args in (("status", "--json", "--host", "x"), ("ps", "--grace", "3", "--json")):
        out = runwatch(*args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        err = json.loads(out.stdout)
        assert "No such option" in err["error"] and err["hint"], err


# --------------------------------------------------------------------------- 12. config values


@pytest.mark.parametrize(
    ("snippet", "key"),
    [
        ("[[hosts]]\ncommand_timeout = -1.0", "hosts[1].command_timeout"),
        ("[[hosts]]\nconnect_timeout = nan", "hosts[1].connect_timeout"),
        ("[[hosts]]\nkeepalive_interval = 0", "hosts[1].keepalive_interval"),
        ("[[runs]]\nstop_grace_seconds = -5.0", "runs[0].stop_grace_seconds"),
        ("[[runs]]\nsettle_seconds = inf", "runs[0].settle_seconds"),
        ("[[runs]]\nstall_seconds = -inf", "runs[0].stall_seconds"),
        ("top\nrefresh_seconds = 0", "refresh_seconds"),
        ("top\nrefresh_seconds = nan", "refresh_seconds"),
        ('[[runs]]\ndatasets = ["B1", ".."]', "runs[0].datasets[1]"),
        ('[[runs]]\ndatasets = ["/etc"]', "runs[0].datasets[0]"),
        ('[[runs]]\ndata_file = "../../x.jsonl"', "runs[0].data_file"),
        ('[[runs]]\ndata_file = "/tmp/x.jsonl"', "runs[0].data_file"),
        ('[datasets."../B1"]\ntoken_budget = 5', "datasets.../B1"),
        ("[[endpoints]]\nprice_out_per_m = -2.5", "endpoints[0].price_out_per_m"),
    ],
)
def test_inv12_config_values_are_sane(tmp_path: Path, snippet: str, key: str) -> None:
    section, _, line = snippet.partition("\n")
    top = line if section == "top" else ""
    body = {
        "[[hosts]]": '[[hosts]]\nname = "two"\nlocal = true\n',
        "[[runs]]": '[[runs]]\nname = "r"\nhost = "one"\nworkdir = "/w"\nargv = ["gen.py"]\n',
        "[[endpoints]]": '[[endpoints]]\nname = "e"\nkind = "api"\nbase_url = "http://x/v1"\n',
    }
    text = f'{top}\n[[hosts]]\nname = "one"\nlocal = true\n'
    if section in body:
        text += body[section] + line + "\n"
    elif section != "top":
        text += snippet + "\n"
    path = tmp_path / "x.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}: {key}:" in str(info.value), str(info.value)
