"""Where should the rest of the work run: time and cost to finish every dataset on each endpoint.

Inputs, and where each number comes from (every estimate says which):

- **live rate**: an endpoint that a running run is using is measured by that run's own data files:
  the run's output over a window (up to 10 minutes) across all its datasets, with its uncertainty
  (``tok/s / sqrt(responses in the window)``), added up over the runs on that endpoint. The
  engine keeps these windows across refreshes and persists them, so they are there at once. For
  a local endpoint the serving engine's own generation-token counter is shown beside it, and the
  gap between the two (tokens made for requests that never reached a file);
- **bench of <time>**: otherwise the latest ``runwatch bench`` of the endpoint whose shape matches
  how the runs use it (the level at the runs' concurrency, the same streaming mode); a bench of
  another shape is used only when there is nothing else, and its source says so;
- **price table**: API cost from prompt + completion tokens x the endpoint's prices (prompt tokens
  estimated per sample from the dataset's own averages); local cost from hours x
  ``gpu_cost_per_hour``; a bench's ``usage.cost`` per request when there is no price table.

Remaining work is bounded by each dataset's effective budget: the run's own ``--token-budget``
first (it stops the dataset there), then the config's ``token_budget``; samples by the run's
``--max-samples``, then the config's. Time and (GPU-time) cost carry the rate's uncertainty:
``API: 24 ± 3 min, $81``.

The arithmetic is in pure functions over plain structs (:func:`remaining_work`, :func:`estimate`,
:func:`compare`), so it is tested on hand-checked cases; :func:`gather_comparison` only collects.

Front ends: the CLI calls the engine's ``gather_comparison(config)`` (it refreshes the hosts); a
UI that already holds a snapshot calls ``comparison_from(config, snapshot, load_history())``
(pure, instant). Either returns a :class:`Comparison`; ``format_lines(comparison)`` gives the
text lines, and its fields (``datasets[].answer``, ``datasets[].estimates``, ``totals``,
``answer``, ``rates[].source``, ``skipped``) hold every number for a table.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from supervisor import display
from supervisor.config import Config, EndpointConfig
from supervisor.rates import dataset_budget

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
    out_tok_per_s_err: float | None = None
    """One standard error of ``out_tok_per_s`` (None: not known, e.g. from a bench)."""
    server_tok_per_s: float | None = None
    """The serving engine's generation-token counter over its window (local endpoints)."""
    gap_tok_per_s: float | None = None
    """``server_tok_per_s`` minus the data files' rate: tokens spent on requests that never
    reached a file (retries, aborted or still-running requests)."""
    shape_note: str | None = None
    """Set when the bench used does not match how the runs use the endpoint."""
    source: str = "no measurement"
    """``live rate (run X)``, ``last live rate, measured 4 min ago (run X ...)``, ``bench of
    2026-11-30 01:23 (c=64), measured 2 h ago`` or ``no measurement``."""
    measured_at: float | None = None
    """When a measurement that is not live was made (Unix seconds): its age is shown."""
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
    seconds_err: float | None = None
    cost_usd: float | None = None
    cost_err: float | None = None
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
    rel = None
    if rate.out_tok_per_s is not None and rate.out_tok_per_s > 0:
        out.seconds = work.remaining_tokens / rate.out_tok_per_s
        out.time_source = rate.source
        if rate.out_tok_per_s_err is not None:
            rel = rate.out_tok_per_s_err / rate.out_tok_per_s
            out.seconds_err = out.seconds * rel
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
            if rel is not None:
                out.cost_err = out.cost_usd * rel
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
    # One rate behind every estimate: their errors are fully correlated and add up.
    if estimates and all(s is not None for s in secs):
        out.seconds = sum(s for s in secs if s is not None)
        out.time_source = endpoint.source
        if all(e.seconds_err is not None for e in estimates):
            out.seconds_err = sum(e.seconds_err or 0.0 for e in estimates)
    if estimates and all(c is not None for c in costs):
        out.cost_usd = sum(c for c in costs if c is not None)
        out.cost_source = estimates[0].cost_source
        if all(e.cost_err is not None for e in estimates):
            out.cost_err = sum(e.cost_err or 0.0 for e in estimates)
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
        if e.cost_err and e.cost_usd is not None:
            cost += f" ± {display.money(e.cost_err)}"
        if e.cost_usd is not None and e.cost_source and e.cost_source.startswith("GPU time"):
            cost += " of GPU time"
        when = display.duration_pm(e.seconds, e.seconds_err)
        parts.append(f"{labels.get(e.endpoint, e.endpoint)}: {when}, {cost}")
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
        rate = display.rate_pm(r.out_tok_per_s, r.out_tok_per_s_err, "output tok/s")
        lines.append(f"  {r.endpoint} ({r.kind}): {rate}")
        lines.append(f"    rate from {r.source}")
        if r.server_tok_per_s is not None:
            gap = ""
            if r.gap_tok_per_s is not None:
                gap = f"; {r.gap_tok_per_s:,.0f} tok/s more than reaches the files"
            lines.append(f"    server counters: {r.server_tok_per_s:,.0f} generated tok/s{gap}")
        if r.shape_note:
            lines.append(f"    ({r.shape_note})")
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


