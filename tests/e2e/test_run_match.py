"""Which config run a process is: one rule (``hosts.match_run``) for ``ps``, ``kill RUN`` and the
engine, and it needs evidence the host found (its data paths in argv, or descriptors on its files),
never only the same directory, datasets or arguments. Real processes, real directories, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config import Config, HostConfig, RunConfig
from supervisor.engine import Engine
from supervisor.hosts import LocalHost, list_processes
from tests.fixtures_procs import FakeRuns, alive

ARGS = ("--datasets", "B1,B2", "--output-dir", "out")
ARGV = ["python3", "run_inference.py", *ARGS]


def _config(workdir: str, argv: list[str] = ARGV, **run: object) -> Config:
    return Config(
        scripts=["run_inference.py"],
        hosts=[HostConfig(name="local", local=True, command_timeout=30.0)],
        runs=[RunConfig(name="gen", host="local", workdir=workdir, argv=list(argv), **run)],  # type: ignore[arg-type]
    )


async def _matches(config: Config) -> tuple[dict[int, str | None], dict[int, str | None]]:
    """pid -> matched run, as ``ps``/``kill RUN`` see it and as the engine sees it."""
    host = LocalHost(config.hosts[0])
    try:
        listed = {p.identity.pid: p.run for p in await list_processes(host, config)}
    finally:
        await host.close()
    async with Engine(config) as engine:
        snap = await engine.refresh()
    seen = {p.identity.pid: p.run for h in snap.hosts for p in h.processes}
    # Other processes on the machine may start or exit between the two listings: compare the
    # processes both saw (each test checks that its own processes are among them).
    both = listed.keys() & seen.keys()
    return {p: listed[p] for p in both}, {p: seen[p] for p in both}


async def test_a_symlinked_workdir_is_the_same_directory(
    tmp_path: Path, fake_runs: FakeRuns
) -> None:
    real = tmp_path / "real" / "w"
    real.mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    proc = fake_runs.start(*ARGS, cwd=real)
    listed, seen = await _matches(_config(str(link / "w")))
    assert listed[proc.pid] == "gen"
    assert seen[proc.pid] == "gen"


async def test_same_command_in_another_directory_is_never_the_run(
    tmp_path: Path, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    mine = home / "proj" / "w"
    mine.mkdir(parents=True)
    other = tmp_path / "other" / "proj" / "w"  # the same tail as the run's ~/proj/w
    other.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    twin = fake_runs.start(*ARGS, cwd=other)
    decoy = fake_runs.start(*ARGS, cwd=tmp_path)
    listed, seen = await _matches(_config("~/proj/w"))
    for pid in (twin.pid, decoy.pid):
        assert listed[pid] is None and seen[pid] is None
    run = fake_runs.start(*ARGS, cwd=mine)
    listed, seen = await _matches(_config("~/proj/w"))
    pids = (run.pid, twin.pid, decoy.pid)  # other processes of this machine come and go
    assert [listed[p] for p in pids] == [seen[p] for p in pids]
    assert listed[run.pid] == "gen"
    assert listed[twin.pid] is None and listed[decoy.pid] is None


async def test_the_output_directory_alone_is_evidence(tmp_path: Path, fake_runs: FakeRuns) -> None:
    work = tmp_path / "w"
    (work / "data").mkdir(parents=True)
    moved = fake_runs.start(
        "--datasets", "B1,B2", "--output-dir", str(work / "data"), cwd=tmp_path
    )  # fmt: skip
    elsewhere = fake_runs.start("--datasets", "B1,B2", "--output-dir", "data", cwd=tmp_path)
    # The run's output dir is where its argv says (the output_dir key is not read for a profiled
    # client).
    argv = ["python3", "run_inference.py", "--datasets", "B1,B2", "--output-dir", "data"]
    listed, seen = await _matches(_config(str(work), argv, output_dir="out"))
    mine = (moved.pid, elsewhere.pid)  # other processes of this machine come and go
    assert [listed[p] for p in mine] == [seen[p] for p in mine]
    assert listed[moved.pid] == "gen"
    assert listed[elsewhere.pid] is None


def test_kill_run_never_picks_a_process_in_another_directory(
    tmp_path: Path, fake_runs: FakeRuns
) -> None:
    home = tmp_path / "home"
    (home / "proj" / "w").mkdir(parents=True)
    other = tmp_path / "other" / "proj" / "w"
    other.mkdir(parents=True)
    twin = fake_runs.start(*ARGS, cwd=other)
    config = tmp_path / "rw.toml"
    config.write_text(
        f"""
scripts = ["run_inference.py"]

[[hosts]]
name = "local"
local = true

[[runs]]
name = "gen"
host = "local"
workdir = "~/proj/w"
argv = {json.dumps(ARGV)}
"""
    )
    env = {**os.environ, "HOME": str(home), "XDG_STATE_HOME": str(tmp_path / "state")}
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "kill", "gen", "-c", str(config), "--yes"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    assert done.returncode != 0, done.stdout
    assert "not running" in done.stderr + done.stdout
    assert alive(twin.pid, twin.start_time)
