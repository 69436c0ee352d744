"""The Prometheus exporter of ``runwatch watch``: ``/metrics`` from the watcher's latest snapshot.

:class:`FleetCollector` is a custom ``prometheus_client`` collector. The watcher hands it each
tick's snapshot, events and failed alert delivery attempts (:meth:`FleetCollector.publish`, one of
``Watcher.observers``); a scrape turns the latest snapshot into metric families and does nothing
else: no refresh of its own, no host asked, no file read. The metric names and labels are a
contract (the README's table lists them with their units): per dataset (``config``, ``host``,
``run``, ``dataset``), per run (the config's runs only: a process outside the config is counted
per host, ``runwatch_strangers``), per host, per endpoint, per GPU (labelled with the runs that hold
it), and the watcher's counters (events by kind, failed alert delivery attempts with every retry
counted, restarts per run).

Every label value passes through the same masking as everything else runwatch writes
(``secrets.mask_known``); values are numbers only. :func:`serve` starts a
``supervisor.metricsserver`` server on a thread (a bounded pool; an idle connection holds no
thread): loopback unless another address is written out (``parse_listen``), TLS and client
certificates through ``ssl``.
"""

from __future__ import annotations

import ipaddress
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from supervisor.compare import Work, endpoint_rates, estimate, live_rates, server_rates
from supervisor.config import Config
from supervisor.display import escape_control
from supervisor.errors import ConfigError, RunwatchError
from supervisor.events import EVENT_KINDS, Event
from supervisor.metricsserver import MetricsServer
from supervisor.model import HostView, RunState, RunView, Snapshot
from supervisor.secrets import known_secrets, mask_known

_Labels = Callable[..., list[str]]
"""Label values, masked (``labels`` in :meth:`FleetCollector.collect`)."""
RUN_STATES: tuple[str, ...] = get_args(RunState)
MIB = 1024 * 1024
DEFAULT_PORT = 9464
"""The port a listen address without one gets (the exporter's usual port)."""
DS = ("config", "host", "run", "dataset")
RUN = ("config", "host", "run")
HOST = ("config", "host")
ENDPOINT = ("config", "host", "endpoint", "kind")
GPU = ("config", "host", "gpu", "uuid", "name", "runs")


@dataclass(frozen=True)
class Listen:
    """Where ``/metrics`` is served."""

    host: str
    port: int

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def url(self, port: int | None = None, tls: bool = False) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (
            f"{'https' if tls else 'http'}://{host}:{self.port if port is None else port}/metrics"
        )


def parse_listen(text: str, where: str = "--metrics-listen") -> Listen:
    """``HOST:PORT``, ``[IPV6]:PORT``, ``:PORT`` or ``PORT`` (the last two on 127.0.0.1)."""
    value = text.strip()
    host, sep, port_text = value.rpartition(":")
    if not sep:
        host, port_text = "", value
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(
            f"{where}: {text!r}: an IPv6 address goes in brackets", "for example [::1]:9464"
        )
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(
            f"{where}: {text!r} is not HOST:PORT", "for example 127.0.0.1:9464"
        ) from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{where}: port {port} is out of range", "use a port from 1 to 65535")
    if host and host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(
                f"{where}: {host!r} is not an IP address",
                "listen on an address of this machine (127.0.0.1 by default)",
            ) from None
    return Listen(host=host or "127.0.0.1", port=port)


def config_label(config: Config) -> str:
    """The ``config`` label: ``[exporter] config_label``, else the config file's stem."""
    return config.exporter.config_label or (Path(config.path).stem if config.path else "runwatch")


