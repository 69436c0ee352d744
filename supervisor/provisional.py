"""What a host shows while its first scan runs: provisional counts and how far the scan is.

A first scan reads every byte of every data file; on a host holding gigabytes of small records
that takes seconds. The agent first counts the files' lines (close to ``wc -l``) and sends the
counts in a progress line, then reports files and bytes done at most every half second
(``supervisor.agent.firstpass``). From those, :func:`provisional_view` makes a ``HostView`` whose
datasets carry their line counts as ``records`` with ``provisional=True`` and whose ``progress``
says how far the scan is. Nothing here feeds the rate trackers: the scan's reply replaces the
view whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from supervisor.model import DatasetView, HostView, ProcessInfo, RunState, RunView, ScanProgress

DatasetPaths = Sequence[tuple[str, Sequence[tuple[str, str]]]]
"""Per configured run of the host: its name and its ``(dataset, path on the host)`` pairs."""


def scan_progress(msg: dict[str, Any]) -> ScanProgress | None:
    """The ``ScanProgress`` of an agent progress line, or None when it has none."""
    try:
        return ScanProgress(
            files_done=int(msg["files_done"]),
            files_total=int(msg["files_total"]),
            bytes_done=int(msg["bytes_done"]),
            bytes_total=int(msg["bytes_total"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def provisional_view(
    last: HostView,
    msg: dict[str, Any],
    runs: DatasetPaths,
    match: Callable[[ProcessInfo], str | None],
) -> HostView:
    """``last`` (the host's view so far) with the progress line ``msg`` applied.

    A progress line with ``files`` (the first one) gives each dataset counted its line count as
    provisional ``records``, and with ``processes`` each run its state; later lines move
    ``progress`` only. Datasets the agent did not count keep what ``last`` had.
    """
    progress = scan_progress(msg)
    counts = msg.get("files")
    raw_procs = msg.get("processes")
    if not isinstance(counts, dict):
        return msgspec.structs.replace(last, progress=progress)
    procs: list[ProcessInfo] | None = None
    if isinstance(raw_procs, list):
        try:
            procs = [msgspec.convert(p, ProcessInfo) for p in raw_procs]
        except msgspec.ValidationError:
            procs = None
    by_run: dict[str, ProcessInfo] = {}
    for p in procs or []:
        name = match(p)
        if name is not None and name not in by_run:
            by_run[name] = p
    before = {r.name: r for r in last.runs}
    views = []
    for name, datasets in runs:
        old = before.get(name)
        old_ds = {d.name: d for d in old.datasets} if old is not None else {}
        dsv = []
        for ds, path in datasets:
            count = counts.get(path)
            if isinstance(count, dict) and isinstance(count.get("lines"), int):
                dsv.append(
                    DatasetView(name=ds, path=path, records=count["lines"], provisional=True)
                )
            else:
                dsv.append(old_ds.get(ds) or DatasetView(name=ds, path=path))
        proc = by_run.get(name)
        state: RunState
        if procs is None:
            state = old.state if old is not None else "unknown"
        elif proc is None:
            state = "stopped"
        else:
            state = "zombie" if proc.state.startswith("Z") else "running"
        views.append(
            RunView(
                name=name,
                host=last.name,
                state=state,
                process=proc if procs is not None else (old.process if old else None),
                datasets=dsv,
            )
        )
    return msgspec.structs.replace(
        last,
        connected=True,
        stale=False,
        error=None,
        runs=views,
        processes=procs if procs is not None else last.processes,
        progress=progress,
    )
