"""Where runwatch keeps its own files (never run data): XDG state and cache directories."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from supervisor.agent import safefs
from supervisor.errors import UnsafeState


def state_dir() -> Path:
    """``$XDG_STATE_HOME/runwatch`` (default ``~/.local/state/runwatch``): audit, bench history."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "runwatch"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/runwatch`` (default ``~/.cache/runwatch``): the demo tokenizer."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runwatch"


def config_key(config_path: str, project: str | None = None) -> str:
    """A config's identity in the state dir: 16 hex digits of the sha256 of its resolved path,
    or of its ``project`` name when it has one (which survives moving the file). Two configs
    never share what is kept under it, and one config named through a link or a relative path
    is still one."""
    if project:
        return hashlib.sha256(f"project:{project}".encode()).hexdigest()[:16]
    resolved = os.path.realpath(config_path) if config_path else "-"
    return hashlib.sha256(resolved.encode()).hexdigest()[:16]


def config_state(key: str) -> Path:
    """``state_dir()/configs/<config key>``: what runwatch keeps for one config (launch specs,
    guard markers, history, the watcher's lock, event baselines, restart intents). Not created
    here: writers make what they need with :func:`private_dir` / :func:`write_private`."""
    return state_dir() / "configs" / key


def _unsafe(e: safefs.UnsafePath) -> UnsafeState:
    return UnsafeState(f"refusing {e.path}: {e.why}", e.fix)


def private_dir(path: Path) -> Path:
    """``path`` made if missing, each level 0700 whatever the umask; it and every level between
    it and the state dir refused (:class:`UnsafeState`) when a link, another user's, or writable
    by group or others (``agent.safefs``)."""
    root = state_dir()
    top = root if path == root or root in path.parents else path
    try:
        safefs.make_dirs(str(path), str(top))
    except safefs.UnsafePath as e:
        raise _unsafe(e) from None
    return path


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically (a new 0600 file beside it, fsync, rename) in a
    private directory (:func:`private_dir`)."""
    private_dir(path.parent)
    safefs.write_atomic(str(path), data)


def write_private_chunks(path: Path, chunks: Iterable[bytes]) -> None:
    """:func:`write_private` of the concatenation of ``chunks``, written as they come."""
    private_dir(path.parent)
    safefs.write_atomic_chunks(str(path), chunks)


def read_private(path: Path) -> bytes:
    """The bytes of a file runwatch keeps, refused (:class:`UnsafeState`) when it is a link,
    another user's or writable by others; FileNotFoundError when it is missing."""
    try:
        return safefs.read_private(str(path))
    except safefs.UnsafePath as e:
        raise _unsafe(e) from None


def open_private(path: Path, flags: int) -> int:
    """A descriptor on a file runwatch keeps (created 0600 with ``O_EXCL`` when new, never
    through a link, checked like :func:`read_private`), in a private directory."""
    private_dir(path.parent)
    try:
        return safefs.open_private(str(path), flags)
    except safefs.UnsafePath as e:
        raise _unsafe(e) from None
