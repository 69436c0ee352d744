"""The Prometheus exporter of ``runwatch watch`` (``supervisor.exporter``): a real watcher process
serving ``/metrics``, read by ``promtool`` and by a real Prometheus server, against ``status
--json``; the example rules under ``promtool``; the dashboard's queries against the metric names;
the listen address, TLS and masking."""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.config import load_config
from supervisor.errors import ConfigError
from supervisor.exporter import FleetCollector, exposure_warning, parse_listen, serve
from supervisor.model import (
    CompletenessView,
    DatasetView,
    EndpointMetrics,
    GpuView,
    HostView,
    Projection,
    Quantity,
    Rates,
    RunView,
    Snapshot,
)
from tests.fixtures_actions import API_KEY, DemoRun, raw_record, run_pids, runwatch
from tests.fixtures_prometheus import Prometheus, free_port
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "prometheus" / "runwatch-rules.yml"
RULES_TEST = ROOT / "configs" / "prometheus" / "runwatch-rules.test.yml"
DASHBOARD = ROOT / "configs" / "grafana" / "runwatch-dashboard.json"

CONTRACT = {
    "runwatch_dataset_records",
    "runwatch_dataset_tokens",
    "runwatch_dataset_token_budget",
    "runwatch_dataset_output_tokens_per_second",
    "runwatch_dataset_output_tokens_per_second_stderr",
    "runwatch_dataset_eta_seconds",
    "runwatch_dataset_projected_waste_tokens",
    "runwatch_dataset_duplicates",
    "runwatch_dataset_missing",
    "runwatch_run_up",
    "runwatch_run_state",
    "runwatch_run_restarts_total",
    "runwatch_host_up",
    "runwatch_host_refresh_seconds",
    "runwatch_endpoint_output_tokens_per_second",
    "runwatch_endpoint_running_requests",
    "runwatch_endpoint_queued_requests",
    "runwatch_endpoint_usd_per_million_output_tokens",
    "runwatch_gpu_utilization_ratio",
    "runwatch_gpu_memory_used_bytes",
    "runwatch_events_total",
    "runwatch_alert_deliveries_failed_total",
}
"""The metric names the issue and the README promise (series names, counters with ``_total``)."""


def series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of an exposition."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    for got, v in series(text).get(name, []):
        if all(got.get(k) == want for k, want in labels.items()):
            return v
    return None


def fetch(url: str, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=10, context=context) as r:
        body: bytes = r.read()
    return body.decode()


def scrape_with(url: str, text: str) -> str | None:
    """The body of a scrape of ``url`` once it holds ``text``."""
    body = fetch(url)
    return body if text in body else None


def watcher_url(out: Path) -> str | None:
    m = re.search(r"metrics at (\S+)", out.read_text() if out.exists() else "")
    return m.group(1) if m else None


def start_watcher(
    spawn: Callable[..., Any], config: Path, out: Path, listen: str | None = None
) -> str:
    """``runwatch watch --metrics-listen LISTEN`` on ``config`` (without LISTEN: the config's
    ``[exporter] listen``); the URL it serves on."""
    argv = [sys.executable, "-m", "supervisor.cli", "-c", str(config), "watch", "--interval", "0.3"]
    argv += ["--metrics-listen", listen] if listen else []
    spawn(argv, stdout=out.open("wb"), stderr=subprocess.STDOUT)
    url: str = wait_until(lambda: watcher_url(out), 60, what="the watcher serving metrics")
    return url


