"""Two configs, one output dir: a launch record of another config (O11).

Config A and config B run the same demo client in the same workdir, so they write the same
``data/.runwatch/<dataset>.launch.json``. Each record says which config, run and unit wrote it.
While A's run lives, B's start is refused naming A's config and the command that stops it there;
once A's processes are gone, A's record never blocks B as an owner: the same settings go ahead,
different settings are refused as any mix of settings is, naming A's config and what to do.
Real parts: the reference client against a mock endpoint, the engine, the real agent, real files.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_actions import (
    DemoRun,
    engine_for,
    launch,
    restart,
    run_pids,
    runwatch,
    tree_hashes,
    why,
)
from tests.waiting import wait_until


def twin_config(a: DemoRun, root: Path, extra: str = "") -> DemoRun:
    """Config B: A's config text in another file (another config key), same workdir and output
    dir; ``extra`` is appended to its argv (as a TOML list's items)."""
    root.mkdir(parents=True, exist_ok=True)
    text = a.config_path.read_text()
    if extra:
        text = text.replace('"--report-seconds", "1"', f'"--report-seconds", "1", {extra}')
    b = DemoRun.__new__(DemoRun)
    b.__dict__.update(a.__dict__)
    b.config_path = root / "runwatch.toml"
    b.config_path.write_text(text)
    return b


def record(a: DemoRun, ds: str = "B1") -> dict[str, Any]:
    return dict(json.loads((a.workdir / "data" / ".runwatch" / f"{ds}.launch.json").read_text()))


async def gone_outside(a: DemoRun) -> None:
    """A's client killed outside runwatch (no stop marker, nothing cleaned up)."""
    for pid in run_pids(a.workdir):
        os.kill(pid, signal.SIGKILL)
    await asyncio.to_thread(wait_until, lambda: not run_pids(a.workdir), 20)


async def test_o11_the_record_names_its_config_and_a_gone_writer_never_blocks(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    a = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    kill_runs_in.append(a.workdir)
    b = twin_config(a, tmp_path / "b")
    assert a.config.key != b.config.key
    async with engine_for(a) as ea:
        ra = await launch(ea, "demo")
        assert ra.ok, why(ra)
        await asyncio.to_thread(wait_until, lambda: len(a.complete_ids("B1")) >= 1, 60)
    rec = record(a)
    assert rec["config"] == a.config.key
    assert rec["config_path"] == str(a.config_path)
    launched = next(s for s in ra.steps if s.name == "launch").data["launch"]
    assert rec["run"] == "demo" and rec["launch_id"] == launched["launch_id"]
    assert rec["identity"]["pid"] == ra.identity["pid"]
    await gone_outside(a)
    async with engine_for(b) as eb:
        rb = await launch(eb, "demo")
        assert rb.ok, why(rb)
        step = next(s for s in rb.steps if s.name == "fingerprint")
        assert f"by config {a.config_path}'s run 'demo' (its processes are gone)" in step.detail
        again = await restart(eb, "demo")
        assert again.ok, why(again)
    assert record(a)["config"] == b.config.key  # B's own launch wrote it


async def test_o11_a_live_writer_of_another_config_is_named_with_its_stop_command(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    a = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    kill_runs_in.append(a.workdir)
    b = twin_config(a, tmp_path / "b")
    async with engine_for(a) as ea:
        ra = await launch(ea, "demo")
        assert ra.ok, why(ra)
    before = record(a)
    async with engine_for(b) as eb:
        for action in (launch, restart):
            refused = await action(eb, "demo")
            assert not refused.ok
            step = refused.failed_step
            assert step is not None and step.name == "fingerprint", why(refused)
            assert f"config {a.config_path}'s run 'demo'" in step.detail
            assert str(ra.identity["pid"]) in step.detail
            assert f"runwatch -c {a.config_path} kill demo" in step.detail
    assert run_pids(a.workdir) == [ra.identity["pid"]]  # A's run untouched
    assert record(a) == before


async def test_o11_other_settings_over_a_gone_configs_data_say_whose_data_it_is(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    a = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    kill_runs_in.append(a.workdir)
    b = twin_config(a, tmp_path / "b", extra='"--temperature", "0.3"')
    async with engine_for(a) as ea:
        ra = await launch(ea, "demo")
        assert ra.ok, why(ra)
        await asyncio.to_thread(wait_until, lambda: len(a.complete_ids("B1")) >= 1, 60)
    await gone_outside(a)
    data = tree_hashes(a.workdir / "data")
    async with engine_for(b) as eb:
        refused = await launch(eb, "demo")
        assert not refused.ok
        step = refused.failed_step
        assert step is not None and step.name == "fingerprint", why(refused)
        assert "temperature (absent) -> 0.3" in step.detail
        assert f"by config {a.config_path}'s run 'demo'" in step.detail
        assert "--allow-change" in step.detail
        assert f"output dir of its own (the data there is config {a.config_path}" in step.detail
        assert tree_hashes(a.workdir / "data") == data  # nothing of the run data changed
        plan = await eb.plan("demo", action="launch", allow_change=["temperature"])
        allowed = await eb.execute(plan)
        assert allowed.ok, why(allowed)
    assert record(a)["config"] == b.config.key


# --------------------------------------------------------------------------- attacks on ownership


def snapshot_run(snap: Any, name: str = "demo") -> Any:
    return next(r for h in snap.hosts for r in h.runs if r.name == name)


async def test_o12_twins_of_two_configs_in_two_workdirs_each_stop_touches_only_its_own(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """Same script, same datasets, same argv, one run name, two configs, two workdirs: A's kill
    stops A's client only; B's stays running and is still B's run, and B's restart leaves A's
    relaunch alone."""
    a = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    b = DemoRun(tmp_path / "b", slow_endpoint.url, max_samples=300)
    kill_runs_in += [a.workdir, b.workdir]
    async with engine_for(a) as ea, engine_for(b) as eb:
        ra, rb = await launch(ea, "demo"), await launch(eb, "demo")
        assert ra.ok and rb.ok, why(rb)
        view_a = snapshot_run(await ea.refresh())
        assert view_a.process is not None
        report = await ea.kill(view_a.host, view_a.process.identity, 2.0, run="demo")
        assert report.all_gone
        assert rb.identity["pid"] not in {r.pid for r in report.results}
        assert run_pids(b.workdir) == [rb.identity["pid"]]
        view_b = snapshot_run(await eb.refresh())
        assert view_b.state == "running" and view_b.process is not None
        assert view_b.process.identity.pid == rb.identity["pid"]
        ra2 = await launch(ea, "demo")
        assert ra2.ok, why(ra2)
        rb2 = await restart(eb, "demo")
        assert rb2.ok, why(rb2)
        assert run_pids(a.workdir) == [ra2.identity["pid"]]
        assert run_pids(b.workdir) == [rb2.identity["pid"]]


async def test_o12_a_symlinked_output_dir_onto_another_configs_run_is_one_dataset(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """B's ``data`` is a link to A's output dir: while A writes, B's launch and restart are
    refused (nothing of A's stopped, no second writer); the record read through the link names
    A's config."""
    a = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    b = DemoRun(tmp_path / "b", slow_endpoint.url, max_samples=300)
    kill_runs_in += [a.workdir, b.workdir]
    (a.workdir / "data").mkdir()
    (b.workdir / "data").symlink_to(a.workdir / "data")
    async with engine_for(a) as ea:
        ra = await launch(ea, "demo")
        assert ra.ok, why(ra)
        await asyncio.to_thread(wait_until, lambda: len(a.complete_ids("B1")) >= 1, 60)
    async with engine_for(b) as eb:
        for action in (launch, restart):
            refused = await action(eb, "demo")
            assert not refused.ok
            assert refused.failed_step is not None, why(refused)
            assert f"config {a.config_path}'s run 'demo'" in refused.failed_step.detail
    assert run_pids(b.workdir) == []
    assert run_pids(a.workdir) == [ra.identity["pid"]]


async def test_o12_a_run_whose_output_dir_is_renamed_while_it_runs_is_never_launched_twice(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """``data`` renamed under a live run (it keeps writing into ``data.moved``): the run is
    still running, a launch is refused, and a restart stops the old writer before the new
    one starts in a fresh ``data``."""
    a = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    kill_runs_in.append(a.workdir)
    async with engine_for(a) as ea:
        ra = await launch(ea, "demo")
        assert ra.ok, why(ra)
        await asyncio.to_thread(wait_until, lambda: len(a.complete_ids("B1")) >= 1, 60)
        (a.workdir / "data").rename(a.workdir / "data.moved")
        moved = a.workdir / "data.moved" / "B1" / "raw_responses.jsonl"
        size = moved.stat().st_size
        await asyncio.to_thread(wait_until, lambda: moved.stat().st_size > size, 60)
        view = snapshot_run(await ea.refresh())
        assert view.state == "running", view
        with_error = None
        try:
            again = await launch(ea, "demo")
            assert not again.ok
        except Exception as e:  # LaunchError: already running
            with_error = str(e)
        assert with_error is None or "already running" in with_error
        assert run_pids(a.workdir) == [ra.identity["pid"]]
        restarted = await restart(ea, "demo")
        assert restarted.ok, why(restarted)
        assert run_pids(a.workdir) == [restarted.identity["pid"]]
        after = moved.stat().st_size
        await asyncio.to_thread(wait_until, lambda: len(a.complete_ids("B1")) >= 1, 60)
        assert moved.stat().st_size == after  # the old writer is gone


async def test_o12_a_record_of_an_older_runwatch_is_compared_never_an_owner(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """An older runwatch's record (no config, no unit, the identity of a process long gone)
    with the same settings: the launch goes ahead, the step names the last launch, and the new
    record names this config."""
    a = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    kill_runs_in.append(a.workdir)
    async with engine_for(a) as ea:
        ra = await launch(ea, "demo")
        assert ra.ok, why(ra)
    await gone_outside(a)
    side = a.workdir / "data" / ".runwatch"
    for ds in ("B1", "B2"):
        old = record(a, ds)
        for key in ("config", "config_path", "launch_id"):
            old.pop(key)
        (side / f"{ds}.launch.json").write_text(json.dumps(old))
    async with engine_for(a) as ea:
        again = await launch(ea, "demo")
        assert again.ok, why(again)
        step = next(s for s in again.steps if s.name == "fingerprint")
        assert step.detail == "same model, sampling and prompts as the last launch"
    assert record(a)["config"] == a.config.key


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize("first", ["kill", "launch"])
async def test_o12_a_launch_racing_a_kill_from_another_terminal_leaves_one_writer_at_most(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path], first: str
) -> None:
    """``runwatch kill`` and ``runwatch launch`` of one run, started together from two
    terminals: never two clients at once; the launch exits 0 only when its client is the one
    left running, and the old client is gone whatever the order."""
    a = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    kill_runs_in.append(a.workdir)
    async with engine_for(a) as ea:
        ra = await launch(ea, "demo")
        assert ra.ok, why(ra)
    old = ra.identity["pid"]
    most = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            most[0] = max(most[0], len(run_pids(a.workdir)))
            done.wait(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    cfg = str(a.config_path)
    cmds = {
        "kill": ("-c", cfg, "kill", "demo", "--yes"),
        "launch": ("-c", cfg, "launch", "demo", "--yes"),
    }
    order = [first, "launch" if first == "kill" else "kill"]
    procs = {name: _cli(*cmds[name]) for name in order}
    outs = {name: p.communicate(timeout=180)[0] for name, p in procs.items()}
    done.set()
    sampler.join()
    assert most[0] <= 1, outs
    assert old not in run_pids(a.workdir), outs
    assert procs["kill"].returncode == 0, outs["kill"]
    left = run_pids(a.workdir)
    if procs["launch"].returncode == 0:
        assert len(left) == 1 and left[0] != old, outs
    else:
        assert left == [], outs
        assert "already running" in outs["launch"] or "held" in outs["launch"], outs["launch"]


async def test_o11_two_configs_launching_one_dataset_at_once_start_one_and_name_it(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """A's and B's launches of runs sharing an output dir, at the same instant: exactly one
    client starts; the other launch is refused by the dataset's lock, naming the other
    config's run and how to stop it there."""
    a = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    kill_runs_in.append(a.workdir)
    b = twin_config(a, tmp_path / "b")
    async with engine_for(a) as ea, engine_for(b) as eb:
        ra, rb = await asyncio.gather(launch(ea, "demo"), launch(eb, "demo"))
    assert [ra.ok, rb.ok].count(True) == 1, (why(ra), why(rb))
    won, lost, loser = (ra, rb, b) if ra.ok else (rb, ra, a)
    winner = a if loser is b else b
    assert run_pids(a.workdir) == [won.identity["pid"]]
    step = lost.failed_step
    assert step is not None, why(lost)
    assert f"run 'demo' of config {winner.config_path}" in step.detail, why(lost)
    assert f"runwatch -c {winner.config_path} kill demo" in step.detail
    assert record(a)["config"] == winner.config.key


def test_o11_kill_pid_of_another_configs_run_is_refused_naming_it(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """``runwatch -c B kill --pid P`` where P is config A's launched run (same run name, same
    output dir): refused, naming A's config and the command that stops it there; A's run keeps
    running; A's own kill stops it, recorded as a stop."""
    a = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    kill_runs_in.append(a.workdir)
    b = twin_config(a, tmp_path / "b")
    out = runwatch("-c", str(a.config_path), "launch", "demo", "--yes", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    [pid] = run_pids(a.workdir)
    refused = runwatch("-c", str(b.config_path), "kill", "--pid", str(pid), "--yes")
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0, text
    assert (
        f"pid {pid} on local is another config's run (run 'demo' of config {a.config_path}" in text
    )
    assert f"runwatch -c {a.config_path} kill demo" in text
    assert run_pids(a.workdir) == [pid]
    stopped = runwatch("-c", str(a.config_path), "kill", "demo", "--yes", "--grace", "2")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert run_pids(a.workdir) == []


async def test_o11_the_engines_kill_refuses_another_configs_run_for_every_front_end(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """The dashboard, the guard and rebalance stop through ``Engine.kill``: a process of A's
    unit seen in B's snapshot is refused there (audited in B's view), and A's run keeps
    running."""
    from supervisor import audit
    from supervisor.errors import KillRefused

    a = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    kill_runs_in.append(a.workdir)
    b = twin_config(a, tmp_path / "b")
    async with engine_for(a) as ea, engine_for(b) as eb:
        ra = await launch(ea, "demo")
        assert ra.ok, why(ra)
        pid = ra.identity["pid"]
        snap = await eb.refresh()
        [theirs] = [p for h in snap.hosts for p in h.processes if p.identity.pid == pid]
        assert theirs.unit is not None and not theirs.unit.mine
        with pytest.raises(KillRefused) as refused:
            await eb.kill("local", theirs.identity, 1.0)
        assert f"run 'demo' of config {a.config_path}" in str(refused.value)
        assert run_pids(a.workdir) == [pid]
    records = audit.read(config=b.config.key)
    assert records and records[-1]["action"] == "kill"
    assert "refused" in json.dumps(records[-1])
