"""The dashboard shows the engine's events as notifications and in the events panel (``e``)."""

from __future__ import annotations

import msgspec
from textual.widgets import Footer

from tests.fixtures_tui import FixedEngine, fixed_snapshot
from tests.waiting import wait_for
from tui.app import make_app
from tui.widgets.events import EventsPanel


async def test_a_death_is_notified_listed_in_the_panel_and_rings_the_bell() -> None:
    engine = FixedEngine()
    app = make_app(engine.config, engine)
    rings: list[int] = []
    app.bell = lambda: rings.append(1)  # type: ignore[method-assign]  # the terminal is an edge
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(lambda: app.refreshes >= 1, what="the first snapshot")
        # At start-up nothing pops up, though the fixed fleet has problems (they are on screen).
        assert app.alerts == []
        panel = app.screen.query_one(EventsPanel)
        shown_at_start = panel.display
        assert not shown_at_start

        died = msgspec.convert(msgspec.to_builtins(fixed_snapshot()), type(engine.snapshot))
        died.hosts[0].runs[0].state = "stopped"
        died.hosts[0].runs[0].process = None
        engine.snapshot = died
        await pilot.press("r")
        await wait_for(lambda: app.alerts, what="the run-died event")
        (event,) = app.alerts
        assert event.kind == "run-died" and event.title == "eagle3-kimi"
        assert event.command is not None and event.command.endswith("launch eagle3-kimi")
        assert rings == [1]  # critical
        shown = [n.message for n in app._notifications]
        assert any("launch eagle3-kimi" in m for m in shown)

        await pilot.press("e")
        await pilot.pause()
        assert panel.display
        text = str(panel.content)
        assert "CRITICAL" in text and "eagle3-kimi" in text and "launch eagle3-kimi" in text
        # The panel sits above the footer, not under it: its newest line is on screen.
        footer = app.screen.query_one(Footer)
        assert not panel.region.overlaps(footer.region)
        # One line per event, cut to the panel's width with its command whole.
        assert panel.content_region.height == 1
        assert str(panel.content).endswith(f"→ {event.command}")
        await pilot.press("e")
        await pilot.pause()
        assert not panel.display
