"""``runwatch demo``: its config, and that it runs, reports and leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from supervisor.config import load_config
from supervisor.demo import launcher
from supervisor.errors import RunwatchError
from tests.waiting import wait_until

RUNWATCH = [sys.executable, "-m", "supervisor.cli"]


def _headless_demo(tmp_path: Path, env: dict[str, str], spawn: Any) -> tuple[Any, Path, Path]:
    """``runwatch demo --headless`` in ``<tmp>/demo``, its output in ``<tmp>/demo.out``, once its
    first report is out: (process, demo directory, output file)."""
    demo_dir = tmp_path / "demo"
    log = tmp_path / "demo.out"
    with open(log, "wb") as f:
        proc = spawn(
            [*RUNWATCH, "demo", "--headless", "--dir", str(demo_dir)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
        )
    wait_until(lambda: "runwatch demo in" in log.read_text(), 90, what="the first report")
    return proc, demo_dir, log


def _env_for(tmp_path: Path, demo_tokenizer: Path) -> dict[str, str]:
    return launcher.demo_env(
        tmp_path, demo_tokenizer, "http://127.0.0.1:1111/v1", "http://127.0.0.1:2222/v1"
    )


def test_demo_config_loads_and_describes_the_story(tmp_path: Path, demo_tokenizer: Path) -> None:
    cfg = load_config(launcher.TEMPLATE, env=_env_for(tmp_path, demo_tokenizer))
    assert [h.local for h in cfg.hosts] == [True]
    assert {e.name: e.kind for e in cfg.endpoints} == {"local-gpu": "local", "api": "api"}
    api = cfg.endpoint("api")
    assert (api.price_in_per_m, api.price_out_per_m) == (0.60, 2.50)
    assert api.api_key_env == launcher.API_KEY_ENV
    assert sorted(cfg.datasets) == [*(f"B{i}" for i in range(1, 9)), "regen"]
    assert all(cfg.datasets[f"B{i}"].max_samples for i in range(1, 9))
    assert all(d.token_budget for d in cfg.datasets.values())
    local, remote = cfg.run("local-gpu"), cfg.run("api")
    assert cfg.run_datasets(local) == ["B1", "B2", "B3", "B4"]
    assert cfg.run_datasets(remote) == ["B5", "B6", "B7", "B8"]
    assert "--max-samples" in local.argv and "--token-budget" not in local.argv
    assert "--token-budget" in remote.argv
    assert local.argv[1] == str(launcher.CLIENT) and local.argv[1].endswith("run_inference.py")
    assert cfg.tokenizer == str(demo_tokenizer)
    assert local.workdir == str(tmp_path)
    # The third run: a SpecForge-style single-file client, its budget enforced by stopping it.
    regen = cfg.run("regen")
    assert regen.format == "specforge" and regen.budget_policy == "stop"
    assert "--output-file-path" in regen.argv and "--resume" in regen.argv
    assert "127.0.0.1:1111" in regen.argv


def test_resolved_copy_loads_without_the_environment(tmp_path: Path, demo_tokenizer: Path) -> None:
    weird = tmp_path / 'dir with "quotes" and \\ back'
    weird.mkdir()
    env = _env_for(weird, demo_tokenizer)
    cfg = launcher.write_resolved_config(env, weird / "runwatch.toml")
    text = (weird / "runwatch.toml").read_text()
    assert not re.search(r"\$\{RUNWATCH_DEMO_[A-Z_]+\}", text)
    assert text.startswith("# Written by `runwatch demo`")
    assert cfg.run("local-gpu").workdir == str(weird)
    again = load_config(weird / "runwatch.toml", env={})
    assert again.run("api").argv == cfg.run("api").argv


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _port_closed(url: str) -> bool:
    port = int(re.search(r":(\d+)/v1", url).group(1))  # type: ignore[union-attr]
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _started(output: str) -> tuple[list[int], list[str]]:
    pids = [int(p) for p in re.findall(r"started [^:]+: pid (\d+):", output)]
    urls = re.findall(r"running (http://127\.0\.0\.1:\d+/v1)", output)
    return pids, sorted(set(urls))


def test_headless_demo_runs_prints_and_leaves_nothing_behind(
    tmp_path: Path, demo_cache_env: dict[str, str]
) -> None:
    demo_dir = tmp_path / "demo"
    key = "sk-demo-test-5e1f0a9c"
    r = subprocess.run(
        [*RUNWATCH, "demo", "--headless", "--seconds", "4", "--dir", str(demo_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**demo_cache_env, launcher.API_KEY_ENV: key},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    pids, urls = _started(out)
    assert len(pids) == 5  # two mock servers, three runs
    assert len(urls) == 2
    paths = ("out/B1/raw_responses.jsonl", "out/B2/raw_responses.jsonl", "logs/api.log")
    for path in (*paths, "out/regen.jsonl"):
        assert re.search(rf"\d+ lines  {re.escape(str(demo_dir / path))}", out), path
    assert out.count("runwatch demo in") >= 4  # a report every second
    assert f"runwatch -c {demo_dir / 'runwatch.toml'} status" in out
    assert "stopped 5 processes" in out
    assert all(_gone(p) for p in pids)
    assert all(_port_closed(u) for u in urls)
    # What the demo set up is what the story needs.
    cfg = load_config(demo_dir / "runwatch.toml", env={})
    b3 = [json.loads(x) for x in (demo_dir / "out/B3/raw_responses.jsonl").read_text().splitlines()]
    assert "text" in b3[0] and "output_ids" not in b3[0]
    b2 = (demo_dir / "out/B2/raw_responses.jsonl").read_text().splitlines()
    b2_tokens = sum(json.loads(x)["completion_tokens"] for x in b2)
    assert cfg.datasets["B2"].token_budget is not None
    assert cfg.datasets["B2"].token_budget - launcher.B2_SEED_MARGIN <= b2_tokens + 2048
    api_log = (demo_dir / "logs/api.log").read_text()
    assert "B5:" in api_log and "HTTP 401" not in api_log  # the key reached the API mock
    logs = "".join(p.read_text() for p in (demo_dir / "logs").iterdir())
    assert key not in out + r.stderr + logs + (demo_dir / "runwatch.toml").read_text()
    assert not (demo_dir / launcher.API_KEY_FILE).exists()  # the user's own key stays theirs


def test_sigterm_stops_the_demo_and_everything_it_started(
    tmp_path: Path, demo_cache_env: dict[str, str], spawn: Any
) -> None:
    proc, demo_dir, log = _headless_demo(tmp_path, demo_cache_env, spawn)
    # A run relaunched for the demo by someone else (as a restart from the TUI would do).
    _, urls = _started(log.read_text())
    # The key the demo made up is kept for other terminals, never printed.
    key_file = demo_dir / launcher.API_KEY_FILE
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = key_file.read_text().strip()
    assert key.startswith("demo-") and key not in log.read_text()
    assert f"export {launcher.API_KEY_ENV}=$(cat {key_file})" in log.read_text()
    with httpx.Client() as client:
        bare = [client.get(f"{u}/models").status_code for u in urls]
        keyed = [
            client.get(f"{u}/models", headers={"Authorization": f"Bearer {key}"}).status_code
            for u in urls
        ]
    assert sorted(bare) == [200, 401] and keyed == [200, 200]  # it is the API mock's key
    # Against the local mock: the API mock would refuse it (no key) and it would exit at
    # once, before the demo's stop could find it.
    (local_url,) = re.findall(r"mock local GPU +pid \d+ +running (\S+)", log.read_text())[:1]
    relaunched = spawn(
        [sys.executable, str(launcher.CLIENT), "--datasets", "B4", "--api-base", local_url],
        cwd=demo_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(60) == 0
    out = log.read_text()
    pids, urls = _started(out)
    assert len(pids) == 5
    assert "stopping (SIGTERM)" in out
    assert "and 1 relaunched run;" in out
    assert all(_gone(p) for p in [*pids, relaunched.pid])
    assert all(_port_closed(u) for u in urls)


def test_an_error_after_start_still_stops_what_was_started(
    tmp_path: Path, demo_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(demo_cache_dir))
    for name in [*_env_for(tmp_path, tmp_path), launcher.API_KEY_ENV]:
        monkeypatch.delenv(name, raising=False)  # restored to absent after the test
    spawned: list[int] = []
    real_spawn = launcher._spawn

    def recording_spawn(*args: Any, **kwargs: Any) -> Any:
        s = real_spawn(*args, **kwargs)
        spawned.append(s.proc.pid)
        return s

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RunwatchError("injected failure")

    monkeypatch.setattr(launcher, "_spawn", recording_spawn)
    monkeypatch.setattr(launcher, "write_resolved_config", broken)
    with pytest.raises(RunwatchError, match="injected failure"):
        launcher.run_demo(headless=True, seconds=1, demo_dir=str(tmp_path / "demo"))
    assert len(spawned) == 2  # both mock servers were up when the failure hit
    assert all(_gone(p) for p in spawned)


def test_line_counter_follows_appends_and_replacement(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    counter = launcher._LineCounter(f)
    assert counter.count() is None
    f.write_text("a\nb\n")
    assert counter.count() == 2
    with open(f, "a") as h:
        h.write("c\npartial")
    assert counter.count() == 3
    f.unlink()
    f.write_text("only\n")
    assert counter.count() == 1


def test_children_die_with_the_demo_even_on_sigkill(
    tmp_path: Path, demo_cache_env: dict[str, str], spawn: Any
) -> None:
    proc, _, log = _headless_demo(tmp_path, demo_cache_env, spawn)
    pids, urls = _started(log.read_text())
    assert len(pids) == 5 and not any(_gone(p) for p in pids)
    os.kill(proc.pid, signal.SIGKILL)  # no clean-up code runs: the kernel tells the children
    proc.wait(10)
    wait_until(lambda: all(_gone(p) for p in pids), 30, what="the children to exit")
    wait_until(lambda: all(_port_closed(u) for u in urls), 30, what="the ports to close")
