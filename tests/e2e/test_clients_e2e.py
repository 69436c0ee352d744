"""Client profiles end to end: real processes of the SpecForge and Model-Optimizer stand-ins
against the demo's mock server, supervised through the engine's front door.

Per client: detected from its script, its own flags read (single output file, input file,
samples, concurrency, endpoint, resume), one dataset named after its file with records, tokens
(reasoning apart), rate, ETA, target, completeness and error/skipped lines; kill and resume; the
restart that would overwrite refused before anything stops; the guard stopping it at its budget;
data shrinking under a running run raised as an alarm and failing the restart that caused it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from supervisor import audit
from supervisor.cli import cli
from supervisor.demo.prompts import write_prompts
from supervisor.engine import Engine
from supervisor.model import DatasetView, RunView
from tests.fixtures_actions import pid_alive
from tests.fixtures_clients import ClientRun
from tests.waiting import wait_for, wait_until

pytestmark = pytest.mark.usefixtures("state_home")


async def _view(engine: Engine, run: str) -> RunView:
    snap = await engine.refresh()
    return next(r for h in snap.hosts for r in h.runs if r.name == run)


async def _until(engine: Engine, run: str, cond: Any, timeout: float = 60.0) -> RunView:
    """Refresh until ``cond(run_view)``; the last view."""
    box: list[RunView] = []

    async def check() -> bool:
        box[:] = [await _view(engine, run)]
        return bool(cond(box[0]))

    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out: {box[0] if box else None}")
        await wait_for(lambda: True, timeout=1.0)  # let the clients write between refreshes
    return box[0]


async def _restart_without_resume(engine: Engine) -> Any:
    plan = await engine.plan("sf", action="restart", unsets=["resume"])
    return await engine.execute(plan)


def _ds(rv: RunView) -> DatasetView:
    assert len(rv.datasets) == 1, rv.datasets
    return rv.datasets[0]


# --------------------------------------------------------------------------- SpecForge


def test_specforge_run_is_detected_and_its_flags_read(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    run = ClientRun(
        tmp_path, "specforge", client_server.url, demo_tokenizer, extra=("--num-samples", "30")
    )
    proc = run.spawn()
    try:
        wait_until(lambda: run.output.exists(), timeout=30)
        result = CliRunner().invoke(cli, ["ps", "-c", str(run.config_path), "--json"])
        assert result.exit_code == 0, result.output
        procs = json.loads(result.output)["hosts"][0]["processes"]
        mine = next(p for p in procs if p["pid"] == proc.pid)
        assert mine["run"] == "sf"
        flags = mine["flags"]
        assert flags["client"] == "specforge"
        assert flags["output_file"] == "out/regen.jsonl"
        assert flags["input_file"] == "in.jsonl"
        assert flags["max_samples"] == 30 and flags["concurrency"] == 2
        assert flags["resume"] is True and flags["token_budget"] is None
        assert flags["backend"] == "local"
        text = CliRunner().invoke(cli, ["ps", "-c", str(run.config_path)]).output.splitlines()
        at = next(i for i, line in enumerate(text) if f"pid {proc.pid} " in line)
        mine_text = "\n".join(text[at : at + 3])  # its line, its flags, its argv
        assert "client specforge" in mine_text and "NO resume flag" not in mine_text
        assert "no --token-budget" not in mine_text.lower()
    finally:
        proc.kill()
        proc.wait()


def test_specforge_status_records_tokens_target_completeness_errors(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    run = ClientRun(
        tmp_path, "specforge", client_server.url, demo_tokenizer, extra=("--num-samples", "30")
    )
    proc = run.spawn()

    async def go() -> RunView:
        async with Engine(run.config) as engine:
            return await _until(
                engine,
                "sf",
                lambda rv: (
                    rv.state == "running"
                    and rv.datasets
                    and _ds(rv).records >= 6
                    and _ds(rv).rates.req_per_s_all
                    and any(s.lines for s in _ds(rv).sidecars)
                ),
            )

    try:
        rv = asyncio.run(go())
    finally:
        proc.kill()
        proc.wait()
    assert rv.client == "specforge" and rv.budget_flag is None
    ds = _ds(rv)
    assert ds.name == "regen" and ds.path == str(run.output)
    assert ds.verdict == "current"
    # --num-samples counts after the rows --resume skips, and a run started by hand does not
    # say how many it skipped: the flag is read, but it bounds nothing (V17).
    assert rv.process is not None and rv.process.flags.max_samples == 30
    assert ds.max_samples is None
    assert ds.completion_tokens > 0 and 0 < ds.reasoning_tokens < ds.completion_tokens
    assert ds.projection.eta_s is not None
    c = ds.completeness
    assert c is not None and c.input == 40 and c.done == ds.unique_ids
    # Rows after the last one answered are not attempted yet, and those just before it may be
    # in flight (fewer than its concurrency): never missing while it runs.
    assert c.missing + c.in_flight + c.not_reached == 40 - c.done - c.failed
    errors = {s.kind: s for s in ds.sidecars}
    assert errors["error"].reasons == {"Data starts with an assistant message": 1}
    assert errors["skipped"].lines == 1
    lines = CliRunner().invoke(cli, ["status", "-c", str(run.config_path)]).output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  sf  "))
    end = next(
        (i for i in range(at + 1, len(lines)) if lines[i][:3].strip() and lines[i][2] != " "),
        len(lines),
    )
    out = "\n".join(lines[at:end])  # the run sf: its line, its dataset, its notes
    assert "regen" in out and "done" in out and "error file: 1 lines" in out, out
    assert "are reasoning" in out and "no --token-budget" not in out, out


def test_specforge_restart_without_resume_is_refused_before_anything_stops(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    run = ClientRun(tmp_path, "specforge", client_server.url, demo_tokenizer)

    async def go() -> Any:
        async with Engine(run.config) as engine:
            launched = await engine.execute(await engine.plan("sf", action="launch"))
            assert launched.ok, launched
            await _until(engine, "sf", lambda rv: rv.datasets and _ds(rv).records >= 2)
            before = (await _view(engine, "sf")).process
            assert before is not None
            size = run.output.stat().st_size
            result = await _restart_without_resume(engine)
            after = (await _view(engine, "sf")).process
            return launched, before, after, result, size

    _launched, before, after, result, size = asyncio.run(go())
    assert not result.ok
    failed = result.failed_step
    assert failed is not None and "--resume" in failed.detail and "--set resume" in failed.detail
    assert after is not None and after.identity == before.identity  # nothing stopped
    assert run.output.stat().st_size >= size
    os.kill(after.identity.pid, 9)


def test_specforge_kill_and_resume_keep_every_byte(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    run = ClientRun(tmp_path, "specforge", client_server.url, demo_tokenizer, rows=16)
    log = run.workdir / "logs" / "sf.log"

    async def go() -> tuple[RunView, bytes]:
        async with Engine(run.config) as engine:
            assert (await engine.execute(await engine.plan("sf", action="launch"))).ok
            rv = await _until(engine, "sf", lambda rv: rv.datasets and _ds(rv).records >= 3)
            assert rv.process is not None
            report = await engine.kill("local", rv.process.identity, 5.0, run="sf")
            assert report.all_gone, report
            prefix = run.output.read_bytes()
            resumed = await engine.execute(await engine.plan("sf", action="launch"))
            assert resumed.ok, resumed
            await wait_for(lambda: "Processing completed" in log.read_text(), timeout=60)
            rv = await _until(engine, "sf", lambda rv: rv.state == "stopped" and rv.datasets)
            return rv, prefix

    rv, prefix = asyncio.run(go())
    assert run.output.read_bytes().startswith(prefix)  # resumed by appending: no byte lost
    ds = _ds(rv)
    assert ds.alarm is None and ds.duplicates == 0
    c = ds.completeness
    # Every input row is accounted for: a record, an error/skipped line, or named as missing
    # (SpecForge resumes by COUNT: a row in flight at the kill, overtaken by later rows, is
    # skipped on resume; completeness is how it shows).
    assert c is not None and c.input == 16
    assert c.done + c.failed + c.missing + c.not_reached == 16
    written = {json.loads(line)["id"] for line in run.lines()}
    assert not written & set(c.missing_first)


def test_specforge_guard_stops_it_at_its_budget(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    run = ClientRun(
        tmp_path, "specforge", client_server.url, demo_tokenizer, policy="stop", budget=200
    )
    proc = run.spawn()

    async def go() -> Any:
        async with Engine(run.config) as engine:
            await _until(engine, "sf", lambda rv: rv.datasets and _ds(rv).over_budget)
            snap = await engine.refresh()
            return await engine.enforce_budget(snap)

    try:
        outcomes = asyncio.run(go())
        assert [o.ok for o in outcomes] == [True], [o.detail for o in outcomes]
        assert "(its client has no budget flag)" in outcomes[0].event.message
        wait_until(lambda: proc.poll() is not None, timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_specforge_restart_with_budget_is_refused_with_the_reason(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    run = ClientRun(
        tmp_path,
        "specforge",
        client_server.url,
        demo_tokenizer,
        policy="restart-with-budget",
        budget=200,
    )
    proc = run.spawn()

    async def go() -> Any:
        async with Engine(run.config) as engine:
            await _until(engine, "sf", lambda rv: rv.datasets and _ds(rv).over_budget)
            return await engine.enforce_budget(await engine.refresh())

    try:
        outcomes = asyncio.run(go())
        assert len(outcomes) == 1 and not outcomes[0].ok
        assert "has no budget flag" in outcomes[0].detail
        assert proc.poll() is None  # refused: nothing was stopped
    finally:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- Model-Optimizer


def test_modelopt_end_to_end_detected_resumed_finished(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    run = ClientRun(
        tmp_path,
        "modelopt",
        client_server.url,
        demo_tokenizer,
        rows=12,
        extra=("--log_empty_conversations",),
    )

    async def go() -> tuple[RunView, RunView]:
        async with Engine(run.config) as engine:
            assert (await engine.execute(await engine.plan("mo", action="launch"))).ok
            first = await _until(
                engine,
                "mo",
                lambda rv: rv.state == "running" and rv.datasets and _ds(rv).records >= 3,
            )
            assert first.process is not None
            assert (await engine.kill("local", first.process.identity, 5.0, run="mo")).all_gone
            prefix = run.output.read_bytes()
            assert (await engine.execute(await engine.plan("mo", action="launch"))).ok
            done = await _until(
                engine,
                "mo",
                lambda rv: (
                    rv.state == "stopped"
                    and rv.datasets
                    and (seen := _ds(rv).completeness) is not None
                    and seen.missing == 0
                ),
            )
            assert run.output.read_bytes().startswith(prefix)
            return first, done

    first, done = asyncio.run(go())
    assert first.client == "modelopt" and first.budget_flag is None
    p = first.process
    assert p is not None and p.flags.client == "modelopt"
    assert p.flags.output_file == "out/gen.jsonl" and p.flags.concurrency == 2
    assert "sk-modelopt-secret-0123456789" not in " ".join(p.argv_masked)
    ds = _ds(done)
    assert ds.name == "gen" and ds.duplicates == 0 and ds.alarm is None
    assert ds.completeness is not None and ds.completeness.done == 12
    assert ds.completion_tokens > 0
    assert run.lines()[-1] == b'{"finished": true}\n'


# --------------------------------------------------------------------------- data loss


def test_overwrite_by_a_misdeclared_client_is_an_alarm_and_fails_the_restart(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    # A user profile that wrongly says the script always resumes: the gate lets the restart
    # without --resume through, the client overwrites, and runwatch says so loudly.
    profile = """
