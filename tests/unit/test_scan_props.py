"""Property: however a byte stream is split into appends, incremental totals equal one cold scan."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.agent import scan
from supervisor.agent.scan import Scanner
from tests.fixtures_data import dump, legacy_record, raw_record
from tests.properties import examples

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


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
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


def _raw(
    sid: bytes, ids: bytes = b"[1, 2, 3]", prompt: bytes = b"7", tokens: bytes = b"3"
) -> bytes:
    return (
        b'{"sample_id": '
        + sid
        + b', "output_ids": '
        + ids
        + b', "prompt_tokens": '
        + prompt
        + b', "completion_tokens": '
        + tokens
        + b', "finish_reason": "stop"}'
    )


# Plain lines (counted in batches) and lines one character away from plain, which must be counted
# (or rejected) exactly as one by one.
_PLAIN = [_raw(b'"p-%d"' % i, b"[%d, 5]" % i, b"%d" % (i * 3), b"2") + b"\n" for i in range(6)]
_NEAR = [
    _raw(b'"q\\"uote"') + b"\n",  # escaped quote in the id
    _raw(b'"caf\xc3\xa9"') + b"\n",  # UTF-8 in the id
    _raw(b'"caf\\u00e9"') + b"\n",  # the same id escaped: a duplicate of the one above
    _raw(b'"br}ace]"') + b"\n",  # } and ] inside a string
    _raw(b'"p-1"') + b"\n",  # a duplicate id of a plain line
    _raw(b'"crlf"') + b"\r\n",
    b"\xef\xbb\xbf" + _raw(b'"bom"') + b"\n",
    b"\n",
    b"\r\n",
    b"   \n",
    _raw(b'"sp"') + b"  \n",  # trailing blanks
    b" " + _raw(b'"lead"') + b"\n",
    _raw(b'"nan"', prompt=b"NaN") + b"\n",
    _raw(b'"inf"', prompt=b"Infinity") + b"\n",
    _raw(b'"neg"', tokens=b"-1") + b"\n",
    _raw(b'"negzero"', tokens=b"-0") + b"\n",
    _raw(b'"flt"', tokens=b"3.0") + b"\n",
    _raw(b'"exp"', prompt=b"1e2") + b"\n",
    _raw(b'"big"', tokens=b"1" + b"0" * 30) + b"\n",
    _raw(b'"huge"', prompt=b"9" * 5000) + b"\n",
    _raw(b'"lead0"', tokens=b"03") + b"\n",
    _raw(b"17") + b"\n",  # an integer id
    _raw(b"null") + b"\n",
    _raw(b'"nest"', ids=b"[[1], [2]]") + b"\n",
    _raw(b'"bad-arr"', ids=b"[1,,2]") + b"\n",
    _raw(b'"empty-arr"', ids=b"[]") + b"\n",
    _raw(b'"dup"')[:-1] + b', "prompt_tokens": 9}\n',  # duplicate key
    _raw(b'"dupk"', ids=b'[1], "completion_tokens": 4, "x": [2]') + b"\n",
    b'{"sample_id":"compact","output_ids":[1,2],"prompt_tokens":1,"completion_tokens":2,'
    b'"finish_reason":"stop"}\n',
    b'{"output_ids": [1], "sample_id": "order", "prompt_tokens": 1, "completion_tokens": 1, '
    b'"finish_reason": "stop"}\n',
    b'{"sample_id": "fr-null", "output_ids": [1], "prompt_tokens": null, '
    b'"completion_tokens": 1, "finish_reason": null}\n',
    b'{"sample_id": "extra", "output_ids": [1], "prompt_tokens": 1, "completion_tokens": 1, '
    b'"finish_reason": "stop", "meta": {"a": 1}}\n',
    b'{"sample_id": "open", "output_ids": [1, 2\n',  # an array running into the next line
    b'3], "prompt_tokens": 1, "completion_tokens": 1, "finish_reason": "stop"}\n',
    b'{"sample_id": "nul\x00", "output_ids": [1], "prompt_tokens": 1, "completion_tokens": 1, '
    b'"finish_reason": "stop"}\n',
    b'{"finished": true}\n',
    b"not json\n",
    *_LEGACY,
]
_RESULT_KEYS = (*_KEYS, "formats", "kinds", "validated", "format", "unique_ids", "texts")


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.lists(
        st.one_of(st.sampled_from(_PLAIN), st.sampled_from(_NEAR)), min_size=0, max_size=40
    ),
    tail=st.sampled_from([b"", b'{"sample_id": "half', _PLAIN[0][:-1]]),
    chunk=st.sampled_from([1, 5, 64, 200, 1 << 20]),
    validate=st.sampled_from(["sample", "none", "all"]),
    expected=st.sampled_from([None, "raw"]),
    long_from=st.sampled_from([scan.BATCH_LINE_MAX, 0, 60]),
)
def test_batches_count_exactly_as_one_by_one(
    body: list[bytes],
    tail: bytes,
    chunk: int,
    validate: str,
    expected: str | None,
    long_from: int,
) -> None:
    """Batches of short lines and head/tail matches of long ones (every line counts as long with
    ``long_from`` 0) count exactly as the one-by-one path."""
    stream = b"".join(body) + tail
    with tempfile.TemporaryDirectory() as d, mock.patch.object(scan, "BATCH_LINE_MAX", long_from):
        path = Path(d) / "raw_responses.jsonl"
        path.write_bytes(stream)
        fast = Scanner(chunk_size=chunk).scan(str(path), fmt=expected, validate=validate)
        slow = Scanner(chunk_size=chunk, batch=False).scan(
            str(path), fmt=expected, validate=validate
        )
    for key in _RESULT_KEYS:
        assert fast[key] == slow[key], key


def test_plain_lines_are_counted_in_batches(tmp_path: Path) -> None:
    """A file of plain lines takes the batch path (the property above would hold without it)."""
    path = tmp_path / "raw_responses.jsonl"
    lines = [_raw(b'"b-%d"' % (i % 50), b"[%d, 1, 2]" % i, b"%d" % i, b"3") for i in range(300)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    scanner = Scanner()
    calls = []
    real = scanner._line

    def counted(*args: object) -> bool:
        calls.append(args)
        return real(*args)  # type: ignore[arg-type]

    scanner._line = counted  # type: ignore[method-assign,assignment]
    r = scanner.scan(str(path))
    assert r["records"] == 300 and r["completion_tokens"] == 900
    assert r["prompt_tokens"] == sum(range(300))
    assert (r["unique_ids"], r["duplicates"]) == (50, 250)
    assert r["finish_reasons"] == {"stop": 300}
    assert len(calls) == r["validated"] == 2  # only the first and last line, one by one


def test_long_plain_lines_are_counted_without_a_parse(tmp_path: Path) -> None:
    """Lines longer than BATCH_LINE_MAX take the head/tail match, not the one-by-one path."""
    path = tmp_path / "raw_responses.jsonl"
    ids = b"[" + b", ".join(b"%d" % (i % 1000) for i in range(3000)) + b"]"
    lines = [_raw(b'"L-%d"' % (i % 7), ids, b"%d" % i, b"3000") for i in range(40)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert len(lines[0]) > scan.BATCH_LINE_MAX
    scanner = Scanner()
    calls = []
    real = scanner._line

    def counted(*args: object) -> bool:
        calls.append(args)
        return real(*args)  # type: ignore[arg-type]

    scanner._line = counted  # type: ignore[method-assign,assignment]
    r = scanner.scan(str(path))
    assert (r["records"], r["completion_tokens"], r["prompt_tokens"]) == (40, 120_000, 780)
    assert (r["unique_ids"], r["duplicates"]) == (7, 33)
    assert len(calls) == r["validated"] == 2
