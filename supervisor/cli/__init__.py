"""The ``runwatch`` command line. Each group of commands lives in its own module.

Heavy imports (textual, asyncssh, httpx, transformers) happen inside the commands, so that
``runwatch --help`` stays fast.
"""

from __future__ import annotations

import click

from supervisor.cli._common import open_ui, run_cli
from supervisor.cli.actions import audit, guard, launch, restart
from supervisor.cli.bench import bench, compare
from supervisor.cli.clients import clients
from supervisor.cli.data import check, scan
from supervisor.cli.demo import demo
from supervisor.cli.hosts import kill, ps
from supervisor.cli.status import status
from supervisor.cli.watch import watch


class _Group(click.Group):
    """Lists each command with its whole first sentence (wrapped), not cut at ~45 characters."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=200)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(
    cls=_Group,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "-c",
    "--config",
    "config_path",
    default=None,
    metavar="PATH",
    help="Config file (TOML). Default: $RUNWATCH_CONFIG, else ./runwatch.toml.",
)
@click.version_option(package_name="runwatch")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """Supervise long LLM data-generation runs on GPU hosts over SSH.

    With no command, opens the dashboard (same as `runwatch tui`). New here? Try `runwatch demo`.
    """
    if ctx.invoked_subcommand is None:
        open_ui(config_path)


cli.add_command(demo)

for _command in (
    scan,
    check,
    ps,
    kill,
    status,
    launch,
    restart,
    guard,
    audit,
    bench,
    compare,
    clients,
    watch,
):
    cli.add_command(_command)


def main() -> None:
    """Console-script entry point."""
    run_cli(cli)