class FleetCollector(Collector):
    """The fleet as metric families, from the latest published snapshot (module docstring)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.label = config_label(config)
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._events: dict[str, int] = dict.fromkeys(EVENT_KINDS, 0)
        self._failed_deliveries = 0
        self._restarts: dict[tuple[str, str], int] = {}

    def publish(self, snapshot: Snapshot, events: Sequence[Event], failed_deliveries: int) -> None:
        """The watcher's hook: one tick's snapshot, its events and the failed alert delivery
        attempts so far (``Alerter.failed_attempts``: a counter counts every failed attempt,
        not the messages that failed)."""
        with self._lock:
            self._snapshot = snapshot
            for ev in events:
                self._events[ev.kind] = self._events.get(ev.kind, 0) + 1
                if ev.kind == "restart-done" and ev.run is not None:
                    key = (ev.host, ev.run)
                    self._restarts[key] = self._restarts.get(key, 0) + 1
            self._failed_deliveries = failed_deliveries

    def describe(self) -> Iterable[Metric]:
        return []  # the families depend on the fleet: registering must not collect

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snap = self._snapshot
            events = dict(self._events)
            failed = self._failed_deliveries
            restarts = dict(self._restarts)
        secrets = known_secrets(self.config)

        def labels(*values: object) -> list[str]:
            # Masked, and a host's control characters written as escapes (``\x1b``): a label
            # value is shown by Grafana and terminals as it is.
            return [
                escape_control(mask_known(str(v), secrets) if secrets else str(v)) for v in values
            ]

        c = self.label
        ev = CounterMetricFamily(
            "runwatch_events", "Events the watcher reported, by kind.", labels=["config", "kind"]
        )
        for kind, n in sorted(events.items()):
            ev.add_metric(labels(c, kind), n)
        yield ev
        fails = CounterMetricFamily(
            "runwatch_alert_deliveries_failed",
            "Alert delivery attempts that failed (every retry counted).",
            labels=["config"],
        )
        fails.add_metric(labels(c), failed)
        yield fails
        if snap is None:
            return
        stamp = GaugeMetricFamily(
            "runwatch_snapshot_timestamp_seconds",
            "Unix time of the snapshot the figures are from.",
            labels=["config"],
        )
        stamp.add_metric(labels(c), snap.time)
        yield stamp
        yield from self._hosts(snap, labels)
        yield from self._runs(snap, labels, restarts)
        yield from self._datasets(snap, labels)
        yield from self._endpoints(snap, labels)
        yield from self._gpus(snap, labels)

    # ------------------------------------------------------------------ families

    def _hosts(self, snap: Snapshot, labels: _Labels) -> Iterator[Metric]:
        up = _gauge("runwatch_host_up", "1 when the host answered the last refresh in time.", HOST)
        rtt = _gauge(
            "runwatch_host_refresh_seconds",
            "Round trip of the host's last refresh request (seconds).",
            HOST,
        )
        last = _gauge(
            "runwatch_host_last_ok_timestamp_seconds",
            "Unix time of the host's last successful refresh.",
            HOST,
        )
        age = _gauge(
            "runwatch_host_staleness_seconds",
            "Seconds between the host's last successful refresh and the snapshot (0: fresh).",
            HOST,
        )
        for h in snap.hosts:
            key = labels(self.label, h.name)
            up.add_metric(key, 1.0 if answered(h) else 0.0)
            if h.rtt_ms is not None:
                rtt.add_metric(key, h.rtt_ms / 1000.0)
            if h.last_ok is not None:
                last.add_metric(key, h.last_ok)
                age.add_metric(key, 0.0 if answered(h) else max(0.0, snap.time - h.last_ok))
        yield from (up, rtt, last, age)

    def _runs(
        self, snap: Snapshot, labels: _Labels, restarts: dict[tuple[str, str], int]
    ) -> Iterator[Metric]:
        up = _gauge(
            "runwatch_run_up",
            "1 while the run's process (or job) is running; absent while its host does not "
            "answer (unknown, not down: runwatch_host_up says so).",
            RUN,
        )
        state = _gauge(
            "runwatch_run_state", "1 for the run's state, 0 for the others.", (*RUN, "state")
        )
        rate = _gauge(
            "runwatch_run_output_tokens_per_second",
            "The run's output tokens/s over its window, across its datasets.",
            RUN,
        )
        count = CounterMetricFamily(
            "runwatch_run_restarts",
            "Restarts of the run (automatic, or through runwatch) this watcher saw.",
            labels=list(RUN),
        )
        strangers = _gauge(
            "runwatch_strangers",
            "Runs on the host that are not in the config (counted, never exported one by one).",
            HOST,
        )
        for h in snap.hosts:
            known = answered(h)
            strangers.add_metric(
                labels(self.label, h.name), sum(1 for r in h.runs if not r.configured)
            )
            for r in configured(h):
                key = labels(self.label, h.name, r.name)
                # A host that does not answer says nothing of its runs: their state is unknown
                # (never "down"), and a last value would be a guess.
                shown = r.state if known else "unknown"
                if known:
                    up.add_metric(key, 1.0 if r.state == "running" else 0.0)
                for s in RUN_STATES:
                    state.add_metric([*key, s], 1.0 if shown == s else 0.0)
                if known and r.rates.tok_per_s is not None:
                    rate.add_metric(key, r.rates.tok_per_s)
                count.add_metric(key, restarts.get((h.name, r.name), 0))
        yield from (up, state, rate, count, strangers)

    def _datasets(self, snap: Snapshot, labels: _Labels) -> Iterator[Metric]:
        records = _gauge("runwatch_dataset_records", "Records (responses) in the data file.", DS)
        tokens = _gauge(
            "runwatch_dataset_tokens",
            "Tokens of the dataset's records; reasoning tokens are part of completion tokens.",
            (*DS, "kind"),
        )
        budget = _gauge(
            "runwatch_dataset_token_budget", "The dataset's completion-token budget.", DS
        )
        samples = _gauge("runwatch_dataset_max_samples", "The samples the dataset wants.", DS)
        rate = _gauge(
            "runwatch_dataset_output_tokens_per_second",
            "Output tokens/s over the rate window (absent while too few responses).",
            DS,
        )
        err = _gauge(
            "runwatch_dataset_output_tokens_per_second_stderr",
            "One standard error of runwatch_dataset_output_tokens_per_second.",
            DS,
        )
        eta = _gauge(
            "runwatch_dataset_eta_seconds", "Seconds until the first stop condition (0: done).", DS
        )
        waste = _gauge(
            "runwatch_dataset_projected_waste_tokens",
            "Tokens past the budget, so far plus projected, of a run without --token-budget.",
            DS,
        )
        over = _gauge("runwatch_dataset_over_budget", "1 when the dataset is past its budget.", DS)
        stalled = _gauge("runwatch_dataset_stalled", "1 when the dataset's writer stalled.", DS)
        idle = _gauge("runwatch_dataset_idle_seconds", "Seconds since the file last grew.", DS)
        done = _gauge("runwatch_dataset_done", "1 when nothing more will be written.", DS)
        dups = _gauge("runwatch_dataset_duplicates", "Records whose id was already seen.", DS)
        missing = _gauge(
            "runwatch_dataset_missing",
            "Input ids with neither a record nor an error (when the input is known).",
            DS,
        )
        bad = _gauge("runwatch_dataset_bad_lines", "Lines that are not records.", DS)
        for h in snap.hosts:
            for r in configured(h):
                for ds in r.datasets:
                    if ds.provisional:
                        continue  # line counts of a first scan, not records yet
                    key = labels(self.label, h.name, r.name, ds.name)
                    records.add_metric(key, ds.records)
                    tokens.add_metric([*key, "prompt"], ds.prompt_tokens)
                    tokens.add_metric([*key, "completion"], ds.completion_tokens)
                    tokens.add_metric([*key, "reasoning"], ds.reasoning_tokens)
                    if ds.token_budget is not None:
                        budget.add_metric(key, ds.token_budget)
                    if ds.max_samples is not None:
                        samples.add_metric(key, ds.max_samples)
                    if ds.rates.tok_per_s is not None:
                        rate.add_metric(key, ds.rates.tok_per_s)
                    if ds.rates.tok_per_s_err is not None:
                        err.add_metric(key, ds.rates.tok_per_s_err)
                    if ds.projection.eta_s is not None:
                        eta.add_metric(key, ds.projection.eta_s)
                    waste.add_metric(key, ds.projection.waste_tokens)
                    over.add_metric(key, 1.0 if ds.over_budget else 0.0)
                    stalled.add_metric(key, 1.0 if ds.stalled else 0.0)
                    idle.add_metric(key, ds.idle_s)
                    done.add_metric(key, 1.0 if ds.done else 0.0)
                    dups.add_metric(key, ds.duplicates)
                    if ds.completeness is not None and ds.completeness.error is None:
                        missing.add_metric(key, ds.completeness.missing)
                    bad.add_metric(key, ds.bad_lines)
        yield from (records, tokens, budget, samples, rate, err, eta, waste)
        yield from (over, stalled, idle, done, dups, missing, bad)

    def _endpoints(self, snap: Snapshot, labels: _Labels) -> Iterator[Metric]:
        rate = _gauge(
            "runwatch_endpoint_output_tokens_per_second",
            "Output tokens/s of the host's running runs on the endpoint, from their data files.",
            ENDPOINT,
        )
        server = _gauge(
            "runwatch_endpoint_server_output_tokens_per_second",
            "Generated tokens/s from the serving engine's own counter (local endpoints).",
            ENDPOINT,
        )
        running = _gauge(
            "runwatch_endpoint_running_requests", "Requests being decoded (local).", ENDPOINT
        )
        queued = _gauge(
            "runwatch_endpoint_queued_requests", "Requests waiting for a slot (local).", ENDPOINT
        )
        kv = _gauge(
            "runwatch_endpoint_kv_cache_usage_ratio", "KV cache in use, 0..1 (local).", ENDPOINT
        )
        for h in snap.hosts:
            for em in h.endpoints:
                key = labels(self.label, h.name, em.name, em.kind)
                if em.files_tok_per_s.value is not None:
                    rate.add_metric(key, em.files_tok_per_s.value)
                if not em.available:
                    continue
                for family, q in ((server, em.gen_tok_per_s), (running, em.running)):
                    if q.value is not None:
                        family.add_metric(key, q.value)
                for family, q in ((queued, em.queued), (kv, em.kv_usage)):
                    if q.value is not None:
                        family.add_metric(key, q.value)
        price = _gauge(
            "runwatch_endpoint_usd_per_million_output_tokens",
            "USD per million output tokens: the price table of an API, GPU cost / live rate of "
            "a local server.",
            ("config", "endpoint", "kind"),
        )
        per_million = Work(
            dataset="",
            remaining_tokens=1e6,
            remaining_samples=0.0,
            avg_prompt_tokens=0.0,
            avg_completion_tokens=0.0,
            bound="token_budget",
        )
        rates = endpoint_rates(self.config, live_rates(self.config, snap), [], server_rates(snap))
        for ep in rates:
            usd = estimate(per_million, ep).cost_usd
            if usd is not None:
                price.add_metric(labels(self.label, ep.endpoint, ep.kind), usd)
        yield from (rate, server, running, queued, kv, price)

    def _gpus(self, snap: Snapshot, labels: _Labels) -> Iterator[Metric]:
        util = _gauge("runwatch_gpu_utilization_ratio", "GPU utilisation, 0..1.", GPU)
        used = _gauge("runwatch_gpu_memory_used_bytes", "GPU memory in use.", GPU)
        total = _gauge("runwatch_gpu_memory_total_bytes", "GPU memory in all.", GPU)
        for h in snap.hosts:
            ours = {r.name for r in configured(h)}
            for i, g in enumerate(h.gpus):
                index = g.index if g.index is not None else i
                # The configured runs only: another process's name carries its pid.
                held = ",".join(sorted(set(g.runs) & ours))
                key = labels(self.label, h.name, index, g.uuid or "", g.name or "", held)
                if g.utilization_pct is not None:
                    util.add_metric(key, g.utilization_pct / 100.0)
                if g.memory_used_mb is not None:
                    used.add_metric(key, g.memory_used_mb * MIB)
                if g.memory_total_mb is not None:
                    total.add_metric(key, g.memory_total_mb * MIB)
        yield from (util, used, total)


def answered(host: HostView) -> bool:
    """The host answered the snapshot's refresh: its figures are of now, not its last ones."""
    return host.connected and not host.stale


