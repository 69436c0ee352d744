"""First connect: line counts at once (provisional), progress while the first scan runs, then the
scan's exact numbers; in the agent, over a real agent channel (local and over the sshd fixture)
and in the engine's snapshots."""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from supervisor.agent import firstpass
from supervisor.agent.server import Agent
from supervisor.config import Config, HostConfig, RunConfig
from supervisor.engine import Engine
from supervisor.hosts import LocalHost
from supervisor.model import Snapshot
from tests.fixtures_data import make_raw
from tests.fixtures_sshd import SshdServer
from tests.waiting import wait_for


def _files(tmp_path: Path) -> dict[str, bytes]:
    """Files of long lines, short lines, a partial last line, nothing; by path."""
    rng = random.Random(3)
    contents = {
        "long": b"".join(b"x" * rng.randint(300, 3000) + b"\n" for _ in range(400)),
        "short": b"".join(b"y" * rng.randint(0, 40) + b"\n" for _ in range(5000)),
        "mixed": b"".join(
            b"z" * (rng.randint(0, 20) if i % 3 else rng.randint(500, 900)) + b"\n"
            for i in range(2000)
        )
        + b'{"partial',
        "empty": b"",
    }
    out = {}
    for name, data in contents.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(data)
        out[str(path)] = data
    return out


@pytest.fixture
def any_size_in_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's small files go to counting processes as big ones do."""
    monkeypatch.setattr(firstpass, "PROCESS_MIN_BYTES", 0)


@pytest.mark.parametrize("wc", [True, False], ids=["wc", "python"])
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.usefixtures("any_size_in_processes")
def test_count_all_counts_every_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, wc: bool
) -> None:
    # Small slices: without wc, lines and files are split between counting processes.
    monkeypatch.setattr(firstpass, "SLICE_BYTES", 4096)
    if not wc:
        monkeypatch.setattr(firstpass, "wc_program", lambda: None)
    else:
        assert firstpass.wc_program() is not None
    files = _files(tmp_path)
    (tmp_path / "a-dir").mkdir()
    paths = [*files, str(tmp_path / "missing.jsonl"), str(tmp_path / "a-dir")]
    counted = firstpass.count_all(paths, workers)
    assert counted == {p: (data.count(b"\n"), len(data)) for p, data in files.items()}


@pytest.mark.usefixtures("any_size_in_processes")
def test_count_all_counts_in_python_what_wc_fails_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    false = shutil.which("false")
    assert false is not None
    monkeypatch.setattr(firstpass, "wc_program", lambda: false)  # exits 1, prints nothing
    files = _files(tmp_path)
    counted = firstpass.count_all(list(files), 2)
    assert counted == {p: (data.count(b"\n"), len(data)) for p, data in files.items()}


@pytest.mark.usefixtures("any_size_in_processes")
def test_wc_never_sees_a_path(tmp_path: Path) -> None:
    """The files reach ``wc`` as its stdin: a name that looks like an option counts the same."""
    hostile = tmp_path / "--files0-from=x"
    hostile.write_bytes(b"a\nb\nc\n")
    assert firstpass.count_all([str(hostile)], 1) == {str(hostile): (3, 6)}


@pytest.mark.usefixtures("any_size_in_processes")
def test_count_all_counts_alone_when_it_cannot_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(firstpass, "SLICE_BYTES", 4096)
    monkeypatch.setattr(firstpass, "wc_program", lambda: None)
    files = _files(tmp_path)
    forks = []

    def no_fork() -> int:
        forks.append(1)
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    counted = firstpass.count_all(list(files), 2)
    assert forks  # it tried
    assert counted == {p: (data.count(b"\n"), len(data)) for p, data in files.items()}


