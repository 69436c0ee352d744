"""``?``: every key of every screen, read from the bindings themselves so it cannot go stale."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

LEGEND = (
    ("Responses", "records written / --max-samples (or the dataset's max_samples)"),
    ("Tokens / budget", "completion tokens against the dataset's token_budget; red when past it"),
    (
        "tok/s, req/s",
        "rates over the last 10 minutes (less while that window fills), shown from 4 responses on",
    ),
    ("Trend", "tokens/s between the last refreshes, one bar each"),
    ("ETA", "time until the first stop condition (samples, budget or prompts)"),
    ("len", "share of responses cut by max_tokens (finish_reason = length)"),
    ("Format", "current, legacy, mixed, corrupt, empty, missing: resume is safe only on current"),
    ("Warning", "over budget with the projected waste, stalls, unreadable files"),
    ("dim / STALE", "the host is unreachable: values are from its last good refresh"),
)


def _sections() -> list[tuple[str, list[BindingType]]]:
    from tui.app import RunwatchApp
    from tui.screens.compare import CompareScreen
    from tui.screens.dashboard import DashboardScreen
    from tui.screens.kill import KillScreen
    from tui.screens.restart import RestartScreen
    from tui.screens.run_detail import RunDetailScreen
    from tui.widgets.dataset_table import DatasetTable

    everywhere: list[BindingType] = [
        *RunwatchApp.BINDINGS,
        Binding("ctrl+p", "command_palette", "Command palette: every action, searchable"),
        Binding("escape", "back", "Back / close"),
        Binding("ctrl+q", "quit", "Quit"),
    ]
    moving: list[BindingType] = [
        *DatasetTable.BINDINGS,
        Binding("tab,shift+tab", "", "Next / previous run"),
        Binding("click", "", "Select a dataset (double click: details)"),
    ]
    return [
        ("Everywhere", everywhere),
        ("Dashboard", [*moving, *DashboardScreen.BINDINGS]),
        ("Run detail", list(RunDetailScreen.BINDINGS)),
        ("Kill dialog", list(KillScreen.BINDINGS)),
        ("Restart / launch", list(RestartScreen.BINDINGS)),
        ("Compare", list(CompareScreen.BINDINGS)),
    ]


def _key_text(binding: Binding) -> str:
    if binding.key_display:
        return binding.key_display
    names = {"question_mark": "?", "escape": "esc", "enter": "enter"}
    return " / ".join(names.get(k, k) for k in binding.key.split(","))


def key_table(bindings: list[BindingType]) -> Table:
    """A two-column table of keys and what they do (hidden bindings included)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", min_width=16, no_wrap=True)
    table.add_column()
    seen: set[str] = set()
    for item in bindings:
        binding = item if isinstance(item, Binding) else Binding(*item)
        key = _key_text(binding)
        if key in seen or not binding.description:
            continue
        seen.add(key)
        tip = f"  {binding.tooltip}" if binding.tooltip else ""
        table.add_row(key, Text.assemble(binding.description, (tip, "dim")))
    return table


class HelpScreen(ModalScreen[None]):
    """Every key, per screen, and what the dashboard's columns mean."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 100; max-width: 100%; height: 90%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    HelpScreen .help-title { text-style: bold; color: $accent; margin-top: 1; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "dismiss", "Close help", key_display="esc"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(
                "runwatch keeps watching while you read. Every action also lives in the "
                "command palette (ctrl+p).",
                classes="help-intro",
            )
            for title, bindings in _sections():
                yield Static(title, classes="help-title")
                yield Static(key_table(bindings))
            yield Static("Dashboard columns", classes="help-title")
            legend = Table.grid(padding=(0, 2))
            legend.add_column(style="bold", min_width=12, no_wrap=True)
            legend.add_column()
            for name, meaning in LEGEND:
                legend.add_row(name, meaning)
            yield Static(legend)
        yield Footer()
