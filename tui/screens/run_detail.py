"""One run in full: process, argv (secrets masked), children, GPU, datasets, live log, samples,
and its history (tok/s, the serving engine's running/queued requests and KV use, GPU use)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Log, Static, TabbedContent, TabPane

from supervisor import display
from supervisor.model import DatasetView, HostView, RunView
from tui.messages import LogTailRead, SamplesRead
from tui.widgets.dataset_table import warning_text
from tui.widgets.fleet import host_header, run_header
from tui.widgets.format import plain
from tui.widgets.serving import RunPlot

if TYPE_CHECKING:
    from tui.app import RunwatchApp

LOG_LINES = 200
SAMPLES = 3
SAMPLE_EVERY = 5
"""Refresh the samples every this many log polls while their tab is open."""


def process_table(run: RunView) -> Table:
    """Process facts: pid, user, uptime, CPU, RSS, GPU memory, cwd, children, full argv."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim", no_wrap=True)
    table.add_column(overflow="fold")
    p = run.process
    if p is None:
        known = run.state != "unknown"
        table.add_row(
            "process",
            Text("none: no process writes this run's datasets", style="yellow")
            if known
            else plain(f"unknown: {run.state_detail or 'not listed yet'}", style="dim"),
        )
        if run.last_unit is not None and run.ending is not None:
            table.add_row("last launch", plain(f"{run.state_detail or run.ending}"))
        return table
    table.add_row("pid", Text(f"{p.identity.pid}", style="bold"))
    if run.held_by is not None:
        unit = f"  unit {p.unit.launch_id}" if p.unit is not None else ""
        table.add_row("held by", plain(f"{run.held_by}{unit}"))
    if run.owner is not None:  # another run's unit writes these files: that config acts
        table.add_row(
            "owner", plain(run.owner.held_text(p.identity.pid) + run.owner.owner(), style="yellow")
        )
    table.add_row("user", plain(f"{p.user} (uid {p.identity.uid})"))
    table.add_row("uptime", display.duration(p.uptime_s))
    table.add_row("cpu / rss", f"{display.percent(p.cpu_percent)}  {display.mebibytes(p.rss_mb)}")
    gpu = (
        "no nvidia-smi on the host"
        if p.gpu_memory_mb is None
        else display.mebibytes(p.gpu_memory_mb)
    )
    table.add_row("GPU memory", gpu)
    table.add_row(
        "backend",
        plain(f"{p.flags.backend}" + (f"  {p.flags.api_base}" if p.flags.api_base else "")),
    )
    if p.flags.model:
        table.add_row("model", plain(p.flags.model))
    table.add_row("cwd", plain(p.cwd or "-"))
    kids = ", ".join(str(c) for c in p.children) or "none"
    table.add_row("children", f"{len(p.children)}: {kids}" if p.children else kids)
    table.add_row(
        "argv", plain(display.command_line(p.argv_masked or list(p.identity.argv)), style="bold")
    )
    return table


DETAIL_COLUMNS = (
    "Dataset", "Records", "Completion", "Budget", "Format", "tok/s 1m", "10m", "all", "req/s 1m",
    "ETA", "Stops at", "Left", "Unique", "Dup", "Prompt", "Finish reasons", "Bad", "Tail B",
)  # fmt: skip


def detail_row(ds: DatasetView) -> list[Text]:
    """Every number of one dataset, for the detail table (in DETAIL_COLUMNS order)."""

    def r(v: str) -> Text:
        return Text(v, justify="right")

    reasons = (
        ", ".join(f"{k} {display.count(v)}" for k, v in sorted(ds.finish_reasons.items())) or "-"
    )
    pr = ds.projection
    return [
        Text(ds.name, style="bold red" if ds.over_budget else "bold"),
        r(
            display.count(ds.records)
            + (f"/{display.count(ds.max_samples)}" if ds.max_samples else "")
        ),
        r(display.compact(ds.completion_tokens)),
        r(display.compact(ds.token_budget)),
        Text(ds.verdict, style="green" if ds.verdict == "current" else "bold red"),
        r(display.rate(ds.rates.tok_per_s_1m)),
        r(display.rate(ds.rates.tok_per_s_10m)),
        r(display.rate(ds.rates.tok_per_s_all)),
        r(display.rate(ds.rates.req_per_s_1m)),
        r(display.eta(pr.eta_s)),
        Text(pr.stop_reason or "-"),
        r(display.compact(pr.remaining_tokens)),
        r(display.count(ds.unique_ids)),
        r(display.count(ds.duplicates)),
        r(display.compact(ds.prompt_tokens)),
        Text(reasons),
        r(display.count(ds.bad_lines)),
        r(display.count(ds.partial_tail_bytes)),
    ]


