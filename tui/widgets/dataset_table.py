"""The table of a run's datasets: progress, budget, rates, trend, ETA, format and warnings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.segment import Segment
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from supervisor import display
from supervisor.model import DatasetView, RunView
from tui.widgets.format import bar, sparkline

_BAR = 6
_BUDGET = 14
"""Cells of the widest budget text, e.g. ``95.6 k / 100 k``."""
_TREND = 14

_VERDICT_STYLE = {
    "current": "green",
    "legacy": "bold red",
    "mixed": "bold red",
    "corrupt": "bold red",
    "error": "red",
    "unknown": "yellow",
    "empty": "dim",
    "missing": "dim",
}


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int | None
    wide_only: bool = False
    right: bool = False


COLUMNS = (
    Column("dataset", "Dataset", None),
    Column("responses", "Responses", 11, right=True),
    Column("tokens", "Tokens / budget", _BAR + 1 + _BUDGET),
    Column("tok_s", "tok/s", 6, right=True),
    Column("req_s", "req/s", 5, wide_only=True, right=True),
    Column("trend", "Trend", _TREND, wide_only=True),
    Column("eta", "ETA", 10, right=True),
    Column("length", "len", 4, right=True),
    Column("verdict", "Format", 7),
    Column("warning", "Warning", None, wide_only=True),
)


def warning_text(ds: DatasetView) -> str:
    """The one-line warning of a dataset: data loss first, then budget waste, then a stall or a
    read problem."""
    if ds.alarm:
        return "⚠ " + ds.alarm
    if ds.over_budget:
        return "⚠ " + (ds.projection.message or "over its token budget")
    if ds.stalled:
        return "⚠ stalled: no new responses"
    if ds.state not in ("ok", "missing"):
        return f"⚠ {ds.state}: {ds.error or ''}".rstrip(": ")
    if ds.verdict in ("legacy", "mixed", "corrupt"):
        return f"⚠ {ds.verdict_detail or ds.verdict + ' format'}"
    if ds.bad_lines:
        return f"⚠ {display.count(ds.bad_lines)} bad lines"
    return ""


def bar_width(wide: bool) -> int:
    """The budget bar's width: one cell less on a narrow screen, where every cell counts."""
    return _BAR if wide else _BAR - 1


def dataset_cells(ds: DatasetView, *, live: bool, stale: bool, wide: bool) -> list[Text]:
    """The cells of one dataset row, styled; ``live`` is False when no process writes it."""
    dim = "dim" if stale or not live or ds.provisional else ""
    bar_cells = bar_width(wide)

    def cell(value: str, style: str = "", right: bool = False) -> Text:
        return Text(value, style=f"{style} {dim}".strip(), justify="right" if right else "left")

    responses = display.provisional(ds.records) if ds.provisional else display.count(ds.records)
    if ds.max_samples is not None:
        responses += f"/{display.count(ds.max_samples)}"
    if ds.provisional:  # lines are counted, tokens not yet
        tokens_cell = Text(" " * bar_cells + f" {display.UNKNOWN}", style=dim)
    elif ds.token_budget:
        fraction = ds.completion_tokens / ds.token_budget
        colour = "red" if ds.over_budget else ("yellow" if fraction >= 0.9 else "green")
        tokens_cell = Text.assemble(
            (bar(fraction, bar_cells), f"{colour} {dim}".strip()),
            (
                f" {display.budget(ds.completion_tokens, ds.token_budget)}",
                "bold red" if ds.over_budget else dim,
            ),
        )
    else:
        tokens_cell = Text(" " * bar_cells + f" {display.compact(ds.completion_tokens)}", style=dim)
    reasons_total = sum(ds.finish_reasons.values())
    length = display.share(ds.finish_reasons.get("length", 0), reasons_total)
    warn = warning_text(ds)
    red = ds.over_budget or ds.alarm is not None
    name_style = "bold red" if red else ("yellow" if ds.stalled else "bold")
    cells: dict[str, Text] = {
        "dataset": cell(("⚠ " if warn else "") + ds.name, name_style),
        "responses": cell(responses, right=True),
        "tokens": tokens_cell,
        # The window's rate, shown only once the window holds enough responses to say.
        "tok_s": cell(display.rate(ds.rates.tok_per_s) if live else display.UNKNOWN, right=True),
        "req_s": cell(display.rate(ds.rates.req_per_s) if live else display.UNKNOWN, right=True),
        "trend": cell(sparkline(ds.history, _TREND) if live else "", "cyan"),
        "eta": cell(display.eta(ds.projection.eta_s) if live else display.UNKNOWN, right=True),
        "length": cell(length, "yellow" if ds.finish_reasons.get("length") else "", right=True),
        "verdict": cell(
            "reading" if ds.provisional else ds.verdict, _VERDICT_STYLE.get(ds.verdict, "")
        ),
        "warning": cell(warn.removeprefix("⚠ "), "bold red" if red else "yellow"),
    }
    return [cells[c.key] for c in COLUMNS if wide or not c.wide_only]


