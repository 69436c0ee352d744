"""Data that shrinks or is replaced under a running run raises an alarm with the byte counts,
kept on the dataset and written to the audit log once; not while no writer is alive."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from supervisor import audit
from supervisor.agent.scan import Scanner
from supervisor.dataloss import DataLossWatch


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _rows(n: int, start: int = 0) -> str:
    return "".join(
        json.dumps({"conversation_id": i, "conversations": [{"role": "assistant", "content": "x"}]})
        + "\n"
        for i in range(start, start + n)
    )


def test_overwrite_under_a_running_run_is_an_alarm_once(tmp_path: Path) -> None:
    data = tmp_path / "out.jsonl"
    data.write_text(_rows(50))
    scanner, watch = Scanner(), DataLossWatch()
    before = data.stat().st_size
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    data.write_text(_rows(3))  # opened "w": the 50 rows are gone
    alarm = watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True)
    assert alarm is not None and "shrank" in alarm
    assert f"{before:,} bytes before" in alarm and f"{data.stat().st_size} bytes now" in alarm
    with data.open("a") as f:
        f.write(_rows(100, 3))  # grows past the old size: the alarm stays
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) == alarm
    records = [r for r in audit.read() if r["action"] == "data-loss"]
    assert len(records) == 1 and records[0]["bytes_before"] == before


def test_replacement_by_a_bigger_file_is_an_alarm(tmp_path: Path) -> None:
    data = tmp_path / "out.jsonl"
    data.write_text(_rows(5))
    scanner, watch = Scanner(), DataLossWatch()
    watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True)
    other = tmp_path / "new.jsonl"
    other.write_text(_rows(20, 100))
    os.replace(other, data)
    alarm = watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True)
    assert alarm is not None and "was replaced" in alarm


def test_no_alarm_without_a_writer_or_for_growth(tmp_path: Path) -> None:
    data = tmp_path / "out.jsonl"
    data.write_text(_rows(5))
    scanner, watch = Scanner(), DataLossWatch()
    watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True)
    with data.open("a") as f:
        f.write(_rows(5, 5))
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    data.write_text(_rows(1))  # the documented repair, say: no writer alive
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), False) is None
    assert watch.alarms() == {}


def test_a_torn_tail_repaired_under_a_running_run_is_no_loss(tmp_path: Path) -> None:
    """A partial last line is not data: its removal (runwatch's repair before a relaunch, or the
    relaunched client's own) raises no alarm; losing a complete record still does."""
    data = tmp_path / "out.jsonl"
    complete = _rows(5)
    data.write_text(complete + '{"conversation_id": 5, "conv')  # killed mid-write
    scanner, watch = Scanner(), DataLossWatch()
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    os.truncate(data, len(complete))  # the repair: back to the last newline
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    os.truncate(data, len(complete) - 3)  # into a complete record: loss
    alarm = watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True)
    assert alarm is not None
    assert [r["action"] for r in audit.read()] == ["data-loss"]


def test_w15_a_scan_stopped_at_its_text_budget_then_a_torn_tail_repair_is_no_loss(
    tmp_path: Path,
) -> None:
    """A scan that stops early (its texts budget full, as under load with a backlog) reads no
    tail: the file's size then counts the record being written. Its repair is no loss."""
    data = tmp_path / "out.jsonl"
    complete = _rows(5)
    data.write_text(complete + '{"conversation_id": 5, "conv')  # a record being written
    scanner, watch = Scanner(max_text_bytes=1), DataLossWatch()
    first = scanner.scan(str(data), fmt="modelopt")
    assert first["texts_more"] and first["offset"] < first["size"]  # stopped early
    assert watch.observe("h", "r", first, True) is None
    os.truncate(data, len(complete))  # the torn tail cut off (the writer was killed mid-record)
    for _ in range(6):  # the scan catches up, a record per call
        assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    assert watch.alarms() == {}
    assert not [r for r in audit.read() if r["action"] == "data-loss"]


