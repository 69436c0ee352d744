"""The ``runwatch`` command line. Each group of commands lives in its own module.

Heavy imports (textual, asyncssh, httpx, transformers) happen inside the commands, so that
``runwatch --help`` stays fast.
"""

from __future__ import annotations

import click

from supervisor.cli._common import run_cli
from supervisor.cli.demo import demo


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-c", "--config", "config_path", default=None, help="Config file (TOML).")
@click.version_option(package_name="runwatch")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """Supervise long LLM data-generation runs on GPU hosts over SSH.

    With no command, opens the dashboard (same as ``runwatch tui``).
    """
    if ctx.invoked_subcommand is None:
        from supervisor.cli.tui import open_tui

        open_tui(config_path)


cli.add_command(demo)

for _module, _names in (
    ("supervisor.cli.tui", ("tui",)),
    ("supervisor.cli.data", ("scan", "check")),
    ("supervisor.cli.hosts", ("ps", "kill", "status")),
    ("supervisor.cli.actions", ("launch", "restart", "guard", "audit")),
    ("supervisor.cli.bench", ("bench", "compare")),
):
    try:
        _mod = __import__(_module, fromlist=list(_names))
    except ModuleNotFoundError as _e:  # a command group not built yet
        if _e.name != _module:
            raise
        continue
    for _name in _names:
        cli.add_command(getattr(_mod, _name))


def main() -> None:
    """Console-script entry point."""
    run_cli(cli)
