"""The runwatch app: a dashboard of every host, run and dataset, with keyboard actions.

Built by ``make_app(config, engine)``: the engine is injected, so tests drive the real app with a
LocalHost engine (or, for screenshots, an engine returning fixed snapshots). All I/O happens in
workers that post typed messages back; the UI thread only renders model objects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import PurePath
from typing import Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.notifications import SeverityLevel
from textual.reactive import var
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from supervisor.config import Config
from supervisor.engine import EVENTS_KEPT, Event, set_origin
from supervisor.model import HostView, RunView, Snapshot
from tui.commands import RunCommands
from tui.engine import EngineLike
from tui.messages import (
    EventsFound,
    RefreshFailed,
    RefreshProgressed,
    RunKilled,
    SnapshotRefreshed,
)
from tui.screens.dashboard import DashboardScreen
from tui.widgets.events import EventsPanel
from tui.widgets.fleet import run_key
from tui.widgets.format import host_text, shown

NOTIFY_SEVERITY: dict[str, SeverityLevel] = {
    "info": "information",
    "warning": "warning",
    "critical": "error",
}


class RunwatchApp(App[None]):
    """Watch the fleet; kill, restart and launch runs; compare endpoints."""

    CSS_PATH: ClassVar[str | PurePath | list[str | PurePath] | None] = [
        "app.tcss",
        "screens/dashboard.tcss",
    ]
    """The dashboard, the first screen, has its styles read with the app's: a screen's own
    CSS_PATH makes Textual parse every style sheet again when it first mounts."""
    TITLE = "runwatch"
    COMMANDS = App.COMMANDS | {RunCommands}
    MODES: ClassVar[dict[str, str | Callable[[], Screen[Any]]]] = {"dashboard": DashboardScreen}
    DEFAULT_MODE = "dashboard"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "Help", key_display="?", tooltip="Every key, explained"),
        Binding("r", "refresh", "Refresh", show=False, tooltip="Refresh every host now"),
        Binding("C", "compare", "Compare", tooltip="Local GPUs vs API: rates and cost"),
        Binding(
            "e",
            "toggle_events",
            "Events",
            show=False,
            tooltip="Show or hide the events panel (what runwatch watch alerts on)",
        ),
        Binding("q", "quit", "Quit", tooltip="Leave runwatch (runs keep running)"),
    ]

    snapshot: var[Snapshot | None] = var(None, always_update=True)
    """The latest snapshot (None until the first refresh finishes)."""
    refresh_error: var[str | None] = var(None)
    """Why the last refresh failed, when it did."""

    def __init__(
        self,
        config: Config,
        engine: EngineLike,
        *,
        refresh_seconds: float | None = None,
        first_refresh: asyncio.Future[Snapshot] | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.engine = engine
        self._first_refresh = first_refresh
        """A refresh begun before the app was built (``tui.cli``, while Textual loads): its snapshot
        is shown at mount when it has finished by then; otherwise the app's first refresh joins
        it."""
        self.config_path = config.path
        self.refresh_seconds = refresh_seconds or config.refresh_seconds
        self.alerts: list[Event] = []
        """The events notified so far, oldest first, the newest ``EVENTS_KEPT`` of them
        (``supervisor.events``, as ``runwatch watch`` reports them; conditions true at start-up
        are not notified)."""
        # Conditions true at start-up are on screen, not notified; other processes' stops and
        # restarts are the watcher's to report.
        engine.supervise(report_initial=False, others=False)
        self.refreshes = 0
        """Number of snapshots received (tests wait on it)."""
        self._refreshing = False
        self._guarded = any(r.budget_policy != "warn" for r in config.runs)
        self._acting = False
        """A tick's budget policy is acting (its snapshot is on screen already)."""
        self._showing = False

    # ------------------------------------------------------------------ lifecycle

    def on_mount(self) -> None:
        first, self._first_refresh = self._first_refresh, None
        if first is not None and first.done() and not first.cancelled() and not first.exception():
            # Read from the hosts while Textual started: the first frame shows it.
            self.on_snapshot_refreshed(SnapshotRefreshed(shown(first.result())))
            self.refresh_now(first.result())  # its budget policy and events
        else:
            self.refresh_now()  # joins the refresh under way, if any (Engine.refresh shares it)
        self.set_interval(self.refresh_seconds, self._tick, name="refresh")

    async def on_unmount(self) -> None:
        await self.engine.aclose()

    def _tick(self) -> None:
        # A refresh slower than the interval is not cancelled: the next tick is skipped instead.
        # While the budget policy acts (a restart takes its quiet window and more), the screen
        # still refreshes; what changed meanwhile is told at the next tick.
        if not self._refreshing:
            self.refresh_now()
        elif self._acting and not self._showing:
            self.show_now()

    @work(group="refresh", exit_on_error=False)
    async def refresh_now(self, taken: Snapshot | None = None) -> None:
        """One turn of the engine's supervision loop (``Engine.tick``), off the UI path: poll
        every host (``taken``: a snapshot already shown instead), apply each run's budget
        policy (the same as ``runwatch guard``: stop or restart runs past their budget, once
        per event, audited) and find the events. The snapshot comes back as SnapshotRefreshed
        before the policy acts, the events as EventsFound."""
        self._refreshing = True
        on_snapshot = self._acts if taken is not None else self._refreshed
        try:
            tick = await self.engine.tick(
                on_progress=self._progressed,
                on_snapshot=on_snapshot,
                snapshot=taken,
                act=self._guarded,
            )
        except Exception as e:  # the engine itself failed (a host failing is in the snapshot)
            self.post_message(RefreshFailed(f"{type(e).__name__}: {e}"))
        else:
            if tick.events:
                self.post_message(EventsFound(tick.events))
        finally:
            self._refreshing = self._acting = False

    def _refreshed(self, snapshot: Snapshot) -> None:
        self.post_message(SnapshotRefreshed(shown(snapshot)))
        self._acts(snapshot)

    def _acts(self, snapshot: Snapshot) -> None:
        self._acting = self._guarded  # the policy's turn of this tick begins

    @work(group="show", exit_on_error=False)
    async def show_now(self) -> None:
        """A refresh only shown, while the budget policy of a tick acts."""
        self._showing = True
        try:
            snapshot = await self.engine.refresh(on_progress=self._progressed)
        except Exception as e:  # the engine itself failed (a host failing is in the snapshot)
            self.post_message(RefreshFailed(f"{type(e).__name__}: {e}"))
        else:
            self.post_message(SnapshotRefreshed(shown(snapshot)))
        finally:
            self._showing = False

    def _progressed(self, snapshot: Snapshot) -> None:
        self.post_message(RefreshProgressed(shown(snapshot)))

    def on_refresh_progressed(self, message: RefreshProgressed) -> None:
        if self.refreshes == 0:  # provisional counts only until the first refresh is done
            self.snapshot = message.snapshot

    def on_snapshot_refreshed(self, message: SnapshotRefreshed) -> None:
        self.refresh_error = None
        self.refreshes += 1
        self.snapshot = message.snapshot

    def on_events_found(self, message: EventsFound) -> None:
        for event in message.events:
            self.notify_event(event)

    def notify_event(self, event: Event) -> None:
        """Show ``event`` as a notification (with the command that acts on it) and in the events
        panel; a critical one rings the terminal bell. Its texts are shown as data (``shown``)."""
        event = shown(event)
        self.alerts.append(event)
        del self.alerts[:-EVENTS_KEPT]
        text = f"{event.message}\n→ {event.command}" if event.command else event.message
        self.notify(text, title=event.title, severity=NOTIFY_SEVERITY[event.severity], markup=False)
        if event.severity == "critical":
            self.bell()
        for panel in self.query("EventsPanel").results(EventsPanel):
            panel.show_events(self.alerts)

    def action_toggle_events(self) -> None:
        """Show or hide the events panel of the dashboard."""
        for panel in self.screen.query("EventsPanel").results(EventsPanel):
            panel.show_events(self.alerts)
            panel.toggle_class("-shown")

    def on_refresh_failed(self, message: RefreshFailed) -> None:
        self.refresh_error = host_text(message.error)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """One place for workers that died with an error nobody handled."""
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            error = event.worker.error
            self.notify(
                host_text(f"{type(error).__name__}: {error}"),
                title=f"{event.worker.name} failed",
                severity="error",
                markup=False,
            )

    # ------------------------------------------------------------------ lookups

    def find_run(self, key: str) -> tuple[HostView, RunView] | None:
        """The host and run named ``host/run`` in the latest snapshot."""
        if self.snapshot is None:
            return None
        for host in self.snapshot.hosts:
            for run in host.runs:
                if run_key(host.name, run.name) == key:
                    return host, run
        return None

    def runs(self) -> list[tuple[HostView, RunView]]:
        """Every run of the latest snapshot, in display order."""
        if self.snapshot is None:
            return []
        return [(h, r) for h in self.snapshot.hosts for r in h.runs]

    def selected_run(self) -> str | None:
        """The run the current screen is about (the cursor's on the dashboard)."""
        from tui.screens.run_detail import RunDetailScreen

        screen = self.screen
        if isinstance(screen, DashboardScreen | RunDetailScreen):
            return screen.selected_run()
        return None

    def _target(self, key: str | None) -> tuple[str, HostView, RunView] | None:
        key = key or self.selected_run()
        found = self.find_run(key) if key else None
        if key is None or found is None:
            self.notify("No run selected.", severity="warning")
            return None
        return key, found[0], found[1]

    # ------------------------------------------------------------------ actions

    def open_run(self, key: str, dataset: str | None = None) -> None:
        """Open the detail screen of run ``host/run`` (its samples preview on ``dataset``)."""
        from tui.screens.run_detail import RunDetailScreen

        if self.find_run(key) is not None:
            self.push_screen(RunDetailScreen(key, dataset))

    def action_open_run(self, key: str) -> None:
        self.open_run(key)

    def action_refresh(self) -> None:
        if not self._refreshing:
            self.refresh_now()

    def action_help(self) -> None:
        from tui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_kill(self, key: str | None = None) -> None:
        """Ask to stop a run (the selected one by default)."""
        from tui.screens.kill import KillScreen

        target = self._target(key)
        if target is None:
            return
        key, host, run = target
        if run.state == "unknown":
            # Not "not running": whether it runs is not known while its host cannot be reached.
            self.notify(
                f"{run.name} is {run.state_text}: nothing can be stopped until {host.name} "
                "answers again.",
                severity="warning",
            )
            return
        if run.process is None or run.state != "running":
            # It may wait for a watcher's restart on failure: the kill cancels it, as
            # `runwatch kill` does (``Engine.cancel_restarts``, audited).
            self.cancel_restarts(run.name, configured=run.configured)
            return
        if not run.process.killable:
            self.notify(
                f"{run.name} belongs to {run.process.user}: not killable.", severity="error"
            )
            return
        self.push_screen(KillScreen(host.name, run))

    @work(group="cancel", exit_on_error=False)
    async def cancel_restarts(self, name: str, configured: bool) -> None:
        """The kill of a run that is not running: its pending restart cancelled, if any."""
        try:
            cancelled = await self.engine.cancel_restarts(name) if configured else None
        except Exception as e:  # the run's lock held too long, a state dir refusing the cancel
            self.notify(f"{name}: the pending restart not cancelled: {e}", severity="error")
            return
        if cancelled is None:
            note = f" ({self.engine.record_stopped(name)})" if configured else ""
            self.notify(f"{name} is not running: nothing to kill{note}.", severity="warning")
        else:
            self.notify(f"{name} is not running; {cancelled}.", severity="information")

    def expect_moved(self, path: str) -> None:
        """``path`` was moved aside by a restart: the new file there is no data loss."""
        self.engine.supervision.expect_moved(path)

    def expect_stop(self, host: str, run: str, pid: int) -> None:
        """Process ``pid`` of a run is being stopped on purpose: its end is not a death."""
        self.engine.supervision.expect_stop(host, run, pid)

    def on_run_killed(self, message: RunKilled) -> None:
        if message.error is None:
            self.action_refresh()

    def action_restart(self, key: str | None = None) -> None:
        """Show the restart plan of a run and run it step by step."""
        from tui.screens.restart import RestartScreen

        target = self._target(key)
        if target is not None:
            self.push_screen(RestartScreen(target[1].name, target[2], mode="restart"))

    def action_launch(self, key: str | None = None) -> None:
        """Show the launch plan of a stopped run and run it step by step."""
        from tui.screens.restart import RestartScreen

        target = self._target(key)
        if target is None:
            return
        _key, host, run = target
        if run.state == "running":
            self.notify(
                f"{run.name} is already running; restart it instead (R).", severity="warning"
            )
            return
        self.push_screen(RestartScreen(host.name, run, mode="launch"))

    def action_compare(self) -> None:
        """Open the local-vs-API comparison."""
        from tui.screens.compare import CompareScreen

        if not isinstance(self.screen, CompareScreen):
            self.push_screen(CompareScreen())


def runwatch_app(app: object) -> RunwatchApp:
    """``app`` as the RunwatchApp it is (the screens and commands of this package run in one)."""
    if not isinstance(app, RunwatchApp):
        raise TypeError(f"expected the runwatch app, got {type(app).__name__}")
    return app


def make_app(
    config: Config,
    engine: EngineLike,
    *,
    refresh_seconds: float | None = None,
    first_refresh: asyncio.Future[Snapshot] | None = None,
) -> RunwatchApp:
    """The app, with its engine injected (the real ``supervisor.engine.Engine`` in production).

    ``first_refresh``: ``engine.refresh()`` already under way (see ``RunwatchApp``). What the
    app does is audited as done from the dashboard."""
    set_origin("dashboard")
    return RunwatchApp(config, engine, refresh_seconds=refresh_seconds, first_refresh=first_refresh)
