"""The agent's memory for the ids of a file of 10 M records, each id distinct.

Three fresh processes, each scanning one generated ``raw`` file of ``--records`` short records
(the same bytes per line) with the agent's ``Scanner``, report their peak RSS (``VmHWM``: their
own memory's; ``ru_maxrss`` keeps the parent's RSS at the fork across exec):

1. **unique**: every record has its own id (the case the ids cost memory for);
2. **baseline**: every record has the same id, so the ids cost nothing: what the scan needs
   without them;
3. **set**: the ids of the unique file in a plain Python ``set`` of the bytes the scanner
   remembers, the structure the scanner kept them in before (built in a fresh process too).

Targets: the unique scan's peak RSS at most 100 MB, its ids at most 8 bytes an id over the
baseline (``(unique - baseline) / records``); printed beside them the ratios against the baseline
and against the set, and each scan's time against the baseline's (no target: a figure). The
counts must be exact (``unique_ids == records``, no duplicates). Run::

    .venv/bin/python tests/perf/bench_scan_ids.py                  # 10 M records
    .venv/bin/python tests/perf/bench_scan_ids.py --records 2000000

Exit status 1 when a target is missed. The temporary directory is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINE = (
    b'{"sample_id": "B2-%09d", "output_ids": [11, 12, 13], "prompt_tokens": 50, '
    b'"completion_tokens": 3, "finish_reason": "stop"}\n'
)
MAX_RSS_MB = 100.0
MAX_BYTES_PER_ID = 8.0

PEAK = """
def hwm_kb():
    # The peak RSS of this process's own memory: getrusage's ru_maxrss keeps the parent's RSS
    # at the fork across exec (Linux), so it would count the benchmark's own memory.
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
"""

SCAN = (
    PEAK
    + """
import json, sys, time
sys.path.insert(0, sys.argv[2])
from supervisor.agent.scan import Scanner
t = time.perf_counter()
r = Scanner().scan(sys.argv[1])
print(json.dumps({"seconds": time.perf_counter() - t, "records": r["records"],
                  "unique": r["unique_ids"], "duplicates": r["duplicates"],
                  "rss_kb": hwm_kb()}))
"""
)

SET = (
    PEAK
    + """
import json, sys, time
t = time.perf_counter()
ids = set()
with open(sys.argv[1], "rb") as f:
    for line in f:
        ids.add(line[15:27])
print(json.dumps({"seconds": time.perf_counter() - t, "records": len(ids), "unique": len(ids),
                  "duplicates": 0,
                  "rss_kb": hwm_kb()}))
"""
)


def generate(path: Path, records: int, unique: bool) -> None:
    with path.open("wb") as f:
        for start in range(0, records, 100_000):
            stop = min(start + 100_000, records)
            f.write(b"".join(LINE % (i if unique else 0) for i in range(start, stop)))


def measure(code: str, path: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", code, str(path), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=10_000_000)
    args = ap.parse_args()
    n = args.records
    tmp = Path(tempfile.mkdtemp(prefix="bench-scan-ids-"))
    missed: list[str] = []
    try:
        unique_file, same_file = tmp / "unique.jsonl", tmp / "same.jsonl"
        generate(unique_file, n, True)
        generate(same_file, n, False)
        base = measure(SCAN, same_file)
        uniq = measure(SCAN, unique_file)
        plain = measure(SET, unique_file)
        assert (uniq["records"], uniq["unique"], uniq["duplicates"]) == (n, n, 0), uniq
        assert (base["records"], base["unique"], base["duplicates"]) == (n, 1, n - 1), base
        assert plain["unique"] == n, plain
        mb = {k: v["rss_kb"] / 1024 for k, v in (("u", uniq), ("b", base), ("s", plain))}
        per_id = (uniq["rss_kb"] - base["rss_kb"]) * 1024 / n
        print(f"{n:,} records of {len(LINE)} bytes, peak RSS of a fresh process:")
        print(f"  baseline (one id):     {mb['b']:7.1f} MB, scan {base['seconds']:.2f} s")
        ok = mb["u"] <= MAX_RSS_MB
        missed += [] if ok else ["unique RSS"]
        print(
            f"  unique ids:            {mb['u']:7.1f} MB ({mb['u'] / mb['b']:.2f}x the baseline),"
            f" scan {uniq['seconds']:.2f} s ({uniq['seconds'] / base['seconds']:.2f}x the"
            f" baseline's); target <= {MAX_RSS_MB:g} MB: {'ok' if ok else 'MISSED'}"
        )
        ok = per_id <= MAX_BYTES_PER_ID
        missed += [] if ok else ["bytes per id"]
        print(
            f"  ids over the baseline: {per_id:7.2f} bytes an id; target <= {MAX_BYTES_PER_ID:g}:"
            f" {'ok' if ok else 'MISSED'}"
        )
        print(
            f"  a Python set of the ids (the former structure): {mb['s']:.1f} MB; "
            f"unique scan / set: {mb['u'] / mb['s']:.3f}x"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if missed:
        print("missed:", ", ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
