"""What a bench measured: per concurrency level and for the whole bench (also the history line)."""

from __future__ import annotations

import msgspec

FailureKind = str
"""One of ``429``, ``5xx``, ``4xx``, ``timeout``, ``connection``, ``invalid``."""


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
