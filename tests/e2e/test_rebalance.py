"""``runwatch rebalance``: the split of the remaining datasets between the runs' endpoints, worked
out by hand on small cases, then carried out on real runs against real mock servers."""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.compare import EndpointRate, Work, compare
from supervisor.demo.prompts import write_prompts
from supervisor.errors import UsageError
from supervisor.rebalance import RESTART_S, Slot, parse_deadline, plan
from tests.fixtures_actions import (
    bench_endpoint,
    datasets_of,
    pids_by_run,
    rebalance_applied,
    status_json,
)
from tests.fixtures_config import write_local_config
from tests.waiting import wait_until

# The local GPU: 100 output tok/s, free; the API: 1,000 tok/s at $2.50 per M output tokens.
LOCAL = EndpointRate(
    endpoint="gpu", kind="local", out_tok_per_s=100.0, out_tok_per_s_err=10.0, gpu_cost_per_hour=0
)
API = EndpointRate(
    endpoint="api", kind="api", out_tok_per_s=1000.0, out_tok_per_s_err=50.0, price_out_per_m=2.5
)
TOKENS = 10_000.0  # per dataset: 100 s on the GPU, 10 s on the API, $0.025 on the API


def _work(name: str, tokens: float = TOKENS) -> Work:
    return Work(
        dataset=name,
        remaining_tokens=tokens,
        remaining_samples=tokens / 1000,
        avg_prompt_tokens=0.0,
        avg_completion_tokens=1000.0,
        bound="token_budget",
    )


def _slots(local: list[str], api: list[str]) -> list[Slot]:
    return [
        Slot(run="local", host="h", endpoint="gpu", kind="local", datasets=local, running=True),
        Slot(run="cloud", host="h", endpoint="api", kind="api", datasets=api, running=True),
    ]


def _brute_force(
    names: list[str], deadline: float | None, cap: float | None
) -> tuple[float, float]:
    """(seconds, cost) of the best split, by the rule the module states, for datasets of
    ``TOKENS`` each, all on the GPU now: a slot's time is the sum of its datasets' times, plus
    ``RESTART_S`` for a slot whose datasets change."""
    per = {"gpu": (TOKENS / 100.0, 0.0), "api": (TOKENS / 1000.0, TOKENS * 2.5 / 1e6)}
    options = []
    for choice in itertools.product(("gpu", "api"), repeat=len(names)):
        moved = "api" in choice  # the GPU gives, the API takes: both restart
        secs = max(
            sum(per[e][0] for e in choice if e == ep) + (RESTART_S if moved else 0.0)
            for ep in ("gpu", "api")
            if ep in choice
        )
        cost = sum(per[e][1] for e in choice)
        if cap is None or cost <= cap + 1e-12:
            options.append((secs, cost))
    meeting = [o for o in options if deadline is not None and o[0] <= deadline]
    if meeting:
        return min(meeting, key=lambda o: (o[1], o[0]))
    return min(options)


@pytest.mark.parametrize(
    ("deadline", "cap"),
    [(None, None), (None, 0.05), (None, 0.075), (250.0, None), (450.0, None), (150.0, 0.05)],
)
def test_the_plan_is_the_best_split_by_the_stated_rule(
    deadline: float | None, cap: float | None
) -> None:
    names = ["B1", "B2", "B3", "B4"]
    comparison = compare([_work(n) for n in names], [LOCAL, API])
    result = plan(comparison, _slots(names, []), deadline_s=deadline, max_usd=cap)
    assert result.refused is None, result.refused
    assert result.plan is not None
    secs, cost = _brute_force(names, deadline, cap)
    assert result.plan.seconds == pytest.approx(secs)
    assert result.plan.cost_usd == pytest.approx(cost)
    if deadline is not None:
        assert result.plan.meets_deadline == (secs <= deadline)
    if cap is not None:
        assert result.plan.within_cap


def test_a_deadline_the_cap_forbids_says_so_and_gives_the_fastest_within_it() -> None:
    names = ["B1", "B2", "B3", "B4"]
    comparison = compare([_work(n) for n in names], [LOCAL, API])
    # Two datasets on the API at most ($0.05): the GPU needs 200 s for the other two.
    result = plan(comparison, _slots(names, []), deadline_s=60.0, max_usd=0.05)
    assert result.plan is not None
    assert result.plan.meets_deadline is False
    assert result.plan.seconds == pytest.approx(200.0 + RESTART_S)
    assert "cannot finish within 1 min for at most $0.05" in result.verdict
    assert "ends in 3 min" in result.verdict


def test_a_cap_below_every_option_is_refused_naming_the_cheapest() -> None:
    comparison = compare([_work("B1")], [API])
    slots = [Slot(run="cloud", host="h", endpoint="api", kind="api", datasets=["B1"])]
    result = plan(comparison, slots, deadline_s=None, max_usd=0.01)
    assert result.plan is None and result.steps == []
    assert result.refused is not None
    assert "no split costs at most $0.01" in result.refused
    assert "$0.03" in result.refused  # all on api: $0.025


def test_an_endpoint_without_a_measured_rate_is_refused_saying_how_to_measure() -> None:
    unmeasured = EndpointRate(endpoint="api", kind="api", price_out_per_m=2.5)
    comparison = compare([_work("B1")], [LOCAL, unmeasured])
    result = plan(comparison, _slots(["B1"], []), deadline_s=None, max_usd=None)
    assert result.refused is not None and "no throughput measured for api" in result.refused
    assert "runwatch bench" in result.refused and result.steps == []


