"""Benchmark an OpenAI-compatible endpoint with the run's own prompts and request shape.

One bench sends ``requests`` chat completions at each concurrency level and reports, per level,
what completed, what failed (by kind: ``429``, ``5xx``, ``4xx``, ``timeout``, ``connection``,
``invalid``), request and token rates, latency percentiles (and TTFT / inter-token latency when
streaming), the concurrency actually achieved, tokens by ``usage`` and by the local tokenizer (their
disagreement flagged), and cost. Results are appended to ``<state_dir>/bench-history.jsonl``.

The tool must never be the bottleneck of what it measures, so the hot path is lean:

- every request body is encoded once, and each prompt's ``httpx.Request`` is built once and sent
  again and again;
- each worker owns an ``httpx.AsyncClient`` with a pool of one connection (the pools together are
  sized to the concurrency). httpcore's pool scans every connection it holds on every request, so
  one shared pool of C connections costs O(C) per request; C pools of one keep it O(1);
- responses are decoded by a typed ``msgspec`` decoder that skips every field it does not need;
- token counting with the tokenizer, percentiles and cost happen after the timed window.

The API key is read from the environment variable the config names, sent as
``Authorization: Bearer``, and masked (``***``) in every message this module produces.

For front ends (CLI, TUI), everything goes through:

- ``await run_bench(config, "endpoint-or-url", prompts=None, options=Options(requests=..,
  concurrency=[..], stream=..), progress=fn)`` -> :class:`BenchResult` (also appended to the
  history). ``fn(done, total)`` is a :data:`ProgressFn`, called on the bench's event loop;
- ``load_history()`` (oldest first) and ``latest_bench(endpoint, history)``;
- errors are ``EndpointError`` / ``UsageError`` / ``ConfigError`` with a message and a hint.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import os
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import msgspec

from supervisor.config import Config, EndpointConfig, RunConfig
from supervisor.errors import EndpointError, UsageError
from supervisor.paths import state_dir

if TYPE_CHECKING:
    import httpx

ProgressFn = Callable[[int, int], None]
"""Called with (requests finished, requests in the whole bench), at most every
``PROGRESS_INTERVAL_S`` and once at the end of each level. Runs on the bench's event loop."""

PROGRESS_INTERVAL_S = 0.1
HISTORY_FILE = "bench-history.jsonl"
DISAGREEMENT_THRESHOLD = 0.02
"""Relative difference between usage and tokenizer counts above which they are flagged."""
WARMUP_MAX_TOKENS = 8
DEFAULT_MAX_TOKENS = 512

FailureKind = str
"""One of ``429``, ``5xx``, ``4xx``, ``timeout``, ``connection``, ``invalid``."""


# --------------------------------------------------------------------------- results


class Percentiles(msgspec.Struct, kw_only=True):
    """Milliseconds."""

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


class TokenCheck(msgspec.Struct, kw_only=True):
    """Completion tokens as the server's ``usage`` says and as the local tokenizer counts them."""

    responses: int = 0
    with_usage: int = 0
    """Responses that carried ``usage.completion_tokens``."""
    usage_completion: int = 0
    """Sum of ``usage.completion_tokens`` over the responses that carried it."""
    tokenizer_completion: int | None = None
    """Tokenizer count of the same responses' text (None: no tokenizer)."""
    fallback_completion: int = 0
    """Tokenizer count of responses WITHOUT usage (what they are counted as)."""
    disagreement: float | None = None
    """(tokenizer - usage) / usage over the responses with usage."""
    mismatched_responses: int = 0
    """Responses whose own counts differ by more than the threshold."""
    flagged: bool = False
    note: str | None = None
    """One line for humans when something is off."""


