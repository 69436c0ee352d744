"""The soak's own parts, on real processes: the plan is the seed's alone, the writer scan sees
writers (and only writers), and a decoy records the signals it gets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.soak import procs
from tests.soak.decoys import Neighbourhood
from tests.soak.run import INVALID_SETS, make_plan
from tests.waiting import wait_until


def test_the_plan_depends_on_the_seed_alone() -> None:
    runs = ["local", "remote"]
    a = [f.describe() for f in make_plan(11, 200, runs)]
    assert a == [f.describe() for f in make_plan(11, 200, runs)]
    assert a != [f.describe() for f in make_plan(12, 200, runs)]
    restarts = [f for f in make_plan(11, 200, runs) if f.kind == "restart"]
    for f in restarts:
        keys = [s.split("=")[0] for s in f.params["sets"]]
        assert len(keys) == len(set(keys)), f.describe()  # no --set overrides another
        assert f.params["invalid"] == any(s in INVALID_SETS for s in f.params["sets"])
    assert any(f.params["invalid"] for f in restarts)
    assert any(not f.params["invalid"] for f in restarts)


def test_writers_are_found_by_inode_and_readers_are_not(tmp_path: Path) -> None:
    data = tmp_path / "out" / "raw_responses.jsonl"
    data.parent.mkdir()
    data.write_bytes(b'{"sample_id": "a"}\n')
    hold = "import sys, time\nf = open(sys.argv[1], sys.argv[2])\nprint('open', flush=True)\n"
    hold += "sys.stdin.read()\n"
    procs_: list[subprocess.Popen[bytes]] = []
    try:
        for mode in ("ab", "rb"):
            p = subprocess.Popen(
                [sys.executable, "-c", hold, str(data), mode],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            procs_.append(p)
            assert p.stdout is not None and p.stdout.readline() == b"open\n"
        found = procs.writers_under(str(tmp_path), "raw_responses.jsonl")
        st = data.stat()
        writers = found[(st.st_dev, st.st_ino)]
        assert [w.pid for w in writers] == [procs_[0].pid]
        assert writers[0].argv[-1] == "ab" and int(writers[0].flags, 8) & os.O_APPEND
    finally:
        for p in procs_:
            p.kill()
            p.wait(10)
            for s in (p.stdin, p.stdout):
                if s is not None:
                    s.close()


def test_a_decoy_records_a_signal_and_retiring_it_records_nothing(tmp_path: Path) -> None:
    hood = Neighbourhood(tmp_path)
    try:
        decoy = hood.python_lookalike(tmp_path, "A1,A2")
        assert "run_inference.py" in decoy.argv and procs.alive(decoy.pid, decoy.start)
        wait_until(lambda: procs.stat(decoy.pid) is not None and _handles_term(decoy.pid))
        os.kill(decoy.pid, signal.SIGTERM)
        wait_until(lambda: "SIGTERM" in decoy.record.read_text())
        assert decoy.proc.poll() is None  # caught, still alive
        decoy.retire()
        assert decoy.retired and decoy.proc.returncode == -signal.SIGKILL
        assert decoy.record.read_text().count("\n") == 1
    finally:
        hood.close()


def _handles_term(pid: int) -> bool:
    """The process has a handler for SIGTERM (bit 15 of SigCgt)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def test_a_ledger_line_in_no_file_is_a_lost_line_with_its_offset(tmp_path: Path) -> None:
    import hashlib
    import json
    import time

    from tests.soak.run import Run, Soak

    soak = Soak(tmp_path, seed=1, minutes=1, interval=5)
    run = Run("r", "here", tmp_path / "work", ["A1"], tmp_path / "work" / "ledger.jsonl")
    soak.runs = {"r": run}
    data = run.data_file()
    data.parent.mkdir(parents=True)
    lines = [json.dumps({"sample_id": f"A1-{i}"}).encode() + b"\n" for i in range(3)]
    data.write_bytes(b"".join(lines))
    st = data.stat()
    entries, offset = [], 0
    for i, line in enumerate(lines):
        entries.append(
            {
                "sample_id": f"A1-{i}",
                "file": str(data),
                "dev": st.st_dev,
                "ino": st.st_ino,
                "offset": offset,
                "length": len(line),
                "sha1": hashlib.sha1(line).hexdigest(),
                "time": time.time(),
            }
        )
        offset += len(line)
    run.ledger.write_text("".join(json.dumps(e) + "\n" for e in entries))
    # the first line moved to a backup beside the file is kept; the last one is gone
    (data.parent / "raw_responses.jsonl.broken").write_bytes(lines[0])
    data.write_bytes(lines[1])
    stats = soak.check_ledgers()
    assert stats == {"r ledger lines": 3, "r found": 2, "r lost": 1}
    [lost] = soak.violations.items
    assert lost["kind"] == "line-lost" and lost["ledger_entry"]["sample_id"] == "A1-2"
    assert lost["ledger_entry"]["offset"] == len(lines[0]) + len(lines[1])
    assert "size" in lost["at_offset_now"]