[clients.careless]
scripts = ["regenerate_train_data.py"]
format = "specforge"
resume = "always"
volatile = ["--resume", "--output-file-path"]
[clients.careless.flags]
output_file = ["--output-file-path"]
input_file = ["--input-file-path"]
"""
    # The restart sees the overwrite only if the client opens its output within the settle
    # time: 4 s covers the stand-in's start (it loads the tokenizer first) on a loaded machine.
    run = ClientRun(
        tmp_path, "specforge", client_server.url, demo_tokenizer, rows=30, top=profile, settle=4.0
    )

    async def go() -> tuple[Any, RunView]:
        async with Engine(run.config) as engine:
            assert (await engine.execute(await engine.plan("sf", action="launch"))).ok
            await _until(engine, "sf", lambda rv: rv.datasets and _ds(rv).records >= 6)
            result = await _restart_without_resume(engine)
            rv = await _view(engine, "sf")
            return result, rv

    result, rv = asyncio.run(go())
    assert not result.ok
    assert any("DATA LOSS" in s.detail for s in result.steps), [s.detail for s in result.steps]
    alarm = _ds(rv).alarm
    assert alarm is not None and "bytes before" in alarm
    assert any(r["action"] == "data-loss" for r in audit.read())
    if rv.process is not None and pid_alive(rv.process.identity.pid):
        os.kill(rv.process.identity.pid, 9)


# --------------------------------------------------------------------------- no profile


def _unprofiled(tmp_path: Path, url: str, limit: int) -> tuple[Path, Path]:
    """A run of a script no profile describes (the reference client under another name)."""
    from tests.fixtures_actions import RUN_INFERENCE
    from tests.fixtures_config import write_local_config

    work = tmp_path / "work"
    write_prompts(work / "prompts", ["B1"], count=60)
    script = work / "mygen.py"
    script.write_bytes(RUN_INFERENCE.read_bytes())
    argv = [
        sys.executable, "mygen.py", "--datasets", "B1", "--prompts-dir", "prompts",
        "--output-dir", "out", "--api-base", url, "--concurrency", "2",
    ]  # fmt: skip
    cfg = write_local_config(
        tmp_path / "runwatch.toml",
        f"""
