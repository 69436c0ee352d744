"""Where runwatch keeps its own files (never run data): XDG state and cache directories."""

from __future__ import annotations

import hashlib
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


def config_id(config_path: str) -> str:
    """A config's identity: 12 hex digits of the SHA-256 of its resolved path ("memory" for a
    config that was not read from a file). Part of every launch token, so two configs with a
    run of the same name never take each other's runs."""
    if not config_path:
        return "memory"
    resolved = os.path.realpath(os.path.expanduser(config_path))
    return hashlib.sha256(resolved.encode("utf-8", "surrogateescape")).hexdigest()[:12]
