"""A yes/no question before an action that stops or starts a run: Cancel is focused, so a key
typed by mistake (or meant for another field) never acts."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from tui.widgets.format import plain


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True only when the confirm button is pressed (escape and Cancel: False)."""

    CSS_PATH = "confirm.tcss"
    AUTO_FOCUS = "#cancel"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, question: str, confirm: str) -> None:
        """Args:
        question: what will happen, in full (shown as is).
        confirm: the label of the button that does it (``Restart``, ``Launch``).
        """
        super().__init__()
        self.question = question
        self.confirm = confirm

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(plain(self.question), id="question")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", variant="primary", compact=True)
                yield Button(self.confirm, id="confirm", variant="warning", compact=True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm")

    def action_cancel(self) -> None:
        self.dismiss(False)
