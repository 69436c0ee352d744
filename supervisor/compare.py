"""Where should the rest of the work run: time and cost to finish every dataset on each endpoint.

Inputs, and where each number comes from (every estimate says which):

- **live rate**: an endpoint that a running run is using is measured by that run's own data files
  (the engine's windowed rates of its datasets, summed: that is the endpoint's throughput);
- **bench of <time>**: otherwise the latest ``runwatch bench`` of the endpoint (the level run at the
  endpoint's configured concurrency, else the fastest level);
- **price table**: API cost from prompt + completion tokens x the endpoint's prices (prompt tokens
  estimated per sample from the dataset's own averages); local cost from hours x
  ``gpu_cost_per_hour``; a bench's ``usage.cost`` per request when there is no price table.

The arithmetic is in pure functions over plain structs (:func:`remaining_work`, :func:`estimate`,
:func:`compare`), so it is tested on hand-checked cases; :func:`gather_comparison` only collects.

Front ends: the CLI calls ``await gather_comparison(config)`` (it refreshes the hosts itself); a
UI that already holds a snapshot calls ``comparison_from(config, snapshot, load_history())``
(pure, instant). Either returns a :class:`Comparison`; ``format_lines(comparison)`` gives the
text lines, and its fields (``datasets[].answer``, ``datasets[].estimates``, ``totals``,
``answer``, ``rates[].source``, ``skipped``) hold every number for a table.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from supervisor import display
from supervisor.config import Config, EndpointConfig

if TYPE_CHECKING:
    from supervisor.bench.results import BenchResult, LevelResult
    from supervisor.model import Snapshot


class Work(msgspec.Struct, kw_only=True):
    """What a dataset still needs."""

    dataset: str
    remaining_tokens: float
    """Completion tokens still wanted."""
    remaining_samples: float
    avg_prompt_tokens: float
    avg_completion_tokens: float
    bound: str
    """What ends the dataset: ``token_budget`` or ``max_samples``."""
    averages_from: str = "dataset"
    """``dataset`` (its own records), ``other datasets`` or ``bench``."""


class EndpointRate(msgspec.Struct, kw_only=True):
    """How fast an endpoint makes tokens, what it costs, and where both come from."""

    endpoint: str
    kind: str
    out_tok_per_s: float | None = None
    source: str = "no measurement"
    """``live rate (run X)``, ``bench of 2026-11-30 01:23 (c=64)`` or ``no measurement``."""
    price_in_per_m: float | None = None
    price_out_per_m: float | None = None
    gpu_cost_per_hour: float | None = None
    cost_per_request: float | None = None
    """Mean ``usage.cost`` of the bench's requests (used when there is no price table)."""
    completion_per_request: float | None = None
    """Mean completion tokens of the bench's requests."""


class Estimate(msgspec.Struct, kw_only=True):
    """Finishing one dataset (or all of them) on one endpoint."""

    dataset: str
    endpoint: str
    kind: str
    seconds: float | None = None
    cost_usd: float | None = None
    time_source: str = "no measurement"
    cost_source: str | None = None


class DatasetComparison(msgspec.Struct, kw_only=True):
    work: Work
    estimates: list[Estimate] = []
    answer: str = ""


class Comparison(msgspec.Struct, kw_only=True):
    """The ``compare --json`` output."""

    time: float
    datasets: list[DatasetComparison] = []
    totals: list[Estimate] = []
    answer: str = ""
    rates: list[EndpointRate] = []
    skipped: dict[str, str] = {}
    """Datasets not compared, and why (no budget, budget reached, no data to estimate from)."""


# --------------------------------------------------------------------------- pure arithmetic