def status_datasets(config: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """(run, dataset) -> its view in ``runwatch status --json``, of the configured runs (other
    clients on this machine are listed too, as runs not in the config)."""
    out = runwatch("-c", str(config), "status", "--json")
    assert out.returncode == 0, out.stderr
    snap = json.loads(out.stdout)
    return {
        (r["name"], ds["name"]): ds
        for h in snap["hosts"]
        for r in h["runs"]
        if r["configured"]
        for ds in r["datasets"]
    }


def test_x1_x2_a_scrape_holds_the_figures_of_status_json_masked_and_promtool_accepts_it(
    tmp_path: Path, state_home: Path, spawn: Callable[..., Any], promtool: str
) -> None:
    demo = DemoRun(tmp_path, "http://127.0.0.1:9/v1")  # never launched: files written here
    b1, b2 = demo.data_file("B1"), demo.data_file("B2")
    b1.parent.mkdir(parents=True)
    b2.parent.mkdir(parents=True)
    b1.write_bytes(raw_record("B1-1", 7) + raw_record("B1-2", 11) + raw_record("B1-1", 13))
    b2.write_bytes(raw_record("B2-1", 5))
    text = demo.config_path.read_text().replace(
        'kind = "api"\n', 'kind = "api"\nprice_out_per_m = 2.5\n'
    )
    # A label made from a value holding a key: masked like everything runwatch writes.
    text += '\n[exporter]\nlisten = "127.0.0.1:0"\nconfig_label = "fleet-${RW_DEMO_API_KEY}"\n'
    # Alerts to a port where nothing listens: every delivery fails.
    text += f'\n[alerts]\nurls = ["json://127.0.0.1:{free_port()}/hook"]\n'
    text += "\n[datasets.B1]\ntoken_budget = 20\n"
    demo.config_path.write_text(text)

    url = start_watcher(spawn, demo.config_path, tmp_path / "watch.out")  # [exporter] listen
    assert url.startswith("http://127.0.0.1:")
    body = wait_until(lambda: scrape_with(url, "runwatch_dataset_tokens{"), 60)
    failed = wait_until(
        lambda: value(fetch(url), "runwatch_alert_deliveries_failed_total"), 60, what="a failure"
    )
    assert failed >= 1
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=body, text=True, capture_output=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

    assert API_KEY not in body
    names = set(series(body))
    assert {"runwatch_dataset_records", "runwatch_run_up", "runwatch_host_up"} <= names
    (config_label,) = {labels["config"] for labels, _ in series(body)["runwatch_host_up"]}
    assert config_label == "fleet-***"

    expected = status_datasets(demo.config_path)
    assert set(expected) == {("demo", "B1"), ("demo", "B2")}
    for (run, ds), view in expected.items():
        key = {"run": run, "dataset": ds, "host": "local"}
        assert value(body, "runwatch_dataset_records", **key) == view["records"]
        for kind, field in (("prompt", "prompt_tokens"), ("completion", "completion_tokens")):
            assert value(body, "runwatch_dataset_tokens", kind=kind, **key) == view[field]
        assert value(body, "runwatch_dataset_duplicates", **key) == view["duplicates"]
    b1_key = {"run": "demo", "dataset": "B1"}
    assert value(body, "runwatch_dataset_tokens", kind="completion", **b1_key) == 31
    assert value(body, "runwatch_dataset_token_budget", **b1_key) == 20
    assert value(body, "runwatch_dataset_over_budget", **b1_key) == 1
    assert value(body, "runwatch_dataset_duplicates", **b1_key) == 1
    assert value(body, "runwatch_run_up", run="demo") == 0
    assert value(body, "runwatch_run_state", run="demo", state="stopped") == 1
    assert value(body, "runwatch_run_state", run="demo", state="running") == 0
    assert value(body, "runwatch_host_up", host="local") == 1
    assert value(body, "runwatch_host_refresh_seconds", host="local") is not None
    assert value(body, "runwatch_endpoint_usd_per_million_output_tokens", endpoint="mock") == 2.5
    # The duplicate id and the budget at start are events of the watcher's first tick.
    assert value(body, "runwatch_events_total", kind="duplicates") == 1
    assert value(body, "runwatch_events_total", kind="run-died") == 0


def full_snapshot() -> Snapshot:
    """A snapshot with every figure the exporter turns into a series."""
    ds = DatasetView(
        name="B1",
        path="/data/B1/raw_responses.jsonl",
        records=120,
        unique_ids=118,
        duplicates=2,
        prompt_tokens=900,
        completion_tokens=40_000,
        reasoning_tokens=10_000,
        token_budget=50_000,
        max_samples=400,
        rates=Rates(tok_per_s=120.0, tok_per_s_err=11.0, req_per_s=0.3),
        projection=Projection(eta_s=83.0, waste_tokens=7_000),
        completeness=CompletenessView(input=400, done=118, missing=280),
        stalled=True,
        idle_s=42.0,
    )
    run = RunView(
        name="eagle3", host="gpu-box", state="running", datasets=[ds], rates=Rates(tok_per_s=120.0)
    )
    endpoint = EndpointMetrics(
        name="local-sglang",
        url="http://127.0.0.1:30000/v1",
        kind="local",
        available=True,
        engine="sglang",
        files_tok_per_s=Quantity(value=118.0),
        running=Quantity(value=12.0),
        queued=Quantity(value=3.0),
        kv_usage=Quantity(value=0.4),
        gen_tok_per_s=Quantity(value=130.0),
    )
    gpu = GpuView(
        index=0,
        uuid="GPU-1",
        name="H100",
        utilization_pct=87.0,
        memory_used_mb=1024.0,
        memory_total_mb=81559.0,
        runs=["eagle3", "another"],
    )
    host = HostView(
        name="gpu-box",
        connected=True,
        rtt_ms=35.0,
        last_ok=1000.0,
        runs=[run],
        endpoints=[endpoint],
        gpus=[gpu],
    )
    return Snapshot(time=1000.0, hosts=[host])


def full_config(tmp_path: Path) -> Any:
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[[hosts]]\nname = "gpu-box"\nlocal = true\n\n[[runs]]\nname = "eagle3"\nhost = "gpu-box"\n'
        'workdir = "/data"\nargv = ["python", "run_inference.py", "--datasets", "B1"]\n'
        'endpoint = "local-sglang"\n\n[[endpoints]]\nname = "local-sglang"\nkind = "local"\n'
        'base_url = "http://127.0.0.1:30000/v1"\ngpu_cost_per_hour = 3.6\n'
    )
    return load_config(path)


