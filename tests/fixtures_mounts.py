"""Another path to the same directory for the file-identity tests: ``bind_view(source)`` bind-
mounts ``source`` on a new directory (``mount --bind``, root only) and unmounts it at teardown;
a test skips with the reason where mounting is not permitted (never fails for such a host)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def bind_view(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """Factory: ``bind_view(source)`` is a directory under ``tmp_path`` showing ``source``
    through a bind mount (the same inodes by another path); every mount is undone afterwards."""
    mounted: list[Path] = []

    def mount(source: Path) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mount --bind needs root")
        view = tmp_path / f"view{len(mounted)}"
        view.mkdir()
        done = subprocess.run(
            ["mount", "--bind", str(source), str(view)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            pytest.skip(f"mount --bind is not permitted here: {done.stderr.strip()}")
        mounted.append(view)
        return view

    yield mount
    for view in reversed(mounted):
        subprocess.run(["umount", "-l", str(view)], capture_output=True, check=False)
