"""The pure parts of the app: bars, sparklines and which snapshot changes raise a notification."""

from __future__ import annotations

import msgspec

from supervisor.model import DatasetView, HostView, Projection, RunView, Snapshot
from tests.fixtures_tui import fixed_snapshot
from tui.alerts import changes, stop_key
from tui.widgets.format import bar, sparkline


def test_bar_is_exact_in_eighths_and_capped() -> None:
    assert bar(0.0, 6) == "░░░░░░"
    assert bar(0.5, 6) == "███░░░"
    assert bar(1 / 48, 6) == "▏░░░░░"
    assert bar(1.07, 6) == "██████"
    assert len(bar(0.33, 10)) == 10


def test_sparkline_scales_to_its_own_maximum() -> None:
    assert sparkline([], 10) == ""
    assert sparkline([0, 0], 10) == "▁▁"
    line = sparkline([1, 2, 4, 8], 10)
    assert line[-1] == "█" and line[0] < line[-1]
    assert len(sparkline(list(range(1, 40)), 14)) == 14


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
    assert list(changes(None, snap, set())) == []
    assert list(changes(snap, snap, set())) == []


def test_budget_stall_and_death_are_reported_once_each() -> None:
    before = fixed_snapshot()
    after = _with(
        before,
        gpu_box__eagle3_kimi__B1__over_budget=True,
        gpu_box__eagle3_kimi__B4__stalled=True,
    )
    kinds = [(a.kind, a.title) for a in changes(before, after, set())]
    assert kinds == [("over-budget", "eagle3-kimi B1"), ("stalled", "eagle3-kimi B4")]
    died = _with(before, gpu_box__eagle3_kimi__state="stopped")
    alerts = list(changes(before, died, set()))
    assert [a.kind for a in alerts] == ["run-died"] and "4242" in alerts[0].message
    # A run stopped on purpose is not a death.
    assert list(changes(before, died, {stop_key("gpu-box", "eagle3-kimi", 4242)})) == []
    # ...but another process of the same run is.
    assert len(list(changes(before, died, {stop_key("gpu-box", "eagle3-kimi", 1)}))) == 1


def test_host_lost_and_back() -> None:
    up = Snapshot(time=1.0, hosts=[HostView(name="h", connected=True)])
    down = Snapshot(time=2.0, hosts=[HostView(name="h", connected=False, stale=True, error="eof")])
    lost = list(changes(up, down, set()))
    assert [(a.kind, a.severity) for a in lost] == [("host-lost", "error")]
    assert "eof" in lost[0].message
    assert [a.kind for a in changes(down, up, set())] == ["host-back"]


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
    assert list(changes(before, after, set())) == []