class LevelResult(msgspec.Struct, kw_only=True):
    """What one concurrency level measured."""

    concurrency: int
    requests: int
    completed: int = 0
    failed: dict[str, int] = {}
    """Failed attempts by kind (a request retried after a 429 counts one ``429`` per attempt)."""
    gave_up: int = 0
    """Requests that never succeeded within the retry policy."""
    wall_s: float = 0.0
    req_per_s: float = 0.0
    output_tok_per_s: float = 0.0
    total_tok_per_s: float = 0.0
    latency_ms: Percentiles = msgspec.field(default_factory=Percentiles)
    """End-to-end latency of the attempt that succeeded."""
    ttft_ms: Percentiles | None = None
    itl_ms: Percentiles | None = None
    """Gaps between streamed chunks that carried text."""
    tpot_ms: Percentiles | None = None
    """Time per output token after the first: (latency - TTFT) / (completion tokens - 1)."""
    achieved_concurrency: float = 0.0
    """Sum of latencies / wall time: how many requests were really in flight on average."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    """Usage where the response had it, the tokenizer's count where it did not."""
    tokens: TokenCheck = msgspec.field(default_factory=TokenCheck)
    cost_usd: float | None = None
    cost_source: str | None = None
    """``usage.cost``, ``usage.cost + price table``, ``price table``, ``GPU time`` or None."""
    retry_wait_s: float = 0.0
    """Seconds spent waiting before retries (Retry-After or backoff)."""
    finish_reasons: dict[str, int] = {}


class BenchResult(msgspec.Struct, kw_only=True):
    """A whole bench: the ``--json`` output and one line of the history file."""

    endpoint: str
    base_url: str
    """Masked: no credentials or query string."""
    model: str
    kind: str = "unknown"
    time: float = 0.0
    """Unix time the bench started."""
    stream: bool = False
    max_tokens: int = 0
    temperature: float | None = None
    prompts: str = ""
    """Where the prompts came from."""
    prompt_count: int = 0
    levels: list[LevelResult] = []


# --------------------------------------------------------------------------- inputs


class Prompt(msgspec.Struct, kw_only=True, frozen=True):
    """One prompt: chat messages, and their text for counting tokens when usage is missing."""

    messages: list[dict[str, Any]]
    text: str


class Target(msgspec.Struct, kw_only=True):
    """The endpoint to bench and the shape of the requests (like the run's)."""

    name: str
    base_url: str
    kind: str = "unknown"
    model: str | None = None
    api_key_env: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    price_in_per_m: float | None = None
    price_out_per_m: float | None = None
    gpu_cost_per_hour: float | None = None
    concurrency: int | None = None


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


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def mask_url(url: str) -> str:
    """The URL without user:password and without a query string (keys hide there)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


def mask(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret replaced by ``***``."""
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


def resolve_target(
    config: Config | None,
    endpoint_or_url: str,
    *,
    max_tokens: int | None = None,
    api_key_env: str | None = None,
) -> Target:
    """The endpoint named in config, or a bare URL (matched to a configured endpoint if one has
    the same base URL, for its prices and request shape)."""
    ep: EndpointConfig | None = None
    if is_url(endpoint_or_url):
        if config is not None:
            want = endpoint_or_url.rstrip("/")
            ep = next((e for e in config.endpoints if e.base_url.rstrip("/") == want), None)
    else:
        if config is None:
            raise UsageError(
                f"{endpoint_or_url!r} is not a URL and no config was given",
                "pass -c CONFIG to bench a configured endpoint, or a URL ending in /v1",
            )
        ep = config.endpoint(endpoint_or_url)
    if ep is None:
        return Target(
            name=mask_url(endpoint_or_url),
            base_url=endpoint_or_url.rstrip("/"),
            api_key_env=api_key_env,
            max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
        )
    return Target(
        name=ep.name,
        base_url=ep.base_url.rstrip("/"),
        kind=ep.kind,
        model=ep.model,
        api_key_env=api_key_env or ep.api_key_env,
        max_tokens=max_tokens or ep.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=ep.temperature,
        price_in_per_m=ep.price_in_per_m,
        price_out_per_m=ep.price_out_per_m,
        gpu_cost_per_hour=ep.gpu_cost_per_hour,
        concurrency=ep.concurrency,
    )


def api_key(target: Target, env: dict[str, str] | None = None) -> str | None:
    """The key from the environment variable the target names (never from config or argv)."""
    if not target.api_key_env:
        return None
    source = os.environ if env is None else env
    key = source.get(target.api_key_env)
    if not key:
        raise EndpointError(
            f"environment variable {target.api_key_env} (API key of {target.name}) is not set",
            f"export {target.api_key_env}=... before running the bench",
        )
    return key


# --------------------------------------------------------------------------- prompts


