"""A mock OpenAI-compatible server: the "local GPU" and the "API" of the demo, and a bench target.

A Starlette app served by uvicorn on 127.0.0.1: ``GET /v1/models``, ``POST /v1/chat/completions``
and ``POST /v1/completions``, streamed (server-sent events in OpenAI's chunk shape) or not. The
official ``openai`` client works against it unchanged. Responses carry ``usage`` (with ``cost`` when
a price is set, as OpenRouter does), ``finish_reason`` ``length`` when ``max_tokens`` is hit, and
the generated token ids when the request sets ``return_token_ids`` (as vLLM does:
``choices[].token_ids`` and top-level ``prompt_token_ids``). The text is the decoding of the ids
with the demo tokenizer, so text and ids always agree. ``GET /mock/stats`` returns the server's
counters (requests by status, tokens, peak concurrency, paced tokens and seconds). ``GET /metrics``
publishes its real state as a serving engine does, in SGLang's Prometheus names (vLLM's with
``metrics="vllm"``): requests running and queued, KV use, prompt and generation token counters,
the generation throughput and a time-to-first-token histogram. A chat request
with ``chat_template_kwargs.enable_thinking`` gets a ``reasoning_content`` (not streamed).

Knobs (:class:`MockSettings`): per-request decode speed, a total capacity shared by concurrent
requests (like a saturated GPU server: the aggregate output rate never exceeds it), a seeded
log-normal response-length distribution, latency before the first token, and injected faults (429
with Retry-After, 500, connection reset mid-body) at given rates. With no decode speed and no
capacity set, responses are answered at once (the bench's fast path).

Run alone: ``python -m supervisor.demo.server --port 8000 --decode-tps 50 --capacity-tps 800``;
it prints its base URL (ending in ``/v1``) when ready. In-process: ``serve_in_thread(settings)``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import itertools
import logging
import math
import os
import random
import socket
import sys
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import msgspec

from supervisor.demo.tokenizer import DemoVocab
from supervisor.extras import require

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_TABLE_TOKENS = 1 << 15
"""Length of the precomputed token table responses are sliced from (also the longest response)."""


@dataclass(kw_only=True)
class MockSettings:
    """The knobs of a mock server. Every field has a sensible default."""

    decode_tps: float = 0.0
    """Output tokens per second of one request; 0 = no per-request limit."""
    capacity_tps: float = 0.0
    """Output tokens per second of the whole server, shared fairly by the requests in flight;
    0 = unlimited. With both speeds 0 every response is answered at once."""
    mean_tokens: int = 3500
    """Mean of the (log-normal) response-length distribution, in tokens."""
    length_sigma: float = 0.6
    """Spread of the response-length distribution (sigma of the underlying normal)."""
    seed: int = 0
    """Seed of lengths, token ids and fault draws (a request's own ``seed`` makes it repeatable)."""
    error_429: float = 0.0
    """Fraction of requests answered 429 Too Many Requests, with a Retry-After header."""
    error_500: float = 0.0
    """Fraction of requests answered 500."""
    error_reset: float = 0.0
    """Fraction of requests whose connection is closed in the middle of the response body."""
    retry_after: float = 1.0
    """Seconds sent in the Retry-After header of a 429."""
    latency_s: float = 0.0
    """Seconds before the first token (queueing plus prefill)."""
    price_in: float | None = None
    """USD per million prompt tokens; with price_out, adds ``usage.cost``."""
    price_out: float | None = None
    """USD per million completion tokens."""
    model: str = "demo-model"
    """The model id served (any requested model name is accepted)."""
    api_key: str | None = field(default=None, repr=False)
    """When set, requests must carry ``Authorization: Bearer <key>`` (401 otherwise)."""
    tokenizer: str | None = None
    """Demo tokenizer directory (default: built on first use under the cache dir)."""
    host: str = "127.0.0.1"
    port: int = 0
    """0 = a free port."""
    stream_chunk_tokens: int = 16
    """Tokens per streamed chunk when output is not paced."""
    tick_s: float = 0.05
    """Scheduling interval of paced output."""
    omit_usage: bool = False
    """Answer without ``usage`` (as some servers do), so clients must count tokens themselves."""
    usage_scale: float = 1.0
    """Report ``completion_tokens`` times this (1.0 = the truth), to test disagreement checks."""
    max_running: int = 0
    """Requests decoded at once; more wait in a queue (0 = no limit)."""
    kv_tokens: int = 65536
    """Tokens the mock's KV cache holds (its ``token_usage`` is the generated tokens of the
    requests in flight over this)."""
    metrics: str = "sglang"
    """Names of ``GET /metrics``: ``sglang``, ``vllm``, or ``none`` (404, as SGLang without
    ``--enable-metrics``)."""


TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, math.inf)
"""Upper bounds of the time-to-first-token histogram, in seconds."""
_REQUEST_START: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "request_start", default=None
)
"""When the request being served was admitted (its first token is timed from there)."""

