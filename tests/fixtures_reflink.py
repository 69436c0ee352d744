"""A filesystem with reflinks for the tests and the benchmark: an XFS image made with
``mkfs.xfs -m reflink=1`` (btrfs when mkfs.xfs is missing), loop-mounted under a temporary
directory, unmounted and removed afterwards. Needs root and a loop device: :func:`unavailable`
says why not, so a test skips with the reason (never fails for a host that has none)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path


def unavailable() -> str | None:
    """Why no reflink filesystem can be mounted here, or None when one can be tried."""
    if os.geteuid() != 0:
        return "loop-mounting a filesystem image needs root"
    if not (shutil.which("mkfs.xfs") or shutil.which("mkfs.btrfs")):
        return "neither mkfs.xfs nor mkfs.btrfs is installed"
    if not Path("/dev/loop-control").exists():
        return "no loop device (/dev/loop-control is missing)"
    return None


@contextlib.contextmanager
def reflink_mount(where: Path, size: int = 1 << 30) -> Iterator[Path]:
    """A mounted filesystem with reflinks at ``where/mnt`` (its image: ``where/fs.img``,
    sparse, ``size`` bytes). Raises ``RuntimeError`` naming the command that failed."""
    image = where / "fs.img"
    mnt = where / "mnt"
    mnt.mkdir(parents=True)
    with open(image, "wb") as f:
        f.truncate(size)
    if shutil.which("mkfs.xfs"):
        mkfs = ["mkfs.xfs", "-q", "-m", "reflink=1", str(image)]
    else:
        mkfs = ["mkfs.btrfs", "-q", str(image)]
    for cmd in (mkfs, ["mount", "-o", "loop", str(image), str(mnt)]):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            image.unlink()
            raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False, capture_output=True)
        with contextlib.suppress(OSError):
            image.unlink()
