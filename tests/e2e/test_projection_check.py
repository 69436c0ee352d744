"""Projections checked against what happened: the reference client against a mock at a fixed
capacity; the ETA and the projected waste read at time t are compared with what the run really
did by its end."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import load_config
from supervisor.engine import Engine
from tests.fixtures_config import write_local_config
from tests.fixtures_demo import reference_client_argv
from tests.waiting import wait_until

TOKENS = 100
"""Every response is exactly this long (no spread), so the only unknown is the timing."""
MAX_SAMPLES = 400
BUDGET = 20_000
"""The config's budget: 200 responses. The run has no --token-budget, so it makes 400."""


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


async def test_eta_and_waste_at_t_match_what_happened_by_the_end(
    tmp_path: Path, mock_server: Any, demo_prompts: Any, spawn: Any
) -> None:
    h = mock_server(capacity_tps=1500, decode_tps=400, mean_tokens=TOKENS, length_sigma=0)
    prompts = demo_prompts(("B1",), count=1000)
    work = tmp_path / "work"
    work.mkdir()
    argv = reference_client_argv(
        h.url,
        prompts,
        work / "out",
        "B1",
        "--concurrency",
        "8",
        "--max-samples",
        str(MAX_SAMPLES),
    )
    cfg = write_local_config(
        tmp_path / "c.toml",
        f"""
[[runs]]
name = "gen"
host = "here"
workdir = "{work}"
argv = {json.dumps(argv)}
endpoint = "local"
[datasets.B1]
token_budget = {BUDGET}
[[endpoints]]
name = "local"
kind = "local"
base_url = "{h.url}"
""",
        python=True,
    )
    data = work / "out" / "B1" / "raw_responses.jsonl"
    spawn(argv, cwd=work)
    async with Engine(load_config(cfg)) as engine:
        # Look until the rate stands on 40 responses or more (an error of 1/sqrt(40) = 16 %
        # at most; the window holds far more by then) and a quarter of the work is done.
        deadline = time.monotonic() + 120
        while True:
            snap = await engine.refresh()
            run = snap.hosts[0].runs[0]
            (ds,) = run.datasets
            measured_at = time.monotonic()
            if ds.rates.tok_per_s is not None and ds.rates.responses >= 40 and ds.records >= 100:
                break
            assert time.monotonic() < deadline, "no rate within 120 s"
    assert ds.projection.stop_reason == "max_samples"
    eta = ds.projection.eta_s
    waste = ds.projection.waste_tokens
    assert eta is not None and eta > 0
    # Wait for the end the projection announced, then compare.
    wait_until(lambda: _lines(data) >= MAX_SAMPLES, 120, what="the run's last response")
    actual_s = time.monotonic() - measured_at
    tokens = _lines(data) * TOKENS
    assert actual_s == pytest.approx(eta, rel=0.10), (eta, actual_s, ds.rates)
    assert tokens - BUDGET == pytest.approx(waste, rel=0.10)
    # The run's rate never exceeds the mock's capacity by more than its stated uncertainty.
    assert run.rates.tok_per_s is not None
    assert run.rates.tok_per_s <= 1500 + (run.rates.tok_per_s_err or 0)
