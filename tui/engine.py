"""What the app needs from the engine, as a Protocol: the methods of ``supervisor.engine.Engine``.

The real engine is ``supervisor.engine.Engine``; screenshot tests pass an engine that returns fixed
snapshots (and implements the rest of this Protocol). Screens use the engine only through this
Protocol; what needs no host of its own (bench, the comparison, the bench history, tokenizers) are
the functions of ``supervisor.engine``. The app's refresh is ``tick`` (the engine's supervision
loop: snapshot, budget policy, events), the same as every other front end's. ``Engine.host`` and
``Engine.kill_within_plan`` are not here: they serve the engine's own plans and previews, never a
screen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from supervisor.model import Identity, ProcessInfo, RunView, Snapshot

if TYPE_CHECKING:  # annotations only: these modules load when first used, not at start-up
    from supervisor.engine import (
        Action,
        ActionResult,
        KillReport,
        LatestSamples,
        LogTail,
        OnStep,
        Plan,
        Supervision,
        Tick,
    )


class EngineLike(Protocol):
    """Every engine operation a front end may ask for (``supervisor.engine.Engine``'s methods)."""

    async def refresh(self, on_progress: Callable[[Snapshot], None] | None = None) -> Snapshot:
        """Poll every host once and return what was seen; ``on_progress`` gets provisional
        snapshots while a host's first scan runs."""
        ...

    async def list_processes(self, host: str) -> list[ProcessInfo]:
        """The runs on ``host``, each matched to its configured run."""
        ...

    async def kill(
        self, host: str, identity: Identity, grace: float = 10.0, *, run: str | None = None
    ) -> KillReport:
        """Stop the process named by ``identity`` on ``host``, audited; per-pid results."""
        ...

    async def cancel_restarts(
        self, run: str, why: str = "kill", on_wait: Callable[[str], None] | None = None
    ) -> str | None:
        """Cancel the run's pending restart on failure (a kill of a run that is not running),
        audited; what was cancelled, or None when nothing was pending."""
        ...

    def record_stopped(self, run: str, why: str = "kill") -> str:
        """A kill of a run found not running with nothing pending, recorded (audited) so that a
        watcher yet to see it gone does not restart it; what the user is told."""
        ...

    async def check_run(
        self, run: str, argv: list[str] | None = None, *, tokens: bool = False
    ) -> list[dict[str, Any]]:
        """Validate every data file of a run (of ``argv``, default its launch argv); one scan
        result per dataset."""
        ...

    async def plan(
        self,
        run: str,
        *,
        action: Action = "restart",
        overrides: Iterable[str] | Iterable[tuple[str, str]] = (),
        move_aside: bool = False,
        force: bool = False,
        allow_change: Iterable[str] = (),
        environ: dict[str, str] | None = None,
        script: str | None = None,
    ) -> Plan:
        """The launch or restart plan of ``run`` as it is now (changes nothing); ``script``: a
        local file that replaces the run's script on the host once the old run is stopped."""
        ...

    async def execute(
        self, plan: Plan, *, dry_run: bool = False, on_step: OnStep | None = None
    ) -> ActionResult:
        """Run a plan step by step (audited); ``dry_run``: the checks only."""
        ...

    async def tail_log(self, host: str, run: str, lines: int = 50) -> LogTail:
        """The last lines of the run's log (or launch log), secrets masked."""
        ...

    def secret_values(self) -> list[str]:
        """API key values set here (masked wherever host text is shown)."""
        ...

    async def samples(self, run: RunView, dataset: str, count: int) -> LatestSamples:
        """The latest records of a dataset, newest first, decoded for a preview."""
        ...

    def supervise(
        self, *, report_initial: bool = True, others: bool = True, started: float | None = None
    ) -> Supervision:
        """Start the state of the supervision loop (what :meth:`tick` reports)."""
        ...

    @property
    def supervision(self) -> Supervision:
        """The supervision loop's state: told of the stops and moves a screen makes."""
        ...

    async def tick(
        self,
        *,
        wait: float | None = None,
        on_progress: Callable[[Snapshot], None] | None = None,
        on_snapshot: Callable[[Snapshot], None] | None = None,
        snapshot: Snapshot | None = None,
        act: bool = True,
        events: bool = True,
    ) -> Tick:
        """One turn of the supervision loop: refresh, each run's budget policy (once per event,
        audited), the events of what changed."""
        ...

    async def aclose(self) -> None:
        """Close every host connection."""
        ...