def test_w15_runwatchs_own_move_aside_from_another_process_is_no_loss(tmp_path: Path) -> None:
    """A restart with --move-aside (the dashboard's, or ``runwatch restart`` in another terminal)
    puts a new file in place of a big one under a running run: its audit record says runwatch did
    it, so no alarm; the same change without that record is an alarm."""
    data = tmp_path / "out.jsonl"
    data.write_text(_rows(50))
    scanner, watch = Scanner(), DataLossWatch()
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    os.rename(data, tmp_path / "out.jsonl.legacy")
    audit.record("move-aside", host="h", run="r", ok=True, path=str(data), to="x", size=1)
    data.write_text(_rows(2, 100))  # the relaunched client's first records
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    with data.open("a") as f:
        f.write(_rows(2, 102))
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None

    other = tmp_path / "other.jsonl"
    other.write_text(_rows(50))
    assert watch.observe("h", "r", scanner.scan(str(other), fmt="modelopt"), True) is None
    other.write_text(_rows(2, 100))  # no move-aside of this path: data loss
    alarm = watch.observe("h", "r", scanner.scan(str(other), fmt="modelopt"), True)
    assert alarm is not None and str(other) in alarm
    assert [r["action"] for r in audit.read()] == ["move-aside", "data-loss"]


def test_w15_a_launch_measures_complete_bytes_so_a_clients_own_tail_cut_is_no_loss(
    tmp_path: Path,
) -> None:
    """The launch's check (a data file smaller after it than before it is data loss) compares
    complete bytes: a client that cuts its own torn last line when it resumes loses nothing; a
    scan that stopped early counts only what it read."""
    from supervisor.gate import complete_size

    data = tmp_path / "out.jsonl"
    complete = _rows(5)
    data.write_text(complete + '{"conversation_id": 5, "conv')
    before = complete_size(Scanner().scan(str(data), fmt="modelopt", validate="none"))
    assert before == len(complete)
    os.truncate(data, len(complete))  # the client's own repair when it resumes
    after = complete_size(Scanner().scan(str(data), fmt="modelopt", validate="none"))
    assert after == before
    early = Scanner(max_text_bytes=1).scan(str(data), fmt="modelopt")
    assert early["texts_more"] and 0 < complete_size(early) < len(complete)
    assert complete_size({"path": str(data), "state": "missing"}) == 0


async def test_w20_a_file_of_a_process_outside_the_config_is_never_data_loss_here(
    tmp_path: Path, fake_runs: Any
) -> None:
    """Another config's run (another runwatch's, a colleague's) is listed but not judged: its
    owner's move-aside is in its own audit log, so this config would raise a false DATA LOSS and
    write it to its own audit log. A configured run's file that disappears still is an alarm."""
    from supervisor.config import Config, HostConfig, RunConfig
    from supervisor.engine import Engine
    from tests.fixtures_data import make_raw

    def data(work: Path) -> Path:
        (work / "out" / "C7").mkdir(parents=True)
        make_raw(work / "out" / "C7" / "raw_responses.jsonl", 12, seed=2)
        return work / "out" / "C7" / "raw_responses.jsonl"

    theirs, ours = data(tmp_path / "theirs"), data(tmp_path / "ours")
    argv = ["--datasets", "C7", "--output-dir", "out"]
    stranger = fake_runs.start(*argv, cwd=tmp_path / "theirs")
    mine = fake_runs.start(*argv, cwd=tmp_path / "ours")
    run = RunConfig(
        name="gen", host="here", workdir=str(tmp_path / "ours"),
        argv=["python3", "run_inference.py", *argv], output_dir="out",
    )  # fmt: skip
    config = Config(hosts=[HostConfig(name="here", local=True, command_timeout=30.0)], runs=[run])
    async with Engine(config) as engine:
        snap = await engine.refresh()
        pids = {r.process.identity.pid for h in snap.hosts for r in h.runs if r.process}
        assert {stranger.pid, mine.pid} <= pids
        for path in (theirs, ours):  # moved aside, by no runwatch of this config
            os.rename(path, path.with_name("raw_responses.jsonl.legacy"))
        snap = await engine.refresh()
    alarms = {
        r.configured: [d.alarm for d in r.datasets]
        for h in snap.hosts
        for r in h.runs
        if r.process is not None and r.process.identity.pid in (stranger.pid, mine.pid)
    }
    assert alarms[False] == [None]
    alarm = alarms[True][0]
    assert alarm is not None and "disappeared" in alarm
    losses = [r for r in audit.read() if r["action"] == "data-loss"]
    assert [r["path"] for r in losses] == [str(ours)]