class _PromptLine(msgspec.Struct):
    prompt: Any = None
    messages: Any = None


_prompt_line = msgspec.json.Decoder(_PromptLine)


def _prompt_from(line: bytes) -> Prompt | None:
    try:
        rec = _prompt_line.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if isinstance(rec.messages, list) and rec.messages:
        messages: list[dict[str, Any]] = []
        texts: list[str] = []
        for m in rec.messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                return None
            content = m.get("content")
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts.extend(
                    p["text"]
                    for p in content
                    if isinstance(p, dict) and isinstance(p.get("text"), str)
                )
            messages.append({"role": m["role"], "content": content})
        return Prompt(messages=messages, text="\n".join(texts))
    if isinstance(rec.prompt, str) and rec.prompt:
        return Prompt(messages=[{"role": "user", "content": rec.prompt}], text=rec.prompt)
    return None


def load_prompts(path: str | os.PathLike[str], limit: int | None = None) -> list[Prompt]:
    """Prompts of a JSONL file whose lines have ``messages`` (chat) or ``prompt`` (text).

    Reads at most ``limit`` usable prompts. Lines that are neither are skipped; a file with none
    is an error.
    """
    p = Path(path).expanduser()
    out: list[Prompt] = []
    try:
        with p.open("rb") as f:
            for line in f:
                if not line.strip():
                    continue
                prompt = _prompt_from(line)
                if prompt is not None:
                    out.append(prompt)
                    if limit is not None and len(out) >= limit:
                        break
    except FileNotFoundError:
        raise EndpointError(f"prompts file {path} does not exist") from None
    except OSError as e:
        raise EndpointError(f"cannot read prompts file {path}: {e.strerror}") from None
    if not out:
        raise EndpointError(
            f"prompts file {path} holds no prompts",
            'expected JSON lines with a "messages" list or a "prompt" string',
        )
    return out


def _dataset_prompt_path(config: Config, dataset: str) -> Path | None:
    ds = config.datasets.get(dataset)
    if ds is None or not ds.prompts:
        return None
    prompts = Path(ds.prompts).expanduser()
    if prompts.is_absolute():
        return prompts
    runs: list[RunConfig] = [r for r in config.runs if dataset in config.run_datasets(r)]
    local = [r for r in runs if config.host(r.host).local]
    if not local:
        where = ", ".join(sorted({r.host for r in runs})) or "no run's host"
        raise EndpointError(
            f"the prompts of dataset {dataset} are on {where}, not on this machine",
            "copy the file here and pass --prompts FILE",
        )
    return Path(local[0].workdir).expanduser() / prompts


def prompts_for(
    config: Config | None, spec: str | None, target: Target, wanted: int
) -> tuple[list[Prompt], str]:
    """The prompts to send and where they came from.

    ``spec`` is a dataset name of the config or a file. Without it: the datasets of the runs that
    use this endpoint (else every dataset with prompts), interleaved.
    """
    if spec is not None:
        if config is not None and spec in config.datasets:
            path = _dataset_prompt_path(config, spec)
            if path is None:
                raise UsageError(f"dataset {spec} has no prompts file in the config")
            return load_prompts(path, wanted), f"{spec} ({path})"
        if not Path(spec).expanduser().exists():
            known = ", ".join(config.datasets) if config is not None else ""
            raise UsageError(
                f"--prompts {spec}: no such file"
                + (f", and not a dataset of the config ({known})" if known else ""),
                "pass a dataset name or a JSONL file with prompt or messages",
            )
        return load_prompts(spec, wanted), spec
    if config is None:
        raise UsageError(
            "no prompts to send", "pass --prompts FILE (JSONL with prompt or messages)"
        )
    names = [
        d for r in config.runs if r.endpoint == target.name for d in config.run_datasets(r)
    ] or list(config.datasets)
    names = [n for n in dict.fromkeys(names) if n in config.datasets and config.datasets[n].prompts]
    if not names:
        raise UsageError(
            "no dataset in the config has a prompts file",
            "set [datasets.NAME].prompts or pass --prompts FILE",
        )
    per = max(1, math.ceil(wanted / len(names)))
    lists: list[list[Prompt]] = []
    for n in names:
        path = _dataset_prompt_path(config, n)
        if path is not None:
            lists.append(load_prompts(path, per))
    mixed = [p for group in _interleave(lists) for p in group]
    return mixed[:wanted], ",".join(names)


