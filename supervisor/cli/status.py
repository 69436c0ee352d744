"""``runwatch status``: every host, run and dataset in one screen of text (or ``--json``).

Per dataset: responses, completion tokens, budget used, rates, ETA, the budget projection (how far
past its budget a dataset without ``--token-budget`` will go) and the format verdict. ``--watch
SECONDS`` redraws in place (plain text) until Ctrl-C. Exit status: 0 when every host answered,
1 when one did not (its last values are shown, marked stale).
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from supervisor.cli._common import config_option, get_config, json_option, print_json

if TYPE_CHECKING:
    from supervisor.model import DatasetView, HostView, RunView, Snapshot

CLEAR = "\x1b[H\x1b[2J"


def human(n: float | None) -> str:
    """``10.7 M``, ``2,912``, ``-`` for None."""
    if n is None:
        return "-"
    a = abs(n)
    if a >= 1e9:
        return f"{n / 1e9:.2f} G"
    if a >= 1e6:
        return f"{n / 1e6:.1f} M"
    if a >= 1e5:
        return f"{n / 1e3:.0f} k"
    if float(n).is_integer():
        return f"{int(n):,}"
    return f"{n:,.1f}"


def duration(s: float | None) -> str:
    """``7 h 03 m``, ``4 m 10 s``, ``12 s``, ``-``."""
    if s is None:
        return "-"
    s = max(0.0, s)
    if s >= 86400:
        return f"{int(s // 86400)} d {int(s % 86400 // 3600):02d} h"
    if s >= 3600:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} m"
    if s >= 60:
        return f"{int(s // 60)} m {int(s % 60):02d} s"
    return f"{s:.0f} s"


def rate(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _budget(ds: DatasetView) -> str:
    if not ds.token_budget:
        return "-"
    return f"{100.0 * ds.completion_tokens / ds.token_budget:.0f}%"


def _host_line(h: HostView, now: float) -> str:
    if h.connected:
        rtt = f"  rtt {h.rtt_ms:.1f} ms" if h.rtt_ms is not None else ""
        return f"{h.name}  connected{rtt}"
    parts = [f"{h.name}  DISCONNECTED"]
    if h.stale and h.last_ok is not None:
        parts.append(f"(stale: last ok {duration(now - h.last_ok)} ago)")
    line = "  ".join(parts)
    return f"{line}\n  error: {h.error}" if h.error else line


def _run_lines(r: RunView) -> list[str]:
    head = f"  {r.name}  {r.state}"
    if not r.configured:
        head += "  (not in config)"
    p = r.process
    if p is not None:
        if r.configured:  # an unconfigured run is named after its pid already
            head += f"  pid {p.identity.pid}"
        head += f"  up {duration(p.uptime_s)}  cpu {p.cpu_percent:.0f}%  rss {human(p.rss_mb)} MB"
        if p.gpu_memory_mb is not None:
            head += f"  gpu {human(p.gpu_memory_mb)} MB"
        if p.flags.token_budget is None:
            head += "  no --token-budget"
    lines = [head]
    if not r.datasets:
        return lines
    lines.append(
        f"    {'dataset':<12} {'responses':>10} {'tokens':>10} {'budget':>7} "
        f"{'req/s':>7} {'tok/s':>9} {'ETA':>10}  verdict"
    )
    for ds in r.datasets:
        responses = human(ds.unique_ids or ds.records)
        if ds.max_samples:
            responses = f"{responses}/{human(ds.max_samples)}"
        verdict = ds.verdict if ds.state == "ok" else ds.state
        flags = []
        if ds.over_budget:
            flags.append("OVER BUDGET")
        if ds.stalled:
            flags.append("STALLED")
        if ds.duplicates:
            flags.append(f"{ds.duplicates} dup")
        if ds.bad_lines:
            flags.append(f"{ds.bad_lines} bad lines")
        rates = ds.rates
        req = rates.req_per_s_1m if rates.req_per_s_1m is not None else rates.req_per_s_all
        tok = rates.tok_per_s_1m if rates.tok_per_s_1m is not None else rates.tok_per_s_all
        lines.append(
            f"    {ds.name:<12} {responses:>10} {human(ds.completion_tokens):>10} {_budget(ds):>7} "
            f"{rate(req):>7} {rate(tok, 1):>9} {duration(ds.projection.eta_s):>10}  {verdict}"
            + (f"  [{', '.join(flags)}]" if flags else "")
        )
        notes = [ds.error]
        if ds.verdict not in ("current", "empty"):
            notes.append(ds.verdict_detail)
        if ds.state == "ok":
            notes.append(ds.projection.message)
        for note in dict.fromkeys(n for n in notes if n):
            lines.append(f"      ! {note}")
    return lines


def render(snap: Snapshot) -> str:
    """The text of ``runwatch status`` for one snapshot."""
    lines: list[str] = []
    for h in snap.hosts:
        lines.append(_host_line(h, snap.time))
        if not h.runs:
            lines.append("  (no runs)")
        for r in h.runs:
            lines.extend(_run_lines(r))
        lines.append("")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.time))
    lines.append(f"as of {stamp}")
    return "\n".join(lines) + "\n"


async def _watch(config: Any, seconds: float, as_json: bool) -> None:
    import asyncio

    from supervisor.engine import Engine

    async with Engine(config) as engine:
        while True:
            started = time.monotonic()
            snap = await engine.refresh()
            if as_json:
                print_json(snap)
            else:
                sys.stdout.write(CLEAR + render(snap))
                sys.stdout.flush()
            await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))


@click.command()
@config_option
@json_option
@click.option(
    "--watch",
    "watch",
    type=click.FloatRange(min=0.1),
    default=None,
    metavar="SECONDS",
    help="Refresh every SECONDS until Ctrl-C.",
)
def status(config_path: str | None, as_json: bool, watch: float | None) -> None:
    """Runs and datasets of every host: responses, tokens, budget, rates, ETA, verdict."""
    import asyncio

    from supervisor.engine import run_sync

    config = get_config(config_path)
    if watch is not None:
        # Ctrl-C is how --watch ends: not an error.
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_watch(config, watch, as_json))
        return

    async def once(engine: Any) -> Snapshot:
        snap: Snapshot = await engine.refresh()
        return snap

    snap = run_sync(config, once)
    if as_json:
        print_json(snap)
    else:
        sys.stdout.write(render(snap))
    if any(h.error for h in snap.hosts):
        sys.exit(1)
