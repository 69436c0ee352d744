"""What the app needs from the engine, as a Protocol.

The real engine is ``supervisor.engine.Engine``; tests of screenshots pass an engine that returns
fixed snapshots. Beyond this Protocol, some screens use more of the real engine: the detail screen
reads the log through ``engine.host(name).request("tail_log", ...)`` and the samples through
``supervisor.samples.latest_samples`` (``engine.config``, ``engine.host``), and the restart
and launch screens hand the engine to ``supervisor.plan`` and ``supervisor.steps`` (which also
use ``engine.config``).
An engine without ``host`` gets a clear message in the detail screen instead of a crash.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from supervisor.model import Identity, Snapshot


@runtime_checkable
class EngineLike(Protocol):
    """The engine operations the dashboard, the detail screen and the kill dialog use."""

    async def refresh(self) -> Snapshot:
        """Poll every host once and return what was seen."""
        ...

    async def kill(self, host: str, identity: Identity, grace: float) -> Any:
        """Stop the process named by ``identity`` on ``host``; a report with per-pid results."""
        ...

    async def check_run(self, run: str, argv: list[str] | None = None) -> list[dict[str, Any]]:
        """Validate every data file of a run (of ``argv``, default its launch argv); one scan
        result per dataset."""
        ...

    async def aclose(self) -> None:
        """Close every host connection."""
        ...
