"""The dashboard against the real demo shows the local mock's serving figures from its /metrics
(running and queued requests, server tok/s), the API endpoint its runs' files' rate, its
sparklines move, and the run detail's History
tab plots the run's series."""

from __future__ import annotations

from typing import Any

from textual.widgets import Sparkline

from supervisor.demo.launcher import LOCAL_MOCK
from supervisor.engine import Engine
from tests.fixtures_tui import figure_text
from tests.waiting import wait_for
from tui.app import make_app
from tui.screens.run_detail import RunDetailScreen
from tui.widgets.serving import FigureRow, RunPlot, ServingPanel


def _row(app: Any, key: str) -> FigureRow | None:
    for row in app.screen.query(FigureRow):
        if row.key == key:
            return row
    return None


async def test_dashboard_shows_the_local_servers_metrics_and_sparklines_move(
    tui_demo: Any,
) -> None:
    app = make_app(tui_demo.config, Engine(tui_demo.config))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(
            lambda: _row(app, "ep-local-gpu") is not None, timeout=30, what="the endpoint row"
        )
        row = _row(app, "ep-local-gpu")
        assert row is not None
        # The demo's 16 + 4 requests (local-gpu and regen) against a mock that decodes all of
        # them at once.
        await wait_for(
            lambda: (
                "running 20 · queued 0" in figure_text(row) and "tok/s (server)" in figure_text(row)
            ),
            timeout=30,
            what="running/queued requests and the server's tok/s",
        )
        spark = row.query_one(Sparkline)
        await wait_for(lambda: len(spark.data or []) >= 2, timeout=30, what="two points")
        before = list(spark.data or [])
        await wait_for(
            lambda: list(spark.data or []) != before, timeout=30, what="the sparkline to move"
        )
        host = app.snapshot.hosts[0] if app.snapshot else None
        assert host is not None
        em = next(e for e in host.endpoints if e.name == "local-gpu")
        assert em.gen_tok_per_s.value is not None
        # Never above the mock's capacity by more than the stated uncertainty.
        cap = float(LOCAL_MOCK["capacity_tps"])
        assert em.gen_tok_per_s.value <= cap + (em.gen_tok_per_s_err or 0) + 1
        assert not app.screen.query_one(ServingPanel).has_class("-empty")
        # The API endpoint has no /metrics of ours: its runs' files measure it.
        api = _row(app, "ep-api")
        assert api is not None
        await wait_for(
            lambda: "tok/s (files)" in figure_text(api),
            timeout=30,
            what="the API's rate from files",
        )

        app.open_run("laptop/local-gpu", None)
        await wait_for(lambda: isinstance(app.screen, RunDetailScreen), what="the run detail")
        await pilot.press("4")
        plot = app.screen.query_one(RunPlot)
        await wait_for(
            lambda: (
                [r.key for r in plot.query(FigureRow)][:5]
                == ["tok/s (files)", "tok/s (server)", "running", "queued", "KV use"]
            ),
            timeout=30,
            what="the run's series",
        )
