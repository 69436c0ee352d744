"""The bench history: one JSON line per bench in ``<state_dir>/bench-history.jsonl``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import msgspec

from supervisor.bench.results import BenchResult
from supervisor.paths import open_private, read_private, state_dir

HISTORY_FILE = "bench-history.jsonl"


def history_path() -> Path:
    return state_dir() / HISTORY_FILE


_encode_result = msgspec.json.Encoder().encode
_decode_result = msgspec.json.Decoder(BenchResult).decode


def append_history(result: BenchResult, path: Path | None = None) -> Path:
    """Append one JSON line; the file (0600) and its directory (0700) are private to the user
    whatever the umask, and refused when a link, another user's or writable by others."""
    p = path or history_path()
    fd = open_private(p, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, _encode_result(result) + b"\n")
    finally:
        os.close(fd)
    return p


def load_history(path: Path | None = None) -> list[BenchResult]:
    """Every readable entry, oldest first (unreadable lines are skipped)."""
    p = path or history_path()
    try:
        raw = read_private(p)
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
