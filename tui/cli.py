"""The ``runwatch`` console script: the engine's command line plus the dashboard.

The engine (``supervisor``) never imports the UI. This module plugs the dashboard into the engine's
command group instead: it adds ``runwatch tui`` and registers the function that ``runwatch`` (no
command) and ``runwatch demo`` call to open it. Textual itself is imported only when the dashboard
opens, so ``runwatch --help`` stays fast.
"""

from __future__ import annotations

import click

from supervisor.cli import cli
from supervisor.cli import main as engine_main
from supervisor.cli._common import config_option, get_config, register_ui


def open_tui(config_path: str | None, refresh_seconds: float | None = None) -> None:
    """Load the config, build the engine and run the dashboard until the user quits."""
    from supervisor.engine import Engine
    from tui.app import make_app

    config = get_config(config_path, need="hosts")
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


def main() -> None:
    """Console-script entry point: every engine command, ``tui``, and the dashboard by default."""
    cli.add_command(tui)
    register_ui(open_tui)
    engine_main()


if __name__ == "__main__":
    main()
