"""Events (``supervisor.events``): which snapshot changes are reported, once each, with the
command that acts; the dashboard and ``runwatch watch`` share them."""

from __future__ import annotations

import msgspec

from supervisor.config import Config
from supervisor.engine import Event, EventTracker, stop_key
from supervisor.model import DatasetView, HostView, Projection, RunView, Snapshot
from tests.fixtures_tui import fixed_config, fixed_snapshot

CONFIG = fixed_config()


def changes(
    before: Snapshot | None, after: Snapshot, expected_stops: set[str], config: Config
) -> list[Event]:
    """The events from ``before`` to ``after`` as the dashboard reports them (conditions true in
    ``before`` are known already)."""
    if before is None:
        return []
    tracker = EventTracker(config, report_initial=False)
    tracker.update(before)
    return tracker.update(after, expected_stops)


def _with(snapshot: Snapshot, **changes_by_path: object) -> Snapshot:
    copy = msgspec.convert(msgspec.to_builtins(snapshot), Snapshot)
    for path, value in changes_by_path.items():
        host, run, *rest = path.split("__")
        h = next(x for x in copy.hosts if x.name == host.replace("_", "-"))
        r = next(x for x in h.runs if x.name == run.replace("_", "-"))
        if rest == ["state"]:
            r.state = value  # type: ignore[assignment]
        else:
            ds = next(d for d in r.datasets if d.name == rest[0])
            setattr(ds, rest[1], value)
    return copy


def test_no_alert_at_start_up_or_without_change() -> None:
    snap = fixed_snapshot()
    assert list(changes(None, snap, set(), CONFIG)) == []
    assert list(changes(snap, snap, set(), CONFIG)) == []


def test_budget_stall_and_death_are_reported_once_each() -> None:
    before = fixed_snapshot()
    after = _with(
        before,
        gpu_box__eagle3_kimi__B1__over_budget=True,
        gpu_box__eagle3_kimi__B4__stalled=True,
    )
    kinds = [(a.kind, a.title) for a in changes(before, after, set(), CONFIG)]
    assert kinds == [("over-budget", "eagle3-kimi B1"), ("stalled", "eagle3-kimi B4")]
    died = _with(before, gpu_box__eagle3_kimi__state="stopped")
    alerts = list(changes(before, died, set(), CONFIG))
    assert [a.kind for a in alerts] == ["run-died"] and "4242" in alerts[0].message
    # A run stopped on purpose is not a death.
    assert list(changes(before, died, {stop_key("gpu-box", "eagle3-kimi", 4242)}, CONFIG)) == []
    # ...but another process of the same run is.
    assert len(list(changes(before, died, {stop_key("gpu-box", "eagle3-kimi", 1)}, CONFIG))) == 1


def test_host_lost_and_back() -> None:
    up = Snapshot(time=1.0, hosts=[HostView(name="h", connected=True)])
    down = Snapshot(time=2.0, hosts=[HostView(name="h", connected=False, stale=True, error="eof")])
    lost = list(changes(up, down, set(), CONFIG))
    assert [(a.kind, a.severity) for a in lost] == [("host-lost", "critical")]
    assert "eof" in lost[0].message
    assert [a.kind for a in changes(down, up, set(), CONFIG)] == ["host-back"]


def test_stale_host_values_raise_no_run_alerts() -> None:
    ds = DatasetView(name="B1", path="p", over_budget=True, projection=Projection(message="m"))
    run = RunView(name="r", host="h", state="stopped", datasets=[ds])
    before = Snapshot(
        time=1.0,
        hosts=[
            HostView(
                name="h",
                connected=False,
                stale=True,
                runs=[
                    RunView(
                        name="r",
                        host="h",
                        state="running",
                        datasets=[DatasetView(name="B1", path="p")],
                    )
                ],
            )
        ],
    )
    after = Snapshot(time=2.0, hosts=[HostView(name="h", connected=False, stale=True, runs=[run])])
    assert list(changes(before, after, set(), CONFIG)) == []


def test_the_watcher_reports_problems_found_at_start_once_each_with_the_command() -> None:
    snap = fixed_snapshot()
    tracker = EventTracker(CONFIG, report_initial=True)
    first = tracker.update(snap)
    kinds = {(e.kind, e.title) for e in first}
    assert ("over-budget", "eagle3-kimi B2") in kinds
    assert ("stalled", "eagle3-kimi B6") in kinds
    assert ("host-lost", "api-box") in kinds
    over = next(e for e in first if e.kind == "over-budget")
    # The exact command: the fixed config is not the default one, so it is named.
    assert over.command is not None and over.command.endswith(
        "restart eagle3-kimi --set token-budget=10000000"
    )
    assert "-c " in over.command and "configs/fleet.toml" in over.command
    assert not [e for e in first if e.kind in ("dataset-done", "all-done")]
    # Nothing new: nothing reported again.
    assert tracker.update(snap) == []


