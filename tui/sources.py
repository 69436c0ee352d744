"""Reads the detail screen needs beyond the snapshot: a run's log tail and its latest samples.

Both go through the engine's host connection (the agent's ``tail_log`` op; the samples through
``supervisor.samples``); nothing is read or parsed here, so the same code serves local and SSH
hosts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from supervisor.config import Config
from supervisor.errors import RunwatchError, UsageError
from supervisor.model import RunView
from tui.engine import EngineLike

if TYPE_CHECKING:
    from supervisor.samples import HostsEngine, SamplePreview


def _host(engine: EngineLike, host: str) -> Any:
    getter = getattr(engine, "host", None)
    if getter is None:
        raise UsageError(
            "this engine gives no access to hosts", "log and samples need the real engine"
        )
    return getter(host)


async def read_log_tail(
    engine: EngineLike, config: Config, host: str, run: str, lines: int
) -> list[str]:
    """The last ``lines`` lines of the run's log (secrets masked by the agent)."""
    try:
        rc = config.run(run)
    except RunwatchError:
        return ["(this process is not a configured run: its log is unknown)"]
    path = rc.log
    if config.host(rc.host).kind == "slurm":  # the job's output file
        from supervisor.slurm import job_output

        path = job_output(getattr(engine, "last", None), run) or path
    if path is None:
        return [f"(run {run} has no log = ... in the config)"]
    result = await _host(engine, host).request(
        "tail_log", {"path": path, "workdir": rc.workdir, "lines": lines}
    )
    if not result.get("exists", False):
        return [f"(no log yet at {result.get('path', path)})"]
    return [str(line) for line in result.get("lines", [])]


async def read_samples(engine: EngineLike, run: RunView, dataset: str, count: int) -> list[str]:
    """The latest ``count`` records of ``dataset`` of ``run``, newest first, as preview texts.

    Reading, parsing and decoding are the engine's (``supervisor.samples``); this only renders.
    """
    from supervisor.samples import latest_samples

    _host(engine, run.host)  # a clear error for an engine without hosts
    found = await latest_samples(cast("HostsEngine", engine), run, dataset, count)
    if not found.exists:
        return [f"(no data file yet at {found.path})"]
    shown = [render_sample(s) for s in found.samples]
    if found.bad_lines:
        shown.append(f"({found.bad_lines} unreadable lines among the last ones)")
    if not found.complete:
        shown.append("(older records are too large to read)")
    return shown


def render_sample(sample: SamplePreview) -> str:
    """``<id>  finish=<reason>  <n> tokens`` and the text (or why there is none) under it."""
    head = f"{sample.id or '?'}  finish={sample.finish_reason or '?'}"
    if sample.tokens is not None:
        head += f"  {sample.tokens} tokens"
    body = sample.text if sample.text is not None else f"({sample.note})"
    return f"{head}\n{body}"