def _interleave(lists: list[list[Prompt]]) -> Iterable[list[Prompt]]:
    for i in range(max((len(x) for x in lists), default=0)):
        yield [x[i] for x in lists if i < len(x)]


# --------------------------------------------------------------------------- wire shapes


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message | None = None
    delta: _Message | None = None
    text: str | None = None
    finish_reason: str | None = None


class _Response(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None


class _Model(msgspec.Struct):
    id: str


class _Models(msgspec.Struct):
    data: list[_Model] = []


_decode_response = msgspec.json.Decoder(_Response).decode
_decode_models = msgspec.json.Decoder(_Models).decode


def _text_of(m: _Message | None) -> str:
    if m is None:
        return ""
    parts = [x for x in (m.reasoning_content, m.reasoning, m.content) if x]
    return parts[0] if len(parts) == 1 else "".join(parts)


class _Done(msgspec.Struct, array_like=True):
    """One successful request (kept small: the timed window appends one per response)."""

    latency: float
    prompt: int
    """Index of the prompt sent."""
    prompt_tokens: int | None
    completion_tokens: int | None
    cost: float | None
    text: str | None
    finish: str | None
    ttft: float | None = None
    gaps: list[float] | None = None


# --------------------------------------------------------------------------- the run


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
        self.done: list[_Done] = []
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
            models = _decode_models(resp.content)
        except (msgspec.DecodeError, msgspec.ValidationError):
            models = _Models()
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
        decode = _decode_response
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
                                    text = ch.text if ch.text is not None else _text_of(ch.message)
                            if u is None:
                                done.append(_Done(t1 - t0, j, None, None, None, text, finish))
                            else:
                                done.append(
                                    _Done(
                                        t1 - t0,
                                        j,
                                        u.prompt_tokens,
                                        u.completion_tokens,
                                        u.cost,
                                        text,
                                        finish,
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
        decode = _decode_response
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
                            outcome: _Done | None = None
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
        self, resp: httpx.Response, t0: float, j: int, decode: Callable[[bytes], _Response]
    ) -> _Done | str:
        """Read an SSE stream. A failure is its kind: ``invalid`` (a chunk is not JSON) or
        ``connection`` (the stream ended before ``[DONE]`` and before a finish reason)."""
        perf = time.perf_counter
        pieces: list[str] = []
        gaps: list[float] = []
        ttft: float | None = None
        last = 0.0
        usage: _Usage | None = None
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
                piece = ch.text if ch.text is not None else _text_of(ch.delta)
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
            return _Done(t1 - t0, j, None, None, None, text, finish, ttft, gaps)
        return _Done(
            t1 - t0,
            j,
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.cost,
            text,
            finish,
            ttft,
            gaps,
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

    def _prompt_tokens(self, done: list[_Done]) -> int:
        total = sum(d.prompt_tokens for d in done if d.prompt_tokens is not None)
        missing = sum(1 for d in done if d.prompt_tokens is None)
        if missing and self.tokenizer is not None:
            # Without usage, the prompts' own text is the best measure (no chat template).
            from supervisor.tokens import count_tokens

            counts = count_tokens(self.tokenizer, [p.text for p in self.prompts])
            total += sum(counts[d.prompt] for d in done if d.prompt_tokens is None)
        return total


# --------------------------------------------------------------------------- pure arithmetic


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100) of already sorted values."""
    if not sorted_values:
        return None
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def percentiles_ms(sorted_seconds: Sequence[float]) -> Percentiles:
    def ms(q: float) -> float | None:
        v = percentile(sorted_seconds, q)
        return None if v is None else round(v * 1000.0, 3)

    return Percentiles(p50=ms(50), p90=ms(90), p99=ms(99))


def token_check(
    done: Sequence[_Done], tokenizer: Any, threshold: float = DISAGREEMENT_THRESHOLD
) -> tuple[TokenCheck, int]:
    """Compare usage with the tokenizer; returns the check and the completion tokens to count
    (usage where present, the tokenizer's count where not)."""
    check = TokenCheck(responses=len(done))
    with_usage = [d for d in done if d.completion_tokens is not None]
    without = [d for d in done if d.completion_tokens is None]
    check.with_usage = len(with_usage)
    check.usage_completion = sum(d.completion_tokens or 0 for d in with_usage)
    completion = check.usage_completion
    notes: list[str] = []
    if tokenizer is not None:
        from supervisor.tokens import count_tokens

        counts = count_tokens(tokenizer, [d.text or "" for d in done])
        by_usage = [c for c, d in zip(counts, done, strict=True) if d.completion_tokens is not None]
        check.tokenizer_completion = sum(by_usage)
        check.fallback_completion = sum(
            c for c, d in zip(counts, done, strict=True) if d.completion_tokens is None
        )
        completion += check.fallback_completion
        for c, d in zip(counts, done, strict=True):
            u = d.completion_tokens
            if u is not None and abs(c - u) > max(1.0, threshold * u):
                check.mismatched_responses += 1
        if check.usage_completion > 0:
            diff = (check.tokenizer_completion - check.usage_completion) / check.usage_completion
            check.disagreement = diff
            if abs(diff) > threshold:
                check.flagged = True
                notes.append(
                    f"usage says {check.usage_completion:,} completion tokens, the tokenizer "
                    f"counts {check.tokenizer_completion:,} ({diff * 100:+.1f} %): "
                    "wrong tokenizer, or the server counts differently"
                )
    if without:
        check.flagged = True
        if tokenizer is not None:
            notes.append(
                f"{len(without)} of {len(done)} responses had no usage: counted with the tokenizer"
            )
        else:
            notes.append(
                f"{len(without)} of {len(done)} responses had no usage and no tokenizer is "
                "configured: their tokens are not counted"
            )
    check.note = "; ".join(notes) or None
    return check, completion


def level_cost(
    done: Sequence[_Done], target: Target, wall_s: float, tokenizer: Any = None
) -> tuple[float | None, str | None]:
    """Cost of a level: the sum of ``usage.cost``; for responses without it the price table; for a
    local endpoint with no prices, its GPU time."""
    costs = [d.cost for d in done if d.cost is not None]
    priced = target.price_in_per_m is not None or target.price_out_per_m is not None
    rest = [d for d in done if d.cost is None]
    if costs and not rest:
        return math.fsum(costs), "usage.cost"
    if priced:
        pin = target.price_in_per_m or 0.0
        pout = target.price_out_per_m or 0.0
        table = math.fsum(
            ((d.prompt_tokens or 0) * pin + (d.completion_tokens or 0) * pout) / 1e6 for d in rest
        )
        if costs:
            return math.fsum([*costs, table]), "usage.cost + price table"
        return table, "price table"
    if costs:
        return math.fsum(costs), "usage.cost (partial)"
    if target.gpu_cost_per_hour is not None:
        return wall_s / 3600.0 * target.gpu_cost_per_hour, "GPU time"
    return None, None


# --------------------------------------------------------------------------- history


def history_path() -> Path:
    return state_dir() / HISTORY_FILE


_encode_result = msgspec.json.Encoder().encode
_decode_result = msgspec.json.Decoder(BenchResult).decode


def append_history(result: BenchResult, path: Path | None = None) -> Path:
    """Append one JSON line; the file and its directory are created private to the user."""
    p = path or history_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, _encode_result(result) + b"\n")
    finally:
        os.close(fd)
    return p


def load_history(path: Path | None = None) -> list[BenchResult]:
    """Every readable entry, oldest first (unreadable lines are skipped)."""
    p = path or history_path()
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        return []
    out: list[BenchResult] = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            out.append(_decode_result(line))
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    return out


def latest_bench(endpoint: str, history: Sequence[BenchResult]) -> BenchResult | None:
    """The newest entry for ``endpoint`` that completed at least one request."""
    for r in reversed(history):
        if r.endpoint == endpoint and any(lv.completed for lv in r.levels):
            return r
    return None


def bench_label(result: BenchResult) -> str:
    """``bench of 2026-11-30 01:23`` (local time)."""
    return "bench of " + datetime.fromtimestamp(result.time).strftime("%Y-%m-%d %H:%M")


# --------------------------------------------------------------------------- one call


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
