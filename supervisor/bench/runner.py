"""The timed requests of a bench, level by level, and ``run_bench``, the one call front ends use.

The tool must never be the bottleneck of what it measures, so the hot path is lean:

- every request body is encoded once, and each prompt's ``httpx.Request`` is built once and sent
  again and again;
- each worker owns an ``httpx.AsyncClient`` with a pool of one connection (the pools together are
  sized to the concurrency). httpcore's pool scans every connection it holds on every request, so
  one shared pool of C connections costs O(C) per request; C pools of one keep it O(1);
- responses are decoded by a typed ``msgspec`` decoder that skips every field it does not need;
- token counting with the tokenizer, percentiles and cost happen after the timed window.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import ssl
import time
from collections.abc import Callable, Sequence
from datetime import timezone
from typing import TYPE_CHECKING, Any

import msgspec

from supervisor.bench.history import append_history
from supervisor.bench.prompts import Prompt, prompts_for
from supervisor.bench.results import BenchResult, FailureKind, LevelResult
from supervisor.bench.stats import level_cost, percentiles_ms, token_check
from supervisor.bench.target import Target, api_key, mask, mask_url, resolve_target
from supervisor.bench.wire import (
    Done,
    Models,
    Response,
    Usage,
    decode_models,
    decode_response,
    text_of,
)
from supervisor.config import Config
from supervisor.errors import EndpointError, UsageError

if TYPE_CHECKING:
    import httpx

ProgressFn = Callable[[int, int], None]
"""Called with (requests finished, requests in the whole bench), at most every
``PROGRESS_INTERVAL_S`` and once at the end of each level. Runs on the bench's event loop."""

PROGRESS_INTERVAL_S = 0.1
WARMUP_MAX_TOKENS = 8


class Options(msgspec.Struct, kw_only=True):
    """How to bench."""

    requests: int = 100
    """Requests per concurrency level (warm-up not included)."""
    concurrency: list[int] = []
    """Concurrency levels (default: the endpoint's ``concurrency``, else 8)."""
    stream: bool = False
    stream_usage: bool = True
    """Ask for usage in the last streamed chunk (``stream_options.include_usage``)."""
    warmup: bool = True
    """Before each level, one short request per worker (opens every connection)."""
    timeout_s: float = 600.0
    max_retries: int = 3
    """Retries of a request after a 429, 5xx, timeout or connection error."""
    backoff_s: float = 0.5
    """First wait before retrying a 5xx/timeout/connection error without Retry-After (doubles)."""
    max_wait_s: float = 120.0
    """Longest wait honoured from a Retry-After header."""


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - time.time())


def _kind_of_status(status: int) -> FailureKind:
    if status == 429:
        return "429"
    if status >= 500:
        return "5xx"
    return "4xx"


class _Level:
    """State of one concurrency level while it runs."""

    __slots__ = ("done", "failed", "gave_up", "next", "retry_wait", "total")

    def __init__(self, total: int) -> None:
        self.total = total
        self.next = 0
        self.done: list[Done] = []
        self.failed: dict[str, int] = {}
        self.gave_up = 0
        self.retry_wait = 0.0


