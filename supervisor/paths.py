"""Where runwatch keeps its own files (never run data): XDG state and cache directories."""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """``$XDG_STATE_HOME/runwatch`` (default ``~/.local/state/runwatch``): audit, bench history."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "runwatch"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/runwatch`` (default ``~/.cache/runwatch``): the demo tokenizer."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runwatch"