def test_a_condition_is_reported_again_only_after_it_cleared() -> None:
    snap = fixed_snapshot()
    tracker = EventTracker(CONFIG)
    tracker.update(snap)
    cleared = _with(snap, gpu_box__eagle3_kimi__B6__stalled=False)
    assert [e.kind for e in tracker.update(cleared)] == []
    again = tracker.update(snap)
    assert [(e.kind, e.title) for e in again] == [("stalled", "eagle3-kimi B6")]


def test_a_lost_host_keeps_its_conditions_and_is_reported_back_once() -> None:
    snap = fixed_snapshot()
    tracker = EventTracker(CONFIG)
    tracker.update(snap)
    gpu = snap.hosts[0]
    down = msgspec.structs.replace(
        snap,
        hosts=[
            msgspec.structs.replace(gpu, connected=False, stale=True, error="eof"),
            snap.hosts[1],
        ],
    )
    lost = tracker.update(down)
    assert [(e.kind, e.host) for e in lost] == [("host-lost", "gpu-box")]
    assert tracker.update(down) == []
    back = tracker.update(snap)
    # Back with the same problems: only "back", the over-budget alert is not repeated.
    assert [(e.kind, e.host) for e in back] == [("host-back", "gpu-box")]


def test_a_run_gone_while_its_host_was_down_is_reported_when_it_is_back() -> None:
    snap = fixed_snapshot()
    tracker = EventTracker(CONFIG)
    tracker.update(snap)
    gpu = snap.hosts[0]
    down = msgspec.structs.replace(
        snap, hosts=[msgspec.structs.replace(gpu, connected=False, stale=True), snap.hosts[1]]
    )
    tracker.update(down)
    rebooted = _with(snap, gpu_box__eagle3_kimi__state="stopped")
    kinds = [e.kind for e in tracker.update(rebooted)]
    assert kinds == ["host-back", "run-died"]


def test_a_shrinking_file_and_duplicates_are_reported() -> None:
    snap = fixed_snapshot()
    tracker = EventTracker(CONFIG)
    tracker.update(snap)
    b1 = next(d for d in snap.hosts[0].runs[0].datasets if d.name == "B1")
    shrunk = _with(snap, gpu_box__eagle3_kimi__B1__records=b1.records - 5)
    events = tracker.update(shrunk)
    assert [e.kind for e in events] == ["data-shrank"]
    assert events[0].severity == "critical" and "runwatch" in (events[0].command or "")
    dup = _with(shrunk, gpu_box__eagle3_kimi__B1__duplicates=3)
    assert [e.kind for e in tracker.update(dup)] == ["duplicates"]


def test_a_file_moved_aside_by_runwatch_is_no_data_loss() -> None:
    from supervisor.engine import moved_key

    snap = fixed_snapshot()
    tracker = EventTracker(CONFIG)
    tracker.update(snap)
    b1 = next(d for d in snap.hosts[0].runs[0].datasets if d.name == "B1")
    fresh = _with(snap, gpu_box__eagle3_kimi__B1__records=0)
    assert tracker.update(fresh, {moved_key(b1.path)}) == []
    # the same shrink of another dataset, not moved by runwatch, is still reported
    b2 = next(d for d in snap.hosts[0].runs[0].datasets if d.name == "B2")
    lost = _with(fresh, gpu_box__eagle3_kimi__B2__records=b2.records - 1)
    events = tracker.update(lost, {moved_key(b1.path)})
    assert [(e.kind, e.dataset) for e in events] == [("data-shrank", "B2")]


def test_a_run_that_finished_its_datasets_did_not_die_and_all_done_is_said_once() -> None:
    ds = DatasetView(name="B1", path="p", records=10, unique_ids=10, max_samples=10)
    cfg = msgspec.structs.replace(CONFIG, hosts=CONFIG.hosts[:1], runs=CONFIG.runs[:1])
    running = RunView(name="eagle3-kimi", host="gpu-box", state="running", datasets=[ds])
    running.process = fixed_snapshot().hosts[0].runs[0].process
    live = Snapshot(time=1.0, hosts=[HostView(name="gpu-box", connected=True, runs=[running])])
    tracker = EventTracker(cfg)
    tracker.update(
        Snapshot(time=0.0, hosts=[HostView(name="gpu-box", connected=True, runs=[
            msgspec.structs.replace(running, datasets=[msgspec.structs.replace(ds, records=5,
                                                                               unique_ids=5)])])])
    )  # fmt: skip
    # Done while it runs: responses in flight still land, so the figure is not final yet.
    assert sorted(e.kind for e in tracker.update(live)) == ["all-done"]
    stopped = Snapshot(
        time=2.0,
        hosts=[
            HostView(
                name="gpu-box",
                connected=True,
                runs=[msgspec.structs.replace(running, state="stopped", process=None)],
            )
        ],
    )
    # It ended by itself: finished, not died; its datasets done with the final figure, once.
    ended = tracker.update(stopped)
    assert sorted(e.kind for e in ended) == ["dataset-done", "finished"]
    assert next(e for e in ended if e.kind == "dataset-done").message.startswith("done: 10 ")
    assert tracker.update(stopped) == []