def test_steps_stop_the_givers_before_the_takers_start() -> None:
    names = ["B1", "B2", "B3", "B4"]
    comparison = compare([_work(n) for n in names], [LOCAL, API])
    result = plan(comparison, _slots(["B1", "B2"], ["B3", "B4"]), deadline_s=None, max_usd=None)
    assert result.plan is not None
    # Fastest: everything on the API (40 s).
    assert [(s.run, s.action, s.datasets) for s in result.steps] == [
        ("local", "stop", []),
        ("cloud", "restart", ["B1", "B2", "B3", "B4"]),
    ]
    assert {(m.dataset, m.from_run, m.to_run) for m in result.moves} == {
        ("B1", "local", "cloud"),
        ("B2", "local", "cloud"),
    }
    names_of = {o.name for o in result.alternatives}
    assert names_of == {"as now", "all on gpu", "all on api"}


def test_a_finished_dataset_is_dropped_and_a_run_left_with_none_is_stopped() -> None:
    comparison = compare([_work("B2")], [LOCAL, API])
    comparison.skipped = {"B1": "token_budget reached"}
    result = plan(comparison, _slots(["B1", "B2"], ["B3"]), deadline_s=None, max_usd=None)
    assert result.kept["B1"] == "token_budget reached"
    assert [(s.run, s.action) for s in result.steps] == [("local", "stop"), ("cloud", "restart")]
    assert result.steps[1].datasets == ["B2", "B3"]  # B3: no work left, but the run keeps it


def test_a_pinned_dataset_and_a_frozen_run_stay_as_they_are() -> None:
    names = ["B1", "B2", "B3"]
    comparison = compare([_work(n) for n in names], [LOCAL, API])
    slots = _slots(["B1", "B2"], ["B3"])
    slots[0].frozen = True
    pinned = {"B1": "its data is legacy", "B2": "its run local also writes B1"}
    result = plan(comparison, slots, deadline_s=None, max_usd=None, pinned=pinned)
    assert result.plan is not None
    assert result.steps == []  # the frozen run neither gives nor takes
    assert result.plan.seconds == pytest.approx(200.0)
    assert result.kept["B1"].startswith("stays with its run: its data is legacy")


def test_a_dataset_never_moves_to_a_run_of_another_model() -> None:
    """The API is faster, but it serves another model: moving a dataset there would mix two
    models' outputs in one data set (and the start's fingerprint check refuses it), so the plan
    keeps every dataset with a run of its own model and says why."""
    names = ["B1", "B2"]
    comparison = compare([_work(n) for n in names], [LOCAL, API])
    slots = _slots(names, [])
    slots[0].model = "big-model"
    slots[1].model = "other-model"
    result = plan(comparison, slots, deadline_s=None, max_usd=None)
    assert result.plan is not None
    assert result.steps == [] and result.moves == []
    assert "own model (other-model)" in result.kept["cloud"]
    all_api = next(o for o in result.alternatives if o.name == "all on api")
    assert all_api.possible is False
    # The same runs on one model: the API takes datasets.
    slots[1].model = "big-model"
    moved = plan(comparison, slots, deadline_s=None, max_usd=None)
    assert moved.moves and all(m.to_run == "cloud" for m in moved.moves)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("45m", 2700.0), ("2h", 7200.0), ("1h30m", 5400.0), ("90s", 90.0), ("600", 600.0)],
)
def test_deadlines_read_as_written(text: str, seconds: float) -> None:
    assert parse_deadline(text) == seconds


@pytest.mark.parametrize("text", ["soon", "5x", "m5", "-3m", ""])
def test_a_deadline_that_is_not_a_duration_says_how_to_write_it(text: str) -> None:
    with pytest.raises(UsageError, match="45m, 2h, 1h30m"):
        parse_deadline(text)


# --------------------------------------------------------------------------- on real runs

DATASETS = ("B1", "B2", "B3", "B4")
SAMPLES = 150  # per dataset, ~100 tokens each: ~15,000 tokens a dataset
PRICE_OUT = 20.0  # USD per million output tokens of the "API"


def _two_run_config(
    root: Path,
    local_url: str,
    api_url: str,
    flags: dict[str, list[str]] | None = None,
    *,
    datasets: tuple[str, str] = ("B1,B2,B3", "B4"),
    gpu_cost: float = 36.0,
) -> Path:
    """Runs ``local`` (B1-B3 on the GPU) and ``cloud`` (B4 on the API), each with its ``flags``
    added (and the ``datasets`` their command lines name, the GPU's cost an hour)."""
    from tests.fixtures_actions import KEY_ENV, RUN_INFERENCE

    work = root / "work"
    write_prompts(work / "prompts", list(DATASETS), count=SAMPLES)

    def run(name: str, datasets: str, url: str, endpoint: str, concurrency: int) -> str:
        argv = [
            sys.executable, str(RUN_INFERENCE), "--datasets", datasets, "--api-base", url,
            "--api-key-env", KEY_ENV, "--model", "demo-model", "--max-samples", str(SAMPLES),
            "--concurrency", str(concurrency), "--output-dir", "data", "--prompts-dir",
            "prompts", "--report-seconds", "1", *(flags or {}).get(name, []),
        ]  # fmt: skip
        return (
            f'[[runs]]\nname = "{name}"\nhost = "here"\nworkdir = {json.dumps(str(work))}\n'
            f'argv = {json.dumps(argv)}\noutput_dir = "data"\nendpoint = "{endpoint}"\n'
            f'log = "logs/{name}.log"\n'
        )

    body = (
        run("local", datasets[0], local_url, "gpu", 16)
        + run("cloud", datasets[1], api_url, "api", 16)
        + "".join(
            f'[datasets.{d}]\nmax_samples = {SAMPLES}\nprompts = "prompts/{d}.jsonl"\n'
            for d in DATASETS
        )
        + f'[[endpoints]]\nname = "gpu"\nkind = "local"\nbase_url = "{local_url}"\n'
        f"gpu_cost_per_hour = {gpu_cost}\n"
        f'[[endpoints]]\nname = "api"\nkind = "api"\nbase_url = "{api_url}"\n'
        f'api_key_env = "{KEY_ENV}"\nprice_in_per_m = 0.0\nprice_out_per_m = {PRICE_OUT}\n'
    )
    return write_local_config(root / "runwatch.toml", body, python=True)


