"""The arithmetic of a bench, done after the timed window: percentiles, token check, cost."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from supervisor import display
from supervisor.bench.results import Percentiles, TokenCheck
from supervisor.bench.target import Target
from supervisor.bench.wire import Done

DISAGREEMENT_THRESHOLD = 0.02
"""Relative difference between usage and tokenizer counts above which they are flagged."""


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
    done: Sequence[Done], tokenizer: Any, threshold: float = DISAGREEMENT_THRESHOLD
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
                    f"usage says {display.count(check.usage_completion)} completion tokens, the "
                    f"tokenizer counts {display.count(check.tokenizer_completion)} "
                    f"({display.signed_percent(diff)}): "
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


def _prompt_cost(prompt: int, cached: int | None, pin: float, pcached: float) -> float:
    """USD x 1e6 of a request's prompt: its cached tokens (never more than the prompt) at the
    cached price, the rest at the full one."""
    hit = min(max(cached or 0, 0), prompt)
    return (prompt - hit) * pin + hit * pcached


def level_cost(
    done: Sequence[Done], target: Target, wall_s: float, tokenizer: Any = None
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
        pcached = target.price_cached_in_per_m
        pcached = pin if pcached is None else pcached
        table = math.fsum(
            (
                _prompt_cost(d.prompt_tokens or 0, d.cached_tokens, pin, pcached)
                + (d.completion_tokens or 0) * pout
            )
            / 1e6
            for d in rest
        )
        if costs:
            return math.fsum([*costs, table]), "usage.cost + price table"
        return table, "price table"
    if costs:
        return math.fsum(costs), "usage.cost (partial)"
    if target.gpu_cost_per_hour is not None:
        return wall_s / 3600.0 * target.gpu_cost_per_hour, "GPU time"
    return None, None
