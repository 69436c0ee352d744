"""What the engine keeps between refreshes beyond the datasets' trackers: run-level rates, the
serving engines' metrics, the GPUs, and the persisted history behind all of them.

``Live`` is owned by ``supervisor.engine.Engine``; each refresh it

* seeds a dataset's tracker from the history the first time the dataset is seen, and records
  every dataset's ``(t, responses, tokens)`` in the history;
* marks a dataset ``done`` when its run has moved on: the run is alive, another of its datasets
  grew since, and this one has not grown for ``MOVED_ON_S`` (runs write their datasets one after
  another), so a finished dataset's rate is 0, not the tail of its last window;
* measures each run's rate over a window across all its datasets (its own tracker of the summed
  counts: a dataset switch inside the window is counted once, never as two windows added up),
  and records ``(t, responses, tokens, alive)`` in the history (``alive``: 1 while the run runs,
  so that the gate's quiet window reads the pace of its writing, not of its stops);
* turns each local endpoint's ``/metrics`` text into :class:`model.EndpointMetrics`
  (``supervisor.servermetrics``) and nvidia-smi's lines into :class:`model.GpuView` (with the runs
  whose processes hold each GPU);
* saves the history every ``SAVE_EVERY_S`` and on close.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from typing import Any

from supervisor import rates, servermetrics
from supervisor.config import Config
from supervisor.history import History, history_path
from supervisor.model import DatasetView, EndpointMetrics, GpuView, Quantity, Rates, RunView

MOVED_ON_S = 120.0
"""A dataset of a live run that has not grown for this long while another grew since is done."""
SAVE_EVERY_S = 15.0
THEIRS_IDLE_S = 120.0
"""A dataset of a process the config does not know (another user's run, a look-alike), not seen
for this long, is forgotten: its tracker and its history. On a shared machine others' runs come
and go for as long as a watcher runs; what is kept of them must not grow with their number."""
SPARK_POINTS = 120
_MISSING = -1.0


def last_window(points: list[tuple[float, ...]]) -> tuple[Rates | None, float | None]:
    """The rate of a run's last window while it ran (up to ``rates.WINDOW_10M``), from its
    history points ``(t, responses, tokens, alive)``, and when that window ends; (None, None)
    when it holds fewer than ``rates.MIN_RESPONSES`` responses."""
    alive: list[tuple[float, ...]] = []  # the last stretch of points while it ran
    for p in reversed(points):
        if len(p) > 3 and p[3] >= 1.0:
            alive.insert(0, p)
        elif alive:
            break
    if len(alive) < 2:
        return None, None
    end = alive[-1]
    window = [p for p in alive if p[0] >= end[0] - rates.WINDOW_10M]
    start = window[0] if len(window) > 1 else alive[-2]
    span, responses, tokens = end[0] - start[0], end[1] - start[1], end[2] - start[2]
    if span <= 0 or responses < rates.MIN_RESPONSES or tokens <= 0:
        return None, None
    tok = tokens / span
    return (
        Rates(
            tok_per_s=tok,
            tok_per_s_err=tok / math.sqrt(responses),
            req_per_s=responses / span,
            window_s=span,
            responses=int(responses),
        ),
        end[0],
    )


def metrics_specs(config: Config, host: str) -> list[dict[str, str]]:
    """``[{name, url}]`` of the local endpoints the runs on ``host`` use."""
    out: dict[str, str] = {}
    for run in config.runs:
        if run.host != host or run.endpoint is None:
            continue
        ep = next((e for e in config.endpoints if e.name == run.endpoint), None)
        if ep is None or ep.kind != "local":
            continue
        out[ep.name] = ep.metrics_url or servermetrics.default_metrics_url(ep.base_url)
    return [{"name": n, "url": u} for n, u in out.items()]


class Live:
    """See the module docstring."""

    def __init__(self, config: Config, persist: bool = True) -> None:
        self.config = config
        self.history = History(history_path(config.key) if persist else None)
        self.history.load()
        self._runs = rates.Trackers()
        self._metrics: dict[tuple[str, str], servermetrics.MetricsTracker] = {}
        self._seeded: set[str] = set()
        self._ours: set[str] = set()
        """History keys of the datasets of the config's runs (never forgotten while watched)."""
        self._saved_at = time.monotonic()

    # ------------------------------------------------------------------ datasets

    def dataset_tracker(self, trackers: rates.Trackers, host: str, path: str) -> rates.RateTracker:
        """The tracker of a dataset file, seeded from the history on first use."""
        tracker = trackers.get((host, path))
        key = f"ds|{host}|{path}"
        if key not in self._seeded:
            self._seeded.add(key)
            tracker.seed([(p[0], int(p[1]), int(p[2])) for p in self.history.points(key)])
        return tracker

    def record_dataset(
        self, host: str, view: DatasetView, tracker: rates.RateTracker, ours: bool = True
    ) -> None:
        """Record the dataset's latest point in the history; ``ours``: the dataset is a
        configured run's (else a process the config does not know writes it)."""
        latest = tracker.latest()
        key = f"ds|{host}|{view.path}"
        if ours:
            self._ours.add(key)
        if latest is not None and view.state == "ok":
            self.history.add(key, *latest)
        # A missing file has no trend, whatever an earlier file at that path had.
        missing = view.state == "missing"
        view.history = [] if missing else self.history.rates(key, limit=SPARK_POINTS)

    def moved_on(
        self, host: str, run: RunView, trackers: rates.Trackers, alive: bool, now: float
    ) -> None:
        """Mark the datasets a live run has moved on from as done (see the module docstring)."""
        if not alive or len(run.datasets) < 2:
            return
        # Only files seen at least once count: a dataset not started yet has not "grown".
        seen = [(ds, trackers.get((host, ds.path))) for ds in run.datasets]
        ages = {ds.path: t.since_growth(now) for ds, t in seen if t.latest() is not None}
        if len(ages) < 2:
            return
        newest = min(ages.values())
        for ds in run.datasets:
            age = ages.get(ds.path)
            if not ds.done and age is not None and age >= MOVED_ON_S and age > newest:
                ds.done = True
                ds.rates = rates.stopped_rates(ds.rates)

    def prune(self, datasets: rates.Trackers) -> None:
        """Drop the rate trackers of the files (``datasets``, keyed ``(host, path)``) and runs
        no longer watched (:meth:`rates.Trackers.prune`); one that comes back is seeded from the
        history again. The files of processes the config does not know are forgotten sooner
        (:data:`THEIRS_IDLE_S`), their history with them."""

        def theirs(key: object) -> bool:
            return isinstance(key, tuple) and f"ds|{key[0]}|{key[1]}" not in self._ours

        gone = datasets.prune() + datasets.prune(THEIRS_IDLE_S, only=theirs)
        for key in gone:
            if isinstance(key, tuple) and len(key) == 2:
                ds_key = f"ds|{key[0]}|{key[1]}"
                self._seeded.discard(ds_key)
                if ds_key not in self._ours:
                    self.history.drop(ds_key)
        for key in self._runs.prune():
            self._seeded.discard(str(key))

    # ------------------------------------------------------------------ runs

    def run_rates(
        self, host: str, run: RunView, alive: bool, now: float, since: float | None = None
    ) -> None:
        """The run's rate over a window across all its datasets, and its history; ``since``:
        when its live process started (the rate is that process's, ``RateTracker.since``)."""
        key = f"run|{host}|{run.name}"
        tracker = self._runs.get(key)
        if key not in self._seeded:
            self._seeded.add(key)
            tracker.seed([(p[0], int(p[1]), int(p[2])) for p in self.history.points(key)])
        if alive and since is not None:
            tracker.since(since)
        # A dataset not started yet (no file) adds nothing; one that cannot be read makes the
        # sum unknown, and the run is not observed this time.
        readable = [ds for ds in run.datasets if ds.state == "ok"]
        if readable and all(ds.state in ("ok", "missing") for ds in run.datasets):
            done = sum(ds.unique_ids or ds.records for ds in readable)
            tokens = sum(ds.completion_tokens for ds in readable)
            tracker.observe(now, done, tokens, stream="run")
            latest = tracker.latest()
            if latest is not None:
                state = 1.0 if alive else 0.0
                newest = self.history.newest(key)
                changed = newest is not None and len(newest) > 3 and newest[3] != state
                self.history.add(key, *latest, state, keep_newest=changed)
        run.rates = tracker.rates(now)
        if not alive:
            run.rates = rates.stopped_rates(run.rates)
            run.last_rates, run.last_rates_at = last_window(self.history.points(key))
        run.history = self.history.rates(key, limit=SPARK_POINTS)

    # ------------------------------------------------------------------ endpoints

    def endpoints(
        self, host: str, fetched: Mapping[str, Any] | None, now: float, runs: list[RunView]
    ) -> list[EndpointMetrics]:
        """Every endpoint the runs of ``host`` use: their output from the data files, and the
        serving-engine figures of the local ones."""
        specs = {s["name"]: s["url"] for s in metrics_specs(self.config, host)}
        used = {r.endpoint for r in self.config.runs if r.host == host and r.endpoint}
        out = []
        for ep in self.config.endpoints:
            if ep.name not in used:
                continue
            if ep.name in specs:
                view = self._served(host, ep.name, specs[ep.name], fetched, now)
            else:
                view = EndpointMetrics(name=ep.name, url=ep.base_url, kind=ep.kind)
            self._files(host, view, [r for r in runs if r.endpoint == ep.name], now)
            out.append(view)
        return out

    def _files(self, host: str, view: EndpointMetrics, runs: list[RunView], now: float) -> None:
        """The endpoint's output from its runs' files: their windows added up (errors in
        quadrature), and its history from their summed token counts."""
        running = [r.rates for r in runs if r.state == "running"]
        both = rates.combine(running) if running else Rates()
        key = f"epf|{host}|{view.name}"
        counted = [ds for r in runs for ds in r.datasets if ds.state == "ok"]
        if counted:
            self.history.add(
                key,
                now,
                sum(ds.unique_ids or ds.records for ds in counted),
                sum(ds.completion_tokens for ds in counted),
            )
        view.files_tok_per_s = Quantity(
            value=both.tok_per_s, history=self.history.rates(key, limit=SPARK_POINTS)
        )
        view.files_tok_per_s_err = both.tok_per_s_err

    def _served(
        self, host: str, name: str, url: str, fetched: Mapping[str, Any] | None, now: float
    ) -> EndpointMetrics:
        """The figures of a local serving engine from its ``/metrics`` fetch."""
        key = f"ep|{host}|{name}"
        tracker = self._metrics.get((host, name))
        if tracker is None:
            tracker = self._metrics[(host, name)] = servermetrics.MetricsTracker()
            # The counter readings of the last window, so that a one-shot refresh already
            # has a rate (a single earlier reading may be a moment old).
            for p in self.history.points(key, since=now - servermetrics.WINDOW_S):
                if len(p) > 5 and p[4] >= 0:
                    tracker.seed(p[0], p[4], p[5] if p[5] >= 0 else None)
        fetch = None if fetched is None else fetched.get(name)
        view = servermetrics.endpoint_view(name, url, fetch, tracker, now)
        if view.available:
            scrape = tracker.latest()
            assert scrape is not None

            def v(x: float | None) -> float:
                return _MISSING if x is None else x

            self.history.add(
                key,
                scrape.t,
                v(scrape.running),
                v(scrape.queued),
                v(scrape.kv_usage),
                v(scrape.generation_tokens),
                v(scrape.prompt_tokens),
            )
        self._fill_history(view, key)
        return view

    def _fill_history(self, view: EndpointMetrics, key: str) -> None:
        def col(c: int) -> list[float]:
            return [x for x in self.history.values(key, c, SPARK_POINTS) if x >= 0]

        view.running = Quantity(value=view.running.value, history=col(1))
        view.queued = Quantity(value=view.queued.value, history=col(2))
        view.kv_usage = Quantity(value=view.kv_usage.value, history=col(3))
        view.gen_tok_per_s = Quantity(
            value=view.gen_tok_per_s.value,
            history=self.history.rates(key, column=4, limit=SPARK_POINTS),
        )

    # ------------------------------------------------------------------ GPUs

    def gpus(
        self, host: str, summary: Mapping[str, Any] | None, runs: list[RunView], now: float
    ) -> tuple[list[GpuView], str | None]:
        """The host's GPUs, each with the runs whose process trees hold it."""
        if not summary:
            return [], None
        error = str(summary["error"]) if summary.get("error") else None
        if not summary.get("gpus"):
            return [], error
        owners: dict[int, str] = {}
        for run in runs:
            if run.process is not None:
                owners[run.process.identity.pid] = run.name
                for child in run.process.children:
                    owners.setdefault(child, run.name)
        out = []
        for raw in summary.get("gpus") or []:
            if not isinstance(raw, dict):
                continue
            gpu = GpuView(
                index=raw.get("index"),
                uuid=raw.get("uuid"),
                name=raw.get("name"),
                utilization_pct=raw.get("utilization_pct"),
                memory_used_mb=raw.get("memory_used_mb"),
                memory_total_mb=raw.get("memory_total_mb"),
                power_w=raw.get("power_w"),
                temperature_c=raw.get("temperature_c"),
                pids=[int(p) for p in raw.get("pids") or []],
            )
            gpu.runs = sorted({owners[p] for p in gpu.pids if p in owners})
            key = f"gpu|{host}|{gpu.uuid or gpu.index}"
            if gpu.utilization_pct is not None:
                self.history.add(key, now, gpu.utilization_pct)
            gpu.history = self.history.values(key, 1, SPARK_POINTS)
            out.append(gpu)
        return out, error

    # ------------------------------------------------------------------ saving

    def maybe_save(self) -> None:
        if self.history.dirty and time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self.save()

    def save(self) -> None:
        self._saved_at = time.monotonic()
        # History is a convenience: a full disk must not stop the refreshes.
        with contextlib.suppress(OSError):
            self.history.save(time.time())

    def close(self) -> None:
        """Save the history and close its file."""
        self.save()
        self.history.close()
