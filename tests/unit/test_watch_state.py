"""The watcher's judgements survive its state dir and its clock.

W22: a state dir that refuses writes never blinds detection: who holds a run's lock is read
without making a directory, and a data-loss alarm whose audit record cannot be written is still
raised, saying so. The refusals are real: a file where a directory should be, and the kernel's
``/dev/full`` (every write ENOSPC) under the audit log's descriptor.

W23: the wall clock stepped back after the watcher started: a stop or a move-aside written since
is still runwatch's own (no false run-died, no false DATA LOSS), and a pending restart waits no
longer than its backoff.

W24: a client's atomic rewrite of its output (a temporary file renamed over it) that keeps every
record read is counted again but is no data loss; one that changes or drops them still is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from supervisor import audit, intents, runlock
from supervisor.agent.scan import Scanner
from supervisor.autorestart import AutoRestart
from supervisor.config import Config, load_config
from supervisor.dataloss import DataLossWatch
from supervisor.events import busy_key, stop_key
from supervisor.guard import BudgetEvent, BudgetGuard
from supervisor.model import Identity
from supervisor.paths import state_dir
from supervisor.stops import StopLedger
from supervisor.watch import alert_spool
from tests.fixtures_tui import fixed_config
from tests.unit.test_dataloss import _rows


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def test_w22_who_holds_a_run_is_read_without_writing_the_state_dir() -> None:
    config = fixed_config()
    run = config.runs[0]
    audit.record(
        "kill", config=config.key, host=run.host, run=run.name, ok=True, identity={"pid": 4242}
    )
    runs = state_dir() / "runs"
    if runs.is_dir():
        shutil.rmtree(runs)
    runs.write_text("not a directory\n")  # nothing can be made under it
    assert runlock.holder(config, run.name) is None
    ledger = StopLedger(config)
    assert stop_key(run.host, run.name, 4242) in ledger.expected()


def test_w22_a_data_loss_alarm_is_raised_when_the_disk_refuses_its_audit_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "out.jsonl"
    data.write_text(_rows(50))
    scanner, watch = Scanner(), DataLossWatch()
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    data.write_text(_rows(3))  # opened "w": the 50 rows are gone
    # The disk is full: the audit record's write fails with ENOSPC.
    monkeypatch.setattr(audit, "open_private", lambda path, flags: os.open("/dev/full", flags))
    alarm = watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True)
    assert alarm is not None and alarm.startswith("DATA LOSS") and "shrank" in alarm
    assert "not in the audit log" in alarm and "No space left on device" in alarm
    # Still the one alarm of that file at the next refresh.
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) == alarm


# W23: the wall clock is stepped back after the watcher started (NTP correcting a clock that ran
# fast, a VM resumed from a snapshot). A ledger that started at a wall time ahead of the clock's
# now is exactly that state: every record written from now on bears an earlier time.
CLOCK_STEP_S = 300.0


def test_w23_a_kill_after_the_clock_stepped_back_is_still_a_stop_with_who() -> None:
    config = fixed_config()
    run = config.runs[0]
    ledger = StopLedger(config, started=time.time() + CLOCK_STEP_S)
    assert stop_key(run.host, run.name, 4242) not in ledger.expected()
    # `runwatch kill` from another terminal: its audit record, written by another process.
    kill = (
        "from supervisor import audit; audit.set_origin('runwatch kill'); audit.record("
        f"'kill', config={config.key!r}, host={run.host!r}, run={run.name!r}, ok=True, "
        "identity={'pid': 4242})"
    )
    subprocess.run([sys.executable, "-c", kill], check=True, timeout=60)
    assert stop_key(run.host, run.name, 4242) in ledger.expected()
    (event,) = ledger.take_events()
    assert event.kind == "stopped" and event.run == run.name and "runwatch kill" in event.text()


def test_w23_a_move_aside_after_the_clock_stepped_back_is_no_loss(tmp_path: Path) -> None:
    data = tmp_path / "out.jsonl"
    data.write_text(_rows(50))
    # The file is seen, then the clock steps back before the next refresh.
    now = time.time()
    clock = iter([now + CLOCK_STEP_S, now, now + 1.0]).__next__
    scanner, watch = Scanner(), DataLossWatch(clock=clock)
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    os.rename(data, tmp_path / "out.jsonl.moved")
    audit.record("move-aside", host="h", run="r", ok=True, path=str(data))
    data.write_text(_rows(3))
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    assert not [r for r in audit.read() if r["action"] == "data-loss"]


def test_w23_a_pending_restart_taken_over_after_the_clock_stepped_back_waits_its_backoff_only() -> (
    None
):
    cfg = fixed_config()
    run = msgspec.structs.replace(cfg.runs[0], on_exit="restart")
    cfg = msgspec.structs.replace(cfg, runs=[run, *cfg.runs[1:]])
    # Written by a watcher 10 s before its backoff's end, with the clock an hour ahead of now.
    ahead = time.time() + 3600.0
    intent = intents.Intent(
        run=run.name, host=run.host, attempt=1, not_before=ahead + 10.0, reason="run-died: test",
        written=ahead, by="someone",
    )  # fmt: skip
    intents.write(cfg, intent)

    class Engine:
        config = cfg

    restarts = AutoRestart(Engine())  # type: ignore[arg-type]
    notes, abandoned = restarts.take_over()
    assert not abandoned and len(notes) == 1
    assert restarts.pending()[run.name] <= 10.0  # not an hour and 10 s


# W24: a client rewrites its output to a temporary file and renames it over (a checkpoint of
# every record so far, and the new ones).
def _rewrite(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_w24_an_atomic_rewrite_that_keeps_every_record_is_no_data_loss(tmp_path: Path) -> None:
    data = tmp_path / "out.jsonl"
    data.write_text(_rows(200))  # past the head and the tail that fingerprint it
    scanner, watch = Scanner(), DataLossWatch()
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    _rewrite(data, _rows(260))
    scan = scanner.scan(str(data), fmt="modelopt")
    assert scan["records"] == 260  # counted again from zero: exact, never twice
    assert "atomic rewrite" in str(scan["rescan_reason"])
    assert watch.observe("h", "r", scan, True) is None
    _rewrite(data, _rows(260))  # a checkpoint with nothing new
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    assert not [r for r in audit.read() if r["action"] == "data-loss"]


@pytest.mark.parametrize(
    "rewritten",
    [
        pytest.param(_rows(199) + _rows(61, 300), id="its last record changed"),
        pytest.param(_rows(1, 500) + _rows(259, 1), id="its first record changed"),
        pytest.param(_rows(150), id="records dropped"),
    ],
)
def test_w24_a_rewrite_that_changes_or_drops_records_read_is_still_data_loss(
    tmp_path: Path, rewritten: str
) -> None:
    data = tmp_path / "out.jsonl"
    data.write_text(_rows(200))
    scanner, watch = Scanner(), DataLossWatch()
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    _rewrite(data, rewritten)
    alarm = watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True)
    assert alarm is not None and alarm.startswith("DATA LOSS")


# W26: a config with a `project` name, moved (or opened from a second copy) between two watchers
# or while an action holds a run: its state is the project's, whatever the file's path.
def _project_configs(tmp_path: Path) -> tuple[Config, Config]:
    from tests.fixtures_actions import DemoRun

    demo = DemoRun(tmp_path / "a", "http://127.0.0.1:9/v1", run_toml=RESTART_TOML)
    text = 'project = "eagle3-gen"\n' + demo.config_path.read_text()
    demo.config_path.write_text(text)
    moved = tmp_path / "b" / "runwatch.toml"
    moved.parent.mkdir()
    moved.write_text(text)
    return load_config(demo.config_path), load_config(moved)


RESTART_TOML = 'on_exit = "restart"'


def test_w26_a_pending_restart_survives_moving_a_project_config(tmp_path: Path) -> None:
    before, after = _project_configs(tmp_path)
    assert before.key == after.key and before.path != after.path
    intent = intents.Intent(
        run="demo", host="local", attempt=1, not_before=time.time() + 5, reason="run-died: test",
        written=time.time(), by="someone",
    )  # fmt: skip
    intents.write(before, intent)

    class Engine:
        config = after

    notes, abandoned = AutoRestart(Engine()).take_over()  # type: ignore[arg-type]
    assert not abandoned
    assert len(notes) == 1 and "took over the pending restart of demo" in notes[0]


async def test_w26_an_action_from_the_other_copy_holds_the_same_run_lock(tmp_path: Path) -> None:
    before, after = _project_configs(tmp_path)
    async with runlock.hold(before, "demo", 1.0, "kill"):
        assert runlock.holder(after, "demo") is not None
        assert busy_key("local", "demo") in StopLedger(after).expected()


def test_w26_undelivered_alerts_are_spooled_under_the_project(tmp_path: Path) -> None:
    before, after = _project_configs(tmp_path)
    assert alert_spool(before) == alert_spool(after)


async def test_w22_a_budget_policy_acts_once_when_its_marker_cannot_be_written(
    tmp_path: Path,
) -> None:
    config = fixed_config()
    run = config.runs[0]
    blocked = tmp_path / "guard"
    blocked.write_text("not a directory\n")  # the once-only marker cannot be made under it
    guard = BudgetGuard(config, marker_dir=blocked / "markers")
    ident = Identity(boot_id="b", pid=4242, start_time=1, uid=0, argv=("python3",))
    event = BudgetEvent(
        policy="warn", host=run.host, run=run.name, identity=ident, datasets=["B1"], budget=100,
        tokens={"B1": 150}, waste_tokens=50, message="B1 over its budget", keys=["k1"],
    )  # fmt: skip

    class Engine:
        pass

    engine = Engine()
    engine.config = config  # type: ignore[attr-defined]
    first = await guard.act(engine, event)  # type: ignore[arg-type]
    assert first.acted and first.ok
    assert "once-only marker not written" in first.detail and "this process only" in first.detail
    again = await guard.act(engine, event)  # type: ignore[arg-type]
    assert not again.acted and again.detail == "already acted on"
    (record,) = [r for r in audit.read() if r["action"] == "budget"]
    assert "once-only marker not written" in record["detail"]


def why_not_read(ledger: StopLedger) -> str | None:
    return ledger.error


def append_by_another_writer() -> None:
    """What a log writable by others lets anyone do (and why it is refused): a line appended."""
    with audit.audit_path().open("a") as f:
        f.write('{"action": "kill", "run": "forged"}\n')


def test_w22_an_audit_log_refused_as_unsafe_leaves_detection_going(tmp_path: Path) -> None:
    config = fixed_config()
    run = config.runs[0]
    audit.record(
        "kill", config=config.key, host=run.host, run=run.name, ok=True, identity={"pid": 4242}
    )
    ledger = StopLedger(config, started=time.time() - 5)
    assert stop_key(run.host, run.name, 4242) in ledger.expected() and why_not_read(ledger) is None
    data = tmp_path / "out.jsonl"
    data.write_text(_rows(50))
    scanner, watch = Scanner(), DataLossWatch()
    assert watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True) is None
    os.chmod(audit.audit_path(), 0o666)  # writable by others: refused, never trusted
    append_by_another_writer()
    # The stops read so far are kept, and why the log is not read is said.
    assert stop_key(run.host, run.name, 4242) in ledger.expected()
    assert "writable" in str(why_not_read(ledger))
    # A file that shrank is an alarm: whether runwatch did it is unknown, so it is said.
    data.write_text(_rows(3))
    alarm = watch.observe("h", "r", scanner.scan(str(data), fmt="modelopt"), True)
    assert alarm is not None and alarm.startswith("DATA LOSS") and "could not be read" in alarm
    os.chmod(audit.audit_path(), 0o600)
    ledger.expected()
    assert why_not_read(ledger) is None
