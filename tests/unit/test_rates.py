"""Rates, ETAs, the over-budget projection and stalls, with injected time."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from supervisor.agent.scan import Scanner
from supervisor.completeness import with_client_parts
from supervisor.config import DatasetConfig, EndpointConfig
from supervisor.demo.prompts import write_prompts
from supervisor.model import DatasetView, Identity, ProcessInfo, Rates, RunFlags, RunView
from supervisor.rates import (
    IDLE_S,
    CostInfo,
    RateTracker,
    Trackers,
    build_dataset_view,
    nearest_in_prompts,
    project,
    run_waste,
)


def scan(records: int, tokens: int, size: int | None = None, **extra: object) -> dict[str, object]:
    base: dict[str, object] = {
        "path": "/data/out/B2/raw_responses.jsonl",
        "state": "ok",
        "records": records,
        "unique_ids": records,
        "duplicates": 0,
        "prompt_tokens": 0,
        "completion_tokens": tokens,
        "finish_reasons": {"stop": records},
        "bad_lines": [],
        "bad_lines_total": 0,
        "partial_tail_bytes": 0,
        "verdict": "current",
        "verdict_detail": None,
        "size": size if size is not None else tokens * 7,
        "stream": "s:1",
        "texts": [],
    }
    base.update(extra)
    return base


def test_windowed_rates_are_exact() -> None:
    t = RateTracker()
    for i in range(0, 1201, 10):  # 0.5 req/s, 175 tok/s for 20 minutes
        t.observe(1000.0 + i, i // 2, i * 175)
    r = t.rates(2200.0)
    assert r.req_per_s_1m == pytest.approx(0.5)
    assert r.req_per_s_10m == pytest.approx(0.5)
    assert r.tok_per_s_all == pytest.approx(175)
    assert len(t.history()) == 60 and t.history()[-1] == pytest.approx(175)


def test_windows_see_a_change_of_pace() -> None:
    t = RateTracker()
    for i in range(0, 601, 10):
        t.observe(float(i), i, i * 10)  # 1 req/s for 10 minutes
    for i in range(610, 1201, 10):
        t.observe(float(i), 600, 6000)  # then nothing
    r = t.rates(1200.0)
    assert r.req_per_s_1m == 0
    assert r.req_per_s_10m == 0
    assert r.req_per_s_all == pytest.approx(0.5)


def test_no_rate_from_a_single_observation() -> None:
    t = RateTracker()
    t.observe(5.0, 10, 100)
    assert t.rate(60, 5.0) == (None, None)
    t.observe(5.5, 11, 110)  # closer than a second
    assert t.rates(5.5).req_per_s_all is None


def test_a_new_stream_or_a_shrinking_count_restarts_the_history() -> None:
    t = RateTracker()
    t.observe(0.0, 100, 1000, stream="a:1")
    t.observe(60.0, 160, 1600, stream="a:1")
    assert t.rates(60.0).req_per_s_all == pytest.approx(1.0)
    t.observe(120.0, 10, 100, stream="a:2")  # rescanned after truncation
    assert t.rates(120.0).req_per_s_all is None
    t.observe(180.0, 70, 700, stream="a:2")
    assert t.rates(180.0).req_per_s_all == pytest.approx(1.0)
    t.observe(240.0, 5, 50, stream="a:2")  # count went down: no negative rates
    assert t.rates(240.0).req_per_s_all is None


def test_a_restarted_history_is_not_idle_since_the_old_ones_last_growth() -> None:
    # The persisted history of an earlier, longer file last grew ten minutes ago; the file is
    # now shorter (started afresh). It is not "quiet for ten minutes" (which made a run's live
    # dataset look done, at 0 tok/s) but new.
    t = RateTracker()
    t.seed([(0.0, 100, 60_000), (60.0, 120, 72_000)])
    t.observe(660.0, 86, 47_500, size=1000, stream="a:1")
    assert t.since_growth(661.0) == pytest.approx(1.0)


def test_a_seeded_history_starts_after_its_file_last_shrank() -> None:
    # The persisted ring of a path holds an earlier file (up to 123 responses) and then the
    # current one (from 86): a one-shot status gave 72.9 tok/s where the dashboard, which had
    # seen the drop, gave 216. Only the current file's points count.
    t = RateTracker()
    old = [(float(s), 100 + s // 10, 60_000 + 100 * s) for s in range(0, 240, 10)]
    new = [(300.0 + s, 86 + s // 10, 47_500 + 200 * s) for s in range(0, 300, 10)]
    t.seed(old + new)
    r = t.rates(590.0)
    assert r.tok_per_s == pytest.approx(200.0)
    assert r.window_s == pytest.approx(290.0)


def test_the_story_over_budget_without_token_budget() -> None:
    """B2: past its 10 M budget, --max-samples far away, no --token-budget."""
    tracker = RateTracker()
    ds = DatasetConfig(token_budget=10_000_000, max_samples=4940)
    flags = RunFlags(max_samples=4940)
    build_dataset_view(scan(2040, 10_200_000), ds, flags, tracker, None, True, 0.0)
    view = build_dataset_view(scan(2140, 10_700_000), ds, flags, tracker, None, True, 900.0)
    p = view.projection
    assert view.name == "B2"
    assert view.over_budget
    assert view.rates.req_per_s_all == pytest.approx(1 / 9)
    assert p.stop_reason == "max_samples"
    assert p.over_budget_tokens == 700_000
    assert p.remaining_samples == 2800
    assert p.remaining_tokens == 14_000_000
    assert p.remaining_s == pytest.approx(7 * 3600)
    assert p.waste_tokens == 14_700_000
    assert p.waste_cost_usd is None
    assert p.message == "10.7 M / 10 M, +14 M projected over 7 h - no --token-budget"


def test_waste_is_priced_per_output_token_or_per_gpu_hour() -> None:
    kw = dict(
        done=2140,
        tokens=10_700_000,
        records=2140,
        req_rate=1 / 9,
        tok_rate=5000 / 9,
        max_samples=4940,
        run_token_budget=None,
        budget=10_000_000,
        prompts=None,
        writer_alive=True,
    )
    api = project(**kw, cost=CostInfo(price_out_per_m=2.5))  # type: ignore[arg-type]
    assert api.waste_cost_usd == pytest.approx(14.7 * 2.5)
    assert api.message is not None and api.message.endswith("no --token-budget, ~$37 wasted")
    gpu = project(**kw, cost=CostInfo(gpu_cost_per_hour=20.0))  # type: ignore[arg-type]
    assert gpu.waste_cost_usd == pytest.approx(14_700_000 / (5000 / 9) / 3600 * 20)
    ep = EndpointConfig(name="x", kind="api", base_url="http://h/v1", price_out_per_m=2.5)
    assert CostInfo.from_endpoint(ep) == CostInfo(price_out_per_m=2.5)
    assert CostInfo.from_endpoint(None) is None


def test_a_run_with_token_budget_stops_there_and_wastes_nothing() -> None:
    p = project(
        done=1000,
        tokens=8_000_000,
        records=1000,
        req_rate=0.25,
        tok_rate=2000.0,
        max_samples=7000,
        run_token_budget=10_000_000,
        budget=10_000_000,
        prompts=None,
        writer_alive=True,
        cost=CostInfo(price_out_per_m=2.5),
    )
    assert p.stop_reason == "token_budget"
    assert p.eta_s == pytest.approx(1000.0)
    assert p.remaining_tokens == 2_000_000 and p.remaining_samples == 250
    assert p.waste_tokens == 0 and p.waste_cost_usd is None
    assert p.etas == {"max_samples": 24000.0, "token_budget": 1000.0}
    assert p.message == "8 M / 10 M, stops at --token-budget in 17 min"


def test_waste_is_said_before_any_rate_is_known() -> None:
    """One look at the files (a one-shot status): no rate, but the waste is already certain."""
    p = project(
        done=86,
        tokens=47_532,
        records=86,
        req_rate=None,
        tok_rate=None,
        max_samples=400,
        run_token_budget=None,
        budget=50_000,
        prompts=None,
        writer_alive=True,
        cost=CostInfo(price_out_per_m=2.5),
    )
    assert p.eta_s is None and p.waste_tokens == 47_532 + 173_547 - 50_000
    assert p.message == (
        "47.5 k / 50 k, +171 k over budget by --max-samples - no --token-budget, ~$0.43 wasted"
    )


def test_small_waste_costs_keep_their_cents() -> None:
    base = dict(
        done=100,
        tokens=60_000,
        records=100,
        req_rate=0.5,
        tok_rate=300.0,
        max_samples=110,
        run_token_budget=None,
        budget=50_000,
        prompts=None,
        writer_alive=True,
    )
    cheap = project(**base, cost=CostInfo(price_out_per_m=2.5))  # type: ignore[arg-type]
    assert cheap.waste_cost_usd == pytest.approx(0.04)
    assert cheap.message is not None and cheap.message.endswith("~$0.04 wasted")
    tiny = project(**base, cost=CostInfo(price_out_per_m=0.25))  # type: ignore[arg-type]
    assert tiny.message is not None and tiny.message.endswith("~$0.004 wasted")


def test_a_dataset_at_its_token_budget_says_so() -> None:
    p = project(
        done=184,
        tokens=106_776,
        records=184,
        req_rate=None,
        tok_rate=None,
        max_samples=400,
        run_token_budget=100_000,
        budget=100_000,
        prompts=None,
        writer_alive=True,
        cost=None,
    )
    assert (p.stop_reason, p.eta_s) == ("token_budget", 0.0)
    assert p.message == "107 k / 100 k, --token-budget reached"


def test_will_pass_the_budget_before_max_samples() -> None:
    p = project(
        done=1000,
        tokens=8_000_000,
        records=1000,
        req_rate=0.25,
        tok_rate=2000.0,
        max_samples=2000,
        run_token_budget=None,
        budget=10_000_000,
        prompts=None,
        writer_alive=True,
        cost=None,
    )
    assert p.stop_reason == "max_samples"
    assert p.waste_tokens == 6_000_000
    assert p.etas["budget"] == pytest.approx(1000.0)
    assert p.message == (
        "8 M / 10 M, passes budget in 17 min, +6 M over by --max-samples - no --token-budget"
    )


def test_prompts_running_out_come_first() -> None:
    p = project(
        done=900,
        tokens=900_000,
        records=900,
        req_rate=1.0,
        tok_rate=1000.0,
        max_samples=7000,
        run_token_budget=None,
        budget=None,
        prompts=1000,
        writer_alive=True,
        cost=None,
    )
    assert (p.stop_reason, p.eta_s, p.remaining_samples) == ("prompts", 100.0, 100)
    assert p.message is None


def test_stopped_writer_projects_nothing() -> None:
    p = project(
        done=2912,
        tokens=10_700_000,
        records=2912,
        req_rate=None,
        tok_rate=None,
        max_samples=7000,
        run_token_budget=None,
        budget=10_000_000,
        prompts=None,
        writer_alive=False,
        cost=None,
    )
    assert p.eta_s is None and p.over_budget_tokens == 700_000
    assert p.waste_tokens == 700_000
    assert p.message == "10.7 M / 10 M - over budget, stopped"


def test_stall_needs_a_live_writer_and_no_growth() -> None:
    tracker = RateTracker()
    ds = DatasetConfig(token_budget=10_000_000)
    # It grew while watched (it has started): only then can it stall.
    build_dataset_view(scan(9, 900, size=450), ds, None, tracker, None, True, -1.0)
    for t in (0.0, 100.0, 200.0):
        v = build_dataset_view(
            scan(10, 1000, size=500), ds, None, tracker, None, True, t, stall_seconds=300
        )
        assert not v.stalled
    v = build_dataset_view(
        scan(10, 1000, size=500), ds, None, tracker, None, True, 300.0, stall_seconds=300
    )
    assert v.stalled
    dead = build_dataset_view(
        scan(10, 1000, size=500), ds, None, tracker, None, False, 400.0, stall_seconds=300
    )
    assert not dead.stalled
    # A partial line being written is growth too.
    v = build_dataset_view(
        scan(10, 1000, size=600), ds, None, tracker, None, True, 500.0, stall_seconds=300
    )
    assert not v.stalled


def test_tokenizer_formats_count_texts_once_per_stream() -> None:
    tracker = RateTracker()
    seen: list[list[str]] = []

    def count(texts: list[str]) -> int:
        seen.append(texts)
        return sum(len(t.split()) for t in texts)

    s1 = scan(2, 0, texts=["a b c", "d e"], stream="x:1")
    v = build_dataset_view(s1, None, None, tracker, None, True, 0.0, count_texts=count)
    assert v.completion_tokens == 5
    s2 = scan(3, 0, texts=["f"], stream="x:1")
    assert (
        build_dataset_view(
            s2, None, None, tracker, None, True, 10.0, count_texts=count
        ).completion_tokens
        == 6
    )
    s3 = scan(1, 0, texts=["g h"], stream="x:2")  # rescanned: start again
    assert (
        build_dataset_view(
            s3, None, None, tracker, None, True, 20.0, count_texts=count
        ).completion_tokens
        == 2
    )
    assert seen == [["a b c", "d e"], ["f"], ["g h"]]


def test_missing_file_view() -> None:
    missing = {
        "path": "/x/B9/raw_responses.jsonl",
        "state": "missing",
        "verdict": "missing",
        "error": "no such file",
    }
    v = build_dataset_view(missing, None, None, RateTracker(), None, True, 0.0)
    assert (v.name, v.state, v.verdict, v.records, v.stalled) == (
        "B9",
        "missing",
        "missing",
        0,
        False,
    )


def test_a_missing_file_has_no_rate_from_an_earlier_file_at_its_path() -> None:
    # The persisted history of a file since deleted (a demo started afresh, a dataset moved
    # aside) gave a file that does not exist 2,180 tok/s and an ETA.
    tracker = RateTracker()
    tracker.seed([(float(t), 4 * t, 2400 * t) for t in range(0, 60, 10)])
    assert tracker.rates(50.0).tok_per_s is not None
    missing = {"path": "/x/B6/raw_responses.jsonl", "state": "missing", "verdict": "missing"}
    ds = DatasetConfig(token_budget=100_000, max_samples=400)
    v = build_dataset_view(missing, ds, None, tracker, None, True, 51.0)
    assert v.rates.tok_per_s is None and v.rates.tok_per_s_all is None
    assert v.projection.eta_s is None
    assert tracker.latest() is None  # not "seen" either: it has not started
    # The file appears: its own rate, from its own counts only.
    build_dataset_view(scan(1, 600), ds, None, tracker, None, True, 52.0)
    v = build_dataset_view(scan(5, 2000), ds, None, tracker, None, True, 62.0)
    assert v.rates.tok_per_s == pytest.approx(140.0)


def test_progress_counts_distinct_ids() -> None:
    v = build_dataset_view(
        scan(10, 100, unique_ids=7, duplicates=3),
        None,
        RunFlags(max_samples=10),
        RateTracker(),
        None,
        True,
        0.0,
    )
    assert v.projection.remaining_samples == 3


def test_trackers_registry() -> None:
    reg = Trackers()
    a = reg.get(("h", "/p"))
    assert reg.get(("h", "/p")) is a
    reg.drop(("h", "/p"))
    assert reg.get(("h", "/p")) is not a


def test_views_from_successive_real_scans(tmp_path: Path) -> None:
    from supervisor.agent.scan import Scanner
    from tests.fixtures_data import raw_lines

    lines, _ = raw_lines(90, seed=60)
    path = tmp_path / "B4" / "raw_responses.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"")
    scanner, tracker = Scanner(), RateTracker()
    ds = DatasetConfig(token_budget=10**9, max_samples=150)
    views = []
    for step in range(3):  # 30 records per minute
        with path.open("ab") as f:
            f.write(b"".join(lines[step * 30 : (step + 1) * 30]))
        r = scanner.scan(str(path))
        views.append(
            build_dataset_view(r, ds, RunFlags(max_samples=150), tracker, None, True, 60.0 * step)
        )
    v = views[-1]
    assert (v.name, v.records, v.unique_ids) == ("B4", 90, 90)
    assert v.rates.req_per_s_1m == pytest.approx(0.5)
    assert v.rates.req_per_s_all == pytest.approx(0.5)
    tokens = sum(json.loads(x)["completion_tokens"] for x in lines)
    assert v.completion_tokens == tokens
    assert v.rates.tok_per_s_all == pytest.approx((tokens - views[0].completion_tokens) / 120.0)
    assert v.projection.stop_reason == "max_samples"
    assert v.projection.eta_s == pytest.approx(60 / 0.5)
    assert v.history and not v.stalled and not v.over_budget


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_trackers_not_asked_for_are_dropped_unless_they_hold_a_text_tally() -> None:
    clock = _Clock()
    trackers = Trackers(clock=clock)
    gone_file = trackers.get(("h", "/gone/B1.jsonl"))
    gone_file.observe(100.0, 10, 1000, stream="s")
    texts = trackers.get(("h", "/gone/texts.jsonl"))
    texts.add_text_tokens("s", 500)
    clock.now += IDLE_S / 2
    kept = trackers.get(("h", "/live/B1.jsonl"))
    assert trackers.prune() == []  # nothing idle that long yet
    clock.now += IDLE_S / 2 + 1
    trackers.get(("h", "/live/B1.jsonl"))  # asked for at every refresh
    assert trackers.prune() == [("h", "/gone/B1.jsonl")]
    assert len(trackers) == 2
    # The one still asked for is the same tracker; the text tally survives the idle time.
    assert trackers.get(("h", "/live/B1.jsonl")) is kept
    assert trackers.get(("h", "/gone/texts.jsonl")).text_tokens("s") == 500
    # A dropped file that comes back starts a new tracker (seeded again from the history).
    assert trackers.get(("h", "/gone/B1.jsonl")) is not gone_file


# Issue 36, "rates after a restart or a switch": five minutes after the switch `compare` said
# "API 57 ± 1 min" (true ~33): the 10-minute window held the previous writer's output and the
# idle minutes between. The window of a dataset is its current writer's.
def _switch(tracker: RateTracker, since: float | None) -> list[DatasetView]:
    """Writer A at 70 tok/s for 20 minutes, 5 idle minutes, then writer B (started at t=1500)
    at 500 tok/s, observed every 10 s; the views from B's start on."""
    ds = DatasetConfig(token_budget=10_000_000)
    views = []
    tokens, records = 0, 0
    for t in range(0, 1200, 10):
        build_dataset_view(
            scan(records, tokens), ds, None, tracker, None, True, float(t), writer=("a", 1)
        )
        tokens, records = tokens + 700, records + 1
    for t in range(1200, 1500, 10):  # A stopped: nothing writes
        build_dataset_view(scan(records, tokens), ds, None, tracker, None, False, float(t))
    for t in range(1500, 1800, 10):
        view = build_dataset_view(
            scan(records, tokens), ds, None, tracker, None, True, float(t),
            writer=("b", 2), writer_since=since,
        )  # fmt: skip
        views.append(view)
        tokens, records = tokens + 5000, records + 5
    return views


