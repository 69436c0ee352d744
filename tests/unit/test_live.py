"""Rates that mean one thing: a run's rate over a window across its datasets (a dataset switch
counted once), a done dataset at 0, uncertainties, and the history that makes a one-shot
``status`` or ``compare`` answer with rates at once."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import random
import sqlite3
from array import array
from pathlib import Path

import pytest

from supervisor import history, rates
from supervisor.compare import compare, endpoint_rates, format_lines, works_from_snapshot
from supervisor.config import Config, load_config
from supervisor.engine import Engine
from supervisor.history import History, history_path
from supervisor.live import Live
from supervisor.model import DatasetView, HostView, Rates, RunFlags, RunView, Snapshot
from tests.fixtures_config import write_local_config

PER_RESPONSE = 1000
"""Completion tokens of every response in these cases."""


def _scan(path: str, n: int | None) -> dict[str, object]:
    if n is None:
        return {"path": path, "state": "missing"}
    return {
        "path": path,
        "state": "ok",
        "records": n,
        "unique_ids": n,
        "completion_tokens": n * PER_RESPONSE,
        "size": n * 10,
        "stream": "s:1",
    }


def _look(live: Live, trackers: rates.Trackers, t: float, b5: int, b6: int | None) -> RunView:
    views = []
    for name, n in (("B5", b5), ("B6", b6)):
        path = f"/w/out/{name}/raw_responses.jsonl"
        tracker = live.dataset_tracker(trackers, "gpu1", path)
        view = rates.build_dataset_view(
            _scan(path, n), None, RunFlags(), tracker, None, True, t, name=name
        )
        live.record_dataset("gpu1", view, tracker)
        views.append(view)
    run = RunView(name="eagle3", host="gpu1", state="running", datasets=views)
    live.moved_on("gpu1", run, trackers, True, t)
    live.run_rates("gpu1", run, True, t)
    return run


def test_a_dataset_switch_is_counted_once_and_the_finished_dataset_is_at_zero() -> None:
    """Hand-worked: 6 responses of 1,000 tokens a minute (100 tok/s). B5 is written from t=0 to
    t=600 and then never again; B6 from t=600 on (its file appears at t=660). At t=900:

    - the run: 10-minute window from t=300 (30 responses) to t=900 (60 + 30): 60 responses,
      60,000 tokens / 600 s = 100 tok/s, error 100 / sqrt(60) = 12.9 tok/s;
    - adding the datasets' own windows would say 50 (B5: 30,000 / 600 s) + 100 (B6) = 150;
    - B5 has not grown for 300 s while B6 grew: done, rate 0; B6: 24,000 / 240 s = 100.
    """
    live = Live(Config(), persist=False)
    trackers = rates.Trackers()
    run = None
    for step in range(16):
        t = 60.0 * step
        b5 = 6 * min(step, 10)
        b6 = None if step <= 10 else 6 * (step - 10)
        run = _look(live, trackers, t, b5, b6)
    assert run is not None
    assert run.rates.tok_per_s == pytest.approx(100.0)
    assert run.rates.tok_per_s_err == pytest.approx(100.0 / math.sqrt(60))
    assert (run.rates.window_s, run.rates.responses) == (600.0, 60)
    v5, v6 = run.datasets
    assert v5.done and v5.rates.tok_per_s == 0.0 and v5.rates.tok_per_s_1m == 0.0
    assert not v6.done and v6.rates.tok_per_s == pytest.approx(100.0)
    naive = (trackers.get(("gpu1", v5.path)).rates(900.0).tok_per_s_10m or 0) + (
        v6.rates.tok_per_s_10m or 0
    )
    assert naive == pytest.approx(150.0)  # what adding up the windows would have claimed
    assert run.history and run.history[-1] == pytest.approx(100.0)


def test_a_quiet_dataset_is_not_done_while_the_next_has_not_started() -> None:
    """B5 has not grown for 5 minutes, but B6 has no file yet: nothing shows that the run moved
    on (it may be stalled, which is another warning), so B5 is not marked done."""
    live = Live(Config(), persist=False)
    trackers = rates.Trackers()
    _look(live, trackers, 0.0, 6, None)
    run = _look(live, trackers, 300.0, 6, None)
    assert not run.datasets[0].done


def test_a_missing_file_shows_no_rate_or_trend_from_the_history_of_an_earlier_one() -> None:
    """The history kept for B6's path (a run before the demo started afresh) has it at 6
    responses a minute; now there is no B6 file: no rate, no ETA, no sparkline."""
    live = Live(Config(), persist=False)
    b6 = "ds|gpu1|/w/out/B6/raw_responses.jsonl"
    for step in range(10):
        live.history.add(b6, 60.0 * step, 6 * step, 6 * step * PER_RESPONSE)
    trackers = rates.Trackers()
    run = _look(live, trackers, 600.0, 6, None)
    run = _look(live, trackers, 610.0, 7, None)
    six = run.datasets[1]
    assert six.state == "missing"
    assert six.rates.tok_per_s is None and six.projection.eta_s is None
    assert six.history == []


def test_a_rate_is_shown_only_when_its_window_holds_enough_responses() -> None:
    t = rates.RateTracker()
    t.observe(0.0, 0, 0)
    t.observe(30.0, rates.MIN_RESPONSES - 1, 3000)
    assert t.rates(30.0).tok_per_s is None and t.rates(30.0).tok_per_s_1m == 100.0
    t.observe(40.0, rates.MIN_RESPONSES, 4000)
    shown = t.rates(40.0)
    assert shown.tok_per_s == 100.0 and shown.tok_per_s_err == pytest.approx(50.0)


def test_history_is_bounded_saved_as_it_changes_and_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    h = History(path)
    for i in range(3000):
        h.add("k", 1000.0 + i * 5.0, float(i))
        if i % 97 == 0:  # saves along the way: each writes what changed since the last
            h.save(now=1000.0 + i * 5.0)
    assert len(h.points("k")) <= 1080
    # Points are 10 s apart except the newest, which is always the latest observation.
    pts = h.points("k")
    assert pts[-1] == (1000.0 + 2999 * 5.0, 2999.0)
    assert all(b[0] - a[0] >= 10.0 for a, b in itertools.pairwise(pts[:-1]))
    h.save(now=pts[-1][0])
    h.close()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = History(path)
    again.load()
    # The file holds the ring as it is: what a full ring let go and the newest points
    # replaced are gone from it too.
    assert again.points("k") == pts
    with contextlib.closing(sqlite3.connect(path)) as db:
        # What a full ring let go is deleted from the file every TRIM_EVERY saves.
        (rows,) = db.execute("SELECT count(*) FROM points").fetchone()
        assert len(pts) <= rows <= len(pts) + history.TRIM_EVERY
    # Rings not updated for a day are dropped; a corrupt file is ignored, then replaced.
    again.save(now=pts[-1][0] + 2 * 86400)
    again.close()
    assert History(path).keys() == []
    path.write_bytes(b"not a database" * 100)
    broken = History(path)
    broken.load()
    assert broken.keys() == [] and broken.points("k") == []
    broken.add("k2", 5.0, 1.0)
    broken.save(now=5.0)
    broken.close()
    assert History(path).points("k2") == [(5.0, 1.0)]


def test_history_saves_only_what_changed_and_shares_the_file(tmp_path: Path) -> None:
    """Two processes' histories of one config (a watcher and a dashboard) on one file: each
    save writes its new points, the other reads them when it first asks for the ring."""
    path = tmp_path / "h.db"
    a, b = History(path), History(path)
    for i in range(50):
        a.add("run|h|x", 100.0 + 10 * i, float(i))
    a.save(now=600.0)
    assert b.points("run|h|x") == a.points("run|h|x")
    statements: list[str] = []
    a._connect().set_trace_callback(statements.append)  # type: ignore[union-attr]
    a.add("run|h|x", 600.0, 50.0)
    a.save(now=600.0)
    writes = [s for s in statements if s.startswith(("INSERT", "DELETE", "UPDATE"))]
    # One new point, one row: a save's cost is what changed, not the history's length.
    assert len(writes) == 1 and "600.0" in writes[0], writes
    a.close()
    b.close()


def _every_rate(pts: list[tuple[float, ...]], column: int, limit: int) -> list[float]:
    """``History.rates`` the long way: every interval of the ring, then the last ``limit``."""
    if len(pts) >= 3 and pts[-1][0] - pts[-2][0] < 10.0:
        pts = pts[:-1]
    out = []
    for a, b in itertools.pairwise(pts):
        dt = b[0] - a[0]
        if dt > 0 and len(a) > column and len(b) > column and b[column] >= a[column]:
            out.append((b[column] - a[column]) / dt)
    return out[-limit:]


def test_history_rates_read_from_the_newest_point_are_every_rates_last(tmp_path: Path) -> None:
    """Rescans (counts going down), a short newest interval, times out of order and short points
    in rings as loaded from disk: the last ``limit`` rates are those of the whole ring."""
    rng = random.Random(5)
    rings = {}
    for k in range(60):
        t, count, pts = 1000.0, 0, []
        for _ in range(rng.randint(1, 300)):
            t += rng.choice([10.0, 10.0, 12.5, 3.0, 0.0, -1.0])
            count = rng.randint(0, 50) if rng.random() < 0.05 else count + rng.randint(0, 900)
            pts.append([t, count, count * 3] if rng.random() > 0.02 else [t])
        rings[f"k{k}"] = pts
    # As another process left them on disk: one row per (ring, time).
    path = tmp_path / "h.db"
    with contextlib.closing(History(path)) as writer:
        writer.load()
        db = writer._connect()
        assert db is not None
        for key, pts in rings.items():
            rows = {p[0]: array("d", p[1:]).tobytes() for p in pts}
            db.executemany("INSERT INTO points VALUES (?, ?, ?)", [(key, *r) for r in rows.items()])
    h = History(path)
    h.load()
    assert sorted(h.keys()) == sorted(rings)
    for key in rings:
        points = h.points(key)
        for column, limit in ((1, 120), (2, 120), (2, 7), (2, 1)):
            assert h.rates(key, column, limit) == _every_rate(points, column, limit), (key, limit)
    assert h.rates("absent") == []


async def test_a_one_shot_refresh_has_rates_from_the_history(tmp_path: Path) -> None:
    """One engine looks at the files and closes (saving its history); a minute later (the saved
    times are moved back 60 s), a new engine's first refresh already has a rate."""
    work = tmp_path / "work"
    data = work / "out" / "B1" / "raw_responses.jsonl"
    data.parent.mkdir(parents=True)

    def write(n: int) -> None:
        with data.open("a") as f:
            for i in range(n):
                rec = {
                    "sample_id": f"{data.stat().st_size if data.exists() else 0}-{i}",
                    "output_ids": [1] * 10,
                    "prompt_tokens": 5,
                    "completion_tokens": PER_RESPONSE,
                    "finish_reason": "stop",
                }
                f.write(json.dumps(rec) + "\n")

    cfg = write_local_config(
        tmp_path / "c.toml",
        f"""
[[runs]]
name = "gen"
host = "here"
workdir = "{work}"
argv = ["python3", "run_inference.py", "--datasets", "B1"]
""",
        python=True,
    )
    config = load_config(cfg)
    write(10)
    async with Engine(config) as engine:
        first = await engine.refresh()
    assert first.hosts[0].runs[0].datasets[0].rates.tok_per_s_all is None  # one look: no rate
    saved = history_path(config.key)
    with contextlib.closing(sqlite3.connect(saved)) as db, db:
        db.execute("UPDATE points SET t = t - 60.0")
    write(12)
    async with Engine(config) as engine:
        snap = await engine.refresh()
    (ds,) = snap.hosts[0].runs[0].datasets
    # 12 responses of 1,000 tokens in about 60 s. The run is stopped (no process): its rate is
    # 0 now, but the dataset's history says what it made.
    assert ds.rates.tok_per_s_all == pytest.approx(12_000 / 60, rel=0.05)
    assert ds.history and ds.history[-1] == pytest.approx(200.0, rel=0.05)


