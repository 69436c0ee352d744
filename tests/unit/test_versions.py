"""The version matrix: what real versions of the systems runwatch reads write, read through
runwatch's own parsers with exact values. One fixture per version under ``tests/fixtures/versions``,
each headed by the project, version and source file it follows (README "Tested against").

- SGLang and vLLM ``/metrics``: label shapes of every version (no ranks; ``tp_rank``/``pp_rank``
  with ``--enable-metrics-for-all-schedulers``; ``dp_rank``, ``moe_ep_rank`` and ``priority``;
  vLLM's ``engine`` and multiprocess ``pid``), deprecated names, served over loopback HTTP and
  fetched by the agent (V1, V2);
- ``squeue --json`` of data_parser v0.0.38 .. v0.0.43 (V4);
- nvidia-smi CSV with ``[N/A]``, ``[Not Supported]`` and MIG, from a stand-in ``nvidia-smi``
  run by the agent's own query (V5);
- OpenAI, OpenRouter (BYOK and credits), vLLM and SGLang responses: cost and reasoning, through
  the bench against a loopback server that answers with them (V6, V7).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest

from supervisor import servermetrics as sm
from supervisor.agent import gpu
from supervisor.agent import slurm as slurmops
from supervisor.agent.metrics import fetch_one
from supervisor.bench import wire
from supervisor.bench.prompts import load_prompts
from supervisor.bench.runner import Bench, Options
from supervisor.bench.target import Target
from supervisor.demo.prompts import write_prompts
from supervisor.model import EndpointMetrics

VERSIONS = Path(__file__).parents[1] / "fixtures" / "versions"
HEADER_KEYS = ("project", "version", "source", "facts")


def load(name: str) -> tuple[dict[str, str], str]:
    """A fixture's header (``# key: value`` lines, continued by ``#   ...``) and its body."""
    header: dict[str, str] = {}
    body: list[str] = []
    key = None
    for line in (VERSIONS / name).read_text().splitlines(keepends=True):
        if not body and line.startswith("# ") and not line.startswith(("# HELP", "# TYPE")):
            text = line[2:].rstrip("\n")
            if text.startswith("  ") and key is not None:
                header[key] += " " + text.strip()
            else:
                key, _, value = text.partition(":")
                header[key] = value.strip()
            continue
        body.append(line)
    return header, "".join(body)


@pytest.mark.parametrize("name", sorted(p.name for p in VERSIONS.iterdir()))
def test_every_fixture_names_its_project_version_and_source(name: str) -> None:
    header, body = load(name)
    assert tuple(header) == HEADER_KEYS, name
    assert all(header[k] for k in HEADER_KEYS) and body.strip()


# --------------------------------------------------------------------------- loopback server


class Served:
    """A real HTTP server on 127.0.0.1 answering GET with ``text`` and POST with ``body``."""

    def __init__(self) -> None:
        self.text = ""
        self.body = b""
        self.content_type = "application/json"
        served = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, data: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer(served.text.encode(), "text/plain; version=0.0.4")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer(served.body, served.content_type)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.stop()


# --------------------------------------------------------------------------- /metrics

# fixture -> (running, queued, KV use, reported tok/s, prompt tokens, generation tokens, TTFT p50)
METRICS = {
    "sglang-0.4.6.post5.prom": (64, 12, 0.62, 2210.4, 182_340, 901_277, 0.1 * 100 / 120),
    # every TP rank reports the batch: 40 running, not 8 x 40; 1,500 tok/s, not 12,000
    "sglang-0.5.2-tp8-all-schedulers.prom": (40, 5, 0.48, 1500.0, 52_000, 240_000, 0.1 + 1 / 30),
    # two data-parallel ranks of 4 TP ranks each, priority totals beside their breakdown
    "sglang-0.5.23-dp2-tp8-priority.prom": (56, 6, 0.71, 1750.0, 75_000, 320_000, 0.1),
    "vllm-v0-engine.prom": (48, 7, 0.93, None, 610_000, 1_400_000, 0.25),
    # two engines (data-parallel ranks) summed; KV use per API-server pid read once
    "vllm-v1-dp2-api-servers2.prom": (60, 3, 0.41, None, 80_000, 240_000, 0.08 + 0.02 * 40 / 50),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(METRICS))
