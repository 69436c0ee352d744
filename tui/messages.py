"""Messages that workers post back to the app: typed, past tense, one per finished piece of I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textual.message import Message

from supervisor.model import Snapshot

if TYPE_CHECKING:  # the events load with the first tick, not at start-up
    from supervisor.engine import Event


class SnapshotRefreshed(Message, bubble=False):
    """A refresh of every host finished."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot
        """What the engine saw."""

    def can_replace(self, message: Message) -> bool:
        # Only the newest snapshot matters: an older one still queued is dropped.
        return isinstance(message, SnapshotRefreshed)


class RefreshProgressed(Message, bubble=False):
    """A provisional snapshot while a host's first scan runs: its datasets' line counts
    (``DatasetView.provisional``) and how far the scan is (``HostView.progress``)."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot
        """What is known so far."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RefreshProgressed)


class EventsFound(Message, bubble=False):
    """A tick of the supervision loop found events to tell (``Engine.tick``): what changed, then
    what the budget policy did."""

    def __init__(self, events: list[Event]) -> None:
        super().__init__()
        self.events = events
        """Oldest first."""


class RefreshFailed(Message, bubble=False):
    """A refresh raised instead of returning a snapshot (the engine itself broke, not one host)."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


@dataclass
class PidOutcome:
    """What happened to one process of a kill."""

    pid: int
    outcome: str
    """``terminated``, ``killed``, ``already-gone`` or ``refused``."""
    detail: str = ""


class RunKilled(Message):
    """A kill finished (successfully or not): the result per pid, or the error."""

    def __init__(
        self, host: str, run: str, outcomes: list[PidOutcome], error: str | None = None
    ) -> None:
        super().__init__()
        self.host = host
        self.run = run
        self.outcomes = outcomes
        self.error = error


class LogTailRead(Message, bubble=False):
    """New lines of a run's log arrived."""

    def __init__(self, run: str, lines: list[str], error: str | None = None) -> None:
        super().__init__()
        self.run = run
        self.lines = lines
        self.error = error


class SamplesRead(Message, bubble=False):
    """The latest samples of a dataset, decoded for display."""

    def __init__(
        self, run: str, dataset: str, samples: list[str], error: str | None = None
    ) -> None:
        super().__init__()
        self.run = run
        self.dataset = dataset
        self.samples = samples
        self.error = error


class PlanMade(Message):
    """A restart or launch plan was computed (nothing changed yet), or could not be."""

    def __init__(self, plan: Any, error: str | None = None) -> None:
        super().__init__()
        self.plan = plan
        """The ``supervisor.plan.Plan`` (None when ``error`` is set)."""
        self.error = error


class StepChanged(Message):
    """A step of a running plan changed state (``running``, then ``ok``/``failed``/``skipped``)."""

    def __init__(self, index: int, name: str, state: str, detail: str) -> None:
        super().__init__()
        self.index = index
        self.name = name
        self.state = state
        self.detail = detail


class PlanFinished(Message):
    """A restart or launch ran to its end, or stopped at its first failed step."""

    def __init__(self, ok: bool, result: Any, error: str | None = None) -> None:
        super().__init__()
        self.ok = ok
        self.result = result
        """The ``supervisor.plan.ActionResult`` (None when ``error`` is set)."""
        self.error = error


class BenchProgressed(Message, bubble=False):
    """A bench made progress: ``done`` of ``total`` requests."""

    def __init__(self, done: int, total: int) -> None:
        super().__init__()
        self.done = done
        self.total = total

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, BenchProgressed)


class BenchFinished(Message):
    """A bench finished; ``result`` is what the bench module returned, or ``error`` says why not."""

    def __init__(self, result: Any, error: str | None = None) -> None:
        super().__init__()
        self.result = result
        self.error = error