def column_widths(wide: bool, name_width: int, screen_width: int) -> list[tuple[Column, int]]:
    """The columns shown and their widths; the warning column takes what is left of the screen
    (1 cell of padding each side of every column)."""
    columns = [c for c in COLUMNS if wide or not c.wide_only]
    used = sum(c.width or 0 for c in columns) + name_width + 2 * len(columns) + 2
    widths = {"dataset": name_width, "warning": max(20, screen_width - used)}
    widths["tokens"] = bar_width(wide) + 1 + _BUDGET
    return [(c, widths.get(c.key, c.width or 0)) for c in columns]


class DatasetTable(Widget, can_focus=True):
    """One run's datasets, one row each, with a cursor row.

    Rows are rendered line by line and cached: a refresh that changes one dataset's numbers
    repaints that one line, which keeps a 1 s refresh of many datasets cheap.
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {"dataset-table--header", "dataset-table--cursor"}

    DEFAULT_CSS = """
    DatasetTable {
        height: auto;
        background: $surface;
    }
    DatasetTable > .dataset-table--header {
        text-style: bold;
        color: $text-muted;
        background: $panel;
    }
    DatasetTable > .dataset-table--cursor {
        background: $surface;
    }
    DatasetTable:focus > .dataset-table--cursor {
        background: $block-cursor-background;
        text-style: bold;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "choose", "Details", tooltip="Open the run's detail screen"),
        Binding("down", "cursor(1)", "Next dataset (past the last one: the next run)", show=False),
        Binding("up", "cursor(-1)", "Previous dataset (or the previous run)", show=False),
    ]

    cursor_row: reactive[int] = reactive(0, repaint=False)
    """Index of the row under the cursor."""

    class EdgeReached(Message):
        """The cursor tried to move past the first or last row (``step`` -1 or +1)."""

        def __init__(self, table: DatasetTable, step: int) -> None:
            super().__init__()
            self.table = table
            self.step = step

    class Chosen(Message):
        """Enter (or a double click) on a row: the run's detail is wanted."""

        def __init__(self, table: DatasetTable, dataset: str | None) -> None:
            super().__init__()
            self.table = table
            self.dataset = dataset

    def __init__(self, run_key: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.run_key = run_key
        """``host/run`` of the run this table shows."""
        self._layout: tuple[bool, tuple[str, ...], int, int] | None = None
        self._columns: list[tuple[Column, int]] = []
        self._keys: list[str] = []
        self._rows: dict[str, tuple[Text, ...]] = {}
        self._strips: dict[tuple[object, ...], Strip] = {}
        self._version = 0
        self._versions: dict[str, int] = {}
        """Per row, a number that changes whenever its cells do (the cache key of its line)."""

    # ------------------------------------------------------------------ data

    @property
    def row_keys(self) -> list[str]:
        """Dataset names, top to bottom."""
        return list(self._keys)

    @property
    def row_count(self) -> int:
        return len(self._keys)

    @property
    def selected_dataset(self) -> str | None:
        """Name of the dataset under the cursor."""
        return self._keys[self.cursor_row] if self._keys else None

    def show(self, run: RunView, *, stale: bool, wide: bool) -> None:
        """Render ``run``'s datasets; only the lines whose content changed are repainted."""
        names = tuple(d.name for d in run.datasets)
        name_width = min(max([7, *(len(n) + 2 for n in names)]), 20)
        # Fixed widths: a changing value never re-lays out the screen.
        layout = (wide, names, name_width, self.app.size.width)
        live = run.state == "running"
        if layout != self._layout:
            self._set_layout(layout)
        for y, ds in enumerate(run.datasets, start=1):
            cells = tuple(dataset_cells(ds, live=live, stale=stale, wide=wide))
            if self._rows.get(ds.name) != cells:
                self._rows[ds.name] = cells
                self._version += 1
                self._versions[ds.name] = self._version
                self.refresh(Region(0, y, self.size.width, 1))

    def _set_layout(self, layout: tuple[bool, tuple[str, ...], int, int]) -> None:
        wide, names, name_width, screen_width = layout
        self._columns = column_widths(wide, name_width, screen_width)
        self._keys = list(names)
        self._rows = {n: self._rows[n] for n in names if n in self._rows}
        self._layout = layout
        self._version += 1
        self._strips.clear()
        self.cursor_row = min(self.cursor_row, max(len(names) - 1, 0))
        self.refresh(layout=True)

    # ------------------------------------------------------------------ rendering

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return 1 + len(self._keys)

    def _line(self, cells: tuple[Text, ...]) -> Text:
        line = Text(no_wrap=True, end="")
        for (column, width), cell in zip(self._columns, cells, strict=True):
            text = cell.copy()
            text.truncate(width, overflow="ellipsis")
            gap = " " * (width - text.cell_len)
            line.append(" ")
            if column.right:
                line.append(gap)
                line.append_text(text)
            else:
                line.append_text(text)
                line.append(gap)
            line.append(" ")
        return line

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y == 0:
            header = self.get_component_rich_style("dataset-table--header")
            labels = tuple(Text(c.label) for c, _w in self._columns)
            key: tuple[object, ...] = ("", self._layout, width, header, base)
            style = base + header
            cursor = None
        elif y - 1 < len(self._keys):
            name = self._keys[y - 1]
            labels = self._rows.get(name, tuple(Text("") for _ in self._columns))
            at_cursor = y - 1 == self.cursor_row
            cursor = self.get_component_rich_style("dataset-table--cursor") if at_cursor else None
            key = (name, self._versions.get(name, -1), width, cursor, base)
            style = base
        else:
            return Strip.blank(width, base)
        cached = self._strips.get(key)
        if cached is not None:
            return cached
        text = self._line(labels)
        strip = Strip(text.render(self.app.console), text.cell_len).apply_style(style)
        strip = strip.extend_cell_length(width, style).crop(0, width)
        if cursor is not None:
            strip = Strip(Segment.apply_style(iter(strip), post_style=cursor), strip.cell_length)
        if len(self._strips) > 256:
            self._strips.clear()
        self._strips[key] = strip
        return strip

    def watch_cursor_row(self, old: int, new: int) -> None:
        for row in (old, new):
            self.refresh(Region(0, row + 1, self.size.width, 1))

    def _on_focus(self, event: events.Focus) -> None:
        self.refresh()

    def _on_blur(self, event: events.Blur) -> None:
        self.refresh()

    # ------------------------------------------------------------------ input

    def move_cursor(self, *, row: int) -> None:
        """Put the cursor on ``row`` (clamped to the rows)."""
        self.cursor_row = min(max(row, 0), max(len(self._keys) - 1, 0))

    def action_cursor(self, step: int) -> None:
        target = self.cursor_row + step
        if not self._keys or not 0 <= target < len(self._keys):
            self.post_message(self.EdgeReached(self, step))
        else:
            self.cursor_row = target

    def action_choose(self) -> None:
        self.post_message(self.Chosen(self, self.selected_dataset))

    def on_click(self, event: events.Click) -> None:
        row = event.y - 1
        if 0 <= row < len(self._keys):
            self.focus()
            self.cursor_row = row
            if event.chain >= 2:
                self.action_choose()