class LiveRate(msgspec.Struct, kw_only=True):
    """An endpoint's output measured by the data files of the running runs that use it."""

    tok_per_s: float | None = None
    err: float | None = None
    window_s: float | None = None
    responses: int = 0
    runs: list[str] = []
    concurrency: int | None = None
    """The runs' ``--concurrency`` (when they agree)."""
    last: LiveRate | None = None
    """The newest measurement of a run that has stopped (see ``RunView.last_rates``)."""
    last_at: float | None = None
    """When ``last`` ends (Unix seconds)."""


def live_rates(config: Config, snapshot: Snapshot) -> dict[str, LiveRate]:
    """Endpoint -> its running runs' output: each run's rate over a window across all its
    datasets (``RunView.rates``), added up over the runs (errors in quadrature). ``tok_per_s``
    is None while a run's window holds too few responses to say. An endpoint whose runs have
    stopped has no running runs (``runs`` empty) but keeps their last measurement (``last``)."""
    from supervisor.rates import combine

    parts: dict[str, list[Any]] = {}
    out: dict[str, LiveRate] = {}
    for host in snapshot.hosts:
        for run in host.runs:
            if run.state != "running" or not run.configured:
                _keep_last(config, run, out)
                continue
            try:
                ep = config.run(run.name).endpoint
            except Exception:
                continue
            if ep is None:
                continue
            parts.setdefault(ep, []).append(run.rates)
            live = out.setdefault(ep, LiveRate())
            live.runs.append(run.name)
            c = run.process.flags.concurrency if run.process is not None else None
            if c is not None:
                live.concurrency = c if live.concurrency in (None, c) else None
    for ep, rates in parts.items():
        both = combine(rates)
        live = out[ep]
        live.tok_per_s, live.err = both.tok_per_s, both.tok_per_s_err
        live.window_s, live.responses = both.window_s, both.responses
    return out


def _keep_last(config: Config, run: Any, out: dict[str, LiveRate]) -> None:
    """A run that stopped keeps its endpoint's last measurement (``RunView.last_rates``): the
    newest of them per endpoint, with when it was made, used while nothing runs there."""
    if not run.configured or run.last_rates is None or run.last_rates_at is None:
        return
    try:
        ep = config.run(run.name).endpoint
    except Exception:
        return
    if ep is None:
        return
    live = out.setdefault(ep, LiveRate())
    if live.last_at is not None and live.last_at >= run.last_rates_at:
        return
    r = run.last_rates
    live.last = LiveRate(
        tok_per_s=r.tok_per_s, err=r.tok_per_s_err, window_s=r.window_s,
        responses=r.responses, runs=[run.name],
    )  # fmt: skip
    live.last_at = run.last_rates_at