def remaining_work(
    dataset: str,
    *,
    done_samples: int,
    done_completion_tokens: int,
    done_prompt_tokens: int,
    token_budget: int | None,
    max_samples: int | None,
    fallback_avg: tuple[float, float, str] | None = None,
) -> Work | str:
    """What is left of a dataset, or why nothing is (a string).

    Averages per sample (prompt, completion) come from the dataset's own records, else from
    ``fallback_avg`` = (prompt, completion, where from). The first limit reached ends the dataset:
    with both, remaining tokens = min(budget - done, samples left x average completion).
    """
    if token_budget is None and max_samples is None:
        return "no token_budget or max_samples"
    if done_samples > 0 and done_completion_tokens > 0:
        avg_p = done_prompt_tokens / done_samples
        avg_c = done_completion_tokens / done_samples
        origin = "dataset"
    elif fallback_avg is not None and fallback_avg[1] > 0:
        avg_p, avg_c, origin = fallback_avg
    else:
        return "no responses yet to estimate tokens per sample from"
    by_tokens = (
        None if token_budget is None else max(0.0, float(token_budget - done_completion_tokens))
    )
    by_samples = (
        None if max_samples is None else max(0.0, float(max_samples - done_samples)) * avg_c
    )
    if by_tokens is not None and (by_samples is None or by_tokens <= by_samples):
        tokens, bound = by_tokens, "token_budget"
    else:
        assert by_samples is not None
        tokens, bound = by_samples, "max_samples"
    if tokens <= 0:
        return f"{bound} reached"
    return Work(
        dataset=dataset,
        remaining_tokens=tokens,
        remaining_samples=tokens / avg_c,
        avg_prompt_tokens=avg_p,
        avg_completion_tokens=avg_c,
        bound=bound,
        averages_from=origin,
    )


def estimate(work: Work, rate: EndpointRate) -> Estimate:
    """Time (remaining tokens / measured output rate) and cost of ``work`` on one endpoint."""
    out = Estimate(dataset=work.dataset, endpoint=rate.endpoint, kind=rate.kind)
    if rate.out_tok_per_s is not None and rate.out_tok_per_s > 0:
        out.seconds = work.remaining_tokens / rate.out_tok_per_s
        out.time_source = rate.source
    if rate.price_in_per_m is not None or rate.price_out_per_m is not None:
        prompt = work.remaining_samples * work.avg_prompt_tokens
        out.cost_usd = (
            prompt * (rate.price_in_per_m or 0.0)
            + work.remaining_tokens * (rate.price_out_per_m or 0.0)
        ) / 1e6
        out.cost_source = "price table"
    elif rate.gpu_cost_per_hour is not None:
        if out.seconds is not None:
            out.cost_usd = out.seconds / 3600.0 * rate.gpu_cost_per_hour
            out.cost_source = f"GPU time at ${rate.gpu_cost_per_hour:g}/h"
    elif rate.cost_per_request is not None and rate.completion_per_request:
        # Cost per completion token as the bench paid it, scaled to this dataset's tokens.
        per_token = rate.cost_per_request / rate.completion_per_request
        out.cost_usd = work.remaining_tokens * per_token
        out.cost_source = "usage.cost of the bench"
    return out


def total(estimates: Sequence[Estimate], endpoint: EndpointRate) -> Estimate:
    """All datasets one after another on one endpoint (its throughput is shared, so times add)."""
    out = Estimate(dataset="total", endpoint=endpoint.endpoint, kind=endpoint.kind)
    secs = [e.seconds for e in estimates]
    costs = [e.cost_usd for e in estimates]
    if estimates and all(s is not None for s in secs):
        out.seconds = sum(s for s in secs if s is not None)
        out.time_source = endpoint.source
    if estimates and all(c is not None for c in costs):
        out.cost_usd = sum(c for c in costs if c is not None)
        out.cost_source = estimates[0].cost_source
    return out


def compare(works: Sequence[Work], rates: Sequence[EndpointRate], now: float = 0.0) -> Comparison:
    """Every dataset on every endpoint, totals, and the plain-language answers."""
    result = Comparison(time=now, rates=list(rates))
    per_endpoint: dict[str, list[Estimate]] = {r.endpoint: [] for r in rates}
    labels = _labels(rates)
    for w in works:
        ests = [estimate(w, r) for r in rates]
        for e in ests:
            per_endpoint[e.endpoint].append(e)
        result.datasets.append(
            DatasetComparison(
                work=w, estimates=ests, answer=f"{w.dataset}: " + _answer(ests, labels)
            )
        )
    result.totals = [total(per_endpoint[r.endpoint], r) for r in rates]
    if works:
        n = len(works)
        result.answer = f"all {n} dataset{'s' if n != 1 else ''}: " + _answer(result.totals, labels)
    return result


# --------------------------------------------------------------------------- words


def _labels(rates: Sequence[EndpointRate]) -> dict[str, str]:
    kinds = [r.kind for r in rates]
    names = {"api": "API", "local": "local"}
    out = {}
    for r in rates:
        base = names.get(r.kind, r.kind)
        out[r.endpoint] = base if kinds.count(r.kind) == 1 else f"{base} {r.endpoint}"
    return out


