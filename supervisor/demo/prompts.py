"""Deterministic demo prompts for datasets B1..B8, each with its own mix of prompt lengths.

``write_prompts(dir)`` writes ``<dir>/<B>.jsonl``, one ``{"sample_id", "messages"}`` object per
line, the same bytes on every machine and every call (seeded by the dataset name).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Iterable
from pathlib import Path

from supervisor.demo.tokenizer import WORDS

DATASETS = ("B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8")

# Per dataset: (weight, fewest words, most words) of each kind of prompt, and turns per chat.
LENGTH_MIXES: dict[str, tuple[list[tuple[float, int, int]], int]] = {
    "B1": ([(1.0, 8, 40)], 1),  # short questions
    "B2": ([(1.0, 40, 200)], 1),  # medium instructions
    "B3": ([(1.0, 300, 900)], 1),  # long documents to work on
    "B4": ([(0.7, 10, 30), (0.3, 400, 1200)], 1),  # bimodal: quick asks and long pastes
    "B5": ([(1.0, 20, 80)], 3),  # multi-turn conversations
    "B6": ([(1.0, 150, 500)], 1),  # medium-long
    "B7": ([(1.0, 3, 15)], 1),  # very short
    "B8": ([(0.5, 10, 100), (0.4, 100, 600), (0.1, 600, 1500)], 1),  # long-tailed
}


def _text(rng: random.Random, n: int) -> str:
    words = rng.choices(WORDS, k=n)
    sentences = []
    i = 0
    while i < len(words):
        k = rng.randint(6, 18)
        part = words[i : i + k]
        part[0] = part[0].capitalize()
        sentences.append(" ".join(part) + rng.choice((".", ".", ".", "?", "!")))
        i += k
    return " ".join(sentences)


def prompt_records(dataset: str, count: int) -> list[dict[str, object]]:
    """The first ``count`` prompts of ``dataset`` (any name; B1..B8 have their own length mixes)."""
    mix, turns = LENGTH_MIXES.get(dataset, ([(1.0, 20, 200)], 1))
    rng = random.Random(f"runwatch-demo-prompts:{dataset}")
    weights = [w for w, _, _ in mix]
    records: list[dict[str, object]] = []
    for i in range(count):
        messages = []
        for turn in range(turns):
            _, lo, hi = rng.choices(mix, weights=weights)[0]
            messages.append({"role": "user", "content": _text(rng, rng.randint(lo, hi))})
            if turn < turns - 1:
                messages.append({"role": "assistant", "content": _text(rng, rng.randint(20, 120))})
        records.append({"sample_id": f"{dataset}-{i:06d}", "messages": messages})
    return records


def write_prompts(
    directory: str | os.PathLike[str], datasets: Iterable[str] = DATASETS, count: int = 1000
) -> dict[str, Path]:
    """Write ``<directory>/<dataset>.jsonl`` for each dataset (atomically); return their paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name in datasets:
        data = "".join(json.dumps(r) + "\n" for r in prompt_records(name, count)).encode()
        path = out / f"{name}.jsonl"
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        paths[name] = path
    return paths


def write_sharegpt(path: str | os.PathLike[str], dataset: str, count: int = 1000) -> Path:
    """Write the prompts of ``dataset`` as ShareGPT rows (``{"id", "conversations"}``), the input
    of the SpecForge and Model-Optimizer generation scripts; return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = (
        {"id": r["sample_id"], "conversations": r["messages"]}
        for r in prompt_records(dataset, count)
    )
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out
