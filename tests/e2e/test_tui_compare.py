"""The compare table fits the terminal: every column shown without scrolling sideways at 80
columns, the full headers where there is room, and the layout follows a resize."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
import pytest
from rich.console import Console
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from supervisor.config import Config, load_config
from supervisor.engine import Engine, Rebalance
from supervisor.model import RunView
from tests.fixtures_config import write_local_config
from tests.fixtures_tui import FixedEngine, compare_config
from tests.waiting import wait_for
from tui.app import RunwatchApp, make_app
from tui.screens.compare import CompareScreen

LOCAL_MODEL = "moonshotai/Kimi-K2.5"
"""The GPU run's model (``--model`` of the fixed config's GPU run)."""


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


def _one_model_config() -> Config:
    """The compare config with the API endpoint serving the GPU run's model: the API run (no
    ``--model``: its endpoint's model) may take the GPU run's datasets (the start's fingerprint
    refuses a change of model)."""
    config = compare_config()
    endpoints = [msgspec.structs.replace(config.endpoints[1], model=LOCAL_MODEL)]
    return msgspec.structs.replace(config, endpoints=[config.endpoints[0], *endpoints])


async def test_the_compare_screen_plans_a_split_and_asks_before_applying_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``p`` plans from what the screen shows (the deadline typed in), ``a`` asks first, with
    every step in the question; Cancel changes nothing."""
    from textual.widgets import Button, Input

    from tui.screens.confirm import ConfirmScreen

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = _one_model_config()
    engine = FixedEngine(config=config)
    app: RunwatchApp = make_app(config, engine)
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


def _plan_of(screen: CompareScreen) -> Rebalance | None:
    """The plan the screen holds now (read afresh: a key may have dropped it)."""
    return screen.rebalance


async def test_m_toggles_moving_data_aside_for_the_plan_as_the_cli_flag_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """B3 holds data of the legacy format: without moving aside, the plan keeps B3 with its run
    and says to pass --move-aside; ``m`` turns moving aside on (the plan row says so, ``?``
    explains the key), and the next plan is made with it (B3's data would be renamed aside, so
    B3 may move); ``m`` again turns it off and drops the plan made the other way."""
    from textual.widgets import Button, Label

    from tui.screens.help import HelpScreen

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = _one_model_config()
    engine = FixedEngine(config=config)
    engine.snapshot = msgspec.structs.replace(
        engine.snapshot,
        hosts=[
            msgspec.structs.replace(h, connected=True, stale=False, error=None)
            for h in engine.snapshot.hosts
        ],
    )
    app: RunwatchApp = make_app(config, engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(lambda: app.refreshes >= 1, what="the first snapshot")
        await pilot.press("C")
        await wait_for(lambda: isinstance(app.screen, CompareScreen), what="the compare screen")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await wait_for(lambda: screen.comparison is not None, what="the comparison")
        label = screen.query_one("#move-aside", Label)
        assert "move aside (m): off" in str(label.render())

        await pilot.press("p")
        await wait_for(lambda: screen.rebalance is not None, what="the plan without moving aside")
        assert screen.rebalance is not None and screen.rebalance.move_aside is False
        assert "pass --move-aside" in screen.rebalance.kept["B3"], screen.rebalance.kept

        await pilot.press("m")
        await wait_for(lambda: "move aside (m): on" in str(label.render()), what="the toggle")
        assert _plan_of(screen) is None and screen.query_one("#apply", Button).disabled
        await pilot.press("p")
        await wait_for(lambda: screen.rebalance is not None, what="the plan moving aside")
        aside = screen.rebalance
        assert aside is not None and aside.move_aside is True
        assert "B3" not in aside.kept, aside.kept

        await pilot.press("m")
        await wait_for(lambda: "move aside (m): off" in str(label.render()), what="off again")
        assert _plan_of(screen) is None

        await pilot.press("question_mark")
        await wait_for(lambda: isinstance(app.screen, HelpScreen), what="the help screen")
        console = Console(width=400, file=io.StringIO(), record=True)
        for widget in app.screen.query(Static):
            console.print(widget.content)
        help_text = " ".join(console.export_text().split())
        assert "m Move aside" in help_text and "renaming that data aside" in help_text


async def test_the_compare_screen_shows_a_move_the_start_checks_refuse_never_proposes_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The API run's config names the GPU run's model (``--model``), but its running process was
    started without it (its endpoint names none: an unknown model). Restarted with datasets of
    the GPU run, it would continue their data with another model than the process that runs
    now: the start's fingerprint check refuses it. The screen's plan checks every start first:
    those moves are shown refused with the check's reason, none is proposed, nothing stopped."""
    from textual.widgets import Button

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = compare_config()
    api = config.runs[1]
    runs = [config.runs[0], msgspec.structs.replace(api, argv=[*api.argv, "--model", LOCAL_MODEL])]
    config = msgspec.structs.replace(config, runs=runs)
    engine = FixedEngine(config=config)

    def current(run: RunView) -> RunView:  # B3's legacy data converted: no run is frozen
        datasets = [msgspec.structs.replace(d, verdict="current") for d in run.datasets]
        return msgspec.structs.replace(run, datasets=datasets)

    engine.snapshot = msgspec.structs.replace(
        engine.snapshot,
        hosts=[
            msgspec.structs.replace(
                h, connected=True, stale=False, error=None, runs=[current(r) for r in h.runs]
            )
            for h in engine.snapshot.hosts
        ],
    )
    app: RunwatchApp = make_app(config, engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(lambda: app.refreshes >= 1, what="the first snapshot")
        await pilot.press("C")
        await wait_for(lambda: isinstance(app.screen, CompareScreen), what="the compare screen")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await wait_for(lambda: screen.comparison is not None, what="the comparison")
        await pilot.press("p")
        result = await wait_for(lambda: _plan_of(screen), what="the checked plan")
        shown = str(screen.query_one("#plan-text", Static).render())
        assert result.gate_refused, shown
        assert all(m.to_run == "eagle3-api" for m in result.gate_refused)
        assert not any(m.to_run == "eagle3-api" for m in result.moves), result.moves
        assert "refused by the start checks" in shown
        for m in result.gate_refused:
            assert m.reason.startswith("fingerprint: "), m
            assert f"model None -> '{LOCAL_MODEL}'" in m.reason, m
        assert screen.query_one("#apply", Button).disabled == (not result.steps)
        assert engine.kills == []
