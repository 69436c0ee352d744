"""The latest samples of a dataset: the agent's ``tail_records`` op (in-process and through the
real agent) and ``supervisor.samples.latest_samples`` on the real engine, real files and the
demo tokenizer."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from supervisor.agent import datafiles
from supervisor.agent.protocol import AgentOpError
from supervisor.config import Config, DatasetConfig, HostConfig, RunConfig
from supervisor.engine import Engine
from supervisor.errors import RunwatchError
from supervisor.hosts import LocalHost
from supervisor.samples import latest_samples
from supervisor.tokens import load_tokenizer
from tests.fixtures_data import dump, raw_record

SECRET = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2"


def _records(path: Path, n: int, *, tokens: int | None = None, seed: int = 1) -> list[Any]:
    rng = random.Random(seed)
    recs = [raw_record(rng, f"s{i:06d}", tokens=tokens) for i in range(n)]
    path.write_bytes(b"".join(dump(r) for r in recs))
    return recs


def test_tail_records_reads_only_complete_records_from_the_end(tmp_path: Path) -> None:
    data = tmp_path / "raw_responses.jsonl"
    recs = _records(data, 500)
    with data.open("ab") as f:
        f.write(b"not json\n[1, 2]\n")  # two lines that are not records
        f.write(dump(recs[0])[:-9])  # a record still being written: no newline yet
    got = datafiles.tail_records({"path": str(data), "count": 3})
    assert got["exists"] and got["size"] == data.stat().st_size
    assert got["records"] == recs[-3:]  # oldest first, the torn tail skipped
    assert got["bad_lines"] == 2 and got["complete"] is True
    assert datafiles.tail_records({"path": str(data), "count": 0})["records"] == []
    # Relative paths are taken from the workdir; a missing file is a result, not an error.
    rel = datafiles.tail_records({"path": data.name, "workdir": str(tmp_path), "count": 1})
    assert rel["records"] == recs[-1:]
    missing = datafiles.tail_records({"path": str(tmp_path / "none.jsonl")})
    assert missing["exists"] is False and missing["records"] == []
    with pytest.raises(AgentOpError) as e:
        datafiles.tail_records({"path": str(tmp_path)})
    assert e.value.kind == "unreadable"


def test_tail_records_grows_its_window_up_to_max_bytes(tmp_path: Path) -> None:
    data = tmp_path / "big.jsonl"
    recs = _records(data, 12, tokens=5000)  # ~35 KB a record: the first 64 KiB window holds 1
    assert len(dump(recs[-1])) > 30_000
    got = datafiles.tail_records({"path": str(data), "count": 6})
    assert got["records"] == recs[-6:] and got["complete"] is True
    # Whole file smaller than asked: everything, complete.
    assert datafiles.tail_records({"path": str(data), "count": 50})["records"] == recs
    # Bounded: what fits in max_bytes, and it says older records were left unread.
    small = datafiles.tail_records({"path": str(data), "count": 6, "max_bytes": 100_000})
    assert small["records"] == recs[-len(small["records"]) :]
    assert 1 <= len(small["records"]) < 6 and small["complete"] is False


async def test_tail_records_through_the_agent(tmp_path: Path) -> None:
    data = tmp_path / "raw_responses.jsonl"
    recs = _records(data, 40)
    host = LocalHost(HostConfig(name="local", local=True))
    hello = await host.connect()
    try:
        assert "tail_records" in hello["ops"]
        got = await host.request("tail_records", {"path": str(data), "count": 4})
        assert got["records"] == recs[-4:]
        assert got == datafiles.tail_records({"path": str(data), "count": 4})
    finally:
        await host.close()


def _config(work: Path, tokenizer: Path | None) -> Config:
    argv = ["python3", "run_inference.py", "--datasets", "B1", "--output-dir", "out"]
    return Config(
        scripts=["run_inference.py"],
        tokenizer=str(tokenizer) if tokenizer is not None else None,
        hosts=[HostConfig(name="here", local=True, command_timeout=30.0)],
        runs=[RunConfig(name="gen", host="here", workdir=str(work), argv=argv)],
        datasets={"B1": DatasetConfig(token_budget=10_000, max_samples=100)},
    )


async def test_latest_samples_decodes_the_newest_records(
    tmp_path: Path, demo_tokenizer: Path
) -> None:
    tok = load_tokenizer(demo_tokenizer)
    work = tmp_path / "work"
    (work / "out" / "B1").mkdir(parents=True)
    data = work / "out" / "B1" / "raw_responses.jsonl"
    texts = [f"answer number {i} is ready" for i in range(5)]
    texts[-1] += f" key {SECRET}"
    lines = []
    for i, text in enumerate(texts):
        ids = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
        finish = "length" if i == 4 else "stop"
        rec = {"sample_id": f"s{i}", "output_ids": ids, "completion_tokens": len(ids),
               "prompt_tokens": 3, "finish_reason": finish}  # fmt: skip
        lines.append(json.dumps(rec) + "\n")
    data.write_text("".join(lines) + '{"sample_id": "torn", "output_')
    async with Engine(_config(work, demo_tokenizer)) as engine:
        snap = await engine.refresh()
        (run,) = [r for h in snap.hosts for r in h.runs if r.name == "gen"]
        found = await latest_samples(engine, run, "B1", 2)
        assert found.exists and found.path == str(data) and found.complete
        newest, older = found.samples
        assert (newest.id, newest.finish_reason) == ("s4", "length")
        assert (older.id, older.finish_reason) == ("s3", "stop")
        assert older.tokens == len(
            tok.backend_tokenizer.encode(texts[3], add_special_tokens=False).ids
        )
        assert older.text is not None and "answer number 3 is ready" in older.text
        # Decoded text is masked like everything else shown.
        assert newest.text is not None and "answer number 4" in newest.text
        assert SECRET not in newest.text and "***" in newest.text
        with pytest.raises(RunwatchError):
            await latest_samples(engine, run, "B9", 2)
    # Without a tokenizer the ids are counted, not decoded, and the preview says why.
    async with Engine(_config(work, None)) as engine:
        snap = await engine.refresh()
        (run,) = [r for h in snap.hosts for r in h.runs if r.name == "gen"]
        (only,) = (await latest_samples(engine, run, "B1", 1)).samples
        assert only.id == "s4" and only.text is None and only.tokens is not None
        assert only.note is not None and "no tokenizer" in only.note
