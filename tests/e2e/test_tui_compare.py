"""The compare table fits the terminal: every column shown without scrolling sideways at 80
columns, the full headers where there is room, and the layout follows a resize."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from supervisor.config import load_config
from supervisor.engine import Engine
from supervisor.model import RunView
from tests.fixtures_config import write_local_config
from tests.fixtures_tui import FixedEngine, compare_config
from tests.waiting import wait_for
from tui.app import RunwatchApp, make_app
from tui.screens.compare import CompareScreen


def _labels(table: DataTable[object]) -> list[str]:
    return [c.label.plain for c in table.columns.values()]


def _fits(screen: CompareScreen) -> bool:
    table = screen.query_one("#table", DataTable)
    body = screen.query_one("#body", VerticalScroll)
    return table.size.width > 0 and table.max_scroll_x == 0 and body.max_scroll_x == 0


async def test_compare_table_fits_80_columns_and_follows_a_resize(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # no bench history
    app: RunwatchApp = make_app(compare_config(), FixedEngine(config=compare_config()))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(lambda: app.refreshes >= 1, what="the first snapshot")
        await pilot.press("C")
        await wait_for(lambda: isinstance(app.screen, CompareScreen), what="the compare screen")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        table = screen.query_one("#table", DataTable)
        await wait_for(lambda: table.row_count > 0, what="the comparison table")
        await wait_for(lambda: _fits(screen), what="a table without sideways scrolling")
        # Compact: the endpoint over time/cost, and the API cost column is there in full.
        assert _labels(table)[-2:] == ["api\ntime", "api\ncost"]
        assert table.header_height == 2
        totals = table.get_row_at(table.row_count - 1)
        assert totals[0].plain == "all" and totals[-1].plain == "$87"
        assert table.virtual_size.width <= table.size.width

        await pilot.resize_terminal(160, 48)
        await wait_for(lambda: _labels(table)[-1] == "api cost", what="the full headers")
        assert "Ends at" in _labels(table) and table.header_height == 1
        assert {table.get_row_at(0)[2].plain} <= {"max_samples", "token_budget"}
        await wait_for(lambda: _fits(screen), what="the wide table")


async def test_compare_with_nothing_to_compare_says_so_instead_of_crashing(
    tmp_path: Path,
) -> None:
    # No endpoint and no data yet: the comparison has no rows (the table's width was the
    # max() of a single number, a TypeError that took the app down).
    path = write_local_config(
        tmp_path / "runwatch.toml",
        f"""
[[runs]]
name = "far-run"
host = "here"
workdir = "{tmp_path / "work"}"
argv = ["python3", "run_inference.py", "--datasets", "B1,B2", "--output-dir", "out"]
output_dir = "out"
""",
    )
    config = load_config(path)
    app: RunwatchApp = make_app(config, Engine(config))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(lambda: app.refreshes >= 1, timeout=30, what="the first snapshot")
        await pilot.press("C")
        await wait_for(lambda: isinstance(app.screen, CompareScreen), what="the compare screen")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        answer = screen.query_one("#answer", Static)
        await wait_for(
            lambda: "Nothing to compare" in str(answer.content), timeout=30, what="the answer"
        )
        assert "no endpoint in the config" in str(answer.content)
        await pilot.pause()
        assert app.is_running and isinstance(app.screen, CompareScreen)
        assert screen.query_one("#table", DataTable).row_count == 0


async def test_the_compare_screen_plans_a_split_and_asks_before_applying_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``p`` plans from what the screen shows (the deadline typed in), ``a`` asks first, with
    every step in the question; Cancel changes nothing."""
    from textual.widgets import Button, Input

    from tui.screens.confirm import ConfirmScreen

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    engine = FixedEngine(config=compare_config())
    app: RunwatchApp = make_app(compare_config(), engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(lambda: app.refreshes >= 1, what="the first snapshot")
        await pilot.press("C")
        await wait_for(lambda: isinstance(app.screen, CompareScreen), what="the compare screen")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await wait_for(lambda: screen.comparison is not None, what="the comparison")
        screen.query_one("#by", Input).value = "2h"
        # The fixed snapshot's API host is down: refused, nothing to apply.
        await pilot.press("p")
        text = screen.query_one("#plan-text", Static)
        await wait_for(lambda: screen.rebalance is not None, what="the refusal")
        assert "is down" in str(text.render()) and "nothing moved" in str(text.render())
        assert screen.query_one("#apply", Button).disabled

        # The host back and B3's legacy data moved aside: the plan has steps.
        def fixed(run: RunView) -> RunView:
            datasets = [msgspec.structs.replace(d, verdict="current") for d in run.datasets]
            return msgspec.structs.replace(run, datasets=datasets)

        engine.snapshot = msgspec.structs.replace(
            engine.snapshot,
            hosts=[
                msgspec.structs.replace(
                    h, connected=True, stale=False, error=None, runs=[fixed(r) for r in h.runs]
                )
                for h in engine.snapshot.hosts
            ],
        )
        seen = app.refreshes
        app.refresh_now()  # the fixed config refreshes once an hour
        await wait_for(lambda: app.refreshes > seen, what="a refresh with the host back")
        await pilot.press("p")
        await wait_for(lambda: "finish within 2 h" in str(text.render()), what="the plan")
        shown = str(text.render())
        assert screen.rebalance is not None and screen.rebalance.plan is not None, shown
        assert "as now" in shown and "all on api" in shown
        assert screen.rebalance.steps, shown
        assert not screen.query_one("#apply", Button).disabled
        await pilot.press("a")
        await wait_for(lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        question = app.screen.question  # type: ignore[attr-defined]
        for st in screen.rebalance.steps:
            assert st.run in question
        await pilot.press("escape")
        await wait_for(lambda: app.screen is screen, what="back on the compare screen")
        assert engine.kills == [] and not screen.applying
