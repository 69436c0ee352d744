"""``runwatch bench`` (measure an endpoint) and ``runwatch compare`` (where should the rest run).

Both import httpx and the engine inside the command, so ``runwatch --help`` stays fast.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from supervisor import display
from supervisor.cli._common import (
    Finite,
    config_option,
    get_config,
    json_option,
    print_json,
    resolve_config_path,
    write_control,
)

if TYPE_CHECKING:
    from supervisor.config import Config
    from supervisor.engine import BenchResult, Comparison, LevelResult


def _levels(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(
            f"expected C[,C...] (integers), got {text!r}", param_hint="'--concurrency'"
        ) from None
    if not values or min(values) < 1:
        raise click.BadParameter(
            f"concurrency levels must be positive integers, got {text!r}",
            param_hint="'--concurrency'",
        )
    return values


def _optional_config(config_path: str | None, target: str) -> Config | None:
    """The config; for a bare URL it is optional (prices and prompts then come from flags)."""
    from supervisor.engine import is_url

    path = resolve_config_path(config_path)
    # "runwatch.toml" is the fallback when no config was named anywhere (-c, $RUNWATCH_CONFIG).
    if is_url(target) and path == "runwatch.toml" and not Path(path).exists():
        return None
    return get_config(config_path)


class _ProgressLine:
    """``bench  c=64  123/400`` redrawn in place on stderr (only on a terminal)."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self.started = time.monotonic()
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.started
        write_control(sys.stderr, "\r")
        sys.stderr.write(
            f"  bench: {display.count(done)}/{display.count(total)} requests "
            f"({display.share(done, total)}), {display.duration(elapsed)} "
        )
        sys.stderr.flush()
        self.drawn = True

    def clear(self) -> None:
        if self.drawn:
            write_control(sys.stderr, "\r\x1b[K")
            sys.stderr.flush()