class Bench:
    """A prepared bench: clients, encoded requests, options. ``await bench.run()`` measures.

    ``transport_factory`` (tests) wraps or replaces the transport of each worker's client.
    """

    def __init__(
        self,
        target: Target,
        prompts: Sequence[Prompt],
        options: Options,
        *,
        key: str | None = None,
        tokenizer: Any = None,
        progress: ProgressFn | None = None,
        prompts_source: str = "",
        transport_factory: Callable[[], httpx.AsyncBaseTransport] | None = None,
    ) -> None:
        if not prompts:
            raise UsageError("no prompts to send")
        if options.requests < 1:
            raise UsageError("--requests must be at least 1")
        if not options.concurrency:
            options = msgspec.structs.replace(options, concurrency=[target.concurrency or 8])
        if min(options.concurrency) < 1:
            raise UsageError("--concurrency must be positive integers")
        self.target = target
        self.prompts = list(prompts)
        self.options = options
        self._key = key
        self.tokenizer = tokenizer
        self.progress = progress
        self.prompts_source = prompts_source
        self._transport_factory = transport_factory
        self._clients: list[httpx.AsyncClient] = []
        self.model = target.model

    # ------------------------------------------------------------------ helpers

    def _masked(self, text: str) -> str:
        return mask(text, [self._key])

    def _key_hint(self) -> str:
        if self.target.api_key_env:
            return f"check the API key in ${self.target.api_key_env}"
        return "the endpoint wants an API key: set api_key_env in the config (or --api-key-env)"

    def _new_client(self, connections: int) -> httpx.AsyncClient:
        import httpx

        headers = {"content-type": "application/json"}
        if self._key:
            headers["authorization"] = f"Bearer {self._key}"
        t = self.options.timeout_s
        timeout = httpx.Timeout(t, connect=min(t, 30.0))
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        if self._transport_factory is not None:
            return httpx.AsyncClient(
                headers=headers, timeout=timeout, transport=self._transport_factory()
            )
        return httpx.AsyncClient(
            headers=headers, timeout=timeout, limits=limits, verify=self._ssl_context()
        )

    _ssl: ssl.SSLContext | None = None

    def _ssl_context(self) -> ssl.SSLContext:
        # One context for every client: building one per client would load the CA bundle C times.
        if self._ssl is None:
            try:
                import certifi

                self._ssl = ssl.create_default_context(cafile=certifi.where())
            except ImportError:  # pragma: no cover - certifi comes with httpx
                self._ssl = ssl.create_default_context()
        return self._ssl

    def _body(self, prompt: Prompt, max_tokens: int, stream: bool) -> bytes:
        assert self.model is not None
        body: dict[str, Any] = {
            "model": self.model,
            "messages": prompt.messages,
            "max_tokens": max_tokens,
        }
        if self.target.temperature is not None:
            body["temperature"] = self.target.temperature
        if stream:
            body["stream"] = True
            if self.options.stream_usage:
                body["stream_options"] = {"include_usage": True}
        return msgspec.json.encode(body)

    async def discover_model(self) -> str:
        """The target's model, else the first of ``GET /models``."""
        if self.model:
            return self.model
        import httpx

        client = self._new_client(1)
        url = f"{self.target.base_url}/models"
        try:
            resp = await client.get(url)
        except httpx.HTTPError as e:
            raise EndpointError(
                self._masked(f"cannot reach {mask_url(url)}: {type(e).__name__}: {e}"),
                "check the URL (it ends in /v1) and that the server is up",
            ) from None
        finally:
            await client.aclose()
        if resp.status_code in (401, 403):
            raise EndpointError(
                f"{mask_url(self.target.base_url)} refused the request ({resp.status_code})",
                self._key_hint(),
            )
        if resp.status_code != 200:
            raise EndpointError(
                self._masked(f"GET {mask_url(url)} answered {resp.status_code}"),
                "set `model` for the endpoint in the config",
            )
        try:
            models = decode_models(resp.content)
        except (msgspec.DecodeError, msgspec.ValidationError):
            models = Models()
        if not models.data:
            raise EndpointError(
                f"GET {mask_url(url)} lists no model", "set `model` for the endpoint in the config"
            )
        self.model = models.data[0].id
        return self.model

    # ------------------------------------------------------------------ running

    async def run(self) -> BenchResult:
        """Warm up and measure every concurrency level in turn."""
        import httpx

        started = time.time()
        await self.discover_model()
        opts = self.options
        result = BenchResult(
            endpoint=self.target.name,
            base_url=mask_url(self.target.base_url),
            model=self.model or "",
            kind=self.target.kind,
            time=started,
            stream=opts.stream,
            max_tokens=self.target.max_tokens,
            temperature=self.target.temperature,
            prompts=self.prompts_source,
            prompt_count=len(self.prompts),
        )
        used = self.prompts[: opts.requests]
        url = f"{self.target.base_url}/chat/completions"
        width = max(opts.concurrency)
        self._clients = [self._new_client(1) for _ in range(width)]
        try:
            first = self._clients[0]
            requests = [
                first.build_request(
                    "POST", url, content=self._body(p, self.target.max_tokens, opts.stream)
                )
                for p in used
            ]
            warm = [
                first.build_request("POST", url, content=self._body(p, WARMUP_MAX_TOKENS, False))
                for p in used[:width]
            ]
            total = opts.requests * len(opts.concurrency)
            finished_before = 0
            for c in opts.concurrency:
                if opts.warmup:
                    await self._warmup(min(c, opts.requests), warm)
                level = await self._level(c, requests, finished_before, total)
                finished_before += opts.requests
                result.levels.append(self._summarize(c, level))
        except httpx.HTTPError as e:  # pragma: no cover - every send path catches these
            raise EndpointError(self._masked(f"{type(e).__name__}: {e}")) from None
        finally:
            await self.aclose()
        return result

    async def aclose(self) -> None:
        clients, self._clients = self._clients, []
        for c in clients:
            await c.aclose()

    async def _warmup(self, c: int, warm: list[httpx.Request]) -> None:
        """One short request per worker; fails the bench when none gets an answer."""
        import httpx

        async def one(i: int) -> tuple[int | None, str]:
            try:
                resp = await self._clients[i].send(warm[i % len(warm)])
            except httpx.HTTPError as e:
                return None, f"{type(e).__name__}: {e}"
            return resp.status_code, resp.text[:200]

        answers = await asyncio.gather(*(one(i) for i in range(c)))
        if any(status == 200 for status, _ in answers):
            return
        status, detail = answers[0]
        url = mask_url(self.target.base_url)
        if status is None:
            raise EndpointError(
                self._masked(f"cannot reach {url}: {detail}"),
                "check the URL (it ends in /v1) and that the server is up",
            )
        if status in (401, 403):
            raise EndpointError(f"{url} refused the request ({status})", self._key_hint())
        if status in (429,) or status >= 500:
            return  # overloaded or flaky: the level measures and retries that
        raise EndpointError(
            self._masked(f"{url} answered {status}: {detail}"),
            "check the model name and that the endpoint speaks the OpenAI chat API",
        )

    async def _level(
        self, c: int, requests: list[httpx.Request], before: int, total: int
    ) -> tuple[_Level, float]:
        n = self.options.requests
        lv = _Level(n)
        progress = self.progress
        t_start = time.perf_counter()
        last_report = [t_start]

        def report(now: float) -> None:
            if progress is not None and now - last_report[0] >= PROGRESS_INTERVAL_S:
                last_report[0] = now
                progress(before + len(lv.done) + lv.gave_up, total)

        work = self._stream_worker if self.options.stream else self._worker
        # More workers than requests would only idle.
        workers = min(c, n)
        await asyncio.gather(
            *(work(self._clients[i], requests, lv, report) for i in range(workers))
        )
        wall = time.perf_counter() - t_start
        if progress is not None:
            progress(before + len(lv.done) + lv.gave_up, total)
        return lv, wall

    async def _retry_wait(self, lv: _Level, attempt: int, kind: str, after: float | None) -> bool:
        """Wait before retrying; False when the request must give up."""
        opts = self.options
        if attempt >= opts.max_retries:
            lv.gave_up += 1
            return False
        if after is not None:  # Retry-After, on a 429 or a 503
            wait = min(after, opts.max_wait_s)
        else:
            wait = min(opts.backoff_s * (2**attempt), opts.max_wait_s)
        lv.retry_wait += wait
        if wait > 0:
            await asyncio.sleep(wait)  # the server asked for this delay (or backoff policy)
        return True

    async def _worker(
        self,
        client: httpx.AsyncClient,
        requests: list[httpx.Request],
        lv: _Level,
        report: Callable[[float], None],
    ) -> None:
        import httpx

        perf = time.perf_counter
        decode = decode_response
        done = lv.done
        failed = lv.failed
        keep_text = self.tokenizer is not None
        nreq = len(requests)
        while lv.next < lv.total:
            i = lv.next
            lv.next = i + 1
            j = i % nreq
            req = requests[j]
            attempt = 0
            while True:
                after: float | None = None
                t0 = perf()
                try:
                    resp = await client.send(req)
                except httpx.TimeoutException:
                    kind = "timeout"
                except httpx.TransportError:
                    kind = "connection"
                except httpx.HTTPError:  # e.g. a body that cannot be decoded
                    kind = "invalid"
                else:
                    t1 = perf()
                    status = resp.status_code
                    if status == 200:
                        try:
                            r = decode(resp.content)
                        except (msgspec.DecodeError, msgspec.ValidationError):
                            kind = "invalid"
                        else:
                            u = r.usage
                            ch = r.choices[0] if r.choices else None
                            text: str | None = None
                            finish = None
                            if ch is not None:
                                finish = ch.finish_reason
                                if keep_text:
                                    text = ch.text if ch.text is not None else text_of(ch.message)
                            if u is None:
                                done.append(Done(t1 - t0, j, None, None, None, text, finish))
                            else:
                                done.append(
                                    Done(
                                        t1 - t0,
                                        j,
                                        u.prompt_tokens,
                                        u.completion_tokens,
                                        u.true_cost(),
                                        text,
                                        finish,
                                        cached_tokens=u.cached_tokens(),
                                    )
                                )
                            report(t1)
                            break
                    else:
                        kind = _kind_of_status(status)
                        after = _retry_after(resp.headers.get("retry-after"))
                        if kind == "4xx":
                            failed[kind] = failed.get(kind, 0) + 1
                            lv.gave_up += 1
                            break
                failed[kind] = failed.get(kind, 0) + 1
                if not await self._retry_wait(lv, attempt, kind, after):
                    break
                attempt += 1

    async def _stream_worker(
        self,
        client: httpx.AsyncClient,
        requests: list[httpx.Request],
        lv: _Level,
        report: Callable[[float], None],
    ) -> None:
        import httpx

        perf = time.perf_counter
        decode = decode_response
        nreq = len(requests)
        while lv.next < lv.total:
            i = lv.next
            lv.next = i + 1
            j = i % nreq
            req = requests[j]
            attempt = 0
            while True:
                after: float | None = None
                t0 = perf()
                try:
                    resp = await client.send(req, stream=True)
                    try:
                        status = resp.status_code
                        if status != 200:
                            await resp.aread()
                            kind = _kind_of_status(status)
                            after = _retry_after(resp.headers.get("retry-after"))
                            outcome: Done | None = None
                        else:
                            read = await self._read_stream(resp, t0, j, decode)
                            if isinstance(read, str):
                                kind, outcome = read, None
                            else:
                                outcome = read
                    finally:
                        await resp.aclose()
                except httpx.TimeoutException:
                    kind, outcome = "timeout", None
                except httpx.TransportError:
                    kind, outcome = "connection", None
                except httpx.HTTPError:  # e.g. a body that cannot be decoded
                    kind, outcome = "invalid", None
                if outcome is not None:
                    lv.done.append(outcome)
                    report(perf())
                    break
                lv.failed[kind] = lv.failed.get(kind, 0) + 1
                if kind == "4xx":
                    lv.gave_up += 1
                    break
                if not await self._retry_wait(lv, attempt, kind, after):
                    break
                attempt += 1

    async def _read_stream(
        self, resp: httpx.Response, t0: float, j: int, decode: Callable[[bytes], Response]
    ) -> Done | str:
        """Read an SSE stream. A failure is its kind: ``invalid`` (a chunk is not JSON) or
        ``connection`` (the stream ended before ``[DONE]`` and before a finish reason)."""
        perf = time.perf_counter
        pieces: list[str] = []
        gaps: list[float] = []
        ttft: float | None = None
        last = 0.0
        usage: Usage | None = None
        finish: str | None = None
        complete = False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                complete = True
                break
            try:
                chunk = decode(data.encode())
            except (msgspec.DecodeError, msgspec.ValidationError):
                return "invalid"
            if chunk.usage is not None:
                usage = chunk.usage
            for ch in chunk.choices:
                piece = ch.text if ch.text is not None else text_of(ch.delta)
                if ch.finish_reason:
                    finish = ch.finish_reason
                if piece:
                    now = perf()
                    if ttft is None:
                        ttft = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
                    pieces.append(piece)
        if not complete and finish is None:
            return "connection"
        t1 = perf()
        text = "".join(pieces)
        if usage is None:
            return Done(t1 - t0, j, None, None, None, text, finish, ttft, gaps)
        return Done(
            t1 - t0,
            j,
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.true_cost(),
            text,
            finish,
            ttft,
            gaps,
            usage.cached_tokens(),
        )

    # ------------------------------------------------------------------ summary

    def _summarize(self, c: int, measured: tuple[_Level, float]) -> LevelResult:
        lv, wall = measured
        done = lv.done
        out = LevelResult(
            concurrency=c,
            requests=lv.total,
            completed=len(done),
            failed=dict(sorted(lv.failed.items())),
            gave_up=lv.gave_up,
            wall_s=wall,
            retry_wait_s=lv.retry_wait,
        )
        check, completion = token_check(done, self.tokenizer)
        prompt_tokens = self._prompt_tokens(done)
        out.tokens = check
        out.completion_tokens = completion
        out.prompt_tokens = prompt_tokens
        latencies = sorted(d.latency for d in done)
        out.latency_ms = percentiles_ms(latencies)
        if self.options.stream:
            out.ttft_ms = percentiles_ms(sorted(d.ttft for d in done if d.ttft is not None))
            out.itl_ms = percentiles_ms(sorted(g for d in done if d.gaps for g in d.gaps))
            out.tpot_ms = percentiles_ms(
                sorted(
                    (d.latency - d.ttft) / (d.completion_tokens - 1)
                    for d in done
                    if d.ttft is not None and d.completion_tokens and d.completion_tokens > 1
                )
            )
        for d in done:
            key = d.finish or "none"
            out.finish_reasons[key] = out.finish_reasons.get(key, 0) + 1
        if wall > 0:
            out.req_per_s = len(done) / wall
            out.output_tok_per_s = completion / wall
            out.total_tok_per_s = (completion + prompt_tokens) / wall
            out.achieved_concurrency = math.fsum(latencies) / wall
        out.cost_usd, out.cost_source = level_cost(done, self.target, wall, self.tokenizer)
        return out

    def _prompt_tokens(self, done: list[Done]) -> int:
        total = sum(d.prompt_tokens for d in done if d.prompt_tokens is not None)
        missing = sum(1 for d in done if d.prompt_tokens is None)
        if missing and self.tokenizer is not None:
            # Without usage, the prompts' own text is the best measure (no chat template).
            from supervisor.tokens import count_tokens

            counts = count_tokens(self.tokenizer, [p.text for p in self.prompts])
            total += sum(counts[d.prompt] for d in done if d.prompt_tokens is None)
        return total


