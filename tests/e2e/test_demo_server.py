"""The mock OpenAI-compatible server: protocol, knobs, faults, the official client against it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervisor.demo.server import MockSettings, _Decoder, _Job, _Stats
from supervisor.demo.tokenizer import DemoVocab

CHAT = {"model": "anything", "messages": [{"role": "user", "content": "Say something long."}]}


_clients: dict[str, httpx.Client] = {}


@pytest.fixture(autouse=True)
def _close_clients() -> Any:
    yield
    while _clients:
        _clients.popitem()[1].close()


def _chat(url: str, **extra: Any) -> httpx.Response:
    # One keep-alive client per server: a new connection per request costs far more than the mock.
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = httpx.Client(timeout=30)
    return client.post(f"{url}/chat/completions", json={**CHAT, **extra})


def _sse(url: str, path: str, body: dict[str, Any]) -> list[Any]:
    events: list[Any] = []
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_models_lists_the_served_model(mock_server: Any) -> None:
    h = mock_server(model="demo-x")
    r = httpx.get(f"{h.url}/models")
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["demo-x"]
    assert h.url.endswith("/v1")


def test_chat_completion_has_message_usage_and_agreeing_token_ids(
    mock_server: Any, demo_tokenizer: Path
) -> None:
    h = mock_server(mean_tokens=60)
    data = _chat(h.url, return_token_ids=True).json()
    assert data["object"] == "chat.completion"
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop"
    usage = data["usage"]
    assert usage["completion_tokens"] == len(choice["token_ids"]) > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens"] == len(data["prompt_token_ids"]) > 0
    assert "cost" not in usage  # no price set
    vocab = DemoVocab(demo_tokenizer)
    assert vocab.tokenizer.decode(choice["token_ids"]) == choice["message"]["content"]
    assert vocab.count(choice["message"]["content"]) == usage["completion_tokens"]


def test_token_ids_only_when_asked(mock_server: Any) -> None:
    h = mock_server(mean_tokens=20)
    data = _chat(h.url).json()
    assert "token_ids" not in data["choices"][0]
    assert "prompt_token_ids" not in data


def test_max_tokens_hit_gives_finish_reason_length(mock_server: Any) -> None:
    h = mock_server(mean_tokens=3500)
    data = _chat(h.url, max_tokens=7, return_token_ids=True).json()
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 7 == len(data["choices"][0]["token_ids"])
    newer = _chat(h.url, max_completion_tokens=3).json()
    assert newer["usage"]["completion_tokens"] == 3


def test_completions_endpoint(mock_server: Any) -> None:
    h = mock_server(mean_tokens=3500)
    r = httpx.post(f"{h.url}/completions", json={"model": "m", "prompt": "Once", "max_tokens": 4})
    data = r.json()
    assert data["object"] == "text_completion"
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["choices"][0]["text"].strip()
    assert data["usage"]["completion_tokens"] == 4


def test_cost_is_exact_when_priced(mock_server: Any) -> None:
    h = mock_server(mean_tokens=80, price_in=0.6, price_out=2.5)
    for _ in range(5):
        usage = _chat(h.url).json()["usage"]
        expected = (usage["prompt_tokens"] * 0.6 + usage["completion_tokens"] * 2.5) / 1e6
        assert usage["cost"] == pytest.approx(expected, rel=1e-12, abs=0)


def test_streaming_chat_matches_a_whole_answer(mock_server: Any) -> None:
    h = mock_server(mean_tokens=100, price_in=1.0, price_out=2.0)
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    events = _sse(h.url, "/chat/completions", {**body, "return_token_ids": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    ids = [i for c in chunks if c["choices"] for i in c["choices"][0].get("token_ids", [])]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    assert usage["completion_tokens"] == len(ids) > 0
    assert usage["cost"] == pytest.approx((usage["prompt_tokens"] + 2 * len(ids)) / 1e6)
    assert DemoVocab(Path(h.settings.tokenizer)).decode(ids) == text


def test_streaming_without_usage_option_has_no_usage_chunk(mock_server: Any) -> None:
    h = mock_server(mean_tokens=3500)
    events = _sse(h.url, "/chat/completions", {**CHAT, "stream": True, "max_tokens": 40})
    chunks = events[:-1]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_streaming_completions(mock_server: Any) -> None:
    h = mock_server(mean_tokens=3500)
    body = {"model": "m", "prompt": "Hi", "max_tokens": 20, "stream": True}
    events = _sse(h.url, "/completions", body)
    assert events[-1] == "[DONE]"
    assert all(c["object"] == "text_completion" for c in events[:-1])
    assert "".join(c["choices"][0]["text"] for c in events[:-1]).strip()


def test_bad_requests_get_openai_shaped_errors(mock_server: Any) -> None:
    h = mock_server()
    r = httpx.post(f"{h.url}/chat/completions", json={"model": "m"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{h.url}/chat/completions", content=b"{nope")
    assert r.status_code == 400
    assert httpx.get(f"{h.url}/chat/completions").status_code == 405


def test_api_key_is_required_when_set(mock_server: Any) -> None:
    h = mock_server(api_key="sekret", mean_tokens=10)
    assert _chat(h.url).status_code == 401
    assert httpx.get(f"{h.url}/models").status_code == 401
    ok = httpx.post(
        f"{h.url}/chat/completions", json=CHAT, headers={"Authorization": "Bearer sekret"}
    )
    assert ok.status_code == 200
    assert "sekret" not in repr(h.settings)


def test_lengths_are_seeded(mock_server: Any) -> None:
    a = mock_server(seed=5, mean_tokens=200)
    b = mock_server(seed=5, mean_tokens=200)
    c = mock_server(seed=6, mean_tokens=200)

    def lengths(url: str) -> list[int]:
        return [_chat(url).json()["usage"]["completion_tokens"] for _ in range(8)]

    la, lb, lc = lengths(a.url), lengths(b.url), lengths(c.url)
    assert la == lb
    assert la != lc
    # A request's own seed makes its answer repeatable whatever came before.
    first = _chat(a.url, seed=42, return_token_ids=True).json()["choices"][0]["token_ids"]
    _chat(a.url)
    again = _chat(a.url, seed=42, return_token_ids=True).json()["choices"][0]["token_ids"]
    assert first == again


def test_length_distribution_mean_follows_the_knob(mock_server: Any) -> None:
    h = mock_server(seed=3, mean_tokens=150)
    lengths = [_chat(h.url).json()["usage"]["completion_tokens"] for _ in range(200)]
    mean = sum(lengths) / len(lengths)
    assert 120 < mean < 180
    assert len(set(lengths)) > 50  # a distribution, not a constant


def test_429_carries_retry_after(mock_server: Any) -> None:
    h = mock_server(error_429=1.0, retry_after=2)
    r = _chat(h.url)
    assert r.status_code == 429
    assert r.headers["retry-after"] == "2"
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert h.stats()["by_status"] == {"429": 1}
    over_http = httpx.get(h.url.removesuffix("/v1") + "/mock/stats").json()
    assert over_http["by_status"] == {"429": 1} and over_http["requests"] == 1


def test_500_is_injected(mock_server: Any) -> None:
    h = mock_server(error_500=1.0)
    r = _chat(h.url)
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "server_error"


def test_reset_closes_the_connection_mid_body(mock_server: Any) -> None:
    h = mock_server(error_reset=1.0, mean_tokens=50)
    with pytest.raises(httpx.RemoteProtocolError):
        _chat(h.url)
    with pytest.raises(httpx.RemoteProtocolError):
        _sse(h.url, "/chat/completions", {**CHAT, "stream": True})
    assert h.stats()["resets"] == 2
    # The server itself is fine afterwards.
    assert httpx.get(f"{h.url}/models").status_code == 200


def test_fault_rates_mix(mock_server: Any) -> None:
    h = mock_server(error_429=0.3, error_500=0.2, seed=11, mean_tokens=5)
    codes = [_chat(h.url).status_code for _ in range(100)]
    assert 15 <= codes.count(429) <= 45
    assert 8 <= codes.count(500) <= 35
    assert codes.count(200) == 100 - codes.count(429) - codes.count(500)


def test_capacity_bounds_the_aggregate_output(mock_server: Any) -> None:
    capacity = 1000.0
    h = mock_server(capacity_tps=capacity, tick_s=0.02)

    async def run() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=60) as c:
            body = {**CHAT, "max_tokens": 150, "ignore_eos": True}
            rs = await asyncio.gather(
                *[c.post(f"{h.url}/chat/completions", json=body) for _ in range(12)]
            )
        return [r.json() for r in rs]

    answers = asyncio.run(run())
    assert all(a["usage"]["completion_tokens"] == 150 for a in answers)
    assert all(a["choices"][0]["finish_reason"] == "length" for a in answers)
    stats = h.stats()
    assert stats["paced_tokens"] == 12 * 150
    assert stats["peak_active"] > 1  # they did share the capacity
    # The scheduler never hands out more than capacity x the time it ran.
    assert stats["paced_tokens"] <= capacity * stats["paced_seconds"] + 1e-6


def test_decoder_shares_capacity_fairly_and_caps_each_request() -> None:
    settings = MockSettings(decode_tps=100, capacity_tps=250)
    stats = _Stats()

    async def allot() -> list[int]:
        d = _Decoder(settings, stats)
        jobs = [_Job(10), _Job(1000), _Job(1000), _Job(1000)]
        d.jobs.update(jobs)
        d._allot(1.0)
        return [j.done for j in jobs]

    small, *big = asyncio.run(allot())
    # Water-filling: the small job gets all it needs, the rest split what remains, each <= 100/s.
    assert small == 10
    assert big == [80, 80, 80]
    assert stats.paced_tokens == 250


def test_per_request_decode_speed_caps_one_request() -> None:
    stats = _Stats()

    async def allot() -> int:
        d = _Decoder(MockSettings(decode_tps=50), stats)
        job = _Job(1000)
        d.jobs.add(job)
        d._allot(0.5)
        return job.done

    assert asyncio.run(allot()) == 25


def test_disconnected_client_frees_its_request(mock_server: Any) -> None:
    h = mock_server(decode_tps=20, tick_s=0.02)

    async def run() -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(60, read=0.3)) as c:
            with pytest.raises(httpx.ReadTimeout):
                await c.post(f"{h.url}/chat/completions", json={**CHAT, "max_tokens": 5000})

    asyncio.run(run())
    from tests.waiting import wait_until

    wait_until(lambda: h.stats()["active"] == 0, timeout=20, what="the abandoned request to end")
    assert h.stats()["by_status"].get("client-gone") == 1


def test_official_openai_client_works_unchanged(mock_server: Any) -> None:
    openai = pytest.importorskip("openai")
    h = mock_server(mean_tokens=40, model="demo-openai", price_in=0.5, price_out=1.5)
    client = openai.OpenAI(base_url=h.url, api_key="unused", max_retries=0)
    try:
        models = client.models.list()
        assert [m.id for m in models.data] == ["demo-openai"]
        resp = client.chat.completions.create(
            model="demo-openai", messages=[{"role": "user", "content": "hi"}], max_tokens=500
        )
        assert resp.choices[0].message.content
        assert resp.choices[0].finish_reason in ("stop", "length")
        assert resp.usage is not None and resp.usage.completion_tokens > 0
        stream = client.chat.completions.create(
            model="demo-openai",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        )
        text, usage = "", None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
        assert text
        assert usage is not None and usage.completion_tokens > 0
        comp = client.completions.create(model="demo-openai", prompt="x", max_tokens=3)
        assert comp.choices[0].finish_reason == "length"
    finally:
        client.close()


def test_cli_prints_its_url_when_ready(spawn: Any, demo_tokenizer: Path) -> None:
    argv = [sys.executable, "-m", "supervisor.demo.server", "--port", "0"]
    argv += ["--tokenizer", str(demo_tokenizer), "--mean-tokens", "30", "--price-in", "1"]
    argv += ["--price-out", "3", "--error-429", "0", "--seed", "9", "--decode-tps", "0"]
    proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    usage = _chat(url).json()["usage"]
    assert usage["cost"] > 0
    proc.terminate()
    assert proc.wait(15) in (0, -15)  # uvicorn re-raises the SIGTERM it handled gracefully
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/models")


def test_usage_can_be_omitted_or_misreported(mock_server: Any) -> None:
    bare = mock_server(mean_tokens=30, omit_usage=True)
    data = _chat(bare.url, return_token_ids=True).json()
    assert "usage" not in data
    assert data["choices"][0]["token_ids"]
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    assert all("usage" not in c for c in _sse(bare.url, "/chat/completions", body)[:-1])
    liar = mock_server(mean_tokens=30, usage_scale=2.0)
    data = _chat(liar.url, return_token_ids=True).json()
    assert data["usage"]["completion_tokens"] == 2 * len(data["choices"][0]["token_ids"])


def test_streamed_prompt_token_ids_come_with_the_first_chunk(mock_server: Any) -> None:
    h = mock_server(mean_tokens=30)
    body = {**CHAT, "stream": True, "return_token_ids": True}
    events = _sse(h.url, "/chat/completions", body)
    whole = _chat(h.url, return_token_ids=True).json()
    assert events[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in events[1:-1])
