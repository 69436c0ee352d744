"""Property: however a byte stream is split into appends, incremental totals equal one cold scan."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.agent.scan import Scanner
from tests.fixtures_data import dump, legacy_record, raw_record

_RNG = random.Random(40)
_GOOD = [dump(raw_record(_RNG, f"id-{i % 9}-é")) for i in range(12)]
_LEGACY = [dump(legacy_record(_RNG, f"old-{i}")) for i in range(2)]
_BAD = [
    b"not json\n",
    b"\x00\x00\x00\x00\n",
    b'{"sample_id": "\xff"}\n',
    b"\n",
    b"[1, 2]\n",
    b'{"sample_id": "n", "output_ids": [], "prompt_tokens": NaN, "completion_tokens": 0, '
    b'"finish_reason": "stop"}\n',
    b'{"sample_id": "t", "output_ids": [1], "prompt_tokens": 1, "completion_tokens": -2, '
    b'"finish_reason": "stop"}\n',
]
_KEYS = (
    "records",
    "unique_ids",
    "duplicates",
    "prompt_tokens",
    "completion_tokens",
    "finish_reasons",
    "bad_lines",
    "bad_lines_total",
    "lines",
    "offset",
    "partial_tail_bytes",
    "verdict",
    "verdict_detail",
    "first_offending",
)

lines = st.lists(
    st.one_of(st.sampled_from(_GOOD), st.sampled_from(_BAD), st.sampled_from(_LEGACY)),
    min_size=0,
    max_size=25,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=lines,
    tail=st.binary(max_size=40).filter(lambda b: b"\n" not in b),
    cuts=st.lists(st.floats(min_value=0, max_value=1), max_size=8),
    chunk=st.sampled_from([1, 3, 16, 1 << 20]),
    validate=st.sampled_from(["sample", "all"]),
)
def test_any_split_into_appends_gives_the_cold_totals(
    body: list[bytes], tail: bytes, cuts: list[float], chunk: int, validate: str
) -> None:
    stream = b"".join(body) + tail
    points = sorted({int(c * len(stream)) for c in cuts} | {len(stream)})
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "raw_responses.jsonl"
        path.write_bytes(b"")
        inc = Scanner(chunk_size=chunk)
        done = 0
        result = inc.scan(str(path), validate=validate)
        for p in points:
            with path.open("ab") as f:
                f.write(stream[done:p])
            done = p
            result = inc.scan(str(path), validate=validate)
        cold = Scanner().scan(str(path), validate=validate)
    assert result["rescan_reason"] is None
    for key in _KEYS:
        assert result[key] == cold[key], key
    assert cold["partial_tail_bytes"] == len(tail)
    assert cold["lines"] == len(body)