def server_rates(snapshot: Snapshot) -> dict[str, float]:
    """Endpoint -> generated tok/s from its serving engine's counter (local endpoints)."""
    out: dict[str, float] = {}
    for host in snapshot.hosts:
        for em in host.endpoints:
            if em.available and em.gen_tok_per_s.value is not None:
                out[em.name] = out.get(em.name, 0.0) + em.gen_tok_per_s.value
    return out


def _window_words(seconds: float | None) -> str:
    if not seconds:
        return ""
    return f" over {display.duration(seconds)}"


def _age(now: float, then: float) -> str:
    """``measured 4 min ago``."""
    return f"measured {display.duration(max(0.0, now - then))} ago"


def endpoint_rates(
    config: Config,
    live: dict[str, LiveRate],
    history: Sequence[BenchResult],
    server: dict[str, float] | None = None,
    now: float | None = None,
) -> list[EndpointRate]:
    """Each configured endpoint's rate: live when a run is using it (and its window holds
    enough responses), else the newest of its last live measurement (a run that stopped) and
    its latest bench of the runs' shape, with its age, else the latest bench marked as another
    shape."""
    from supervisor.bench.history import bench_label

    now = time.time() if now is None else now
    out = []
    for ep in config.endpoints:
        r = _rate_base(ep)
        lr = live.get(ep.name)
        if lr is not None and lr.tok_per_s is not None and lr.tok_per_s > 0:
            r.out_tok_per_s, r.out_tok_per_s_err = lr.tok_per_s, lr.err
            r.source = (
                f"live rate (run {', '.join(lr.runs)}: {lr.responses} responses"
                f"{_window_words(lr.window_s)})"
            )
        if server is not None and ep.name in server:
            r.server_tok_per_s = server[ep.name]
            if r.out_tok_per_s is not None and lr is not None and lr.tok_per_s is not None:
                r.gap_tok_per_s = r.server_tok_per_s - r.out_tok_per_s
        want_c = (lr.concurrency if lr is not None else None) or ep.concurrency
        bench, level, mismatch = _matching_bench(ep, history, want_c)
        last = lr.last if lr is not None else None
        last_at = lr.last_at if lr is not None else None
        if (
            r.out_tok_per_s is None
            and last is not None
            and last_at is not None
            and last.tok_per_s
            and (bench is None or level is None or bench.time <= last_at)
        ):
            # Nothing runs there now: its last live measurement, newer than any bench, and
            # how old it is (never dropped because the run finished).
            r.out_tok_per_s, r.out_tok_per_s_err = last.tok_per_s, last.err
            r.source = (
                f"last live rate, {_age(now, last_at)} (run {', '.join(last.runs)}: "
                f"{last.responses} responses{_window_words(last.window_s)}; not running now)"
            )
            r.measured_at = last_at
        if bench is not None and level is not None:
            if r.out_tok_per_s is None and level.output_tok_per_s > 0:
                r.out_tok_per_s = level.output_tok_per_s
                r.source = f"{bench_label(bench)} (c={level.concurrency}), {_age(now, bench.time)}"
                r.shape_note = mismatch
                r.measured_at = bench.time
            if level.cost_usd is not None and level.cost_source == "usage.cost" and level.completed:
                r.cost_per_request = level.cost_usd / level.completed
                r.completion_per_request = level.completion_tokens / level.completed
        if r.out_tok_per_s is None and r.server_tok_per_s:
            r.out_tok_per_s = r.server_tok_per_s
            r.source = "server counters (no run's files measured yet)"
        if r.out_tok_per_s is None:
            if lr is not None and lr.runs:
                r.source = (
                    f"no measurement yet (run {', '.join(lr.runs)}: {lr.responses} responses "
                    "so far, too few for a rate)"
                )
            else:
                r.source = f"no measurement (run `runwatch bench {ep.name}`)"
        out.append(r)
    return out