# --------------------------------------------------------------------------- compare by hand


def _compare_config(tmp_path: Path) -> Config:
    cfg = write_local_config(
        tmp_path / "c.toml",
        """
[[runs]]
name = "gen"
host = "here"
workdir = "/w"
argv = ["python3", "run_inference.py", "--datasets", "B1", "--token-budget", "50000"]
endpoint = "local"
[datasets.B1]
token_budget = 100_000
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
    )
    return load_config(cfg)


def test_compare_is_bounded_by_the_runs_own_token_budget(tmp_path: Path) -> None:
    """Hand-worked: B1 holds 30 responses, 30,000 tokens (3,000 prompt tokens). The run's
    --token-budget 50,000 stops it before the config's 100,000: 20,000 tokens (20 responses)
    are left, not 70,000. The run makes 100 ± 10 tok/s: 200 ± 20 s, and at $36/h of GPU time
    $2.00 ± $0.20. The API (no rate measured): 20 x 100 prompt + 20,000 completion tokens at
    $1/$2 per M = $0.042."""
    config = _compare_config(tmp_path)
    ds = DatasetView(
        name="B1",
        path="/w/out/B1/raw_responses.jsonl",
        records=30,
        unique_ids=30,
        completion_tokens=30_000,
        prompt_tokens=3_000,
        token_budget=100_000,
        run_token_budget=50_000,
    )
    run = RunView(
        name="gen",
        host="here",
        state="running",
        datasets=[ds],
        rates=Rates(tok_per_s=100.0, tok_per_s_err=10.0, responses=100, window_s=600.0),
    )
    snap = Snapshot(time=1.0, hosts=[HostView(name="here", connected=True, runs=[run])])
    (work,), _ = works_from_snapshot(config, snap)
    assert (work.remaining_tokens, work.remaining_samples, work.bound) == (
        20_000,
        20,
        "token_budget",
    )
    from supervisor.compare import live_rates

    result = compare([work], endpoint_rates(config, live_rates(config, snap), []))
    local, api = result.datasets[0].estimates
    assert (local.seconds, local.seconds_err) == pytest.approx((200.0, 20.0))
    assert (local.cost_usd, local.cost_err) == pytest.approx((2.0, 0.2))
    assert api.seconds is None and api.cost_usd == pytest.approx(0.042)
    lines = format_lines(result)
    assert lines[0] == "B1: local: 200 ± 20 s, $2.00 ± $0.20 of GPU time; API: -, $0.042"
    assert "  local (local): 100 ± 10 output tok/s" in lines


def test_compare_across_a_dataset_switch(tmp_path: Path) -> None:
    """Hand-worked, on the switch above at t=900: B5 is done (60 responses, its budget 60,000
    reached), B6 holds 30 responses (30,000 tokens) of its 60,000 budget: 30,000 tokens left.
    The endpoint's rate is the run's window, 100 ± 12.9 tok/s (not 50 + 100 = 150): B6 needs
    300 ± 39 s, and at $36/h of GPU time $3.00 ± $0.39."""
    cfg = write_local_config(
        tmp_path / "c.toml",
        """
[[runs]]
name = "eagle3"
host = "here"
workdir = "/w"
argv = ["python3", "run_inference.py", "--datasets", "B5,B6"]
endpoint = "local"
[datasets.B5]
token_budget = 60_000
[datasets.B6]
token_budget = 60_000
[[endpoints]]
name = "local"
kind = "local"
base_url = "http://127.0.0.1:1/v1"
gpu_cost_per_hour = 36.0
""",
    )
    config = load_config(cfg)
    live = Live(config, persist=False)
    trackers = rates.Trackers()
    run = None
    for step in range(16):
        b6 = None if step <= 10 else 6 * (step - 10)
        run = _look(live, trackers, 60.0 * step, 6 * min(step, 10), b6)
    assert run is not None
    snap = Snapshot(time=900.0, hosts=[HostView(name="here", connected=True, runs=[run])])
    from supervisor.compare import live_rates

    works, skipped = works_from_snapshot(config, snap)
    assert skipped == {"B5": "token_budget reached"}
    (work6,) = works
    assert work6.remaining_tokens == 30_000
    (local,) = endpoint_rates(config, live_rates(config, snap), [])
    assert local.out_tok_per_s == pytest.approx(100.0)
    (est,) = compare(works, [local]).datasets[0].estimates
    assert est.seconds == pytest.approx(300.0)
    assert est.seconds_err == pytest.approx(300.0 / math.sqrt(60))
    assert (est.cost_usd, est.cost_err) == pytest.approx((3.0, 3.0 / math.sqrt(60)))


def test_a_save_while_another_process_writes_leaves_its_points_to_the_next(
    tmp_path: Path,
) -> None:
    """Another process of the config holds the file's write lock (writing, or stopped with
    Ctrl-Z while it did): the save gives up its turn at once and keeps its points, which the
    next save writes."""
    path = tmp_path / "h.db"
    h = History(path)
    h.add("run|h|x", 100.0, 1.0)
    h.save(now=100.0)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    h.add("run|h|x", 110.0, 2.0)
    h.save(now=110.0)
    kept = h.dirty
    other.execute("ROLLBACK")
    other.close()
    h.save(now=110.0)
    assert (kept, h.dirty) == (True, False)
    h.close()
    assert History(path).points("run|h|x") == [(100.0, 1.0), (110.0, 2.0)]
