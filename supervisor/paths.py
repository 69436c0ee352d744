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


def config_key(config_path: str) -> str:
    """A config's identity in the state dir: 16 hex digits of the sha256 of its resolved path.
    Two configs never share what is kept under it, and one config named through a link or a
    relative path is still one."""
    resolved = os.path.realpath(config_path) if config_path else "-"
    return hashlib.sha256(resolved.encode()).hexdigest()[:16]


def private_dir(path: Path) -> Path:
    """``path`` made if missing (its parents as the umask says) and kept mode 0700 whatever the
    umask; refused when it is a symbolic link, so that nothing runwatch keeps is written where a
    link points."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.is_symlink() or not path.is_dir():
        raise OSError(f"{path}: not a directory of runwatch's own (a link or a file)")
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically (a temporary file beside it, fsync, rename),
    mode 0600, in a 0700 directory."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
