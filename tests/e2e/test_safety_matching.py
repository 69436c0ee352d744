"""Invariant 2: a run is matched by evidence a neighbour cannot fake (its data paths in argv, or
descriptors on its files), never by its working directory alone; two candidates make the run
ambiguous and every action by run name refuses until a pid is named. Real processes, the real
agent (locally and over the real sshd), the real CLI."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import Config, HostConfig, RunConfig
from supervisor.engine import Engine
from supervisor.errors import LaunchError
from supervisor.hosts import assign_runs, list_processes
from supervisor.model import RunView
from supervisor.plan import make_plan
from supervisor.ssh import SSHHost
from tests.fixtures_procs import FakeRuns, alive, gone
from tests.waiting import wait_until

ARGV = ["python3", "run_inference.py", "--datasets", "B1", "--output-dir", "out"]

# A run that holds a file open for writing (its path in the environment, never in argv).
HOLDS_FILE = r"""
import json, os, signal
opts = json.loads(os.environ["FAKE_RUN_OPTS"])
f = open(os.environ["HOLD_PATH"], "a")
tmp = opts["ready"] + ".tmp"
with open(tmp, "w") as g:
    json.dump({"pid": os.getpid(), "children": []}, g)
os.rename(tmp, opts["ready"])
while True:
    signal.pause()
"""


def _config(workdir: str, host: HostConfig | None = None, **run: Any) -> Config:
    hc = host or HostConfig(name="local", local=True, command_timeout=30.0)
    return Config(
        scripts=["run_inference.py"],
        hosts=[hc],
        runs=[RunConfig(name="gen", host=hc.name, workdir=workdir, argv=list(ARGV), **run)],
    )


async def _view(config: Config) -> RunView:
    async with Engine(config) as engine:
        snap = await engine.refresh()
    return next(r for h in snap.hosts for r in h.runs if r.name == "gen")


def _write_config(path: Path, workdir: Path) -> Path:
    path.write_text(
        f"""
scripts = ["run_inference.py"]

[[hosts]]
name = "local"
local = true

