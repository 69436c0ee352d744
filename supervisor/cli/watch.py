"""``runwatch watch``: the headless watcher, in the foreground (tmux, or a systemd user unit).

It refreshes every host every ``refresh_seconds``, applies each run's budget policy, prints one
line per event and one per refresh (``--json``: one JSON object per line; a refresh is
``{"tick": n, ...}``) and sends alerts to ``[alerts] urls`` off its loop (a receiver that hangs
never delays a refresh; undelivered alerts are kept in the state dir for the next watcher);
runs with ``on_exit = "restart"`` are restarted through the launch checks. SIGINT or SIGTERM
end it cleanly (exit status 0). A second watcher of the same config exits with status 3 naming
the one that acts, or with ``--standby`` waits to take over. ``--metrics-listen`` (or
``[exporter] listen``) serves the watcher's latest snapshot to Prometheus (``supervisor.exporter``).
"""

from __future__ import annotations

import click

from supervisor.cli._common import Finite, config_option, get_config, json_option


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
    type=Finite(min=0.1),
    default=None,
    metavar="SECONDS",
    help="Seconds between refreshes (default: the config's refresh_seconds).",
)
@click.option(
    "--metrics-listen",
    default=None,
    metavar="HOST:PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (default: [exporter] listen; "
    "a bare PORT is 127.0.0.1:PORT).",
)
def watch(
    config_path: str | None,
    as_json: bool,
    standby: bool,
    interval: float | None,
    metrics_listen: str | None,
) -> None:
    """Watch every host headless: budget policy, alerts, restarts on failure, until stopped.

    Events: run-died, finished, stopped, stalled, over-budget, waste, dataset-done, all-done,
    host-lost, host-back, restart-done, restart-failed, restart-rolled-back, restart-gave-up,
    restart-abandoned, start-refused, budget-policy, duplicates, data-shrank, config-reloaded,
    config-refused, job-requeued. Each names the command that acts on it. An edit of the config
    file is taken at the next refresh, or refused with why (the watcher keeps the config it had).
    A restart waiting for its backoff is written in the state dir: a watcher started after one was
    killed takes it over, or says why it abandons it.
    """
    import asyncio
    import signal

    from supervisor.engine import Engine
    from supervisor.exporter import exposure_warning
    from supervisor.exporter import serve as serve_metrics
    from supervisor.watch import Watcher
    from supervisor.watch import watch as run_watch

    config = get_config(config_path, act=True)

    def out(line: str) -> None:
        click.echo(line)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        listen = metrics_listen or config.exporter.listen
        exporter = serve_metrics(config, listen) if listen else None
        try:
            async with Engine(config) as engine:
                watcher = Watcher(engine, emit=out, as_json=as_json, interval=interval)
                if exporter is not None:
                    watcher.observers.append(exporter.collector.publish)
                    watcher.note(f"metrics at {exporter.url}")
                    warning = exposure_warning(exporter.url, config)
                    if warning:
                        watcher.note(warning)
                await run_watch(engine, stop, standby=standby, watcher=watcher)
        finally:
            if exporter is not None:
                exporter.close()

    asyncio.run(main())
