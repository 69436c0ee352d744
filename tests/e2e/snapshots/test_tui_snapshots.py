"""Screenshots of the app at 80x24 and 160x48 on a fixed snapshot (no timing in the pixels).

Regenerate after a deliberate change with ``pytest tests/e2e/snapshots --snapshot-update`` and
look at the report before committing the new SVGs.
"""

from __future__ import annotations

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Footer, Input
from textual.widgets._footer import FooterKey

from tests.fixtures_tui import FixedEngine, compare_config, fixed_config
from tests.waiting import wait_for
from tui.app import RunwatchApp, make_app
from tui.screens.compare import CompareScreen
from tui.screens.help import HelpScreen
from tui.screens.kill import KillScreen
from tui.screens.restart import RestartScreen
from tui.screens.run_detail import RunDetailScreen
from tui.widgets.dataset_table import DatasetTable

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]


def _app() -> RunwatchApp:
    return make_app(fixed_config(), FixedEngine())


async def _settled(pilot: Pilot[None]) -> None:
    """Until the focused widget has processed its focus and the footer shows its keys.

    Waiting on these conditions (not on the process looking idle) keeps the pictures identical on
    a loaded machine.
    """
    app = pilot.app
    await wait_for(lambda: app.focused is None or app.focused.has_focus, what="the focus")

    def footer_ready() -> bool:
        footers = list(app.screen.query(Footer))
        if not footers:
            return True
        shown = {k.action for k in footers[0].query(FooterKey)}
        wanted = {
            b.action
            for (_node, b, enabled, _tip) in app.screen.active_bindings.values()
            if b.show and enabled
        }
        return wanted <= shown

    await wait_for(footer_ready, what="the footer")
    await pilot.pause()


async def _loaded(pilot: Pilot[None]) -> None:
    app = pilot.app
    assert isinstance(app, RunwatchApp)
    await wait_for(lambda: app.refreshes >= 1, what="the first snapshot")
    await wait_for(lambda: isinstance(app.focused, DatasetTable), what="a focused run")
    await _settled(pilot)


def _no_blink(pilot: Pilot[None]) -> None:
    for field in pilot.app.screen.query(Input):
        field.cursor_blink = False


@pytest.mark.parametrize("size", SIZES)
def test_dashboard(snap_compare, size: tuple[int, int]) -> None:
    assert snap_compare(_app(), terminal_size=size, run_before=_loaded)


@pytest.mark.parametrize("size", SIZES)
def test_run_detail(snap_compare, size: tuple[int, int]) -> None:
    async def open_detail(pilot: Pilot[None]) -> None:
        await _loaded(pilot)
        await pilot.press("enter")
        await wait_for(lambda: isinstance(pilot.app.screen, RunDetailScreen), what="detail")
        await _settled(pilot)

    assert snap_compare(_app(), terminal_size=size, run_before=open_detail)


@pytest.mark.parametrize("size", SIZES)
def test_kill_dialog(snap_compare, size: tuple[int, int]) -> None:
    async def ask_kill(pilot: Pilot[None]) -> None:
        await _loaded(pilot)
        await pilot.press("k")
        await wait_for(lambda: isinstance(pilot.app.screen, KillScreen), what="the kill dialog")
        _no_blink(pilot)
        await _settled(pilot)

    assert snap_compare(_app(), terminal_size=size, run_before=ask_kill)


def test_kill_dialog_results(snap_compare) -> None:
    async def kill(pilot: Pilot[None]) -> None:
        await _loaded(pilot)
        await pilot.press("k")
        await wait_for(lambda: isinstance(pilot.app.screen, KillScreen), what="the kill dialog")
        _no_blink(pilot)
        await _settled(pilot)
        await pilot.press("tab", "enter")  # Cancel is focused: tab to Kill, then press it
        await wait_for(lambda: getattr(pilot.app.screen, "outcomes", None) is not None, what="kill")
        await _settled(pilot)

    assert snap_compare(_app(), terminal_size=(80, 24), run_before=kill)


def test_help(snap_compare) -> None:
    async def ask_help(pilot: Pilot[None]) -> None:
        await _loaded(pilot)
        await pilot.press("question_mark")
        await wait_for(lambda: isinstance(pilot.app.screen, HelpScreen), what="help")
        await _settled(pilot)

    assert snap_compare(_app(), terminal_size=(80, 24), run_before=ask_help)


@pytest.mark.parametrize("size", SIZES)
def test_restart_plan(snap_compare, size: tuple[int, int]) -> None:
    async def plan(pilot: Pilot[None]) -> None:
        await _loaded(pilot)
        await pilot.press("R")
        screen = pilot.app.screen
        assert isinstance(screen, RestartScreen)
        await wait_for(lambda: screen.plan is not None, what="the plan", timeout=30)
        _no_blink(pilot)
        await _settled(pilot)

    assert snap_compare(_app(), terminal_size=size, run_before=plan)


@pytest.mark.parametrize("size", SIZES)
def test_restart_blocked_by_legacy_data(snap_compare, size: tuple[int, int]) -> None:
    async def blocked(pilot: Pilot[None]) -> None:
        await _loaded(pilot)
        await pilot.press("R")
        screen = pilot.app.screen
        assert isinstance(screen, RestartScreen)
        await wait_for(lambda: screen.plan is not None, what="the plan", timeout=30)
        await pilot.press("c")
        await wait_for(lambda: screen.result is not None, what="the checks", timeout=30)
        _no_blink(pilot)
        await _settled(pilot)

    assert snap_compare(_app(), terminal_size=size, run_before=blocked)


def test_compare_fits_80x24(snap_compare, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # No bench history: the numbers come from the fixed snapshot's live rates only.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    async def compare(pilot: Pilot[None]) -> None:
        await _loaded(pilot)
        await pilot.press("C")
        app = pilot.app

        def shown() -> bool:
            screen = app.screen
            return isinstance(screen, CompareScreen) and screen.query_one(DataTable).row_count > 0

        await wait_for(shown, what="the comparison table")
        _no_blink(pilot)
        await _settled(pilot)

    app = make_app(compare_config(), FixedEngine(config=compare_config()))
    assert snap_compare(app, terminal_size=(80, 24), run_before=compare)
