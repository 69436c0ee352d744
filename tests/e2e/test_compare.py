"""``supervisor.compare``: the arithmetic on hand-checked cases, then the inputs it collects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from supervisor.bench.history import append_history
from supervisor.bench.results import BenchResult, LevelResult
from supervisor.compare import (
    EndpointRate,
    Work,
    compare,
    endpoint_rates,
    estimate,
    format_lines,
    live_rates,
    pick_level,
    remaining_work,
    works_from_snapshot,
)
from supervisor.config import load_config
from supervisor.model import DatasetView, HostView, Rates, RunView, Snapshot
from tests.fixtures_config import write_local_config
from tests.waiting import wait_until

API = EndpointRate(
    endpoint="openrouter",
    kind="api",
    out_tok_per_s=4000.0,
    source="bench of 2026-11-30 01:23 (c=64)",
    price_in_per_m=0.6,
    price_out_per_m=2.5,
)
LOCAL = EndpointRate(
    endpoint="sglang",
    kind="local",
    out_tok_per_s=700.0,
    source="live rate (run eagle3)",
    gpu_cost_per_hour=20.0,
)


# --------------------------------------------------------------------------- remaining work


def test_budget_reached_leaves_nothing() -> None:
    # The story's B2: 2,912 responses, 10.7 M tokens, 10 M budget.
    w = remaining_work(
        "B2",
        done_samples=2912,
        done_completion_tokens=10_700_000,
        done_prompt_tokens=900_000,
        token_budget=10_000_000,
        max_samples=7000,
    )
    assert w == "token_budget reached"


def test_token_budget_bound() -> None:
    # 1,000 samples, 4 M tokens: 4,000 per sample, 300 prompt tokens per sample. Budget 10 M ->
    # 6 M tokens left = 1,500 samples (max_samples 7,000 would allow 24 M).
    w = remaining_work(
        "B3",
        done_samples=1000,
        done_completion_tokens=4_000_000,
        done_prompt_tokens=300_000,
        token_budget=10_000_000,
        max_samples=7000,
    )
    assert isinstance(w, Work)
    assert (w.remaining_tokens, w.remaining_samples) == (6_000_000, 1500)
    assert (w.avg_prompt_tokens, w.avg_completion_tokens, w.bound) == (300, 4000, "token_budget")


def test_max_samples_bound_comes_first() -> None:
    # 6,000 of 7,000 samples at 1,000 tokens each: 1 M tokens left, long before the 10 M budget.
    w = remaining_work(
        "B4",
        done_samples=6000,
        done_completion_tokens=6_000_000,
        done_prompt_tokens=600_000,
        token_budget=10_000_000,
        max_samples=7000,
    )
    assert isinstance(w, Work)
    assert (w.remaining_tokens, w.remaining_samples, w.bound) == (1_000_000, 1000, "max_samples")


def test_empty_dataset_uses_fallback_averages_or_says_why_not() -> None:
    w = remaining_work(
        "B8",
        done_samples=0,
        done_completion_tokens=0,
        done_prompt_tokens=0,
        token_budget=10_000_000,
        max_samples=None,
        fallback_avg=(300.0, 4000.0, "other datasets"),
    )
    assert isinstance(w, Work)
    assert (w.remaining_tokens, w.remaining_samples, w.averages_from) == (
        10_000_000,
        2500,
        "other datasets",
    )
    none = remaining_work(
        "B8",
        done_samples=0,
        done_completion_tokens=0,
        done_prompt_tokens=0,
        token_budget=10_000_000,
        max_samples=None,
    )
    assert none == "no responses yet to estimate tokens per sample from"
    assert (
        remaining_work(
            "B9",
            done_samples=5,
            done_completion_tokens=5,
            done_prompt_tokens=5,
            token_budget=None,
            max_samples=None,
        )
        == "no token_budget or max_samples"
    )


# --------------------------------------------------------------------------- estimates


B3 = Work(
    dataset="B3",
    remaining_tokens=6_000_000,
    remaining_samples=1500,
    avg_prompt_tokens=300,
    avg_completion_tokens=4000,
    bound="token_budget",
)
B8 = Work(
    dataset="B8",
    remaining_tokens=10_000_000,
    remaining_samples=2500,
    avg_prompt_tokens=300,
    avg_completion_tokens=4000,
    bound="token_budget",
)


def test_api_estimate_by_hand() -> None:
    e = estimate(B3, API)
    # 6 M tokens / 4,000 tok/s = 1,500 s. 1,500 x 300 prompt tokens x $0.60/M = $0.27,
    # 6 M x $2.50/M = $15.00.
    assert e.seconds == 1500.0
    assert e.cost_usd == pytest.approx(15.27)
    assert e.time_source == "bench of 2026-11-30 01:23 (c=64)"
    assert e.cost_source == "price table"


def test_local_estimate_by_hand() -> None:
    e = estimate(B3, LOCAL)
    # 6 M / 700 tok/s = 8,571.43 s = 2.381 h x $20/h = $47.62.
    assert e.seconds == pytest.approx(8571.428571)
    assert e.cost_usd == pytest.approx(47.619048)
    assert e.time_source == "live rate (run eagle3)"
    assert e.cost_source == "GPU time at $20/h"


def test_unmeasured_endpoint_has_cost_but_no_time() -> None:
    e = estimate(
        B3, EndpointRate(endpoint="x", kind="api", price_in_per_m=1.0, price_out_per_m=1.0)
    )
    assert e.seconds is None and e.time_source == "no measurement"
    assert e.cost_usd == pytest.approx((450_000 + 6_000_000) / 1e6)


def test_cost_from_the_bench_usage_when_no_price_table() -> None:
    rate = EndpointRate(
        endpoint="x",
        kind="api",
        out_tok_per_s=100.0,
        cost_per_request=0.01,
        completion_per_request=500,
    )
    e = estimate(B3, rate)
    assert e.cost_usd == pytest.approx(6_000_000 * 0.01 / 500)
    assert e.cost_source == "usage.cost of the bench"


def test_compare_answers_per_dataset_and_in_total() -> None:
    result = compare([B3, B8], [API, LOCAL])
    assert [d.answer for d in result.datasets] == [
        "B3: API: 25 min, $15; local: 2 h 23 min, $48 of GPU time",
        # 10 M / 4,000 = 2,500 s; 2,500 x 300 x 0.6/M + 10 M x 2.5/M = $25.45.
        # 10 M / 700 = 14,285.7 s = 3 h 58 min; x $20/h = $79.37.
        "B8: API: 42 min, $25; local: 3 h 58 min, $79 of GPU time",
    ]
    api_total, local_total = result.totals
    assert api_total.seconds == 4000.0 and api_total.cost_usd == pytest.approx(40.72)
    assert local_total.seconds == pytest.approx(16e6 / 700)
    assert local_total.cost_usd == pytest.approx(16e6 / 700 / 3600 * 20)
    assert (
        result.answer == "all 2 datasets: API: 1 h 07 min, $41; local: 6 h 21 min, $127 of GPU time"
    )
    lines = format_lines(result)
    text = "\n".join(lines)
    assert (
        "  openrouter (api): 4,000 output tok/s\n"
        "    rate from bench of 2026-11-30 01:23 (c=64)\n"
        "    cost from price table ($0.60 in / $2.50 out per M tokens)\n" in text + "\n"
    )
    assert (
        "  sglang (local): 700 output tok/s\n"
        "    rate from live rate (run eagle3)\n"
        "    cost from GPU time at $20/h" in text
    )
    assert "price table ($0.60 in / $2.50 out per M tokens)" in text
    # The answer to the question compare exists for, in one line.
    assert (
        lines[3] == "=> API finishes 5.7x sooner: 1 h 07 min vs 6 h 21 min, $41 vs $127 of GPU time"
    )
    assert max(len(ln) for ln in lines) <= 80


def test_two_endpoints_of_one_kind_are_named() -> None:
    other = EndpointRate(endpoint="together", kind="api", out_tok_per_s=8000.0, price_out_per_m=1.0)
    result = compare([B3], [API, other])
    assert result.datasets[0].answer.startswith("B3: API openrouter: 25 min, $15; API together: ")


# --------------------------------------------------------------------------- collected inputs


def _config(tmp_path: Path) -> Path:
    return write_local_config(
        tmp_path / "c.toml",
        f"""
