"""A host's serving engines and GPUs: one line each, with a sparkline of its recent history.

The figures come from the engine (``HostView.endpoints`` from each local endpoint's ``/metrics``,
``HostView.gpus`` from nvidia-smi); nothing is computed here.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from supervisor import display
from supervisor.model import EndpointMetrics, GpuView, HostView, RunView


def _seconds(s: float | None) -> str:
    return display.latency(None if s is None else s * 1000)


def _fraction(f: float | None) -> str:
    return display.percent(None if f is None else f * 100)


def _files(em: EndpointMetrics, writing: bool) -> str:
    """``1,930 ± 290 tok/s (files)``: what the runs' data files measure."""
    tok = em.files_tok_per_s.value
    if tok is None:
        return "files: too few responses yet" if writing else "files: no run writing"
    return display.rate_pm(tok, em.files_tok_per_s_err or None, "tok/s (files)")


def endpoint_line(em: EndpointMetrics, *, writing: bool = True) -> Text:
    """``⚙ local (sglang)  running 16 · queued 3 · KV 25% · 2,160 tok/s (server) · 1,930 ±
    290 tok/s (files) · TTFT p50 300 ms p90 800 ms``; an API endpoint has its files' rate only.
    ``writing``: some run of the host that uses the endpoint is running."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append("⚙ ", style="cyan")
    text.append(em.name, style="bold")
    if em.kind != "local":
        text.append(f" ({em.kind})", style="dim")
        text.append("  " + _files(em, writing))
        return text
    if not em.available:
        text.append("  " + _files(em, writing))
        text.append(f" · metrics: {em.why or 'not available'}", style="dim yellow")
        return text
    text.append(f" ({em.engine})", style="dim")

    parts = [
        f"running {display.count(em.running.value)}",
        f"queued {display.count(em.queued.value)}",
    ]
    if em.kv_usage.value is not None:
        parts.append(f"KV {_fraction(em.kv_usage.value)}")
    gen = em.gen_tok_per_s.value
    parts.append(f"{display.rate(gen)} tok/s (server)" if gen is not None else "tok/s: second look")
    parts.append(_files(em, writing))
    if em.ttft_p50_s is not None:
        parts.append(f"TTFT p50 {_seconds(em.ttft_p50_s)} p90 {_seconds(em.ttft_p90_s)}")
    text.append("  " + " · ".join(parts))
    if em.note:
        text.append(f" · {em.note}", style="dim yellow")
    return text


def gpu_line(gpu: GpuView) -> Text:
    """``GPU0 97% · 70 GiB/80 GiB · 612 W · 71°C  eagle3``."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"GPU{gpu.index if gpu.index is not None else '?'} ", style="bold")
    util = gpu.utilization_pct
    text.append(display.percent(util), style="green" if util else "dim")
    parts = []
    if gpu.memory_used_mb is not None and gpu.memory_total_mb is not None:
        parts.append(
            f"{display.mebibytes(gpu.memory_used_mb)}/{display.mebibytes(gpu.memory_total_mb)}"
        )
    if gpu.power_w is not None:
        parts.append(f"{display.count(gpu.power_w)} W")
    if gpu.temperature_c is not None:
        parts.append(f"{gpu.temperature_c:.0f}°C")
    if parts:
        text.append(" · " + " · ".join(parts), style="dim")
    if gpu.runs:
        text.append("  " + ", ".join(gpu.runs), style="cyan")
    return text


class FigureRow(Horizontal):
    """One line of text and, beside it, a sparkline of its history."""

    DEFAULT_CSS = """
    FigureRow { height: 1; padding: 0 1; }
    FigureRow > Static { width: 1fr; height: 1; }
    FigureRow > Sparkline { width: 24; height: 1; }
    """

    def __init__(self, key: str, text: Text, history: list[float]) -> None:
        super().__init__()
        self.key = key
        self._text, self._history = text, history
        self._ready = False

    def compose(self) -> ComposeResult:
        yield Static()
        yield Sparkline([])

    def on_mount(self) -> None:
        if not self.query_children(Sparkline):
            return  # removed before its mount was handled
        self._ready = True
        self._apply()

    def show(self, text: Text, history: list[float]) -> None:
        self._text, self._history = text, history
        if self._ready:
            self._apply()

    def _apply(self) -> None:
        self.query_one(Static).update(self._text)
        self.query_one(Sparkline).data = list(self._history)


class ServingPanel(Vertical):
    """The host's local serving engines, then its GPUs; hidden when it has neither."""

    DEFAULT_CSS = """
    ServingPanel { height: auto; }
    ServingPanel.-empty { display: none; }
    """

    def show(self, host: HostView) -> None:
        running = {r.endpoint for r in host.runs if r.state == "running"}
        rows: list[tuple[str, Text, list[float]]] = [
            (
                f"ep-{em.name}",
                endpoint_line(em, writing=em.name in running),
                em.gen_tok_per_s.history if em.available else em.files_tok_per_s.history,
            )
            for em in host.endpoints
        ]
        rows += [(f"gpu-{g.uuid or g.index}", gpu_line(g), g.history) for g in host.gpus]
        self.set_class(not rows, "-empty")
        existing = {r.key: r for r in self.query_children(FigureRow)}
        wanted = {k for k, _t, _h in rows}
        for key, old in existing.items():
            if key not in wanted:
                old.remove()
        for key, text, history in rows:
            found = existing.get(key)
            if found is None:
                self.mount(FigureRow(key, text, history))
            else:
                found.show(text, history)


def plot_series(host: HostView, run: RunView) -> list[tuple[str, str, list[float]]]:
    """The run's series over time: ``(label, latest value, history)`` for its tok/s, then its
    endpoint's running and queued requests and KV use, then the utilisation of the GPUs its
    processes hold (every GPU of the host when none is known to be its)."""
    series: list[tuple[str, str, list[float]]] = []
    series.append(("tok/s (files)", display.rate(run.rates.tok_per_s), run.history))
    for em in host.endpoints:
        if em.name != run.endpoint:
            continue
        series.append(
            ("tok/s (server)", display.rate(em.gen_tok_per_s.value), em.gen_tok_per_s.history)
        )
        series.append(("running", display.count(em.running.value), em.running.history))
        series.append(("queued", display.count(em.queued.value), em.queued.history))
        series.append(("KV use", _fraction(em.kv_usage.value), em.kv_usage.history))
    gpus = [g for g in host.gpus if run.name in g.runs] or host.gpus
    for g in gpus:
        series.append((f"GPU{g.index} util", display.percent(g.utilization_pct), g.history))
    return series


class RunPlot(Vertical):
    """Sparklines of a run's series over the last hours, one labelled row each."""

    DEFAULT_CSS = """
    RunPlot { height: auto; padding: 0 1; }
    RunPlot > FigureRow { height: 2; padding: 0; }
    RunPlot > FigureRow > Static { width: 28; height: 2; }
    RunPlot > FigureRow > Sparkline { width: 1fr; height: 2; }
    """

    def show(self, host: HostView, run: RunView) -> None:
        rows = plot_series(host, run)
        existing = list(self.query_children(FigureRow))
        if [r.key for r in existing] != [label for label, _v, _h in rows]:
            self.remove_children()
            self.mount_all(
                FigureRow(label, self._label(label, value), history)
                for label, value, history in rows
            )
            return
        for row, (label, value, history) in zip(existing, rows, strict=True):
            row.show(self._label(label, value), history)

    @staticmethod
    def _label(label: str, value: str) -> Text:
        return Text.assemble((f"{label:<15}", "bold"), (f"{value:>10}", "cyan"))