@click.command()
@click.argument("target", metavar="ENDPOINT|URL")
@config_option
@click.option("--prompts", default=None, help="A dataset of the config, or a JSONL file.")
@click.option(
    "--requests",
    "n_requests",
    type=int,
    default=100,
    show_default=True,
    help="Requests per concurrency level.",
)
@click.option(
    "--concurrency",
    default=None,
    help="Concurrency levels, e.g. 8,32,64 (default: the endpoint's, else 8).",
)
@click.option(
    "--max-tokens",
    type=int,
    default=None,
    help="max_tokens of each request (default: the endpoint's).",
)
@click.option(
    "--stream", is_flag=True, help="Stream responses: measures TTFT and inter-token latency."
)
@click.option("--no-warmup", is_flag=True, help="Skip the warm-up request per connection.")
@click.option(
    "--retries",
    type=int,
    default=3,
    show_default=True,
    help="Retries of a request after 429, 5xx, timeout or connection error.",
)
@click.option(
    "--timeout",
    type=Finite(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds allowed for one request.",
)
@click.option(
    "--api-key-env", default=None, help="Environment variable holding the API key (for a bare URL)."
)
@click.option("--no-save", is_flag=True, help="Do not append the result to the bench history.")
@json_option
def bench(
    target: str,
    config_path: str | None,
    prompts: str | None,
    n_requests: int,
    concurrency: str | None,
    max_tokens: int | None,
    stream: bool,
    no_warmup: bool,
    retries: int,
    timeout: float,
    api_key_env: str | None,
    no_save: bool,
    as_json: bool,
) -> None:
    """Measure an endpoint with the run's own prompts and request shape.

    Prints, per concurrency level: completed requests, errors by kind (each failed attempt,
    retried or not; "gave up" counts the requests lost), req/s, output and total tokens/s,
    latency percentiles (TTFT and inter-token latency with --stream), achieved concurrency,
    tokens by usage vs the tokenizer, and cost. The result is appended to the bench history
    that `runwatch compare` reads.
    """
    from supervisor.engine import BenchOptions
    from supervisor.engine import bench as run_bench
    from supervisor.errors import UsageError

    if n_requests < 1:
        raise UsageError("--requests must be at least 1")
    if retries < 0:
        raise UsageError("--retries must be 0 or more")
    levels = _levels(concurrency) if concurrency else []
    config = _optional_config(config_path, target)
    if levels and n_requests < max(levels):
        click.echo(
            f"note: --requests {n_requests} is below --concurrency {max(levels)}: that level "
            "never has all its requests in flight (see 'achieved')",
            err=True,
        )
    options = BenchOptions(
        requests=n_requests,
        concurrency=levels,
        stream=stream,
        warmup=not no_warmup,
        timeout_s=timeout,
        max_retries=retries,
    )
    line = _ProgressLine()
    try:
        result = asyncio.run(
            run_bench(
                config,
                target,
                prompts=prompts,
                options=options,
                max_tokens=max_tokens,
                api_key_env=api_key_env,
                progress=line,
                save=not no_save,
            )
        )
    finally:
        line.clear()
    if as_json:
        print_json(result)
    else:
        click.echo(format_bench(result))


def _failed(lv: LevelResult) -> str:
    parts = [f"{k}:{v}" for k, v in lv.failed.items()]
    if lv.gave_up:
        parts.append(f"gave up {lv.gave_up}")
    return " ".join(parts) or "0"


def _pack(head: str, parts: list[str], width: int = 80) -> list[str]:
    """``head part; part; ...`` on as few lines of ``width`` as fit, continuations aligned."""
    out: list[str] = []
    indent = " " * len(head)
    line, fresh = head, True
    for part in parts:
        if not fresh and len(line) + 2 + len(part) + 1 > width:
            out.append(line + ";")
            line, fresh = indent, True
        line += (" " if fresh else "; ") + part
        fresh = False
    out.append(line)
    return out


def format_bench(result: BenchResult) -> str:
    """The text report of a bench."""
    head = (
        f"bench {result.endpoint}  model {result.model}  max_tokens {result.max_tokens}"
        f"{'  streamed' if result.stream else ''}"
    )
    lines = [head, f"  prompts: {result.prompts or '-'} ({result.prompt_count} used)"]
    # 80 columns: the latency percentiles go on each level's own line below the table.
    cols = (
        f"  {'conc':>5} {'done':>5} {'errors':<12} {'req/s':>7} {'out tok/s':>9} "
        f"{'tot tok/s':>9} {'achieved':>8} {'cost':>9}"
    )
    lines.append(cols)
    for lv in result.levels:
        cost = display.money(lv.cost_usd)
        lines.append(
            f"  {lv.concurrency:>5} {lv.completed:>5} {_failed(lv):<12} "
            f"{display.rate(lv.req_per_s):>7} "
            f"{display.rate(lv.output_tok_per_s):>9} {display.rate(lv.total_tok_per_s):>9} "
            f"{lv.achieved_concurrency:>8.1f} {cost:>9}"
        )
    ms = display.latency
    for lv in result.levels:
        lat = lv.latency_ms
        detail = [
            f"  c={lv.concurrency}:",
            f"latency p50 {ms(lat.p50)} p90 {ms(lat.p90)} p99 {ms(lat.p99)}",
        ]
        if lv.ttft_ms is not None:
            detail.append(f"TTFT p50 {ms(lv.ttft_ms.p50)} p99 {ms(lv.ttft_ms.p99)}")
        if lv.itl_ms is not None and lv.itl_ms.p50 is not None:
            detail.append(f"inter-chunk p50 {ms(lv.itl_ms.p50)} p99 {ms(lv.itl_ms.p99)}")
        if lv.tpot_ms is not None and lv.tpot_ms.p50 is not None:
            detail.append(f"per token p50 {ms(lv.tpot_ms.p50)}")
        t = lv.tokens
        tok = f"tokens: usage {display.count(t.usage_completion)}"
        if t.tokenizer_completion is not None:
            tok += f", tokenizer {display.count(t.tokenizer_completion)}"
            if t.disagreement is not None:
                tok += f" ({display.signed_percent(t.disagreement)})"
        detail.append(tok)
        if lv.cost_source:
            detail.append(f"cost from {lv.cost_source}")
        if lv.retry_wait_s:
            detail.append(f"waited {ms(lv.retry_wait_s * 1000)} before retries")
        lines.extend(_pack(detail[0], detail[1:]))
        if t.flagged and t.note:
            lines.append(f"    ! {t.note}")
    return "\n".join(lines)


@click.command()
@config_option
@click.option(
    "--sample",
    "sample_s",
    type=Finite(min=0),
    default=10.0,
    show_default=True,
    help="Seconds at most spent refreshing when a running run has no rate yet (no history and "
    "too few responses); with history the answer is immediate.",
)
@json_option
def compare(config_path: str | None, sample_s: float, as_json: bool) -> None:
    """Time and cost to finish every dataset with budget left, on each endpoint.

    Uses the live rates of running runs (their data files, over a window kept by every refresh
    and persisted, with their uncertainty; the serving engine's counters beside them), the
    latest bench of the runs' shape for endpoints that are not running, and the price tables.
    """
    from supervisor.engine import gather_comparison

    config = get_config(config_path)
    result = asyncio.run(gather_comparison(config, sample_s=sample_s))
    if as_json:
        print_json(result)
    else:
        click.echo(format_compare(result))


def format_compare(result: Comparison) -> str:
    from supervisor.engine import format_lines

    return "\n".join(format_lines(result))
