"""Where a run lives on its host: workdir, output dir and log (``supervisor.layout`` has it all)."""

from __future__ import annotations

from supervisor.config import Config, RunConfig
from supervisor.layout import layout_of


def run_paths(config: Config, run: RunConfig) -> dict[str, str]:
    """``workdir``, ``out``, ``log`` of a run on its host, from its config argv."""
    return layout_of(config, run).paths