[[runs]]
name = "gen"
host = "local"
workdir = "{workdir}"
argv = {json.dumps(ARGV)}
"""
    )
    return path


def _cli(config: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args, "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env,
    )


async def test_inv2_cwd_alone_is_not_the_run(tmp_path: Path, fake_runs: FakeRuns) -> None:
    """A process started first in the run's workdir with other datasets is not the run; the
    real run, started second, is (and a restart would stop it, not the neighbour)."""
    work = tmp_path / "w"
    work.mkdir()
    neighbour = fake_runs.start("--datasets", "B9", "--output-dir", "out", cwd=work)
    no_flags = fake_runs.start(cwd=work, script=fake_runs.script("run_inference.py"))
    (work / "elsewhere").mkdir()
    other_out = fake_runs.start("--datasets", "B1", "--output-dir", "elsewhere", cwd=work)
    config = _config(str(work))
    view = await _view(config)
    assert view.state == "stopped", view
    run = fake_runs.start("--datasets", "B1", "--output-dir", "out", cwd=work)
    view = await _view(config)
    assert view.state == "running"
    assert view.process is not None and view.process.identity.pid == run.pid
    assert view.process.evidence["gen"] == ["argv", "cwd"]
    async with Engine(config) as engine:
        plan = await make_plan(engine, "gen", action="restart")
    assert plan.old is not None and plan.old.identity.pid == run.pid
    host_procs = await _listed(config)
    for decoy in (neighbour, other_out):
        assert host_procs[decoy.pid].run is None
        assert host_procs[decoy.pid].evidence.get("gen") == ["cwd"]
    # No flags at all: only its directory ties it to the run, and that is no evidence.
    assert host_procs[no_flags.pid].evidence.get("gen") == ["cwd"]
    assert host_procs[no_flags.pid].run is None


async def _listed(config: Config) -> dict[int, Any]:
    from supervisor.hosts import LocalHost

    host = LocalHost(config.hosts[0])
    try:
        return {p.identity.pid: p for p in await list_processes(host, config)}
    finally:
        await host.close()


async def test_inv2_open_descriptors_on_the_run_files_are_evidence(
    tmp_path: Path, fake_runs: FakeRuns
) -> None:
    """A process from elsewhere, without the run's flags, that holds the run's data file open
    is a candidate (it writes the run's files)."""
    work = tmp_path / "w"
    data = work / "out" / "B1" / "raw_responses.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("")
    os.environ["HOLD_PATH"] = str(data)
    try:
        holder = fake_runs.start(
            "--datasets", "X", cwd=tmp_path, script=fake_runs.script(body=HOLDS_FILE)
        )
    finally:
        del os.environ["HOLD_PATH"]
    view = await _view(_config(str(work)))
    assert view.state == "running"
    assert view.process is not None and view.process.identity.pid == holder.pid
    assert view.process.evidence["gen"] == ["fd"]


async def test_inv2_two_candidates_make_the_run_ambiguous_and_restart_refuses(
    tmp_path: Path, fake_runs: FakeRuns
) -> None:
    work = tmp_path / "w"
    work.mkdir()
    first = fake_runs.start("--datasets", "B1", "--output-dir", "out", cwd=work)
    second = fake_runs.start("--datasets", "B1,B2", "--output-dir", str(work / "out"), cwd=tmp_path)
    config = _config(str(work))
    view = await _view(config)
    assert view.state == "ambiguous"
    assert sorted(view.candidates) == sorted([first.pid, second.pid])
    assert view.process is None
    async with Engine(config) as engine:
        with pytest.raises(LaunchError, match="ambiguous"):
            await make_plan(engine, "gen", action="restart")
        with pytest.raises(LaunchError, match="ambiguous"):
            await make_plan(engine, "gen", action="launch")
        with pytest.raises(LaunchError, match="is not gen"):
            await make_plan(engine, "gen", action="restart", pid=os.getpid())
        plan = await make_plan(engine, "gen", action="restart", pid=second.pid)
    assert plan.old is not None and plan.old.identity.pid == second.pid
    assert alive(first.pid, first.start_time) and alive(second.pid, second.start_time)


def test_inv2_kill_by_run_name_refuses_when_ambiguous_until_a_pid_is_named(
    tmp_path: Path, fake_runs: FakeRuns
) -> None:
    work = tmp_path / "w"
    work.mkdir()
    first = fake_runs.start("--datasets", "B1", "--output-dir", "out", cwd=work)
    second = fake_runs.start("--datasets", "B1", "--output-dir", "out", cwd=work)
    config = _write_config(tmp_path / "rw.toml", work)
    status = _cli(config, tmp_path, "status")
    assert "gen  ambiguous: pids" in status.stdout, status.stdout + status.stderr
    done = _cli(config, tmp_path, "kill", "gen", "--yes")
    assert done.returncode != 0
    assert "ambiguous" in done.stderr and str(first.pid) in done.stderr, done.stderr
    assert alive(first.pid, first.start_time) and alive(second.pid, second.start_time)
    done = _cli(config, tmp_path, "kill", "gen", "--pid", str(second.pid), "--yes", "--grace", "2")
    assert done.returncode == 0, done.stderr + done.stdout
    wait_until(lambda: gone(second.pid, second.start_time), 10)
    assert alive(first.pid, first.start_time)
    ps = _cli(config, tmp_path, "ps", "--json")
    listed = json.loads(ps.stdout)["hosts"][0]["processes"]
    assert [p["run"] for p in listed if p["pid"] == first.pid] == ["gen"]


@pytest.mark.ssh
async def test_inv2_tilde_is_expanded_on_the_host_never_compared_by_suffix(
    ssh_host_cfg: Any, fake_runs: FakeRuns, tmp_path: Path
) -> None:
    """``~/work`` is the SSH user's home on the host: a run in ``/tmp/.../elsewhere/work`` with the
    same command line is not it, and ``kill RUN`` finds nothing to kill."""
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)  # the sshd fixture logs in as this user
    mine = Path(os.path.realpath(home)) / f"rw-inv2-{os.getpid()}" / "work"
    mine.mkdir(parents=True, exist_ok=True)
    elsewhere = tmp_path / "elsewhere" / mine.parent.name / "work"
    elsewhere.mkdir(parents=True)
    try:
        decoy = fake_runs.start("--datasets", "B1", "--output-dir", "out", cwd=elsewhere)
        config = _config(f"~/{mine.parent.name}/work", host=ssh_host_cfg)
        host = SSHHost(ssh_host_cfg)
        try:
            found = await list_processes(host, config)
            assert next(p for p in found if p.identity.pid == decoy.pid).run is None
            real = fake_runs.start("--datasets", "B1", "--output-dir", "out", cwd=mine)
            found = await list_processes(host, config)
        finally:
            await host.close()
        runs = assign_runs(found, config, ssh_host_cfg.name)
        assert [p.identity.pid for p in runs["gen"]] == [real.pid]
    finally:
        for p in sorted(mine.parent.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        mine.parent.rmdir()
