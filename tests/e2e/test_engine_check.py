"""``Engine.check_run`` validates every complete line of every file, even a file the refreshes
have already scanned incrementally with sampled validation (real files, the real agent)."""

from __future__ import annotations

import random
from pathlib import Path

from supervisor.config import Config, HostConfig, RunConfig
from supervisor.engine import Engine
from tests.fixtures_data import dump, raw_record

ARGV = ["python3", "run_inference.py", "--datasets", "B1"]


def _write(path: Path, n: int, bad_at: int, bad: bytes) -> None:
    """``n`` good raw records with ``bad`` as line ``bad_at`` (1-based), far from either end."""
    rng = random.Random(4)
    with path.open("wb") as f:
        for i in range(1, n + 1):
            f.write(bad if i == bad_at else dump(raw_record(rng, f"s{i:06d}")))


async def test_check_run_catches_what_a_sampled_refresh_skipped(tmp_path: Path) -> None:
    work = tmp_path / "w"
    d = work / "out" / "B1"
    d.mkdir(parents=True)
    path = d / "raw_responses.jsonl"
    # Only a full parse of the array sees this one: its count and shape look right.
    corrupt = b'{"sample_id": "bad", "output_ids": [1,,2], "completion_tokens": 3, '
    corrupt += b'"prompt_tokens": 5, "finish_reason": "stop"}\n'
    _write(path, 200, 100, corrupt)
    config = Config(
        hosts=[HostConfig(name="here", local=True, command_timeout=30.0)],
        runs=[RunConfig(name="gen", host="here", workdir=str(work), argv=list(ARGV))],
    )
    async with Engine(config) as engine:
        snap = await engine.refresh()
        (b1,) = snap.hosts[0].runs[0].datasets
        assert b1.state == "ok" and b1.records >= 199  # sampled: the middle was not validated
        (checked,) = await engine.check_run("gen")
        assert checked["bad_lines_total"] == 1, checked
        assert checked["bad_lines"][0]["line"] == 100
        assert checked["records"] == 199
        # The refreshes go on incrementally from where they were (nothing rescanned, no change).
        snap = await engine.refresh()
        (again,) = snap.hosts[0].runs[0].datasets
        assert again.records == b1.records