def _matching_bench(
    ep: EndpointConfig, history: Sequence[BenchResult], concurrency: int | None
) -> tuple[BenchResult | None, LevelResult | None, str | None]:
    """The newest bench of ``ep`` with a level at ``concurrency`` and ``ep.stream``'s mode; else
    the newest bench at all, with a note saying how its shape differs."""
    benches = [b for b in history if b.endpoint == ep.name and any(lv.completed for lv in b.levels)]
    for b in reversed(benches):
        if ep.stream is not None and b.stream != ep.stream:
            continue
        level = next(
            (lv for lv in b.levels if lv.completed and lv.concurrency == concurrency), None
        )
        if concurrency is None:
            level = pick_level(b, None)
        if level is not None:
            return b, level, None
    if not benches:
        return None, None, None
    newest = benches[-1]
    level = pick_level(newest, concurrency)
    differs = []
    if level is not None and concurrency is not None and level.concurrency != concurrency:
        differs.append(f"c={level.concurrency}, the runs use c={concurrency}")
    if ep.stream is not None and newest.stream != ep.stream:
        mode = {True: "streamed", False: "not streamed"}
        differs.append(f"{mode[newest.stream]}, the runs are {mode[ep.stream]}")
    note = "bench of another shape: " + "; ".join(differs) if differs else None
    return newest, level, note


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
    run_budgets: dict[str, int] = {}
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
                if ds.run_token_budget is not None:
                    # The run stops the dataset at its own --token-budget (the smallest, when
                    # several runs write it).
                    old = run_budgets.get(ds.name)
                    run_budgets[ds.name] = min(old or ds.run_token_budget, ds.run_token_budget)
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
        # The dataset's budget, else the run's flag (the views' budget: the same rule).
        budget = dataset_budget(cfg, budget)
        if cfg is not None:
            # The views' max_samples is already the run's own flag first, then the config's.
            samples = samples if samples is not None else cfg.max_samples
        # The effective budget: the run's own --token-budget first, then the config's.
        budget = run_budgets.get(name, budget)
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
    config: Config, snapshot: Snapshot, history: Sequence[BenchResult]
) -> Comparison:
    """The comparison for a snapshot the caller already has (pure, instant)."""
    works, skipped = works_from_snapshot(config, snapshot, history)
    rates = endpoint_rates(
        config,
        live_rates(config, snapshot),
        history,
        server=server_rates(snapshot),
        now=snapshot.time or None,
    )
    result = compare(works, rates, now=snapshot.time)
    result.skipped = skipped
    return result


def waiting_for_rates(config: Config, snapshot: Snapshot) -> bool:
    """True while a running run that uses an endpoint has too few responses for a rate and
    its endpoint's serving engine has no counter rate either (which ``endpoint_rates`` uses)."""
    server = server_rates(snapshot)
    return any(
        lr.runs and lr.tok_per_s is None and not server.get(ep)
        for ep, lr in live_rates(config, snapshot).items()
    )


class Refreshes(Protocol):
    """Takes a snapshot of every host (``Engine.refresh``)."""

    async def refresh(self) -> Snapshot: ...


async def gather_comparison(
    config: Config, *, engine: Refreshes, sample_s: float = 0.0
) -> Comparison:
    """Refresh the hosts once through ``engine`` and compare (``supervisor.engine``'s
    ``gather_comparison`` opens an engine for it).

    The engine starts from the rate history persisted by earlier refreshes (the dashboard,
    ``status``, an earlier ``compare``), so a running run has a rate at once. Only when a
    running run has none yet (no history, too few responses) are the hosts refreshed again every
    ``refresh_seconds``, for at most ``sample_s`` seconds.
    """
    from supervisor.bench.history import load_history

    start = time.monotonic()
    snapshot = await engine.refresh()
    while waiting_for_rates(config, snapshot) and time.monotonic() - start < sample_s:
        await asyncio.sleep(max(0.2, config.refresh_seconds))  # the measuring interval
        snapshot = await engine.refresh()
    return comparison_from(config, snapshot, load_history())
