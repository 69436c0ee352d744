"""The events panel: what the engine reported (``supervisor.events``), newest last, with the
command that acts on each. Hidden until toggled (``e``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text
from textual.widgets import Static

from supervisor.engine import Event

STYLES = {"info": "green", "warning": "yellow", "critical": "bold red"}
SHOWN = 8
"""Events listed (the newest)."""


def events_text(events: Sequence[Event], limit: int = SHOWN) -> Text:
    """The last ``limit`` events, one line each plus a dim line with the command."""
    if not events:
        return Text("No events yet.", style="dim")
    lines = []
    for ev in list(events)[-limit:]:
        stamp = time.strftime("%H:%M:%S", time.localtime(ev.time))
        first = ev.message.split("\n", 1)[0]
        line = Text.assemble(
            (f"{stamp} ", "dim"),
            (f"{ev.severity.upper():<8}", STYLES.get(ev.severity, "")),
            f" {ev.title}: {first}",
        )
        if ev.command:
            line.append(f"  → {ev.command}", style="dim")
        lines.append(line)
    return Text("\n").join(lines)


class EventsPanel(Static):
    """The last events, docked under the fleet."""

    DEFAULT_CSS = """
    EventsPanel {
        dock: bottom;
        height: auto;
        max-height: 10;
        border-top: solid $secondary;
        padding: 0 1;
        display: none;
    }
    EventsPanel.-shown { display: block; }
    """

    def show_events(self, events: Sequence[Event]) -> None:
        """Render ``events`` (the app's list)."""
        self.update(events_text(events))
