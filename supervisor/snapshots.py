"""A snapshot before every start over existing data: the second, independent guarantee.

Whatever runwatch made of a command line, a start must not lose the data it hands the client.
Every path that starts a client (launch, restart, the rollback of a failed restart, the
watcher's restart on failure, the budget guard's restart, ``rebalance --apply``: all go through
``supervisor.steps``) does, on the host (``agent.snapshots``):

1. before anything stops: :func:`check` - can each data file (and its error/skipped files) be
   kept? A reflink where the filesystem has them, else a byte copy within ``backup_max_bytes``;
   a file that can be neither refuses the start (:func:`refusal`) unless ``--force``, which names
   what goes unprotected;
2. right before the launch request: :func:`take` - the snapshot in
   ``<out>/.runwatch/snapshots/<run>/<UTC stamp>/``, the run's older ones pruned to
   ``snapshot_keep``;
3. once the client runs: :func:`damaged` - a kept file that shrank or was replaced (another
   inode) makes the steps stop the new client, :func:`put_back` the snapshot (the client's file
   kept as ``<file>.after-<stamp>``), audit, alert, and fail the start.

By hand: ``runwatch restore RUN`` lists a run's snapshots and puts one back (:func:`listing`,
:func:`restore_by_hand`), only while no writer of its files is alive.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from supervisor import display
from supervisor.agent.protocol import SIDECAR_DIR
from supervisor.errors import RunwatchError, StepFailed

if TYPE_CHECKING:
    from supervisor import replies
    from supervisor.agentclient import AgentClient
    from supervisor.config import Config
    from supervisor.layout import RunLayout

SNAPSHOTS = "snapshots"
"""``<out>/.runwatch/snapshots/<run>/``: a run's snapshots."""
TIMEOUT_S = 600.0
"""A byte copy of ``backup_max_bytes`` (4 GiB by default) may take minutes."""


def root_of(layout: RunLayout) -> str:
    """Where the snapshots of ``layout``'s run are kept."""
    return posixpath.join(layout.out, SIDECAR_DIR, SNAPSHOTS, layout.run.replace("/", "_"))


def files_of(layout: RunLayout) -> list[str]:
    """The files a start hands the client: each data file and its error/skipped files."""
    paths = list(layout.data_files.values())
    for sides in layout.sidecars.values():
        paths += [p for p in sides.values() if p not in paths]
    return paths


async def check(agent: AgentClient, config: Config, layout: RunLayout) -> replies.SnapshotCheck:
    """How each file of ``layout`` would be kept now (nothing is copied)."""
    return await agent.snapshot_check(
        root=root_of(layout),
        paths=files_of(layout),
        max_bytes=config.backup_max_bytes,
        timeout=TIMEOUT_S,
    )


def summary(found: replies.SnapshotCheck) -> str:
    """``snapshot: 1 file by reflink, 2 by copy (3.0 MiB)`` (``nothing to keep`` when no file
    holds data)."""
    by: dict[str, int] = {}
    for f in found.files:
        by[f.method] = by.get(f.method, 0) + 1
    parts = []
    if by.get("reflink"):
        parts.append(f"{by['reflink']} file(s) by reflink")
    if by.get("copy"):
        parts.append(f"{by['copy']} by copy ({display.size(found.copy_bytes)})")
    if by.get("none"):
        parts.append(f"{by['none']} NOT protected")
    return "snapshot: " + (", ".join(parts) if parts else "nothing to keep")


def refusal(unprotected: list[str], config: Config) -> StepFailed:
    """The refusal of a start whose data cannot be kept first."""
    return StepFailed(
        "no snapshot can be made of the data before the start: " + "; ".join(unprotected),
        f"put the output on a filesystem with reflinks (XFS, btrfs), raise backup_max_bytes "
        f"(now {display.size(config.backup_max_bytes)}) in {config.path}, or pass --force to "
        "start with those files unprotected; nothing was stopped",
    )


async def take(
    agent: AgentClient, config: Config, layout: RunLayout, reason: str
) -> replies.SnapshotTake:
    """The snapshot of ``layout``'s files, right before the launch request; pruned."""
    return await agent.snapshot_take(
        root=root_of(layout),
        paths=files_of(layout),
        max_bytes=config.backup_max_bytes,
        keep=config.snapshot_keep,
        run=layout.run,
        reason=reason,
        timeout=TIMEOUT_S,
    )


async def damaged(
    agent: AgentClient, layout: RunLayout, snap: replies.SnapshotTake
) -> list[replies.SnapshotDamage]:
    """The kept files that shrank or were replaced since ``snap``."""
    if not snap.id:
        return []
    return (await agent.snapshot_verify(root=root_of(layout), id=snap.id)).damaged


async def put_back(
    agent: AgentClient, layout: RunLayout, snap: replies.SnapshotTake
) -> replies.SnapshotRestore:
    """Put back the damaged files of ``snap`` (no writer may be alive: stop the client first)."""
    return await agent.snapshot_restore(
        root=root_of(layout), id=snap.id, damaged_only=True, timeout=TIMEOUT_S
    )


async def listing(agent: AgentClient, layout: RunLayout) -> list[replies.SnapshotInfo]:
    """The run's snapshots, newest first."""
    return (await agent.snapshot_list(root=root_of(layout))).snapshots


async def restore_by_hand(
    agent: AgentClient, layout: RunLayout, snapshot_id: str, paths: list[str] | None
) -> replies.SnapshotRestore:
    """``runwatch restore RUN --snapshot ID``: the files of a snapshot put back (every one, or
    ``paths``); refused while a writer of one of them is alive."""
    known = {s.id for s in await listing(agent, layout)}
    if snapshot_id not in known:
        raise RunwatchError(
            f"no snapshot {snapshot_id!r} of {layout.run} in {root_of(layout)}",
            f"`runwatch restore {layout.run}` lists them",
        )
    return await agent.snapshot_restore(
        root=root_of(layout), id=snapshot_id, paths=paths, timeout=TIMEOUT_S
    )
