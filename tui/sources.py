"""Reads the detail screen needs beyond the snapshot: a run's log tail and its latest samples.

Both go through the engine (``EngineLike.tail_log``: the run's log or its launch log, secrets
masked; ``EngineLike.samples``); nothing is read or parsed here, so the same code serves local and
SSH hosts.
"""

from __future__ import annotations

from supervisor import display
from supervisor.engine import SamplePreview
from supervisor.errors import RunwatchError
from supervisor.model import RunView
from tui.engine import EngineLike
from tui.widgets.format import host_text


async def read_log_tail(engine: EngineLike, host: str, run: str, lines: int) -> list[str]:
    """The last ``lines`` lines of the run's log, or one line saying why there are none."""
    try:
        tail = await engine.tail_log(host, run, lines)
    except RunwatchError as e:
        return [host_text(f"({e.message})")]
    if not tail.exists:
        return [host_text(f"(no log yet at {tail.path})")]
    return [host_text(line) for line in tail.lines]


async def read_samples(engine: EngineLike, run: RunView, dataset: str, count: int) -> list[str]:
    """The latest ``count`` records of ``dataset`` of ``run``, newest first, as preview texts.

    Reading, parsing and decoding are the engine's (``EngineLike.samples``); this only renders.
    """
    found = await engine.samples(run, dataset, count)
    if not found.exists:
        return [f"(no data file yet at {found.path})"]
    shown = [render_sample(s) for s in found.samples]
    if found.bad_lines:
        shown.append(f"({display.count(found.bad_lines)} unreadable lines among the last ones)")
    if not found.complete:
        shown.append("(older records are too large to read)")
    return shown


def render_sample(sample: SamplePreview) -> str:
    """``<id>  finish=<reason>  <n> tokens`` and the text (or why there is none) under it."""
    head = f"{sample.id or '?'}  finish={sample.finish_reason or '?'}"
    if sample.tokens is not None:
        head += f"  {display.count(sample.tokens)} tokens"
    body = sample.text if sample.text is not None else f"({sample.note})"
    return host_text(f"{head}\n{body}")
