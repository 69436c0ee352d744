"""A state dir that refuses writes never blinds detection (W22): who holds a run's lock is read
without making a directory, and a data-loss alarm whose audit record cannot be written is still
raised, saying so. The refusals are real: a file where a directory should be, and the kernel's
``/dev/full`` (every write ENOSPC) under the audit log's descriptor."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from supervisor import audit, runlock
from supervisor.agent.scan import Scanner
from supervisor.dataloss import DataLossWatch
from supervisor.events import stop_key
from supervisor.paths import state_dir
from supervisor.stops import StopLedger
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
