"""Serving-engine metrics: SGLang's and vLLM's texts read into figures, counters across resets,
TTFT quantiles from bucket deltas, the agent's loopback-only fetch, and the demo mock's /metrics
read through the real engine and agent."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor import servermetrics as sm
from supervisor.agent.metrics import check_url, fetch_one
from supervisor.config import load_config
from supervisor.engine import Engine
from supervisor.model import EndpointMetrics
from tests.fixtures_config import write_local_config
from tests.waiting import SCALE, wait_until

SGLANG_TEXT = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m",dp_rank="0"} 1000.0
sglang:prompt_tokens_total{model_name="m",dp_rank="1"} 500.0
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m",dp_rank="0"} %(gen0)s
sglang:generation_tokens_total{model_name="m",dp_rank="1"} %(gen1)s
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",dp_rank="0"} 12.0
sglang:num_running_reqs{model_name="m",dp_rank="1"} 4.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",dp_rank="0"} 3.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",dp_rank="0"} 0.25
sglang:token_usage{model_name="m",dp_rank="1"} 0.5
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="m",dp_rank="0"} 810.5
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m",dp_rank="0"} 0.125
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} %(b1)s
sglang:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} %(b2)s
sglang:time_to_first_token_seconds_bucket{le="1.0",model_name="m"} %(b3)s
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} %(b3)s
sglang:time_to_first_token_seconds_sum{model_name="m"} 1.0
sglang:time_to_first_token_seconds_count{model_name="m"} %(b3)s
"""

VLLM_TEXT = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.75
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} 4000.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} 900.0
"""


def _sglang(gen0: float, gen1: float, b: tuple[int, int, int] = (0, 0, 0)) -> str:
    return SGLANG_TEXT % {"gen0": gen0, "gen1": gen1, "b1": b[0], "b2": b[1], "b3": b[2]}


def test_sglang_names_are_read_and_label_sets_summed() -> None:
    s = sm.parse(_sglang(3000, 1000), t=10.0)
    assert s.engine == "sglang"
    assert (s.running, s.queued, s.prompt_tokens, s.generation_tokens) == (16, 3, 1500, 4000)
    # KV use is the fullest rank's; the engine's own throughput gauge is kept as reported.
    assert (s.kv_usage, s.gen_throughput, s.cache_hit_rate) == (0.5, 810.5, 0.125)


def test_vllm_names_including_the_older_kv_name() -> None:
    s = sm.parse(VLLM_TEXT, t=1.0)
    assert s.engine == "vllm"
    assert (s.running, s.queued, s.kv_usage, s.generation_tokens) == (7, 2, 0.75, 4000)
    newer = VLLM_TEXT.replace("gpu_cache_usage_perc", "kv_cache_usage_perc")
    assert sm.parse(newer, t=1.0).kv_usage == 0.75


def test_counters_become_rates_across_a_server_restart() -> None:
    t = sm.MetricsTracker()
    view = EndpointMetrics(name="local", url="u")
    for when, gen in ((0.0, 4000), (10.0, 6000), (20.0, 500)):  # restarted: counted from 0
        t.add(sm.parse(_sglang(gen, 0), t=when))
    t.figures(view)
    # 2,000 before the restart, 500 after it, over 20 s.
    assert view.gen_tok_per_s.value == pytest.approx(125.0)
    assert view.window_s == 20.0
    assert sm.counter_delta([10.0, 20.0, 5.0, 8.0]) == 10 + 5 + 3


def test_a_restart_across_a_long_gap_starts_the_window_again() -> None:
    """Readings of an earlier server session (persisted, or before runwatch stopped watching),
    then a restarted server scraped minutes later: the downtime is no part of the rate."""
    t = sm.MetricsTracker()
    for when, gen in ((0.0, 4000), (10.0, 6500)):
        t.seed(when, gen, None)
    for when, gen in ((300.0, 500), (310.0, 3000)):  # restarted during the gap
        t.add(sm.parse(_sglang(gen, 0), t=when))
    view = t.figures(EndpointMetrics(name="local", url="u"))
    assert view.gen_tok_per_s.value == pytest.approx(250.0)
    assert view.window_s == 10.0
    # the same gap without a restart: the counter's delta over the real time is the rate
    t = sm.MetricsTracker()
    for when, gen in ((0.0, 4000), (300.0, 79_000), (310.0, 81_500)):
        t.add(sm.parse(_sglang(gen, 0), t=when))
    view = t.figures(EndpointMetrics(name="local", url="u"))
    assert view.gen_tok_per_s.value == pytest.approx(77_500 / 310)


def test_ttft_quantiles_from_the_buckets_of_the_window() -> None:
    t = sm.MetricsTracker()
    # 100 requests before the window's start, all fast; then 10 more: 2 <= 0.1 s, 8 in (0.1, 0.5].
    t.add(sm.parse(_sglang(0, 0, (100, 100, 100)), t=0.0))
    t.add(sm.parse(_sglang(0, 0, (102, 110, 110)), t=60.0))
    view = t.figures(EndpointMetrics(name="local", url="u"))
    # p50: rank 5 of 10 -> 3 into the 8 of (0.1, 0.5]: 0.1 + 0.4 * 3/8 = 0.25.
    assert view.ttft_p50_s == pytest.approx(0.25)
    # p90: rank 9 -> 7/8 of the way: 0.1 + 0.4 * 7/8 = 0.45.
    assert view.ttft_p90_s == pytest.approx(0.45)
    assert view.ttft_window == "60 s"
    assert sm.quantile(0.5, [(0.1, 0.0), (math_inf(), 4.0)]) == 0.1


def math_inf() -> float:
    return float("inf")


def test_why_there_are_no_figures() -> None:
    t = sm.MetricsTracker()
    refused = sm.endpoint_view("e", "u", {"ok": False, "error": "connection refused"}, t, 0.0)
    assert (refused.available, refused.why) == (False, "connection refused")
    missing = sm.endpoint_view("e", "u", {"ok": False, "error": "HTTP 404", "status": 404}, t, 0)
    assert missing.why is not None and missing.why.startswith(
        "not enabled: SGLang needs --enable-metrics"
    )
    other = sm.endpoint_view("e", "u", {"ok": True, "text": "up 1\n", "time": 1.0}, t, 0.0)
    assert other.why is not None and "no SGLang or vLLM figures" in other.why
    assert sm.default_metrics_url("http://127.0.0.1:30000/v1") == "http://127.0.0.1:30000/metrics"


def test_the_agent_fetches_only_this_hosts_http() -> None:
    assert check_url("http://127.0.0.1:30000/metrics") is None
    assert check_url("http://localhost:30000/metrics") is None
    assert check_url("http://[::1]:30000/metrics") is None
    assert "only http://" in (check_url("https://127.0.0.1/metrics") or "")
    assert "not this host" in (check_url("http://10.255.255.1/metrics") or "")
    assert "not this host" in (check_url("http://169.254.169.254/latest") or "")
    assert fetch_one("http://127.0.0.1:1/metrics") == {
        "ok": False,
        "error": "connection refused",
        "kind": "refused",
    }


def test_a_refresh_with_malformed_metrics_specs_is_refused() -> None:
    from supervisor.agent.protocol import AgentOpError
    from supervisor.agent.server import Agent

    with pytest.raises(AgentOpError) as refused:
        Agent().refresh({"metrics": [{"name": "local", "url": 1}]})
    assert refused.value.kind == "bad-params"
    reply = Agent().refresh({"metrics": [{"name": "local", "url": "http://127.0.0.1:1/m"}]})
    assert reply["metrics"] == {
        "local": {"ok": False, "error": "connection refused", "kind": "refused"}
    }


def test_the_mock_serves_its_real_state(mock_server: Any) -> None:
    h = mock_server(metrics="vllm", mean_tokens=50, length_sigma=0)
    got = fetch_one(h.url[: -len("/v1")] + "/metrics")
    assert got["ok"], got
    s = sm.parse(got["text"], t=1.0)
    assert (s.engine, s.running, s.generation_tokens) == ("vllm", 0, 0)
    off = mock_server(metrics="none")
    assert fetch_one(off.url[: -len("/v1")] + "/metrics")["status"] == 404


async def test_engine_shows_the_local_servers_running_queued_and_tok_s(
    tmp_path: Path, mock_server: Any, demo_prompts: Any, spawn: Any
) -> None:
    """A capacity-limited mock that decodes 4 requests at a time while the reference client
    sends 8: the engine reads 4 running and 4 queued from /metrics through the real agent, and
    a generation rate from the counter that stays within the capacity."""
    from tests.fixtures_demo import reference_client_argv

    h = mock_server(capacity_tps=400, decode_tps=200, mean_tokens=200, max_running=4, tick_s=0.02)
    prompts = demo_prompts(("B1",), count=500)
    work = tmp_path / "work"
    work.mkdir()
    argv = reference_client_argv(h.url, prompts, work / "out", "B1", "--concurrency", "8")
    cfg = write_local_config(
        tmp_path / "c.toml",
        f"""