# Its time is compared with a projection measured on this machine: alone, the pace it measured
# holds while it runs (four workers beside it change the pace under it).
@pytest.mark.serial
def test_rebalance_apply_moves_datasets_and_finishes_as_projected(
    tmp_path: Path,
    state_home: Path,
    mock_server: Any,
    kill_runs_in: list[Path],
) -> None:
    """Two runs of the reference client against two real mock servers (a slow "GPU" priced
    by the hour, a fast "API" priced per token): the GPU run is running, the API run is not (a
    bench measured it). The plan, applied with --apply --yes, moves the datasets it gives the
    API run and launches it; no dataset gets two writers or a duplicate, every dataset ends
    complete, and the work ends within 15 % of the projected time and cost."""
    from tests.fixtures_actions import API_KEY, runwatch

    local = mock_server(capacity_tps=500.0, mean_tokens=100, length_sigma=0.2, seed=1)
    api = mock_server(
        capacity_tps=1500.0, mean_tokens=100, length_sigma=0.2, seed=2, api_key=API_KEY,
        price_in=0.0, price_out=PRICE_OUT,
    )  # fmt: skip
    cfg = _two_run_config(tmp_path, local.url, api.url)
    kill_runs_in.append(tmp_path / "work")
    p = runwatch("-c", str(cfg), "launch", "local", "--yes")
    assert p.returncode == 0, p.stdout + p.stderr
    # The API run is not running: its rate comes from a bench of its shape, as a user gets it.
    p = runwatch(
        "-c", str(cfg), "bench", "api", "--prompts", "B4", "--requests", "150",
        "--concurrency", "16", "--json",
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr

    # The local rate needs responses over a window: until then the plan is refused and nothing
    # changes.
    api_before = api.stats()
    last: list[str] = []

    def applied_once() -> dict[str, Any] | None:
        p = runwatch("-c", str(cfg), "rebalance", "--max-usd", "2.0", "--apply", "--yes", "--json")
        last[:] = [p.stdout + p.stderr]
        out = json.loads(p.stdout) if p.stdout.strip() else None
        if out is not None and "steps" in out and "ok" in out:
            return dict(out)
        assert out is not None and "no throughput measured" in str(out.get("refused")), last
        return None

    try:
        # A bound on a condition, not a pace: on a loaded machine each call takes seconds.
        applied = wait_until(applied_once, timeout=240, interval=0.5)
    except AssertionError:
        raise AssertionError(f"never applied: {last}") from None
    assert applied["ok"] is True, applied
    result = applied["plan"]
    assert result["plan"]["within_cap"] is True
    moved = {m["dataset"]: m["to_run"] for m in result["moves"]}
    assert any(to == "cloud" for to in moved.values()), result
    assert ("cloud", "launch") in {(st["run"], st["action"]) for st in result["steps"]}
    projected_s = result["plan"]["seconds"]
    projected_usd = result["plan"]["cost_usd"]
    seen: list[float] = []

    def finished() -> dict[str, Any] | None:
        st = status_json(cfg)
        seen.append(time.time())
        runs = [r for h in st["hosts"] for r in h["runs"] if r.get("configured", True)]
        done = all(r["state"] != "running" for r in runs)
        # Done once every run has stopped and the plan's end is recorded (the refresh that saw
        # its last records).
        return st if done and st["plan"] and st["plan"]["ended_at"] is not None else None

    final = wait_until(finished, timeout=max(300.0, 6 * projected_s), interval=1.0)
    assert final, "the runs did not finish"
    # The projection counts from the moment the steps began (after planning and the start
    # checks, whatever they took on this machine), as status shows it.
    start = final["plan"]["started_at"]
    assert result["time"] <= start <= seen[0], (result["time"], start)
    by_name = datasets_of(final)
    ends = []
    for d in DATASETS:
        path = tmp_path / "work" / "data" / d / "raw_responses.jsonl"
        ids = [json.loads(line)["sample_id"] for line in path.read_text().splitlines()]
        assert len(ids) == len(set(ids)) == SAMPLES, (d, len(ids), len(set(ids)))
        assert all(v["duplicates"] == 0 for v in by_name[d])
        ends.append(path.stat().st_mtime)
    end = dict(zip(DATASETS, ends, strict=True))
    # Each share's run writes its datasets from the end of its step (restart or launch): its
    # time is then to its last record, plus the restart the projection counts for it. The steps
    # take what they take on this machine (one after another, givers first; long under load):
    # that is the machine's pace, not the projection's.
    stepped = {o["run"]: o["at"] for o in applied["steps"] if o["ok"]}
    assert set(stepped) == {st["run"] for st in result["steps"]}, applied["steps"]
    took = max(
        max(end[d] for d in sh["datasets"])
        - stepped.get(sh["run"], start)
        + (RESTART_S if sh["run"] in stepped else 0.0)
        for sh in result["plan"]["shares"]
        if sh["datasets"]
    )
    print(f"\nrebalance: took {took:.1f} s, projected {projected_s:.1f} s")
    assert took == pytest.approx(projected_s, rel=0.15), (took, result["plan"])
    spent = (api.stats()["completion_tokens"] - api_before["completion_tokens"]) * PRICE_OUT / 1e6
    # The GPU is paid by the hour while the GPU run works: until its last dataset's last record.
    local_share = next(s for s in result["plan"]["shares"] if s["run"] == "local")
    if local_share["datasets"]:
        spent += (max(end[d] for d in local_share["datasets"]) - start) * 36.0 / 3600.0
    print(f"rebalance: spent ${spent:.3f}, projected ${projected_usd:.3f}")
    assert spent == pytest.approx(projected_usd, rel=0.15), (spent, result["plan"])
    # status shows the plan done, with how the projection held: it ended when a refresh first
    # saw the last record, no earlier than it was written and no later than the refresh that
    # found every run stopped.
    plan_now = final["plan"]
    assert max(ends) - 0.05 <= plan_now["ended_at"] <= seen[-1], (plan_now, max(ends), seen[-1])
    assert plan_now["projected_end"] == pytest.approx(start + projected_s)
    text = runwatch("-c", str(cfg), "status").stdout
    assert "done at" in text and "projected" in text, text


def test_runs_that_cannot_take_datasets_are_kept_and_a_down_host_refuses(tmp_path: Path) -> None:
    from supervisor.config import load_config
    from supervisor.model import DatasetView, HostView, RunView, Snapshot
    from supervisor.rebalance import slots_from

    cfg = load_config(
        write_local_config(
            tmp_path / "c.toml",
            f"""
[[runs]]
name = "ref"
host = "here"
workdir = "{tmp_path}"
argv = ["python3", "run_inference.py", "--datasets", "B1", "--api-base", "http://127.0.0.1:1/v1"]
endpoint = "api"
[[runs]]
name = "sf"
host = "here"
workdir = "{tmp_path}"
argv = ["python3", "regenerate_train_data.py", "--input-file-path", "in.jsonl",
        "--output-file-path", "out.jsonl", "--resume"]
endpoint = "api"
[[runs]]
name = "bare"
host = "here"
workdir = "{tmp_path}"
argv = ["python3", "run_inference.py", "--datasets", "B2"]
[[endpoints]]
name = "api"
kind = "api"
base_url = "http://127.0.0.1:1/v1"
""",
        )
    )
    runs = [
        RunView(name="ref", host="here", datasets=[DatasetView(name="B1", path="/x/B1")]),
        RunView(name="sf", host="here", datasets=[DatasetView(name="out", path="/x/out")]),
        RunView(name="bare", host="here", datasets=[DatasetView(name="B2", path="/x/B2")]),
    ]
    up = Snapshot(time=1.0, hosts=[HostView(name="here", connected=True, runs=runs)])
    slots, kept, pinned, refused = slots_from(cfg, up)
    assert refused is None and pinned == {}
    assert [s.run for s in slots] == ["ref"]
    assert "no dataset flag" in kept["sf"] and "specforge" in kept["sf"]
    assert "names no endpoint" in kept["bare"]
    down = Snapshot(
        time=1.0, hosts=[HostView(name="here", connected=False, error="timed out", runs=runs)]
    )
    slots, kept, pinned, refused = slots_from(cfg, down)
    assert slots == [] and refused is not None
    assert "host here of run ref is down (timed out)" in refused and "nothing moved" in refused


async def test_apply_refuses_a_plan_that_misses_its_deadline_and_changes_nothing() -> None:
    """A deadline the cap makes impossible: the plan says so, and --apply refuses it whole
    (the engine is never asked to plan, stop or start anything)."""
    from supervisor.rebalance import apply

    names = ["B1", "B2", "B3", "B4"]
    comparison = compare([_work(n) for n in names], [LOCAL, API])
    result = plan(comparison, _slots(names, []), deadline_s=60.0, max_usd=0.05)
    assert result.plan is not None and result.plan.meets_deadline is False and result.steps

    class NoEngine:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the engine was asked for {name}")

    said: list[str] = []
    outcomes = await apply(NoEngine(), result, on_step=said.append)
    assert [o.ok for o in outcomes] == [False]
    assert "cannot finish within 1 min" in outcomes[0].detail
    assert "nothing changed" in outcomes[0].detail and said and said[0].startswith("refused")


def test_a_refusal_names_the_cheapest_split_that_can_be_made_not_one_ruled_out() -> None:
    """The cheapest option on paper moves a dataset that must stay: the refusal names the
    cheapest split the rules allow."""
    paid = EndpointRate(
        endpoint="gpu", kind="local", out_tok_per_s=100.0, gpu_cost_per_hour=36.0
    )  # $1.00 a dataset
    comparison = compare([_work("B1"), _work("B2")], [paid, API])
    slots = _slots(["B1", "B2"], [])
    slots[0].frozen = True
    pinned = {"B1": "its data is legacy", "B2": "its run local also writes B1"}
    result = plan(comparison, slots, deadline_s=None, max_usd=0.5, pinned=pinned)
    assert result.refused is not None
    assert "the cheapest that can be made costs $2.00" in result.refused, result.refused
    impossible = [a for a in result.alternatives if not a.possible]
    assert [a.name for a in impossible] == ["all on api"]


def test_a_runs_model_is_read_as_the_starts_fingerprint_reads_it() -> None:
    """Rebalance and the gate's fingerprint read a run's model through one function
    (``fingerprint.model_of``): the last model flag given (``--model-name`` over ``--model``),
    else the endpoint's; two runs that differ only in ``--model-name`` are of two models."""
    from supervisor.fingerprint import model_of

    argvs = [
        ["gen.py", "--model", "m", "--model-name", "qwen-8b"],
        ["gen.py", "--model-name", "qwen-8b", "--model", "m"],
        ["gen.py", "--model", "m"],
        ["gen.py"],
    ]
    assert model_of(argvs[0], None) == model_of(argvs[1], None) == "qwen-8b"
    assert model_of(argvs[2], "ep-model") == "m"
    assert model_of(argvs[3], "ep-model") == "ep-model"


@pytest.mark.parametrize(
    ("data_model", "taker_model"), list(itertools.product([None, "m-a", "m-b"], repeat=2))
)
def test_the_plan_moves_a_dataset_exactly_when_the_starts_model_check_lets_it(
    data_model: str | None, taker_model: str | None
) -> None:
    """One rule (``fingerprint.model_changed``) for the gate and the plan: a dataset moves to the
    faster run exactly when the start's fingerprint check passes its model; an unknown model
    (None) is a model like any other, so data of an unknown model never goes to a named one, nor
    the other way round."""
    from supervisor.fingerprint import compare_fingerprints

    names = ["B1", "B2"]
    comparison = compare([_work(n) for n in names], [LOCAL, API])
    slots = _slots(names, [])
    slots[0].model, slots[1].model = data_model, taker_model
    result = plan(comparison, slots, deadline_s=None, max_usd=None)
    blocking, _ = compare_fingerprints({"model": data_model}, {"model": taker_model}, {})
    moved = any(m.to_run == "cloud" for m in result.moves)
    assert moved == (not blocking), (result.moves, blocking)
    assert ("cloud" in result.kept) == bool(blocking), result.kept
    allowed = plan(comparison, slots, deadline_s=None, max_usd=None, allow_model_change=True)
    assert any(m.to_run == "cloud" for m in allowed.moves)


def test_a_runs_model_is_read_from_its_launch_argv_with_its_profiles_model_flag(
    tmp_path: Path,
) -> None:
    """The plan reads each run's model as the start's fingerprint does, from the argv a start
    would run (the config's argv with the run's launch spec: ``launch --set model=...`` or
    ``--set model-name=...``) and with the client profile's own model flag (``--model-path``)."""
    from supervisor import launchspec
    from supervisor.config import load_config
    from supervisor.fingerprint import fingerprint_of
    from supervisor.model import DatasetView, HostView, RunView, Snapshot
    from supervisor.rebalance import slots_from

    def run(name: str, argv: list[str]) -> str:
        return (
            f'[[runs]]\nname = "{name}"\nhost = "here"\nworkdir = "{tmp_path}"\n'
            f'argv = {json.dumps(argv)}\nendpoint = "api"\n'
        )

    ref = ["python3", "run_inference.py", "--api-base", "http://127.0.0.1:1/v1"]
    profiled = ["python3", "gen.py", "--sets", "B3", "--url", "x", "--model", "m-config",
                "--model-path", "m-path"]  # fmt: skip
    cfg = load_config(
        write_local_config(
            tmp_path / "c.toml",
            run("spec-model", [*ref, "--datasets", "B1", "--model", "m-config"])
            + run("spec-name", [*ref, "--datasets", "B2", "--model", "m-config"])
            + run("profiled", profiled)
            + run("as-config", [*ref, "--datasets", "B4", "--model", "m-config"])
            + '[[endpoints]]\nname = "api"\nkind = "api"\nbase_url = "http://127.0.0.1:1/v1"\n'
            'model = "m-endpoint"\n'
            '[clients.mygen]\nscripts = ["gen.py"]\n'
            '[clients.mygen.flags]\ndatasets = ["--sets"]\nendpoint = ["--url"]\n'
            'model = ["--model-path"]\n',
        )
    )
    launchspec.save(cfg.key, launchspec.LaunchSpec(run="spec-model", sets=[("--model", "m-set")]))
    launchspec.save(
        cfg.key, launchspec.LaunchSpec(run="spec-name", sets=[("--model-name", "m-name")])
    )
    views = [
        RunView(name=r.name, host="here", datasets=[DatasetView(name=f"B{i}", path=f"/x/B{i}")])
        for i, r in enumerate(cfg.runs, 1)
    ]
    snap = Snapshot(time=1.0, hosts=[HostView(name="here", connected=True, runs=views)])
    slots, kept, _, refused = slots_from(cfg, snap)
    assert refused is None and kept == {}, kept
    models = {s.run: s.model for s in slots}
    assert models == {
        "spec-model": "m-set",
        "spec-name": "m-name",
        "profiled": "m-path",
        "as-config": "m-config",
    }
    for r in cfg.runs:  # the start's fingerprint reads the same
        argv = launchspec.launch_argv(cfg, r)
        assert fingerprint_of(r, argv, cfg)["model"] == models[r.name], r.name


def test_a_move_the_start_checks_refuse_is_shown_refused_with_their_reason_never_proposed(
    tmp_path: Path, state_home: Path, mock_server: Any, kill_runs_in: list[Path]
) -> None:
    """Two runs of one model that differ in ``--temperature``: the split alone would move the
    GPU run's datasets to the faster API run, but that run's start would continue data made at
    0.5 at 0.9, which the start's fingerprint check refuses. The proposal runs every start
    through the gate's checks first (dry: nothing stops or starts): each such move is listed as
    refused with the gate's reason and the plan keeps the datasets where they are. With the API
    run's launch spec at 0.5 (``launch --set temperature=0.5``), its start passes the same checks
    and the move is proposed; with a value its client rejects (``--concurrency x``), the
    preflight check refuses it the same way."""
    import asyncio

    from supervisor import launchspec
    from supervisor.config import load_config
    from supervisor.engine import Engine
    from supervisor.model import Snapshot
    from supervisor.rebalance import Rebalance, checked_plan, describe, plan_for
    from tests.fixtures_actions import API_KEY, runwatch

    slow = mock_server(capacity_tps=20.0, mean_tokens=100, length_sigma=0.2, seed=1)
    api = mock_server(capacity_tps=1500.0, mean_tokens=100, seed=2, api_key=API_KEY)
    temps = {"local": ["--temperature", "0.5"], "cloud": ["--temperature", "0.9"]}
    cfg = _two_run_config(tmp_path, slow.url, api.url, flags=temps)
    kill_runs_in.append(tmp_path / "work")
    p = runwatch("-c", str(cfg), "launch", "local", "--yes")
    assert p.returncode == 0, p.stdout + p.stderr
    config = load_config(cfg)
    comparison = compare([_work(d) for d in DATASETS], [LOCAL, API])

    def processes(snap: Snapshot) -> dict[str, int | None]:
        return {
            r.name: r.process.identity.pid if r.process is not None else None
            for h in snap.hosts
            for r in h.runs
            if r.configured
        }

    async def propose() -> tuple[Rebalance, Rebalance, dict[str, int | None], dict[str, Any]]:
        async with Engine(config) as engine:
            snap = await engine.refresh()
            unchecked = plan_for(config, snap, comparison, deadline_s=None, max_usd=None)
            checked = await checked_plan(
                config, engine, snap, comparison, deadline_s=None, max_usd=None
            )
            after = await engine.refresh()
            return unchecked, checked, processes(snap), processes(after)

    unchecked, checked, before, after = asyncio.run(propose())
    assert before["local"] is not None and before == after  # nothing stopped or started
    to_cloud = {m.dataset for m in unchecked.moves if m.to_run == "cloud"}
    assert to_cloud, unchecked.moves  # the split alone moves datasets to the API run
    assert checked.refused is None and checked.plan is not None
    assert not any(m.to_run == "cloud" for m in checked.moves), checked.moves
    assert {m.dataset for m in checked.gate_refused} >= to_cloud
    for m in checked.gate_refused:
        assert m.to_run == "cloud" and m.from_run == "local", m
        assert m.reason.startswith("fingerprint: ") and "temperature 0.5 -> 0.9" in m.reason, m
    shown = "\n".join(describe(checked))
    assert "refused by the start checks: " in shown and "temperature 0.5 -> 0.9" in shown, shown

    launchspec.save(config.key, launchspec.LaunchSpec(run="cloud", sets=[("--temperature", "0.5")]))
    _, same, _, _ = asyncio.run(propose())
    assert same.gate_refused == [], same.gate_refused
    assert {m.dataset for m in same.moves if m.to_run == "cloud"} == to_cloud, same.moves

    # The taker's start refused for a value its client rejects (not the fingerprint): the same.
    launchspec.save(
        config.key,
        launchspec.LaunchSpec(run="cloud", sets=[("--temperature", "0.5"), ("--concurrency", "x")]),
    )
    _, bad, before, after = asyncio.run(propose())
    assert before == after and bad.refused is None
    assert not any(m.to_run == "cloud" for m in bad.moves), bad.moves
    assert {m.dataset for m in bad.gate_refused} >= to_cloud, bad.gate_refused
    for m in bad.gate_refused:
        assert m.reason.startswith("preflight: ") and "--concurrency" in m.reason, m


def test_apply_launches_a_stopped_run_whose_command_line_names_its_datasets_already(
    tmp_path: Path, state_home: Path, mock_server: Any, kill_runs_in: list[Path]
) -> None:
    """Both runs stopped, each of its own model (no dataset may move), their command lines
    naming the datasets the plan gives them: "as now" never finishes (a stopped run makes
    nothing), and --apply launches both and ends with both confirmed running, exit 0."""
    from tests.fixtures_actions import API_KEY

    local = mock_server(capacity_tps=200.0, mean_tokens=100, length_sigma=0.2, seed=1)
    api = mock_server(
        capacity_tps=300.0, mean_tokens=100, length_sigma=0.2, seed=2, api_key=API_KEY,
        price_in=0.0, price_out=PRICE_OUT,
    )  # fmt: skip
    cfg = _two_run_config(tmp_path, local.url, api.url, flags={"cloud": ["--model", "other-model"]})
    kill_runs_in.append(tmp_path / "work")
    bench_endpoint(cfg, "gpu", "B1")
    bench_endpoint(cfg, "api", "B4")
    assert pids_by_run(cfg) == {"local": None, "cloud": None}
    code, out = rebalance_applied(cfg)
    assert code == 0 and out.get("ok") is True, out
    result = out["plan"]
    as_now = next(a for a in result["alternatives"] if a["name"] == "as now")
    assert as_now["never"] == ["local", "cloud"] and as_now["seconds"] is None, as_now
    assert result["moves"] == []
    assert {(st["run"], st["action"]) for st in result["steps"]} == {
        ("local", "launch"),
        ("cloud", "launch"),
    }, result["steps"]
    pids = pids_by_run(cfg)
    assert pids["local"] is not None and pids["cloud"] is not None, pids


def test_a_run_finishing_what_it_has_is_never_stopped_to_hand_it_to_a_slower_run(
    tmp_path: Path, state_home: Path, mock_server: Any, kill_runs_in: list[Path]
) -> None:
    """The switch in progress: the API run writes B2, the stopped GPU run's command line still
    names B1-B3, and the free GPU is slower. The cheapest plan within 2 h would give B2 back
    to the GPU; the API run finishes B2 sooner than the GPU would, so it keeps it and is never
    stopped: the GPU run is launched with B1 and B3 only, and both end confirmed running."""
    from tests.fixtures_actions import API_KEY, runwatch

    local = mock_server(capacity_tps=100.0, mean_tokens=100, length_sigma=0.2, seed=1)
    api = mock_server(
        capacity_tps=200.0, mean_tokens=100, length_sigma=0.2, seed=2, api_key=API_KEY,
        price_in=0.0, price_out=PRICE_OUT,
    )  # fmt: skip
    cfg = _two_run_config(tmp_path, local.url, api.url, datasets=("B1,B2,B3", "B2"), gpu_cost=0.0)
    kill_runs_in.append(tmp_path / "work")
    bench_endpoint(cfg, "gpu", "B1")
    p = runwatch("-c", str(cfg), "launch", "cloud", "--yes")
    assert p.returncode == 0, p.stdout + p.stderr
    cloud = pids_by_run(cfg)["cloud"]
    assert cloud is not None
    code, out = rebalance_applied(cfg, "--by", "2h")
    result = out["plan"]
    assert not any(m["from_run"] == "cloud" for m in result["moves"]), result["moves"]
    assert [(st["run"], st["action"], st["datasets"]) for st in result["steps"]] == [
        ("local", "launch", ["B1", "B3"])
    ], result["steps"]
    assert code == 0 and out.get("ok") is True, out
    pids = pids_by_run(cfg)
    assert pids["cloud"] == cloud and pids["local"] is not None, (cloud, pids)


def test_apply_whose_launch_fails_rolls_back_the_runs_as_they_were_and_exits_1(
    tmp_path: Path, state_home: Path, mock_server: Any, kill_runs_in: list[Path]
) -> None:
    """As above, but the API run's client exits at its start (its prompts dir does not exist):
    the plan's runs cannot all be running, so the apply fails, the local run it launched first
    is stopped again (the runs as they were: both stopped) and the exit status is 1."""
    from tests.fixtures_actions import API_KEY

    local = mock_server(capacity_tps=200.0, mean_tokens=100, length_sigma=0.2, seed=1)
    api = mock_server(
        capacity_tps=300.0, mean_tokens=100, length_sigma=0.2, seed=2, api_key=API_KEY,
        price_in=0.0, price_out=PRICE_OUT,
    )  # fmt: skip
    broken = ["--model", "other-model", "--prompts-dir", "no-such-dir"]
    cfg = _two_run_config(tmp_path, local.url, api.url, flags={"cloud": broken})
    kill_runs_in.append(tmp_path / "work")
    bench_endpoint(cfg, "gpu", "B1")
    bench_endpoint(cfg, "api", "B4")
    code, out = rebalance_applied(cfg)
    assert code == 1 and out.get("ok") is False, out
    by_run = {(o["run"], o["action"]): o for o in out["steps"]}
    assert by_run[("local", "launch")]["ok"] and by_run[("local", "launch")]["rolled_back"], out
    assert not by_run[("cloud", "launch")]["ok"], out
    assert pids_by_run(cfg) == {"local": None, "cloud": None}


def test_status_says_a_plan_dataset_no_running_run_writes_never_finishes(
    tmp_path: Path, state_home: Path, mock_server: Any, kill_runs_in: list[Path]
) -> None:
    """The plan applied (both runs launched, within 2 h: on track); then the API run is
    stopped. Its B4 is left to no running run: status says the plan now ends never and will
    miss its deadline (not an end at the stopped run's last rate)."""
    from tests.fixtures_actions import API_KEY, runwatch

    local = mock_server(capacity_tps=200.0, mean_tokens=100, length_sigma=0.2, seed=1)
    api = mock_server(
        capacity_tps=100.0, mean_tokens=100, length_sigma=0.2, seed=2, api_key=API_KEY,
        price_in=0.0, price_out=PRICE_OUT,
    )  # fmt: skip
    cfg = _two_run_config(tmp_path, local.url, api.url, flags={"cloud": ["--model", "other-model"]})
    kill_runs_in.append(tmp_path / "work")
    bench_endpoint(cfg, "gpu", "B1")
    bench_endpoint(cfg, "api", "B4")
    code, out = rebalance_applied(cfg, "--by", "2h")
    assert code == 0 and out.get("ok") is True, out
    plan_now = status_json(cfg)["plan"]
    assert plan_now["unwritten"] == [] and plan_now["will_miss"] is False, plan_now
    p = runwatch("-c", str(cfg), "kill", "cloud", "--yes")
    assert p.returncode == 0, p.stdout + p.stderr
    plan_now = status_json(cfg)["plan"]
    assert plan_now["unwritten"] == ["B4"] and plan_now["expected_end"] is None, plan_now
    assert plan_now["will_miss"] is True, plan_now
    assert "never (B4: no running run writes it)" in plan_now["text"], plan_now
    assert "WILL MISS the deadline" in plan_now["text"], plan_now


# --------------------------------------------------------------------------- a plan half-applied


def _stopping_plan(tmp_path: Path, mock_server: Any, kill_runs_in: list[Path]) -> Path:
    """The GPU run running (B1-B3), the API run stopped (B4) and much faster, both of one
    model: the fastest plan stops the GPU run first and launches the API run with everything.
    Returns the config once a plan (not yet applied) is made."""
    from tests.fixtures_actions import API_KEY, runwatch

    local = mock_server(capacity_tps=100.0, mean_tokens=100, length_sigma=0.2, seed=1)
    api = mock_server(
        capacity_tps=1000.0, mean_tokens=100, length_sigma=0.2, seed=2, api_key=API_KEY,
        price_in=0.0, price_out=PRICE_OUT,
    )  # fmt: skip
    cfg = _two_run_config(tmp_path, local.url, api.url)
    kill_runs_in.append(tmp_path / "work")
    p = runwatch("-c", str(cfg), "launch", "local", "--yes")
    assert p.returncode == 0, p.stdout + p.stderr
    bench_endpoint(cfg, "gpu", "B1")
    bench_endpoint(cfg, "api", "B4")

    def planned() -> dict[str, Any] | None:
        out = json.loads(runwatch("-c", str(cfg), "rebalance", "--json").stdout or "{}")
        return None if "no throughput measured" in str(out.get("refused")) else dict(out)

    result = wait_until(planned, timeout=240, interval=0.5)
    assert result["steps"] and result["steps"][0]["run"] == "local", result
    assert result["steps"][0]["action"] in ("stop", "restart"), result["steps"]
    return cfg


def _intent(cfg: Path) -> dict[str, Any] | None:
    from supervisor.config import load_config
    from supervisor.paths import config_state

    path = config_state(load_config(cfg).key) / "rebalance-intent.json"
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, ValueError):
        return None


