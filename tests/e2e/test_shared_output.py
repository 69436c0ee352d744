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
from pathlib import Path
from typing import Any

from tests.fixtures_actions import (
    DemoRun,
    engine_for,
    launch,
    restart,
    run_pids,
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
