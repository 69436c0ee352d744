"""How close ``runwatch bench``'s figures come to what the paced mock server is set to deliver.

The e2e tests (``tests/e2e/test_bench.py``) check only what a loaded machine cannot change (no
rate above the mock's capacity, no latency below its pacing). The figures themselves depend on
the machine being quiet, so they are measured here, in the same run, each printed as a ratio
of measured to nominal (1.00 is exact):

1. non-streaming, 48 requests of 400 tokens at concurrency 8 against 4,000 tok/s of shared
   capacity: output tok/s (nominal 4,000), req/s (10), achieved concurrency (8), p50 latency
   (0.8 s);
2. streaming, 6 requests of 100 tokens at concurrency 2, 200 tok/s each after 0.2 s of
   prefill: p50 TTFT (0.2 s), p50 time per output token (5 ms), output tok/s (285.7).

Target: every ratio within 5 % of 1; 10 % for the latency and up to 1.5 for the TTFT (the
mock's scheduling tick and the first chunk's way through the client come on top). Exit status
1 when one misses it. Run::

    .venv/bin/python tests/perf/bench_rates.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from supervisor.bench.prompts import load_prompts  # noqa: E402
from supervisor.bench.results import LevelResult  # noqa: E402
from supervisor.bench.runner import Bench, Options  # noqa: E402
from supervisor.bench.target import Target  # noqa: E402
from supervisor.demo.prompts import write_prompts  # noqa: E402
from supervisor.demo.server import MockSettings, serve_in_thread  # noqa: E402


async def _level(url: str, prompts_file: Path, options: Options, max_tokens: int) -> LevelResult:
    target = Target(name="mock", base_url=url, max_tokens=max_tokens)
    result = await Bench(target, load_prompts(prompts_file), options).run()
    (level,) = result.levels
    return level


def _rows(prompts: Path) -> list[tuple[str, float, float, float]]:
    """``(figure, measured, nominal, tolerance)`` of one round of both runs."""
    settings = MockSettings(capacity_tps=4000.0, mean_tokens=1000, length_sigma=0, tick_s=0.01)
    with serve_in_thread(settings) as h:
        lv = asyncio.run(_level(h.url, prompts, Options(requests=48, concurrency=[8]), 400))
    settings = MockSettings(
        decode_tps=200, latency_s=0.2, mean_tokens=1000, length_sigma=0, tick_s=0.01
    )
    with serve_in_thread(settings) as h:
        st = asyncio.run(
            _level(h.url, prompts, Options(requests=6, concurrency=[2], stream=True), 100)
        )
    assert st.ttft_ms is not None and st.tpot_ms is not None
    return [
        ("output tok/s", lv.output_tok_per_s, 4000.0, 0.05),
        ("req/s", lv.req_per_s, 10.0, 0.05),
        ("achieved concurrency", lv.achieved_concurrency, 8.0, 0.05),
        ("p50 latency ms", lv.latency_ms.p50 or 0.0, 800.0, 0.10),
        ("stream p50 TTFT ms", st.ttft_ms.p50 or 0.0, 200.0, 0.50),
        ("stream p50 TPOT ms", st.tpot_ms.p50 or 0.0, 5.0, 0.05),
        ("stream output tok/s", st.output_tok_per_s, 2 * 100 / 0.7, 0.05),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the median ratio is judged")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="runwatch-bench-rates-") as tmp:
        os.environ["XDG_STATE_HOME"] = str(Path(tmp) / "state")
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        prompts = Path(tmp) / "prompts"
        write_prompts(prompts, ["B1"], count=64)
        rounds = [_rows(prompts / "B1.jsonl") for _ in range(args.repeat)]
    missed = []
    print(f"{'figure':<24}{'nominal':>10}{'measured':>12}{'ratio':>8}  target")
    for i, (name, _m, nominal, tol) in enumerate(rounds[0]):
        measured = sorted(r[i][1] for r in rounds)[len(rounds) // 2]
        ratio = measured / nominal
        ok = abs(ratio - 1) <= tol
        missed += [] if ok else [name]
        print(f"{name:<24}{nominal:>10.1f}{measured:>12.1f}{ratio:>8.2f}  1 +- {tol:.2f}")
    if missed:
        print("missed:", ", ".join(missed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