def collected(collector: FleetCollector) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def test_x4_every_contract_name_is_served_and_the_rules_and_dashboard_use_only_served_names(
    tmp_path: Path,
) -> None:
    collector = FleetCollector(full_config(tmp_path))
    assert "runwatch_dataset_tokens" not in collected(collector)  # nothing published yet
    collector.publish(full_snapshot(), [], 0)
    body = collected(collector)
    served = set(series(body))
    assert served >= CONTRACT, sorted(CONTRACT - served)

    gpu = {"host": "gpu-box", "gpu": "0", "runs": "eagle3"}  # "another" is not in the config
    assert value(body, "runwatch_gpu_utilization_ratio", **gpu) == pytest.approx(0.87)
    assert value(body, "runwatch_gpu_memory_used_bytes", **gpu) == 1024 * 1024 * 1024
    assert value(body, "runwatch_dataset_tokens", kind="reasoning") == 10_000
    assert value(body, "runwatch_dataset_missing", dataset="B1") == 280
    assert value(body, "runwatch_dataset_eta_seconds", dataset="B1") == 83.0
    assert value(body, "runwatch_endpoint_queued_requests", endpoint="local-sglang") == 3.0
    # GPU cost per hour over the live rate of the run on it: 3.6 $/h at 120 tok/s.
    usd = value(body, "runwatch_endpoint_usd_per_million_output_tokens", endpoint="local-sglang")
    assert usd == pytest.approx(3.6 / 3600 / 120 * 1e6)

    used: set[str] = set()
    for path in (RULES, DASHBOARD):
        used |= set(re.findall(r"\brunwatch_[a-z_]+", path.read_text()))
    assert used, "the rules and the dashboard query runwatch metrics"
    assert used <= served, sorted(used - served)
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert {p["title"] for p in panels} >= {"Tokens against budget", "ETA", "GPU utilisation"}


def test_x1_the_watchers_counters_add_up_over_ticks(tmp_path: Path) -> None:
    from supervisor.events import Event

    def event(kind: Any, run: str | None = "eagle3") -> Event:
        return Event(
            kind=kind,
            severity="info",
            host="gpu-box",
            run=run,
            title="t",
            message="m",
            key=kind,
            time=0.0,
        )

    collector = FleetCollector(full_config(tmp_path))
    snap = full_snapshot()
    collector.publish(snap, [event("restart-done"), event("run-died")], 1)
    collector.publish(snap, [event("restart-done"), event("host-lost", None)], 1)
    collector.publish(snap, [], 2)
    body = collected(collector)
    assert value(body, "runwatch_run_restarts_total", run="eagle3") == 2
    assert value(body, "runwatch_events_total", kind="restart-done") == 2
    assert value(body, "runwatch_events_total", kind="run-died") == 1
    assert value(body, "runwatch_events_total", kind="host-lost") == 1
    assert value(body, "runwatch_events_total", kind="stalled") == 0
    assert value(body, "runwatch_alert_deliveries_failed_total") == 2


