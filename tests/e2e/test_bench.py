"""``supervisor.bench`` against the demo's mock server, whose ground truth is known by construction.

The mock paces output like a GPU server: ``capacity_tps`` tokens/s in total, shared by the requests
in flight. With every response the same length (``length_sigma = 0`` and ``max_tokens`` below the
mean, so each answer stops at ``max_tokens``), the rates it delivers are computable exactly.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from supervisor.bench.history import append_history, latest_bench, load_history
from supervisor.bench.prompts import Prompt, load_prompts, prompts_for
from supervisor.bench.results import BenchResult
from supervisor.bench.runner import Bench, Options, run_bench
from supervisor.bench.stats import percentile
from supervisor.bench.target import Target, mask_url, resolve_target
from supervisor.config import load_config
from supervisor.demo.prompts import write_prompts
from supervisor.errors import EndpointError
from tests.fixtures_config import write_api_run_config
from tests.waiting import wait_until

# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_prompts(tmp_path_factory.mktemp("prompts"), ["B1", "B2", "B5"], count=60)


@pytest.fixture
def demo_tok(demo_tokenizer: Path) -> Any:
    """The demo tokenizer, loaded: the one the mock server's text comes from."""
    from supervisor.tokens import load_tokenizer

    return load_tokenizer(demo_tokenizer)


