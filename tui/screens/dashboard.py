"""The dashboard: every host, its runs and their datasets, refreshed live."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, Static

from supervisor.model import Snapshot
from tui.widgets.dataset_table import DatasetTable
from tui.widgets.events import EventsPanel
from tui.widgets.fleet import Fleet, update_static

if TYPE_CHECKING:
    from tui.app import RunwatchApp

WIDE = 120
"""From this many columns on, tables show the trend, req/s and warning columns."""


def status_line(
    snapshot: Snapshot | None, config_path: str, every: float, error: str | None
) -> Text:
    """The top line: what is watched, when it was last refreshed, and totals."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" runwatch ", style="bold reverse")
    text.append(f" {Path(config_path).name if config_path else 'no config'}", style="dim")
    if snapshot is None:
        text.append("  connecting…", style="yellow")
    else:
        runs = sum(1 for h in snapshot.hosts for r in h.runs if r.state == "running")
        over = sum(1 for h in snapshot.hosts for r in h.runs for d in r.datasets if d.over_budget)
        up = sum(1 for h in snapshot.hosts if h.connected)
        stamp = time.strftime("%H:%M:%S UTC", time.gmtime(snapshot.time))
        text.append(f"  {up}/{len(snapshot.hosts)} hosts up", style="green" if up else "red")
        text.append(f" · {runs} running", style="bold")
        if over:
            text.append(f" · {over} over budget", style="bold red")
        text.append(f"  {stamp} (every {every:g} s)", style="dim")
    if error:
        text.append(f"  refresh failed: {error}", style="bold red")
    return text


class DashboardScreen(Screen[None]):
    """Hosts, runs and datasets. Every action works on the run under the cursor."""

    # Its styles (dashboard.tcss) are read with the app's (RunwatchApp.CSS_PATH).

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "open_selected", "Details", show=False, tooltip="Open the selected run"),
        Binding("k", "app.kill", "Kill", tooltip="Stop the selected run (asks first)"),
        Binding("R", "app.restart", "Restart", tooltip="Restart the selected run with checks"),
        Binding("L", "app.launch", "Launch", tooltip="Launch the selected run when it is stopped"),
    ]

    @property
    def rw(self) -> RunwatchApp:
        from tui.app import runwatch_app

        return runwatch_app(self.app)

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        yield Fleet(id="fleet")
        yield EventsPanel(id="events")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self._on_snapshot)
        self.watch(self.app, "refresh_error", self._on_snapshot_error)

    def on_resize(self) -> None:
        self._redraw()

    def _on_snapshot(self, _snapshot: object) -> None:
        self._redraw()

    def _on_snapshot_error(self, _error: object) -> None:
        self._render_status()

    def _render_status(self) -> None:
        app = self.rw
        update_static(
            self.query_one("#status", Static),
            status_line(app.snapshot, app.config_path, app.refresh_seconds, app.refresh_error),
        )

    def _redraw(self) -> None:
        self._render_status()
        snapshot = self.rw.snapshot
        if snapshot is not None:
            self.query_one(Fleet).show(snapshot, wide=self.size.width >= WIDE)
            if self.focused is None:
                self.call_after_refresh(self._focus_first)

    def _focus_first(self) -> None:
        if self.focused is None:
            tables = list(self.query(DatasetTable))
            if tables:
                tables[0].focus(scroll_visible=False)

    def selected_run(self) -> str | None:
        """``host/run`` of the run under the cursor (the first run when nothing is focused)."""
        focused = self.focused
        if isinstance(focused, DatasetTable):
            return focused.run_key
        cards = self.query_one(Fleet).run_cards()
        return cards[0].run_key if cards else None

    def selected_dataset(self) -> str | None:
        focused = self.focused
        return focused.selected_dataset if isinstance(focused, DatasetTable) else None

    def action_open_selected(self) -> None:
        key = self.selected_run()
        if key is not None:
            self.rw.open_run(key, self.selected_dataset())

    def on_dataset_table_edge_reached(self, event: DatasetTable.EdgeReached) -> None:
        """Down at the last row (up at the first) moves to the next (previous) run's table."""
        tables = list(self.query(DatasetTable))
        i = tables.index(event.table) + event.step
        if 0 <= i < len(tables):
            target = tables[i]
            target.focus()
            target.move_cursor(row=0 if event.step > 0 else max(target.row_count - 1, 0))

    def on_dataset_table_chosen(self, event: DatasetTable.Chosen) -> None:
        event.stop()
        self.rw.open_run(event.table.run_key, event.dataset)