[[runs]]
name = "mine"
host = "here"
workdir = {json.dumps(str(work))}
argv = {json.dumps(argv)}
settle_seconds = 0.5
""",
        top=f'scripts = ["mygen.py"]\nbackup_max_bytes = {limit}',
        python=True,
    )
    return cfg, work / "out" / "B1" / "raw_responses.jsonl"


def test_a_script_without_profile_gets_its_output_copied_before_a_restart(
    tmp_path: Path, client_server: Any
) -> None:
    from supervisor.config import load_config

    cfg, data = _unprofiled(tmp_path, client_server.url, 1 << 20)

    async def go() -> tuple[Any, bytes]:
        async with Engine(load_config(cfg)) as engine:
            assert (await engine.execute(await engine.plan("mine", action="launch"))).ok
            await _until(engine, "mine", lambda rv: rv.datasets and _ds(rv).records >= 3)
            result = await engine.execute(await engine.plan("mine", action="restart"))
            rv = await _view(engine, "mine")
            if rv.process is not None:
                await engine.kill("here", rv.process.identity, 5.0, run="mine")
            return result, data.read_bytes()

    result, now = asyncio.run(go())
    assert result.ok, [(s.name, s.detail) for s in result.steps]
    launch = next(s for s in result.steps if s.name == "launch")
    copies = launch.data["snapshot"]["files"]
    assert len(copies) == 1 and copies[0]["path"] == str(data)
    copy = Path(copies[0]["copy"])
    assert copy.parent.parent == data.parent.parent / ".runwatch" / "snapshots" / "mine"
    assert now.startswith(copy.read_bytes())  # the copy is the file as it was at the launch
    restart = next(r for r in audit.read() if r["action"] == "restart")
    assert restart["snapshot"]["files"][0]["path"] == str(data)


def test_a_script_without_profile_over_the_copy_limit_is_refused_before_the_stop(
    tmp_path: Path, client_server: Any
) -> None:
    from supervisor.config import load_config

    cfg, _data = _unprofiled(tmp_path, client_server.url, 10)

    async def go() -> tuple[Any, Any, Any]:
        async with Engine(load_config(cfg)) as engine:
            assert (await engine.execute(await engine.plan("mine", action="launch"))).ok
            before = await _until(engine, "mine", lambda rv: rv.datasets and _ds(rv).records >= 2)
            result = await engine.execute(await engine.plan("mine", action="restart"))
            after = await _view(engine, "mine")
            if after.process is not None:
                await engine.kill("here", after.process.identity, 5.0, run="mine")
            return result, before.process, after.process

    result, before, after = asyncio.run(go())
    assert not result.ok
    failed = result.failed_step
    assert failed is not None and failed.name == "format-check"
    assert "backup_max_bytes" in failed.detail and "--force" in failed.detail
    assert before is not None and after is not None and before.identity == after.identity