def _answer(estimates: Sequence[Estimate], labels: dict[str, str]) -> str:
    parts = []
    for e in estimates:
        cost = "cost unknown" if e.cost_usd is None else display.money(e.cost_usd)
        if e.cost_usd is not None and e.cost_source and e.cost_source.startswith("GPU time"):
            cost += " of GPU time"
        parts.append(f"{labels.get(e.endpoint, e.endpoint)}: {display.duration(e.seconds)}, {cost}")
    return "; ".join(parts)


def format_lines(result: Comparison) -> list[str]:
    """The text report: one answer per dataset, the total, which endpoint is faster and by how
    much, then where the numbers come from (lines that fit 80 columns where the names do)."""
    lines: list[str] = []
    if not result.rates:
        return ["no [[endpoints]] in the config: nothing to compare the datasets on"]
    if not result.datasets:
        lines.append("nothing to compare: no dataset has budget left")
    for d in result.datasets:
        lines.append(d.answer)
    if result.answer:
        lines.append(result.answer)
        verdict = _verdict(result.totals, _labels(result.rates))
        if verdict:
            lines.append(verdict)
    for name, why in result.skipped.items():
        lines.append(f"  ({name}: {why})")
    lines.append("where the numbers come from:")
    for r in result.rates:
        rate = display.rate(r.out_tok_per_s, "output tok/s")
        lines.append(f"  {r.endpoint} ({r.kind}): {rate}")
        lines.append(f"    rate from {r.source}")
        lines.append(f"    cost from {_cost_basis(r)}")
    return lines


def _verdict(totals: Sequence[Estimate], labels: dict[str, str]) -> str:
    """``=> API finishes 8.7x sooner: 3 min vs 26 min, $1.25 vs $8.59 of GPU time``."""
    timed = sorted((e for e in totals if e.seconds), key=lambda e: e.seconds or 0.0)
    if len(timed) < 2:
        return ""
    fast, slow = timed[0], timed[-1]
    assert fast.seconds is not None and slow.seconds is not None
    if slow.seconds <= fast.seconds:
        return ""

    def cost(e: Estimate) -> str:
        gpu = e.cost_source is not None and e.cost_source.startswith("GPU time")
        if e.cost_usd is None:
            return "cost unknown"
        return display.money(e.cost_usd) + (" of GPU time" if gpu else "")

    name = labels.get(fast.endpoint, fast.endpoint)
    return (
        f"=> {name} finishes {slow.seconds / fast.seconds:.1f}x sooner: "
        f"{display.duration(fast.seconds)} vs {display.duration(slow.seconds)}, "
        f"{cost(fast)} vs {cost(slow)}"
    )


def _price(usd: float | None) -> str:
    """``0.60``, ``2.50``, ``0.075``: cents always, more digits only when the price has them."""
    v = usd or 0.0
    return f"{v:.2f}" if round(v, 2) == v else f"{v:g}"


def _cost_basis(r: EndpointRate) -> str:
    if r.price_in_per_m is not None or r.price_out_per_m is not None:
        return (
            f"price table (${_price(r.price_in_per_m)} in / ${_price(r.price_out_per_m)} out "
            "per M tokens)"
        )
    if r.gpu_cost_per_hour is not None:
        return f"GPU time at ${r.gpu_cost_per_hour:g}/h"
    if r.cost_per_request is not None:
        return "usage.cost of the bench"
    return "nothing (no prices, no GPU cost in config)"


# --------------------------------------------------------------------------- collecting


def pick_level(result: BenchResult, concurrency: int | None) -> LevelResult | None:
    """The level run at ``concurrency``, else the one with the highest output rate."""
    levels = [lv for lv in result.levels if lv.completed > 0]
    if not levels:
        return None
    for lv in levels:
        if concurrency is not None and lv.concurrency == concurrency:
            return lv
    return max(levels, key=lambda lv: lv.output_tok_per_s)


def _window_rate(ds: Any) -> float | None:
    r = ds.rates
    for v in (r.tok_per_s_10m, r.tok_per_s_1m):
        if v is not None:
            return float(v)
    if r.tok_per_s_all is not None and not ds.stalled:
        return float(r.tok_per_s_all)
    return None


def live_rates(config: Config, snapshot: Snapshot) -> dict[str, tuple[float, list[str]]]:
    """Endpoint -> (output tok/s summed over its running runs' datasets, those runs' names)."""
    out: dict[str, tuple[float, list[str]]] = {}
    for host in snapshot.hosts:
        for run in host.runs:
            if run.state != "running" or not run.configured:
                continue
            try:
                ep = config.run(run.name).endpoint
            except Exception:
                continue
            if ep is None:
                continue
            rates = [r for r in (_window_rate(d) for d in run.datasets) if r is not None]
            if not rates:
                continue
            tok, runs = out.get(ep, (0.0, []))
            out[ep] = (tok + sum(rates), [*runs, run.name])
    return out