@pytest.mark.usefixtures("any_size_in_processes")
def test_a_few_big_files_are_counted_in_slices_over_the_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One file and three workers: slices keep more cores busy than one ``wc`` would."""
    monkeypatch.setattr(firstpass, "SLICE_BYTES", 4096)
    assert firstpass.wc_program() is not None
    files = _files(tmp_path)
    long = next(p for p in files if p.endswith("long.jsonl"))
    forks = []
    real_fork = os.fork

    def fork() -> int:
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", fork)
    assert firstpass.count_all([long], 3) == {long: (400, len(files[long]))}
    assert len(forks) == 3
    forks.clear()
    assert firstpass.count_all(list(files), 3) == {  # four files: one wc each
        p: (data.count(b"\n"), len(data)) for p, data in files.items()
    }
    assert forks == []


def test_small_files_are_counted_without_starting_a_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first connect to a fleet of short files starts no ``wc`` and no fork per file."""
    started = []

    def no_process(*args: object, **kwargs: object) -> None:
        started.append(args)
        raise AssertionError("a counting process was started for a small file")

    files = _files(tmp_path)
    assert all(len(data) < firstpass.PROCESS_MIN_BYTES for data in files.values())
    monkeypatch.setattr("supervisor.agent.firstpass.subprocess.Popen", no_process)
    monkeypatch.setattr(os, "fork", no_process)
    counted = firstpass.count_all(list(files), 4)
    assert counted == {p: (data.count(b"\n"), len(data)) for p, data in files.items()}
    assert started == []


def test_early_counting_is_handed_to_the_first_refresh_once(tmp_path: Path) -> None:
    files = _files(tmp_path)
    paths = list(files)
    firstpass.start_early(json.dumps({"count": paths}).encode() + b"\n")
    assert firstpass.take_early([paths[0], str(tmp_path / "other.jsonl")]) is None  # not all
    firstpass.start_early(json.dumps({"count": paths}).encode() + b"\n")
    counting = firstpass.take_early(paths[:2])
    assert counting is not None
    assert counting.wait() == {p: (data.count(b"\n"), len(data)) for p, data in files.items()}
    assert firstpass.take_early(paths[:2]) is None  # taken
    for bad in (b"", b"not json\n", b"[1]\n", b'{"count": [1]}\n', b'{"count": []}\n'):
        firstpass.start_early(bad)
        assert firstpass.take_early([]) is None


async def test_a_new_agent_counts_the_files_it_was_started_with(tmp_path: Path) -> None:
    one = tmp_path / "B1.jsonl"
    truth = make_raw(one, 300, seed=2)
    seen: list[dict[str, Any]] = []
    host = LocalHost(HostConfig(name="here", local=True, command_timeout=30.0))
    host.count_first = [str(one)]
    async with host:
        assert host.count_first == []
        params = {"files": [{"path": str(one)}], "progress": True, "gpu": False}
        result = await host.request("refresh", params, on_progress=seen.append)
    assert result["files"][str(one)]["records"] == truth.records
    assert seen[0]["files"] == {str(one): {"lines": truth.records, "size": one.stat().st_size}}