_STATUS_NAMES = {0: "reset", 499: "client-gone"}
"""Pseudo statuses in the counters: connections the mock reset, requests abandoned by clients."""


class _Stats:
    """Counters of a running server, readable from any thread (plain ints, GIL-atomic updates)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.requests = 0
        self.by_status: dict[int, int] = {}
        self.resets = 0
        self.completion_tokens = 0
        self.prompt_tokens = 0
        self.active = 0
        self.peak_active = 0
        self.paced_tokens = 0
        """Tokens produced by the pacing scheduler (never more than capacity x paced time)."""
        self.paced_seconds = 0.0
        """Seconds the pacing scheduler has been busy."""
        self.queued = 0
        """Requests waiting for a slot (``max_running``)."""
        self.prefill_tokens = 0
        """Prompt tokens of every request admitted (counted when it starts, as a server does)."""
        self.throughput = 0.0
        """Generated tokens/s, smoothed over a few seconds."""
        self.ttft = [0] * len(TTFT_BUCKETS)
        """Requests per time-to-first-token bucket (not cumulative)."""
        self.ttft_sum = 0.0
        self.ttft_count = 0

    def observe_ttft(self, seconds: float) -> None:
        for i, le in enumerate(TTFT_BUCKETS):
            if seconds <= le:
                self.ttft[i] += 1
                break
        self.ttft_sum += seconds
        self.ttft_count += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "uptime_s": time.monotonic() - self.started,
            "requests": self.requests,
            "by_status": {
                _STATUS_NAMES.get(k, str(k)): v for k, v in sorted(self.by_status.items())
            },
            "resets": self.resets,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens": self.prompt_tokens,
            "active": self.active,
            "peak_active": self.peak_active,
            "paced_tokens": self.paced_tokens,
            "paced_seconds": self.paced_seconds,
        }


class _Job:
    __slots__ = ("credit", "done", "event", "want")

    def __init__(self, want: int) -> None:
        self.want = want
        self.done = 0
        self.credit = 0.0
        self.event = asyncio.Event()


class _Decoder:
    """Paces output like a GPU server: each request at most ``decode_tps``, all together at most
    ``capacity_tps``, shared by water-filling (short requests get their need, the rest split
    evenly)."""

    def __init__(self, settings: MockSettings, stats: _Stats) -> None:
        self.decode_tps = max(0.0, settings.decode_tps)
        self.capacity_tps = max(0.0, settings.capacity_tps)
        self.tick = max(0.005, settings.tick_s)
        self.stats = stats
        self.jobs: set[_Job] = set()
        self._task: asyncio.Task[None] | None = None

    @property
    def paced(self) -> bool:
        return self.decode_tps > 0 or self.capacity_tps > 0

    async def produce(self, n: int) -> AsyncGenerator[int, None]:
        """Yield how many more of the ``n`` tokens are ready, until all ``n`` are."""
        started = _REQUEST_START.get()
        if not self.paced or n <= 0:
            if n > 0:
                if started is not None:
                    self.stats.observe_ttft(time.monotonic() - started)
                yield n
            return
        job = _Job(n)
        self.jobs.add(job)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            given = 0
            while given < n:
                await job.event.wait()
                job.event.clear()
                if job.done > given:
                    if given == 0 and started is not None:
                        self.stats.observe_ttft(time.monotonic() - started)
                    new, given = job.done - given, job.done
                    yield new
        finally:
            self.jobs.discard(job)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while self.jobs:
            await asyncio.sleep(self.tick)  # pacing the output, not synchronisation
            now = loop.time()
            dt, last = min(now - last, 1.0), now
            self.stats.paced_seconds += dt
            before = self.stats.paced_tokens
            self._allot(dt)
            if dt > 0:
                # A 2-second moving average, as a server's throughput gauge is.
                alpha = min(1.0, dt / 2.0)
                rate = (self.stats.paced_tokens - before) / dt
                self.stats.throughput += alpha * (rate - self.stats.throughput)
        self.stats.throughput = 0.0

    def _allot(self, dt: float) -> None:
        cap = self.decode_tps * dt if self.decode_tps > 0 else math.inf
        left = self.capacity_tps * dt if self.capacity_tps > 0 else math.inf
        needs = sorted(
            ((min(cap, j.want - j.done - j.credit), j) for j in self.jobs),
            key=lambda nj: nj[0],
        )
        for i, (need, job) in enumerate(needs):
            share = left / (len(needs) - i)
            give = max(0.0, min(need, share))
            left -= give
            job.credit += give
            whole = int(job.credit + 1e-9)
            if whole > 0:
                whole = min(whole, job.want - job.done)
                job.credit = max(0.0, job.credit - whole)
                job.done += whole
                self.stats.paced_tokens += whole
                job.event.set()


class _Generation(msgspec.Struct):
    ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    prompt_text: str


_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class MockState:
    """Everything the app shares: settings, vocabulary, token table, scheduler, counters."""

    def __init__(self, settings: MockSettings) -> None:
        self.settings = settings
        vocab_dir = Path(settings.tokenizer) if settings.tokenizer else None
        self.vocab = DemoVocab(vocab_dir)
        self.rng = random.Random(settings.seed)
        self.stats = _Stats()
        self.decoder = _Decoder(settings, self.stats)
        self.ids = itertools.count(1)
        table_rng = random.Random(f"table:{settings.seed}")
        base = self.vocab.random_ids(table_rng, _TABLE_TOKENS)
        # The table twice over, so any window of up to _TABLE_TOKENS ids is one slice.
        self.table = base + base
        offsets = [0]
        total = 0
        for i in self.table:
            total += len(self.vocab.pieces[i])
            offsets.append(total)
        self.offsets = offsets
        self.table_text = "".join(self.vocab.pieces[i] for i in self.table)
        mean = max(1.0, float(settings.mean_tokens))
        sigma = max(0.0, settings.length_sigma)
        self.mu = math.log(mean) - sigma * sigma / 2
        self.sigma = sigma
        self.count_prompt = lru_cache(maxsize=8192)(self.vocab.count)
        if settings.api_key:
            self.auth: bytes | None = f"Bearer {settings.api_key}".encode()
        else:
            self.auth = None
        self._slots: asyncio.Semaphore | None = None

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """A decoding slot (``max_running``); the request waits in the queue until one frees."""
        if self.settings.max_running <= 0:
            yield
            return
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.settings.max_running)
        self.stats.queued += 1
        try:
            await self._slots.acquire()
        finally:
            self.stats.queued -= 1
        try:
            yield
        finally:
            self._slots.release()

    def metrics_text(self) -> str:
        """The server's state in Prometheus text format, in SGLang's (or vLLM's) names."""
        st, vllm = self.stats, self.settings.metrics == "vllm"
        kv = sum(j.done for j in self.decoder.jobs) / max(1, self.settings.kv_tokens)
        generated = st.paced_tokens if self.decoder.paced else st.completion_tokens
        label = f'{{model_name="{self.settings.model}"}}'
        if vllm:
            names = [
                ("vllm:num_requests_running", "gauge", st.active),
                ("vllm:num_requests_waiting", "gauge", st.queued),
                ("vllm:kv_cache_usage_perc", "gauge", kv),
                ("vllm:prompt_tokens_total", "counter", st.prefill_tokens),
                ("vllm:generation_tokens_total", "counter", generated),
            ]
            ttft = "vllm:time_to_first_token_seconds"
        else:
            names = [
                ("sglang:num_running_reqs", "gauge", st.active),
                ("sglang:num_queue_reqs", "gauge", st.queued),
                ("sglang:token_usage", "gauge", kv),
                ("sglang:gen_throughput", "gauge", st.throughput),
                ("sglang:cache_hit_rate", "gauge", 0.0),
                ("sglang:prompt_tokens_total", "counter", st.prefill_tokens),
                ("sglang:generation_tokens_total", "counter", generated),
            ]
            ttft = "sglang:time_to_first_token_seconds"
        lines = []
        for name, kind, value in names:
            family = name[: -len("_total")] if kind == "counter" else name
            lines += [f"# TYPE {family} {kind}", f"{name}{label} {float(value)!r}"]
        lines.append(f"# TYPE {ttft} histogram")
        cumulative = 0
        model = self.settings.model
        for le, n in zip(TTFT_BUCKETS, st.ttft, strict=True):
            cumulative += n
            bound = "+Inf" if math.isinf(le) else repr(le)
            lines.append(f'{ttft}_bucket{{le="{bound}",model_name="{model}"}} {cumulative}.0')
        lines.append(f"{ttft}_sum{label} {st.ttft_sum!r}")
        lines.append(f"{ttft}_count{label} {st.ttft_count}.0")
        return "\n".join(lines) + "\n"

    def generate(self, body: dict[str, Any], prompt_text: str) -> _Generation:
        rng = self.rng
        req_seed = body.get("seed")
        if isinstance(req_seed, int):
            rng = random.Random(f"{self.settings.seed}:{req_seed}:{prompt_text}")
        n = (
            int(rng.lognormvariate(self.mu, self.sigma))
            if self.sigma > 0
            else int(math.exp(self.mu))
        )
        n = min(max(1, n), _TABLE_TOKENS)
        finish = "stop"
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if isinstance(limit, int) and limit > 0 and (body.get("ignore_eos") or n >= limit):
            n, finish = min(limit, _TABLE_TOKENS), "length"
        off = rng.randrange(_TABLE_TOKENS)
        ids = self.table[off : off + n]
        text = self.table_text[self.offsets[off] : self.offsets[off + n]]
        return _Generation(ids, text, finish, self.count_prompt(prompt_text), prompt_text)

    def usage(self, gen: _Generation, completion_tokens: int) -> dict[str, Any]:
        if self.settings.usage_scale != 1.0:
            completion_tokens = round(completion_tokens * self.settings.usage_scale)
        usage: dict[str, Any] = {
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": gen.prompt_tokens + completion_tokens,
        }
        s = self.settings
        if s.price_in is not None or s.price_out is not None:
            usage["cost"] = (
                gen.prompt_tokens * (s.price_in or 0.0) + completion_tokens * (s.price_out or 0.0)
            ) / 1e6
        return usage


def _error_body(message: str, kind: str, code: int | str | None = None) -> bytes:
    return _encode({"error": {"message": message, "type": kind, "param": None, "code": code}})


async def _send_json(send: Send, status: int, body: bytes, extra: list[Any] | None = None) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ConnectionError("client disconnected")
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _prompt_of_chat(body: dict[str, Any]) -> str | None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            return None
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(
                p.get("text", "")
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            return None
        parts.append(f"{m.get('role', 'user')}: {content}")
    return "\n".join(parts)


def _prompt_of_completion(body: dict[str, Any]) -> str | None:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


class _Models:
    def __init__(self, state: MockState) -> None:
        self.state = state
        model = {
            "id": state.settings.model,
            "object": "model",
            "created": 0,
            "owned_by": "runwatch",
        }
        self.body = _encode({"object": "list", "data": [model]})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _authorized(self.state, scope):
            await _send_json(send, 401, _error_body("invalid API key", "authentication_error", 401))
            return
        await _send_json(send, 200, self.body)


class _StatsEndpoint:
    def __init__(self, state: MockState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_json(send, 200, _encode(self.state.stats.as_dict()))


class _MetricsEndpoint:
    def __init__(self, state: MockState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.state.settings.metrics == "none":
            await _send_json(send, 404, _error_body("Not Found", "not_found", 404))
            return
        body = self.state.metrics_text().encode()
        headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _authorized(state: MockState, scope: Scope) -> bool:
    if state.auth is None:
        return True
    for name, value in scope["headers"]:
        if name == b"authorization":
            return bool(value == state.auth)
    return False


class _Completions:
    """``POST /v1/chat/completions`` (chat=True) and ``POST /v1/completions``."""

    def __init__(self, state: MockState, chat: bool) -> None:
        self.state = state
        self.chat = chat
        self.object = "chat.completion" if chat else "text_completion"
        self.prefix = "chatcmpl-" if chat else "cmpl-"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        stats = state.stats
        stats.requests += 1
        status = 0
        counted = False

        async def counting_send(message: Message) -> None:
            # Count before the last bytes leave, so a client that reads the counters right after
            # its response sees that response counted.
            nonlocal status, counted
            if message["type"] == "http.response.start":
                status = message["status"]
            elif not message.get("more_body", False) and not counted:
                counted = True
                stats.by_status[status] = stats.by_status.get(status, 0) + 1
            await send(message)

        unfinished = await self._handle(scope, receive, counting_send)
        if not counted:  # reset by the mock, or abandoned by the client
            stats.by_status[unfinished] = stats.by_status.get(unfinished, 0) + 1

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> int:
        state = self.state
        s = state.settings
        try:
            raw = await _read_body(receive)
        except ConnectionError:
            return 499
        if not _authorized(state, scope):
            await _send_json(send, 401, _error_body("invalid API key", "authentication_error", 401))
            return 401
        try:
            body = _decode(raw)
        except msgspec.DecodeError:
            await _send_json(send, 400, _error_body("body is not JSON", "invalid_request_error"))
            return 400
        if not isinstance(body, dict):
            await _send_json(
                send, 400, _error_body("body is not an object", "invalid_request_error")
            )
            return 400
        prompt = _prompt_of_chat(body) if self.chat else _prompt_of_completion(body)
        if prompt is None:
            what = "messages: a non-empty list" if self.chat else "prompt: a string"
            await _send_json(send, 400, _error_body(f"expected {what}", "invalid_request_error"))
            return 400
        if s.error_429 or s.error_500 or s.error_reset:
            r = state.rng.random()
            if r < s.error_429:
                retry = (b"retry-after", f"{s.retry_after:g}".encode())
                msg = _error_body("rate limited (injected by the mock)", "rate_limit_error", 429)
                await _send_json(send, 429, msg, [retry])
                return 429
            if r < s.error_429 + s.error_500:
                msg = _error_body("internal error (injected by the mock)", "server_error", 500)
                await _send_json(send, 500, msg)
                return 500
            reset = r < s.error_429 + s.error_500 + s.error_reset
        else:
            reset = False
        gen = state.generate(body, prompt)
        stream = bool(body.get("stream"))
        _REQUEST_START.set(time.monotonic())
        async with state.slot():
            return await self._admitted(body, gen, receive, send, reset, stream)

    async def _admitted(
        self,
        body: dict[str, Any],
        gen: _Generation,
        receive: Receive,
        send: Send,
        reset: bool,
        stream: bool,
    ) -> int:
        state = self.state
        s = state.settings
        stats = state.stats
        stats.active += 1
        stats.peak_active = max(stats.peak_active, stats.active)
        stats.prefill_tokens += gen.prompt_tokens
        try:
            if s.latency_s > 0:
                await asyncio.sleep(s.latency_s)  # the mock's time to first token
            if stream:
                return await self._stream(body, gen, receive, send, reset)
            return await self._whole(body, gen, receive, send, reset)
        finally:
            stats.active -= 1

    def _message(self, body: dict[str, Any], gen: _Generation) -> dict[str, Any]:
        """The assistant message; with ``chat_template_kwargs.enable_thinking`` (as SGLang with a
        reasoning parser) the first quarter of the tokens is its ``reasoning_content``."""
        kwargs = body.get("chat_template_kwargs")
        if not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is True):
            return {"role": "assistant", "content": gen.text}
        k = max(1, len(gen.ids) // 4) if len(gen.ids) > 1 else 0
        pieces = self.state.vocab.pieces
        reasoning = "".join(pieces[i] for i in gen.ids[:k])
        return {
            "role": "assistant",
            "content": gen.text[len(reasoning) :],
            "reasoning_content": reasoning,
        }

    def _choice_extra(self, body: dict[str, Any], ids: list[int]) -> dict[str, Any]:
        return {"token_ids": ids} if body.get("return_token_ids") else {}

    async def _whole(
        self, body: dict[str, Any], gen: _Generation, receive: Receive, send: Send, reset: bool
    ) -> int:
        state = self.state
        n = len(gen.ids)
        if state.decoder.paced:
            produced = await _until_done_or_gone(state.decoder.produce(n), receive)
            if produced < n:
                return 499  # the client went away; its share of capacity is free again
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": self._message(body, gen),
                "logprobs": None,
                "finish_reason": gen.finish_reason,
            }
        else:
            choice = {
                "index": 0,
                "text": gen.text,
                "logprobs": None,
                "finish_reason": gen.finish_reason,
            }
        choice.update(self._choice_extra(body, gen.ids))
        out: dict[str, Any] = {
            "id": f"{self.prefix}{next(state.ids):012x}",
            "object": self.object,
            "created": int(time.time()),
            "model": state.settings.model,
            "choices": [choice],
        }
        if not state.settings.omit_usage:
            out["usage"] = state.usage(gen, n)
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = state.vocab.tokenizer.encode(
                gen.prompt_text, add_special_tokens=False
            ).ids
        payload = _encode(out)
        if reset:
            state.stats.resets += 1
            await _send_partial(send, payload)
            return 0
        state.stats.completion_tokens += n
        state.stats.prompt_tokens += gen.prompt_tokens
        await _send_json(send, 200, payload)
        return 200

    async def _stream(
        self, body: dict[str, Any], gen: _Generation, receive: Receive, send: Send, reset: bool
    ) -> int:
        state = self.state
        s = state.settings
        cid = f"{self.prefix}{next(state.ids):012x}"
        created = int(time.time())
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        want_ids = bool(body.get("return_token_ids"))
        opts = body.get("stream_options")
        include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))

        def chunk(
            choice: dict[str, Any] | None,
            usage: dict[str, Any] | None = None,
            extra: dict[str, Any] | None = None,
        ) -> bytes:
            c: dict[str, Any] = {"id": cid, "object": obj, "created": created, "model": s.model}
            c["choices"] = [choice] if choice is not None else []
            if usage is not None:
                c["usage"] = usage
            if extra:
                c.update(extra)
            return b"data: " + _encode(c) + b"\n\n"

        def piece(a: int, b: int, finish: str | None) -> dict[str, Any]:
            text = gen.text[state_offsets[a] : state_offsets[b]]
            choice: dict[str, Any]
            if self.chat:
                choice = {"index": 0, "delta": {"content": text}, "logprobs": None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None}
            choice["finish_reason"] = finish
            if want_ids:
                choice["token_ids"] = gen.ids[a:b]
            return choice

        # Character offsets of each token inside gen.text, to cut deltas on token boundaries.
        pieces = state.vocab.pieces
        state_offsets = [0]
        acc = 0
        for i in gen.ids:
            acc += len(pieces[i])
            state_offsets.append(acc)

        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        first: dict[str, Any]
        if self.chat:
            first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
            first["finish_reason"] = None
            extra = None
            if want_ids:  # vLLM sends the prompt's ids once, with the first chunk
                ids = state.vocab.tokenizer.encode(gen.prompt_text, add_special_tokens=False).ids
                extra = {"prompt_token_ids": ids}
            data = chunk(first, extra=extra)
            await send({"type": "http.response.body", "body": data, "more_body": True})
        n = len(gen.ids)
        if reset:
            # Part of the answer, then the connection goes away (mid-body).
            await send(
                {
                    "type": "http.response.body",
                    "body": chunk(piece(0, min(n, 1), None))[:-3],
                    "more_body": True,
                }
            )
            state.stats.resets += 1
            return 0
        sent = 0
        step = max(1, s.stream_chunk_tokens)
        paced = state.decoder.paced
        gone = asyncio.get_running_loop().create_task(_wait_disconnect(receive)) if paced else None
        try:
            async with contextlib.aclosing(state.decoder.produce(n)) as ready_tokens:
                async for ready in ready_tokens:
                    if gone is not None and gone.done():
                        return 499  # the client went away; its share of capacity is free again
                    upto = sent + ready
                    while sent < upto:
                        b = upto if paced else min(upto, sent + step)
                        data = chunk(piece(sent, b, None))
                        await send({"type": "http.response.body", "body": data, "more_body": True})
                        sent = b
        finally:
            if gone is not None:
                gone.cancel()
        if self.chat:
            last: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": None}
        else:
            last = {"index": 0, "text": "", "logprobs": None}
        last["finish_reason"] = gen.finish_reason
        tail = chunk(last)
        if include_usage and not s.omit_usage:
            tail += chunk(None, state.usage(gen, n))
        tail += b"data: [DONE]\n\n"
        state.stats.completion_tokens += n
        state.stats.prompt_tokens += gen.prompt_tokens
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return 200


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _until_done_or_gone(tokens: AsyncGenerator[int, None], receive: Receive) -> int:
    """Consume the paced token stream; stop early (returning fewer) when the client disconnects."""
    produced = 0

    async def consume() -> None:
        nonlocal produced
        async for k in tokens:
            produced += k

    loop = asyncio.get_running_loop()
    work = loop.create_task(consume())
    gone = loop.create_task(_wait_disconnect(receive))
    try:
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (work, gone):
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        await tokens.aclose()
    return produced


async def _send_partial(send: Send, payload: bytes) -> None:
    """Announce the whole body, send half of it, and return: uvicorn then closes the connection."""
    headers = [*_JSON_HEADERS, (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send(
        {"type": "http.response.body", "body": payload[: len(payload) // 2], "more_body": True}
    )


class _QuietResets(logging.Filter):
    """Drop uvicorn's complaint about the connections the mock resets on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "returned without completing response" not in record.getMessage()


def build_app(settings: MockSettings, on_startup: Callable[[], None] | None = None) -> Any:
    """The Starlette app of a mock server (``app.state.mock`` is its :class:`MockState`)."""
    Starlette = require("starlette.applications", "the demo's mock server", "demo").Starlette
    Route = require("starlette.routing", "the demo's mock server", "demo").Route

    state = MockState(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        if on_startup is not None:
            on_startup()
        yield

    routes = [
        Route("/v1/models", _Models(state), methods=["GET"]),
        Route("/v1/chat/completions", _Completions(state, chat=True), methods=["POST"]),
        Route("/v1/completions", _Completions(state, chat=False), methods=["POST"]),
        Route("/mock/stats", _StatsEndpoint(state), methods=["GET"]),
        Route("/metrics", _MetricsEndpoint(state), methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.mock = state
    return app


def _bind(host: str, port: int) -> socket.socket:
    # proto=IPPROTO_TCP: asyncio turns Nagle off only on sockets that say they are TCP, and small
    # header/body writes under Nagle wait 40 ms for the peer's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    # Listening now means clients may connect before the event loop accepts: they just queue.
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def _uvicorn_server(app: Any) -> Any:
    uvicorn = require("uvicorn", "the demo's mock server", "demo")

    log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietResets) for f in log.filters):
        log.addFilter(_QuietResets())
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        log_level="warning",
        lifespan="on",
        http="h11",
        ws="none",
        loop="asyncio",
        timeout_graceful_shutdown=2,
        backlog=2048,
    )
    return uvicorn.Server(config)


class MockServerHandle:
    """A mock server running in a background thread. ``url`` ends in ``/v1``; ``stop()`` ends it
    and frees the port (also on leaving a ``with`` block)."""

    def __init__(self, settings: MockSettings, start_timeout: float = 30.0) -> None:
        self.settings = settings
        started = threading.Event()
        self.app = build_app(settings, on_startup=started.set)
        self.state: MockState = self.app.state.mock
        self._sock = _bind(settings.host, settings.port)
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://{settings.host}:{self.port}/v1"
        self._server = _uvicorn_server(self.app)
        self._error: BaseException | None = None

        def target() -> None:
            try:
                self._server.run(sockets=[self._sock])
            except BaseException as e:  # reported by the thread that started us
                self._error = e
            finally:
                started.set()

        self._thread = threading.Thread(target=target, name=f"mock-server-{self.port}", daemon=True)
        self._thread.start()
        if (
            not started.wait(start_timeout)
            or self._error is not None
            or not self._thread.is_alive()
        ):
            self.stop()
            raise RuntimeError(f"mock server on port {self.port} did not start: {self._error!r}")

    def stats(self) -> dict[str, Any]:
        """The server's counters (requests, statuses, tokens, peak concurrency...)."""
        return self.state.stats.as_dict()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving, cancel requests still in flight, and close the port."""
        self._server.should_exit = True
        self._thread.join(timeout / 2)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout / 2)
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> MockServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(settings: MockSettings | None = None, **knobs: Any) -> MockServerHandle:
    """Start a mock server in a background thread; ``knobs`` override fields of ``settings``."""
    base = settings if settings is not None else MockSettings()
    return MockServerHandle(replace(base, **knobs) if knobs else base)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m supervisor.demo.server",
        description="Mock OpenAI-compatible server (runwatch demo); prints its URL when ready.",
    )
    d = MockSettings()
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=8000, help="0 = a free port (default 8000)")
    p.add_argument("--decode-tps", type=float, default=d.decode_tps, help="tokens/s per request")
    p.add_argument("--capacity-tps", type=float, default=d.capacity_tps, help="tokens/s in total")
    p.add_argument("--mean-tokens", type=int, default=d.mean_tokens, help="mean response length")
    p.add_argument("--length-sigma", type=float, default=d.length_sigma)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--error-429", type=float, default=d.error_429, help="fraction answered 429")
    p.add_argument("--error-500", type=float, default=d.error_500, help="fraction answered 500")
    p.add_argument("--error-reset", type=float, default=d.error_reset, help="fraction reset")
    p.add_argument("--retry-after", type=float, default=d.retry_after)
    p.add_argument("--latency", type=float, default=d.latency_s, help="seconds to first token")
    p.add_argument("--price-in", type=float, default=None, help="USD per million prompt tokens")
    p.add_argument("--price-out", type=float, default=None, help="USD per million output tokens")
    p.add_argument("--model", default=d.model)
    p.add_argument("--tokenizer", default=None, help="demo tokenizer directory")
    p.add_argument("--omit-usage", action="store_true", help="answer without usage")
    p.add_argument("--usage-scale", type=float, default=1.0, help="misreport completion tokens")
    p.add_argument("--max-running", type=int, default=0, help="requests decoded at once")
    p.add_argument(
        "--metrics",
        choices=("sglang", "vllm", "none"),
        default=d.metrics,
        help="names of GET /metrics (none: answer 404, as SGLang without --enable-metrics)",
    )
    p.add_argument(
        "--api-key-env",
        default=None,
        help="require the key held by this environment variable (the key is never an argument)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            print(f"environment variable {args.api_key_env} is not set", file=sys.stderr)
            return 2
    settings = MockSettings(
        decode_tps=args.decode_tps,
        capacity_tps=args.capacity_tps,
        mean_tokens=args.mean_tokens,
        length_sigma=args.length_sigma,
        seed=args.seed,
        error_429=args.error_429,
        error_500=args.error_500,
        error_reset=args.error_reset,
        retry_after=args.retry_after,
        latency_s=args.latency,
        price_in=args.price_in,
        price_out=args.price_out,
        model=args.model,
        api_key=api_key,
        tokenizer=args.tokenizer,
        omit_usage=args.omit_usage,
        usage_scale=args.usage_scale,
        max_running=args.max_running,
        metrics=args.metrics,
        host=args.host,
        port=args.port,
    )
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
    try:
        sock = _bind(settings.host, settings.port)
    except OSError as e:
        print(f"cannot listen on {settings.host}:{settings.port}: {e.strerror}", file=sys.stderr)
        return 1
    url = f"http://{settings.host}:{sock.getsockname()[1]}/v1"

    def ready() -> None:
        print(url, flush=True)

    server = _uvicorn_server(build_app(settings, on_startup=ready))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it already handled gracefully
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
