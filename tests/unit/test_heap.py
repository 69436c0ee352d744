"""The C heap's free pages go back to the system (``supervisor.heap``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.heap import Trimmer

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")

# In a fresh interpreter: 24 MB of 4 kB objects (each one of malloc's, not of Python's own
# arenas), all freed but the last, which keeps the heap's top in use: glibc keeps the freed pages
# resident until they are released.
FRAGMENT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from supervisor.heap import release

def heap_kb():
    rss, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            inside = line.rstrip().endswith("[heap]")
        elif inside and head[0] == "Rss:":
            rss += int(head[1])
    return rss

blocks = [bytes(4000) for _ in range(6000)]
pin = blocks[-1]
full = heap_kb()
del blocks
freed = heap_kb()
ok = release()
print(json.dumps({"full": full, "freed": freed, "released": heap_kb(), "ok": ok}))
"""


def test_release_gives_freed_heap_pages_back() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FRAGMENT, str(ROOT)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    kb = json.loads(out.stdout)
    assert kb["ok"] is True
    # Freed but kept: the heap still holds (nearly) all of it.
    assert kb["freed"] > kb["full"] - 4_000, kb
    # Released: at least 20 of the 24 MB are given back.
    assert kb["released"] < kb["freed"] - 20_000, kb


def test_trimmer_releases_at_most_once_per_period() -> None:
    t = Trimmer(every=60.0)
    assert t.maybe(1000.0) is True
    assert t.maybe(1030.0) is False
    assert t.maybe(1059.9) is False
    assert t.maybe(1060.0) is True
    assert t.maybe(1061.0) is False
