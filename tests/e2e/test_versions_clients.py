"""Every released generation of SpecForge's and Model-Optimizer's scripts
(``tests/versions_clients.py``) read by the host's scanner, judged by ``check``, preflighted by the
profiles, counted for budgets; the profiles list exactly the flags some version has (rows V10 to
V18 of ``docs/reliability.md``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner

from supervisor import clients, rates
from supervisor.agent.scan import Scanner
from supervisor.cli import cli
from supervisor.config import load_config
from supervisor.demo.prompts import prompt_records
from supervisor.engine import Engine
from supervisor.events import EventTracker
from supervisor.model import DatasetView, RunView
from tests.fixtures_actions import why
from tests.fixtures_clients import ClientRun
from tests.versions_clients import (
    ALL_GENERATIONS,
    MODELOPT_GENERATIONS,
    SPECFORGE_GENERATIONS,
    Generation,
)
from tests.waiting import wait_for, wait_until

pytestmark = pytest.mark.usefixtures("state_home")


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _write(gen: Generation, root: Path) -> dict[str, Any]:
    """The generation's input, output and side files under ``root``; the scan arguments."""
    specforge = gen.project.endswith("SpecForge")
    inp = _jsonl(
        root / "in.jsonl",
        [
            {"id": f"row-{i}", "conversations": [{"role": "user", "content": f"question {i}"}]}
            for i in range(gen.input_rows)
        ],
    )
    out = _jsonl(root / ("regen.jsonl" if specforge else "gen.jsonl"), gen.records)
    sidecars = {}
    if specforge:
        for kind, rows in (("error", gen.error), ("skipped", gen.skipped)):
            path = root / f"regen_{kind}.jsonl"
            if rows is not None:
                _jsonl(path, rows)
            sidecars[kind] = str(path)
    return {
        "path": str(out),
        "fmt": "specforge" if specforge else "modelopt",
        "sidecars": sidecars or None,
        "input_file": {"path": str(inp), "id": "id" if specforge else ""},
    }


def _words(texts: list[str]) -> int:
    return sum(len(t.split()) for t in texts)


@pytest.mark.parametrize("gen", ALL_GENERATIONS, ids=lambda g: g.name)
def test_v10_every_generation_reads_as_its_format_with_exact_counts(
    gen: Generation, tmp_path: Path
) -> None:
    """Records of every version are of the client's format (SpecForge's before ``status`` too),
    reasoning is counted under either key, Model-Optimizer's id-only lines are failed rows (not
    records, not missing, not another format), and every input row is accounted for."""
    args = _write(gen, tmp_path)
    scan = Scanner().scan(args.pop("path"), validate="all", **args)
    assert scan["verdict"] == "current", scan["verdict_detail"]
    assert scan["bad_lines_total"] == 0
    assert scan["texts"] == gen.answers
    assert scan["reasoning_texts"] == gen.reasoning
    assert scan["records"] == len(gen.answers)
    assert scan.get("failed_lines", 0) == len(gen.failed)
    assert scan["finished"] is gen.finished
    c = scan["completeness"]
    side = len(gen.error or []) + len(gen.skipped or [])
    assert c["input"] == gen.input_rows
    assert c["done"] == len(gen.answers)
    assert c["failed"] == len(gen.failed) + side
    # Unanswered rows are missing when the client passed them, else not reached yet.
    unanswered = gen.input_rows - len(gen.answers) - len(gen.failed) - side
    assert c["missing"] + c["not_reached"] == unanswered
    # The tokens status shows: every answer and every reasoning text, reasoning apart.
    view = rates.build_dataset_view(
        scan, None, None, rates.RateTracker(), None, False, 0.0, name="d", count_texts=_words
    )
    assert view.completion_tokens == _words(gen.answers) + _words(gen.reasoning)
    assert view.reasoning_tokens == _words(gen.reasoning)


def test_v10_a_specforge_file_resumed_by_a_newer_version_is_not_mixed(tmp_path: Path) -> None:
    """Records without ``status`` (before late 2025), then ``thinking`` ones, then
    ``reasoning_content`` ones: one format, every reasoning text counted once."""
    old, thinking, current = (SPECFORGE_GENERATIONS[i] for i in (1, 2, 3))
    rows = old.records[:2] + thinking.records[2:3] + current.records[3:]
    out = _jsonl(tmp_path / "regen.jsonl", rows)
    scan = Scanner().scan(str(out), fmt="specforge", validate="all")
    assert scan["verdict"] == "current", scan["verdict_detail"]
    assert scan["reasoning_texts"] == thinking.reasoning[2:3] + current.reasoning[3:]


