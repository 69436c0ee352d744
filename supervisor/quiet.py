"""The gate's ``quiet`` check: writers observed, not only inferred.

The ``writers`` check finds processes that hold a data file open. A writer that appends without
keeping the file open (a shell loop with ``>>``, an appender that opens, appends and closes per
record), another user's process the agent may not inspect, or a process on another node of a
shared filesystem holds nothing to find; what it cannot hide is the file growing. So, just before
anything of runwatch's touches the data (the ``data-repair`` and ``launch`` steps), and after the
old run is confirmed stopped on a restart (its own writes are expected until then), the host's
agent watches each data file's size, mtime and inode (``observe_files``) over a quiet window.
Any change is refused, naming the file, the bytes and the seconds; nothing is launched, and a
restart leaves the run stopped (a relaunch beside an unknown writer would interleave records:
data is never traded for uptime). On Slurm the login node's agent watches the shared filesystem.

The window: three times the run's median interval between records, from its rate history (what
runwatch saw of it while it ran; a writer of the same client appends at about that pace), at
least ``MIN_WINDOW_S`` and at most ``MAX_WINDOW_S``; ``MIN_WINDOW_S`` when the history knows no
rate (runwatch never watched it write). The files are sampled every ``SAMPLE_S``, and the watch
ends at the first change.

A file changed ``age`` seconds before the watch began is watched for at least ``INTERVALS x
age`` (up to ``MAX_WINDOW_S``): whatever changed it moments ago may be a writer slower than the
window (a record every few seconds), and after a restart's stop that costs a few seconds at
most. A change is a new size, inode, mtime or ctime (an in-place rewrite that puts the mtime
back still moves the ctime).

The gap between this check and the launch (the repair and the launch request, well under a
second) is not watched; nor is a writer slower than the window whose last write is older than
``MAX_WINDOW_S / INTERVALS``, or one whose filesystem shows its writes to the login node later
than the window (an NFS client's write-back of a file it keeps open).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from supervisor.plan import StepFailed
from supervisor.replies import LockHolder, ObservedFile

if TYPE_CHECKING:
    from supervisor.plan import Step
    from supervisor.steps import _Runner

MIN_WINDOW_S = 2.0
MAX_WINDOW_S = 30.0
INTERVALS = 3.0
"""The window covers this many of the run's usual intervals between records."""
SAMPLE_S = 0.2
RECENT = 60
"""How many of the newest growth intervals of the history the median is taken over."""


def record_interval(points: Sequence[Sequence[float]]) -> float | None:
    """The median interval between records, in seconds, of a run's history of ``(time, records,
    tokens, alive)`` points (oldest first); None when it shows no growth while the run ran. Between
    two points where the count grew, the time between them spread over the records added; only
    while every point says the run was running (a stop, and the quiet window itself, would pass
    for a slow writer), and a count that went down (a file replaced, a rescan) starts over."""
    intervals: list[float] = []
    last: tuple[float, float] | None = None
    for p in points:
        if len(p) < 4 or not p[3]:
            last = None
            continue
        t, n = float(p[0]), float(p[1])
        if last is None or n < last[1]:
            last = (t, n)
            continue
        if n > last[1] and t > last[0]:
            intervals.append((t - last[0]) / (n - last[1]))
            last = (t, n)
    if not intervals:
        return None
    return statistics.median(intervals[-RECENT:])


def window_for(interval: float | None) -> float:
    """The quiet window for a run whose median record interval is ``interval`` (None: unknown)."""
    if interval is None:
        return MIN_WINDOW_S
    return min(MAX_WINDOW_S, max(MIN_WINDOW_S, INTERVALS * interval))


def _seconds(s: float) -> str:
    return f"{s:.1f} s"


