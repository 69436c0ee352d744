"""The kill dialog: who exactly will be stopped, a grace period, Cancel focused; then per-pid
results."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rich.table import Table
from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Label, Static

from supervisor import display
from supervisor.engine import KillReport
from supervisor.model import RunView
from tui.messages import PidOutcome, RunKilled
from tui.widgets.format import error_text, host_text, plain

if TYPE_CHECKING:
    from tui.app import RunwatchApp

DEFAULT_GRACE = 10.0
_OUTCOME_STYLE = {
    "terminated": "green",
    "killed": "yellow",
    "already-gone": "dim",
    "refused": "bold red",
}


def outcomes_of(report: KillReport) -> list[PidOutcome]:
    """The per-pid results of a kill report."""
    return [PidOutcome(r.pid, r.outcome, r.detail) for r in report.results]


ARGV_LINES = 4
"""Lines the argv may take: ``#identity`` holds 8 (``kill.tcss``), the 4 rows above it use 4."""
_LABEL = len("children") + 1
"""Cells of the label column and the gap after it."""


def identity_table(run: RunView, width: int | None = None) -> Table:
    """The identity the kill names: the agent refuses if any of it differs on the host.

    ``width``: the cells the table has; the children and argv are cut to fit it (children on one
    line, argv on ``ARGV_LINES``), ending in ``…`` when cut. None: shown whole."""
    assert run.process is not None
    p = run.process
    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim", no_wrap=True)
    table.add_column()

    def fit(text: str, lines: int) -> Text:
        if width is None:
            return plain(text)
        cut = display.shorten(host_text(text), width - _LABEL, lines)
        return Text(cut, no_wrap=True, overflow="ellipsis")

    table.add_row("pid", Text(str(p.identity.pid), style="bold"))
    if p.unit is not None:  # the whole unit is stopped, whatever its members did
        table.add_row(
            "unit", plain(f"{p.unit.launch_id} ({p.unit.held_by}): every member is stopped")
        )
    table.add_row("user", plain(f"{p.user} (uid {p.identity.uid})"))
    table.add_row(
        "started", plain(f"tick {p.identity.start_time} of boot {p.identity.boot_id[:8]}")
    )
    kids = ", ".join(str(c) for c in p.children)
    table.add_row("children", fit(f"{len(p.children)}" + (f": {kids}" if kids else ""), 1))
    # The argv last: a long one is what gets cut (with an ellipsis), never who else is stopped.
    table.add_row("argv", fit(display.command_line(p.argv_masked or p.identity.argv), ARGV_LINES))
    return table


class IdentityView(Static):
    """The identity table, cut to the width it is given (again on each resize)."""

    def __init__(self, run: RunView, **kwargs: Any) -> None:
        super().__init__(identity_table(run), **kwargs)
        self.run_view = run

    def on_resize(self, event: events.Resize) -> None:
        self.update(identity_table(self.run_view, event.size.width))


class KillScreen(ModalScreen[bool]):
    """Confirm and perform a kill; dismisses with True when something was stopped."""

    CSS_PATH = "kill.tcss"
    AUTO_FOCUS = "#cancel"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel / close"),
    ]

    def __init__(self, host: str, run: RunView) -> None:
        super().__init__()
        self.host = host
        self.run = run
        self.outcomes: list[PidOutcome] | None = None
        """Per-pid results once the kill finished."""
        self._busy = False

    @property
    def rw(self) -> RunwatchApp:
        from tui.app import runwatch_app

        return runwatch_app(self.app)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog"):
            yield Static(
                Text.assemble("Kill ", (self.run.name, "bold"), " on ", (self.host, "bold"), "?"),
                id="title",
            )
            yield IdentityView(self.run, id="identity")
            with Horizontal(id="grace-row"):
                yield Label("Grace period (s)", id="grace-label")
                yield Input(str(int(DEFAULT_GRACE)), type="number", id="grace", compact=True)
            yield Static(
                "TERM to the process and its children, KILL after the grace period. "
                "Data already written stays.",
                id="explain",
            )
            yield DataTable(id="results", show_cursor=False)
            yield Static(id="outcome")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button("Kill", id="confirm", variant="error")

    def on_mount(self) -> None:
        results = self.query_one("#results", DataTable)
        results.add_columns("pid", "outcome", "detail")
        results.display = False

    def action_cancel(self) -> None:
        if not self._busy:
            self.dismiss(self.outcomes is not None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "cancel":
            self.action_cancel()
        elif event.button.id == "confirm":
            self.confirm()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        # Enter in the grace field does not kill: killing takes a deliberate press of the button.
        event.stop()
        self.query_one("#confirm", Button).focus()

    def grace(self) -> float | None:
        """The grace period entered, or None (with a message) when it is not a number of seconds."""
        raw = self.query_one("#grace", Input).value.strip()
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0 <= value <= 3600:
            self.query_one("#outcome", Static).update(
                Text(f"Grace period must be 0..3600 seconds, not {raw!r}.", style="bold red")
            )
            return None
        return value

    def confirm(self) -> None:
        """Send the kill (once)."""
        if self._busy or self.outcomes is not None:
            return
        grace = self.grace()
        if grace is None:
            return
        self._busy = True
        self.query_one("#confirm", Button).disabled = True
        self.query_one("#cancel", Button).disabled = True
        self.query_one("#grace", Input).disabled = True
        self.query_one("#outcome", Static).update(
            Text(
                f"Stopping pid {self.run.process.identity.pid if self.run.process else '?'}…",
                style="yellow",
            )
        )
        if self.run.process is not None:
            self.rw.expect_stop(self.host, self.run.name, self.run.process.identity.pid)
        self._kill(grace)

    @work(exclusive=True, group="kill", exit_on_error=False)
    async def _kill(self, grace: float) -> None:
        assert self.run.process is not None
        try:
            report = await self.rw.engine.kill(
                self.host, self.run.process.identity, grace, run=self.run.name
            )
        except Exception as e:  # shown in the dialog: the user must see that nothing is confirmed
            self.post_message(RunKilled(self.host, self.run.name, [], error_text(e)))
        else:
            self.post_message(RunKilled(self.host, self.run.name, outcomes_of(report)))

    def on_run_killed(self, message: RunKilled) -> None:
        self._busy = False
        self.outcomes = message.outcomes
        results = self.query_one("#results", DataTable)
        for o in message.outcomes:
            results.add_row(
                Text(str(o.pid)),
                Text(o.outcome, style=_OUTCOME_STYLE.get(o.outcome, "")),
                plain(o.detail),
            )
        results.display = bool(message.outcomes)
        outcome = self.query_one("#outcome", Static)
        if message.error is not None:
            outcome.update(Text(f"Kill failed: {message.error}", style="bold red"))
        else:
            refused = [o for o in message.outcomes if o.outcome == "refused"]
            if refused:
                outcome.update(plain(f"Refused: {refused[0].detail}", style="bold red"))
            else:
                n = len(message.outcomes)
                plural = "es" if n != 1 else ""
                outcome.update(Text(f"Stopped: {n} process{plural} gone.", style="bold green"))
        self.query_one("#confirm", Button).display = False
        self.query_one("#grace-row").display = False
        self.query_one("#explain").display = False
        cancel = self.query_one("#cancel", Button)
        cancel.label = "Close"
        cancel.disabled = False
        cancel.focus()
        # The message bubbles on to the app, which refreshes; the dialog stays open to be read.