class Recorder(httpx.AsyncBaseTransport):
    """A real transport that also notes, per exchange, when it was sent and answered, its status,
    the Retry-After it carried and the ``usage.cost`` of a successful body."""

    def __init__(self, log: list[dict[str, Any]]) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.log = log

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST":
            return await self.inner.handle_async_request(request)
        sent = time.monotonic()
        entry: dict[str, Any] = {"sent": sent}
        self.log.append(entry)
        try:
            resp = await self.inner.handle_async_request(request)
            body = await resp.aread()
        except httpx.TransportError as e:
            entry["error"] = type(e).__name__
            raise
        entry["answered"] = time.monotonic()
        entry["status"] = resp.status_code
        entry["retry_after"] = resp.headers.get("retry-after")
        if resp.status_code == 200 and body.startswith(b"{"):
            entry["cost"] = json.loads(body)["usage"].get("cost")
        return httpx.Response(resp.status_code, headers=resp.headers, content=body, request=request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def target(url: str, **kw: Any) -> Target:
    return Target(name="mock", base_url=url, **kw)


async def bench_once(
    url: str,
    prompts: list[Prompt],
    options: Options,
    log: list[dict[str, Any]] | None = None,
    **kw: Any,
) -> BenchResult:
    factory = None
    if log is not None:
        rec_log = log

        def factory() -> httpx.AsyncBaseTransport:
            return Recorder(rec_log)

    tok = kw.pop("tokenizer", None)
    b = Bench(target(url, **kw), prompts, options, tokenizer=tok, transport_factory=factory)
    return await b.run()


# --------------------------------------------------------------------------- ground truth


async def test_rates_match_what_the_mock_delivers(
    mock_server: Any, prompt_files: dict[str, Path], demo_tok: Any
) -> None:
    # 4,000 tok/s of capacity shared by 8 requests of exactly 400 tokens: every wave of 8 takes
    # 0.8 s, so the server delivers 4,000 output tok/s and 10 req/s.
    capacity, length, c = 4000.0, 400, 8
    h = mock_server(capacity_tps=capacity, mean_tokens=1000, length_sigma=0, tick_s=0.01)
    prompts = load_prompts(prompt_files["B2"])
    r = await bench_once(
        h.url,
        prompts,
        Options(requests=48, concurrency=[c]),
        max_tokens=length,
        tokenizer=demo_tok,
    )
    (lv,) = r.levels
    assert lv.completed == 48 and lv.failed == {} and lv.gave_up == 0
    assert lv.completion_tokens == 48 * length
    assert lv.finish_reasons == {"length": 48}
    # What a loaded machine cannot change: the mock never delivers faster than its capacity, a
    # request never takes less than its share (8 x 400 tokens at 4,000 tok/s = 0.8 s), and the
    # rates are the tokens counted over the time measured. How close to the capacity the figures
    # come on a quiet machine is measured by tests/perf/bench_rates.py.
    assert 0 < lv.output_tok_per_s <= capacity * 1.05
    assert lv.req_per_s == pytest.approx(lv.output_tok_per_s / length, rel=1e-6)
    assert 1 < lv.achieved_concurrency <= c * 1.05
    assert lv.latency_ms.p50 is not None and lv.latency_ms.p50 >= 800 * 0.95
    assert lv.prompt_tokens > 0 and lv.total_tok_per_s > lv.output_tok_per_s
    # The demo tokenizer is the mock's: usage and tokenizer agree to the token.
    assert lv.tokens.usage_completion == lv.tokens.tokenizer_completion == 48 * length
    assert not lv.tokens.flagged and lv.tokens.disagreement == 0.0


async def test_streaming_measures_ttft_and_time_per_token(
    mock_server: Any, prompt_files: dict[str, Path]
) -> None:
    # Two requests at a time, 200 tokens/s each, after 0.2 s of "prefill": TTFT is 0.2 s (plus a
    # scheduling tick), every later token takes 5 ms, and each 100-token answer takes 0.7 s.
    h = mock_server(decode_tps=200, latency_s=0.2, mean_tokens=1000, length_sigma=0, tick_s=0.01)
    prompts = load_prompts(prompt_files["B1"])
    r = await bench_once(
        h.url, prompts, Options(requests=6, concurrency=[2], stream=True), max_tokens=100
    )
    (lv,) = r.levels
    assert lv.completed == 6 and lv.completion_tokens == 600
    assert lv.ttft_ms is not None and lv.tpot_ms is not None and lv.itl_ms is not None
    # Bounds a loaded machine cannot break (no token comes sooner than the mock paces it); the
    # figures on a quiet machine are measured by tests/perf/bench_rates.py.
    assert lv.ttft_ms.p50 is not None and lv.ttft_ms.p50 >= 200
    assert lv.tpot_ms.p50 is not None and lv.tpot_ms.p50 >= 5.0 * 0.95
    assert 0 < lv.output_tok_per_s <= 2 * 100 / 0.7 * 1.05
    assert lv.itl_ms.p50 is not None and lv.itl_ms.p50 > 0


# --------------------------------------------------------------------------- faults (E1)


async def test_429_and_500_counted_by_kind_and_retry_after_honoured(
    mock_server: Any, prompt_files: dict[str, Path]
) -> None:
    h = mock_server(error_429=0.25, error_500=0.15, retry_after=0.3, mean_tokens=50, seed=7)
    log: list[dict[str, Any]] = []
    opts = Options(requests=30, concurrency=[1], warmup=False, max_retries=20, backoff_s=0.01)
    r = await bench_once(h.url, load_prompts(prompt_files["B1"]), opts, log=log)
    (lv,) = r.levels
    statuses = [e.get("status") for e in log]
    n429, n500 = statuses.count(429), statuses.count(500)
    assert n429 >= 3 and n500 >= 2  # the seed injects both kinds
    assert lv.failed == {"429": n429, "5xx": n500}
    want = {"200": 30, "429": n429, "500": n500}
    wait_until(lambda: h.stats()["by_status"] == want, 5, what=f"the mock to count {want}")
    assert lv.completed == 30 and lv.gave_up == 0
    # After every 429 the next request waited at least the Retry-After the server sent.
    gaps = [
        nxt["sent"] - e["answered"] for e, nxt in itertools.pairwise(log) if e.get("status") == 429
    ]
    assert len(gaps) == n429
    assert all(e["retry_after"] == "0.3" for e in log if e.get("status") == 429)
    assert min(gaps) >= 0.3
    assert lv.retry_wait_s >= 0.3 * n429


@pytest.mark.parametrize("stream", [False, True])
async def test_connection_reset_mid_body_counted_and_retried(
    mock_server: Any, prompt_files: dict[str, Path], stream: bool
) -> None:
    h = mock_server(error_reset=0.3, mean_tokens=50, seed=3)
    opts = Options(
        requests=20, concurrency=[2], warmup=False, max_retries=20, backoff_s=0.01, stream=stream
    )
    r = await bench_once(h.url, load_prompts(prompt_files["B1"]), opts)
    (lv,) = r.levels
    attempts = lv.completed + sum(lv.failed.values())
    wait_until(lambda: h.stats()["requests"] == attempts, 5, what="the mock to count every attempt")
    resets = h.stats()["resets"]
    assert resets >= 2
    assert lv.failed == {"connection": resets}
    assert lv.completed == 20


async def test_gives_up_after_the_retry_budget_and_still_reports(
    mock_server: Any, prompt_files: dict[str, Path]
) -> None:
    h = mock_server(error_500=1.0)
    opts = Options(requests=3, concurrency=[1], warmup=False, max_retries=2, backoff_s=0.01)
    r = await bench_once(h.url, load_prompts(prompt_files["B1"]), opts)
    (lv,) = r.levels
    assert lv.completed == 0 and lv.gave_up == 3
    assert lv.failed == {"5xx": 9}  # 3 requests x (1 try + 2 retries)
    assert lv.req_per_s == 0.0 and lv.latency_ms.p50 is None


# --------------------------------------------------------------------------- tokens (E2)


def _word_tokenizer(directory: Path) -> Any:
    """A real Hugging Face tokenizer that counts characters (it disagrees with the server's BPE),
    saved and loaded the way the config's tokenizer is."""
    from tokenizers import Regex, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Split
    from transformers import PreTrainedTokenizerFast

    from supervisor.tokens import load_tokenizer

    raw = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    raw.pre_tokenizer = Split(Regex("."), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(directory)
    return load_tokenizer(directory)


async def test_usage_and_tokenizer_disagreement_is_flagged(
    mock_server: Any, prompt_files: dict[str, Path], tmp_path: Path
) -> None:
    h = mock_server(mean_tokens=300, length_sigma=0)
    words = _word_tokenizer(tmp_path / "words")
    r = await bench_once(
        h.url,
        load_prompts(prompt_files["B1"]),
        Options(requests=10, concurrency=[2], warmup=False),
        max_tokens=200,
        tokenizer=words,
    )
    t = r.levels[0].tokens
    assert t.usage_completion == 2000
    assert t.tokenizer_completion is not None and t.tokenizer_completion != 2000
    assert t.flagged and t.disagreement is not None and abs(t.disagreement) > 0.02
    assert t.mismatched_responses == 10
    assert t.note is not None and "tokenizer" in t.note
    # Usage stays the count of record when present.
    assert r.levels[0].completion_tokens == 2000


async def test_responses_without_usage_fall_back_to_the_tokenizer(
    mock_server: Any, prompt_files: dict[str, Path], demo_tok: Any
) -> None:
    h = mock_server(mean_tokens=300, length_sigma=0)
    opts = Options(requests=8, concurrency=[2], stream=True, stream_usage=False, warmup=False)
    r = await bench_once(
        h.url, load_prompts(prompt_files["B1"]), opts, max_tokens=120, tokenizer=demo_tok
    )
    lv = r.levels[0]
    assert lv.tokens.with_usage == 0
    assert lv.tokens.fallback_completion == 8 * 120
    assert lv.completion_tokens == 8 * 120
    assert lv.prompt_tokens > 0  # counted from the prompts' text
    assert lv.tokens.flagged and "no usage" in (lv.tokens.note or "")


# --------------------------------------------------------------------------- cost


async def test_cost_is_exactly_the_sum_of_usage_cost(
    mock_server: Any, prompt_files: dict[str, Path]
) -> None:
    h = mock_server(mean_tokens=80, price_in=0.6, price_out=2.5, seed=5)
    log: list[dict[str, Any]] = []
    prompts = load_prompts(prompt_files["B5"])  # multi-turn chats of varied length
    r = await bench_once(h.url, prompts, Options(requests=40, concurrency=[4], warmup=False), log)
    lv = r.levels[0]
    costs = [e["cost"] for e in log if e.get("status") == 200]
    assert len(costs) == 40 and len(set(costs)) > 5
    assert lv.cost_source == "usage.cost"
    assert lv.cost_usd == math.fsum(costs)


async def test_cost_from_price_table_when_usage_has_none(
    mock_server: Any, prompt_files: dict[str, Path]
) -> None:
    h = mock_server(mean_tokens=80)
    r = await bench_once(
        h.url,
        load_prompts(prompt_files["B1"]),
        Options(requests=10, concurrency=[2], warmup=False),
        price_in_per_m=1.0,
        price_out_per_m=4.0,
    )
    lv = r.levels[0]
    assert lv.cost_source == "price table"
    assert lv.cost_usd == pytest.approx((lv.prompt_tokens * 1.0 + lv.completion_tokens * 4.0) / 1e6)


async def test_local_endpoint_costs_its_gpu_time(
    mock_server: Any, prompt_files: dict[str, Path]
) -> None:
    h = mock_server(mean_tokens=20)
    r = await bench_once(
        h.url,
        load_prompts(prompt_files["B1"]),
        Options(requests=5, concurrency=[1], warmup=False),
        gpu_cost_per_hour=36.0,
    )
    lv = r.levels[0]
    assert lv.cost_source == "GPU time"
    assert lv.cost_usd == pytest.approx(lv.wall_s / 100.0)


# --------------------------------------------------------------------------- shape, progress


async def test_bare_url_takes_its_model_from_v1_models(
    mock_server: Any, prompt_files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    h = mock_server(model="org/served-model", mean_tokens=20)
    seen: list[tuple[int, int]] = []
    r = await run_bench(
        None,
        h.url,
        prompts=str(prompt_files["B1"]),
        options=Options(requests=12, concurrency=[2, 4]),
        progress=lambda done, total: seen.append((done, total)),
    )
    assert r.model == "org/served-model"
    assert [lv.concurrency for lv in r.levels] == [2, 4]
    assert seen[-1] == (24, 24)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    history = load_history()
    assert len(history) == 1 and history[0].levels[1].completed == 12
    assert latest_bench(r.endpoint, history) is not None


async def test_requests_are_shaped_like_the_run(
    mock_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Model, max_tokens and temperature come from the endpoint; prompts from the run's dataset."""
    h = mock_server(mean_tokens=1000, length_sigma=0)
    cfg = write_api_run_config(
        tmp_path,
        h.url,
        "B7",
        prompts=20,
        token_budget=1000,
        endpoint="""
model = "m-from-config"
max_tokens = 33
temperature = 0.6
concurrency = 3
""",
    )
    config = load_config(cfg)
    t = resolve_target(config, "api")
    prompts, source = prompts_for(config, None, t, 10)
    assert "B7" in source and len(prompts) == 10
    assert prompts == load_prompts(tmp_path / "work" / "prompts" / "B7.jsonl", 10)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    r = await run_bench(config, "api", options=Options(requests=6))
    assert r.model == "m-from-config" and r.max_tokens == 33 and r.temperature == 0.6
    assert r.levels[0].concurrency == 3  # the endpoint's concurrency
    assert r.levels[0].completion_tokens == 6 * 33  # max_tokens reached the server
    # A bare URL equal to the endpoint's base URL takes the endpoint's shape too.
    assert resolve_target(config, h.url + "/").name == "api"


async def test_unreachable_endpoint_is_one_clear_error(prompt_files: dict[str, Path]) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    b = Bench(
        target(f"http://127.0.0.1:{port}/v1", model="m"),
        load_prompts(prompt_files["B1"]),
        Options(requests=2, concurrency=[1]),
    )
    with pytest.raises(EndpointError, match=r"cannot reach http://127\.0\.0\.1"):
        await b.run()


# --------------------------------------------------------------------------- pieces


def test_prompt_lines_of_both_shapes(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text(
        '{"prompt": "hello there"}\n'
        "\n"
        "not json\n"
        '{"sample_id": "x", "messages": [{"role": "user", "content": "a"},'
        ' {"role": "assistant", "content": "b"}]}\n'
        '{"other": 1}\n'
    )
    got = load_prompts(p)
    assert got[0] == Prompt(
        messages=[{"role": "user", "content": "hello there"}], text="hello there"
    )
    assert got[1].messages[1] == {"role": "assistant", "content": "b"} and got[1].text == "a\nb"
    assert len(got) == 2
    empty = tmp_path / "e.jsonl"
    empty.write_text('{"other": 1}\n')
    with pytest.raises(EndpointError, match="holds no prompts"):
        load_prompts(empty)


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([float(i) for i in range(101)], 90) == 90.0


def test_mask_url_drops_credentials_and_query() -> None:
    assert mask_url("https://user:pw@api.example.com:8443/v1/?key=sek") == (
        "https://api.example.com:8443/v1"
    )


def test_history_round_trip_skips_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    a = BenchResult(endpoint="a", base_url="u", model="m", time=1.0)
    append_history(a, path)
    with path.open("ab") as f:
        f.write(b"{torn\n")
    append_history(msgspec.structs.replace(a, time=2.0), path)
    got = load_history(path)
    assert [r.time for r in got] == [1.0, 2.0]
    assert path.stat().st_mode & 0o777 == 0o600


async def test_a_rejected_request_is_not_retried(mock_server: Any, tmp_path: Path) -> None:
    # The mock answers 400 to a message whose content is a number; a 4xx will not get better.
    p = tmp_path / "p.jsonl"
    p.write_text('{"messages": [{"role": "user", "content": 5}]}\n{"prompt": "fine"}\n')
    h = mock_server(mean_tokens=10)
    opts = Options(requests=4, concurrency=[1], warmup=False, max_retries=5, backoff_s=0.01)
    r = await bench_once(h.url, load_prompts(p), opts)
    (lv,) = r.levels
    assert lv.failed == {"4xx": 2} and lv.gave_up == 2 and lv.completed == 2
    assert lv.retry_wait_s == 0.0