def test_x4_the_example_rules_pass_promtool_and_fire_on_their_series(promtool: str) -> None:
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "7 rules found" in checked.stdout
    tested = subprocess.run(
        [promtool, "test", "rules", str(RULES_TEST)], capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("9464", "127.0.0.1", 9464),
        (":9464", "127.0.0.1", 9464),
        ("127.0.0.1:0", "127.0.0.1", 0),
        ("[::1]:9464", "::1", 9464),
        ("0.0.0.0:9100", "0.0.0.0", 9100),
        ("localhost:9464", "localhost", 9464),
    ],
)
def test_x3_listen_addresses_default_to_loopback(text: str, host: str, port: int) -> None:
    addr = parse_listen(text)
    assert (addr.host, addr.port) == (host, port)
    assert addr.loopback == (host != "0.0.0.0")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("127.0.0.1:http", "is not HOST:PORT"),
        ("127.0.0.1:70000", "out of range"),
        ("::1:9464", "in brackets"),
        ("metrics.example:9464", "is not an IP address"),
    ],
)
def test_x3_a_bad_listen_address_is_refused_saying_what_to_write(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_listen(text)
    assert says in e.value.message and e.value.hint


def test_x3_the_cli_refuses_a_bad_address_and_a_port_in_use(
    tmp_path: Path, state_home: Path
) -> None:
    demo = DemoRun(tmp_path, "http://127.0.0.1:9/v1")
    bad = runwatch("-c", str(demo.config_path), "watch", "--metrics-listen", "localhost:x")
    assert bad.returncode == 2 and "is not HOST:PORT" in bad.stderr, bad.stderr
    config = demo.config
    held = serve(config, "127.0.0.1:0")
    try:
        port = held.url.rsplit(":", 1)[1].split("/")[0]
        busy = runwatch("-c", str(demo.config_path), "watch", "--metrics-listen", f":{port}")
        assert busy.returncode == 1, busy.stderr
        assert f"cannot serve metrics on 127.0.0.1:{port}" in busy.stderr
        assert "--metrics-listen" in busy.stderr and "Traceback" not in busy.stderr
    finally:
        held.close()


def test_x3_beyond_loopback_without_tls_is_said(tmp_path: Path) -> None:
    config = full_config(tmp_path)
    assert exposure_warning("http://127.0.0.1:9464/metrics", config) is None
    warning = exposure_warning("http://0.0.0.0:9464/metrics", config)
    assert warning is not None and "without TLS" in warning and "cert_file" in warning


def test_x3_tls_through_prometheus_client(tmp_path: Path, state_home: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    files = ["-keyout", str(key), "-out", str(cert)]
    made = subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            *subject,
            *files,
        ],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.fail(f"openssl could not make a certificate: {made.stderr}")
    demo = DemoRun(tmp_path, "http://127.0.0.1:9/v1")
    text = demo.config_path.read_text()
    text += f'\n[exporter]\ncert_file = "{cert}"\nkey_file = "{key}"\n'
    demo.config_path.write_text(text)
    config = demo.config
    exporter = serve(config, f"127.0.0.1:{free_port()}")
    try:
        assert exporter.url.startswith("https://127.0.0.1:")
        body = fetch(exporter.url, ssl.create_default_context(cafile=str(cert)))
        assert "runwatch_events_total" in body
        with pytest.raises(OSError):  # plain HTTP gets no answer
            fetch(exporter.url.replace("https://", "http://"))
        with pytest.raises(urllib.error.URLError):
            fetch(exporter.url)  # a certificate no CA of the system signed
    finally:
        exporter.close()
    demo.config_path.write_text(demo.config_path.read_text().replace(f'key_file = "{key}"\n', ""))
    with pytest.raises(ConfigError, match="cert_file and key_file go together"):
        serve(demo.config, "127.0.0.1:0")


def test_x1_prometheus_scrapes_the_watcher_and_finds_the_tokens_of_status_json(
    tmp_path: Path,
    state_home: Path,
    spawn: Callable[..., Any],
    mock_endpoint: Any,
    kill_runs_in: list[Path],
    prometheus_server: Callable[[list[str]], Prometheus],
) -> None:
    demo = DemoRun(tmp_path, mock_endpoint.url, max_samples=12)
    kill_runs_in.append(demo.workdir)
    port = free_port()
    start_watcher(spawn, demo.config_path, tmp_path / "watch.out", f"127.0.0.1:{port}")
    prom = prometheus_server([f"127.0.0.1:{port}"])
    wait_until(prom.targets_up, 60, what="Prometheus scraping the watcher", interval=0.2)

    launched = runwatch("-c", str(demo.config_path), "launch", "demo", "--yes")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    wait_until(
        lambda: prom.query('runwatch_run_up{run="demo"} == 1'), 60, what="the run up in Prometheus"
    )
    wait_until(lambda: not run_pids(demo.workdir), 120, what="the run finishing")

    expected = status_datasets(demo.config_path)
    assert {ds: v["records"] for (_, ds), v in expected.items()} == {"B1": 12, "B2": 12}

    def scraped() -> dict[tuple[str, str], float]:
        result = prom.query('runwatch_dataset_tokens{kind="completion",run="demo"}')
        return {(r["metric"]["run"], r["metric"]["dataset"]): float(r["value"][1]) for r in result}

    want = {key: float(v["completion_tokens"]) for key, v in expected.items()}
    assert all(want.values())
    wait_until(lambda: scraped() == want, 60, what=f"Prometheus holding {want}")
    prompt = prom.query('sum(runwatch_dataset_tokens{kind="prompt",run="demo"})')
    assert float(prompt[0]["value"][1]) == sum(v["prompt_tokens"] for v in expected.values())
    wait_until(lambda: prom.query('runwatch_run_up{run="demo"} == 0'), 60, what="the run down")
    done = prom.query('runwatch_events_total{kind="dataset-done"}')
    assert float(done[0]["value"][1]) == 2
    died = prom.query('runwatch_events_total{kind="run-died"}')
    assert float(died[0]["value"][1]) == 0  # a finished run did not die