[[runs]]
name = "eagle3"
host = "here"
workdir = "{tmp_path}"
argv = ["python3", "run_inference.py", "--datasets", "B1,B2"]
endpoint = "sglang"
[[runs]]
name = "api-run"
host = "here"
workdir = "{tmp_path}"
output_dir = "out-api"
argv = ["python3", "run_inference.py", "--datasets", "B2"]
endpoint = "openrouter"
[datasets.B1]
token_budget = 1_000_000
[datasets.B2]
token_budget = 1_000_000
[datasets.B3]
max_samples = 100
[[endpoints]]
name = "sglang"
kind = "local"
base_url = "http://127.0.0.1:1/v1"
gpu_cost_per_hour = 20.0
[[endpoints]]
name = "openrouter"
kind = "api"
base_url = "http://127.0.0.1:2/v1"
price_in_per_m = 0.6
price_out_per_m = 2.5
concurrency = 64
[[endpoints]]
name = "unmeasured"
kind = "api"
base_url = "http://127.0.0.1:3/v1"
""",
    )


def _ds(
    name: str, path: str, records: int, comp: int, prompt: int, tok_10m: float | None
) -> DatasetView:
    return DatasetView(
        name=name,
        path=path,
        records=records,
        unique_ids=records,
        completion_tokens=comp,
        prompt_tokens=prompt,
        rates=Rates(tok_per_s_10m=tok_10m),
    )


def _snapshot() -> Snapshot:
    local = RunView(
        name="eagle3",
        host="here",
        state="running",
        datasets=[
            _ds("B1", "/w/out/B1/raw_responses.jsonl", 100, 400_000, 30_000, 400.0),
            _ds("B2", "/w/out/B2/raw_responses.jsonl", 50, 200_000, 15_000, 300.0),
        ],
        # The run's own window across its datasets (the engine measures it; the datasets'
        # windows above are not added up).
        rates=Rates(tok_per_s=650.0, tok_per_s_err=65.0, responses=100, window_s=600.0),
    )
    api = RunView(
        name="api-run",
        host="here",
        state="stopped",
        datasets=[_ds("B2", "/w/out-api/B2/raw_responses.jsonl", 50, 200_000, 15_000, 9999.0)],
    )
    stranger = RunView(
        name="run_inference.py (pid 42)",
        host="here",
        state="running",
        configured=False,
        datasets=[_ds("B2", "/elsewhere/B2/raw_responses.jsonl", 7, 7_000, 700, 1e6)],
    )
    return Snapshot(
        time=1.0, hosts=[HostView(name="here", connected=True, runs=[local, api, stranger])]
    )


def _bench(endpoint: str, when: float, levels: list[tuple[int, float]]) -> BenchResult:
    return BenchResult(
        endpoint=endpoint,
        base_url="u",
        model="m",
        time=when,
        levels=[
            LevelResult(
                concurrency=c,
                requests=10,
                completed=10,
                output_tok_per_s=tok,
                completion_tokens=40_000,
                cost_usd=0.2,
                cost_source="usage.cost",
            )
            for c, tok in levels
        ],
    )


def test_live_rate_is_the_runs_own_window_not_a_sum_of_datasets(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path))
    # The stopped run's rates are history, not a measurement of its endpoint now; the running
    # run's rate is its own window (650), not its datasets' windows added up (400 + 300).
    (ep,) = live_rates(config, _snapshot()).items()
    assert ep[0] == "sglang"
    assert (ep[1].tok_per_s, ep[1].err, ep[1].runs) == (650.0, 65.0, ["eagle3"])


def test_endpoint_rates_live_else_latest_bench_of_the_runs_shape(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path))
    when = datetime(2026, 11, 30, 1, 23).timestamp()
    history = [
        _bench("openrouter", when - 3600, [(64, 1.0)]),
        _bench("openrouter", when, [(8, 2000.0), (64, 4000.0), (128, 5000.0)]),
        _bench("sglang", when, [(64, 99999.0)]),
    ]
    rates = {
        r.endpoint: r
        for r in endpoint_rates(
            config,
            live_rates(config, _snapshot()),
            history,
            server={"sglang": 700.0},
            now=when + 2 * 3600,
        )
    }
    assert (rates["sglang"].out_tok_per_s, rates["sglang"].out_tok_per_s_err) == (650.0, 65.0)
    assert rates["sglang"].source == "live rate (run eagle3: 100 responses over 10 min)"
    # The server made 50 tok/s more than reached the files.
    assert rates["sglang"].server_tok_per_s == 700.0 and rates["sglang"].gap_tok_per_s == 50.0
    # The level at the endpoint's configured concurrency (64), from the newest bench.
    assert rates["openrouter"].out_tok_per_s == 4000.0
    assert rates["openrouter"].source == "bench of 2026-11-30 01:23 (c=64), measured 2 h ago"
    assert rates["openrouter"].measured_at == when
    assert rates["openrouter"].shape_note is None
    assert rates["openrouter"].cost_per_request == pytest.approx(0.02)
    assert rates["unmeasured"].out_tok_per_s is None
    assert rates["unmeasured"].source == "no measurement (run `runwatch bench unmeasured`)"
    assert pick_level(history[1], None) is not None
    assert pick_level(history[1], None).concurrency == 128  # type: ignore[union-attr]


def test_a_bench_of_another_shape_is_marked(tmp_path: Path) -> None:
    """The newest bench ran at c=8 and c=128 only, streamed; the runs use c=64 without
    streaming: the bench is used (there is nothing else) and says how it differs."""
    text = (
        _config(tmp_path)
        .read_text()
        .replace("concurrency = 64", "concurrency = 64\nstream = false")
    )
    (tmp_path / "c2.toml").write_text(text)
    config = load_config(tmp_path / "c2.toml")
    bench = _bench("openrouter", 1.0e9, [(8, 2000.0), (128, 5000.0)])
    bench.stream = True
    (api,) = [r for r in endpoint_rates(config, {}, [bench]) if r.endpoint == "openrouter"]
    assert api.out_tok_per_s == 5000.0
    assert api.shape_note == (
        "bench of another shape: c=128, the runs use c=64; streamed, the runs are not streamed"
    )
    assert "(bench of another shape: c=128" in "\n".join(format_lines(compare([], [api])))


def test_works_add_up_a_dataset_written_by_two_runs(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path))
    works, skipped = works_from_snapshot(config, _snapshot())
    by = {w.dataset: w for w in works}
    # B2: 100 samples, 400,000 tokens in two files -> 600,000 left at 4,000 per sample.
    assert by["B2"].remaining_tokens == 600_000 and by["B2"].remaining_samples == 150
    assert by["B1"].remaining_tokens == 600_000
    # B3 has no data: estimated from the other datasets (200 samples, 800,000 tokens, 60,000
    # prompt tokens -> 4,000 and 300 per sample), 100 samples -> 400,000 tokens.
    assert by["B3"].averages_from == "other datasets"
    assert (by["B3"].remaining_tokens, by["B3"].avg_prompt_tokens) == (400_000, 300)
    assert skipped == {}


def test_datasets_of_an_unreachable_host_are_unknown_not_empty(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path))
    snap = Snapshot(
        time=1.0, hosts=[HostView(name="here", connected=False, error="connection refused")]
    )
    works, skipped = works_from_snapshot(config, snap)
    assert [w.dataset for w in works] == []  # B3 has no data anywhere to estimate from
    assert skipped["B1"] == skipped["B2"] == "host here not reachable (connection refused)"
    # Stale values (the host answered before) still count.
    stale = _snapshot()
    stale.hosts[0].connected, stale.hosts[0].stale = False, True
    works, skipped = works_from_snapshot(config, stale)
    assert {w.dataset for w in works} == {"B1", "B2", "B3"}


# --------------------------------------------------------------------------- the command


def test_compare_command_reads_data_files_and_bench_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real engine, real agent, real files: B1 half done, B2 over budget, benches in history."""
    work = tmp_path / "work"
    cfg = write_local_config(
        tmp_path / "c.toml",
        f"""
[[runs]]
name = "local-run"
host = "here"
workdir = "{work}"
argv = ["python3", "run_inference.py", "--datasets", "B1,B2"]
endpoint = "local"
[datasets.B1]
token_budget = 20_000
[datasets.B2]
token_budget = 1_000
[[endpoints]]
name = "local"
kind = "local"
base_url = "http://127.0.0.1:1/v1"
gpu_cost_per_hour = 36.0
[[endpoints]]
name = "api"
kind = "api"
base_url = "http://127.0.0.1:2/v1"
price_in_per_m = 1.0
price_out_per_m = 2.0
""",
        python=True,
    )
    for name, n in (("B1", 10), ("B2", 5)):
        d = work / "out" / name
        d.mkdir(parents=True)
        with (d / "raw_responses.jsonl").open("w") as f:
            for i in range(n):
                rec = {
                    "sample_id": f"{name}-{i}",
                    "output_ids": list(range(1000)),
                    "prompt_tokens": 100,
                    "completion_tokens": 1000,
                    "finish_reason": "stop",
                }
                f.write(json.dumps(rec) + "\n")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    append_history(_bench("local", 1.0e9, [(8, 100.0)]))
    append_history(_bench("api", 1.0e9, [(8, 1000.0)]))
    env = dict(os.environ)
    p = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "compare", "-c", str(cfg), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["skipped"] == {"B2": "token_budget reached"}
    (b1,) = out["datasets"]
    # B1: 10,000 of 20,000 tokens: 10,000 left = 10 samples of 100 prompt tokens.
    assert b1["work"]["remaining_tokens"] == 10_000
    local, api = b1["estimates"]
    assert local["seconds"] == pytest.approx(100.0) and local["cost_usd"] == pytest.approx(1.0)
    assert api["seconds"] == pytest.approx(10.0)
    assert api["cost_usd"] == pytest.approx((10 * 100 * 1.0 + 10_000 * 2.0) / 1e6)
    assert local["time_source"].startswith("bench of ")
    text = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "compare", "-c", str(cfg)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    ).stdout
    assert "B1: local: 2 min, $1.00 of GPU time; API: 10 s, $0.021" in text


