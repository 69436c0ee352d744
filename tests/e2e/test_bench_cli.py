"""``runwatch bench`` as a user runs it: a real process against the demo's mock server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.demo.prompts import write_prompts
from supervisor.demo.server import MockServerHandle
from tests.fixtures_config import write_api_run_config

KEY = "sk-or-v1-RECOGNIZABLE-7f3a9c0e1d"


@pytest.fixture
def keyed_mock(mock_server: Any) -> MockServerHandle:
    h: MockServerHandle = mock_server(
        api_key=KEY, mean_tokens=40, price_in=0.6, price_out=2.5, error_429=0.1
    )
    return h


def _config(tmp_path: Path, url: str) -> Path:
    return write_api_run_config(
        tmp_path,
        url,
        "B1",
        prompts=30,
        token_budget=100000,
        endpoint="""
api_key_env = "BENCH_TEST_KEY"
price_in_per_m = 0.6
price_out_per_m = 2.5
max_tokens = 64
""",
    )


def _runwatch(
    tmp_path: Path, *args: str, key: str | None = KEY
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env.pop("BENCH_TEST_KEY", None)
    if key is not None:
        env["BENCH_TEST_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_bench_json_shape_and_the_key_never_shows(
    keyed_mock: MockServerHandle, tmp_path: Path
) -> None:
    cfg = _config(tmp_path, keyed_mock.url)
    p = _runwatch(
        tmp_path,
        "bench",
        "api",
        "-c",
        str(cfg),
        "--requests",
        "12",
        "--concurrency",
        "2,4",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["endpoint"] == "api"
    assert [lv["concurrency"] for lv in out["levels"]] == [2, 4]
    for lv in out["levels"]:
        assert lv["completed"] == 12
        assert set(lv["latency_ms"]) == {"p50", "p90", "p99"}
        for field in ("failed", "req_per_s", "output_tok_per_s", "total_tok_per_s", "cost_usd"):
            assert field in lv
        assert lv["cost_usd"] > 0
    history = tmp_path / "state" / "runwatch" / "bench-history.jsonl"
    assert len(history.read_text().splitlines()) == 1
    # The key went to the server on every request (it answers 401 otherwise) but nowhere else.
    for text in (p.stdout, p.stderr, history.read_text()):
        assert KEY not in text
        assert "RECOGNIZABLE" not in text


def test_bench_text_report(keyed_mock: MockServerHandle, tmp_path: Path) -> None:
    cfg = _config(tmp_path, keyed_mock.url)
    p = _runwatch(tmp_path, "bench", "api", "-c", str(cfg), "--requests", "10", "--stream")
    assert p.returncode == 0, p.stderr
    assert "bench api  model demo-model  max_tokens 64  streamed" in p.stdout
    assert "TTFT p50" in p.stdout and "cost from usage.cost" in p.stdout
    assert KEY not in p.stdout + p.stderr


def test_wrong_key_is_a_clear_error_that_does_not_echo_it(
    keyed_mock: MockServerHandle, tmp_path: Path
) -> None:
    cfg = _config(tmp_path, keyed_mock.url)
    wrong = "sk-WRONG-KEY-4455aa"
    p = _runwatch(tmp_path, "bench", "api", "-c", str(cfg), "--requests", "2", key=wrong)
    assert p.returncode == 1
    assert "refused the request (401)" in p.stderr and "$BENCH_TEST_KEY" in p.stderr
    assert wrong not in p.stdout + p.stderr


def test_missing_key_variable_names_it(keyed_mock: MockServerHandle, tmp_path: Path) -> None:
    cfg = _config(tmp_path, keyed_mock.url)
    p = _runwatch(tmp_path, "bench", "api", "-c", str(cfg), key=None)
    assert p.returncode == 1
    assert "BENCH_TEST_KEY" in p.stderr and "is not set" in p.stderr


def test_bench_a_bare_url_without_config(mock_server: Any, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path, ["B7"], count=5)["B7"]
    h = mock_server(model="served/x", mean_tokens=10)
    args = ("bench", h.url, "--prompts", str(prompts), "--requests", "5", "--json")
    # -c naming a file that does not exist is an error, even for a URL.
    p = _runwatch(tmp_path, "-c", str(tmp_path / "none.toml"), *args, key=None)
    # under --json the error is JSON on stdout, with the same exit status
    assert p.returncode == 2 and "no such config file" in json.loads(p.stdout)["error"]
    # No config named anywhere and none in the working directory: the URL alone is enough.
    p = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "s"), "RUNWATCH_CONFIG": ""},
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["model"] == "served/x"


def test_bad_prompts_and_concurrency_are_usage_errors_that_say_which(
    mock_server: Any, tmp_path: Path
) -> None:
    h = mock_server(mean_tokens=10)
    cfg = _config(tmp_path, h.url)
    p = _runwatch(tmp_path, "bench", "api", "-c", str(cfg), "--prompts", "B9")
    assert p.returncode == 2
    assert "--prompts B9: no such file, and not a dataset of the config (B1)" in p.stderr
    assert "Traceback" not in p.stderr
    p = _runwatch(tmp_path, "bench", h.url, "--prompts", str(tmp_path / "none.jsonl"))
    assert p.returncode == 2 and "none.jsonl: no such file\n" in p.stderr
    for bad in ("abc", "0", "4,-1"):
        p = _runwatch(tmp_path, "bench", "api", "-c", str(cfg), "--concurrency", bad)
        assert p.returncode == 2
        assert "Invalid value for '--concurrency'" in p.stderr, p.stderr


def test_text_report_fits_80_columns_and_warns_of_a_level_never_filled(
    mock_server: Any, tmp_path: Path
) -> None:
    h = mock_server(mean_tokens=20, price_in=0.6, price_out=2.5)
    cfg = _config(tmp_path, h.url)
    args = ("bench", "api", "-c", str(cfg), "--requests", "3", "--concurrency", "4", "--no-save")
    p = _runwatch(tmp_path, *args)
    assert p.returncode == 0, p.stderr
    assert "--requests 3 is below --concurrency 4" in p.stderr
    lines = p.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80, p.stdout
    (row,) = [ln for ln in lines if ln.split()[:2] == ["4", "3"]]
    assert "$0.0" in row  # a cost of a few hundredths of a cent keeps its digits
    assert "latency p50 " in p.stdout
    # Failed attempts that a retry made good are "errors", not lost requests.
    assert lines[2].split()[:3] == ["conc", "done", "errors"]