[[runs]]
name = "gen"
host = "here"
workdir = "{work}"
argv = {json.dumps(argv)}
endpoint = "local"
[[endpoints]]
name = "local"
kind = "local"
base_url = "{h.url}"
""",
        python=True,
    )
    spawn(argv, cwd=work)
    wait_until(lambda: h.stats()["active"] >= 4, 30, what="the mock busy")
    async with Engine(load_config(cfg)) as engine:
        # Refresh back to back until the counter has been read over 2 s or more and a scrape
        # caught the server full (one request between its end and the next one's admission
        # reads 3 running: each scrape is one instant of the server's).
        deadline = time.monotonic() + 30 * SCALE
        seen: list[tuple[float | None, float | None]] = []
        while True:
            snap = await engine.refresh()
            (last,) = snap.hosts[0].endpoints
            seen.append((last.running.value, last.queued.value))
            full = (4, 4) in seen
            if ((last.window_s or 0) >= 2 and full) or time.monotonic() > deadline:
                break
    assert last.available and last.engine == "sglang", last.why
    assert (4, 4) in seen, seen
    assert all((r or 0) <= 4 and (r or 0) + (q or 0) <= 8 for r, q in seen), seen
    assert last.gen_tok_per_s.value is not None
    # Never above the capacity by more than the stated uncertainty.
    assert last.gen_tok_per_s.value <= 400 + (last.gen_tok_per_s_err or 0) + 1
    assert last.gen_tok_per_s.value > 100
    assert last.running.history and max(last.running.history) == 4, last.running.history
    # A one-shot look (a new engine, as `runwatch status` is) has the rate at once: the counter
    # readings kept in the history are its start.
    async with Engine(load_config(cfg)) as engine:
        (once,) = (await engine.refresh()).hosts[0].endpoints
    assert once.gen_tok_per_s.value is not None and once.gen_tok_per_s.value > 100
    assert once.gen_tok_per_s.value <= 400 + (once.gen_tok_per_s_err or 0) + 1
    assert len(once.running.history) >= 2