async def test_a_cold_compare_answers_from_the_servers_counter_without_sampling_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_server: Any, demo_prompts: Any, spawn: Any
) -> None:
    """No rate history yet and a local run whose responses take minutes: its files cannot give
    a rate within ``--sample``, but its serving engine's counter does after a refresh or two, and
    compare answers from it then instead of refreshing until ``--sample`` runs out."""
    from supervisor.compare import gather_comparison
    from supervisor.engine import Engine
    from tests.fixtures_demo import reference_client_argv

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    h = mock_server(capacity_tps=400, decode_tps=50, mean_tokens=6000, max_running=4, tick_s=0.02)
    prompts = demo_prompts(("B1",), count=50)
    work = tmp_path / "work"
    work.mkdir()
    argv = reference_client_argv(h.url, prompts, work / "out", "B1", "--concurrency", "4")
    cfg = write_local_config(
        tmp_path / "c.toml",
        f"""
[[runs]]
name = "gen"
host = "here"
workdir = "{work}"
argv = {json.dumps(argv)}
endpoint = "local"
[[endpoints]]
name = "local"
kind = "local"
base_url = "{h.url}"
gpu_cost_per_hour = 10.0
""",
        top="refresh_seconds = 0.5",
        python=True,
    )
    spawn(argv, cwd=work)
    wait_until(lambda: h.stats()["active"] >= 4, 30, what="the mock busy")
    config = load_config(cfg)
    refreshes = 0
    async with Engine(config) as engine:
        plain = engine.refresh

        async def counted() -> Snapshot:
            nonlocal refreshes
            refreshes += 1
            return await plain()

        monkeypatch.setattr(engine, "refresh", counted)
        result = await gather_comparison(config, sample_s=20.0, engine=engine)
    (local,) = result.rates
    assert local.source.startswith("server counters"), local.source
    assert local.out_tok_per_s is not None and 0 < local.out_tok_per_s <= 401
    # 20 s of sampling at 0.5 s would be some forty refreshes; the counter needs two.
    assert refreshes <= 5, refreshes