def test_v11_modelopt_json_array_input_is_counted_by_row(tmp_path: Path) -> None:
    """``--data_path`` may be one JSON array (the script ``json.load``s a path not ending in
    jsonl): its rows are the input, whatever its line breaks."""
    gen = MODELOPT_GENERATIONS[-1]
    rows = [{"conversations": [{"role": "user", "content": f"q {i}"}]} for i in range(6)]
    inp = tmp_path / "train.json"
    inp.write_text(json.dumps(rows, indent=2))
    out = _jsonl(tmp_path / "gen.jsonl", gen.records)
    scan = Scanner().scan(str(out), fmt="modelopt", input_file={"path": str(inp), "id": ""})
    c = scan["completeness"]
    assert c["error"] is None
    assert (c["input"], c["done"], c["failed"], c["missing"]) == (6, 4, 2, 0)
    # Through the engine: a run whose --data_path is that array.
    run = ClientRun(tmp_path / "mo", "modelopt", "http://127.0.0.1:9/v1", tmp_path, rows=6)
    (run.workdir / "train.json").write_text(json.dumps(rows, indent=2))
    run.config_path.write_text(run.config_path.read_text().replace('"in.jsonl"', '"train.json"'))
    _jsonl(run.output, gen.records)

    async def view() -> RunView:
        async with Engine(run.config) as engine:
            return await _view(engine, "mo")

    ds = _ds(asyncio.run(view()))
    assert ds.completeness is not None and ds.completeness.error is None
    c2 = ds.completeness
    assert (c2.input, c2.done, c2.failed, c2.missing) == (6, 4, 2, 0)
    assert ds.verdict == "current" and ds.records == 4
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    scan = Scanner().scan(str(out), fmt="modelopt", input_file={"path": str(bad), "id": ""})
    assert "not a JSON array" in scan["completeness"]["error"]


@pytest.mark.parametrize(
    ("profile", "gens"), [("specforge", SPECFORGE_GENERATIONS), ("modelopt", MODELOPT_GENERATIONS)]
)
def test_v12_each_profile_lists_exactly_the_flags_of_its_versions(
    profile: str, gens: list[Generation]
) -> None:
    """Every flag a profile knows is one some version has (no ``--thinking-modes``), every flag
    of every version is known, switches are switches, and a typed flag has that type in every
    version that has it."""
    p = clients.BUILTIN_CLIENTS[profile]
    options: dict[str, set[str]] = {}
    for g in gens:
        for flag, kind in g.options.items():
            options.setdefault(flag, set()).add(json.dumps(kind))
    assert sorted(p.known_flags) == sorted(options)
    assert sorted(p.switches) == sorted(f for f, k in options.items() if k == {'"switch"'})
    for flag, vtype in p.value_types.items():
        # "path" is a str the client opens; choices are compared as written.
        wanted = "str" if vtype == "path" else vtype
        assert options[flag] == {json.dumps(wanted)}, (flag, options[flag])
    assert clients.value_types_problems(p) == []


REFUSED = "the new command line would not start"


