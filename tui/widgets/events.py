"""The events panel: what the engine reported (``supervisor.events``), newest first, with the
command that acts on each. Hidden until toggled (``e``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text
from textual.widgets import Static

from supervisor import display
from supervisor.engine import Event

STYLES = {"info": "green", "warning": "yellow", "critical": "bold red"}
SHOWN = 8
"""Events listed (the newest)."""
_MESSAGE_KEPT = 24
"""Characters of an event's title and message a long command leaves them."""


def events_text(events: Sequence[Event], limit: int = SHOWN, width: int | None = None) -> Text:
    """The last ``limit`` events, newest first, each with the command that acts on it.

    ``width``: the panel's cells; each event then takes one line, its message cut with ``…`` so
    that the command stays whole (cut too only when it would leave less than ``_MESSAGE_KEPT``
    characters of the message). None: lines are not cut (they wrap)."""
    if not events:
        return Text("No events yet.", style="dim")
    lines = []
    for ev in reversed(list(events)[-limit:]):
        stamp = time.strftime("%H:%M:%S", time.localtime(ev.time))
        head = f"{ev.severity.upper():<8}"
        first = ev.message.split("\n", 1)[0]
        body = f" {ev.title}: {first}"
        command = f"  → {ev.command}" if ev.command else ""
        if width is not None:
            room = width - len(stamp) - 1 - len(head)
            if len(body) + len(command) > room:
                # The command is what to do: it keeps the room, less a start of the message.
                command = display.shorten(command, room - min(len(body), _MESSAGE_KEPT))
                body = display.shorten(body, room - len(command))
        line = Text.assemble((f"{stamp} ", "dim"), (head, STYLES.get(ev.severity, "")), body)
        line.append(command, style="dim")
        lines.append(line)
    return Text("\n", no_wrap=width is not None, overflow="ellipsis").join(lines)


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

    _events: Sequence[Event] = ()

    def show_events(self, events: Sequence[Event]) -> None:
        """Render ``events`` (the app's list), one line each, cut to the panel's width."""
        self._events = events
        width = self.content_region.width
        self.update(events_text(events, width=width or None))

    def on_resize(self) -> None:
        self.show_events(self._events)