def test_v1_metrics_of_every_version_read_exactly(name: str, served: Served) -> None:
    _, text = load(name)
    served.text = text
    fetched = fetch_one(served.url + "/metrics")  # the agent's own fetch, over loopback
    assert fetched["ok"], fetched
    tracker = sm.MetricsTracker()
    view = sm.endpoint_view("e", served.url, fetched, tracker, now=100.0)
    running, queued, kv, reported, prompt, gen, p50 = METRICS[name]
    assert view.available and view.engine == name.split("-")[0]
    assert (view.running.value, view.queued.value) == (running, queued)
    assert view.kv_usage.value == pytest.approx(kv)
    assert view.reported_gen_throughput == (pytest.approx(reported) if reported else None)
    scrape = tracker.latest()
    assert scrape is not None
    assert (scrape.prompt_tokens, scrape.generation_tokens) == (prompt, gen)
    assert view.ttft_window == "since start"
    assert view.ttft_p50_s == pytest.approx(p50)


def test_v1_tensor_parallel_copies_count_once_in_rates_too() -> None:
    """The issue's example: SGLang ``--tp 8`` with metrics for all schedulers shows 40 running, 5
    queued and 1,500 tok/s, and a counter written per rank moves at one rank's pace."""
    _, text = load("sglang-0.5.2-tp8-all-schedulers.prom")
    per_rank = text.replace(
        'sglang:generation_tokens_total{model_name="qwen3-8b"} 240000.0',
        "\n".join(
            f'sglang:generation_tokens_total{{model_name="qwen3-8b",tp_rank="{r}",pp_rank="0"}} %s'
            for r in range(8)
        ),
    )
    assert per_rank != text
    tracker = sm.MetricsTracker()
    tracker.add(sm.parse(per_rank.replace("%s", "240000.0"), t=0.0))
    tracker.add(sm.parse(per_rank.replace("%s", "255000.0"), t=10.0))
    view = tracker.figures(EndpointMetrics(name="e", url="u"))
    assert (view.running.value, view.queued.value, view.reported_gen_throughput) == (40, 5, 1500)
    assert view.gen_tok_per_s.value == pytest.approx(1500.0)


def test_v2_every_label_shape_sums_data_parallel_ranks_and_reads_one_copy_of_each() -> None:
    """Label shapes beyond the fixtures: pipeline ranks, a rank written as a name, a copy whose
    lowest rank is missing, several models, a priority breakdown without its total."""

    def text(lines: list[tuple[str, float]]) -> str:
        body = "\n".join(f"sglang:num_running_reqs{{{labels}}} {v}" for labels, v in lines)
        return "# TYPE sglang:num_running_reqs gauge\n" + body + "\n"

    def running(lines: list[tuple[str, float]]) -> float | None:
        return sm.parse(text(lines), t=0.0).running

    m = 'model_name="m",engine_type="unified"'
    # TP x PP copies of two DP ranks (the copies differ here): one per DP rank, the lowest ranks
    grid = [
        (f'{m},tp_rank="{t}",pp_rank="{p}",dp_rank="{d}"', 10.0 * (d + 1) + t + p)
        for d in (0, 1)
        for t in range(4)
        for p in range(2)
    ]
    assert running(grid) == 30
    # ranks sort as numbers ("10" after "9"); a copy without rank 0 still counts once
    assert running([(f'{m},tp_rank="{t}"', 7.0 if t == 9 else 99.0) for t in (10, 9, 11)]) == 7
    # two models served by one process are two workloads
    assert running([('model_name="a",tp_rank="0"', 3.0), ('model_name="b",tp_rank="0"', 4.0)]) == 7
    # a breakdown by priority with no total: summed
    assert running([(f'{m},priority="1"', 2.0), (f'{m},priority="2"', 5.0)]) == 7
    # vLLM: engines are data-parallel ranks; pids of API servers are copies
    vllm = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="q",pid="11"} 4.0\n'
        'vllm:num_requests_running{engine="0",model_name="q",pid="12"} 4.0\n'
        'vllm:num_requests_running{engine="1",model_name="q",pid="11"} 6.0\n'
    )
    assert sm.parse(vllm, t=0.0).running == 10


# --------------------------------------------------------------------------- squeue --json

SQUEUE = sorted(p.name for p in VERSIONS.glob("squeue-*.json"))
NOW = 1_700_003_700.0


