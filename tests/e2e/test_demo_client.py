"""The reference client ``run_inference.py``, run as a real process against real mock servers."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fixtures_demo import reference_client_argv
from tests.waiting import wait_until


def _records(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "torn last line"
    return [json.loads(line) for line in data.splitlines()]


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def test_writes_one_current_format_line_per_response(
    mock_server: Any, demo_prompts: Any, tmp_path: Path
) -> None:
    h = mock_server(mean_tokens=80)
    prompts = demo_prompts(("B1", "B2"), count=30)
    out = tmp_path / "out"
    r = _run(reference_client_argv(h.url, prompts, out, "B1,B2", "--max-samples", "12"))
    assert r.returncode == 0, r.stdout + r.stderr
    for ds in ("B1", "B2"):
        recs = _records(out / ds / "raw_responses.jsonl")
        assert len(recs) == 12
        assert len({x["sample_id"] for x in recs}) == 12
        assert all(x["sample_id"].startswith(f"{ds}-") for x in recs)
        for x in recs:
            assert set(x) == {
                "sample_id",
                "output_ids",
                "prompt_tokens",
                "completion_tokens",
                "finish_reason",
            }
            assert len(x["output_ids"]) == x["completion_tokens"] > 0
            assert x["prompt_tokens"] > 0
            assert x["finish_reason"] in ("stop", "length")


def test_legacy_format_stores_text(mock_server: Any, demo_prompts: Any, tmp_path: Path) -> None:
    h = mock_server(mean_tokens=40)
    prompts = demo_prompts(("B3",), count=10)
    out = tmp_path / "out"
    argv = reference_client_argv(h.url, prompts, out, "B3", "--legacy-format", "--max-samples", "4")
    r = _run(argv)
    assert r.returncode == 0, r.stdout
    recs = _records(out / "B3" / "raw_responses.jsonl")
    assert len(recs) == 4
    assert all("text" in x and "output_ids" not in x and x["text"] for x in recs)


def test_max_samples_stops_at_the_count_with_concurrency(
    mock_server: Any, demo_prompts: Any, tmp_path: Path
) -> None:
    h = mock_server(mean_tokens=50)
    prompts = demo_prompts(("B2",), count=100)
    out = tmp_path / "out"
    argv = reference_client_argv(h.url, prompts, out, "B2", "--max-samples", "37")
    r = _run([*argv, "--concurrency", "8"])
    assert r.returncode == 0, r.stdout
    assert len(_records(out / "B2" / "raw_responses.jsonl")) == 37
    assert "--max-samples 37 reached" in r.stdout
    # A second run has nothing left to do.
    again = _run([*argv, "--concurrency", "8"])
    assert again.returncode == 0
    assert len(_records(out / "B2" / "raw_responses.jsonl")) == 37
    assert h.stats()["requests"] == 37


def test_token_budget_stops_within_one_response(
    mock_server: Any, demo_prompts: Any, tmp_path: Path
) -> None:
    h = mock_server(mean_tokens=300, seed=4)
    prompts = demo_prompts(("B4",), count=200)
    out = tmp_path / "out"
    budget = 5000
    argv = reference_client_argv(h.url, prompts, out, "B4", "--token-budget", str(budget))
    r = _run([*argv, "--concurrency", "1"])
    assert r.returncode == 0, r.stdout
    recs = _records(out / "B4" / "raw_responses.jsonl")
    tokens = [x["completion_tokens"] for x in recs]
    assert sum(tokens) >= budget
    assert sum(tokens) - tokens[-1] < budget  # the last response is the one that crossed it
    assert len(recs) < 200


def test_prompts_run_out_before_the_limits(
    mock_server: Any, demo_prompts: Any, tmp_path: Path
) -> None:
    h = mock_server(mean_tokens=20)
    prompts = demo_prompts(("B7",), count=9)
    out = tmp_path / "out"
    r = _run(reference_client_argv(h.url, prompts, out, "B7", "--max-samples", "50"))
    assert r.returncode == 0
    assert len(_records(out / "B7" / "raw_responses.jsonl")) == 9


def test_retries_429_500_and_resets_without_losing_or_duplicating(
    mock_server: Any, demo_prompts: Any, tmp_path: Path
) -> None:
    h = mock_server(
        mean_tokens=30, error_429=0.25, error_500=0.15, error_reset=0.1, retry_after=0.05, seed=8
    )
    prompts = demo_prompts(("B5",), count=40)
    out = tmp_path / "out"
    argv = reference_client_argv(h.url, prompts, out, "B5", "--max-samples", "40")
    r = _run([*argv, "--concurrency", "4", "--max-retries", "30"])
    assert r.returncode == 0, r.stdout
    recs = _records(out / "B5" / "raw_responses.jsonl")
    assert sorted(x["sample_id"] for x in recs) == [f"B5-{i:06d}" for i in range(40)]
    by_status = h.stats()["by_status"]
    assert by_status["200"] == 40
    assert by_status["429"] > 0 and by_status["500"] > 0 and by_status["reset"] > 0


def test_resume_after_sigkill_has_no_duplicates_and_no_torn_line(
    mock_server: Any, demo_prompts: Any, tmp_path: Path, spawn: Any
) -> None:
    # Slow, capacity-bound answers so that the kill lands with requests in flight.
    h = mock_server(mean_tokens=60, decode_tps=400, capacity_tps=1000, tick_s=0.02)
    prompts = demo_prompts(("B2",), count=80)
    out = tmp_path / "out"
    data = out / "B2" / "raw_responses.jsonl"
    argv = reference_client_argv(h.url, prompts, out, "B2", "--max-samples", "60")
    argv += ["--concurrency", "6"]
    log = open(tmp_path / "first.log", "wb")  # noqa: SIM115 - closed below
    first = spawn(argv, stdout=log, stderr=subprocess.STDOUT)

    def lines() -> int:
        return data.read_bytes().count(b"\n") if data.exists() else 0

    wait_until(lambda: lines() >= 5, timeout=20, what="the first responses")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    log.close()
    before = lines()
    assert before < 60, "the run finished before the kill; make it slower"
    r = _run(argv)
    assert r.returncode == 0, r.stdout
    recs = _records(data)
    ids = [x["sample_id"] for x in recs]
    assert len(ids) == len(set(ids)) == 60
    assert f"{before} samples" in r.stdout  # the restart counted what was there


def test_resume_moves_a_torn_last_line_aside(
    mock_server: Any, demo_prompts: Any, tmp_path: Path
) -> None:
    h = mock_server(mean_tokens=30)
    prompts = demo_prompts(("B2",), count=20)
    out = tmp_path / "out"
    argv = reference_client_argv(h.url, prompts, out, "B2", "--max-samples", "3")
    assert _run(argv).returncode == 0
    data = out / "B2" / "raw_responses.jsonl"
    good = data.read_bytes()
    fragment = b'{"sample_id": "B2-000003", "output_ids": [12, 4'
    data.write_bytes(good + fragment)  # what a writer killed in mid-write would leave
    argv6 = reference_client_argv(h.url, prompts, out, "B2", "--max-samples", "6")
    r = _run(argv6)
    assert r.returncode == 0, r.stdout
    assert data.read_bytes().startswith(good)
    recs = _records(data)
    ids = [x["sample_id"] for x in recs]
    assert len(ids) == len(set(ids)) == 6
    assert "B2-000003" in ids  # the torn sample was not counted, so it was asked again
    assert (out / "B2" / "raw_responses.jsonl.torn").read_bytes() == fragment + b"\n"
    assert "incomplete last line" in r.stdout


def test_resume_skips_ids_in_the_legacy_format(
    mock_server: Any, demo_prompts: Any, tmp_path: Path
) -> None:
    h = mock_server(mean_tokens=30)
    prompts = demo_prompts(("B3",), count=10)
    data = tmp_path / "out" / "B3" / "raw_responses.jsonl"
    data.parent.mkdir(parents=True)
    legacy = [
        {"sample_id": f"B3-{i:06d}", "text": "old words", "completion_tokens": 2} for i in (0, 2)
    ]
    data.write_text("".join(json.dumps(x) + "\n" for x in legacy) + "not json\n")
    argv = reference_client_argv(h.url, prompts, tmp_path / "out", "B3", "--max-samples", "5")
    r = _run(argv)
    assert r.returncode == 0, r.stdout
    recs = [json.loads(line) for line in data.read_text().splitlines() if line != "not json"]
    ids = [x["sample_id"] for x in recs]
    assert len(ids) == len(set(ids)) == 5
    assert h.stats()["requests"] == 3
    assert "1 bad lines" in r.stdout


def test_api_key_comes_from_the_environment_and_is_never_printed(
    mock_server: Any, demo_prompts: Any, tmp_path: Path
) -> None:
    key = "sk-demo-0123456789abcdef"
    h = mock_server(api_key=key, mean_tokens=20)
    prompts = demo_prompts(("B6",), count=5)
    out = tmp_path / "out"
    argv = reference_client_argv(h.url, prompts, out, "B6", "--api-key-env", "DEMO_KEY_VAR")
    r = _run(argv, env={**os.environ, "DEMO_KEY_VAR": key})
    assert r.returncode == 0, r.stdout
    assert len(_records(out / "B6" / "raw_responses.jsonl")) == 5
    assert key not in r.stdout + r.stderr
    missing = _run(argv, env={k: v for k, v in os.environ.items() if k != "DEMO_KEY_VAR"})
    assert missing.returncode == 2
    assert "DEMO_KEY_VAR is not set" in missing.stdout
    wrong_key = "sk-wrong-9876543210"
    fresh = reference_client_argv(
        h.url, prompts, tmp_path / "out2", "B6", "--api-key-env", "DEMO_KEY_VAR"
    )
    for extra in ([], ["--model", "named"]):  # refused when listing models, or when generating
        wrong = _run([*fresh, *extra], env={**os.environ, "DEMO_KEY_VAR": wrong_key})
        assert wrong.returncode == 1
        assert "HTTP 401" in wrong.stdout
        assert wrong_key not in wrong.stdout + wrong.stderr
    assert not (tmp_path / "out2" / "B6" / "raw_responses.jsonl").read_bytes()


def test_a_second_writer_of_the_same_dataset_is_refused(
    mock_server: Any, demo_prompts: Any, tmp_path: Path
) -> None:
    h = mock_server(mean_tokens=20)
    prompts = demo_prompts(("B8",), count=5)
    data = tmp_path / "out" / "B8" / "raw_responses.jsonl"
    data.parent.mkdir(parents=True)
    with open(data, "ab") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        r = _run(reference_client_argv(h.url, prompts, tmp_path / "out", "B8"))
    assert r.returncode == 3
    assert "another process" in r.stdout
    assert h.stats()["requests"] == 0


def test_model_defaults_to_the_first_listed(
    mock_server: Any, demo_prompts: Any, tmp_path: Path
) -> None:
    h = mock_server(mean_tokens=20, model="listed-model")
    prompts = demo_prompts(("B1",), count=3)
    r = _run(reference_client_argv(h.url, prompts, tmp_path / "out", "B1"))
    assert r.returncode == 0
    assert "(model listed-model)" in r.stdout


def _client_module() -> Any:
    import importlib.util

    from tests.fixtures_demo import REFERENCE_CLIENT

    name = "demo_run_inference"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REFERENCE_CLIENT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_torn_tail_handling_keeps_every_complete_line(tmp_path: Path) -> None:
    ri = _client_module()
    f = tmp_path / "raw_responses.jsonl"
    cases = [
        (b"", b"", b""),
        (b'{"a": 1}\n', b'{"a": 1}\n', b""),
        (b'{"a": 1}\n{"b"', b'{"a": 1}\n', b'{"b"'),
        (b"no newline at all", b"", b"no newline at all"),
        (b"x" * 200_000 + b"\n" + b"y" * 70_000, b"x" * 200_000 + b"\n", b"y" * 70_000),
    ]
    for content, kept, moved in cases:
        f.write_bytes(content)
        torn = tmp_path / "raw_responses.jsonl.torn"
        torn.unlink(missing_ok=True)
        fd = os.open(f, os.O_WRONLY | os.O_APPEND)
        try:
            assert ri.move_torn_tail(f, fd) == len(moved)
        finally:
            os.close(fd)
        assert f.read_bytes() == kept
        assert (torn.read_bytes() if torn.exists() else b"") == (moved + b"\n" if moved else b"")


def test_existing_records_are_read_in_any_format(tmp_path: Path) -> None:
    ri = _client_module()
    f = tmp_path / "raw_responses.jsonl"
    lines = [
        {"sample_id": "a", "output_ids": [1, 2, 3], "completion_tokens": 3},
        {"sample_id": "b", "output_ids": [1, 2]},  # no count: the ids are counted
        {"sample_id": "c", "text": "older format", "completion_tokens": 7},
        {"sample_id": "a", "output_ids": [9], "completion_tokens": 1},  # duplicate: counted once
        {"no_id": True},
    ]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines) + "\n[1, 2]\n{bad\n")
    res = ri.read_existing(f)
    assert res.done == {"a", "b", "c"}
    assert res.completion_tokens == 3 + 2 + 7
    assert res.bad_lines == 3
    assert ri.read_existing(tmp_path / "missing").done == set()


def test_retry_after_accepts_seconds_and_http_dates() -> None:
    import email.utils
    import time

    import httpx

    ri = _client_module()

    def resp(value: str | None) -> httpx.Response:
        return httpx.Response(429, headers={"retry-after": value} if value else {})

    assert ri._retry_after(resp("2")) == 2.0
    assert ri._retry_after(resp("0.25")) == 0.25
    assert ri._retry_after(resp(None)) is None
    assert ri._retry_after(resp("soon")) is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < ri._retry_after(resp(later)) <= 31


def test_ledger_records_each_written_line_where_it_is(
    mock_server: Any, demo_prompts: Any, tmp_path: Path
) -> None:
    import hashlib

    h = mock_server(mean_tokens=30)
    prompts = demo_prompts(("B1", "B2"), count=12)
    out = tmp_path / "out"
    ledger = tmp_path / "ledger.jsonl"
    argv = reference_client_argv(h.url, prompts, out, "B1,B2", "--ledger", str(ledger))
    r = _run([*argv, "--concurrency", "4"])
    assert r.returncode == 0, r.stdout
    entries = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert len(entries) == 24
    for e in entries:
        data = Path(e["file"]).read_bytes()[e["offset"] : e["offset"] + e["length"]]
        assert hashlib.sha1(data).hexdigest() == e["sha1"]
        assert json.loads(data)["sample_id"] == e["sample_id"]
        assert Path(e["file"]).stat().st_ino == e["ino"]
    assert {Path(e["file"]).parent.name for e in entries} == {"B1", "B2"}