def endpoint_rates(
    config: Config,
    live: dict[str, tuple[float, list[str]]],
    history: Sequence[BenchResult],
    live_note: str = "",
    run_notes: dict[str, str] | None = None,
) -> list[EndpointRate]:
    """Each configured endpoint's rate: live when a run is using it, else its latest bench."""
    from supervisor.bench.history import bench_label, latest_bench

    out = []
    for ep in config.endpoints:
        r = _rate_base(ep)
        if ep.name in live and live[ep.name][0] > 0:
            tok, runs = live[ep.name]
            r.out_tok_per_s = tok
            named = ", ".join(f"{run}{(run_notes or {}).get(run, '')}" for run in runs)
            r.source = f"live rate (run {named}{live_note})"
        bench = latest_bench(ep.name, history)
        level = pick_level(bench, ep.concurrency) if bench is not None else None
        if bench is not None and level is not None:
            if r.out_tok_per_s is None and level.output_tok_per_s > 0:
                r.out_tok_per_s = level.output_tok_per_s
                r.source = f"{bench_label(bench)} (c={level.concurrency})"
            if level.cost_usd is not None and level.cost_source == "usage.cost" and level.completed:
                r.cost_per_request = level.cost_usd / level.completed
                r.completion_per_request = level.completion_tokens / level.completed
        if r.out_tok_per_s is None:
            r.source = f"no measurement (run `runwatch bench {ep.name}`)"
        out.append(r)
    return out


def _rate_base(ep: EndpointConfig) -> EndpointRate:
    return EndpointRate(
        endpoint=ep.name,
        kind=ep.kind,
        price_in_per_m=ep.price_in_per_m,
        price_out_per_m=ep.price_out_per_m,
        gpu_cost_per_hour=ep.gpu_cost_per_hour,
    )


def works_from_snapshot(
    config: Config, snapshot: Snapshot, history: Sequence[BenchResult] = ()
) -> tuple[list[Work], dict[str, str]]:
    """Remaining work per dataset of the configured runs (views of the same dataset in several
    runs are added up)."""
    done: dict[str, list[int]] = {}
    limits: dict[str, tuple[int | None, int | None]] = {}
    seen_paths: set[tuple[str, str]] = set()
    # Progress that cannot be read is unknown, not zero: such datasets are skipped, with why.
    unknown: dict[str, str] = {}
    hosts = {h.name: h for h in snapshot.hosts}
    for rc in config.runs:
        hv = hosts.get(rc.host)
        if hv is None or (not hv.connected and not hv.stale):
            why = f"host {rc.host} not reachable"
            if hv is not None and hv.error:
                why += f" ({hv.error.splitlines()[0]})"
            for name in config.run_datasets(rc):
                unknown.setdefault(name, why)
    for host in snapshot.hosts:
        for run in host.runs:
            if not run.configured:  # a matching process the config does not know: not our data
                continue
            for ds in run.datasets:
                if ds.state in ("unreadable", "error", "not-a-file"):
                    unknown.setdefault(ds.name, f"{ds.path}: {ds.error or ds.state}")
                key = (host.name, ds.path)
                if key in seen_paths:
                    continue
                seen_paths.add(key)
                acc = done.setdefault(ds.name, [0, 0, 0])
                acc[0] += ds.unique_ids or ds.records
                acc[1] += ds.completion_tokens
                acc[2] += ds.prompt_tokens
                budget, samples = limits.get(ds.name, (None, None))
                limits[ds.name] = (budget or ds.token_budget, samples or ds.max_samples)
    names = list(dict.fromkeys([*config.datasets, *done]))
    all_done = [sum(v[i] for v in done.values()) for i in range(3)]
    fallback: tuple[float, float, str] | None = None
    if all_done[0] > 0 and all_done[1] > 0:
        fallback = (all_done[2] / all_done[0], all_done[1] / all_done[0], "other datasets")
    else:
        fallback = _bench_averages(history)
    works: list[Work] = []
    skipped: dict[str, str] = {}
    for name in names:
        cfg = config.datasets.get(name)
        budget, samples = limits.get(name, (None, None))
        if cfg is not None:
            budget = cfg.token_budget if cfg.token_budget is not None else budget
            samples = cfg.max_samples if cfg.max_samples is not None else samples
        if name in unknown:
            skipped[name] = unknown[name]
            continue
        n, comp, prompt = done.get(name, [0, 0, 0])
        w = remaining_work(
            name,
            done_samples=n,
            done_completion_tokens=comp,
            done_prompt_tokens=prompt,
            token_budget=budget,
            max_samples=samples,
            fallback_avg=fallback,
        )
        if isinstance(w, str):
            skipped[name] = w
        else:
            works.append(w)
    return works, skipped


