"""The ``runwatch`` command line. Each group of commands lives in its own module.

The group imports a command's module only when that command runs (:class:`LazyGroup`), and
heavy libraries (textual, asyncssh, httpx, transformers) are imported inside the commands, so
that ``runwatch --help`` and the start of any one command stay fast.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from supervisor.cli._common import open_ui, run_cli

LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "adopt": (
        "supervisor.cli.hosts:adopt",
        "Take a Slurm job that runwatch did not submit as RUN's, so that kill and restart act on "
        "it.",
    ),
    "audit": (
        "supervisor.cli.actions:audit",
        "Show the audit log: every kill, launch, restart, move-aside, repair and budget action.",
    ),
    "bench": (
        "supervisor.cli.bench:bench",
        "Measure an endpoint with the run's own prompts and request shape.",
    ),
    "check": (
        "supervisor.cli.data:check",
        "Validate every record of PATH (file or directory) or of every dataset of RUN.",
    ),
    "clients": (
        "supervisor.cli.clients:clients",
        "List the client profiles: scripts, layout, flags, resume rule, sidecars, volatile flags.",
    ),
    "compare": (
        "supervisor.cli.bench:compare",
        "Time and cost to finish every dataset with budget left, on each endpoint.",
    ),
    "demo": (
        "supervisor.cli.demo:demo",
        "Start mock local-GPU and API servers and three runs against them, then watch them.",
    ),
    "guard": (
        "supervisor.cli.actions:guard",
        "Apply each run's budget_policy (warn, stop, restart-with-budget) to runs without "
        "--token-budget whose datasets passed their budget.",
    ),
    "kill": (
        "supervisor.cli.hosts:kill",
        "Stop RUN (or --pid PID, with --host NAME when the config has several hosts) and every "
        "descendant, and prove they are gone.",
    ),
    "launch": (
        "supervisor.cli.actions:launch",
        "Launch RUN on its host, detached, after checking its data; confirm it runs.",
    ),
    "ps": (
        "supervisor.cli.hosts:ps",
        "List the runs on every host: identity, owner, CPU, memory, GPU, children and flags.",
    ),
    "rebalance": (
        "supervisor.cli.rebalance:rebalance",
        "Split the datasets left between the runs' endpoints to finish by a deadline under a "
        "cost cap; --apply carries it out.",
    ),
    "restart": (
        "supervisor.cli.actions:restart",
        "Check RUN's data and settings, stop it by identity, repair a torn tail, relaunch it.",
    ),
    "restore": (
        "supervisor.cli.actions:restore",
        "List the snapshots taken of RUN's data before its starts, or put one back (--snapshot).",
    ),
    "scan": (
        "supervisor.cli.data:scan",
        "Count records, ids, tokens and bad lines of dataset files (no config needed).",
    ),
    "status": (
        "supervisor.cli.status:status",
        "Runs and datasets of every host: responses, tokens, budget, rates, ETA, verdict.",
    ),
    "watch": (
        "supervisor.cli.watch:watch",
        "Watch every host headless: budget policy, alerts, restarts on failure, until stopped.",
    ),
}
"""Command name -> (``module:attribute`` of the command, its short help as ``--help`` lists it).
The short help is the first sentence of the command's docstring; a test checks they agree."""


class LazyGroup(click.Group):
    """A group whose commands are imported when first asked for (click's documented lazy-loading
    pattern): ``runwatch status`` imports the status command's module and no other.

    ``--help`` lists every command with its whole short help (wrapped, not cut at ~45 characters),
    taken from :data:`LAZY_COMMANDS` for the commands not imported yet."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy
        """Command name -> (``module:attribute``, short help) of the commands imported on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self.lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = self.commands.get(cmd_name)
        if command is None and cmd_name in self.lazy:
            module, _, attr = self.lazy[cmd_name][0].partition(":")
            command = getattr(importlib.import_module(module), attr)
            if not isinstance(command, click.Command):
                raise TypeError(f"{module}:{attr} is not a click command")
            self.add_command(command, cmd_name)
        return command

    def listed_help(self, ctx: click.Context, cmd_name: str) -> str | None:
        """The command's short help, without importing it (None: a hidden command)."""
        command = self.commands.get(cmd_name)
        if command is None:
            return self.lazy[cmd_name][1]
        return None if command.hidden else command.get_short_help_str(limit=200)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            text = self.listed_help(ctx, name)
            if text is not None:
                rows.append((name, text))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    lazy=LAZY_COMMANDS,
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
    from supervisor.engine import set_origin

    set_origin(f"runwatch {ctx.invoked_subcommand}" if ctx.invoked_subcommand else "dashboard")
    if ctx.invoked_subcommand is None:
        open_ui(config_path)


def main() -> None:
    """Console-script entry point."""
    run_cli(cli)