@pytest.mark.parametrize("name", SQUEUE)
def test_v4_squeue_json_of_every_data_parser_version(name: str) -> None:
    header, body = load(name)
    jobs = {j["job_id"]: j for j in slurmops.parse_json_jobs(json.loads(body), now=NOW)}
    assert sorted(jobs) == ["41", "55_2", "58"]
    completing, running, pending = jobs["41"], jobs["55_2"], jobs["58"]
    # cancelled while its processes are torn down: not ended, whichever shape the state has
    assert completing["state"] == "COMPLETING" and "COMPLETING" in slurmops.ACTIVE_STATES
    assert completing["state"] not in slurmops.TERMINAL_STATES
    assert (completing["elapsed_s"], completing["time_limit_s"]) == (3640, 14_400)
    assert (running["state"], running["elapsed_s"], running["start_time"]) == (
        "RUNNING",
        2500,
        1_700_001_200,
    )
    assert (running["array_job_id"], running["nodes"]) == ("55", "gpu-a02")
    assert (pending["state"], pending["reason"], pending["elapsed_s"]) == (
        "PENDING",
        "Resources",
        None,
    )
    assert pending["time_limit_s"] is None and pending["start_time"] is None
    assert {j["submit_time"] for j in jobs.values()} == {
        1_700_000_000,
        1_700_001_000,
        1_700_002_000,
    }
    assert {j["user"] for j in jobs.values()} == {"alice"} and completing["uid"] == 1000
    assert header["version"].split()[0] in json.loads(body)["meta"]["Slurm"]["release"]


# --------------------------------------------------------------------------- nvidia-smi

