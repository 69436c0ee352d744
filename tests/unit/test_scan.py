"""The incremental scanner on real files: exact counts, appends, and the data faults D1-D9."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from supervisor.agent.follow import unfollowable
from supervisor.agent.scan import Scanner
from tests.fixtures_data import Truth, dump, legacy_record, make_raw, raw_lines, raw_record


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("chunk", [7, 100, 1 << 20])
def test_cold_scan_counts_exactly(tmp_path: Path, chunk: int) -> None:
    path = tmp_path / "raw_responses.jsonl"
    truth = make_raw(path, 300, seed=1, dup_every=17)
    result = Scanner(chunk_size=chunk).scan(str(path))
    truth.check(result)
    assert truth.duplicates > 0
    assert result["state"] == "ok"
    assert result["format"] == "raw"
    assert result["verdict"] == "current"
    assert result["bad_lines"] == []
    assert result["partial_tail_bytes"] == 0
    assert result["size"] == path.stat().st_size == result["offset"]
    assert result["lines"] == 300


def test_validate_all_checks_every_record(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    make_raw(path, 50, seed=2)
    assert Scanner().scan(str(path), validate="all")["validated"] == 50
    sampled = Scanner().scan(str(path), validate="sample")["validated"]
    assert 2 <= sampled <= 50
    assert Scanner().scan(str(path), validate="none")["validated"] == 0


def test_sample_validation_catches_a_count_that_disagrees_with_the_array(tmp_path: Path) -> None:
    rng = random.Random(3)
    rec = raw_record(rng, "x", tokens=10)
    rec["completion_tokens"] = 11
    path = tmp_path / "r.jsonl"
    path.write_bytes(dump(rec))  # the first (and last) record is always validated
    result = Scanner().scan(str(path))
    assert result["records"] == 0
    assert result["bad_lines"][0]["reason"] == (
        "invalid record: completion_tokens is 11 but output_ids has 10 items"
    )
    assert result["verdict"] == "corrupt"


def test_incremental_scan_reads_only_appended_bytes(tmp_path: Path, scanner: Scanner) -> None:
    lines, truth = raw_lines(200, seed=4)
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(lines[:120]))
    first = scanner.scan(str(path))
    assert first["records"] == 120
    appended = b"".join(lines[120:])
    with path.open("ab") as f:
        f.write(appended)
    second = scanner.scan(str(path))
    truth.check(second)
    assert second["bytes_read"] == len(appended)
    assert second["rescan_reason"] is None
    assert second["stream"] == first["stream"]
    third = scanner.scan(str(path))
    assert third["bytes_read"] == 0
    truth.check(third)


# --------------------------------------------------------------------------- D1


def test_d1_partial_last_line_is_held_then_counted_once(tmp_path: Path, scanner: Scanner) -> None:
    lines, truth = raw_lines(10, seed=5)
    path = tmp_path / "r.jsonl"
    last = lines[-1]
    cut = len(last) // 2
    path.write_bytes(b"".join(lines[:-1]) + last[:cut])
    r = scanner.scan(str(path))
    assert r["records"] == 9
    assert r["partial_tail_bytes"] == cut
    assert r["offset"] == sum(len(x) for x in lines[:-1])
    assert r["bad_lines"] == []
    # The writer is still mid-line: a second look changes nothing.
    assert scanner.scan(str(path))["records"] == 9
    with path.open("ab") as f:
        f.write(last[cut:-1])  # everything but the newline: still partial
    assert scanner.scan(str(path))["records"] == 9
    with path.open("ab") as f:
        f.write(b"\n")
    r = scanner.scan(str(path))
    truth.check(r)
    assert r["partial_tail_bytes"] == 0
    truth.check(scanner.scan(str(path)))


# --------------------------------------------------------------------------- D3 / D7


def _bad_file(tmp_path: Path) -> tuple[Path, Truth, list[tuple[int, int, str]]]:
    """Good records interleaved with every kind of bad line; (path, truth, expected bad)."""
    rng = random.Random(6)
    truth = Truth()
    bad_lines: list[tuple[bytes, str]] = [
        (b'{"sample_id": "b1", "output_ids": [1, 2', "bad JSON"),
        (b"\x00" * 4096, "NUL bytes (zeroed block)"),
        (b'{"sample_id": "z", "output_ids": [1, \x00\x00\x00\x00', "NUL bytes (zeroed block)"),
        (b'{"sample_id": "b\xff\xfe", "prompt_tokens": 1}', "invalid UTF-8"),
        (
            b'{"sample_id": "n", "output_ids": [1], "prompt_tokens": NaN, '
            b'"completion_tokens": 1, "finish_reason": "stop"}',
            "NaN is not valid JSON",
        ),
        (
            b'{"sample_id": "i", "output_ids": [1], "prompt_tokens": 1, '
            b'"completion_tokens": Infinity, "finish_reason": "stop"}',
            "Infinity is not valid JSON",
        ),
        (
            b'{"sample_id": "d", "sample_id": "e", "output_ids": [1], "prompt_tokens": 1, '
            b'"completion_tokens": 1, "finish_reason": "stop"}',
            "duplicate key 'sample_id'",
        ),
        (b"[1, 2, 3]", "not a JSON object (list)"),
        (b"42", "not a JSON object (int)"),
        (b'"text"', "not a JSON object (str)"),
        (
            b'{"sample_id": "m", "output_ids": [1], "prompt_tokens": 1, "finish_reason": "stop"}',
            "missing completion_tokens",
        ),
        (
            b'{"sample_id": "g", "output_ids": [1], "prompt_tokens": 1, '
            b'"completion_tokens": -1, "finish_reason": "stop"}',
            "completion_tokens is negative",
        ),
        (
            b'{"sample_id": "s", "output_ids": [1], "prompt_tokens": 1, '
            b'"completion_tokens": "1", "finish_reason": "stop"}',
            "completion_tokens is a string",
        ),
        (
            b'\xef\xbb\xbf{"sample_id": "bom", "output_ids": [1], "prompt_tokens": 1, '
            b'"completion_tokens": 1, "finish_reason": "stop"}',
            "UTF-8 BOM at start of line",
        ),
        (b"", "empty line"),
        (b"   ", "bad JSON"),
    ]
    out = bytearray()
    expected: list[tuple[int, int, str]] = []
    line = 0
    for i, (bad, reason) in enumerate(bad_lines):
        for j in range(3):
            rec = raw_record(rng, f"ok{i}-{j}")
            truth.add(
                rec["sample_id"],
                rec["prompt_tokens"],
                rec["completion_tokens"],
                rec["finish_reason"],
            )
            out += dump(rec)
            line += 1
        line += 1
        expected.append((len(out), line, reason))
        out += bad + b"\n"
    rec = raw_record(rng, "last")
    truth.add("last", rec["prompt_tokens"], rec["completion_tokens"], rec["finish_reason"])
    out += dump(rec)
    path = tmp_path / "bad.jsonl"
    path.write_bytes(bytes(out))
    return path, truth, expected


@pytest.mark.parametrize("chunk", [5, 4096, 1 << 20])
@pytest.mark.parametrize("validate", ["sample", "all"])
def test_d3_d7_bad_lines_reported_with_offset_and_counting_continues(
    tmp_path: Path, chunk: int, validate: str
) -> None:
    path, truth, expected = _bad_file(tmp_path)
    before = _sha(path)
    result = Scanner(chunk_size=chunk).scan(str(path), validate=validate)
    truth.check(result)
    got = [(b["offset"], b["line"], b["reason"]) for b in result["bad_lines"]]
    assert [(o, n) for o, n, _ in got] == [(o, n) for o, n, _ in expected]
    for (_, _, reason), (_, _, want) in zip(got, expected, strict=True):
        assert want in reason, (reason, want)
    assert result["bad_lines_total"] == len(expected)
    assert result["verdict"] == "corrupt"
    assert "bad lines, first at line 4" in result["verdict_detail"]
    assert _sha(path) == before  # the scanner never writes


def test_bad_lines_are_deterministic_across_scanners(tmp_path: Path) -> None:
    path, _, _ = _bad_file(tmp_path)
    a = Scanner(chunk_size=3).scan(str(path))
    b = Scanner().scan(str(path))
    for key in ("records", "completion_tokens", "bad_lines", "unique_ids", "lines"):
        assert a[key] == b[key]


def test_only_the_first_hundred_bad_lines_are_listed(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"garbage\n" * 250)
    r = Scanner().scan(str(path))
    assert len(r["bad_lines"]) == 100
    assert r["bad_lines_total"] == 250
    assert r["bad_lines"][-1] == {
        "offset": 99 * 8,
        "line": 100,
        "reason": r["bad_lines"][0]["reason"],
    }


def test_utf8_character_split_across_reads(tmp_path: Path) -> None:
    rng = random.Random(8)
    truth = Truth()
    out = bytearray()
    for i in range(60):
        sid = f"é-€-😀-{i}"
        rec = raw_record(rng, sid)
        truth.add(sid, rec["prompt_tokens"], rec["completion_tokens"], rec["finish_reason"])
        out += dump(rec)
    path = tmp_path / "u.jsonl"
    path.write_bytes(bytes(out))
    for chunk in (1, 2, 3, 5, 7, 11):
        r = Scanner(chunk_size=chunk).scan(str(path), validate="all")
        truth.check(r)
        assert r["bad_lines"] == []


def test_crlf_line_endings_are_records(tmp_path: Path) -> None:
    lines, truth = raw_lines(5, seed=9)
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(x[:-1] + b"\r\n" for x in lines))
    truth.check(Scanner().scan(str(path)))


# --------------------------------------------------------------------------- D4


def test_d4_truncation_rescans_without_double_counting(tmp_path: Path, scanner: Scanner) -> None:
    path = tmp_path / "r.jsonl"
    make_raw(path, 50, seed=10)
    assert scanner.scan(str(path))["records"] == 50
    truth = make_raw(path, 20, seed=11)  # opened "wb": truncated in place, same inode
    r = scanner.scan(str(path))
    truth.check(r)
    assert r["rescan_reason"] == "file truncated"


def test_d4_copytruncate(tmp_path: Path, scanner: Scanner) -> None:
    path = tmp_path / "r.jsonl"
    make_raw(path, 40, seed=12)
    first = scanner.scan(str(path))
    shutil.copyfile(path, tmp_path / "r.jsonl.1")
    with path.open("r+b") as f:
        f.truncate(0)
    assert scanner.scan(str(path))["records"] == 0
    lines, truth = raw_lines(7, seed=13)
    with path.open("ab") as f:
        f.write(b"".join(lines))
    r = scanner.scan(str(path))
    truth.check(r)
    assert r["stream"] != first["stream"]


def test_d4_truncate_then_regrow_past_the_offset(tmp_path: Path, scanner: Scanner) -> None:
    path = tmp_path / "r.jsonl"
    make_raw(path, 30, seed=14)
    old_size = path.stat().st_size
    assert scanner.scan(str(path))["records"] == 30
    truth = make_raw(path, 80, seed=15)  # different bytes, now longer than the old offset
    assert path.stat().st_size > old_size
    r = scanner.scan(str(path))
    truth.check(r)
    assert r["rescan_reason"] == "file rewritten (head changed)"


def test_d4_regrow_with_the_same_head_is_caught_by_the_tail_hash(
    tmp_path: Path, scanner: Scanner
) -> None:
    lines, _ = raw_lines(60, seed=16)
    head = b"".join(lines[:40])
    assert len(head) > 4096
    path = tmp_path / "r.jsonl"
    path.write_bytes(head + b"".join(lines[40:50]))
    assert scanner.scan(str(path))["records"] == 50
    other, _ = raw_lines(40, seed=17)
    truth = Truth()
    for x in lines[:40] + other:
        rec = json.loads(x)
        truth.add(
            rec["sample_id"], rec["prompt_tokens"], rec["completion_tokens"], rec["finish_reason"]
        )
    path.write_bytes(head + b"".join(other))
    r = scanner.scan(str(path))
    truth.check(r)
    assert r["rescan_reason"] == "file rewritten (bytes before the offset changed)"


# --------------------------------------------------------------------------- D5


def test_d5_replaced_file_never_gets_the_old_offset(tmp_path: Path, scanner: Scanner) -> None:
    path = tmp_path / "r.jsonl"
    make_raw(path, 50, seed=18)
    scanner.scan(str(path))
    new = tmp_path / "new.jsonl"
    truth = make_raw(new, 60, seed=19)
    os.replace(new, path)
    r = scanner.scan(str(path))
    truth.check(r)
    assert r["rescan_reason"] == "file replaced (new inode)"


def test_d5_rotation(tmp_path: Path, scanner: Scanner) -> None:
    path = tmp_path / "r.jsonl"
    make_raw(path, 25, seed=20)
    scanner.scan(str(path))
    path.rename(tmp_path / "r.jsonl.1")
    assert scanner.scan(str(path))["state"] == "missing"
    truth = make_raw(path, 3, seed=21)
    truth.check(scanner.scan(str(path)))


def test_d5_same_inode_new_content(tmp_path: Path, scanner: Scanner) -> None:
    """What inode reuse looks like to the scanner: same (dev, inode), other bytes."""
    path = tmp_path / "r.jsonl"
    make_raw(path, 20, seed=22)
    ino = path.stat().st_ino
    scanner.scan(str(path))
    other = tmp_path / "o.jsonl"
    truth = make_raw(other, 30, seed=23)
    with path.open("r+b") as f:  # overwrite in place: the inode stays
        f.write(other.read_bytes())
    assert path.stat().st_ino == ino
    r = scanner.scan(str(path))
    truth.check(r)
    assert r["rescan_reason"] is not None


def test_d5_delete_and_recreate(tmp_path: Path, scanner: Scanner) -> None:
    path = tmp_path / "r.jsonl"
    make_raw(path, 20, seed=24)
    scanner.scan(str(path))
    path.unlink()
    truth = make_raw(path, 35, seed=25)  # the filesystem may well hand out the same inode
    truth.check(scanner.scan(str(path)))


# --------------------------------------------------------------------------- D6


def test_d6_mixed_formats_name_the_first_offending_line(tmp_path: Path) -> None:
    rng = random.Random(26)
    out = bytearray()
    offset = line = 0
    for i in range(10):
        rec: dict[str, Any] = raw_record(rng, f"r{i}") if i != 6 else legacy_record(rng, "x")
        if i == 6:
            offset, line = len(out), i + 1
        out += dump(rec)
    path = tmp_path / "r.jsonl"
    path.write_bytes(bytes(out))
    r = Scanner().scan(str(path), fmt="raw")
    assert r["verdict"] == "mixed"
    assert r["first_offending"] == {
        "line": line,
        "offset": offset,
        "format": "raw-legacy",
        "missing": ["output_ids"],
        "extra": ["text"],
    }
    assert r["verdict_detail"].startswith(f"line 7 (offset {offset}) is raw-legacy, not raw")
    assert "missing output_ids; extra text" in r["verdict_detail"]
    assert r["records"] == 10  # both formats carry completion_tokens: all counted


def test_legacy_file_verdict_relative_to_expected(tmp_path: Path) -> None:
    rng = random.Random(27)
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(dump(legacy_record(rng, f"l{i}")) for i in range(5)))
    assert Scanner().scan(str(path), fmt="raw")["verdict"] == "legacy"
    assert Scanner().scan(str(path), fmt="raw-legacy")["verdict"] == "current"
    auto = Scanner().scan(str(path))
    assert (auto["format"], auto["verdict"]) == ("raw-legacy", "current")
    assert Scanner().scan(str(path), fmt="specforge")["verdict"] == "unknown"


def test_changing_the_expected_format_rescans(tmp_path: Path, scanner: Scanner) -> None:
    path = tmp_path / "r.jsonl"
    make_raw(path, 5, seed=28)
    assert scanner.scan(str(path), fmt="raw")["verdict"] == "current"
    r = scanner.scan(str(path), fmt="specforge")
    assert r["rescan_reason"] == "format changed"
    assert r["verdict"] == "unknown"


# --------------------------------------------------------------------------- D7: big lines


def _write_big_line(path: Path, n_ids: int, sid: str = "big") -> int:
    item = b"123456, "
    with path.open("wb") as f:
        f.write(b'{"sample_id": "%s", "output_ids": [' % sid.encode())
        block = item * 65536
        left = n_ids - 1
        while left >= 65536:
            f.write(block)
            left -= 65536
        f.write(item * left + b"7]")
        f.write(
            b', "prompt_tokens": 5, "completion_tokens": %d, "finish_reason": "length"}\n' % n_ids
        )
    return path.stat().st_size


def test_d7_a_100_mb_line_is_counted_with_bounded_memory(tmp_path: Path) -> None:
    import tracemalloc

    path = tmp_path / "big.jsonl"
    n = 12_700_000
    size = _write_big_line(path, n)
    assert size > 100_000_000
    lines, truth = raw_lines(3, seed=29)
    with path.open("ab") as f:
        f.write(b"".join(lines))
    truth.add("big", 5, n, "length")
    tracemalloc.start()
    try:
        r = Scanner().scan(str(path))  # first line is always validated
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    truth.check(r)
    assert r["bad_lines"] == []
    # The line itself, plus the buffer's growth slack and one chunk: never a parsed array.
    assert peak < 1.6 * size, peak


def test_d7_lines_over_the_limit_are_skipped_unbuffered(tmp_path: Path) -> None:
    import tracemalloc

    path = tmp_path / "big.jsonl"
    size = _write_big_line(path, 3_000_000)
    lines, truth = raw_lines(4, seed=30)
    with path.open("ab") as f:
        f.write(b"".join(lines))
    tracemalloc.start()
    try:
        r = Scanner(chunk_size=1 << 16, max_line_bytes=1 << 20).scan(str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    truth.check(r)
    assert r["bad_lines"] == [
        {
            "offset": 0,
            "line": 1,
            "reason": f"line longer than 1048576 bytes ({size - 1} bytes), skipped",
        }
    ]
    assert peak < 4 << 20, peak


# --------------------------------------------------------------------------- D8


def test_d8_duplicate_ids_counted_once(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    truth = make_raw(path, 400, seed=31, id_space=150)
    r = Scanner().scan(str(path))
    truth.check(r)
    assert r["unique_ids"] <= 150
    assert r["duplicates"] == 400 - r["unique_ids"]


@pytest.mark.parametrize("validate", ["all", "sample", "none"])
def test_d8_the_first_duplicate_ids_are_named(tmp_path: Path, validate: str) -> None:
    """Record by record and on the fast path alike: the first ids seen again, in file order
    (one repeated inside a batch too), at most ten, with the exact count."""
    rng = random.Random(32)
    path = tmp_path / "r.jsonl"
    ids = [f"s{i}" for i in range(300)] + ["s9", "s2", "s2", *(f"s{i}" for i in range(20, 40))]
    path.write_bytes(b"".join(dump(raw_record(rng, i)) for i in ids))
    r = Scanner().scan(str(path), "raw", validate=validate)
    assert r["duplicates"] == 23
    assert r["duplicate_ids"] == ["s9", "s2", "s2", *(f"s{i}" for i in range(20, 27))]


# --------------------------------------------------------------------------- D9


def test_d9_missing_file_is_a_state(tmp_path: Path, scanner: Scanner) -> None:
    r = scanner.scan(str(tmp_path / "nope.jsonl"))
    assert (r["state"], r["verdict"], r["records"]) == ("missing", "missing", 0)


def test_d9_directory_instead_of_file(tmp_path: Path, scanner: Scanner) -> None:
    d = tmp_path / "raw_responses.jsonl"
    d.mkdir()
    r = scanner.scan(str(d))
    assert r["state"] == "not-a-file"
    assert r["verdict"] == "error"


def test_d9_fifo_is_not_a_file_and_does_not_block(tmp_path: Path, scanner: Scanner) -> None:
    fifo = tmp_path / "raw_responses.jsonl"
    os.mkfifo(fifo)
    assert scanner.scan(str(fifo))["state"] == "not-a-file"


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root reads a mode-000 file anyway: permissions cannot deny it"
)
def test_d9_unreadable_file(tmp_path: Path, scanner: Scanner) -> None:
    path = tmp_path / "r.jsonl"
    make_raw(path, 3)
    path.chmod(0)
    try:
        assert scanner.scan(str(path))["state"] == "unreadable"
    finally:
        path.chmod(0o644)


def test_d9_permission_error_maps_to_unreadable() -> None:
    """The errno mapping itself (root, which the CI container runs as, reads mode-000 files)."""
    import errno

    err = unfollowable(PermissionError(errno.EACCES, "Permission denied"))
    assert (err.state, err.message) == ("unreadable", "permission denied")


def test_d9_path_through_a_file_is_not_a_file(tmp_path: Path, scanner: Scanner) -> None:
    f = tmp_path / "file"
    f.write_bytes(b"x")
    assert scanner.scan(str(f / "raw_responses.jsonl"))["state"] == "not-a-file"


def test_d9_one_bad_path_leaves_the_others_alone(tmp_path: Path, scanner: Scanner) -> None:
    good = tmp_path / "good.jsonl"
    truth = make_raw(good, 12, seed=32)
    (tmp_path / "dir.jsonl").mkdir()
    results = [scanner.scan(str(p)) for p in (tmp_path / "x.jsonl", tmp_path / "dir.jsonl", good)]
    assert [r["state"] for r in results] == ["missing", "not-a-file", "ok"]
    truth.check(results[2])


def test_unknown_format_name_is_an_error_state(tmp_path: Path, scanner: Scanner) -> None:
    path = tmp_path / "r.jsonl"
    make_raw(path, 2)
    r = scanner.scan(str(path), fmt="nonesuch")
    assert r["state"] == "error"
    assert "unknown format 'nonesuch'" in r["error"]


def test_result_is_json_able(tmp_path: Path) -> None:
    path, _, _ = _bad_file(tmp_path)
    r = Scanner().scan(str(path))
    assert json.loads(json.dumps(r)) == r


@pytest.mark.parametrize("big_path", [False, True])
@pytest.mark.parametrize(
    ("array", "ok"),
    [
        (b"[1, 2, 3]", True),
        (b"[]", True),
        (b"[ -4 ,5 ]", True),
        (b"[1, 2.5]", False),
        (b'[1, "a"]', False),
        (b"[1,, 2]", False),
        (b"[1, NaN]", False),
        (b"[1, 2,]", False),
        (b"[true]", False),
    ],
)
def test_validated_arrays_must_hold_integers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, array: bytes, ok: bool, big_path: bool
) -> None:
    import supervisor.agent.scan as scan_mod

    if big_path:  # the piecewise check used for arrays too big to parse
        monkeypatch.setattr(scan_mod, "FULL_PARSE_MAX", 4)
    n = array.count(b",") + 1 if array.strip(b"[] ") else 0
    line = (
        b'{"sample_id": "a", "output_ids": %s, "prompt_tokens": 1, "completion_tokens": %d, '
        b'"finish_reason": "stop"}\n' % (array, n)
    )
    path = tmp_path / "r.jsonl"
    path.write_bytes(line)
    r = Scanner().scan(str(path), validate="all")
    assert (r["records"] == 1) is ok, r["bad_lines"]
    if not ok:
        assert r["bad_lines"][0]["reason"].startswith("invalid record:")


def test_d7_a_100_mb_text_line_is_parsed_with_memory_a_few_times_the_line(tmp_path: Path) -> None:
    """A legacy record whose text is 100 MB must be parsed whole (the line, its decoded text and
    the parsed value): about three times the line, never more."""
    import tracemalloc

    path = tmp_path / "big.jsonl"
    with path.open("wb") as f:
        f.write(b'{"sample_id": "t", "text": "' + b"word " * 20_000_000)
        f.write(b'", "prompt_tokens": 1, "completion_tokens": 5, "finish_reason": "stop"}\n')
    size = path.stat().st_size
    tracemalloc.start()
    try:
        r = Scanner().scan(str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (r["records"], r["completion_tokens"], r["verdict"]) == (1, 5, "current")
    assert peak < 3.4 * size, peak
