"""Serving-engine metrics: SGLang's and vLLM's Prometheus text, read into figures a user can act
on (running and queued requests, KV-cache use, token rates, time to first token).

The host agent fetches the text over the host's loopback (``supervisor.agent.metrics``); this
module parses it with ``prometheus_client``'s text parser and keeps, per endpoint, a short
history of scrapes so that

* counters (``*_tokens_total``) become rates over a window (up to 10 minutes). A counter that
  went down means the server restarted: the delta across the reset is the new value (it counted
  up from zero);
* histograms (time to first token) become p50/p90 of the requests within the window: the delta of
  the cumulative buckets, interpolated linearly inside the bucket where the quantile falls (as
  Prometheus' ``histogram_quantile`` does). With a single scrape the quantiles are over
  everything since the server started, and say so;
* gauges (running, queued, KV use) are the latest value.

Label sets are read as the engines write them (``replicas``): one copy of a scheduler's figures
is kept per data-parallel rank (SGLang's tensor, pipeline and expert ranks all report the same
batch with ``--enable-metrics-for-all-schedulers``), a gauge's per-priority breakdown is dropped
when its total is there, and what is left (data-parallel ranks: SGLang ``dp_rank``, vLLM
``engine``; several models) is summed, KV use takes the largest. Only the names below are read; a
server that publishes none of them is "not enabled".
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from supervisor.model import EndpointMetrics, Quantity

WINDOW_S = 600.0
"""Longest window of counter rates and histogram quantiles."""

# name in the text -> the quantity it is, per engine. Counters are named with their ``_total``.
SGLANG = {
    "running": "sglang:num_running_reqs",
    "queued": "sglang:num_queue_reqs",
    "kv_usage": "sglang:token_usage",
    "gen_throughput": "sglang:gen_throughput",
    "prompt_tokens": "sglang:prompt_tokens_total",
    "generation_tokens": "sglang:generation_tokens_total",
    "cache_hit_rate": "sglang:cache_hit_rate",
    "ttft": "sglang:time_to_first_token_seconds",
}
VLLM = {
    "running": "vllm:num_requests_running",
    "queued": "vllm:num_requests_waiting",
    "kv_usage": "vllm:kv_cache_usage_perc",
    "kv_usage_old": "vllm:gpu_cache_usage_perc",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "ttft": "vllm:time_to_first_token_seconds",
}
NOT_ENABLED = "not enabled: SGLang needs --enable-metrics (vLLM serves /metrics by default)"

REPLICA_LABELS = ("tp_rank", "pp_rank", "moe_ep_rank", "pid")
"""Labels that tell copies of one data-parallel rank's figures apart. SGLang labels its scheduler
metrics with ``tp_rank`` and ``pp_rank`` (0.5 on) and ``moe_ep_rank`` (later 0.5 releases); by
default only the first rank of each data-parallel rank writes them, with
``--enable-metrics-for-all-schedulers`` every rank does, and every rank of one data-parallel rank
runs the same batch. prometheus_client's multiprocess mode ``all`` (the default of a gauge
declared without a mode, e.g. vLLM's ``kv_cache_usage_perc``) adds a ``pid`` per process. Of
each set of copies the lowest ranks are read; the labels that remain (``dp_rank``, vLLM's
``engine``, the model) are distinct work and are summed."""
PRIORITY_LABEL = "priority"
"""SGLang with priority scheduling writes a queue gauge's total under ``priority=""`` and its
breakdown under ``priority="<n>"`` (its counters count each request once, under its priority)."""

Labels = tuple[tuple[str, str], ...]


def _rank(value: str | None) -> tuple[int, int, str]:
    """Sort key of a replica label's value: absent first, then numbers as numbers."""
    if value is None:
        return (0, 0, "")
    if value.isdigit():
        return (1, int(value), "")
    return (2, 0, value)


