"""``runwatch tui`` (and ``runwatch`` with no command): the dashboard.

The UI package is imported only when the dashboard opens, so the engine and every other command
stay free of it.
"""

from __future__ import annotations

import click

from supervisor.cli._common import config_option


def open_tui(config_path: str | None, refresh_seconds: float | None = None) -> None:
    """Load the config, build the engine and run the dashboard until the user quits."""
    import importlib

    from supervisor.cli._common import get_config
    from supervisor.engine import Engine

    config = get_config(config_path)
    # Imported by name: the engine package never depends on the UI package (import contract).
    make_app = importlib.import_module("tui.app").make_app
    app = make_app(config, Engine(config), refresh_seconds=refresh_seconds)
    app.run()


@click.command()
@config_option
@click.option(
    "--refresh",
    "refresh_seconds",
    type=click.FloatRange(min=0.2),
    default=None,
    help="Seconds between refreshes (default: refresh_seconds of the config).",
)
def tui(config_path: str | None, refresh_seconds: float | None) -> None:
    """Open the dashboard: every host, run and dataset, live; kill and restart from the keyboard."""
    open_tui(config_path, refresh_seconds)