def describe(f: ObservedFile) -> str:
    """What another writer did to one file, for the refusal."""
    at = _seconds(f.seconds)
    if f.change == "grew":
        return f"something else is appending to {f.path}: {f.bytes} bytes in {at}"
    if f.change == "shrank":
        return f"something else truncated {f.path}: {-f.bytes} bytes fewer in {at}"
    if f.change == "replaced":
        return f"something else replaced {f.path} (a new file at that path) within {at}"
    if f.change == "created":
        return f"something else created {f.path} ({f.bytes} bytes) within {at}"
    if f.change == "removed":
        return f"something else removed {f.path} within {at}"
    return f"something else modified {f.path} (same size, new mtime) within {at}"


async def check(runner: _Runner, step: Step) -> None:
    """The ``quiet`` step of a plan (see the module docstring)."""
    plan = runner.plan
    paths = list(plan.layout.data_files.values())
    interval = record_interval(runner.engine.record_points(plan.host, plan.run.name))
    window = window_for(interval)
    rule = (
        f"{INTERVALS:g} x the run's median record interval of {interval:.2g} s"
        if interval is not None
        else "no record rate known yet"
    )
    rule += f", {MIN_WINDOW_S:g} to {MAX_WINDOW_S:g} s"
    # The host lengthens the window to 3 x the time since a file last changed (at most the
    # longest window): a writer that wrote that long ago may write again as late.
    since = f"{INTERVALS:g} x the time since a file last changed, at most {MAX_WINDOW_S:g} s"
    longer = f"longer by {since}"
    running = plan.old is not None or plan.job is not None
    if runner.dry_run and running:
        await runner.set(
            step,
            "skipped",
            f"dry run: would watch {len(paths)} data file(s) for {_seconds(window)} ({rule}; "
            f"{longer}) once the run is stopped",
        )
        return
    await runner.set(
        step,
        "running",
        f"watching {len(paths)} data file(s) for {_seconds(window)} ({rule}; {longer})",
    )
    timeout = max(window, MAX_WINDOW_S) + runner.hc.command_timeout
    seen = await runner.agent.observe_files(
        paths=paths,
        workdir=plan.layout.workdir,
        window_s=window,
        interval_s=SAMPLE_S,
        recent_factor=INTERVALS,
        recent_max_s=MAX_WINDOW_S,
        timeout=timeout,
    )
    step.data["observed"] = {
        "asked_s": window,
        "window_s": seen.window_s,
        "elapsed_s": seen.elapsed_s,
        "files": [
            {"path": f.path, "change": f.change, "bytes": f.bytes, "seconds": f.seconds}
            for f in seen.files
        ],
    }
    if seen.window_s > window:
        rule = f"lengthened from {_seconds(window)}, {rule}: {since}"
    changed = [f for f in seen.files if f.change]
    if not changed:
        step.detail = (
            f"no other writer: {len(seen.files)} data file(s) unchanged for "
            f"{_seconds(seen.window_s)} ({rule})"
        )
        return
    what = "; ".join(describe(f) for f in changed)
    await _not_another_launch(runner, what)
    if running:
        runner.keep_stopped = True
        raise StepFailed(
            f"{what}; the run is stopped and stays stopped: nothing was launched",
            "find the writer (`lsof` or `fuser` on the file; it may be another user's process "
            f"or on another node) and stop it, then `runwatch launch {plan.run.name}`",
        )
    raise StepFailed(
        f"{what}; nothing was launched",
        "find the writer (`lsof` or `fuser` on the file; it may be another user's process or "
        "on another node) and stop it, then launch again",
    )


async def _not_another_launch(runner: _Runner, what: str) -> None:
    """The writer is a launch of this run by another runwatch when it holds the run's lock: say
    so (the run is not down). Slurm jobs hold no lock on the login node."""
    plan = runner.plan
    if runner.hc.kind == "slurm" or not plan.locks:
        return
    st = await runner.agent.lock_status(lock_paths=plan.locks)
    holder = st.holder
    if not st.held or not (st.holder_alive or (holder is not None and holder.state == "launching")):
        return
    runner.taken_over = True
    who = (holder or LockHolder()).who(runner.engine.config.key)
    raise StepFailed(
        f"already running: {who} holds the run's lock {st.lock_path} (started by another "
        f"runwatch or launch) and writes its data ({what})",
        "nothing was launched; refresh to see the process that runs now",
    )
