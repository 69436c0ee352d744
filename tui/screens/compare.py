"""Local GPUs vs API: time and cost to finish each dataset on each endpoint; run a bench.

The comparison is recomputed from every refresh (live rates of the running runs) and from the bench
history; a bench started here shows its progress and lands in the same history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Input, Label, ProgressBar, Select, Static

from supervisor import display
from supervisor.engine import BenchResult, Comparison
from tui.messages import BenchFinished, BenchProgressed
from tui.screens.confirm import ConfirmScreen
from tui.widgets.format import error_text

if TYPE_CHECKING:
    from supervisor.engine import Rebalance
    from supervisor.model import Snapshot
    from tui.app import RunwatchApp

DEFAULT_REQUESTS = 20


def move_aside_text(on: bool) -> str:
    """The plan row's note of the move-aside toggle (``m``)."""
    return f" move aside (m): {'on' if on else 'off'} "


def sources_text(comparison: Comparison) -> Text:
    """Where each endpoint's numbers come from (live rate, bench, price table), and what was
    left out of the comparison and why."""
    from supervisor.engine import format_lines

    text = Text()
    for name, why in comparison.skipped.items():
        text.append(f"{name}: not compared, {why}\n", style="dim")
    lines = format_lines(comparison)
    marker = "where the numbers come from:"
    if marker in lines:
        text.append(marker + "\n", style="bold")
        for line in lines[lines.index(marker) + 1 :]:
            text.append(line + "\n")
    return text


class TableLayout:
    """The comparison as one table: headers and rows of cells."""

    def __init__(self, headers: list[Text], rows: list[list[Text]]) -> None:
        self.headers = headers
        self.rows = rows
        self.header_height = max(len(h.plain.split("\n")) for h in headers)

    def width(self) -> int:
        """Cells the table takes: each column as wide as its widest line, plus its padding."""
        widest = [
            max(
                [
                    *(cell_len(line) for line in h.plain.split("\n")),
                    *(r[i].cell_len for r in self.rows),
                ]
            )
            for i, h in enumerate(self.headers)
        ]
        return sum(w + 2 for w in widest)


def table_layouts(comparison: Comparison) -> list[TableLayout]:
    """The table from the widest layout to the narrowest; the screen shows the first that fits.

    Full: ``<endpoint> time`` and ``<endpoint> cost`` headers, what ends each dataset. Compact:
    the endpoint's name over ``time``/``cost`` on two header lines, ``budget``/``samples`` for
    what ends it. Narrowest: the compact one without the "Ends at"
    column (the answer line above the table still says it all).
    """
    endpoints = [r.endpoint for r in comparison.rates]
    short_bound = {"token_budget": "budget", "max_samples": "samples"}

    def build(compact: bool, bound: bool) -> TableLayout:
        headers = [Text("Dataset"), Text("Left", justify="right")]
        if bound:
            headers.append(Text("Ends at"))
        for name in endpoints:
            for what in ("time", "cost"):
                label = f"{name}\n{what}" if compact else f"{name} {what}"
                headers.append(Text(label, justify="right"))

        def cells(estimates: list[Any]) -> list[Text]:
            by = {e.endpoint: e for e in estimates}
            out: list[Text] = []
            for name in endpoints:
                e = by.get(name)
                cost = display.money(e.cost_usd) if e else "?"
                out.append(Text(display.duration(e.seconds) if e else "?", justify="right"))
                out.append(Text(cost, justify="right"))
            return out

        rows: list[list[Text]] = []
        for d in comparison.datasets:
            w = d.work
            row = [
                Text(w.dataset, style="bold"),
                Text(display.compact(w.remaining_tokens), justify="right"),
            ]
            if bound:
                row.append(Text(short_bound.get(w.bound, w.bound) if compact else w.bound))
            rows.append(row + cells(d.estimates))
        if comparison.datasets:
            rows.append([Text("all", style="bold"), Text(""), *([Text("")] if bound else []),
                         *cells(comparison.totals)])  # fmt: skip
        return TableLayout(headers, rows)

    return [build(False, True), build(True, True), build(True, False)]