def _first_step_done(cfg: Path) -> dict[str, Any] | None:
    intent = _intent(cfg)
    return intent if intent is not None and intent["steps"][0]["state"] == "done" else None


def _apply_process(cfg: Path) -> Any:
    import subprocess

    return subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "-c", str(cfg), "rebalance", "--apply", "--yes"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _watch_once(cfg: Path) -> list[str]:
    """The lines of one tick of the watcher over ``cfg``."""
    import asyncio

    from supervisor.config import load_config
    from supervisor.engine import Engine
    from supervisor.watch import Watcher

    lines: list[str] = []

    async def once() -> None:
        async with Engine(load_config(cfg)) as engine:
            await Watcher(engine, emit=lines.append).tick()

    asyncio.run(once())
    return lines


def _states(cfg: Path) -> dict[str, str]:
    return {
        r["name"]: r["state"]
        for h in status_json(cfg)["hosts"]
        for r in h["runs"]
        if r.get("configured", True)
    }


def test_an_apply_killed_after_its_stop_leaves_its_plan_and_resume_rolls_it_back(
    tmp_path: Path, state_home: Path, mock_server: Any, kill_runs_in: list[Path]
) -> None:
    """``rebalance --apply`` SIGKILLed right after its first step stopped the GPU run: the plan
    is left on disk, status says it is half-applied with the command that takes it up, and
    ``--apply --resume`` puts the runs back as they were (the GPU run running, the API run
    stopped), audited; the intent is then gone."""
    from supervisor.audit import audit_path
    from tests.fixtures_actions import runwatch

    cfg = _stopping_plan(tmp_path, mock_server, kill_runs_in)
    before = pids_by_run(cfg)
    assert before["local"] is not None and before["cloud"] is None, before
    proc = _apply_process(cfg)
    try:
        wait_until(lambda: _first_step_done(cfg), timeout=240, interval=0.05)
    finally:
        proc.kill()
        proc.communicate()
    intent = _intent(cfg)
    assert intent is not None and intent["steps"][0]["state"] == "done", intent
    text = runwatch("-c", str(cfg), "status").stdout
    assert "half-applied" in text and "rebalance --apply --resume --yes" in text, text
    plan_now = status_json(cfg)["plan"]
    assert plan_now["half_applied"] is True and "local" in plan_now["runs"], plan_now
    # The watcher says and audits the plan half-applied, naming the fix.
    said = "\n".join(_watch_once(cfg))
    assert "half-applied" in said and "--resume" in said, said
    # A new apply refuses while the plan is half-applied, naming the fix.
    p = runwatch("-c", str(cfg), "rebalance", "--apply", "--yes")
    assert p.returncode != 0 and "--resume" in p.stderr, p.stdout + p.stderr
    p = runwatch("-c", str(cfg), "rebalance", "--apply", "--resume", "--yes", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)
    assert out["resumed"] is True and out["ok"] is True, out
    assert _intent(cfg) is None
    states = _states(cfg)
    assert states["local"] == "running" and states["cloud"] != "running", states
    assert status_json(cfg)["plan"] is None or not status_json(cfg)["plan"]["half_applied"]
    records = [json.loads(line) for line in audit_path().read_text().splitlines()]
    seen = [r for r in records if r["action"] == "rebalance-half-applied"]
    assert len(seen) == 1 and "local" in seen[0]["runs"], seen
    resumed = [r for r in records if r["action"] == "rebalance-resume"]
    assert len(resumed) == 1 and resumed[0]["ok"] is True, resumed
    assert resumed[0]["intent"]["steps"][0]["run"] == "local", resumed