SMI = {
    "nvidia-smi-535-h100.csv": (
        {31337: 71234.0, 31338: 65120.0},
        [(0, "NVIDIA H100 80GB HBM3", 97.0, 71234.0, 81559.0, 612.35, 71.0, [31337]),
         (1, "NVIDIA H100 80GB HBM3", 88.0, 65120.0, 81559.0, None, 66.0, [31338])],
    ),
    # MIG: per-process memory [N/A] (held, amount unknown: 0), utilization [Not Supported]
    "nvidia-smi-550-a100-mig.csv": (
        {4100: 0.0, 4101: 0.0, 4200: 40110.0},
        [(0, "NVIDIA A100-SXM4-80GB", None, 38912.0, 81920.0, 245.1, 58.0, [4100, 4101]),
         (1, "NVIDIA A100-SXM4-80GB", 64.0, 40110.0, 81920.0, 301.77, 61.0, [4200])],
    ),
    "nvidia-smi-570-gh200.csv": (
        {9001: 90112.0},
        [(0, "NVIDIA GH200 480GB", 100.0, 90112.0, 97871.0, None, 54.0, [9001])],
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SMI))
def test_v5_nvidia_smi_of_every_driver_read_by_the_agents_query(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, body = load(name)
    apps, _, gpus = body.partition("## --query-gpu\n")
    (tmp_path / "apps.csv").write_text(apps.replace("## --query-compute-apps\n", ""))
    (tmp_path / "gpus.csv").write_text(gpus)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    # a stand-in that prints the captured output of the query it is asked (a constant script)
    smi.write_text(
        "#!/bin/sh\n"
        'here="$(dirname "$0")/.."\n'
        'case "$1" in\n'
        '  --query-compute-apps=*) cat "$here/apps.csv" ;;\n'
        '  --query-gpu=*) cat "$here/gpus.csv" ;;\n'
        "  *) exit 2 ;;\n"
        "esac\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    per_pid, summary = gpu.query_gpu()
    want_pids, want_gpus = SMI[name]
    assert per_pid == want_pids
    assert summary is not None
    got = [
        (g["index"], g["name"], g["utilization_pct"], g["memory_used_mb"], g["memory_total_mb"],
         g["power_w"], g["temperature_c"], g["pids"])
        for g in summary["gpus"]
    ]  # fmt: skip
    assert got == want_gpus


# --------------------------------------------------------------------------- API responses

REASONING = "The user asks for a capital. It is Paris."
CONTENT = "Paris is the capital."
# fixture -> (what a request cost, the generated text)
RESPONSES = {
    "openai-chat.json": (None, CONTENT),
    "openai-chat-cached.json": (None, CONTENT),
    "openrouter-credits.json": (0.0000891, REASONING + CONTENT),
    # BYOK: OpenRouter's fee plus what the provider charged the user's own key (20x the fee)
    "openrouter-byok.json": (0.00025 + 0.005, REASONING + CONTENT),
    # vLLM fills both reasoning fields with the same text: once
    "vllm-reasoning.json": (None, REASONING + CONTENT),
    "sglang-reasoning.json": (None, REASONING + CONTENT),
}


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_v6_v7_cost_and_text_of_every_api_response(name: str) -> None:
    _, body = load(name)
    response = wire.decode_response(body.encode())
    cost, text = RESPONSES[name]
    assert response.usage is not None
    assert response.usage.true_cost() == (pytest.approx(cost) if cost is not None else None)
    assert wire.text_of(response.choices[0].message) == text


def test_v7_reasoning_under_two_names_counts_once_in_every_form() -> None:
    once = wire.reasoning_text
    assert once("abc", "abc") == "abc" and once(None, "abc") == "abc" and once("abc", "") == "abc"
    # one holds the other (a field that is the other's alias, filled more fully): the fuller one
    assert once("abc", "ab") == "abc" and once("b", "abc") == "abc"
    assert once("abc", "xyz") == "abcxyz"  # two different texts are both kept
    assert wire.text_of(wire.Message(content="c", reasoning="r", reasoning_content="r")) == "rc"
    _, stream = load("vllm-reasoning-stream.sse")
    pieces = [
        wire.text_of(chunk.choices[0].delta)
        for line in stream.splitlines()
        if line.startswith("data: {")
        for chunk in [wire.decode_response(line[len("data: ") :].encode())]
        if chunk.choices
    ]
    assert "".join(pieces) == REASONING + CONTENT


def _char_tokenizer(directory: Path) -> Any:
    """A real Hugging Face tokenizer with one token per character, loaded as the config's is."""
    from tokenizers import Regex, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Split
    from transformers import PreTrainedTokenizerFast

    from supervisor.tokens import load_tokenizer

    raw = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    raw.pre_tokenizer = Split(Regex("."), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(directory)
    return load_tokenizer(directory)


async def _bench(served: Served, tmp_path: Path, stream: bool, tokenizer: Any = None) -> Any:
    prompts = load_prompts(write_prompts(tmp_path / "prompts", ["B1"], count=8)["B1"])
    options = Options(requests=6, concurrency=[2], warmup=False, stream=stream)
    target = Target(name="api", base_url=served.url + "/v1", model="m")
    result = await Bench(target, prompts, options, tokenizer=tokenizer).run()
    return result.levels[0]


async def test_v6_a_bench_through_openrouter_byok_counts_the_providers_price(
    served: Served, tmp_path: Path
) -> None:
    served.body = load("openrouter-byok.json")[1].encode()
    level = await _bench(served, tmp_path, stream=False)
    assert level.completed == 6 and level.cost_source == "usage.cost"
    assert level.cost_usd == pytest.approx(6 * (0.00025 + 0.005))
    served.body = load("openrouter-credits.json")[1].encode()
    level = await _bench(served, tmp_path, stream=False)
    assert level.cost_usd == pytest.approx(6 * 0.0000891)


async def test_e4_cached_prompt_tokens_are_charged_at_the_cached_price(
    served: Served, tmp_path: Path
) -> None:
    """OpenAI bills the prompt tokens its cache served (``prompt_tokens_details.cached_tokens``)
    at the cached price: 1,920 of 2,006 here. With ``price_cached_in_per_m`` they cost that;
    without it, the full input price."""
    served.body = load("openai-chat-cached.json")[1].encode()
    prompts = load_prompts(write_prompts(tmp_path / "prompts", ["B1"], count=8)["B1"])
    options = Options(requests=6, concurrency=[2], warmup=False)
    url = served.url + "/v1"
    target = Target(name="api", base_url=url, model="m", price_in_per_m=2.5, price_out_per_m=10.0)
    cached = msgspec.structs.replace(target, price_cached_in_per_m=1.25)
    full, half = [(await Bench(t, prompts, options).run()).levels[0] for t in (target, cached)]
    assert half.completed == 6 and half.cost_source == "price table"
    assert half.cost_usd == pytest.approx(6 * (86 * 2.5 + 1920 * 1.25 + 300 * 10.0) / 1e6)
    assert full.cost_usd == pytest.approx(6 * (2006 * 2.5 + 300 * 10.0) / 1e6)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_v7_a_bench_of_vllm_counts_its_reasoning_once(
    served: Served, tmp_path: Path, stream: bool
) -> None:
    """vLLM's usage says 62 completion tokens; the tokenizer (one token per character) counts the
    reasoning once and the content: 41 + 21 = 62, no disagreement."""
    if stream:
        served.body = load("vllm-reasoning-stream.sse")[1].encode()
        served.content_type = "text/event-stream"
    else:
        served.body = load("vllm-reasoning.json")[1].encode()
    level = await _bench(served, tmp_path, stream, _char_tokenizer(tmp_path / "chars"))
    assert len(REASONING) + len(CONTENT) == 62
    assert level.completed == 6 and level.tokens.usage_completion == 6 * 62
    assert level.tokens.tokenizer_completion == 6 * 62
    assert level.tokens.mismatched_responses == 0 and not level.tokens.flagged
