"""``runwatch status``: every host, run and dataset in one screen of text (or ``--json``).

Per dataset: responses, completion tokens, budget used, rates, ETA, the budget projection (how far
past its budget a dataset without ``--token-budget`` will go) and the format verdict. ``--watch
SECONDS`` redraws in place (plain text) until Ctrl-C and applies each run's budget policy
(``Engine.tick``: warn, stop or restart-with-budget, once per event, audited), showing
what it did. Exit status: 0 when every host answered, 1 when one did not (its last values are
shown, marked stale).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from supervisor import display
from supervisor.cli._common import (
    Finite,
    config_option,
    get_config,
    json_option,
    print_json,
    write_control,
)
from supervisor.engine import describe_job

if TYPE_CHECKING:
    from supervisor.model import DatasetView, HostView, RunView, Snapshot

CLEAR = "\x1b[H\x1b[2J"


def _eta(ds: DatasetView) -> str:
    """Time to the first stop condition; ``done`` once one is reached."""
    done = ds.unique_ids or ds.records
    if ds.projection.eta_s == 0 or (ds.max_samples and done >= ds.max_samples):
        return "done"
    return display.duration(ds.projection.eta_s)


def _plain_progress(ds: DatasetView) -> bool:
    """True when the projection's message only repeats the tokens and budget columns."""
    if not ds.token_budget:
        return False
    head = display.budget(ds.completion_tokens, ds.token_budget)
    return ds.projection.message == head


def _client_notes(ds: DatasetView) -> list[str]:
    """Reasoning tokens, completeness against the input, and the error / skipped files."""
    from supervisor.engine import completeness_line, sidecar_line

    notes = []
    if ds.reasoning_tokens:
        notes.append(
            f"{display.compact(ds.reasoning_tokens)} of the "
            f"{display.compact(ds.completion_tokens)} completion tokens are reasoning"
        )
    c = ds.completeness
    if c is not None and (ds.records or c.failed or c.error):  # nothing written: nothing to say
        notes.append(completeness_line(c))
    notes.extend(sidecar_line(s) for s in ds.sidecars if s.lines)
    return notes


def _host_line(h: HostView, now: float) -> str:
    if h.connected:
        rtt = f"  rtt {display.latency(h.rtt_ms)}" if h.rtt_ms is not None else ""
        return "\n  ".join([f"{h.name}  connected{rtt}", *h.notes])
    parts = [f"{h.name}  DISCONNECTED"]
    if h.stale and h.last_ok is not None:
        parts.append(f"(stale: last ok {display.ago(now, h.last_ok)})")
    line = "  ".join(parts)
    return f"{line}\n  error: {h.error}" if h.error else line


def _run_lines(r: RunView) -> list[str]:
    head = f"  {r.name}  {r.state_text}"
    if not r.configured:
        head += "  (not in config)"
    if r.candidates:
        pids = ", ".join(map(str, r.candidates))
        head += f": pids {pids} could each be it (name one with --pid)"
    p = r.process
    if p is not None:
        # The warning first: the rest of the line is what a narrow terminal cuts.
        if p.flags.token_budget is None and r.budget_flag:
            head += f"  no {r.budget_flag}"
        if r.configured:  # an unconfigured run is named after its pid already
            head += f"  pid {p.identity.pid}"
        if r.held_by is not None:
            head += f"  {display.held(r.held_by)}"
        head += f"  up {display.duration(p.uptime_s)}  cpu {display.percent(p.cpu_percent)}"
        head += f"  rss {display.mebibytes(p.rss_mb)}"
        if p.gpu_memory_mb is not None:
            head += f"  gpu {display.mebibytes(p.gpu_memory_mb)}"
    elif r.job is not None:
        head += "  " + describe_job(r.job)
    if r.state == "running" and r.rates.tok_per_s is not None:
        # The run's own window across all its datasets, with its uncertainty.
        head += "  " + display.rate_pm(r.rates.tok_per_s, r.rates.tok_per_s_err, "tok/s")
    lines = [head]
    if r.waste is not None:  # the whole waste first: one dataset's line says only its own
        lines.append(f"    {r.waste.message}")
    if not r.datasets:
        return lines
    # The name column fits the longest name, so that the table fits 80 columns for short ones.
    w = max(7, *(len(ds.name) for ds in r.datasets))
    lines.append(
        f"    {'dataset':<{w}} {'responses':>11} {'tokens':>8} {'budget':>6} "
        f"{'req/s':>6} {'tok/s':>7} {'ETA':>10}  verdict"
    )
    for ds in r.datasets:
        responses = display.count(ds.unique_ids or ds.records)
        if ds.max_samples:
            responses = f"{responses}/{display.count(ds.max_samples)}"
        if ds.state == "missing":
            verdict = "not started"
        else:
            verdict = ds.verdict if ds.state == "ok" else ds.state
        flags = []
        if ds.over_budget:
            flags.append("OVER BUDGET")
        if ds.stalled:
            flags.append("STALLED")
        if ds.duplicates:
            flags.append(f"{display.count(ds.duplicates)} dup")
        if ds.bad_lines:
            flags.append(f"{display.count(ds.bad_lines)} bad lines")
        # The window's rate, once the window holds enough responses to say (0 once done).
        req, tok = ds.rates.req_per_s, ds.rates.tok_per_s
        lines.append(
            f"    {ds.name:<{w}} {responses:>11} {display.compact(ds.completion_tokens):>8} "
            f"{display.share(ds.completion_tokens, ds.token_budget):>6} "
            f"{display.rate(req):>6} {display.rate(tok):>7} {_eta(ds):>10}  {verdict}"
        )
        if ds.state == "missing" and not ds.alarm:  # not reached yet: nothing to say
            continue
        notes = [ds.alarm, ds.error, ds.torn_tail]
        if ds.state == "ok" and not _plain_progress(ds):
            notes.append(ds.projection.message)
        if ds.verdict not in ("current", "empty"):
            notes.append(ds.verdict_detail)
        notes.extend(_client_notes(ds))
        unique = [n for n in dict.fromkeys(notes) if n]
        # The flags open the notes (not the row, which then fits 80 columns).
        if flags:
            tag = f"[{', '.join(flags)}]"
            unique = [f"{tag} {unique[0]}", *unique[1:]] if unique else [tag]
        for note in unique:
            lines.append(f"      ! {note}")
    return lines


