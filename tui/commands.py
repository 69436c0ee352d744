"""Every action of the app in the command palette (ctrl+p), one entry per run where it applies."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider

from tui.widgets.fleet import run_key

if TYPE_CHECKING:
    pass


class RunCommands(Provider):
    """Refresh, help, compare, and open / kill / restart / launch for each run."""

    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        from tui.app import runwatch_app

        app = runwatch_app(self.app)
        commands: list[tuple[str, str, Callable[[], object]]] = [
            ("Refresh now", "Poll every host now", app.action_refresh),
            ("Help: keys", "Every key of every screen", app.action_help),
            (
                "Compare local vs API",
                "Time and cost to finish on each endpoint",
                app.action_compare,
            ),
            (
                "Bench an endpoint",
                "Measure an endpoint now, on the compare screen",
                app.action_compare,
            ),
        ]
        for host, run in app.runs():
            key = run_key(host.name, run.name)
            where = f"{run.name} on {host.name}"
            commands.append(
                (f"Open {where}", "argv, children, log tail, samples", partial(app.open_run, key))
            )
            if run.state == "running":
                commands.append(
                    (
                        f"Kill {where}",
                        "Stop the process tree (asks first)",
                        partial(app.action_kill, key),
                    )
                )
                commands.append(
                    (
                        f"Restart {where}",
                        "Kill, check the data, launch again",
                        partial(app.action_restart, key),
                    )
                )
            elif run.configured:
                commands.append(
                    (
                        f"Launch {where}",
                        "Start the run (checks first)",
                        partial(app.action_launch, key),
                    )
                )
        return commands

    async def discover(self) -> Hits:
        for title, help_text, callback in self._commands():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, text=title, help=help_text)