def test_ctrl_c_during_apply_rolls_back_and_exits_130_without_a_traceback(
    tmp_path: Path, state_home: Path, mock_server: Any, kill_runs_in: list[Path]
) -> None:
    """SIGINT once the first step stopped the GPU run: the step under way ends, the steps done
    are rolled back (the GPU run running again, the API run stopped), the output says so, the
    exit status is 130, stderr holds no traceback and no plan is left half-applied."""
    import signal

    cfg = _stopping_plan(tmp_path, mock_server, kill_runs_in)
    proc = _apply_process(cfg)
    try:
        wait_until(lambda: _first_step_done(cfg), timeout=240, interval=0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 130, (proc.returncode, stdout, stderr)
    assert "Traceback" not in stderr, stderr
    assert "interrupted" in stderr and "rolling back" in stdout, (stdout, stderr)
    assert "every step done was rolled back" in stdout, stdout
    assert _intent(cfg) is None
    runs = {r["name"]: r for h in status_json(cfg)["hosts"] for r in h["runs"]}
    states = {name: r["state"] for name, r in runs.items()}
    assert states["local"] == "running" and states["cloud"] == "stopped", states
    # The GPU run writes the files the API run shares: the API run says whose they are, and no
    # tail of them is called torn while that run writes it.
    cloud = runs["cloud"]
    assert "written by this config's run 'local'" in (cloud["state_detail"] or ""), cloud
    assert cloud["owner"] is None
    assert all(not d.get("torn_tail") for d in cloud["datasets"]), cloud["datasets"]


def test_a_second_apply_at_once_is_refused_naming_the_first_and_touches_nothing(
    tmp_path: Path, state_home: Path, mock_server: Any, kill_runs_in: list[Path]
) -> None:
    """While one apply carries its plan out, a second apply of the config refuses at once,
    naming the first's pid; the first's plan completes untouched (exit 0: the API run running
    with every dataset, the GPU run stopped)."""
    from tests.fixtures_actions import runwatch

    cfg = _stopping_plan(tmp_path, mock_server, kill_runs_in)
    first = _apply_process(cfg)
    try:
        wait_until(lambda: _intent(cfg), timeout=240, interval=0.05)
        second = runwatch("-c", str(cfg), "rebalance", "--apply", "--yes")
        stdout, stderr = first.communicate(timeout=240)
    finally:
        first.kill()
    assert second.returncode != 0, second.stdout + second.stderr
    assert f"pid {first.pid}" in second.stderr, second.stderr
    assert "another rebalance is being applied" in second.stderr, second.stderr
    assert first.returncode == 0, (stdout, stderr)
    assert "plan applied" in stdout and "rolling back" not in stdout, stdout
    assert _intent(cfg) is None
    states = _states(cfg)
    assert states["cloud"] == "running", states