async def run_bench(
    config: Config | None,
    endpoint_or_url: str,
    *,
    prompts: str | None = None,
    options: Options | None = None,
    max_tokens: int | None = None,
    api_key_env: str | None = None,
    progress: ProgressFn | None = None,
    save: bool = True,
    tokenizer: Any = None,
) -> BenchResult:
    """Resolve the target and prompts from config, bench, and append the result to the history.

    The tokenizer is the config's (``tokenizer``) unless one is passed; without one, token counts
    come from ``usage`` only.
    """
    opts = options or Options()
    target = resolve_target(config, endpoint_or_url, max_tokens=max_tokens, api_key_env=api_key_env)
    key = api_key(target)
    prompt_list, source = prompts_for(config, prompts, target, opts.requests)
    if tokenizer is None and config is not None and config.tokenizer:
        from supervisor.tokens import load_tokenizer

        # Loading imports transformers (seconds): off the event loop, which may be a UI's.
        tokenizer = await asyncio.to_thread(
            load_tokenizer, config.tokenizer, config.trust_remote_code
        )
    bench = Bench(
        target,
        prompt_list,
        opts,
        key=key,
        tokenizer=tokenizer,
        progress=progress,
        prompts_source=source,
    )
    try:
        result = await bench.run()
    except EndpointError:
        raise
    except Exception as e:  # never let a key escape in an unexpected error's text
        raise EndpointError(mask(f"bench failed: {type(e).__name__}: {e}", [key])) from None
    if save:
        append_history(result)
    return result
