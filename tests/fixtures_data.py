"""Generators of dataset files with known ground truth, one per record format."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from supervisor.agent.scan import Scanner


@dataclass
class Truth:
    """What a generated file holds, computed independently of the scanner."""

    records: int = 0
    ids: set[Any] = field(default_factory=set)
    duplicates: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reasons: Counter[str] = field(default_factory=Counter)

    def add(self, sample_id: Any, prompt: int, completion: int, finish: str | None) -> None:
        self.records += 1
        if sample_id in self.ids:
            self.duplicates += 1
        self.ids.add(sample_id)
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        if finish is not None:
            self.finish_reasons[finish] += 1

    def check(self, result: dict[str, Any]) -> None:
        assert result["records"] == self.records
        assert result["unique_ids"] == len(self.ids)
        assert result["duplicates"] == self.duplicates
        assert result["prompt_tokens"] == self.prompt_tokens
        assert result["completion_tokens"] == self.completion_tokens
        assert result["finish_reasons"] == dict(self.finish_reasons)


def raw_record(
    rng: random.Random, sample_id: str, tokens: int | None = None, finish: str | None = None
) -> dict[str, Any]:
    n = rng.randint(1, 60) if tokens is None else tokens
    return {
        "sample_id": sample_id,
        "output_ids": [rng.randint(0, 163_839) for _ in range(n)],
        "prompt_tokens": rng.randint(5, 400),
        "completion_tokens": n,
        "finish_reason": finish or rng.choice(["stop", "stop", "stop", "length"]),
    }


def legacy_record(rng: random.Random, sample_id: str) -> dict[str, Any]:
    n = rng.randint(1, 60)
    return {
        "sample_id": sample_id,
        "text": " ".join(f"w{rng.randint(0, 99)}" for _ in range(n)),
        "prompt_tokens": rng.randint(5, 400),
        "completion_tokens": n,
        "finish_reason": "stop",
    }


def specforge_record(rng: random.Random, ident: str) -> dict[str, Any]:
    return {
        "id": ident,
        "conversations": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": f"Question {rng.randint(0, 999)}?"},
            {"role": "assistant", "content": f"Answer é {rng.randint(0, 999)}."},
        ],
        "status": rng.choice(["success", "success", "success", "error"]),
    }


def modelopt_record(rng: random.Random, ident: str, truncated: bool = False) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "conversation_id": ident,
        "conversations": [
            {"role": "user", "content": f"Tell me {rng.randint(0, 999)}"},
            {"role": "assistant", "content": f"Sure: {rng.randint(0, 999)}"},
        ],
    }
    if truncated:
        rec["truncated"] = True
    return rec


def speculators_record(rng: random.Random, ident: str) -> dict[str, Any]:
    p, c = rng.randint(3, 30), rng.randint(1, 40)
    return {
        "id": ident,
        "input_ids": [rng.randint(0, 150_000) for _ in range(p + c)],
        "loss_mask": [0] * p + [1] * c,
        "text": "prompt and answer",
        "metadata": {
            "finish_reason": rng.choice(["stop", "length"]),
            "usage": {"prompt_tokens": p, "completion_tokens": c},
        },
    }


def query_record(rng: random.Random, ident: str, thinking: bool) -> dict[str, Any]:
    """A line of Model-Optimizer ``tools/launcher/common/query.py`` output (``datasets``
    ``to_json`` of its ``synthesize`` map): the input row's columns with ``messages`` replaced by
    the conversation as sent, the system and user turns interleaved with the generated assistant
    turns; every assistant turn but the last stripped of its ``<think>`` trace; on the shards it
    runs without thinking (even ones) ``enable_thinking: false`` and ``" /no_think"`` after each
    user turn."""
    turns = rng.randint(1, 3)
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a careful tutor."}]
    for t in range(turns):
        question = f"Question {rng.randint(0, 999)}: explain step {t} of the proof in detail."
        messages.append(
            {"role": "user", "content": question if thinking else question + " /no_think"}
        )
        answer = " ".join(f"w{rng.randint(0, 99)}" for _ in range(rng.randint(5, 40)))
        if thinking and t == turns - 1:
            answer = f"<think>\nreasoning {rng.randint(0, 999)}\n</think>\n\n{answer}"
        messages.append({"role": "assistant", "content": answer})
    row: dict[str, Any] = {"conversation_id": ident, "messages": messages}
    if not thinking:
        row["enable_thinking"] = False
    return row


def dump(record: Any) -> bytes:
    return json.dumps(record, ensure_ascii=False).encode() + b"\n"


def make_raw(
    path: Path, n: int, seed: int = 0, dup_every: int = 0, id_space: int | None = None
) -> Truth:
    """Write ``n`` raw records (every ``dup_every``-th repeats an earlier id); their truth."""
    rng = random.Random(seed)
    truth = Truth()
    with path.open("wb") as f:
        for i in range(n):
            if dup_every and i and i % dup_every == 0:
                sid = f"s{rng.randrange(i):06d}"
            else:
                sid = f"s{i if id_space is None else rng.randrange(id_space):06d}"
            rec = raw_record(rng, sid)
            truth.add(sid, rec["prompt_tokens"], rec["completion_tokens"], rec["finish_reason"])
            f.write(dump(rec))
    return truth


def raw_lines(n: int, seed: int = 0) -> tuple[list[bytes], Truth]:
    rng = random.Random(seed)
    truth = Truth()
    lines = []
    for i in range(n):
        rec = raw_record(rng, f"s{i:06d}")
        truth.add(
            rec["sample_id"], rec["prompt_tokens"], rec["completion_tokens"], rec["finish_reason"]
        )
        lines.append(dump(rec))
    return lines, truth


@pytest.fixture
def scanner() -> Scanner:
    return Scanner()


@pytest.fixture
def tiny_chunk_scanner() -> Scanner:
    """Reads 7 bytes at a time: every line and most characters straddle reads."""
    return Scanner(chunk_size=7)
