"""The engine: concurrent refresh of every host, runs matched to processes, exact dataset counts,
stale values while a host is down, reconnection, kill and check_run."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import Config, DatasetConfig, HostConfig, RunConfig
from supervisor.engine import Engine
from supervisor.layout import layout_of
from supervisor.model import HostView
from tests.fixtures_data import dump, make_raw, raw_record
from tests.fixtures_procs import FakeRuns
from tests.fixtures_sshd import SshdPool, SshdServer, free_port

ARGV = ["python3", "run_inference.py", "--datasets", "B1,B2", "--max-samples", "7000"]


def _config(hosts: list[HostConfig], runs: list[RunConfig], **kw: Any) -> Config:
    return Config(
        hosts=hosts,
        runs=runs,
        datasets={
            "B1": DatasetConfig(token_budget=1000, max_samples=7000),
            "B2": DatasetConfig(token_budget=10_000_000, max_samples=7000),
        },
        **kw,
    )


def _local(name: str = "here") -> HostConfig:
    return HostConfig(name=name, local=True, command_timeout=30.0)


def _run(name: str, host: str, work: Path) -> RunConfig:
    return RunConfig(name=name, host=host, workdir=str(work), argv=list(ARGV))


def _host(snap: Any, name: str) -> HostView:
    (h,) = [h for h in snap.hosts if h.name == name]
    return h


async def test_local_refresh_counts_and_matches_the_run(
    tmp_path: Path, fake_runs: FakeRuns
) -> None:
    work = tmp_path / "work"
    (work / "out" / "B1").mkdir(parents=True)
    truth = make_raw(work / "out" / "B1" / "raw_responses.jsonl", 40, seed=5, dup_every=7)
    config = _config([_local()], [_run("gen", "here", work)])
    async with Engine(config) as engine:
        snap = await engine.refresh()
        h = _host(snap, "here")
        assert h.connected and h.error is None and h.rtt_ms is not None
        (run,) = [r for r in h.runs if r.configured]
        assert run.name == "gen" and run.state == "stopped" and run.process is None
        b1, b2 = run.datasets
        assert (b1.records, b1.unique_ids, b1.duplicates) == (
            truth.records,
            len(truth.ids),
            truth.duplicates,
        )
        assert b1.completion_tokens == truth.completion_tokens
        assert b1.prompt_tokens == truth.prompt_tokens
        assert b1.token_budget == 1000 and b1.over_budget == (truth.completion_tokens > 1000)
        assert b2.state == "missing" and b2.records == 0
        # A real process of that run appears on the next refresh and is matched to it.
        proc = fake_runs.start(*ARGV[2:], cwd=work)
        snap = await engine.refresh()
        (run,) = [r for r in _host(snap, "here").runs if r.configured]
        assert run.state == "running" and run.process is not None
        assert run.process.identity.pid == proc.pid and run.process.run == "gen"


async def test_unconfigured_run_is_shown_with_its_datasets(
    tmp_path: Path, fake_runs: FakeRuns
) -> None:
    work = tmp_path / "elsewhere"
    (work / "out" / "C7").mkdir(parents=True)
    truth = make_raw(work / "out" / "C7" / "raw_responses.jsonl", 12, seed=2)
    proc = fake_runs.start("--datasets", "C7", "--output-dir", "out", cwd=work)
    async with Engine(_config([_local()], [])) as engine:
        snap = await engine.refresh()
        (run,) = [
            r
            for r in _host(snap, "here").runs
            if r.process is not None and r.process.identity.pid == proc.pid
        ]
        assert not run.configured and run.name == f"run_inference.py (pid {proc.pid})"
        (c7,) = run.datasets
        assert c7.name == "C7" and c7.records == truth.records
        assert c7.completion_tokens == truth.completion_tokens


async def test_check_run_validates_every_record(tmp_path: Path) -> None:
    work = tmp_path / "w"
    d = work / "out" / "B1"
    d.mkdir(parents=True)
    truth = make_raw(d / "raw_responses.jsonl", 30, seed=9)
    with (d / "raw_responses.jsonl").open("ab") as f:
        f.write(b'{"sample_id": "bad", "output_ids": [1,,2], "completion_tokens": 2}\n')
    async with Engine(_config([_local()], [_run("gen", "here", work)])) as engine:
        b1, b2 = await engine.check_run("gen")
    assert b1["path"] == str(d / "raw_responses.jsonl")
    assert b1["records"] == truth.records
    assert b1["bad_lines_total"] == 1 and b1["bad_lines"][0]["line"] == 31
    assert b2["state"] == "missing"


async def test_engine_kill_stops_the_listed_process(tmp_path: Path, fake_runs: FakeRuns) -> None:
    work = tmp_path / "w"
    work.mkdir()
    proc = fake_runs.start(*ARGV[2:], cwd=work, ignore_term=True, children=1)
    async with Engine(_config([_local()], [_run("gen", "here", work)])) as engine:
        snap = await engine.refresh()
        (run,) = [r for r in _host(snap, "here").runs if r.configured]
        assert run.process is not None
        report = await engine.kill("here", run.process.identity, grace=0.5)
        assert report.all_gone
        assert {r.pid: r.outcome for r in report.results}[proc.pid] == "killed"
        snap = await engine.refresh()
        assert _host(snap, "here").runs[0].state == "stopped"


def test_dataset_path_expands_home_only_locally() -> None:
    run = RunConfig(name="r", host="h", workdir="~/data", argv=["run_inference.py"])
    for local, want in ((False, "~/data"), (True, str(Path.home() / "data"))):
        config = Config(hosts=[HostConfig(name="h", local=local)], runs=[run])
        layout = layout_of(config, run, ["run_inference.py", "--datasets", "B1"])
        assert layout.data_files == {"B1": f"{want}/out/B1/raw_responses.jsonl"}


# --------------------------------------------------------------------------- over SSH


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word (a hung host)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield int(srv.getsockname()[1])
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


@pytest.mark.ssh
async def test_one_bad_host_never_stalls_the_good_one(
    sshd: SshdServer, tmp_path: Path, blackhole: int
) -> None:
    work = tmp_path / "w"
    (work / "out" / "B1").mkdir(parents=True)
    truth = make_raw(work / "out" / "B1" / "raw_responses.jsonl", 25, seed=1)
    good = sshd.host_config("good")
    hung = sshd.host_config("hung", port=blackhole, connect_timeout=1.5)
    refused = sshd.host_config("refused", port=free_port())
    config = _config(
        [good, hung, refused],
        [_run("g", "good", work), _run("h", "hung", work), _run("r", "refused", work)],
    )
    async with Engine(config) as engine:
        snap = await asyncio.wait_for(engine.refresh(), 30)
        g = _host(snap, "good")
        assert g.connected and g.runs[0].datasets[0].records == truth.records
        assert g.runs[0].datasets[0].completion_tokens == truth.completion_tokens
        h = _host(snap, "hung")
        assert not h.connected and h.error is not None and "no SSH answer" in h.error
        r = _host(snap, "refused")
        assert (
            not r.connected
            and r.error == f"refused: connection refused by 127.0.0.1:{refused.port}"
        )
        assert not r.stale  # never seen: nothing old to show
        # The failing hosts back off: the next refresh answers for them at once with the same error.
        snap = await asyncio.wait_for(engine.refresh(), 30)
        assert _host(snap, "good").connected
        assert _host(snap, "refused").error == r.error


@pytest.mark.ssh
async def test_host_down_keeps_stale_values_then_reconnects(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    server = sshd_pool.start("flaky")
    work = tmp_path / "w"
    (work / "out" / "B1").mkdir(parents=True)
    truth = make_raw(work / "out" / "B1" / "raw_responses.jsonl", 33, seed=4)
    config = _config([server.host_config("flaky")], [_run("g", "flaky", work)])
    async with Engine(config) as engine:
        snap = await engine.refresh()
        assert _host(snap, "flaky").connected
        server.stop()
        h = _host(await engine.refresh(), "flaky")
        assert not h.connected and h.stale and h.error
        assert h.runs[0].datasets[0].records == truth.records  # last values kept
        server.restart()

        async def reconnected() -> HostView:
            while True:
                view = _host(await engine.refresh(), "flaky")
                if view.connected:
                    return view
                await asyncio.sleep(0.1)

        view = await asyncio.wait_for(reconnected(), 60)
        assert not view.stale and view.error is None
        assert view.runs[0].datasets[0].records == truth.records
    server.stop()


@pytest.mark.ssh
async def test_engine_over_ssh_sees_the_run(
    sshd: SshdServer, tmp_path: Path, fake_runs: FakeRuns
) -> None:
    work = tmp_path / "w"
    (work / "out" / "B2").mkdir(parents=True)
    truth = make_raw(work / "out" / "B2" / "raw_responses.jsonl", 18, seed=8)
    proc = fake_runs.start(*ARGV[2:], cwd=work)
    config = _config([sshd.host_config("remote")], [_run("gen", "remote", work)])
    async with Engine(config) as engine:
        snap = await engine.refresh()
    (run,) = [r for r in _host(snap, "remote").runs if r.configured]
    assert run.state == "running" and run.process is not None
    assert run.process.identity.pid == proc.pid
    b2 = run.datasets[1]
    assert b2.records == truth.records and b2.completion_tokens == truth.completion_tokens


async def test_live_rates_prompts_bound_and_over_budget_projection(
    tmp_path: Path, fake_runs: FakeRuns
) -> None:
    """A live run past its budget without --token-budget: rates appear as the file grows, the
    prompts file bounds the samples, and the projection says what will be wasted."""
    work = tmp_path / "w"
    data = work / "out" / "B1" / "raw_responses.jsonl"
    data.parent.mkdir(parents=True)
    make_raw(data, 20, seed=3)
    (work / "prompts").mkdir()
    (work / "prompts" / "B1.jsonl").write_text("".join(f'{{"p": {i}}}\n' for i in range(90)))
    config = Config(
        hosts=[_local()],
        runs=[_run("gen", "here", work)],
        datasets={"B1": DatasetConfig(token_budget=100, prompts="prompts/B1.jsonl")},
    )
    fake_runs.start(*ARGV[2:], cwd=work)
    rng = random.Random(4)
    more = [dump(raw_record(rng, f"new{i}")) for i in range(60)]
    async with Engine(config) as engine:

        async def until_rates() -> Any:
            i = 0
            while True:
                if i < len(more):
                    with data.open("ab") as f:
                        f.write(more[i])
                    i += 1
                snap = await engine.refresh()
                b1 = next(r for r in _host(snap, "here").runs if r.configured).datasets[0]
                if b1.rates.req_per_s_all is not None:
                    return b1
                await asyncio.sleep(0.05)

        b1 = await asyncio.wait_for(until_rates(), 60)
    done = b1.unique_ids
    assert b1.over_budget and b1.token_budget == 100
    assert b1.projection.stop_reason == "prompts"
    assert b1.projection.remaining_samples == 90 - done
    assert b1.projection.over_budget_tokens == b1.completion_tokens - 100
    assert b1.projection.waste_tokens > b1.projection.over_budget_tokens
    assert b1.projection.message is not None and "--token-budget" in b1.projection.message


async def test_overlapping_refreshes_share_one_poll(tmp_path: Path) -> None:
    work = tmp_path / "w"
    (work / "out" / "B1").mkdir(parents=True)
    make_raw(work / "out" / "B1" / "raw_responses.jsonl", 3)
    async with Engine(_config([_local()], [_run("gen", "here", work)])) as engine:
        a, b = await asyncio.gather(engine.refresh(), engine.refresh())
        assert a is b and engine.last is a
        c = await engine.refresh()
        assert c is not a and c.time >= a.time


async def test_tick_is_the_supervision_loop_snapshot_policy_and_events(
    tmp_path: Path, state_home: Path, fake_runs: FakeRuns
) -> None:
    """``Engine.tick`` on a run past its budget under ``budget_policy = "stop"``: without ``act``
    the run is left alone; with it the run is stopped once, the outcome and its event come back
    with the snapshot the policy acted on, and the stop is never reported as a death."""
    from supervisor.config import load_config
    from tests.fixtures_actions import over_budget_stop_run
    from tests.fixtures_procs import gone

    run, cfg = over_budget_stop_run(tmp_path, fake_runs, seed=5)
    async with Engine(load_config(cfg)) as engine:
        engine.supervise(report_initial=False, others=False)
        looked = await engine.tick(act=False)
        assert looked.outcomes == [] and not gone(run.pid, run.start_time)
        (rv,) = [r for h in looked.snapshot.hosts for r in h.runs if r.name == "gen"]
        assert rv.state == "running" and rv.process is not None
        assert rv.process.identity.pid == run.pid

        seen: list[Any] = []
        acted = await engine.tick(on_snapshot=seen.append)
        assert seen == [acted.snapshot]
        (outcome,) = acted.outcomes
        assert outcome.acted and outcome.ok and outcome.event.policy == "stop"
        assert outcome.event.identity.pid == run.pid
        assert gone(run.pid, run.start_time)
        assert [e.kind for e in acted.events] == ["budget-policy"]

        later = [await engine.tick() for _ in range(3)]
        assert [o for t in later for o in t.outcomes] == []  # once per event, ever
        kinds = [e.kind for t in later for e in t.events]
        assert "run-died" not in kinds and "budget-policy" not in kinds
        quiet = await engine.tick(events=False)
        assert quiet.events == [] and quiet.snapshot is engine.last