def _serving_lines(h: HostView) -> list[str]:
    """The host's local serving engines (from their /metrics) and GPUs, one line each."""
    lines = []
    for em in h.endpoints:
        files = "files: too few responses yet"
        if em.files_tok_per_s.value is not None:
            err = em.files_tok_per_s_err or 0.0
            files = display.rate_pm(em.files_tok_per_s.value, err, "tok/s (files)")
        if em.kind != "local":
            lines.append(f"  endpoint {em.name} ({em.kind}): {files}")
            continue
        if not em.available:
            lines.append(f"  endpoint {em.name}: {files}; metrics {em.why}")
            continue
        parts = [
            f"running {display.count(em.running.value)}",
            f"queued {display.count(em.queued.value)}",
        ]
        if em.kv_usage.value is not None:
            parts.append(f"KV {display.percent(100 * em.kv_usage.value)}")
        if em.gen_tok_per_s.value is not None:
            parts.append(f"{display.rate(em.gen_tok_per_s.value)} tok/s (server)")
        parts.append(files)
        if em.ttft_p50_s is not None and em.ttft_p90_s is not None:
            parts.append(
                f"TTFT p50 {display.latency(1000 * em.ttft_p50_s)} p90 "
                f"{display.latency(1000 * em.ttft_p90_s)} ({em.ttft_window})"
            )
        if em.note:
            parts.append(em.note)
        lines.append(f"  endpoint {em.name} ({em.engine}): " + ", ".join(parts))
    for g in h.gpus:
        parts = [display.percent(g.utilization_pct)]
        if g.memory_used_mb is not None and g.memory_total_mb is not None:
            parts.append(
                f"{display.mebibytes(g.memory_used_mb)} / {display.mebibytes(g.memory_total_mb)}"
            )
        if g.power_w is not None:
            parts.append(f"{g.power_w:.0f} W")
        if g.temperature_c is not None:
            parts.append(f"{g.temperature_c:.0f} C")
        held = f"  ({', '.join(g.runs)})" if g.runs else ""
        lines.append(f"  GPU{g.index} " + ", ".join(parts) + held)
    if h.gpu_error:
        lines.append(f"  GPUs: {h.gpu_error}")
    return lines


def _has_rates(snap: Snapshot) -> bool:
    return any(
        ds.rates.req_per_s_1m is not None or ds.rates.req_per_s_all is not None
        for h in snap.hosts
        for r in h.runs
        for ds in r.datasets
    )


def render(snap: Snapshot, rates_hint: bool = True) -> str:
    """The text of ``runwatch status`` for one snapshot.

    ``rates_hint``: say how to get rates when the snapshot has none (a one-shot status)."""
    lines: list[str] = []
    for h in snap.hosts:
        lines.append(_host_line(h, snap.time))
        if not h.runs:
            lines.append("  (no runs)")
        for r in h.runs:
            lines.extend(_run_lines(r))
        lines.extend(_serving_lines(h))
        lines.append("")
    if snap.plan is not None:
        mark = "! " if snap.plan.will_miss else ""
        lines.append(f"{mark}{snap.plan.text}")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.time))
    lines.append(f"as of {stamp}")
    running = any(r.datasets and r.state == "running" for h in snap.hosts for r in h.runs)
    if rates_hint and running and not _has_rates(snap):
        # Rates come from successive looks at the files; one refresh has none to compare.
        lines.append("rates and ETA need a second refresh: runwatch status --watch 2")
    return "\n".join(lines) + "\n"


