"""The ``runwatch`` console script: the engine's command line plus the dashboard.

The engine (``supervisor``) never imports the UI. This module plugs the dashboard into the engine's
command group instead: it adds ``runwatch tui`` and registers the function that ``runwatch`` (no
command) and ``runwatch demo`` call to open it. Textual itself is imported only when the dashboard
opens, so ``runwatch --help`` stays fast.
"""

from __future__ import annotations

from typing import Any

import click

from supervisor.cli import cli
from supervisor.cli import main as engine_main
from supervisor.cli._common import Finite, config_option, get_config, register_ui


def open_tui(config_path: str | None, refresh_seconds: float | None = None) -> None:
    """Load the config, build the engine and run the dashboard until the user quits."""
    import asyncio

    config = get_config(config_path, need="hosts")
    asyncio.run(_dashboard(config, refresh_seconds))


async def _dashboard(config: Any, refresh_seconds: float | None) -> None:
    """Start the first refresh, then load Textual and run the app.

    The hosts' agents start (a process each, locally or over SSH) while Textual is imported on a
    thread, so the first refresh is under way when the app mounts: the app shows its snapshot at
    mount when it is done by then, and its own first refresh joins it otherwise
    (``Engine.refresh`` shares a refresh in flight)."""
    import asyncio
    import contextlib
    import importlib

    from supervisor.engine import Engine

    engine = Engine(config)
    first = asyncio.ensure_future(engine.refresh())
    # The app reports what the first refresh raised, if anything: here it is only retrieved.
    first.add_done_callback(lambda f: f.cancelled() or f.exception())
    try:
        app_module = await asyncio.to_thread(importlib.import_module, "tui.app")
        app = app_module.make_app(
            config, engine, refresh_seconds=refresh_seconds, first_refresh=first
        )
        await app.run_async()
    finally:
        if not first.done():
            first.cancel()
            with contextlib.suppress(BaseException):
                await first


@click.command()
@config_option
@click.option(
    "--refresh",
    "refresh_seconds",
    type=Finite(min=0.2),
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
