"""Duplicate ids past the scanner's recent ones (D8): found exactly, hash collisions included.

The ids of a file move from an exact set into buckets of hashes (``agent/idset.py``); these tests
make that happen after a few ids and force the hashes to collide, so that every way an id is
decided (recent, a bucket's hash read back from the file, ids of a shared hash) is taken.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.agent import idset
from supervisor.agent.idset import IdSet
from supervisor.agent.scan import Scanner
from tests.fixtures_data import Truth, dump, raw_record


def _scanner(hasher: Callable[[Any], int], batch: bool, chunk: int = 1 << 20) -> Scanner:
    return Scanner(chunk_size=chunk, batch=batch, id_set=lambda: IdSet(recent_max=4, hasher=hasher))


def _few_hashes(key: Any) -> int:
    """Eleven hashes for every id: distinct ids collide all the time."""
    return zlib.crc32(repr(key).encode()) % 11


def _spread(key: Any) -> int:
    """Hashes that collide for one in about thirty pairs of ids."""
    return zlib.crc32(repr(key).encode()) % 4096


@pytest.mark.parametrize("hasher", [_few_hashes, _spread, lambda key: 7])
@pytest.mark.parametrize("batch", [True, False])
@pytest.mark.parametrize("read_back", [1 << 20, 300])
def test_d8_duplicates_are_exact_whatever_the_hashes(
    tmp_path: Path,
    hasher: Callable[[Any], int],
    batch: bool,
    read_back: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``read_back``: the blocks the file is read back in (small ones: most blocks hold no
    wanted hash and are passed over whole)."""
    monkeypatch.setattr(idset, "READ_BACK_CHUNK", read_back)
    rng = random.Random(5)
    path = tmp_path / "raw_responses.jsonl"
    truth = Truth()
    scanner = _scanner(hasher, batch, chunk=97)
    with path.open("ab") as f:
        for part in range(6):
            for _ in range(60):
                sid = f"s{rng.randrange(150):04d}"
                rec = raw_record(rng, sid)
                truth.add(sid, rec["prompt_tokens"], rec["completion_tokens"], rec["finish_reason"])
                f.write(dump(rec))
            f.flush()
            result = scanner.scan(str(path))
            assert result["rescan_reason"] is None or part == 0
            truth.check(result)
    assert truth.duplicates > 100


@pytest.mark.parametrize("batch", [True, False])
@pytest.mark.parametrize("split", [False, True])
def test_d8_a_colliding_id_is_decided_by_the_first_id_of_its_hash_in_the_file(
    tmp_path: Path, batch: bool, split: bool
) -> None:
    """``a`` is hashed into a bucket; ``b`` has its hash (a new id, not a duplicate), then ``a``
    comes again (a duplicate). The first line spells its key with an escape, so only a parse
    reads its id back: taking ``b``'s line for the first of the hash would count ``b`` as a
    duplicate."""

    def hasher(key: Any) -> int:
        return 1 if key in (b"a", b"b") else 2 + zlib.crc32(repr(key).encode())

    rng = random.Random(9)

    def line(sid: str) -> bytes:
        return dump(raw_record(rng, sid))

    first = line("a").replace(b'"sample_id"', b'"sample\\u005fid"')
    head = first + b"".join(line(f"f{i}") for i in range(5))
    tail = line("b") + line("f2")
    path = tmp_path / "r.jsonl"
    scanner = _scanner(hasher, batch)
    if split:
        path.write_bytes(head)
        assert scanner.scan(str(path))["unique_ids"] == 6
    path.write_bytes(head + tail)
    result = scanner.scan(str(path))
    assert (result["records"], result["unique_ids"], result["duplicates"]) == (8, 7, 1)
    path.write_bytes(head + tail + line("a") + line("b"))
    result = scanner.scan(str(path))
    assert (result["records"], result["unique_ids"], result["duplicates"]) == (10, 7, 3)


def test_d8_ids_of_other_types_and_escaped_values_are_read_back(tmp_path: Path) -> None:
    """Ids that are not plain strings (an escaped quote, non-ASCII written as an escape, an
    integer) are hashed into buckets, then met again and by a new id of the same hash: each is
    read back from the file and told apart exactly."""
    ids: list[Any] = ['q"1', "naïve", 42, "x/y", "plain"]
    shared = {b'q"1': 3, b"new1": 3, "naïve".encode(): 4, b"new2": 4, 42: 5, b"new3": 5}

    def hasher(key: Any) -> int:
        return shared.get(key, 10 + zlib.crc32(repr(key).encode()))

    rng = random.Random(3)
    path = tmp_path / "r.jsonl"
    with path.open("wb") as f:
        for sid in ids + ids[::-1] + ["new1", "new2", "new3"]:
            f.write(json.dumps(raw_record(rng, sid)).encode() + b"\n")
    for batch in (True, False):
        result = _scanner(hasher, batch).scan(str(path))
        assert (result["records"], result["unique_ids"], result["duplicates"]) == (13, 8, 5)


def test_completeness_counts_answered_rows_past_the_recent_ids(tmp_path: Path) -> None:
    inp = tmp_path / "input.jsonl"
    inp.write_text(
        "".join(json.dumps({"id": f"s{i}", "conversations": []}) + "\n" for i in range(30))
    )
    out = tmp_path / "regen.jsonl"
    rows = [f"s{i}" for i in range(25)] + ["s3", "stranger"]
    out.write_text(
        "".join(
            json.dumps({"id": sid, "conversations": [{"role": "user", "content": "x"}]}) + "\n"
            for sid in rows
        )
    )
    scanner = _scanner(_spread, True)
    c = scanner.scan(str(out), fmt="specforge", input_file={"path": str(inp), "id": "id"})[
        "completeness"
    ]
    assert (c["input"], c["done"], c["duplicates"], c["not_in_input"]) == (30, 25, 1, 1)
    assert c["not_reached"] == 5 and c["missing"] == 0