def _agent_lines(out: io.BytesIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def test_agent_sends_counts_then_progress_then_the_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(firstpass, "PROGRESS_INTERVAL_S", 0.0)  # a progress line per read
    big = tmp_path / "B1.jsonl"
    truth = make_raw(big, 12000, seed=4)  # ~4 MB: several reads of the scanner
    missing = tmp_path / "B2.jsonl"
    out = io.BytesIO()
    agent = Agent(out)
    specs = [{"path": str(big), "format": "raw"}, {"path": str(missing), "format": "raw"}]
    agent.handle(7, "refresh", {"files": specs, "progress": True, "gpu": False})
    first, *ticks, reply = _agent_lines(out)
    size = big.stat().st_size
    assert first["id"] == 7 and "ok" not in first
    progress = first["progress"]
    assert progress["files"] == {str(big): {"lines": truth.records, "size": size}}
    assert isinstance(progress["processes"], list)
    assert (progress["files_done"], progress["files_total"]) == (0, 2)
    assert (progress["bytes_done"], progress["bytes_total"]) == (0, size)
    assert len(ticks) >= 3 and all(t["id"] == 7 and "ok" not in t for t in ticks)
    done = [t["progress"]["bytes_done"] for t in ticks]
    assert done == sorted(done) and 0 < done[0] < size and done[-1] == size
    assert ticks[-1]["progress"]["files_done"] == 2
    assert reply["id"] == 7 and reply["ok"] is True
    assert reply["result"]["files"][str(big)]["records"] == truth.records
    # Scanned once, a file is not counted again: the next refresh reads only appended bytes.
    out.seek(0)
    out.truncate()
    agent.handle(8, "refresh", {"files": specs, "progress": True, "gpu": False})
    first, *_, reply = _agent_lines(out)
    assert first["progress"]["files"] == {} and first["progress"]["bytes_total"] == 0
    assert reply["ok"] is True
    # Without "progress" only the reply is written.
    out.seek(0)
    out.truncate()
    agent.handle(9, "refresh", {"files": specs, "gpu": False})
    assert [line.get("ok") for line in _agent_lines(out)] == [True]


async def test_channel_without_a_listener_waits_for_the_reply(tmp_path: Path) -> None:
    one, two = tmp_path / "B1.jsonl", tmp_path / "B2.jsonl"
    truth = make_raw(one, 50, seed=1)
    two.write_bytes(one.read_bytes())
    seen: list[dict[str, Any]] = []
    async with LocalHost(HostConfig(name="here", local=True, command_timeout=30.0)) as host:
        params = {"files": [{"path": str(one)}], "progress": True, "gpu": False}
        result = await host.request("refresh", params)
        assert result["files"][str(one)]["records"] == truth.records
        params = {"files": [{"path": str(two)}], "progress": True, "gpu": False}
        result = await host.request("refresh", params, on_progress=seen.append)
        assert result["files"][str(two)]["records"] == truth.records
    assert seen and seen[0]["files"] == {
        str(two): {"lines": truth.records, "size": two.stat().st_size}
    }


async def test_engine_shows_provisional_counts_before_the_first_scan_ends(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "out" / "B1").mkdir(parents=True)
    data = work / "out" / "B1" / "raw_responses.jsonl"
    truth = make_raw(data, 500, seed=2, dup_every=5)
    with data.open("ab") as f:
        f.write(b"not json\n")  # a bad line: counted as a line, never as a record
    lines = truth.records + 1
    argv = ["python3", "run_inference.py", "--datasets", "B1,B2"]
    config = Config(
        hosts=[HostConfig(name="here", local=True, command_timeout=30.0)],
        runs=[RunConfig(name="gen", host="here", workdir=str(work), argv=argv)],
    )
    seen: list[Snapshot] = []
    async with Engine(config) as engine:
        snap = await engine.refresh(on_progress=seen.append)
        assert seen, "no provisional snapshot before the first scan's reply"
        (host,) = seen[0].hosts
        assert host.connected and host.progress is not None
        assert host.progress.files_total == 2 and host.progress.files_done == 0
        run = next(r for r in host.runs if r.name == "gen")
        b1, b2 = run.datasets
        assert (b1.name, b1.records, b1.provisional) == ("B1", lines, True)
        assert b1.completion_tokens == 0  # not known before the scan
        assert (b2.name, b2.provisional) == ("B2", False)  # missing: nothing to count
        assert run.state == "stopped"
        (host,) = snap.hosts
        assert host.progress is None
        run = next(r for r in host.runs if r.name == "gen")
        b1 = run.datasets[0]
        assert (b1.records, b1.provisional, b1.bad_lines) == (truth.records, False, 1)
        assert b1.completion_tokens == truth.completion_tokens
        # Connected and scanned: the next refresh has no first scan and no progress.
        count = len(seen)
        await engine.refresh(on_progress=seen.append)
        assert len(seen) == count


SLOW_SMI = """#!/bin/sh
# A GPU query that answers only once the test creates {release} (at most 30 s).
i=0
while [ ! -e "{release}" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
case "$1" in
  --query-compute-apps=*) echo "4242, GPU-aaaa, 70000" ;;
  --query-gpu=*) echo "0, GPU-aaaa, NVIDIA H100 80GB HBM3, 97, 71234, 81559, 612.35, 71" ;;
esac
"""


async def test_counts_go_out_before_a_slow_gpu_query_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    release = tmp_path / "release"
    smi = bin_dir / "nvidia-smi"
    smi.write_text(SLOW_SMI.format(release=release))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    work = tmp_path / "work"
    (work / "out" / "B1").mkdir(parents=True)
    truth = make_raw(work / "out" / "B1" / "raw_responses.jsonl", 300, seed=8)
    argv = ["python3", "run_inference.py", "--datasets", "B1"]
    config = Config(
        hosts=[HostConfig(name="here", local=True, command_timeout=60.0)],
        runs=[RunConfig(name="gen", host="here", workdir=str(work), argv=argv)],
    )
    seen: list[Snapshot] = []
    async with Engine(config) as engine:
        refresh = asyncio.create_task(engine.refresh(on_progress=seen.append))
        await wait_for(lambda: seen, timeout=20, what="the line counts while nvidia-smi is asked")
        assert not refresh.done(), "the reply came before the GPU query answered"
        (b1,) = next(r for r in seen[0].hosts[0].runs if r.name == "gen").datasets
        assert (b1.records, b1.provisional) == (truth.records, True)
        release.touch()
        snap = await asyncio.wait_for(refresh, 60)
    (host,) = snap.hosts
    assert host.has_gpu and [(g.index, g.utilization_pct) for g in host.gpus] == [(0, 97.0)]
    (b1,) = next(r for r in host.runs if r.name == "gen").datasets
    assert (b1.records, b1.provisional) == (truth.records, False)


async def test_a_host_lost_during_its_first_scan_keeps_the_counts_it_showed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent dies after its line counts went out, before the scan's reply: the host is shown
    lost with those counts, still marked provisional and no scan under way, never with its runs
    emptied (what a lost host shows does not depend on how far its first scan had got)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    release = tmp_path / "release"
    smi.write_text(SLOW_SMI.format(release=release))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    work = tmp_path / "work"
    (work / "out" / "B1").mkdir(parents=True)
    truth = make_raw(work / "out" / "B1" / "raw_responses.jsonl", 300, seed=8)
    argv = ["python3", "run_inference.py", "--datasets", "B1"]
    config = Config(
        hosts=[HostConfig(name="here", local=True, command_timeout=60.0)],
        runs=[RunConfig(name="gen", host="here", workdir=str(work), argv=argv)],
    )
    seen: list[Snapshot] = []
    async with Engine(config) as engine:
        refresh = asyncio.create_task(engine.refresh(on_progress=seen.append))
        await wait_for(lambda: seen, timeout=20, what="the line counts while nvidia-smi is asked")
        assert not refresh.done(), "the reply came before the GPU query answered"
        host = engine.host("here")
        assert isinstance(host, LocalHost) and host.agent_pid is not None
        os.kill(host.agent_pid, signal.SIGKILL)
        snap = await asyncio.wait_for(refresh, 60)
        release.touch()  # the dead agent's nvidia-smi ends too
    (view,) = snap.hosts
    assert not view.connected and view.error and view.progress is None
    assert not view.stale  # nothing was ever answered in full
    (run,) = [r for r in view.runs if r.name == "gen"]
    assert run.state == "unknown"
    assert [(d.name, d.records, d.provisional) for d in run.datasets] == [
        ("B1", truth.records, True)
    ]


@pytest.mark.ssh
async def test_engine_over_ssh_shows_provisional_counts_first(
    sshd: SshdServer, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    (work / "out" / "B1").mkdir(parents=True)
    truth = make_raw(work / "out" / "B1" / "raw_responses.jsonl", 200, seed=6)
    cfg = sshd.host_config("gpu")
    argv = ["python3", "run_inference.py", "--datasets", "B1"]
    config = Config(
        hosts=[cfg], runs=[RunConfig(name="gen", host="gpu", workdir=str(work), argv=argv)]
    )
    seen: list[Snapshot] = []
    async with Engine(config) as engine:
        snap = await engine.refresh(on_progress=seen.append)
    assert seen, "no provisional snapshot over SSH"
    run = next(r for r in seen[0].hosts[0].runs if r.name == "gen")
    assert (run.datasets[0].records, run.datasets[0].provisional) == (truth.records, True)
    run = next(r for r in snap.hosts[0].runs if r.name == "gen")
    assert (run.datasets[0].records, run.datasets[0].provisional) == (truth.records, False)
