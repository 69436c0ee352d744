"""The agent's ``backup_files``: byte-identical copies under the output's ``.runwatch/`` before a
launch that may rewrite the data, within a size limit, never overwriting an earlier copy."""

from __future__ import annotations

import hashlib
from pathlib import Path

from supervisor.agent import datafiles


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_copies_every_non_empty_file_byte_for_byte(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    data = out / "regen.jsonl"
    data.write_bytes(b'{"id": "s1"}\n' * 5000)
    (out / "regen_error.jsonl").write_bytes(b"")  # empty: nothing to keep
    dest = out / ".runwatch" / "backup-T1"
    paths = [str(data), str(out / "regen_error.jsonl"), str(out / "nope.jsonl")]
    r = datafiles.backup_files({"paths": paths, "dest_dir": str(dest), "max_bytes": 1 << 20})
    assert r["refused"] is None
    assert [c["path"] for c in r["copied"]] == [str(data)]
    copy = Path(r["copied"][0]["copy"])
    assert copy.parent == dest and _sha(copy) == _sha(data)
    assert r["copied"][0]["bytes"] == data.stat().st_size == r["total_bytes"]
    assert r["copied"][0]["method"] in ("reflink", "copy_file_range", "copy")
    assert (dest.stat().st_mode & 0o777) == 0o700
    again = datafiles.backup_files({"paths": paths, "dest_dir": str(dest), "max_bytes": 1 << 20})
    assert again["copied"][0]["copy"] != str(copy)  # never overwrites the earlier copy
    assert _sha(copy) == _sha(data)


def test_over_the_size_limit_nothing_is_copied(tmp_path: Path) -> None:
    data = tmp_path / "out.jsonl"
    data.write_bytes(b"x\n" * 1000)
    dest = tmp_path / ".runwatch" / "b"
    r = datafiles.backup_files({"paths": [str(data)], "dest_dir": str(dest), "max_bytes": 100})
    assert r["copied"] == [] and r["total_bytes"] == 2000
    assert r["refused"] is not None and "2000 bytes" in r["refused"]
    assert not dest.exists()