def configured(host: HostView) -> list[RunView]:
    """The host's runs of the config: a process outside it is only counted
    (``runwatch_strangers``), so that another user's thousand datasets make no series and no pid
    becomes a label."""
    return [r for r in host.runs if r.configured]


def _gauge(name: str, documentation: str, label_names: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=list(label_names))


@dataclass
class Exporter:
    """A serving exporter: its collector, its HTTP server and the URL it answers on."""

    collector: FleetCollector
    server: MetricsServer
    thread: threading.Thread
    url: str

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5.0)


def serve(config: Config, listen: str | None = None) -> Exporter:
    """Serve ``/metrics`` of a new :class:`FleetCollector` on ``listen`` (default: ``[exporter]
    listen``) with a :class:`~supervisor.metricsserver.MetricsServer` on a thread (a bounded
    pool, idle connections holding no thread; TLS when the config gives a certificate)."""
    from prometheus_client.exposition import make_wsgi_app

    ex = config.exporter
    where = "--metrics-listen" if listen else f"{config.path}: [exporter].listen"
    text = listen or ex.listen
    if not text:
        raise ConfigError(f"{where}: no address", "for example --metrics-listen 127.0.0.1:9464")
    addr = parse_listen(text, where)
    if (ex.cert_file is None) != (ex.key_file is None):
        raise ConfigError(
            f"{config.path}: [exporter]: cert_file and key_file go together",
            "give both (HTTPS) or neither (plain HTTP)",
        )
    if ex.client_ca_file is not None and ex.cert_file is None:
        raise ConfigError(
            f"{config.path}: [exporter].client_ca_file needs cert_file and key_file",
            "client certificates are checked over HTTPS only",
        )
    collector = FleetCollector(config)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    context = None
    if ex.cert_file is not None and ex.key_file is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(ex.cert_file, ex.key_file)
        if ex.client_ca_file is not None:
            context.load_verify_locations(cafile=ex.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
    try:
        server = MetricsServer(addr.host, addr.port, make_wsgi_app(registry), context)
    except OSError as e:
        raise RunwatchError(
            f"cannot serve metrics on {addr.host}:{addr.port}: {e.strerror or e}",
            "choose another port with --metrics-listen HOST:PORT",
        ) from None
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    url = addr.url(port=server.server_port, tls=ex.cert_file is not None)
    return Exporter(collector=collector, server=server, thread=thread, url=url)


def exposure_warning(url: str, config: Config) -> str | None:
    """What to say when the metrics at ``url`` are served beyond this machine without TLS."""
    host = url.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if Listen(host=host, port=0).loopback or config.exporter.cert_file is not None:
        return None
    return (
        f"metrics served beyond this machine without TLS at {url}: set [exporter] cert_file "
        "and key_file, or put it behind a proxy with basic auth (README)"
    )
