"""The dashboard's body: one card per host, one card per run under it, each with its datasets."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from supervisor import display
from supervisor.model import HostView, RunView, Snapshot
from tui.widgets.dataset_table import DatasetTable, warning_text
from tui.widgets.serving import ServingPanel

_STATE_STYLE = {
    "running": "bold green",
    "pending": "cyan",
    "stopped": "yellow",
    "zombie": "red",
    "unknown": "dim",
    "ambiguous": "bold red",
}


def update_static(widget: Static, text: Text) -> None:
    """Show ``text`` in ``widget`` if it differs; lay out again only when its height may have
    changed: another number of lines, or another length of a text that wraps (a refresh that
    changes a number on a one-line header never re-lays out the screen)."""
    old = widget.content
    if isinstance(old, Text) and old == text:
        return
    relayout = (
        not isinstance(old, Text)
        or old.plain.count("\n") != text.plain.count("\n")
        or (not (old.no_wrap and text.no_wrap) and len(old.plain) != len(text.plain))
    )
    widget.update(text, layout=relayout)


def run_key(host: str, run: str) -> str:
    """The key naming a run across the app: ``host/run``."""
    return f"{host}/{run}"


def run_header(run: RunView, *, stale: bool) -> Text:
    """``eagle3-kimi  running  pid 4242  local  up 3 h 12 min  --max-samples 7,000 · no
    --token-budget``.

    The flags shown are those that decide when the run stops and how fast it goes.
    """
    dim = " dim" if stale else ""
    text = Text()
    text.append(run.name, style="bold" + dim)
    if not run.configured:
        text.append(" (not in config)", style="dim")
    text.append("  ")
    text.append(run.state_text, style=_STATE_STYLE.get(run.state, "") + dim)
    if run.candidates:
        text.append(f"  pids {', '.join(map(str, run.candidates))}", style="red" + dim)
    p = run.process
    if p is not None:
        text.append(f"  pid {p.identity.pid}", style=dim.strip())
        backend = p.flags.backend
        text.append(f"  {backend if backend != 'unknown' else '?'}", style="cyan" + dim)
        text.append(f"  up {display.duration(p.uptime_s)}", style=dim.strip())
        flags: list[tuple[str, str]] = []
        if p.flags.max_samples is not None:
            label = run.samples_flag or "samples"
            flags.append((f"{label} {display.count(p.flags.max_samples)}", ""))
        if p.flags.token_budget is not None:
            flags.append((f"--token-budget {display.compact(p.flags.token_budget)}", ""))
        elif run.budget_flag and any(d.token_budget for d in run.datasets):
            flags.append((f"no {run.budget_flag}", "bold yellow"))
        if p.flags.concurrency is not None:
            flags.append((f"--concurrency {p.flags.concurrency}", ""))
        if p.gpu_memory_mb:
            flags.append((f"GPU {display.mebibytes(p.gpu_memory_mb)}", ""))
        for i, (flag, style) in enumerate(flags):
            text.append("  " if i == 0 else " · ", style="dim")
            text.append(flag, style=(style + dim).strip())
    elif run.job is not None:
        from supervisor.engine import describe_job as describe

        text.append("  Slurm " + describe(run.job), style=dim.strip())
    elif run.state != "unknown":
        text.append("  no process writes these datasets", style="dim")
    if run.rates.tok_per_s is not None and run.state == "running":
        # The run's own window across its datasets, with its uncertainty.
        value, _, err = display.rate_pm(run.rates.tok_per_s, run.rates.tok_per_s_err).partition(" ")
        text.append(f"  {value}", style="bold" + dim)
        text.append(f" {err} tok/s" if err else " tok/s", style=dim.strip())
    if run.waste is not None:  # the whole waste of the run, not one dataset's
        text.append("\n  " + run.waste.message, style="bold yellow" + dim)
    return text


def host_header(host: HostView, now: float) -> Text:
    """``● gpu-box  connected  rtt 12 ms`` or ``○ gpu-box  lost  last ok 2 min ago: why``."""
    text = Text(no_wrap=True, overflow="ellipsis")
    if host.connected and not host.stale:
        text.append("● ", style="bold green")
        text.append(host.name, style="bold")
        text.append("  connected", style="green")
        if host.rtt_ms is not None:
            text.append(f"  rtt {display.latency(host.rtt_ms)}", style="dim")
        for note in host.notes:
            text.append(f"  {note}", style="yellow")
    else:
        text.append("○ ", style="bold red")
        text.append(host.name, style="bold")
        text.append("  disconnected", style="bold red")
        if host.stale:
            text.append("  STALE", style="reverse yellow")
        text.append(f"  last ok {display.ago(now, host.last_ok)}", style="dim")
        if host.error:
            text.append(f"  {host.error}", style="red")
    if host.progress is not None:
        p = host.progress
        text.append(
            f"  {display.scanning(p.files_done, p.files_total, p.bytes_done, p.bytes_total)}",
            style="yellow",
        )
    if host.has_gpu:
        text.append("  GPU", style="dim")
    runs = len(host.runs)
    text.append(f"  {runs} run{'s' if runs != 1 else ''}", style="dim")
    return text


class RunCard(Vertical):
    """A run: its header line, its dataset table and (on narrow screens) its warnings."""

    DEFAULT_CSS = """
    RunCard { height: auto; }
    RunCard > .run-header { height: auto; padding: 0 1; background: $boost; }
    RunCard > DatasetTable { height: auto; max-height: 24; overflow-x: hidden; }
    RunCard > .run-alerts { height: auto; padding: 0 1; color: $warning; }
    RunCard > .run-alerts.-empty { display: none; }
    """

    def __init__(self, host: str, run: RunView, *, stale: bool, wide: bool) -> None:
        self.run_key = run_key(host, run.name)
        super().__init__()
        self._run = run
        self._stale = stale
        self._wide = wide
        self._ready = False

    def compose(self) -> ComposeResult:
        yield Static(classes="run-header")
        yield DatasetTable(self.run_key)
        yield Static(classes="run-alerts")

    def on_mount(self) -> None:
        if not self.query_children(".run-header"):
            return  # removed (a newer view rebuilt its host) before its mount was handled
        self._ready = True
        self._apply()
        first = next(iter(self.screen.query(RunCard)), None)
        if self.screen.focused is None and first is self:
            # The first run on screen takes the focus, so the keys act on something at once.
            self.query_one(DatasetTable).focus(scroll_visible=False)

    @property
    def run(self) -> RunView:
        return self._run

    def show(self, run: RunView, *, stale: bool, wide: bool) -> None:
        self._run, self._stale, self._wide = run, stale, wide
        if self._ready:
            self._apply()

    def _apply(self) -> None:
        run = self._run
        update_static(self.query_one(".run-header", Static), run_header(run, stale=self._stale))
        self.query_one(DatasetTable).show(run, stale=self._stale, wide=self._wide)
        alerts = self.query_one(".run-alerts", Static)
        lines = (
            []
            if self._wide
            else [
                Text.assemble((f"{d.name}: ", "bold"), warning_text(d).removeprefix("⚠ "))
                for d in run.datasets
                if warning_text(d)
            ]
        )
        update_static(alerts, Text("\n").join([Text("⚠ ") + line for line in lines]))
        alerts.set_class(not lines, "-empty")


class HostCard(Vertical):
    """A host: its connection line, then its runs."""

    DEFAULT_CSS = """
    HostCard { height: auto; border-top: solid $primary; margin-bottom: 0; }
    HostCard.-stale { border-top: solid $error; }
    HostCard.-stale > RunCard { opacity: 70%; }
    HostCard > .host-header { height: 1; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    HostCard > .host-empty { color: $text-muted; padding: 0 2; height: 1; }
    """

    def __init__(self, host: HostView, now: float, *, wide: bool) -> None:
        super().__init__()
        self.host_name = host.name
        self._host = host
        self._now = now
        self._wide = wide
        self._ready = False

    def compose(self) -> ComposeResult:
        yield Static(classes="host-header")
        yield ServingPanel(classes="-empty")
        yield Static("no runs on this host", classes="host-empty")
        # The runs known now mount with the card (one layout pass, not two, at the first paint).
        for run in self._host.runs:
            yield RunCard(self.host_name, run, stale=self._host.stale, wide=self._wide)

    def on_mount(self) -> None:
        if not self.query_children(".host-header"):
            return  # removed before its mount was handled
        self._ready = True
        self._apply()

    def show(self, host: HostView, now: float, *, wide: bool) -> None:
        self._host, self._now, self._wide = host, now, wide
        if self._ready:
            self._apply()

    def _apply(self) -> None:
        host = self._host
        self.set_class(host.stale or not host.connected, "-stale")
        update_static(self.query_one(".host-header", Static), host_header(host, self._now))
        self.query_one(ServingPanel).show(host)
        self.query_one(".host-empty").display = not host.runs
        cards = {c.run_key: c for c in self.query_children(RunCard)}
        wanted = {run_key(host.name, r.name): r for r in host.runs}
        for key, card in cards.items():
            if key not in wanted:
                card.remove()
        for key, run in wanted.items():
            existing = cards.get(key)
            if existing is None:
                self.mount(RunCard(host.name, run, stale=host.stale, wide=self._wide))
            else:
                existing.show(run, stale=host.stale, wide=self._wide)


class Fleet(VerticalScroll, can_focus=False):
    """Every host of the snapshot, in config order."""

    DEFAULT_CSS = """
    Fleet { height: 1fr; }
    Fleet > .fleet-empty { color: $text-muted; padding: 1 2; }
    """

    def compose(self) -> ComposeResult:
        yield Static("Connecting to hosts…", classes="fleet-empty")

    def show(self, snapshot: Snapshot, *, wide: bool) -> None:
        """Render ``snapshot``, reusing the cards already on screen."""
        empty = self.query_one(".fleet-empty", Static)
        empty.display = not snapshot.hosts
        if not snapshot.hosts:
            empty.update("No hosts in the config.")
        cards = {c.host_name: c for c in self.query_children(HostCard)}
        wanted = {h.name: h for h in snapshot.hosts}
        for name, card in cards.items():
            if name not in wanted:
                card.remove()
        for name, host in wanted.items():
            existing = cards.get(name)
            if existing is None:
                self.mount(HostCard(host, snapshot.time, wide=wide))
            else:
                existing.show(host, snapshot.time, wide=wide)

    def run_cards(self) -> list[RunCard]:
        """Every run card, top to bottom."""
        return list(self.query(RunCard))
