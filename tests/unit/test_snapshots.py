"""The agent's snapshots (A2): a copy of each data file before a start, checked before anything
stops, put back when the file shrank or was replaced, the file found in its place kept aside,
never while a writer is alive, pruned to N, never through a link. Real files, a real writer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.agent import snapshots
from supervisor.agent.protocol import AgentOpError


def _setup(tmp_path: Path) -> tuple[Path, Path, str]:
    out = tmp_path / "out"
    (out / "B1").mkdir(parents=True)
    data = out / "B1" / "raw_responses.jsonl"
    data.write_bytes(b'{"sample_id": "s1"}\n' * 3000)
    root = str(out / ".runwatch" / "snapshots" / "r")
    return out, data, root


def _take(data: Path, root: str, keep: int = 3, limit: int = 1 << 30) -> dict:
    return snapshots.snapshot_take(
        {"paths": [str(data)], "root": root, "max_bytes": limit, "keep": keep, "run": "r"}
    )


def test_a_truncated_file_is_put_back_byte_for_byte_and_the_truncated_one_kept(
    tmp_path: Path,
) -> None:
    _, data, root = _setup(tmp_path)
    before = data.read_bytes()
    mode = 0o640
    data.chmod(mode)
    taken = _take(data, root)
    [entry] = taken["files"]
    assert entry["method"] in ("reflink", "copy_file_range", "copy") and entry["bytes"] == len(
        before
    )
    assert Path(entry["copy"]).read_bytes() == before
    assert (Path(taken["dir"]).stat().st_mode & 0o777) == 0o700
    assert (Path(entry["copy"]).stat().st_mode & 0o777) == 0o600
    assert snapshots.snapshot_verify({"root": root, "id": taken["id"]}) == {"damaged": []}
    with open(data, "w") as f:  # a client opening its output with "w"
        f.write('{"sample_id": "new"}\n')
    [damage] = snapshots.snapshot_verify({"root": root, "id": taken["id"]})["damaged"]
    assert damage["path"] == str(data) and "shrank" in damage["why"]
    done = snapshots.snapshot_restore({"root": root, "id": taken["id"], "damaged_only": True})
    [restored] = done["restored"]
    assert data.read_bytes() == before
    assert (data.stat().st_mode & 0o777) == mode
    aside = Path(restored["aside"])
    assert aside.name.startswith("raw_responses.jsonl.after-")
    assert aside.read_bytes() == b'{"sample_id": "new"}\n'
    assert snapshots.snapshot_verify({"root": root, "id": taken["id"]})["damaged"][0]["why"]


def test_a_replaced_file_of_the_same_size_is_damage(tmp_path: Path) -> None:
    _, data, root = _setup(tmp_path)
    taken = _take(data, root)
    other = data.with_name("tmp")
    other.write_bytes(data.read_bytes() + b"more\n")
    os.replace(other, data)  # bigger, but another inode: the old records may be anything
    [damage] = snapshots.snapshot_verify({"root": root, "id": taken["id"]})["damaged"]
    assert "replaced" in damage["why"]


def test_growth_is_not_damage(tmp_path: Path) -> None:
    _, data, root = _setup(tmp_path)
    taken = _take(data, root)
    with open(data, "ab") as f:
        f.write(b'{"sample_id": "s2"}\n')
    assert snapshots.snapshot_verify({"root": root, "id": taken["id"]}) == {"damaged": []}
    assert snapshots.snapshot_restore({"root": root, "id": taken["id"], "damaged_only": True}) == {
        "restored": []
    }


def test_a_restore_is_refused_while_a_writer_is_alive(tmp_path: Path) -> None:
    _, data, root = _setup(tmp_path)
    before = data.read_bytes()
    taken = _take(data, root)
    code = "import sys; f = open(sys.argv[1], 'w'); print('open', flush=True); sys.stdin.read()"
    writer = subprocess.Popen(
        [sys.executable, "-c", code, str(data)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"open\n"
        with pytest.raises(AgentOpError) as refused:
            snapshots.snapshot_restore({"root": root, "id": taken["id"]})
        assert refused.value.kind == "writer-alive" and str(writer.pid) in str(refused.value)
        assert data.read_bytes() == b"" and not list(data.parent.glob("*.after-*"))
    finally:
        assert writer.stdin is not None
        writer.stdin.close()
        writer.wait(10)
    snapshots.snapshot_restore({"root": root, "id": taken["id"]})
    assert data.read_bytes() == before


def test_pruning_keeps_the_newest_n(tmp_path: Path) -> None:
    _, data, root = _setup(tmp_path)
    ids = []
    for i in range(5):
        with open(data, "ab") as f:
            f.write(b'{"sample_id": "x%d"}\n' % i)
        ids.append(_take(data, root, keep=2)["id"])
    listed = snapshots.snapshot_list({"root": root})["snapshots"]
    assert [s["id"] for s in listed] == ids[:-3:-1]  # newest first
    assert sorted(os.listdir(root)) == sorted(ids[-2:])
    assert listed[0]["files"][0]["bytes"] == data.stat().st_size


def test_over_the_copy_limit_without_reflink_the_check_says_unprotected(tmp_path: Path) -> None:
    _, data, root = _setup(tmp_path)
    checked = snapshots.snapshot_check({"paths": [str(data)], "root": root, "max_bytes": 10})
    [f] = checked["files"]
    if f["method"] == "reflink":
        pytest.skip(f"{tmp_path} is on a filesystem with reflinks: no limit applies")
    assert f["method"] == "none" and checked["unprotected"]
    assert "backup_max_bytes" in checked["unprotected"][0]
    assert [p for p in Path(root).iterdir()] == []  # the probe leaves nothing
    roomy = snapshots.snapshot_check({"paths": [str(data)], "root": root, "max_bytes": 1 << 20})
    assert roomy["files"][0]["method"] == "copy" and roomy["copy_bytes"] == data.stat().st_size
    # missing and empty files need no copy
    empty = data.with_name("empty.jsonl")
    empty.write_bytes(b"")
    none = snapshots.snapshot_check(
        {"paths": [str(empty), str(data.with_name("nope"))], "root": root, "max_bytes": 0}
    )
    assert [f["method"] for f in none["files"]] == ["empty", "empty"] and not none["unprotected"]


def test_a_data_file_that_is_a_link_is_never_followed(tmp_path: Path) -> None:
    _, data, root = _setup(tmp_path)
    secret = tmp_path / "elsewhere"
    secret.write_bytes(b"not the run's\n")
    link = data.with_name("linked.jsonl")
    link.symlink_to(secret)
    checked = snapshots.snapshot_check({"paths": [str(link)], "root": root, "max_bytes": 1 << 20})
    assert checked["files"][0]["method"] == "none" and "symbolic link" in checked["unprotected"][0]
    taken = _take(link, root)
    assert taken["id"] == "" and "symbolic link" in taken["unprotected"][0]


def test_a_snapshot_root_that_is_a_link_is_refused(tmp_path: Path) -> None:
    out, data, root = _setup(tmp_path)
    (out / ".runwatch").mkdir()
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir()
    (out / ".runwatch" / "snapshots").symlink_to(elsewhere)
    with pytest.raises(AgentOpError) as refused:
        _take(data, root)
    assert refused.value.kind == "unsafe-path"
    assert list(elsewhere.iterdir()) == []


def test_a_restore_names_only_files_of_the_snapshot(tmp_path: Path) -> None:
    _, data, root = _setup(tmp_path)
    taken = _take(data, root)
    with pytest.raises(AgentOpError) as refused:
        snapshots.snapshot_restore(
            {"root": root, "id": taken["id"], "paths": [str(tmp_path / "other")]}
        )
    assert refused.value.kind == "missing"
    for bad in ("..", "a/b", ""):
        with pytest.raises(AgentOpError):
            snapshots.snapshot_restore({"root": root, "id": bad})


def test_a_file_rewritten_from_its_start_and_grown_past_its_size_is_damage(
    tmp_path: Path,
) -> None:
    """A client that opens its output with "w" and writes more than was there within its settle
    time: same inode, bigger, but not the data that was kept."""
    _, data, root = _setup(tmp_path)
    before = data.read_bytes()
    taken = _take(data, root)
    with open(data, "w") as f:
        f.write('{"sample_id": "other"}\n' * 4000)
    assert data.stat().st_size > len(before)
    [damage] = snapshots.snapshot_verify({"root": root, "id": taken["id"]})["damaged"]
    assert "rewritten" in damage["why"]
    snapshots.snapshot_restore({"root": root, "id": taken["id"], "damaged_only": True})
    assert data.read_bytes() == before


def test_a_torn_last_line_cut_by_the_client_is_not_damage(tmp_path: Path) -> None:
    """A client may drop a partial last line on start: only complete lines must stay."""
    _, data, root = _setup(tmp_path)
    with open(data, "ab") as f:
        f.write(b'{"sample_id": "s9", "cut')
    taken = _take(data, root)
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size - len(b'{"sample_id": "s9", "cut'))
    assert snapshots.snapshot_verify({"root": root, "id": taken["id"]}) == {"damaged": []}
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size - 1)  # one byte of a complete line: damage
    assert snapshots.snapshot_verify({"root": root, "id": taken["id"]})["damaged"]


def test_a_fifo_in_a_data_files_place_never_blocks_and_is_unprotected(tmp_path: Path) -> None:
    _, data, root = _setup(tmp_path)
    fifo = data.with_name("fifo.jsonl")
    os.mkfifo(fifo)
    paths = [str(data), str(fifo)]
    checked = snapshots.snapshot_check({"paths": paths, "root": root, "max_bytes": 1 << 30})
    assert [f["method"] for f in checked["files"]][1] == "none"
    assert "not a regular file" in checked["unprotected"][0]
    taken = snapshots.snapshot_take({"paths": paths, "root": root, "max_bytes": 1 << 30, "keep": 2})
    assert [f["path"] for f in taken["files"]] == [str(data)]
    assert "not a regular file" in taken["unprotected"][0]