def fit_screen(text: str, rows: int, cols: int = 0) -> str:
    """``text`` cut to the terminal: lines longer than ``cols`` (when given) end in ``…``, and
    past ``rows`` lines the last one says how many were left out (a redraw taller than the
    terminal would scroll its top, the hosts, out of sight)."""
    lines = text.splitlines()
    if cols > 1:
        lines = [display.shorten(ln, cols) for ln in lines]
    if rows >= 2 and len(lines) > rows - 1:
        keep = rows - 2
        lines = [
            *lines[:keep],
            f"... {len(lines) - keep} more lines: enlarge the terminal, or --json",
        ]
    return "\n".join(lines) + "\n"


async def _watch(config: Any, seconds: float, as_json: bool) -> None:
    """Redraw every ``seconds`` until Ctrl-C or SIGTERM. Its own handler sets a stop that each
    turn races: a cancellation alone can be lost (``asyncio.wait_for`` of Python 3.11 returns a
    reply that came at the instant it was cancelled), and the loop would then go on."""
    import asyncio
    import signal

    from supervisor.engine import Engine

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stopped = asyncio.ensure_future(stop.wait())

    async def until_stop(aw: Any) -> Any:
        """``aw``'s result, or None when a stop came first (``aw`` is then cancelled)."""
        task = asyncio.ensure_future(aw)
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return None

    acted: list[str] = []  # what the budget guard did, shown under every redraw
    async with Engine(config) as engine:
        while not stop.is_set():
            started = time.monotonic()
            # Each run's budget policy (warn, stop, restart-with-budget), once per event, audited.
            tick = await until_stop(engine.tick(events=False))
            if tick is None:
                break
            snap = tick.snapshot
            done = [o for o in tick.outcomes if o.acted]
            if as_json:
                print_json(snap)
                for o in done:
                    click.echo(f"budget {o.event.policy}: {o.detail}", err=True)
            else:
                acted = (acted + [_guard_line(o) for o in done])[-5:]
                text = render(snap, rates_hint=False) + "".join(line + "\n" for line in acted)
                if sys.stdout.isatty():
                    size = shutil.get_terminal_size()
                    text = fit_screen(text, size.lines, size.columns)
                write_control(sys.stdout, CLEAR)
                sys.stdout.write(text)
                sys.stdout.flush()
            await until_stop(asyncio.sleep(max(0.0, seconds - (time.monotonic() - started))))
    stopped.cancel()


class _Progress:
    """The first scan's progress on one line of stderr while a terminal shows it, erased when the
    refresh returns: ``gpu-box: ~1,369,600 responses in 8 datasets; scanning 3/8 files, ...``."""

    def __init__(self) -> None:
        self.shown = False

    def __call__(self, snap: Snapshot) -> None:
        parts = []
        for h in snap.hosts:
            p = h.progress
            if p is None:
                continue
            counted = [d for r in h.runs for d in r.datasets if d.provisional]
            lines = display.provisional(sum(d.records for d in counted))
            scan = display.scanning(p.files_done, p.files_total, p.bytes_done, p.bytes_total)
            parts.append(f"{h.name}: {lines} responses in {len(counted)} datasets; {scan}")
        if parts:
            write_control(sys.stderr, "\r")
            sys.stderr.write("; ".join(parts)[: shutil.get_terminal_size().columns - 1])
            write_control(sys.stderr, "\x1b[K")
            sys.stderr.flush()
            self.shown = True

    def done(self) -> None:
        if self.shown:
            write_control(sys.stderr, "\r\x1b[K")
            sys.stderr.flush()
            self.shown = False


def _guard_line(outcome: Any) -> str:
    """One line for what the budget guard did (``GuardOutcome``)."""
    stamp = time.strftime("%H:%M:%S")
    mark = "" if outcome.ok else " (FAILED)"
    return f"{stamp} budget {outcome.event.policy}{mark}: {outcome.detail}"


@click.command()
@config_option
@json_option
@click.option(
    "--watch",
    "watch",
    type=Finite(min=0.1),
    default=None,
    metavar="SECONDS",
    help="Refresh every SECONDS until Ctrl-C, applying each run's budget policy.",
)
def status(config_path: str | None, as_json: bool, watch: float | None) -> None:
    """Runs and datasets of every host: responses, tokens, budget, rates, ETA, verdict."""
    import asyncio

    from supervisor.engine import run_sync

    config = get_config(config_path, need="hosts")
    if watch is not None:
        # Ctrl-C is how --watch ends: not an error.
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_watch(config, watch, as_json))
        return

    async def once(engine: Any) -> Snapshot:
        if not sys.stderr.isatty():
            snap: Snapshot = await engine.refresh()
            return snap
        progress = _Progress()
        try:
            snap = await engine.refresh(on_progress=progress)
        finally:
            progress.done()
        return snap

    snap = run_sync(config, once)
    if as_json:
        print_json(snap)
    else:
        sys.stdout.write(render(snap))
    if any(h.error for h in snap.hosts):
        sys.exit(1)
