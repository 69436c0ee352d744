"""Restart or launch a run: the plan, each check's result as it runs, the argv diff, remedies.

Nothing changes until a button is pressed: the plan is computed first (``make_plan``), then either
checked (dry run: only the checks run) or executed, and every step's state is shown as it changes.
A new script (a local path, as ``restart --script``) is read when the plan is made: one that
cannot be read is no plan, said with why; one that can is shown in the plan and is what the
checks read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Checkbox, Footer, Input, Label, Static

from supervisor import display
from supervisor.engine import ActionResult, Plan, Step, start_refused_event
from supervisor.model import RunView
from tui.messages import PlanFinished, PlanMade, StepChanged
from tui.screens.confirm import ConfirmScreen
from tui.widgets.format import error_text, host_text, plain

if TYPE_CHECKING:
    from tui.app import RunwatchApp

_STATE_STYLE = {
    "pending": ("·", "dim"),
    "running": ("…", "bold yellow"),
    "ok": ("✓", "bold green"),
    "skipped": ("–", "dim"),
    "failed": ("✗", "bold red"),
}

REMEDIES = {
    "preflight": (
        "Remedy: fix the flag named above (it is not one the client accepts, or needs a value), "
        "or give the newer script that declares it under 'New script'; nothing was stopped."
    ),
    "format-check": (
        "Remedy: press m to move those files aside (renamed to <file>.<format>-<time>, nothing "
        "deleted) so the run starts them afresh, then run again. Or convert them first."
    ),
    "fingerprint": (
        "Remedy: if the change is intended, list it under 'Allow changes' (model, sampling, "
        "prompts, format...) and run again; otherwise restore the old flags."
    ),
    "stop": "Remedy: the old process was not confirmed gone; look at the host before retrying.",
    "gpu-release": "Remedy: something still holds the GPUs; check nvidia-smi on the host.",
    "quiet": (
        "Remedy: something else appends to a data file; find it (lsof or fuser on the file, on "
        "every node that mounts it) and stop it, then launch again."
    ),
    "data-repair": "Remedy: a data file could not be repaired; read the detail above.",
    "launch": "Remedy: the run did not stay up; read its log (run detail, Log tab).",
}


def steps_table(steps: list[dict[str, str]]) -> Table:
    """One line per step: number, state mark, name, and what happened (wrapped)."""
    table = Table(box=None, padding=(0, 1), expand=True, show_edge=False)
    table.add_column("", no_wrap=True, width=2)
    table.add_column("step", no_wrap=True, style="bold")
    table.add_column("result", ratio=1, overflow="fold")
    for i, step in enumerate(steps, 1):
        mark, style = _STATE_STYLE.get(step["state"], ("?", ""))
        detail = step["detail"] or step["title"]
        table.add_row(
            Text(f"{mark}", style=style),
            Text(f"{i}. {step['name']}"),
            plain(detail, style="dim" if step["state"] == "pending" else ""),
        )
    return table


def diff_text(plan: Plan) -> Table:
    """What runs now, the new argv (masked), the flags that change, and the log."""
    from supervisor.engine import mask_argv

    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim", no_wrap=True, width=12)
    table.add_column(overflow="fold")
    if plan.old is not None:
        table.add_row("running now", Text(f"pid {plan.old.identity.pid}", style="bold"))
    else:
        table.add_row("running now", "nothing")
    table.add_row("new argv", plain(display.command_line(mask_argv(plan.argv, plan.secrets))))
    changes = plan.argv_diff()
    for d in changes:
        old = "(absent)" if d["old"] is None else str(d["old"])
        new = "(absent)" if d["new"] is None else str(d["new"])
        table.add_row(
            "changes",
            Text.assemble(
                (host_text(f"{d['flag']}: "), "bold"),
                (host_text(old), "red"),
                " → ",
                (host_text(new), "green"),
            ),
        )
    if not changes:
        table.add_row("changes", "none: the same argv as " + ("now" if plan.old else "the config"))
    last = plan.last_launch_diff()
    if last is None:
        table.add_row("last launch", "none recorded by runwatch")
    elif not last:
        table.add_row("last launch", "the same argv")
    for d in last or []:
        old = "(absent)" if d["old"] is None else str(d["old"])
        new = "(absent)" if d["new"] is None else str(d["new"])
        table.add_row(
            "last launch",
            Text.assemble(
                (host_text(f"{d['flag']}: "), "bold"),
                (host_text(old), "red"),
                " → ",
                (host_text(new), "green"),
            ),
        )
    if plan.script is not None:
        table.add_row(
            "new script",
            plain(
                f"{plan.script.path} (sha256 {plan.script.short}): replaces the host's after the "
                "stop, the old one kept beside it; the checks read this one"
            ),
        )
    table.add_row("log", plain(str(plan.paths.get("log", "-"))))
    return table


class RestartScreen(Screen[None]):
    """The plan of a restart (or launch) of one run, and its execution step by step."""

    CSS_PATH = "restart.tcss"
    AUTO_FOCUS = "#back"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("c", "check", "Check only", tooltip="Run the checks without changing anything"),
        Binding("x", "execute", "Execute", tooltip="Run the plan: stop, repair, launch"),
        Binding("m", "toggle_move_aside", "Move aside", tooltip="Rename files in another format"),
        Binding("e", "edit_flags", "Edit flags", tooltip="Change flags: KEY=VALUE, or a switch"),
    ]

    def __init__(
        self, host: str, run: RunView, *, mode: Literal["restart", "launch"] = "restart"
    ) -> None:
        super().__init__()
        self.host = host
        self.run = run
        self.mode = mode
        self.plan: Plan | None = None
        """The current plan (None until computed)."""
        self.steps: list[dict[str, str]] = []
        """Each step's name, title, state and detail, as last reported."""
        self.result: ActionResult | None = None
        """The ``ActionResult`` once the plan ran."""
        self.transitions: list[tuple[str, str]] = []
        """Every (step, state) shown, in order."""
        self.busy = False
        self.planning = False
        """True from a change of the options until their plan (or why there is none) is shown."""
        self._run_when_planned: bool | None = None
        """``dry_run`` of a run asked for while the plan was being recomputed."""

    def flags_example(self) -> str:
        """The placeholder of the flags field: the run's budget flag when its client has one
        (a client without one is never offered a budget flag)."""
        flag = self.run.budget_flag
        if flag is None:
            return "KEY=VALUE ... (its client has no budget flag)"
        return f"KEY=VALUE ... e.g. {flag.lstrip('-')}=100000"

    @property
    def rw(self) -> RunwatchApp:
        from tui.app import runwatch_app

        return runwatch_app(self.app)

    def compose(self) -> ComposeResult:
        verb = "Restart" if self.mode == "restart" else "Launch"
        yield Static(
            Text.assemble(f"{verb} ", (self.run.name, "bold"), " on ", (self.host, "bold")),
            id="title",
        )
        with VerticalScroll(id="body"):
            with Horizontal(classes="option"):
                yield Label("Set flags", classes="option-label")
                yield Input(placeholder=self.flags_example(), id="flags", compact=True)
            with Horizontal(classes="option"):
                yield Label("New script", classes="option-label")
                yield Input(
                    placeholder="a newer script on this machine (copied after the stop)",
                    id="script",
                    compact=True,
                )
            with Horizontal(classes="option"):
                yield Label("Allow changes", classes="option-label")
                yield Input(placeholder="model sampling prompts ...", id="allow", compact=True)
            yield Checkbox(
                "Move aside files in another format (nothing deleted)",
                id="move-aside",
                compact=True,
            )
            yield Static("Computing the plan…", id="diff")
            yield Static(id="steps")
            yield Static(id="problem")
        with Horizontal(id="buttons"):
            yield Button("Back", id="back", variant="primary", compact=True)
            yield Button("Check only", id="check", compact=True)
            yield Button(verb, id="execute", variant="warning", compact=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self._plan()

    # ------------------------------------------------------------------ planning

    def _options(self) -> tuple[list[str], list[str], bool, str | None]:
        flags = self.query_one("#flags", Input).value.split()
        allow = self.query_one("#allow", Input).value.replace(",", " ").split()
        script = self.query_one("#script", Input).value.strip() or None
        return flags, allow, self.query_one("#move-aside", Checkbox).value, script

    def _plan(self, *, then_run: bool | None = None) -> None:
        """Compute the plan afresh; then run it (``then_run`` is its ``dry_run``) if asked."""
        self._run_when_planned = then_run
        self.planning = True
        self.plan = None
        self.result = None
        self._set_buttons(enabled=False)
        self.query_one("#problem", Static).update("")
        flags, allow, move_aside, script = self._options()
        self._make_plan(flags, allow, move_aside, script)

    @work(exclusive=True, group="plan", exit_on_error=False)
    async def _make_plan(
        self, flags: list[str], allow: list[str], move_aside: bool, script: str | None
    ) -> None:
        try:
            plan = await self.rw.engine.plan(
                self.run.name,
                action=self.mode,
                overrides=flags,
                move_aside=move_aside,
                allow_change=allow,
                script=script,
            )
        except Exception as e:  # shown on the screen with its hint
            self.post_message(PlanMade(None, error_text(e)))
        else:
            self.post_message(PlanMade(plan))

    def on_plan_made(self, message: PlanMade) -> None:
        message.stop()
        self.planning = False
        if message.error is not None:
            self._run_when_planned = None
            self.query_one("#diff", Static).update(Text("No plan.", style="bold red"))
            self.query_one("#steps", Static).update("")
            self._problem(message.error, None)
            self.query_one("#check", Button).disabled = True
            self.query_one("#execute", Button).disabled = True
            return
        self.plan = message.plan
        self.steps = [
            {"name": s.name, "title": s.title, "state": s.state, "detail": ""}
            for s in message.plan.steps
        ]
        self.query_one("#diff", Static).update(diff_text(message.plan))
        self._show_steps()
        self._set_buttons(enabled=True)
        if self._run_when_planned is not None:
            dry_run, self._run_when_planned = self._run_when_planned, None
            self._run(dry_run=dry_run)

    def _show_steps(self) -> None:
        self.query_one("#steps", Static).update(steps_table(self.steps))

    def _set_buttons(self, *, enabled: bool) -> None:
        for button_id in ("check", "execute"):
            self.query_one(f"#{button_id}", Button).disabled = not enabled

    def _problem(self, text: str, step: str | None) -> None:
        body = plain(text, style="bold red")
        remedy = REMEDIES.get(step or "")
        if remedy:
            body.append("\n" + remedy, style="yellow")
        self.query_one("#problem", Static).update(body)

    # ------------------------------------------------------------------ execution

    def action_check(self) -> None:
        self._run(dry_run=True)

    def action_execute(self) -> None:
        """Run the plan once the user confirms what it stops and starts (Cancel focused)."""
        if self.busy or self.plan is None:
            return
        plan = self.plan
        verb = "Restart" if self.mode == "restart" else "Launch"
        if plan.old is not None:
            what = f"Stop pid {plan.old.identity.pid} of {self.run.name} on {self.host} and start"
            what += " it again with the command line above?"
        elif plan.job is not None:
            what = f"Cancel Slurm job {plan.job.job_id} of {self.run.name} and submit it again?"
        else:
            what = f"Start {self.run.name} on {self.host} with the command line above?"
        self.app.push_screen(ConfirmScreen(what, verb), self._confirmed)

    def _confirmed(self, yes: bool | None) -> None:
        if yes:
            self._run(dry_run=False)

    def _run(self, *, dry_run: bool) -> None:
        if self.busy or self.plan is None:
            return
        if self.result is not None:
            # A plan runs once: run again on a fresh look at the host (the checks run again too).
            self._plan(then_run=dry_run)
            return
        self.busy = True
        self._set_buttons(enabled=False)
        self.query_one("#problem", Static).update(
            Text("Checking…" if dry_run else "Running the plan…", style="yellow")
        )
        if not dry_run and self.plan.old is not None:
            self.rw.expect_stop(self.host, self.run.name, self.plan.old.identity.pid)
        # Follow the steps as they report, like a log, until the user scrolls.
        self.query_one("#body", VerticalScroll).anchor()
        self._execute(self.plan, dry_run)

    @work(exclusive=True, group="execute", exit_on_error=False)
    async def _execute(self, plan: Plan, dry_run: bool) -> None:
        index = {s.name: i for i, s in enumerate(plan.steps)}

        def on_step(step: Step) -> None:
            self.post_message(StepChanged(index[step.name], step.name, step.state, step.detail))

        try:
            result = await self.rw.engine.execute(plan, dry_run=dry_run, on_step=on_step)
        except Exception as e:  # the plan itself broke (not a step): shown on the screen
            self.post_message(PlanFinished(False, None, error_text(e)))
        else:
            self.post_message(PlanFinished(bool(result.ok), result))

    def on_step_changed(self, message: StepChanged) -> None:
        message.stop()
        step = self.steps[message.index]
        self.transitions.append((message.name, message.state))
        step["state"] = message.state
        step["detail"] = message.detail
        self._show_steps()

    def on_plan_finished(self, message: PlanFinished) -> None:
        message.stop()
        self.busy = False
        self.result = message.result
        self._set_buttons(enabled=True)
        problem = self.query_one("#problem", Static)
        if message.error is not None:
            self._problem(message.error, None)
            return
        result = message.result
        for step in result.steps:  # files moved aside by the plan: no data loss at their paths
            for path in step.data.get("moved", []):
                self.rw.expect_moved(str(path))
        failed = result.failed_step
        if failed is not None:
            number = [s["name"] for s in self.steps].index(failed.name) + 1
            text = f"✗ Blocked at step {number}, {failed.name} (detail above)."
            rollback = result.rollback
            if rollback is not None:
                text += f"\n{rollback['detail']}"
            if rollback is not None and rollback.get("refused"):
                # The run is down and stays down: said as loudly as a run that died.
                self.rw.notify_event(
                    start_refused_event(
                        self.host, self.run.name, str(rollback["detail"]), str(rollback["command"])
                    )
                )
            self._problem(text, failed.name)
        elif result.nothing_to_do:
            problem.update(Text(f"{self.run.name}: nothing to do: all datasets done."))
        elif result.dry_run:
            problem.update(Text("Every check passed. Press x to run the plan.", style="bold green"))
        else:
            pid = (result.identity or {}).get("pid")
            done = "restarted" if self.mode == "restart" else "launched"
            problem.update(Text(f"{self.run.name} {done}: pid {pid}.", style="bold green"))
            self.notify(f"{self.run.name} {done} (pid {pid}).", title=self.host)
        self.rw.action_refresh()

    # ------------------------------------------------------------------ options

    def action_toggle_move_aside(self) -> None:
        box = self.query_one("#move-aside", Checkbox)
        box.value = not box.value

    def action_edit_flags(self) -> None:
        self.query_one("#flags", Input).focus()

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        if not self.busy:
            self._plan()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not self.busy:
            self._plan()
            self.query_one("#back", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "back":
            self.action_back()
        elif event.button.id == "check":
            self.action_check()
        elif event.button.id == "execute":
            self.action_execute()

    def action_back(self) -> None:
        if self.busy:
            self.notify("A step is running; wait for it to finish.", severity="warning")
            return
        self.dismiss(None)