class CompareScreen(Screen[None]):
    """The comparison table, its sources, and a bench with a progress bar."""

    CSS_PATH = "compare.tcss"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("b", "bench", "Bench", tooltip="Measure the selected endpoint now"),
        Binding("p", "plan", "Plan", tooltip="Split the datasets left to finish by the deadline"),
        Binding("a", "apply", "Apply plan", tooltip="Carry the plan out, after confirmation"),
        Binding(
            "m",
            "move_aside",
            "Move aside",
            show=False,  # the plan row shows it and its state; the footer keeps Quit at 80 cols
            tooltip="Plan with --move-aside (on/off): a run may restart over data of an earlier "
            "format by renaming that data aside (nothing is deleted; the dataset starts afresh)",
        ),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.history: list[BenchResult] | None = None
        """Bench results from the history file (None until read)."""
        self.comparison: Comparison | None = None
        self.bench_result: BenchResult | None = None
        self.benching = False
        self.rebalance: Rebalance | None = None
        self.applying = False
        self.move_aside = False
        """The plan may rename data of an earlier format aside (``rebalance --move-aside``)."""

    @property
    def rw(self) -> RunwatchApp:
        from tui.app import runwatch_app

        return runwatch_app(self.app)

    def compose(self) -> ComposeResult:
        endpoints = [(f"{e.name} ({e.kind})", e.name) for e in self.rw.config.endpoints]
        yield Static(Text("Where should the rest of the work run?", style="bold"), id="title")
        with VerticalScroll(id="body"):
            yield Static(id="answer")
            yield DataTable(id="table", cursor_type="row", zebra_stripes=True)
            yield Static(id="sources")
            with Horizontal(id="bench-row"):
                yield Select(
                    endpoints,
                    value=endpoints[0][1] if endpoints else Select.NULL,
                    allow_blank=not endpoints,
                    id="endpoint",
                    compact=True,
                )
                yield Label(" requests ", id="requests-label")
                yield Input(str(DEFAULT_REQUESTS), type="integer", id="requests", compact=True)
                yield Button("Bench", id="bench", variant="primary", compact=True)
            yield ProgressBar(id="progress", show_eta=False)
            yield Static(id="bench-result")
            with Horizontal(id="plan-row"):
                yield Label("finish within ", id="by-label")
                yield Input(placeholder="45m", id="by", compact=True)
                yield Label(" at most $ ", id="usd-label")
                yield Input(placeholder="none", type="number", id="max-usd", compact=True)
                yield Button("Plan", id="plan", compact=True)
                yield Label(move_aside_text(False), id="move-aside")
                yield Button("Apply", id="apply", variant="warning", compact=True, disabled=True)
            yield Static(id="plan-text")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#progress", ProgressBar).display = False
        self.watch(self.rw, "snapshot", self._recompute)
        self._load_history()

    @work(exclusive=True, group="history", exit_on_error=False)
    async def _load_history(self) -> None:
        import asyncio

        from supervisor.engine import load_history

        history = await asyncio.to_thread(load_history)
        self.history = history
        self._recompute(None)

    def _recompute(self, _snapshot: object) -> None:
        from supervisor.engine import comparison_from

        snapshot = self.rw.snapshot
        if snapshot is None or self.history is None:
            self.query_one("#answer", Static).update(Text("Gathering rates…", style="dim"))
            return
        self.comparison = comparison = comparison_from(self.rw.config, snapshot, self.history)
        answer = Text()
        if comparison.answer:
            answer.append(comparison.answer, style="bold")
        if not comparison.rates:
            answer.append(
                "Nothing to compare: no endpoint in the config (add [[endpoints]] and name one "
                "in each run's endpoint =).",
                style="yellow",
            )
        elif not comparison.datasets:
            answer.append("Nothing to compare: no dataset has budget left.", style="yellow")
        self.query_one("#answer", Static).update(answer)
        self._show_table()
        self.query_one("#sources", Static).update(sources_text(comparison))
        progress = snapshot.plan
        if progress is not None and self.rebalance is None:
            style = "bold red" if progress.will_miss else ""
            self.query_one("#plan-text", Static).update(Text(progress.text, style=style))

    def on_resize(self) -> None:
        self._show_table()

    def _show_table(self) -> None:
        """The comparison table in the first layout of :func:`table_layouts` that fits."""
        comparison = self.comparison
        if comparison is None:
            return
        # Room for the table: the body's padding and both scrollbars (body and table) taken off.
        room = self.app.size.width - 6
        for layout in table_layouts(comparison):
            if layout.width() <= room:
                break
        table = self.query_one("#table", DataTable)
        table.clear(columns=True)
        table.header_height = layout.header_height
        for i, header in enumerate(layout.headers):
            table.add_column(header, key=str(i))
        for row in layout.rows:
            table.add_row(*row)

    # ------------------------------------------------------------------ bench

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "bench":
            self.action_bench()
        elif event.button.id == "plan":
            self.action_plan()
        elif event.button.id == "apply":
            self.action_apply()

    # ------------------------------------------------------------------ rebalance

    def action_move_aside(self) -> None:
        """Plan with or without moving data of an earlier format aside; a plan made the other
        way is dropped (it cannot be applied as it was not made)."""
        self.move_aside = not self.move_aside
        self.query_one("#move-aside", Label).update(move_aside_text(self.move_aside))
        if self.rebalance is not None and not self.applying:
            self.rebalance = None
            self.query_one("#apply", Button).disabled = True
            self.query_one("#plan-text", Static).update(
                Text("Move aside changed: plan again (p).", style="dim")
            )

    def action_plan(self) -> None:
        """The split of the datasets left between the runs' endpoints, from what is shown,
        each of its starts checked by the gate (dry) before it is shown."""
        from supervisor.engine import parse_deadline
        from supervisor.errors import RunwatchError

        snapshot, comparison = self.rw.snapshot, self.comparison
        if snapshot is None or comparison is None:
            self.notify("No rates yet: wait for a refresh.", severity="warning")
            return
        by = self.query_one("#by", Input).value.strip()
        usd = self.query_one("#max-usd", Input).value.strip()
        try:
            deadline = parse_deadline(by) if by else None
            cap = float(usd) if usd else None
        except (RunwatchError, ValueError) as e:
            self.notify(str(e), severity="error")
            return
        self.query_one("#apply", Button).disabled = True
        self.query_one("#plan-text", Static).update(
            Text("Checking the plan's starts…", style="dim")
        )
        self._plan(snapshot, comparison, deadline, cap, self.move_aside)

    @work(exclusive=True, group="plan", exit_on_error=False)
    async def _plan(
        self,
        snapshot: Snapshot,
        comparison: Comparison,
        deadline: float | None,
        cap: float | None,
        move_aside: bool,
    ) -> None:
        from supervisor.engine import describe_rebalance, plan_rebalance

        try:
            result = await plan_rebalance(
                self.rw.config,
                self.rw.engine,
                snapshot,
                comparison,
                deadline_s=deadline,
                max_usd=cap,
                move_aside=move_aside,
            )
        except Exception as e:  # shown on the screen, never lost
            self.query_one("#plan-text", Static).update(
                Text(f"FAILED: {error_text(e)}", style="bold red")
            )
            return
        if self.applying:
            return
        self.rebalance = result
        refused = result.refused is not None
        misses = result.plan is not None and result.plan.meets_deadline is False
        self.query_one("#apply", Button).disabled = refused or misses or not result.steps
        text = "\n".join(describe_rebalance(result))
        self.query_one("#plan-text", Static).update(Text(text, style="yellow" if refused else ""))

    def action_apply(self) -> None:
        result = self.rebalance
        if result is None or result.refused is not None or not result.steps:
            self.notify("Make a plan first (p), with steps to carry out.", severity="warning")
            return
        if self.applying:
            self.notify("The plan is being applied.", severity="warning")
            return
        from supervisor.engine import describe_rebalance

        steps = [ln for ln in describe_rebalance(result) if ln.startswith("  ") and ". " in ln]
        question = (
            "Apply this plan? Each step passes the start checks; the runs that give datasets "
            "away stop first; a failed step rolls back those before it.\n\n" + "\n".join(steps)
        )
        self.app.push_screen(ConfirmScreen(question, "Apply"), self._apply_confirmed)

    def _apply_confirmed(self, ok: bool | None) -> None:
        if ok and self.rebalance is not None:
            self.applying = True
            self.query_one("#apply", Button).disabled = True
            self.query_one("#plan-text", Static).update(Text("Applying the plan…", style="yellow"))
            self._apply(self.rebalance)

    @work(exclusive=True, group="rebalance", exit_on_error=False)
    async def _apply(self, result: Rebalance) -> None:
        from supervisor.engine import apply_rebalance, hold_plan_lock

        lines: list[str] = []
        try:
            # One apply at a time per config, from any front end (a second one refuses).
            with hold_plan_lock(self.rw.config, "rebalance --apply (dashboard)"):
                outcomes = await apply_rebalance(self.rw.engine, result, on_step=lines.append)
        except Exception as e:  # shown on the screen, never lost
            lines.append(f"FAILED: {error_text(e)}")
            outcomes = []
        ok = bool(outcomes) and all(o.ok for o in outcomes)
        self.applying = False
        self.rebalance = None
        self.query_one("#plan-text", Static).update(
            Text("\n".join(lines), style="green" if ok else "bold red")
        )
        self.notify(
            "Plan applied." if ok else "Plan NOT applied.",
            severity="information" if ok else "error",
        )

    def action_bench(self) -> None:
        if self.benching:
            self.notify("A bench is already running.", severity="warning")
            return
        endpoint = self.query_one("#endpoint", Select).value
        if not isinstance(endpoint, str):
            self.notify("No endpoint in the config to bench.", severity="warning")
            return
        try:
            requests = int(self.query_one("#requests", Input).value)
        except ValueError:
            requests = 0
        if requests < 1:
            self.notify("Requests must be a positive number.", severity="error")
            return
        self.benching = True
        self.query_one("#bench", Button).disabled = True
        bar = self.query_one("#progress", ProgressBar)
        bar.display = True
        bar.update(total=None, progress=0)
        self.query_one("#bench-result", Static).update(
            Text(f"Benching {endpoint} with {requests} requests…", style="yellow")
        )
        self._bench(endpoint, requests)

    @work(exclusive=True, group="bench", exit_on_error=False)
    async def _bench(self, endpoint: str, requests: int) -> None:
        import asyncio

        from supervisor.engine import BenchOptions
        from supervisor.engine import bench as run_bench

        config = self.rw.config
        tokenizer = None

        def progress(done: int, total: int) -> None:
            self.post_message(BenchProgressed(done, total))

        try:
            if config.tokenizer:
                from supervisor.engine import load_tokenizer

                # Loading a tokenizer takes a moment: off the event loop.
                tokenizer = await asyncio.to_thread(
                    load_tokenizer, config.tokenizer, config.trust_remote_code
                )
            result = await run_bench(
                config,
                endpoint,
                options=BenchOptions(requests=requests),
                progress=progress,
                tokenizer=tokenizer,
            )
        except Exception as e:  # shown under the bench controls
            self.post_message(BenchFinished(None, error_text(e)))
        else:
            self.post_message(BenchFinished(result))

    def on_bench_progressed(self, message: BenchProgressed) -> None:
        self.query_one("#progress", ProgressBar).update(total=message.total, progress=message.done)

    def on_bench_finished(self, message: BenchFinished) -> None:
        message.stop()
        self.benching = False
        self.query_one("#bench", Button).disabled = False
        out = self.query_one("#bench-result", Static)
        if message.error is not None:
            self.query_one("#progress", ProgressBar).display = False
            out.update(Text(f"Bench failed: {message.error}", style="bold red"))
            return
        self.bench_result = result = message.result
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=1, progress=1)
        lines = Text()
        for lv in result.levels:
            failed = sum(lv.failed.values())
            lines.append(
                f"{result.endpoint} c={lv.concurrency}: {display.count(lv.completed)}/"
                f"{display.count(lv.requests)} done, "
                f"{display.rate(lv.output_tok_per_s, 'output tok/s')}, "
                f"{display.rate(lv.req_per_s, 'req/s')}"
                + (f", {failed} failed attempts" if failed else "")
                + "\n",
                style="green",
            )
        out.update(lines)
        self.notify(f"Bench of {result.endpoint} finished.", title="bench")
        if self.history is not None:
            self.history.append(result)
        self._recompute(None)
