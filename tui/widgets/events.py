"""The events panel: what the engine reported (``supervisor.events``), newest first, with the
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
    """The last ``limit`` events, newest first (a narrow panel that cuts its wrapped lines then
    cuts the oldest), each with the command that acts on it."""
    if not events:
        return Text("No events yet.", style="dim")
    lines = []
    for ev in reversed(list(events)[-limit:]):
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
    """The last events, under the fleet and above the footer (not docked: a second widget docked
    at the bottom would be drawn under the footer, hiding the newest event)."""

    DEFAULT_CSS = """
    EventsPanel {
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
