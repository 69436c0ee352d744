"""The snapshot by reflink (A2), for real: an XFS image with reflinks (btrfs where mkfs.xfs is
missing) loop-mounted in the test. The copy shares the file's blocks (the free space does not
drop by the file's size), no byte limit applies (``backup_max_bytes = 0``), and a restart whose
client truncates its output is put back from it. Skipped, with the reason, where no such
filesystem can be mounted (not root, no loop device)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.agent import snapshots
from supervisor.engine import Engine
from tests.e2e.test_snapshot import careless, clients  # noqa: F401 - the fixture
from tests.fixtures_clients import ClientRun
from tests.fixtures_reflink import reflink_mount, unavailable
from tests.waiting import wait_for

pytestmark = pytest.mark.usefixtures("state_home")


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[Path]:
    why = unavailable()
    if why:
        pytest.skip(why)
    try:
        with reflink_mount(tmp_path) as where:
            yield where
    except RuntimeError as e:
        pytest.skip(f"no reflink filesystem could be mounted: {e}")


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def test_a2_a_reflink_snapshot_shares_the_blocks_and_has_no_byte_limit(mnt: Path) -> None:
    out = mnt / "out"
    out.mkdir()
    data = out / "raw_responses.jsonl"
    with open(data, "wb") as f:
        for i in range(64):
            f.write((b'{"sample_id": "%06d", "text": "' % i) + os.urandom(1 << 19).hex().encode())
            f.write(b'"}\n')
        f.flush()
        os.fsync(f.fileno())
    size = data.stat().st_size
    before = data.read_bytes()
    root = str(out / ".runwatch" / "snapshots" / "r")
    checked = snapshots.snapshot_check({"paths": [str(data)], "root": root, "max_bytes": 0})
    assert checked["files"][0]["method"] == "reflink" and checked["unprotected"] == []
    free = _free(mnt)
    taken = snapshots.snapshot_take(
        {"paths": [str(data)], "root": root, "max_bytes": 0, "keep": 2, "run": "r"}
    )
    [entry] = taken["files"]
    assert entry["method"] == "reflink" and entry["bytes"] == size
    assert free - _free(mnt) < size // 16  # shared blocks, not a second copy
    assert Path(entry["copy"]).read_bytes() == before
    with open(data, "w") as f:
        f.write('{"sample_id": "fresh"}\n')
    [damage] = snapshots.snapshot_verify({"root": root, "id": taken["id"]})["damaged"]
    assert "shrank" in damage["why"]
    [back] = snapshots.snapshot_restore({"root": root, "id": taken["id"]})["restored"]
    assert back["method"] == "reflink" and data.read_bytes() == before
    assert Path(back["aside"]).read_bytes() == b'{"sample_id": "fresh"}\n'


async def test_a2_a_restart_on_a_reflink_filesystem_is_protected_whatever_the_size(
    mnt: Path,
    client_server: Any,
    demo_tokenizer: Path,
    clients: list[ClientRun],  # noqa: F811
) -> None:
    run = careless(mnt, client_server.url, demo_tokenizer, clients, top="backup_max_bytes = 0")
    at_stop: dict[str, bytes] = {}

    def on_step(s: Any) -> None:
        if s.name == "stop" and s.state == "ok":
            at_stop["out"] = run.output.read_bytes()
        if s.name == "launch" and s.state == "failed":
            at_stop["failed"] = run.output.read_bytes()

    async with Engine(run.config) as engine:
        first = await engine.execute(await engine.plan("sf", action="launch"))
        assert first.ok, [s.to_json() for s in first.steps]
        await wait_for(lambda: len(run.lines()) >= 5, 90, what="5 records")
        plan = await engine.plan("sf", action="restart", unsets=["resume"])
        result = await engine.execute(plan, on_step=on_step)
    steps = {s.name: s for s in result.steps}
    assert "file(s) by reflink" in steps["format-check"].detail
    assert steps["launch"].state == "failed" and "put back" in steps["launch"].detail
    kept = steps["launch"].data["snapshot"]["files"]
    assert {f["method"] for f in kept} == {"reflink"}
    assert at_stop["failed"] == at_stop["out"]
    assert run.output.read_bytes().startswith(at_stop["out"])  # the rollback appends