def notes(run: RunView) -> Text:
    """Per dataset: its file, then anything worth reading (warnings, projection, format details)."""
    text = Text()
    for ds in run.datasets:
        text.append(f"{ds.name:<8}", style="bold")
        text.append(f"{ds.path}\n", style="dim")
        warn = warning_text(ds)
        if warn:
            text.append(f"        {warn}\n", style="bold red" if ds.over_budget else "yellow")
        elif ds.projection.message:
            text.append(f"        {ds.projection.message}\n")
        if ds.torn_tail:
            text.append(f"        {ds.torn_tail}\n", style="yellow")
        if ds.verdict_detail and ds.verdict_detail not in warn:
            text.append(f"        {ds.verdict_detail}\n", style="dim")
    return text


class RunDetailScreen(Screen[None]):
    """Everything about one run; keeps following the refreshes and the log while open."""

    CSS_PATH = "run_detail.tcss"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("k", "kill", "Kill"),
        Binding("R", "restart", "Restart"),
        Binding("L", "launch", "Launch"),
        Binding("1", "tab('overview')", "Overview", show=False),
        Binding("2", "tab('log')", "Log", show=False),
        Binding("3", "tab('samples')", "Samples", show=False),
        Binding("4", "tab('history')", "History", show=False),
        Binding("f", "toggle_follow", "Follow log"),
        Binding("s", "next_dataset", "Next sample set", tooltip="Preview another dataset"),
    ]

    def __init__(self, key: str, dataset: str | None = None) -> None:
        super().__init__()
        self.key = key
        """``host/run`` of the run shown."""
        self.follow = True
        """The log view scrolls to new lines as they arrive."""
        self.sample_dataset: str | None = dataset
        """The dataset whose samples are previewed (the one chosen on the dashboard)."""
        self._last_log: list[str] = []
        self._ticks = 0
        self._samples_started = False

    @property
    def rw(self) -> RunwatchApp:
        from tui.app import runwatch_app

        return runwatch_app(self.app)

    def selected_run(self) -> str:
        return self.key

    def compose(self) -> ComposeResult:
        yield Static(id="host-line")
        yield Static(id="run-line")
        with TabbedContent(initial="overview"):
            with TabPane("Overview [1]", id="overview"), VerticalScroll():
                yield Static(id="process")
                yield DataTable(id="datasets", cursor_type="row", zebra_stripes=True)
                yield Static(id="notes")
            with TabPane("Log [2]", id="log"):
                yield Static(id="log-status")
                yield Log(id="log-view", max_lines=2000)
            with TabPane("Samples [3]", id="samples"), VerticalScroll():
                yield Static(id="samples-status")
                yield Static(id="samples-view")
            with TabPane("History [4]", id="history"), VerticalScroll():
                yield RunPlot(id="plot")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#datasets", DataTable)
        for label in DETAIL_COLUMNS:
            table.add_column(label, key=label)
        self.watch(self.rw, "snapshot", self._on_snapshot)
        self._timer = self.set_interval(self.rw.refresh_seconds, self._poll_log)
        self._poll_log()

    def _found(self) -> tuple[HostView, RunView] | None:
        return self.rw.find_run(self.key)

    def _on_snapshot(self, _snapshot: object) -> None:
        found = self._found()
        if found is None:
            self.query_one("#run-line", Static).update(
                Text(f"{self.key}: no longer seen", style="red")
            )
            return
        host, run = found
        now = self.rw.snapshot.time if self.rw.snapshot else 0.0
        self.query_one("#host-line", Static).update(host_header(host, now))
        self.query_one("#run-line", Static).update(run_header(run, stale=host.stale))
        self.query_one("#process", Static).update(process_table(run))
        table = self.query_one("#datasets", DataTable)
        names = [d.name for d in run.datasets]
        if [str(k.value) for k in table.rows] != names:
            table.clear()
            for ds in run.datasets:
                table.add_row(*detail_row(ds), key=ds.name)
        else:
            for ds in run.datasets:
                for label, value in zip(DETAIL_COLUMNS, detail_row(ds), strict=True):
                    table.update_cell(ds.name, label, value)
        self.query_one("#notes", Static).update(notes(run))
        self.query_one(RunPlot).show(host, run)
        if not self._samples_started and run.datasets:
            self._samples_started = True
            if self.sample_dataset not in names:
                self.sample_dataset = run.datasets[0].name
            self._load_samples()

    # ------------------------------------------------------------------ log

    def _poll_log(self) -> None:
        found = self._found()
        if found is not None:
            self._read_log(found[0].name, found[1].name)
        # The samples shown follow the data too, while their tab is open.
        self._ticks += 1
        if self._ticks % SAMPLE_EVERY == 0 and self.query_one(TabbedContent).active == "samples":
            self._load_samples(quiet=True)

    @work(exclusive=True, group="log", exit_on_error=False)
    async def _read_log(self, host: str, run: str) -> None:
        from tui.sources import read_log_tail

        try:
            lines = await read_log_tail(self.rw.engine, host, run, LOG_LINES)
        except Exception as e:  # shown in the log tab; the next poll tries again
            self.post_message(LogTailRead(run, [], f"{type(e).__name__}: {e}"))
        else:
            self.post_message(LogTailRead(run, lines))

    def on_log_tail_read(self, message: LogTailRead) -> None:
        status = self.query_one("#log-status", Static)
        if message.error is not None:
            status.update(Text(message.error, style="red"))
            return
        status.update(
            Text(
                f"last {len(message.lines)} lines, "
                + ("following" if self.follow else "paused (f)"),
                style="dim",
            )
        )
        if message.lines == self._last_log:
            return
        view = self.query_one("#log-view", Log)
        old = self._last_log
        # Append only what is new when the old tail is still visible; otherwise start over.
        overlap = 0
        if old and message.lines:
            for k in range(min(len(old), len(message.lines)), 0, -1):
                if old[-k:] == message.lines[:k]:
                    overlap = k
                    break
        if overlap:
            view.write_lines(message.lines[overlap:], scroll_end=self.follow)
        else:
            view.clear()
            view.write_lines(message.lines, scroll_end=self.follow)
        self._last_log = list(message.lines)

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        view = self.query_one("#log-view", Log)
        view.auto_scroll = self.follow
        if self.follow:
            view.scroll_end(animate=False)
        self.notify("Following the log." if self.follow else "Log paused.", timeout=2)

    # ------------------------------------------------------------------ samples

    def action_next_dataset(self) -> None:
        found = self._found()
        if found is None or not found[1].datasets:
            return
        names = [d.name for d in found[1].datasets]
        i = names.index(self.sample_dataset) + 1 if self.sample_dataset in names else 0
        self.sample_dataset = names[i % len(names)]
        self.action_tab("samples")
        self._load_samples()

    def _load_samples(self, quiet: bool = False) -> None:
        found = self._found()
        if found is None or self.sample_dataset is None:
            return
        ds = next((d for d in found[1].datasets if d.name == self.sample_dataset), None)
        if ds is not None:
            if not quiet:
                self.query_one("#samples-status", Static).update(
                    Text(f"{ds.name}: reading the latest samples…", style="dim")
                )
            self._read_samples(found[1], ds.name)

    @work(exclusive=True, group="samples", exit_on_error=False)
    async def _read_samples(self, run: RunView, dataset: str) -> None:
        from tui.sources import read_samples

        try:
            samples = await read_samples(self.rw.engine, run, dataset, SAMPLES)
        except Exception as e:  # shown in the samples tab
            self.post_message(SamplesRead(run.name, dataset, [], f"{type(e).__name__}: {e}"))
        else:
            self.post_message(SamplesRead(run.name, dataset, samples))

    def on_samples_read(self, message: SamplesRead) -> None:
        status = self.query_one("#samples-status", Static)
        view = self.query_one("#samples-view", Static)
        if message.error is not None:
            status.update(Text(f"{message.dataset}: {message.error}", style="red"))
            view.update("")
            return
        status.update(
            Text(
                f"{message.dataset}: latest {len(message.samples)} samples (s: next dataset)",
                style="dim",
            )
        )
        body = Text()
        for i, sample in enumerate(message.samples):
            if i:
                body.append("\n" + "─" * 40 + "\n", style="dim")
            body.append(sample)
        view.update(body)

    # ------------------------------------------------------------------ actions

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "samples":
            self._load_samples(quiet=True)

    def action_kill(self) -> None:
        self.rw.action_kill(self.key)

    def action_restart(self) -> None:
        self.rw.action_restart(self.key)

    def action_launch(self) -> None:
        self.rw.action_launch(self.key)

    def on_unmount(self) -> None:
        self._timer.stop()