def test_v13_preflight_refuses_flags_and_values_no_version_accepts(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    """Model-Optimizer's script has no ``--thinking-modes`` in any version; SpecForge refuses a
    ``--temperature`` outside 0..1 when it starts: both are refused before anything starts."""
    sf = ClientRun(tmp_path / "sf", "specforge", client_server.url, demo_tokenizer)
    mo = ClientRun(tmp_path / "mo", "modelopt", client_server.url, demo_tokenizer)

    async def plan(run: ClientRun, sets: list[str]) -> Any:
        async with Engine(run.config) as engine:
            p = await engine.plan(run.name, action="launch", overrides=sets)
            return await engine.execute(p, dry_run=True)

    def refused(result: Any) -> str:
        assert not result.ok, why(result)
        failed = result.failed_step
        assert failed is not None and failed.name == "preflight", why(result)
        assert REFUSED in failed.detail
        return str(failed.detail)

    detail = refused(asyncio.run(plan(mo, ["thinking-modes=low,high"])))
    assert "--thinking-modes" in detail
    detail = refused(asyncio.run(plan(sf, ["temperature=1.5"])))
    assert "--temperature: '1.5' is outside 0..1" in detail
    assert "-0.1" in refused(asyncio.run(plan(sf, ["temperature=-0.1"])))
    assert "--max-tokens: '0' is outside at least 1" in refused(
        asyncio.run(plan(sf, ["max-tokens=0"]))
    )
    good = asyncio.run(plan(sf, ["temperature=1.0"]))
    pre = next(s for s in good.steps if s.name == "preflight")
    assert pre.state == "ok", why(good)
    assert not list((sf.workdir / "out").iterdir())  # nothing was started


def test_v14_check_passes_failed_rows_and_says_what_status_says(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    """``check`` of a Model-Optimizer file with failed-request lines passes (they are its own
    lines); ``check RUN`` of SpecForge names its error and skipped files as ``status`` does."""
    mo = MODELOPT_GENERATIONS[0]
    path = _jsonl(tmp_path / "gen.jsonl", mo.records)
    r = CliRunner().invoke(cli, ["check", str(path), "--format", "modelopt"])
    assert r.exit_code == 0, r.output
    assert "3 failed requests logged" in r.output
    # Without --format, a file that starts with a failed request is still Model-Optimizer's.
    first_failed = _jsonl(tmp_path / "first.jsonl", [mo.records[1], mo.records[0], *mo.records[2:]])
    r = CliRunner().invoke(cli, ["check", str(first_failed)])
    assert r.exit_code == 0, r.output
    assert "modelopt current" in r.output and "3 failed requests logged" in r.output

    run = ClientRun(tmp_path / "sf", "specforge", client_server.url, demo_tokenizer)
    gen = SPECFORGE_GENERATIONS[-1]
    rows = [{**rec, "id": f"B1-00000{i}"} for i, rec in enumerate(gen.records)]
    _jsonl(run.output, rows)
    assert gen.error is not None and gen.skipped is not None
    _jsonl(run.sidecar("error"), [{**r, "id": "B1-000004"} for r in gen.error])
    _jsonl(run.sidecar("skipped"), [{**r, "id": "B1-000005"} for r in gen.skipped])
    r = CliRunner().invoke(cli, ["check", "sf", "-c", str(run.config_path)])
    assert r.exit_code == 0, r.output
    assert "error file: 1 lines (1 Data starts with an assistant message)" in r.output
    assert "skipped file: 1 lines (1 empty conversations)" in r.output
    assert "4 / 40 done, 2 failed, 34 not attempted yet" in r.output
    out = CliRunner().invoke(cli, ["check", "sf", "-c", str(run.config_path), "--json"])
    [f] = json.loads(out.output)["files"]
    assert f["sidecars"]["error"]["lines"] == 1 and f["completeness"]["input"] == 40


async def _view(engine: Engine, run: str) -> RunView:
    snap = await engine.refresh()
    return next(r for h in snap.hosts for r in h.runs if r.name == run)


def _ds(rv: RunView) -> DatasetView:
    assert len(rv.datasets) == 1, rv.datasets
    return rv.datasets[0]


async def _until(engine: Engine, run: str, cond: Any, timeout: float = 60.0) -> RunView:
    box: list[RunView] = []

    async def check() -> bool:
        box[:] = [await _view(engine, run)]
        return bool(cond(box[0]))

    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out: {box[0] if box else None}")
        await wait_for(lambda: True, timeout=1.0)
    return box[0]


def test_v15_a_refused_restart_with_budget_leaves_stop_its_turn(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    """The guard refuses ``restart-with-budget`` for SpecForge (no budget flag) and says to set
    ``stop``; once set, the next enforcement stops the run. The alert's command is one the
    client has (a stop), never a ``--set token-budget``."""
    run = ClientRun(
        tmp_path,
        "specforge",
        client_server.url,
        demo_tokenizer,
        policy="restart-with-budget",
        budget=200,
    )
    proc = run.spawn()

    async def go() -> tuple[Any, Any, Any]:
        async with Engine(run.config) as engine:
            await _until(engine, "sf", lambda rv: rv.datasets and _ds(rv).over_budget)
            snap = await engine.refresh()
            events = EventTracker(run.config).update(snap)
            refused = await engine.enforce_budget(snap)
        text = run.config_path.read_text().replace(
            'budget_policy = "restart-with-budget"', 'budget_policy = "stop"'
        )
        run.config_path.write_text(text)
        async with Engine(load_config(run.config_path)) as engine:
            stopped = await engine.enforce_budget(await engine.refresh())
        return events, refused, stopped

    try:
        events, refused, stopped = asyncio.run(go())
        assert len(refused) == 1 and not refused[0].ok
        assert "set budget_policy = 'stop'" in refused[0].detail
        assert [o.ok for o in stopped] == [True], [o.detail for o in stopped]
        assert stopped[0].event.policy == "stop"
        wait_until(lambda: proc.poll() is not None, timeout=15)
        over = [e for e in events if e.kind == "over-budget"]
        assert over and all("token-budget" not in e.command for e in over)
        assert all(" kill sf" in e.command for e in over), [e.command for e in over]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_v16_over_budget_launch_check_counts_tokenizer_formats(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    """A SpecForge dataset already past its budget (answers and reasoning counted with the
    tokenizer, as the dashboard counts them) is not launched again without --force."""
    run = ClientRun(tmp_path, "specforge", client_server.url, demo_tokenizer, budget=60)
    gen = SPECFORGE_GENERATIONS[3]
    _jsonl(run.output, [{**r, "id": f"B1-00000{i}"} for i, r in enumerate(gen.records)])

    async def go() -> tuple[Any, RunView]:
        async with Engine(run.config) as engine:
            rv = await _view(engine, "sf")
            plan = await engine.plan("sf", action="launch")
            return await engine.execute(plan, dry_run=True), rv

    result, rv = asyncio.run(go())
    shown = _ds(rv).completion_tokens
    assert shown > 60 and _ds(rv).reasoning_tokens > 0
    assert not result.ok, why(result)
    failed = result.failed_step
    assert failed is not None and "already over budget" in failed.detail, why(result)
    assert f"regen: {shown} completion tokens, budget 60" in failed.detail
    assert "--force" in failed.detail
    assert not run.pids()


def test_v17_specforge_sample_bound_after_a_resume(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    """``--num-samples 5`` after a resume over 7 records makes 5 more: launched by runwatch the
    bound is 12; started by hand (what it skipped unknown) there is no bound, never 7/5."""
    run = ClientRun(
        tmp_path, "specforge", client_server.url, demo_tokenizer, extra=("--num-samples", "5")
    )
    records = prompt_records("B1", 7)
    _jsonl(
        run.output,
        [
            {
                "id": r["sample_id"],
                "conversations": [
                    *cast(list[Any], r["messages"]),
                    {"role": "assistant", "content": "done"},
                ],
                "status": "success",
            }
            for r in records
        ],
    )

    async def launched() -> RunView:
        async with Engine(run.config) as engine:
            result = await engine.execute(await engine.plan("sf", action="launch"))
            assert result.ok, why(result)
            rv = await _until(engine, "sf", lambda rv: rv.state == "running" and rv.datasets)
            assert rv.process is not None
            try:
                return rv
            finally:
                os.kill(rv.process.identity.pid, signal.SIGKILL)

    rv = asyncio.run(launched())
    assert _ds(rv).max_samples == 12
    wait_until(lambda: not run.pids(), timeout=15)

    proc = run.spawn()

    async def by_hand() -> RunView:
        async with Engine(run.config) as engine:
            return await _until(engine, "sf", lambda rv: rv.state == "running" and rv.datasets)

    try:
        rv = asyncio.run(by_hand())
        assert rv.process is not None and rv.process.flags.max_samples == 5
        ds = _ds(rv)
        assert ds.max_samples is None and ds.records >= 7
        lines = CliRunner().invoke(cli, ["status", "-c", str(run.config_path)]).output
        assert "/5" not in lines, lines
    finally:
        proc.kill()
        proc.wait()


def test_v18_a_blocked_resuming_client_is_never_told_to_move_its_output_aside(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    """A Model-Optimizer file with a line of another format blocks the launch; the hint does not
    offer --move-aside, which would take the file its resume reads (it would start over)."""
    run = ClientRun(tmp_path, "modelopt", client_server.url, demo_tokenizer)
    gen = MODELOPT_GENERATIONS[-1]
    stray = {"sample_id": "x", "output_ids": [1], "prompt_tokens": 1, "completion_tokens": 1}
    _jsonl(run.output, [*gen.records[:3], {**stray, "finish_reason": "stop"}])

    async def go() -> Any:
        async with Engine(run.config) as engine:
            plan = await engine.plan("mo", action="launch")
            return await engine.execute(plan, dry_run=True)

    result = asyncio.run(go())
    assert not result.ok, why(result)
    failed = result.failed_step
    assert failed is not None and failed.name in ("format-check", "launch"), why(result)
    text = failed.detail
    assert "modelopt resumes from that file" in text, text
    assert "--move-aside to rename" not in text and "pass --move-aside" not in text


def test_v16_the_launch_check_counts_every_text_of_a_file_larger_than_one_reply(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    """The host hands texts back 8 MB at a time; the launch check reads on until the file's
    last text, so a dataset past its budget only in its last records is still over."""
    from supervisor.engine import count_tokens, load_tokenizer

    # About 100 KB, in few long tokens: the tokenizer's time is not what this test is about.
    text = "alpha" * 20000
    per_record = count_tokens(load_tokenizer(str(demo_tokenizer)), [text])[0]
    records = 90  # about 9 MB: more than one reply's texts
    budget = per_record * 86
    run = ClientRun(tmp_path, "specforge", client_server.url, demo_tokenizer, budget=budget)
    _jsonl(
        run.output,
        [
            {
                "id": f"B1-{i:06d}",
                "conversations": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": text},
                ],
                "status": "success",
            }
            for i in range(records)
        ],
    )

    async def go() -> Any:
        async with Engine(run.config) as engine:
            plan = await engine.plan("sf", action="launch")
            return await engine.execute(plan, dry_run=True)

    result = asyncio.run(go())
    assert not result.ok, why(result)
    failed = result.failed_step
    assert failed is not None and "already over budget" in failed.detail, why(result)
    assert f"regen: {per_record * records} completion tokens, budget {budget}" in failed.detail


def test_v10_runwatch_scan_counts_reasoning_under_either_key(
    tmp_path: Path, demo_tokenizer: Path
) -> None:
    """``runwatch scan --tokenizer`` counts answers and reasoning, as the dashboard does."""
    from supervisor.engine import count_tokens, load_tokenizer

    gen = SPECFORGE_GENERATIONS[2]  # reasoning under "thinking"
    path = _jsonl(tmp_path / "regen.jsonl", gen.records)
    tok = load_tokenizer(str(demo_tokenizer))
    wanted = sum(count_tokens(tok, [*gen.answers, *gen.reasoning]))
    r = CliRunner().invoke(
        cli,
        ["scan", str(path), "--format", "specforge", "--tokenizer", str(demo_tokenizer), "--json"],
    )
    assert r.exit_code == 0, r.output
    [f] = json.loads(r.output)["files"]
    assert f["completion_tokens"] == wanted
    assert wanted > sum(count_tokens(tok, gen.answers))


def test_v10_the_demo_server_answers_reasoning_content_as_sglang_does(client_server: Any) -> None:
    """SpecForge's ``--is-reasoning-model`` read ``message.reasoning_content`` whatever the
    request: the demo server, like SGLang, always has the key (null without thinking), so that
    version runs against it and writes ``"thinking": null``."""
    import httpx

    def message(extra: dict[str, Any]) -> dict[str, Any]:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        r = httpx.post(f"{client_server.url}/chat/completions", json={**body, **extra})
        r.raise_for_status()
        return dict(r.json()["choices"][0]["message"])

    plain = message({})
    assert "reasoning_content" in plain and plain["reasoning_content"] is None
    thinking = message({"chat_template_kwargs": {"enable_thinking": True}})
    assert isinstance(thinking["reasoning_content"], str) and thinking["reasoning_content"]


def test_v13_a_user_profile_range_needs_a_numeric_type(tmp_path: Path) -> None:
    """``value_ranges`` of a ``[clients.NAME]`` profile: only on an int or float flag."""
    from supervisor.errors import ConfigError
    from tests.fixtures_config import write_local_config

    def config(ranges: str) -> Path:
        return write_local_config(
            tmp_path / "rw.toml",
            f"""
[clients.mygen]
scripts = ["gen.py"]
known_flags = ["--out", "--t", "--mode"]
value_types = {{ "--t" = "float", "--mode" = "str" }}
value_ranges = {ranges}
[clients.mygen.flags]
output_file = ["--out"]
""",
        )

    assert load_config(config('{ "--t" = [0.0, 2.0] }')).clients["mygen"].value_ranges
    with pytest.raises(ConfigError, match="a range needs a numeric type"):
        load_config(config('{ "--mode" = [0.0, 1.0] }'))
    with pytest.raises(ConfigError, match=r"expected \[low, high\] or \[low\]"):
        load_config(config('{ "--t" = [2.0, 1.0] }'))


def test_v12_clients_says_each_format_s_lines_and_the_sample_bound(tmp_path: Path) -> None:
    """``runwatch clients``: the marker and failed-request lines, the reasoning keys, the value
    rules and defaults, and what the sample flag bounds after a resume."""
    from tests.fixtures_config import write_local_config

    cfg = write_local_config(tmp_path / "rw.toml", "")
    out = CliRunner().invoke(cli, ["clients", "-c", str(cfg), "--json"])
    assert out.exit_code == 0, out.output
    data = {c["name"]: c for c in json.loads(out.output)["clients"]}
    assert data["modelopt"]["lines"]["failed_line"] == ["conversation_id"]
    assert data["modelopt"]["lines"]["end_marker"] == {"finished": True}
    assert data["specforge"]["lines"]["reasoning_keys"] == ["reasoning_content", "thinking"]
    assert data["specforge"]["value_ranges"]["--temperature"] == [0.0, 1.0]
    assert data["modelopt"]["defaults"]["--num_threads"] == "256"
    text = CliRunner().invoke(cli, ["clients", "-c", str(cfg)]).output
    assert 'failed-request line (a failed row, not missing): {"conversation_id": N}' in text
    assert "--temperature must be 0..1" in text
    assert "launched by runwatch the bound is the records at the launch plus it" in text


def test_v11_modelopt_failed_requests_end_to_end_restart_and_check(
    tmp_path: Path, demo_tokenizer: Path
) -> None:
    """The Model-Optimizer stand-in with ``--log_empty_conversations`` against a server that
    fails half its requests: the restart is not blocked, every row ends up done or failed (none
    missing), status and check agree, and check passes."""
    from supervisor.demo.server import MockSettings, serve_in_thread

    settings = MockSettings(decode_tps=100.0, mean_tokens=40, length_sigma=0.3, error_500=0.5)
    with serve_in_thread(settings) as server:
        run = ClientRun(
            tmp_path,
            "modelopt",
            server.url,
            demo_tokenizer,
            rows=16,
            extra=("--log_empty_conversations",),
        )

        async def go() -> RunView:
            async with Engine(run.config) as engine:
                assert (await engine.execute(await engine.plan("mo", action="launch"))).ok
                await _until(
                    engine, "mo", lambda rv: rv.state == "running" and len(run.lines()) >= 3
                )
                restarted = await engine.execute(await engine.plan("mo", action="restart"))
                assert restarted.ok, why(restarted)
                return await _until(
                    engine,
                    "mo",
                    lambda rv: (
                        rv.state == "stopped"
                        and rv.datasets
                        and (seen := _ds(rv).completeness) is not None
                        and seen.missing == 0
                    ),
                )

        rv = asyncio.run(go())
    lines = [json.loads(line) for line in run.lines()]
    failed = [r for r in lines if set(r) == {"conversation_id"}]
    assert failed and lines[-1] == {"finished": True}
    ds = _ds(rv)
    assert ds.verdict == "current" and ds.records == len(lines) - len(failed) - 1
    c = ds.completeness
    assert c is not None and (c.done, c.failed, c.missing) == (ds.records, len(failed), 0)
    r = CliRunner().invoke(cli, ["check", "mo", "-c", str(run.config_path)])
    assert r.exit_code == 0, r.output
    assert f"{len(failed)} failed requests logged" in r.output
    assert f"{ds.records} / 16 done, {len(failed)} failed" in r.output


async def test_v15_the_restart_screen_offers_no_budget_flag_to_a_client_without_one(
    tmp_path: Path, demo_tokenizer: Path
) -> None:
    """The launch screen of a Model-Optimizer run (no budget flag) does not suggest one."""
    from textual.widgets import Input

    from tui.app import make_app
    from tui.screens.restart import RestartScreen
    from tui.widgets.dataset_table import DatasetTable

    run = ClientRun(tmp_path, "modelopt", "http://127.0.0.1:9/v1", demo_tokenizer)
    _jsonl(run.output, MODELOPT_GENERATIONS[-1].records[:2])
    app = make_app(run.config, Engine(run.config))
    async with app.run_test(size=(100, 40)) as pilot:

        def table() -> DatasetTable | None:
            found = [t for t in app.screen.query(DatasetTable) if t.run_key == "local/mo"]
            return found[0] if found and app.refreshes >= 1 else None

        (await wait_for(table, 30, what="the run on the dashboard")).focus()
        await pilot.pause()
        await pilot.press("L")
        screen = await wait_for(
            lambda: app.screen if isinstance(app.screen, RestartScreen) else None, 10
        )
        placeholder = str(screen.query_one("#flags", Input).placeholder)
    assert "token-budget" not in placeholder and "no budget flag" in placeholder