def distinct_samples(families: Iterable[Any]) -> list[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of every sample that counts once: of the samples that differ
    only in :data:`REPLICA_LABELS` the one with the lowest ranks, and of a gauge that has a
    ``priority=""`` total, only the total (NaN values are skipped)."""
    chosen: dict[tuple[str, Labels], tuple[tuple[tuple[int, int, str], ...], dict[str, str], float]]
    chosen = {}
    gauges: set[str] = set()
    for family in families:
        if family.type == "gauge":
            gauges.add(family.name)
        for sample in family.samples:
            value = float(sample.value)
            if math.isnan(value):
                continue
            labels: dict[str, str] = dict(sample.labels)
            rest = tuple(sorted((k, v) for k, v in labels.items() if k not in REPLICA_LABELS))
            rank = tuple(_rank(labels.get(k)) for k in REPLICA_LABELS)
            key = (sample.name, rest)
            held = chosen.get(key)
            if held is None or rank < held[0]:
                chosen[key] = (rank, labels, value)
    totals = {
        (name, tuple(kv for kv in rest if kv[0] != PRIORITY_LABEL))
        for name, rest in chosen
        if name in gauges and (PRIORITY_LABEL, "") in rest
    }
    out = []
    for (name, rest), (_, labels, value) in chosen.items():
        whole = (name, tuple(kv for kv in rest if kv[0] != PRIORITY_LABEL))
        if labels.get(PRIORITY_LABEL, "") != "" and name in gauges and whole in totals:
            continue  # a part of a total that is there
        out.append((name, labels, value))
    return out


class Scrape(msgspec.Struct, kw_only=True):
    """The figures of one ``/metrics`` text."""

    t: float
    engine: str | None = None
    running: float | None = None
    queued: float | None = None
    kv_usage: float | None = None
    gen_throughput: float | None = None
    cache_hit_rate: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    ttft_buckets: list[tuple[float, float]] = []
    """Cumulative ``(le, count)`` of the time-to-first-token histogram, ``le`` ascending."""


def parse(text: str, t: float) -> Scrape:
    """The figures of a Prometheus text (raises ValueError when it is not one)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    maxima: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for name, labels, value in distinct_samples(text_string_to_metric_families(text)):
        if name.endswith("_bucket") and "le" in labels:
            le = float(labels["le"])
            per = buckets.setdefault(name[: -len("_bucket")], {})
            per[le] = per.get(le, 0.0) + value
            continue
        sums[name] = sums.get(name, 0.0) + value
        maxima[name] = max(maxima.get(name, value), value)
    engine: str | None = None
    names: Mapping[str, str] = {}
    if any(n.startswith("sglang:") for n in (*sums, *buckets)):
        engine, names = "sglang", SGLANG
    elif any(n.startswith("vllm:") for n in (*sums, *buckets)):
        engine, names = "vllm", VLLM
    out = Scrape(t=t, engine=engine)
    if engine is None:
        return out
    for key in ("running", "queued", "prompt_tokens", "generation_tokens", "gen_throughput"):
        metric = names.get(key)
        if metric is not None and metric in sums:
            setattr(out, key, sums[metric])
    for key in ("kv_usage", "kv_usage_old", "cache_hit_rate"):
        metric = names.get(key)
        if metric is not None and metric in maxima:
            field = "kv_usage" if key.startswith("kv_usage") else key
            if getattr(out, field) is None:
                setattr(out, field, maxima[metric])
    hist = buckets.get(names["ttft"])
    if hist:
        out.ttft_buckets = sorted(hist.items())
    return out


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of a cumulative histogram ``[(le, count)]`` by linear interpolation
    within the bucket it falls in (the ``+Inf`` bucket answers with the last finite bound)."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def bucket_delta(
    new: list[tuple[float, float]], old: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Requests observed between two scrapes of a histogram (the new one alone after a reset)."""
    before = dict(old)
    if any(count < before.get(le, 0.0) for le, count in new):
        return list(new)
    return [(le, count - before.get(le, 0.0)) for le, count in new]


def counter_delta(values: Iterable[float | None]) -> float | None:
    """What a counter counted across successive readings, resets included (a reading below the
    previous one means it restarted from zero)."""
    total, last, seen = 0.0, None, False
    for v in values:
        if v is None:
            continue
        seen = True
        if last is not None:
            total += v - last if v >= last else v
        last = v
    return total if seen else None


RESTART_GAP_S = 60.0
"""A counter that went down across a longer gap than this between two scrapes starts the window
again (when in the gap the server restarted is unknown)."""


class MetricsTracker:
    """The scrapes of one endpoint over the last ``WINDOW_S`` seconds, and its figures."""

    def __init__(self) -> None:
        self._scrapes: deque[Scrape] = deque()

    def seed(self, t: float, generation_tokens: float, prompt_tokens: float | None) -> None:
        """Add a persisted counter reading, oldest first (so that the first scrape already
        gives a rate)."""
        self.add(Scrape(t=t, generation_tokens=generation_tokens, prompt_tokens=prompt_tokens))

    def add(self, scrape: Scrape) -> None:
        if self._scrapes and scrape.t <= self._scrapes[-1].t:
            return
        prev = self._scrapes[-1] if self._scrapes else None
        if (
            prev is not None
            and scrape.t - prev.t > RESTART_GAP_S
            and scrape.generation_tokens is not None
            and prev.generation_tokens is not None
            and scrape.generation_tokens < prev.generation_tokens
        ):
            # The server restarted at some unknown moment of a long gap in the scrapes (runwatch
            # was not watching, or the server was down): the time before its restart made none
            # of its tokens, so the window starts again here.
            self._scrapes.clear()
        self._scrapes.append(scrape)
        while len(self._scrapes) > 2 and self._scrapes[1].t <= scrape.t - WINDOW_S:
            self._scrapes.popleft()

    def latest(self) -> Scrape | None:
        return self._scrapes[-1] if self._scrapes else None

    def figures(self, view: EndpointMetrics) -> EndpointMetrics:
        """``view`` filled with the latest gauges, the counter rates and the TTFT quantiles."""
        if not self._scrapes:
            return view
        last = self._scrapes[-1]
        first = self._scrapes[0]
        view.engine = last.engine
        view.running = Quantity(value=last.running)
        view.queued = Quantity(value=last.queued)
        view.kv_usage = Quantity(value=last.kv_usage)
        view.reported_gen_throughput = last.gen_throughput
        view.cache_hit_rate = last.cache_hit_rate
        view.generation_tokens_total = last.generation_tokens
        span = last.t - first.t
        if span >= 1.0:
            gen = counter_delta(s.generation_tokens for s in self._scrapes)
            prompt = counter_delta(s.prompt_tokens for s in self._scrapes)
            view.window_s = span
            if gen is not None:
                view.gen_tok_per_s = Quantity(value=gen / span)
                # The counter is exact; what is uncertain is when each scrape was taken (the
                # round trip's jitter, under a second) relative to the span.
                view.gen_tok_per_s_err = gen / span * (1.0 / span)
            if prompt is not None:
                view.prompt_tok_per_s = prompt / span
        old = next((s for s in self._scrapes if s.ttft_buckets), None)
        if last.ttft_buckets:
            if old is not None and old is not last:
                hist = bucket_delta(last.ttft_buckets, old.ttft_buckets)
                span_s = last.t - old.t
                view.ttft_window = f"{span_s:.0f} s" if span_s < 90 else f"{round(span_s / 60)} min"
            else:
                hist = last.ttft_buckets
                view.ttft_window = "since start"
            view.ttft_p50_s = quantile(0.5, hist)
            view.ttft_p90_s = quantile(0.9, hist)
        return view


def why_unavailable(fetch: Mapping[str, Any]) -> str:
    """One line saying why a fetch gave no figures."""
    error = str(fetch.get("error") or "no answer")
    if fetch.get("status") == 404:
        return f"{NOT_ENABLED} (HTTP 404)"
    return error


def endpoint_view(
    name: str, url: str, fetch: Mapping[str, Any] | None, tracker: MetricsTracker, now: float
) -> EndpointMetrics:
    """The :class:`EndpointMetrics` of one endpoint after a refresh (feeds ``tracker``)."""
    view = EndpointMetrics(name=name, url=url)
    if fetch is None:
        view.why = "not fetched (the host's agent does not fetch metrics)"
        return view
    if not fetch.get("ok"):
        view.why = why_unavailable(fetch)
        return view
    try:
        scrape = parse(str(fetch.get("text") or ""), float(fetch.get("time") or now))
    except ValueError as e:
        view.why = f"unreadable /metrics: {e}"
        return view
    if scrape.engine is None:
        view.why = f"no SGLang or vLLM figures in /metrics; {NOT_ENABLED}"
        return view
    tracker.add(scrape)
    view.available = True
    if fetch.get("truncated"):
        cap = int(fetch.get("max_bytes") or 0)
        size = f"{cap >> 20} MiB" if cap >= 1 << 20 else f"{cap} bytes"
        view.note = f"/metrics over {size}: figures from its first {size} only"
    return tracker.figures(view)


def default_metrics_url(base_url: str) -> str:
    """``http://127.0.0.1:30000/v1`` -> ``http://127.0.0.1:30000/metrics``."""
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + "/metrics"
