"""``runwatch watch``: the headless watcher, in the foreground (tmux, or a systemd user unit).

It refreshes every host every ``refresh_seconds``, applies each run's budget policy, prints one
line per event (``--json``: one JSON object per line) and sends alerts to ``[alerts] urls``;
runs with ``on_exit = "restart"`` are restarted through the launch checks. SIGINT or SIGTERM
end it cleanly (exit status 0). A second watcher of the same config exits with status 3 naming
the one that acts, or with ``--standby`` waits to take over.
"""

from __future__ import annotations

import click

from supervisor.cli._common import config_option, get_config, json_option


@click.command()
@config_option
@json_option
@click.option(
    "--standby",
    is_flag=True,
    help="When another watcher holds this config, wait and take over when it stops.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=None,
    metavar="SECONDS",
    help="Seconds between refreshes (default: the config's refresh_seconds).",
)
def watch(config_path: str | None, as_json: bool, standby: bool, interval: float | None) -> None:
    """Watch every host headless: budget policy, alerts, restarts on failure, until stopped.

    Events: run-died, stalled, over-budget, waste, dataset-done, all-done, host-lost, host-back,
    restart-done, restart-failed, restart-rolled-back, restart-gave-up, start-refused,
    budget-policy, duplicates, data-shrank. Each names the command that acts on it.
    """
    import asyncio
    import signal

    from supervisor.engine import Engine
    from supervisor.engine import watch as run_watch

    config = get_config(config_path, act=True)

    def out(line: str) -> None:
        click.echo(line)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with Engine(config) as engine:
            await run_watch(
                engine, stop, emit=out, as_json=as_json, standby=standby, interval=interval
            )

    asyncio.run(main())
