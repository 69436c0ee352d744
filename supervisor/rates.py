"""Rates, stop-condition ETAs, the over-budget projection and stalls, from successive scans.

Laptop side and pure: every function takes the time (``now``, Unix seconds) as an argument, so
results are deterministic and testable.

Stable API (the engine calls it once per dataset per refresh)::

    trackers = Trackers()                        # keep for the life of the engine
    tracker = trackers.get((host, path))         # one RateTracker per dataset file
    view = build_dataset_view(
        scan,          # dict: the scanner's result for the dataset file (supervisor.agent.scan)
        dataset,       # config.DatasetConfig | None: token budget and samples wanted, prompts
        flags,         # model.RunFlags | None: the run's real stop flags (--max-samples...)
        tracker,       # RateTracker: history of this file; fed by this call
        cost,          # CostInfo | None: USD per M output tokens and/or GPU USD per hour
        writer_alive,  # bool: a live process writes this file (projection and stall need it)
        now,           # float: time of the refresh
        name=None,            # dataset name (default: the file's directory name)
        stall_seconds=300.0,  # RunConfig.stall_seconds
        prompts=None,         # number of prompts of the dataset (bounds the samples), if known
        count_texts=None,     # Callable[[list[str]], int]: tokenizer for tokenizer formats
    ) -> model.DatasetView

Definitions:

* progress counts distinct ids (``unique_ids``; ``records`` when a format has no id), so a
  duplicate response never moves a dataset closer to ``--max-samples``;
* tokens are completion tokens: the scan's ``completion_tokens`` plus, for formats counted with a
  tokenizer, the tokens of the texts the scans handed back (``count_texts``), accumulated in the
  tracker and dropped whenever the scanner starts a new stream (a rescan);
* rates are over the last minute, the last 10 minutes and everything this tracker has seen,
  measured from the newest observation at least that old (the oldest kept while the window is
  filling); ``None`` until two observations at least 1 s apart exist;
* the headline rate (``Rates.tok_per_s``, what the screens show and compare uses) is the
  10-minute window's, with one standard error ``tok_per_s / sqrt(n)`` for the ``n`` responses
  written within it; None until the window holds ``MIN_RESPONSES``;
* a dataset is ``done`` once no live process writes it or a stop condition is reached: its
  windowed rates are then 0 (the whole-life averages stay);
* projections use the 10-minute rate, else the 1-minute one, else the whole-run one;
* the run's stop conditions are its ``--max-samples`` (else the dataset's ``max_samples``), its
  ``--token-budget`` (never the config budget: a run without the flag does not stop at it), and
  the prompts running out. ``Projection.stop_reason`` is the first of them to come;
* the budget is the dataset's ``token_budget`` (else the run's ``--token-budget``). Past it without
  ``--token-budget`` in the run, everything the run still makes is waste: ``waste_tokens`` is what
  is already over plus what it will make before it stops, ``waste_cost_usd`` its price at the
  endpoint's output price, else at the GPU cost per hour over the time it takes;
* a dataset is stalled when its file has not grown for ``stall_seconds`` while its writer is alive.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any, get_args

import msgspec

from supervisor import display
from supervisor.config import DatasetConfig, EndpointConfig
from supervisor.model import DatasetView, Projection, Rates, RunFlags, RunView, RunWaste, Verdict

WINDOW_1M = 60.0
WINDOW_10M = 600.0
MIN_SPAN = 1.0
"""Observations closer than this give no rate (avoids dividing noise by nothing)."""
HISTORY_POINTS = 60
MIN_RESPONSES = 4
"""Responses a window must hold before its rate is shown (relative error 1/sqrt(4) = 50 %)."""
_SEEDED = "\0seeded"
"""Stream marker of a tracker seeded from the persisted history: the next scan continues it
(a new agent names its streams afresh) unless its counts went down."""


def dataset_budget(dataset: DatasetConfig | None, run_flag: int | None) -> int | None:
    """A dataset's token budget: the config's ``token_budget`` for it, else the run's own
    ``--token-budget`` (``run_flag``; None: none). The one rule of the rates, the budget policy
    and the comparison."""
    if dataset is not None and dataset.token_budget:
        return dataset.token_budget
    return run_flag


class CostInfo(msgspec.Struct, kw_only=True, frozen=True):
    """What output costs where the run sends its requests."""

    price_out_per_m: float | None = None
    """USD per million completion tokens (API endpoints)."""
    gpu_cost_per_hour: float | None = None
    """USD per hour of the GPUs behind a local endpoint."""

    @classmethod
    def from_endpoint(cls, endpoint: EndpointConfig | None) -> CostInfo | None:
        if endpoint is None:
            return None
        return cls(
            price_out_per_m=endpoint.price_out_per_m, gpu_cost_per_hour=endpoint.gpu_cost_per_hour
        )


class SteadyClock:
    """The time of rates: Unix time as it was when the clock was made, moved on by the monotonic
    clock since. A step of the wall clock (NTP, a VM resumed, by hand) never moves it, so the
    spans of a rate window stay the time that really passed (a step forward would put every
    observation outside the window and collapse the rates)."""

    def __init__(
        self, wall: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic
    ) -> None:
        self._mono = mono
        self._offset = wall() - mono()

    def __call__(self) -> float:
        return self._offset + self._mono()


class _Sample(msgspec.Struct, frozen=True):
    t: float
    records: int
    tokens: int


class RateTracker:
    """The history of one dataset file: observations, text-token tally and last growth."""

    def __init__(self) -> None:
        self._samples: deque[_Sample] = deque()
        self._first: _Sample | None = None
        self._stream: str | None = None
        self._text_tokens = 0
        self._reasoning_tokens = 0
        self._text_stream: str | None = None
        self._size: int | None = None
        self._last_growth: float | None = None
        self._writer: object = None
        self._written = False
        """The file grew while watched, under the current writer (it has started)."""

    def note_writer(self, writer: object) -> None:
        """The process writing the file now (any key); a new one has not written it yet."""
        if writer != self._writer:
            self._writer = writer
            self._written = False

    def since(self, started: float) -> None:
        """The writer now writing the file started at ``started`` (wall clock): what was seen
        before (an earlier writer's output, the idle gap after it) is no rate of this one, and
        the windows start again from the first observation under it."""
        if not self._samples or self._samples[0].t >= started:
            return
        while self._samples and self._samples[0].t < started:
            self._samples.popleft()
        self._first = self._samples[0] if self._samples else None
        if not self._samples:
            self._last_growth = None

    @property
    def written(self) -> bool:
        """True once the file grew while watched under the current writer."""
        return self._written

    # ------------------------------------------------------------------ feeding

    def add_text_tokens(self, stream: str | None, tokens: int, reasoning: int = 0) -> None:
        """Add tokenizer counts of texts from a scan of ``stream`` (a new stream restarts);
        ``reasoning`` of them are reasoning tokens (``reasoning_content``)."""
        if stream != self._text_stream:
            self._text_stream = stream
            self._text_tokens = 0
            self._reasoning_tokens = 0
        self._text_tokens += tokens
        self._reasoning_tokens += reasoning

    def reasoning_tokens(self, stream: str | None) -> int:
        """Reasoning tokens among the text tokens of ``stream``."""
        return self._reasoning_tokens if stream == self._text_stream else 0

    def holds_text_tally(self) -> bool:
        """True when tokenizer counts of texts were added (see :meth:`add_text_tokens`)."""
        return self._text_stream is not None and bool(self._text_tokens or self._reasoning_tokens)

    def text_tokens(self, stream: str | None) -> int:
        return self._text_tokens if stream == self._text_stream else 0

    def seed(self, points: list[tuple[float, int, int]]) -> None:
        """Start from persisted observations ``(t, responses, tokens)``, oldest first."""
        if self._samples or not points:
            return
        # Only what follows the last time the counts went down (the file was replaced, truncated
        # or started afresh): a rate never spans two files, as in observe().
        for i in range(len(points) - 1, 0, -1):
            if points[i][1] < points[i - 1][1] or points[i][2] < points[i - 1][2]:
                points = points[i:]
                break
        for t, records, tokens in points:
            self._samples.append(_Sample(float(t), int(records), int(tokens)))
        self._first = self._samples[0]
        self._stream = _SEEDED
        grown = [b.t for a, b in itertools.pairwise(self._samples) if b.records > a.records]
        self._last_growth = grown[-1] if grown else self._samples[0].t
        self._size = None

    def clear(self) -> None:
        """Forget every observation: the file is gone, and nothing it (or the persisted history
        of an earlier file at that path) said is a rate of what is there now."""
        self._samples.clear()
        self._first = None
        self._stream = None
        self._size = None
        self._last_growth = None
        self._written = False

    def latest(self) -> tuple[float, int, int] | None:
        """The newest observation ``(t, responses, tokens)``."""
        if not self._samples:
            return None
        s = self._samples[-1]
        return s.t, s.records, s.tokens

    def observe(
        self,
        now: float,
        records: int,
        tokens: int,
        size: int | None = None,
        stream: str | None = None,
    ) -> None:
        """Record the counts seen at ``now``. A new stream or a count going down restarts."""
        last = self._samples[-1] if self._samples else None
        continued = self._stream == _SEEDED and stream is not None
        if (stream is not None and stream != self._stream and not continued) or (
            last is not None and (records < last.records or tokens < last.tokens)
        ):
            self._samples.clear()
            self._first = None
            self._last_growth = None  # a new history starts now, not at the old one's last growth
            last = None
        self._stream = stream
        grew = (
            self._last_growth is None
            or (size is not None and self._size is not None and size != self._size)
            or (last is not None and (records > last.records or tokens > last.tokens))
        )
        if grew:
            self._last_growth = now
            self._written = self._written or last is not None
        self._size = size
        sample = _Sample(now, records, tokens)
        if last is not None and now <= last.t:
            self._samples[-1] = _Sample(last.t, records, tokens)
        else:
            self._samples.append(sample)
        if self._first is None:
            self._first = sample
        # Keep one observation older than the 10-minute window so the window is always covered.
        while len(self._samples) > 2 and self._samples[1].t <= now - WINDOW_10M:
            self._samples.popleft()

    # ------------------------------------------------------------------ reading

    def rate(self, window: float | None, now: float) -> tuple[float | None, float | None]:
        """``(records/s, tokens/s)`` over the last ``window`` seconds (None: since the start)."""
        return self._rate(window, now)[:2]

    def _rate(
        self, window: float | None, now: float
    ) -> tuple[float | None, float | None, float, int]:
        """``(records/s, tokens/s, span, responses in it)``."""
        if not self._samples:
            return None, None, 0.0, 0
        latest = self._samples[-1]
        base = self._first
        if window is not None:
            # The newest observation at least `window` old covers the window; before the window
            # has filled, the oldest one kept.
            base = self._samples[0]
            for s in self._samples:
                if s.t > now - window:
                    break
                base = s
        if base is None:
            return None, None, 0.0, 0
        span = latest.t - base.t
        if span < MIN_SPAN:
            return None, None, span, 0
        n = latest.records - base.records
        return n / span, (latest.tokens - base.tokens) / span, span, n

    def rates(self, now: float) -> Rates:
        """The 1-minute, 10-minute and whole rates, and the headline: the 10-minute window (or
        what of it is filled) with its Poisson error, shown from ``MIN_RESPONSES`` on."""
        r1, t1 = self.rate(WINDOW_1M, now)
        r10, t10, span, n = self._rate(WINDOW_10M, now)
        ra, ta = self.rate(None, now)
        out = Rates(
            req_per_s_1m=r1,
            req_per_s_10m=r10,
            req_per_s_all=ra,
            tok_per_s_1m=t1,
            tok_per_s_10m=t10,
            tok_per_s_all=ta,
            window_s=span or None,
            responses=max(0, n),
        )
        if t10 is not None and n >= MIN_RESPONSES:
            out.tok_per_s, out.req_per_s = t10, r10
            out.tok_per_s_err = t10 / math.sqrt(n)
        return out

    def since_growth(self, now: float) -> float:
        """Seconds since the file last grew (0 before the first observation)."""
        return 0.0 if self._last_growth is None else max(0.0, now - self._last_growth)

    def history(self) -> list[float]:
        """Tokens/s between successive observations of the last 10 minutes, oldest first."""
        out: list[float] = []
        for a, b in itertools.pairwise(self._samples):
            if b.t - a.t > 0:
                out.append((b.tokens - a.tokens) / (b.t - a.t))
        return out[-HISTORY_POINTS:]


IDLE_S = 2 * WINDOW_10M
"""A tracker not asked for this long is dropped (:meth:`Trackers.prune`): its window is stale and
the persisted history seeds a new one if the file comes back."""


class Trackers:
    """One :class:`RateTracker` per key (e.g. ``(host, path)``), created on first use; the ones
    not asked for in :data:`IDLE_S` are dropped by :meth:`prune` (a long-lived watcher sees
    processes and files come and go)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._by_key: dict[Hashable, RateTracker] = {}
        self._used: dict[Hashable, float] = {}
        self._clock = clock

    def get(self, key: Hashable) -> RateTracker:
        tracker = self._by_key.get(key)
        if tracker is None:
            tracker = self._by_key[key] = RateTracker()
        self._used[key] = self._clock()
        return tracker

    def drop(self, key: Hashable) -> None:
        self._by_key.pop(key, None)
        self._used.pop(key, None)

    def prune(
        self, idle_s: float = IDLE_S, only: Callable[[Hashable], bool] | None = None
    ) -> list[Hashable]:
        """Drop the trackers not asked for in ``idle_s`` seconds (of the keys ``only`` accepts,
        default all) and return their keys. A tracker holding a tally of tokenizer-counted texts
        is kept: the host's scanner goes on from where it was and sends only new texts, so that
        tally cannot be rebuilt."""
        cutoff = self._clock() - idle_s
        gone = [
            k
            for k, t in self._used.items()
            if t < cutoff and (only is None or only(k)) and not self._by_key[k].holds_text_tally()
        ]
        for k in gone:
            self.drop(k)
        return gone

    def __len__(self) -> int:
        return len(self._by_key)


# --------------------------------------------------------------------------- projection


def project(
    *,
    done: int,
    tokens: int,
    records: int,
    req_rate: float | None,
    tok_rate: float | None,
    max_samples: int | None,
    run_token_budget: int | None,
    budget: int | None,
    prompts: int | None,
    writer_alive: bool,
    cost: CostInfo | None,
    budget_flag: str | None = "--token-budget",
) -> Projection:
    """The projection of one dataset (see the module docstring for the definitions);
    ``budget_flag`` is the run's client's budget flag (None: it has none), named in messages."""
    avg = tokens / records if records else None
    etas: dict[str, float] = {}
    remaining: dict[str, tuple[int | None, int | None]] = {}
    for stop, limit in (("max_samples", max_samples), ("prompts", prompts)):
        if limit is None:
            continue
        left = max(0, limit - done)
        remaining[stop] = (left, round(left * avg) if avg is not None else None)
        if req_rate:
            etas[stop] = left / req_rate
        elif left == 0:
            etas[stop] = 0.0
    if run_token_budget is not None:
        left_tok = max(0, run_token_budget - tokens)
        samples = math.ceil(left_tok / avg) if avg else None
        remaining["token_budget"] = (samples, left_tok)
        if tok_rate:
            etas["token_budget"] = left_tok / tok_rate
        elif left_tok == 0:
            etas["token_budget"] = 0.0
    proj = Projection(etas=dict(etas))
    if budget is not None and run_token_budget is None and budget > tokens and tok_rate:
        proj.etas["budget"] = (budget - tokens) / tok_rate
    if etas:
        stop = min(etas, key=lambda k: etas[k])
        proj.stop_reason = stop
        proj.eta_s = etas[stop]
        proj.remaining_samples, proj.remaining_tokens = remaining[stop]
        proj.remaining_s = etas[stop]
    elif remaining:
        # A stop condition exists but nothing moves yet: say what is left, not when.
        stop = next(iter(remaining))
        proj.stop_reason = stop
        proj.remaining_samples, proj.remaining_tokens = remaining[stop]
    if not writer_alive:
        proj.eta_s = proj.remaining_s = None
    if budget is None:
        return proj
    over = max(0, tokens - budget)
    proj.over_budget_tokens = over
    future = proj.remaining_tokens if writer_alive and proj.remaining_tokens is not None else 0
    if run_token_budget is None:
        proj.waste_tokens = max(0, tokens + future - budget)
        if proj.waste_tokens and cost is not None:
            if cost.price_out_per_m is not None:
                proj.waste_cost_usd = proj.waste_tokens / 1e6 * cost.price_out_per_m
            elif cost.gpu_cost_per_hour is not None and tok_rate:
                proj.waste_cost_usd = proj.waste_tokens / tok_rate / 3600 * cost.gpu_cost_per_hour
    proj.message = _message(
        proj, tokens, budget, run_token_budget, writer_alive, future, budget_flag, records
    )
    return proj


def run_waste(run: RunView, cost: CostInfo | None) -> RunWaste | None:
    """What ``run`` makes past its datasets' budgets if left alone (:class:`RunWaste`): None
    unless it runs without its client's budget flag and something of it is past a budget.

    A dataset with a figure gives its ``waste_tokens`` (and cost); a dataset not started that
    has a budget and samples to go gives those samples times a tokens per response, past its
    budget: that of the started dataset whose prompts are nearest its own in length
    (:func:`nearest_in_prompts`), else the run's average so far, named a guess. The time is the
    whole at the run's own rate (the datasets take turns or share it: the run makes tokens at
    that rate either way)."""
    flags = run.process.flags if run.process is not None else None
    if run.state != "running" or flags is None or flags.token_budget is not None:
        return None
    made = sum(d.completion_tokens for d in run.datasets)
    responses = sum(d.records for d in run.datasets)
    average = made / responses if responses else None
    out = RunWaste()
    for d in run.datasets:
        waste = d.projection.waste_tokens
        if not waste and d.records == 0 and d.token_budget is not None:
            like = nearest_in_prompts(d, run.datasets)
            per = like.completion_tokens / like.records if like is not None else average
            if per is not None:
                left = d.projection.remaining_samples
                waste = max(0, round((left or 0) * per) - d.token_budget)
            if waste and like is not None:
                out.like[d.name] = like.name
            elif waste:
                out.guessed.append(d.name)
        if waste:
            out.tokens += waste
            out.datasets.append(d.name)
    if not out.tokens:
        return None
    rate = run.rates.tok_per_s or run.rates.tok_per_s_1m or run.rates.tok_per_s_all
    out.seconds = out.tokens / rate if rate else None
    if cost is not None and cost.price_out_per_m is not None:
        out.cost_usd = out.tokens / 1e6 * cost.price_out_per_m
    elif cost is not None and cost.gpu_cost_per_hour is not None and out.seconds is not None:
        out.cost_usd = out.seconds / 3600 * cost.gpu_cost_per_hour
    over = _names(out.datasets)
    when = f" over ~{display.duration(out.seconds)}" if out.seconds is not None else ""
    usd = f", ~{display.money(out.cost_usd)}" if out.cost_usd else ""
    made_past = f"+{display.compact(out.tokens)} tokens past budgets in {over}"
    out.message = f"left alone: {made_past}{when}{usd}{_like_words(run, out)}"
    if out.guessed and average is not None:
        out.message += (
            f"; {_names(out.guessed)} not started: guessed from the run's "
            f"{display.compact(average)} tokens per response"
        )
    return out


def nearest_in_prompts(dataset: DatasetView, datasets: list[DatasetView]) -> DatasetView | None:
    """Of the started ``datasets``, the one whose prompts are nearest ``dataset``'s in mean
    length (by ratio, so 100 and 200 characters are as far apart as 1,000 and 2,000): the one
    whose answers stand for those of ``dataset``. None when its prompts' length is unknown."""
    mine = dataset.prompt_chars
    if not mine:
        return None
    started = [
        d
        for d in datasets
        if d.records > 0 and d.completion_tokens > 0 and d.prompt_chars and d is not dataset
    ]
    if not started:
        return None
    return min(started, key=lambda d: abs(math.log((d.prompt_chars or 1.0) / mine)))


def _like_words(run: RunView, waste: RunWaste) -> str:
    """``; B3, B4 not started: at B2's 3.7 k tokens per response (prompts nearest in length),
    2,733 samples to budget``, one clause per started dataset they are projected from."""
    by_name = {d.name: d for d in run.datasets}
    words = ""
    for like in dict.fromkeys(waste.like.values()):
        names = [n for n, s in waste.like.items() if s == like]
        source = by_name[like]
        per = source.completion_tokens / source.records
        budgets = {by_name[n].token_budget for n in names}
        budget = budgets.pop() if len(budgets) == 1 else None
        to_budget = f", {math.ceil(budget / per):,} samples to budget" if budget is not None else ""
        words += (
            f"; {_names(names)} not started: at {like}'s {display.compact(per)} tokens per "
            f"response (prompts nearest in length){to_budget}"
        )
    return words


def _names(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 4 else f"{names[0]}..{names[-1]} ({len(names)})"


def past_budget(tokens: int, budget: int, records: int) -> bool:
    """Over budget: past it by more than one record (the average one). A client that stops at its
    budget finishes the record that reaches it, so a dataset just at its budget ("6 k / 6 k") is
    at it, not over it."""
    one_record = tokens / records if records > 0 else 0.0
    return tokens - budget > one_record


def _message(
    proj: Projection,
    tokens: int,
    budget: int,
    run_token_budget: int | None,
    writer_alive: bool,
    future: int,
    budget_flag: str | None = "--token-budget",
    records: int = 0,
) -> str:
    head = display.budget(tokens, budget)
    # What the run lacks: its client's budget flag, or (a client without one) any budget flag.
    lacks = f"no {budget_flag}" if budget_flag else "its client has no budget flag"
    cost = f", ~{display.money(proj.waste_cost_usd)} wasted" if proj.waste_cost_usd else ""
    if not writer_alive:
        over = past_budget(tokens, budget, records)
        return head + (" - over budget, stopped" if over else " - stopped")
    if run_token_budget is not None:
        if proj.stop_reason == "token_budget" and proj.eta_s == 0:
            return f"{head}, {budget_flag or 'budget'} reached"
        if proj.stop_reason == "token_budget" and proj.eta_s is not None:
            return f"{head}, stops at {budget_flag or 'budget'} in {display.duration(proj.eta_s)}"
        return head
    when = f" over {display.duration(proj.remaining_s)}" if proj.remaining_s is not None else ""
    if tokens > budget:
        if future:
            return f"{head}, +{display.compact(future)} projected{when} - {lacks}{cost}"
        return f"{head} - over budget, {lacks}{cost}"
    passes = proj.etas.get("budget")
    if proj.waste_tokens and passes is not None:
        return (
            f"{head}, passes budget in {display.duration(passes)}, "
            f"+{display.compact(proj.waste_tokens)} over by {_stop_name(proj.stop_reason)}"
            f" - {lacks}{cost}"
        )
    if proj.waste_tokens:
        # No rate yet (a single look at the files): the waste is known, its timing is not.
        return (
            f"{head}, +{display.compact(proj.waste_tokens)} over budget by "
            f"{_stop_name(proj.stop_reason)} - {lacks}{cost}"
        )
    return head


def _stop_name(stop: str | None) -> str:
    return {"max_samples": "--max-samples", "prompts": "the last prompt"}.get(stop or "", "the end")


# --------------------------------------------------------------------------- the view


def build_dataset_view(
    scan: Mapping[str, Any],
    dataset: DatasetConfig | None,
    flags: RunFlags | None,
    tracker: RateTracker,
    cost: CostInfo | None,
    writer_alive: bool,
    now: float,
    *,
    name: str | None = None,
    stall_seconds: float = 300.0,
    prompts: int | None = None,
    count_texts: Callable[[list[str]], int] | None = None,
    budget_flag: str | None = "--token-budget",
    writer: object = None,
    writer_since: float | None = None,
) -> DatasetView:
    """The :class:`model.DatasetView` of one dataset at ``now`` (feeds ``tracker``).

    ``writer`` names the live process (any key): a dataset is stalled only when it has grown
    under that writer (it started) and is not finished, then stopped growing for
    ``stall_seconds``; one not started yet, or done, is never stalled. ``writer_since``: when
    that process started (wall clock); the rates are its own (:meth:`RateTracker.since`)."""
    path = str(scan.get("path") or "")
    view_name = name or os.path.basename(os.path.dirname(path)) or path
    state = scan.get("state", "ok")
    if state not in ("ok", "missing", "unreadable", "not-a-file", "error"):
        state = "error"
    stream = scan.get("stream")
    texts = scan.get("texts") or []
    reasoning_texts = scan.get("reasoning_texts") or []
    if (texts or reasoning_texts) and count_texts is not None:
        reasoning = count_texts(list(reasoning_texts)) if reasoning_texts else 0
        content = count_texts(list(texts)) if texts else 0
        tracker.add_text_tokens(stream, content + reasoning, reasoning)
    tokens = int(scan.get("completion_tokens") or 0) + tracker.text_tokens(stream)
    records = int(scan.get("records") or 0)
    unique = int(scan.get("unique_ids") or 0)
    done = unique if unique else records
    max_samples = flags.max_samples if flags is not None and flags.max_samples else None
    if max_samples is None and dataset is not None:
        max_samples = dataset.max_samples
    run_budget = flags.token_budget if flags is not None else None
    budget = dataset_budget(dataset, run_budget)
    tracker.note_writer(writer if writer_alive else None)
    if writer_alive and writer_since is not None:
        tracker.since(writer_since)
    if state == "ok":
        tracker.observe(now, done, tokens, scan.get("size"), stream)
    elif state == "missing":
        tracker.clear()
    rates = tracker.rates(now)
    req = _first_known(rates.req_per_s_10m, rates.req_per_s_1m, rates.req_per_s_all)
    tok = _first_known(rates.tok_per_s_10m, rates.tok_per_s_1m, rates.tok_per_s_all)
    projection = project(
        done=done,
        tokens=tokens,
        records=records,
        req_rate=req,
        tok_rate=tok,
        max_samples=max_samples,
        run_token_budget=run_budget,
        budget=budget,
        prompts=prompts,
        writer_alive=writer_alive,
        cost=cost,
        budget_flag=budget_flag,
    )
    reached = any(
        projection.etas.get(stop) == 0 for stop in ("max_samples", "token_budget", "prompts")
    )
    finished = state == "ok" and (not writer_alive or reached)
    if finished:
        rates = stopped_rates(rates)
    verdict: Verdict = scan.get("verdict") or "empty"
    if verdict not in get_args(Verdict):
        verdict = "error"
    return DatasetView(
        name=view_name,
        path=path,
        state=state,
        error=scan.get("error"),
        records=records,
        unique_ids=unique,
        duplicates=int(scan.get("duplicates") or 0),
        prompt_tokens=int(scan.get("prompt_tokens") or 0),
        completion_tokens=tokens,
        finish_reasons=dict(scan.get("finish_reasons") or {}),
        bad_lines=int(scan.get("bad_lines_total", len(scan.get("bad_lines") or ()))),
        partial_tail_bytes=int(scan.get("partial_tail_bytes") or 0),
        verdict=verdict,
        verdict_detail=scan.get("verdict_detail"),
        max_samples=max_samples,
        token_budget=budget,
        rates=rates,
        projection=projection,
        over_budget=budget is not None and past_budget(tokens, budget, records),
        stalled=writer_alive
        and state == "ok"
        and tracker.written
        and not _finished(done, tokens, max_samples, prompts, run_budget)
        and tracker.since_growth(now) >= stall_seconds,
        history=tracker.history(),
        reasoning_tokens=tracker.reasoning_tokens(stream),
        idle_s=tracker.since_growth(now),
        done=finished,
        run_token_budget=run_budget,
    )


def stopped_rates(rates: Rates) -> Rates:
    """The rates of something that makes nothing any more: every window 0 (exactly: no error),
    the whole-life averages kept."""
    return msgspec.structs.replace(
        rates,
        req_per_s_1m=0.0,
        req_per_s_10m=0.0,
        tok_per_s_1m=0.0,
        tok_per_s_10m=0.0,
        tok_per_s=0.0,
        tok_per_s_err=0.0,
        req_per_s=0.0,
        responses=0,
    )


def combine(parts: list[Rates]) -> Rates:
    """Rates of independent producers added up (several runs on one endpoint): headline rates
    add, their errors add in quadrature; None when any part has no headline yet."""
    if not parts or any(p.tok_per_s is None for p in parts):
        return Rates(responses=sum(p.responses for p in parts))
    tok = sum(p.tok_per_s or 0.0 for p in parts)
    err = math.sqrt(sum((p.tok_per_s_err or 0.0) ** 2 for p in parts))
    spans = [p.window_s for p in parts if p.window_s]
    return Rates(
        tok_per_s=tok,
        tok_per_s_err=err,
        req_per_s=sum(p.req_per_s or 0.0 for p in parts),
        window_s=min(spans) if spans else None,
        responses=sum(p.responses for p in parts),
    )


def _finished(
    done: int, tokens: int, max_samples: int | None, prompts: int | None, budget: int | None
) -> bool:
    """A stop condition is reached: the dataset is done."""
    return (
        (max_samples is not None and done >= max_samples)
        or (prompts is not None and done >= prompts)
        or (budget is not None and tokens >= budget)
    )


def _first_known(*values: float | None) -> float | None:
    for v in values:
        if v is not None:
            return v
    return None
