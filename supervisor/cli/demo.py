"""``runwatch demo``: the embedded demo workload (mock servers, reference client, TUI)."""

from __future__ import annotations

import click

from supervisor.cli._common import Finite


@click.command()
@click.option("--headless", is_flag=True, help="No UI: print what runs, every second.")
@click.option(
    "--seconds",
    type=Finite(min=0),
    default=None,
    help="Stop after this many seconds (default: until Ctrl-C).",
)
@click.option("--dir", "demo_dir", default=None, help="Demo directory (default: a fresh temp dir).")
@click.option(
    "--slurm", is_flag=True, help="Run the clients as Slurm jobs of this machine's cluster."
)
def demo(headless: bool, seconds: float | None, demo_dir: str | None, slurm: bool) -> None:
    """Start mock local-GPU and API servers and three runs against them, then watch them."""
    from supervisor.cli._common import ui_opener
    from supervisor.demo.launcher import run_demo

    run_demo(
        headless=headless, seconds=seconds, demo_dir=demo_dir, open_ui=ui_opener(), slurm=slurm
    )