def test_after_a_switch_the_rate_is_the_new_writers_within_its_error_bar() -> None:
    views = _switch(RateTracker(), since=1500.0)
    first, last = views[0].rates, views[-1].rates
    assert first.tok_per_s is None  # nothing under the new writer yet: no rate, not the old one
    assert last.tok_per_s is not None and last.tok_per_s_err is not None
    assert abs(last.tok_per_s - 500.0) <= last.tok_per_s_err
    assert last.window_s == pytest.approx(290.0)
    assert last.tok_per_s_all == pytest.approx(500.0)
    # Without the writer's start the same window mixes the idle gap in: far outside its bar.
    mixed = _switch(RateTracker(), since=None)[-1].rates
    assert mixed.tok_per_s is not None and mixed.tok_per_s_err is not None
    assert abs(mixed.tok_per_s - 500.0) > 3 * mixed.tok_per_s_err


def test_a_seeded_history_of_an_earlier_writer_is_dropped_at_the_new_writers_start() -> None:
    # A one-shot `compare` (a fresh process) seeds from the persisted history: the earlier
    # writer's points and the idle gap are in it.
    t = RateTracker()
    old = [(float(s), s // 10, 70 * s) for s in range(0, 1200, 10)]
    idle = [(float(s), 119, 83_300) for s in range(1200, 1500, 10)]
    new = [(1500.0 + s, 119 + s // 2, 83_300 + 500 * s) for s in range(0, 300, 10)]
    t.seed(old + idle + new)
    t.since(1500.0)
    r = t.rates(1790.0)
    assert r.tok_per_s == pytest.approx(500.0)
    assert r.window_s == pytest.approx(290.0)
    t.since(1500.0)  # the same writer again: nothing more dropped
    assert t.rates(1790.0).window_s == pytest.approx(290.0)


def test_the_whole_waste_of_a_run_counts_the_datasets_not_started_as_a_guess() -> None:
    """The incident's run: B1 done under its budget, B2 past it with 2,800 samples to go, B3 and
    B4 not started; every dataset has a 10 M budget and 4,940 samples, the run no
    --token-budget, on GPUs at $15 an hour. Left alone it makes B2's waste and, past their
    budgets, what B3 and B4 will make at the run's average tokens per response."""
    budget, samples = 10_000_000, 4940
    ds = DatasetConfig(token_budget=budget, max_samples=samples)
    flags = RunFlags(max_samples=samples)
    cost = CostInfo(gpu_cost_per_hour=15.0)

    def view(name: str, records: int, tokens: int) -> DatasetView:
        tracker = RateTracker()
        first = scan(records - 100, tokens - 500_000, path=f"/o/{name}/raw_responses.jsonl")
        build_dataset_view(first, ds, flags, tracker, cost, True, 0.0)
        now = scan(records, tokens, path=f"/o/{name}/raw_responses.jsonl")
        return build_dataset_view(now, ds, flags, tracker, cost, True, 900.0)

    b1 = view("B1", samples, 9_000_000)
    b2 = view("B2", 2140, 10_700_000)
    missing = [
        build_dataset_view(
            {"path": f"/o/{n}/raw_responses.jsonl", "state": "missing", "verdict": "missing"},
            ds,
            flags,
            RateTracker(),
            cost,
            True,
            900.0,
        )
        for n in ("B3", "B4")
    ]
    run = RunView(
        name="eagle3-kimi",
        host="gpu",
        state="running",
        process=_process(flags),
        datasets=[b1, b2, *missing],
        rates=Rates(tok_per_s=500.0),
    )
    waste = run_waste(run, cost)
    assert waste is not None
    average = (9_000_000 + 10_700_000) / (samples + 2140)
    guessed = round(samples * average) - budget  # per dataset not started
    assert b1.projection.waste_tokens == 0 and b2.projection.waste_tokens == 14_700_000
    assert waste.tokens == 14_700_000 + 2 * guessed
    assert (waste.datasets, waste.guessed) == (["B2", "B3", "B4"], ["B3", "B4"])
    assert waste.seconds == pytest.approx(waste.tokens / 500.0)
    assert waste.cost_usd == pytest.approx(waste.tokens / 500.0 / 3600 * 15.0)
    assert waste.message.startswith("left alone: +")
    assert "past budgets in B2, B3, B4 over ~" in waste.message, waste.message
    assert "; B3, B4 not started: guessed from the run's " in waste.message, waste.message
    # With its budget flag the run stops at each budget: nothing is waste.
    with_flag = msgspec.structs.replace(run, process=_process(RunFlags(token_budget=budget)))
    assert run_waste(with_flag, cost) is None
    assert run_waste(msgspec.structs.replace(run, state="stopped"), cost) is None


def _process(flags: RunFlags) -> ProcessInfo:
    identity = Identity(boot_id="b", pid=42, start_time=1, uid=0, argv=("python3", "x.py"))
    return ProcessInfo(
        identity=identity, user="u", uptime_s=1.0, cpu_percent=0.0, rss_mb=1.0, state="S",
        flags=flags,
    )  # fmt: skip


def test_datasets_not_started_are_projected_from_the_dataset_with_the_nearest_prompts(
    tmp_path: Path,
) -> None:
    """The incident's skew: B1's short questions got short answers (1,822 tokens each), B2's
    longer instructions long ones (3,659). B3 (long documents) and B7 (very short questions) are
    not started: each is projected at the answers of the started dataset whose prompts, as the
    host's scanner reads them from the demo's prompt files, are nearest its own in length (B3 at
    B2's, B7 at B1's), not at the run's average that B1's many short answers pull down. B4's
    prompt file is unreadable: it stays a guess, said so."""
    prompts = write_prompts(tmp_path / "prompts", ("B1", "B2", "B3", "B7"), count=400)
    budget, samples = 10_000_000, 4940
    ds = DatasetConfig(token_budget=budget, max_samples=samples)
    flags = RunFlags(max_samples=samples)
    cost = CostInfo(gpu_cost_per_hour=15.0)
    scanner = Scanner()

    def view(name: str, records: int, tokens: int) -> DatasetView:
        data = str(tmp_path / "out" / name / "raw_responses.jsonl")
        prompt_file = str(prompts.get(name, tmp_path / "prompts" / f"{name}.jsonl"))
        read = scanner.scan(data, fmt="raw", input_file={"path": prompt_file, "id": "sample_id"})
        tracker = RateTracker()
        if records:
            first = scan(records - 100, tokens - 500_000, path=data)
            build_dataset_view(first, ds, flags, tracker, cost, True, 0.0)
            now = {**scan(records, tokens, path=data), "prompt_lengths": read["prompt_lengths"]}
        else:
            now = read
        return with_client_parts(
            build_dataset_view(now, ds, flags, tracker, cost, True, 900.0), now
        )

    b1 = view("B1", samples, 9_000_000)
    b2 = view("B2", 2916, 10_670_000)
    b3, b7, b4 = view("B3", 0, 0), view("B7", 0, 0), view("B4", 0, 0)
    assert b1.prompt_chars and b2.prompt_chars and b3.prompt_chars and b7.prompt_chars
    assert b7.prompt_chars < b1.prompt_chars < b2.prompt_chars < b3.prompt_chars
    assert b4.prompt_chars is None  # no prompt file: its length is unknown
    run = RunView(
        name="eagle3-kimi",
        host="gpu",
        state="running",
        process=_process(flags),
        datasets=[b1, b2, b3, b4, b7],
        rates=Rates(tok_per_s=500.0),
    )
    waste = run_waste(run, cost)
    assert waste is not None
    long, short = 10_670_000 / 2916, 9_000_000 / samples
    average = (9_000_000 + 10_670_000) / (samples + 2916)
    # B7 at B1's short answers stays under its budget (4,940 x 1,822): no waste, where the
    # run's average (4,940 x 2,504) would have made 2.4 M of it.
    assert waste.like == {"B3": "B2"}
    assert nearest_in_prompts(b7, run.datasets) is b1
    assert waste.guessed == ["B4"]
    b2_waste = b2.projection.waste_tokens
    assert waste.tokens == (
        b2_waste
        + round(samples * long)
        - budget  # B3, at B2's answers
        + round(samples * average)
        - budget  # B4, the guess
    )
    assert waste.datasets == ["B2", "B3", "B4"]
    assert "; B3 not started: at B2's 3.7 k tokens per response (prompts nearest in length), " in (
        waste.message
    ), waste.message
    assert "2,733 samples to budget" in waste.message, waste.message  # the average's: 3,994
    assert "; B4 not started: guessed from the run's " in waste.message, waste.message
    assert short < average < long