def test_a_run_enforcing_its_own_budget_is_not_alerted_over_budget() -> None:
    snap = fixed_snapshot()
    proc = snap.hosts[0].runs[0].process
    assert proc is not None
    proc.flags.token_budget = 10_000_000  # the run stops each dataset at it
    kinds = {(e.kind, e.title) for e in EventTracker(CONFIG).update(snap)}
    assert ("over-budget", "eagle3-kimi B2") not in kinds
    assert ("stalled", "eagle3-kimi B6") in kinds


def test_waste_and_stall_multiple_thresholds() -> None:
    from supervisor.config import AlertsConfig

    cfg = msgspec.structs.replace(
        CONFIG, alerts=AlertsConfig(waste_tokens=5_000_000, waste_usd=50.0, stall_multiple=10)
    )
    snap = _with(
        fixed_snapshot(),
        gpu_box__eagle3_kimi__B1__projection=Projection(waste_tokens=6_000_000),
        gpu_box__eagle3_kimi__B4__projection=Projection(waste_tokens=10, waste_cost_usd=80.0),
        gpu_box__eagle3_kimi__B5__projection=Projection(waste_tokens=4_000_000),
    )
    b3 = next(d for d in snap.hosts[0].runs[0].datasets if d.name == "B3")
    b3.rates.req_per_s_10m = 0.5  # one response every 2 s: 10x is 20 s
    b3.idle_s = 25.0
    b3.stalled = False
    events = EventTracker(cfg).update(snap)
    waste = sorted(e.title for e in events if e.kind == "waste")
    assert waste == ["eagle3-kimi B1", "eagle3-kimi B2", "eagle3-kimi B4"]  # B2: +14 M
    assert any(e.kind == "stalled" and e.title == "eagle3-kimi B3" for e in events)
    b3.idle_s = 15.0
    events = EventTracker(cfg).update(snap)
    assert not any(e.kind == "stalled" and e.title == "eagle3-kimi B3" for e in events)


def test_an_audited_restart_is_done_failed_or_rolled_back() -> None:
    from supervisor.events import audited_restart_event

    config = fixed_config()
    base = {"action": "restart", "host": "gpu-box", "run": "eagle3-kimi"}
    done = audited_restart_event(config, {**base, "ok": True, "identity": {"pid": 42}, "steps": []})
    failed_step = {"name": "launch", "ok": False, "detail": "exited at once"}
    failed = audited_restart_event(config, {**base, "ok": False, "steps": [failed_step]})
    rolled = audited_restart_event(
        config, {**base, "ok": False, "steps": [failed_step], "rollback": {"ok": True}}
    )
    assert done is not None and done.kind == "restart-done" and "42" in done.message
    assert failed is not None and failed.kind == "restart-failed"
    assert rolled is not None and rolled.kind == "restart-rolled-back"
    assert "(rolled back)" in rolled.message and "exited at once" in rolled.message


def test_w13_an_audited_stop_says_who_and_from_where_for_this_configs_runs_only() -> None:
    from supervisor.events import audited_stop_event

    config = fixed_config()
    by = "ana@laptop, pid 77, runwatch kill"
    base = {"action": "kill", "host": "gpu-box", "run": "eagle3-kimi", "time": 5.0, "by": by}
    ok = audited_stop_event(config, {**base, "ok": True, "identity": {"pid": 42}})
    assert ok is not None and (ok.kind, ok.severity) == ("stopped", "info")
    assert ok.message == f"Stopped through runwatch (pid 42) by {by}."
    failed = audited_stop_event(
        config, {**base, "ok": False, "identity": {"pid": 42}, "detail": "refused: busy\nmore"}
    )
    assert failed is not None and failed.severity == "warning"
    assert failed.message.endswith("failed: refused: busy")
    job = audited_stop_event(config, {**base, "ok": True, "identity": {"job_id": "12"}})
    assert job is not None and "(job 12)" in job.message
    # The audit log is shared by every config: another config's run is not this one's.
    assert audited_stop_event(config, {**base, "ok": True, "run": "someone-elses"}) is None
    assert audited_stop_event(config, {**base, "ok": True, "host": "elsewhere"}) is None