def _bench_averages(history: Sequence[BenchResult]) -> tuple[float, float, str] | None:
    for r in reversed(history):
        for lv in r.levels:
            if lv.completed and lv.completion_tokens:
                return (
                    lv.prompt_tokens / lv.completed,
                    lv.completion_tokens / lv.completed,
                    "bench",
                )
    return None


def comparison_from(
    config: Config,
    snapshot: Snapshot,
    history: Sequence[BenchResult],
    live_note: str = "",
    run_notes: dict[str, str] | None = None,
) -> Comparison:
    """The comparison for a snapshot the caller already has (the TUI's latest refresh).

    ``live_note`` is appended to the source of live rates (e.g. ``, over 12 s``), and
    ``run_notes[run]`` to the name of each run measured (e.g. ``: 14 new responses``)."""
    works, skipped = works_from_snapshot(config, snapshot, history)
    rates = endpoint_rates(config, live_rates(config, snapshot), history, live_note, run_notes)
    result = compare(works, rates, now=snapshot.time)
    result.skipped = skipped
    return result


def _running_with_endpoint(config: Config, snapshot: Snapshot) -> list[Any]:
    with_endpoint = {r.name for r in config.runs if r.endpoint}
    return [
        run
        for host in snapshot.hosts
        for run in host.runs
        if run.state == "running" and run.configured and run.name in with_endpoint
    ]


MIN_NEW_RESPONSES = 10
"""Responses a running run must write while compare measures it, when time allows: its files grow
a whole response at a time, so a rate measured over 3 or 4 of them is off by a third."""


def _written(config: Config, snapshot: Snapshot) -> dict[str, int]:
    """Responses on disk per running run that uses an endpoint."""
    return {
        run.name: sum(d.unique_ids or d.records for d in run.datasets)
        for run in _running_with_endpoint(config, snapshot)
    }


def _needs_rates(config: Config, snapshot: Snapshot) -> bool:
    """True while a running run that uses an endpoint has no positive rate yet."""
    for run in _running_with_endpoint(config, snapshot):
        if sum(r for r in (_window_rate(d) for d in run.datasets) if r is not None) <= 0:
            return True
    return False


async def gather_comparison(
    config: Config, *, sample_s: float = 30.0, min_sample_s: float = 10.0, engine: Any = None
) -> Comparison:
    """Refresh the hosts and compare.

    Live rates need several looks at a run's files: while a run that uses an endpoint is running,
    the hosts are refreshed every ``refresh_seconds`` for at least ``min_sample_s`` and until every
    such run shows a positive rate and has written ``MIN_NEW_RESPONSES`` responses since the first
    look, at most ``sample_s``. With none running it answers at once.
    (The TUI, which refreshes all the time, calls :func:`comparison_from` instead.)
    """
    from supervisor.bench.history import load_history

    own = engine is None
    if engine is None:
        from supervisor.engine import Engine

        engine = Engine(config)
    try:
        start = time.monotonic()
        snapshot = await engine.refresh()
        first = _written(config, snapshot)
        while _running_with_endpoint(config, snapshot):
            elapsed = time.monotonic() - start
            if elapsed >= sample_s:
                break
            now = _written(config, snapshot)
            enough = all(n - first.get(run, n) >= MIN_NEW_RESPONSES for run, n in now.items())
            if elapsed >= min_sample_s and enough and not _needs_rates(config, snapshot):
                break
            await asyncio.sleep(max(0.2, config.refresh_seconds))  # the measuring interval
            snapshot = await engine.refresh()
        sampled = time.monotonic() - start
    finally:
        if own:
            await engine.aclose()
    note = f", measured over {display.duration(sampled)}" if own else ""
    # How many responses a live rate stands on: a rate from a handful of them is rough.
    run_notes = {}
    for run, n in _written(config, snapshot).items():
        new = n - first.get(run, n)
        few = "only " if new < MIN_NEW_RESPONSES else ""
        run_notes[run] = f": {few}{new} new response{'' if new == 1 else 's'}"
    return comparison_from(config, snapshot, load_history(), note, run_notes)
