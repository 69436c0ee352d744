"""Text the dashboard cuts to fit (command lines, paths, errors) ends in an ellipsis, read from
the screen of the real app (Pilot)."""

from __future__ import annotations

import msgspec
from textual.geometry import Region

from supervisor.model import Snapshot
from tests.fixtures_tui import FixedEngine, fixed_snapshot
from tests.waiting import wait_for
from tui.app import make_app
from tui.screens.kill import ARGV_LINES, KillScreen
from tui.widgets.dataset_table import DatasetTable

LONG_ARGV = [
    "python3",
    "/data/eagle3/scripts/run_inference.py",
    "--datasets",
    "B1,B2,B3,B4,B5,B6,B7,B8",
    *(f"--extra-option-{i}=/data/eagle3/some/long/path/number/{i}" for i in range(12)),
    "--output-dir",
    "/data/eagle3/out/THE-END",
]


def _snapshot(argv: list[str], children: int) -> Snapshot:
    snap = fixed_snapshot()
    p = snap.hosts[0].runs[0].process
    assert p is not None
    ident = msgspec.structs.replace(p.identity, argv=tuple(argv))
    snap.hosts[0].runs[0].process = msgspec.structs.replace(
        p, identity=ident, argv_masked=list(argv), children=[5000 + i for i in range(children)]
    )
    return snap


def _shown(widget: object) -> list[str]:
    """The lines a widget draws on screen (what a person reads)."""
    region = Region(0, 0, *widget.outer_size)  # type: ignore[attr-defined]
    return [strip.text.rstrip() for strip in widget.render_lines(region)]  # type: ignore[attr-defined]


async def _kill_dialog_lines(size: tuple[int, int], argv: list[str], children: int) -> list[str]:
    engine = FixedEngine(_snapshot(argv, children))
    app = make_app(engine.config, engine)
    async with app.run_test(size=size) as pilot:
        await wait_for(lambda: app.refreshes >= 1, what="the first snapshot")
        await wait_for(lambda: isinstance(app.focused, DatasetTable), what="a focused run")
        await pilot.press("k")
        await wait_for(lambda: isinstance(app.screen, KillScreen), what="the kill dialog")
        await pilot.pause()
        lines = _shown(app.screen.query_one("#identity"))
        await pilot.press("escape")
    assert engine.kills == []
    return lines


async def test_the_kill_dialog_cuts_a_long_argv_with_an_ellipsis() -> None:
    for size in ((80, 24), (160, 48)):
        lines = await _kill_dialog_lines(size, LONG_ARGV, children=40)
        rows = {ln.split()[0]: i for i, ln in enumerate(lines) if ln and not ln.startswith(" ")}
        # Every row is on screen, the argv last; the children and the argv end in "…".
        assert list(rows) == ["pid", "user", "started", "children", "argv"], lines
        children = lines[rows["children"]]
        assert children.startswith("children 40: 5000, 5001") and children.endswith("…")
        argv = lines[rows["argv"] :]
        assert len(argv) == ARGV_LINES, lines
        assert argv[-1].endswith("…") and "THE-END" not in "".join(argv), argv
        # What is shown is the argv's start, whole words in order, then the cut.
        shown = " ".join(ln.removeprefix("argv").strip() for ln in argv).removesuffix("…")
        assert " ".join(LONG_ARGV).startswith(shown.rstrip()), (shown, argv)
        assert "run_inference.py --datasets B1,B2,B3,B4,B5,B6,B7,B8" in shown


async def test_the_kill_dialog_shows_a_short_argv_whole() -> None:
    argv = ["python3", "run_inference.py", "--datasets", "B1", "--output-dir", "out"]
    lines = await _kill_dialog_lines((80, 24), argv, children=2)
    assert "argv     python3 run_inference.py --datasets B1 --output-dir out" in lines
    assert "children 2: 5000, 5001" in lines
    assert not any("…" in ln for ln in lines)


async def test_the_events_panel_gives_each_event_one_line_and_keeps_its_command() -> None:
    from supervisor.engine import Event
    from tui.widgets.events import EventsPanel

    engine = FixedEngine()
    app = make_app(engine.config, engine)
    path = "/data/eagle3/" + "very-long-directory/" * 8 + "raw_responses.jsonl"
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(lambda: app.refreshes >= 1, what="the first snapshot")
        app.alerts.extend(
            Event(
                kind="data-loss",  # type: ignore[arg-type]  # a kind of no known event
                severity="critical",
                host="gpu-box",
                title=f"eagle3-kimi B{i}",
                message=f"{path} shrank by {i} bytes",
                key=f"k{i}",
                time=1_764_460_800.0 + i,
                command=f"runwatch check eagle3-kimi-{i}",
            )
            for i in range(1, 4)
        )
        await pilot.press("e")
        panel = app.screen.query_one(EventsPanel)
        await wait_for(lambda: panel.display and panel.content_region.width > 0, what="panel")
        await pilot.pause()
        lines = [ln.strip() for ln in _shown(panel) if ln.strip() and "─" not in ln]
        assert len(lines) == 3, lines
        for i, ln in zip((3, 2, 1), lines, strict=True):
            assert f"eagle3-kimi B{i}: /data/eagle3/very-long" in ln
            assert ln.endswith(f"…  → runwatch check eagle3-kimi-{i}"), ln
            assert len(ln) <= panel.content_region.width and ln[8:18] == " CRITICAL ", ln


async def test_a_long_error_in_the_run_detail_is_cut_with_an_ellipsis() -> None:
    from tui.screens.run_detail import RunDetailScreen

    engine = FixedEngine()
    path = "/data/eagle3/" + "very-long-directory/" * 8 + "raw_responses.jsonl"

    async def unreadable(*args: object) -> object:
        raise PermissionError(f"cannot read {path}: permission denied")

    engine.samples = unreadable  # type: ignore[method-assign,assignment]
    app = make_app(engine.config, engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(lambda: isinstance(app.focused, DatasetTable), what="a focused run")
        await pilot.press("enter")
        await wait_for(lambda: isinstance(app.screen, RunDetailScreen), what="the run detail")
        await pilot.press("s")
        status = app.screen.query_one("#samples-status")
        await wait_for(lambda: "PermissionError" in str(status.content), what="the error")  # type: ignore[attr-defined]
        await pilot.pause()
        (line,) = _shown(status)
        assert line[3:].startswith(": PermissionError: cannot read /data/eagle3/very-long"), line
        assert line.endswith("…") and len(line) <= 80, line
