"""The app driven like a person, against the real engine and the real demo: mock servers, two live
runs of the reference client on this machine (LocalHost agent), real files growing."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
from click.testing import CliRunner
from rich.console import Console
from textual.command import CommandList, CommandPalette
from textual.widgets import Button, DataTable, Input, Log, ProgressBar, Select, Static

from supervisor.cli import cli
from supervisor.engine import Engine
from tests.fixtures_tui import demo_process, show_tab
from tests.waiting import wait_for
from tui.app import RunwatchApp, make_app
from tui.screens.compare import CompareScreen
from tui.screens.confirm import ConfirmScreen
from tui.screens.dashboard import DashboardScreen
from tui.screens.help import HelpScreen
from tui.screens.kill import ARGV_LINES, KillScreen
from tui.screens.restart import RestartScreen
from tui.screens.run_detail import RunDetailScreen
from tui.widgets.dataset_table import DatasetTable


def _app(demo: Any) -> RunwatchApp:
    return make_app(demo.config, Engine(demo.config))


async def _loaded(app: RunwatchApp, pilot: Any) -> None:
    """Until both demo runs are on screen with their datasets, a table has the focus and the
    first refresh is done: the provisional counts of the first scan are on screen before it, and
    events are reported from the first complete snapshot on (what is true then is not news)."""

    def ready() -> bool:
        tables = list(app.screen.query(DatasetTable))
        return len(tables) >= 2 and all(t.row_count == 4 for t in tables[:2])

    await wait_for(ready, timeout=30, what="both demo runs on the dashboard")
    await wait_for(lambda: isinstance(app.focused, DatasetTable), what="a focused run")
    await wait_for(lambda: app.refreshes >= 1, timeout=30, what="the first complete refresh")
    await pilot.pause()


def _text(widget: Static) -> str:
    """The plain text a Static shows (Rich tables included)."""
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(widget.content)
    return console.export_text()


async def _select_run(app: RunwatchApp, pilot: Any, key: str) -> DatasetTable:
    table = next(t for t in app.screen.query(DatasetTable) if t.run_key == key)
    table.focus()
    await pilot.pause()
    return table


async def _open_restart(app: RunwatchApp, pilot: Any, key: str) -> RestartScreen:
    """R on run ``key``: its restart screen, once the plan is shown."""
    await _select_run(app, pilot, key)
    await pilot.press("R")
    await wait_for(lambda: isinstance(app.screen, RestartScreen), what="the restart screen")
    screen = app.screen
    assert isinstance(screen, RestartScreen)
    await wait_for(lambda: screen.plan is not None, timeout=20, what="the plan")
    return screen


async def _confirm(app: RunwatchApp, pilot: Any) -> None:
    """The confirmation that x asks for: Cancel is focused; press the other button."""
    await wait_for(lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
    assert app.screen.focused is not None and app.screen.focused.id == "cancel"
    await pilot.click("#confirm")


async def test_dashboard_navigation_help_and_palette(tui_demo: Any) -> None:
    app = _app(tui_demo)
    async with app.run_test(size=(160, 48)) as pilot:
        await _loaded(app, pilot)
        tables = list(app.screen.query(DatasetTable))
        keys = [t.run_key for t in tables]
        assert keys[:2] == ["laptop/local-gpu", "laptop/api"]
        first = tables[0]
        assert app.focused is first
        assert first.row_keys == ["B1", "B2", "B3", "B4"]

        # Down walks the datasets, then crosses into the next run's table.
        for _ in range(3):
            await pilot.press("down")
        assert first.cursor_row == 3
        await pilot.press("down")
        assert app.focused is tables[1]
        assert app.screen.selected_run() == "laptop/api"  # type: ignore[attr-defined]
        await pilot.press("up")
        assert app.focused is first and first.cursor_row == 3

        # Enter opens the run under the cursor; escape comes back to the same place.
        await pilot.press("enter")
        await wait_for(lambda: isinstance(app.screen, RunDetailScreen), what="the detail screen")
        assert app.screen.key == "laptop/local-gpu"  # type: ignore[attr-defined]
        assert app.screen.sample_dataset == "B4"  # type: ignore[attr-defined]
        await pilot.press("escape")
        await wait_for(lambda: isinstance(app.screen, DashboardScreen), what="the dashboard")

        # ? lists every key of every screen.
        await pilot.press("question_mark")
        await wait_for(lambda: isinstance(app.screen, HelpScreen), what="the help screen")
        help_text = " ".join(_text(s) for s in app.screen.query(Static))
        for needed in ("Kill", "Restart", "Launch", "Compare", "Command palette", "Follow log"):
            assert needed in help_text, needed
        await pilot.press("escape")
        await wait_for(lambda: isinstance(app.screen, DashboardScreen), what="help closed")

        # The command palette offers the actions of each run: "kill api" opens its kill dialog
        # even though the cursor is on the other run.
        await pilot.press("ctrl+p")
        await wait_for(lambda: isinstance(app.screen, CommandPalette), what="the palette")
        await pilot.press(*"kill api")
        palette = app.screen
        commands = palette.query_one(CommandList)
        await wait_for(lambda: commands.option_count > 0, what="palette hits")
        first_hit = str(commands.get_option_at_index(0).prompt)
        assert "Kill api on laptop" in first_hit
        await pilot.press("enter")
        await wait_for(lambda: isinstance(app.screen, KillScreen), what="the kill dialog")
        assert app.screen.run.name == "api"  # type: ignore[attr-defined]
        await pilot.press("escape")
        await wait_for(lambda: isinstance(app.screen, DashboardScreen), what="dialog closed")
        assert demo_process(tui_demo, "api").proc.poll() is None


async def test_kill_flow_stops_exactly_the_chosen_run(tui_demo: Any) -> None:
    local = demo_process(tui_demo, "local-gpu").proc
    api = demo_process(tui_demo, "api").proc
    app = _app(tui_demo)
    async with app.run_test(size=(80, 24)) as pilot:
        await _loaded(app, pilot)
        await _select_run(app, pilot, "laptop/local-gpu")

        # Cancel is focused by default: k then enter changes nothing.
        await pilot.press("k")
        await wait_for(lambda: isinstance(app.screen, KillScreen), what="the kill dialog")
        assert isinstance(app.focused, Button) and app.focused.id == "cancel"
        assert f"pid      {local.pid}" in _text(app.screen.query_one("#identity", Static))
        await pilot.press("enter")
        await wait_for(lambda: isinstance(app.screen, DashboardScreen), what="dialog cancelled")
        assert local.poll() is None and psutil.Process(local.pid).status() != "zombie"

        # Confirm: a short grace period, then the Kill button.
        await pilot.press("k")
        await wait_for(lambda: isinstance(app.screen, KillScreen), what="the kill dialog")
        dialog = app.screen
        assert isinstance(dialog, KillScreen)
        grace = dialog.query_one("#grace", Input)
        grace.value = "3"
        dialog.query_one("#confirm", Button).focus()
        await pilot.press("enter")
        await wait_for(lambda: dialog.outcomes is not None, timeout=30, what="the kill result")
        outcomes = dialog.outcomes or []
        assert [o.pid for o in outcomes][:1] == [local.pid]
        assert outcomes[0].outcome in ("terminated", "killed")
        assert "gone" in _text(dialog.query_one("#outcome", Static))
        # The right process is gone (reaped here: the demo started it), the other run lives on.
        wait_for_exit = local.wait(timeout=10)
        assert wait_for_exit is not None
        assert not psutil.pid_exists(local.pid) or psutil.Process(local.pid).status() == "zombie"
        assert api.poll() is None
        # The kill is in `runwatch audit` (the engine audits it, whichever front end asked).
        shown = CliRunner().invoke(cli, ["audit", "--json"])
        assert shown.exit_code == 0, shown.output
        kills = [r for r in json.loads(shown.output) if r["action"] == "kill"]
        assert [(r["run"], r["identity"]["pid"], r["ok"]) for r in kills] == [
            ("local-gpu", local.pid, True)
        ]

        await pilot.press("escape")
        await wait_for(lambda: isinstance(app.screen, DashboardScreen), what="dialog closed")
        found = app.find_run("laptop/local-gpu")
        await wait_for(
            lambda: (f := app.find_run("laptop/local-gpu")) is not None and f[1].state != "running",
            timeout=15,
            what="the dashboard to show the run stopped",
        )
        assert found is not None
        # A deliberate kill is not reported as a death.
        assert not [a for a in app.alerts if a.kind == "run-died" and "local-gpu" in a.title]

        # L launches it again (B3's legacy lines moved aside first: m).
        await pilot.press("L")
        await wait_for(lambda: isinstance(app.screen, RestartScreen), what="the launch screen")
        launch = app.screen
        assert isinstance(launch, RestartScreen) and launch.mode == "launch"
        await wait_for(lambda: launch.plan is not None, timeout=20, what="the launch plan")
        assert [s["name"] for s in launch.steps] == [
            "preflight", "format-check", "fingerprint", "writers", "quiet", "data-repair",
            "launch",
        ]  # fmt: skip
        await pilot.press("m")
        await wait_for(lambda: launch.plan is not None and launch.plan.move_aside, what="plan")
        await pilot.press("x")
        await _confirm(app, pilot)
        await wait_for(lambda: launch.result is not None, timeout=60, what="the launch")
        launched = launch.result
        assert launched is not None and launched.identity is not None
        assert launched.ok is True, launch.steps
        new_pid = launched.identity["pid"]
        assert psutil.Process(new_pid).cmdline()[1].endswith("run_inference.py")


async def test_a_run_that_dies_is_notified(tui_demo: Any) -> None:
    api = demo_process(tui_demo, "api").proc
    app = _app(tui_demo)
    async with app.run_test(size=(80, 24)) as pilot:
        await _loaded(app, pilot)
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(timeout=10)
        await wait_for(
            lambda: any(a.kind == "run-died" and a.title == "api" for a in app.alerts),
            timeout=15,
            what="the run-died notification",
        )


async def test_restart_blocked_by_legacy_data_shows_the_remedy(tui_demo: Any) -> None:
    local = demo_process(tui_demo, "local-gpu").proc
    b3 = Path(tui_demo.config.runs[0].workdir) / "out" / "B3" / "raw_responses.jsonl"
    before = b3.read_bytes()
    app = _app(tui_demo)
    async with app.run_test(size=(100, 40)) as pilot:
        await _loaded(app, pilot)
        screen = await _open_restart(app, pilot, "laptop/local-gpu")
        assert f"pid {local.pid}" in _text(screen.query_one("#diff", Static))

        # Check only: the format check fails on B3 and the screen says what to do.
        await pilot.press("c")
        await wait_for(lambda: screen.result is not None, timeout=30, what="the checks")
        failed = screen.result
        assert failed is not None and failed.ok is False
        assert screen.steps[1]["name"] == "format-check" and screen.steps[1]["state"] == "failed"
        assert "B3" in screen.steps[1]["detail"] and "legacy" in screen.steps[1]["detail"]
        problem = _text(screen.query_one("#problem", Static))
        assert "press m to move those files aside" in problem
        # Nothing changed: the run still runs, B3 is untouched.
        assert local.poll() is None
        assert b3.read_bytes() == before

        # The remedy: m (move aside), then the checks pass.
        await pilot.press("m")
        await wait_for(
            lambda: screen.plan is not None and screen.plan.move_aside, timeout=20, what="new plan"
        )
        await pilot.press("c")
        await wait_for(lambda: screen.result is not None, timeout=30, what="the checks again")
        passed = screen.result
        assert passed is not None and passed.ok is True, screen.steps
        assert "will move aside" in screen.steps[1]["detail"]
        assert local.poll() is None


async def test_detail_follows_the_log_and_decodes_samples(tui_demo: Any) -> None:
    app = _app(tui_demo)
    async with app.run_test(size=(120, 40)) as pilot:
        await _loaded(app, pilot)
        await _select_run(app, pilot, "laptop/api")
        await pilot.press("enter")
        await wait_for(lambda: isinstance(app.screen, RunDetailScreen), what="the detail screen")
        screen = app.screen
        await show_tab(pilot, "log")
        log = screen.query_one("#log-view", Log)
        await wait_for(lambda: log.line_count > 0, timeout=20, what="log lines")
        assert any("B5" in line for line in log.lines)
        # The API key given to the run never shows (argv names only the variable).
        assert not any(os.environ["RUNWATCH_DEMO_API_KEY"] in line for line in log.lines)
        await show_tab(pilot, "samples")
        view = screen.query_one("#samples-view", Static)
        status = screen.query_one("#samples-status", Static)
        await wait_for(
            lambda: "finish=" in _text(view), timeout=20, what="samples " + _text(status)
        )
        assert "tokens" in _text(view)


async def test_typing_on_the_restart_screen_never_restarts_the_run(tui_demo: Any) -> None:
    """Keys typed while the Back button has focus (meant for the flags box) reach the screen's
    one-key actions: ``x`` asks for a confirmation with Cancel focused, and the keys after it
    never confirm it. The run keeps its pid."""
    app = _app(tui_demo)
    async with app.run_test(size=(100, 40)) as pilot:
        await _loaded(app, pilot)
        screen = await _open_restart(app, pilot, "laptop/local-gpu")
        pid = screen.plan.old.identity.pid if screen.plan and screen.plan.old else None
        assert pid is not None and psutil.pid_exists(pid)
        await pilot.press("x")
        await wait_for(lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        assert app.screen.focused is not None and app.screen.focused.id == "cancel"
        await pilot.press("enter")  # the focused button: Cancel
        await wait_for(lambda: app.screen is screen, what="the restart screen again")
        await pilot.press(*"max-tokens=4096", "enter")
        await wait_for(
            lambda: not screen.busy and (screen.plan is not None or screen.result is not None),
            timeout=30,
            what="the screen at rest",
        )
        if isinstance(app.screen, ConfirmScreen):
            assert app.screen.focused is not None and app.screen.focused.id == "cancel"
        assert screen.result is None or screen.result.dry_run, screen.steps
        proc = psutil.Process(pid)
        assert proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE


async def test_restart_with_move_aside_relaunches_the_run(tui_demo: Any) -> None:
    local = demo_process(tui_demo, "local-gpu").proc
    b3_dir = Path(tui_demo.config.runs[0].workdir) / "out" / "B3"
    legacy = (b3_dir / "raw_responses.jsonl").read_bytes()
    app = _app(tui_demo)
    async with app.run_test(size=(100, 40)) as pilot:
        await _loaded(app, pilot)
        screen = await _open_restart(app, pilot, "laptop/local-gpu")
        await pilot.press("m")
        await wait_for(
            lambda: screen.plan is not None and screen.plan.move_aside, timeout=20, what="new plan"
        )
        # Check first; the screen then says x runs the plan, and one x does.
        await pilot.press("c")
        await wait_for(lambda: screen.result is not None, timeout=30, what="the checks")
        checks = screen.result
        assert checks is not None and checks.ok is True and checks.dry_run, screen.steps
        assert "Press x to run the plan" in _text(screen.query_one("#problem", Static))
        checked = len(screen.transitions)
        await pilot.press("x")
        await _confirm(app, pilot)
        await wait_for(
            lambda: screen.result is not None and not screen.result.dry_run,
            timeout=90,
            what="the restart",
        )
        restarted = screen.result
        assert restarted is not None
        assert restarted.ok is True and restarted.identity is not None, screen.steps
        # Each step was shown running, then with its result, in plan order.
        seen = screen.transitions[checked:]
        names = [s["name"] for s in screen.steps]
        # (A step may say "running" again with news of its progress: the quiet window.)
        running = [
            n for i, (n, st) in enumerate(seen) if st == "running" and seen[i - 1] != (n, st)
        ]
        assert running == names
        assert seen.index(("format-check", "ok")) < seen.index(("launch", "running"))
        assert seen[-1] == ("launch", "ok")
        new_pid = restarted.identity["pid"]
        assert new_pid != local.pid and psutil.pid_exists(new_pid)
        assert local.wait(timeout=10) is not None
        # The legacy file was moved aside byte for byte, not deleted.
        moved = [p for p in b3_dir.iterdir() if p.name.startswith("raw_responses.jsonl.")]
        assert [p.read_bytes() for p in moved] == [legacy]
        assert f"pid {new_pid}" in _text(screen.query_one("#problem", Static))
        await pilot.press("escape")
        await wait_for(
            lambda: (
                (f := app.find_run("laptop/local-gpu")) is not None
                and f[1].process is not None
                and f[1].process.identity.pid == new_pid
            ),
            timeout=15,
            what="the dashboard to show the new process",
        )
        assert not [a for a in app.alerts if a.kind == "run-died"]


async def test_compare_screen_and_a_bench_with_progress(tui_demo: Any) -> None:
    app = _app(tui_demo)
    async with app.run_test(size=(120, 40)) as pilot:
        await _loaded(app, pilot)
        await pilot.press("C")
        await wait_for(lambda: isinstance(app.screen, CompareScreen), what="the compare screen")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await wait_for(
            lambda: screen.comparison is not None and screen.comparison.rates,
            timeout=20,
            what="a comparison",
        )
        assert screen.comparison is not None
        assert {r.endpoint for r in screen.comparison.rates} == {"local-gpu", "api"}
        table = screen.query_one("#table", DataTable)
        assert table.row_count >= 1

        # A short bench of the mock API: the bar moves, the result lands in the history.
        screen.query_one("#endpoint", Select).value = "api"
        screen.query_one("#requests", Input).value = "6"
        await pilot.press("b")
        bar = screen.query_one("#progress", ProgressBar)
        assert bar.display
        await wait_for(lambda: screen.bench_result is not None, timeout=60, what="the bench")
        result = screen.bench_result
        assert result is not None
        assert result.endpoint == "api"
        assert sum(lv.completed for lv in result.levels) == 6
        assert bar.percentage == 1.0
        history = Path(os.environ["XDG_STATE_HOME"]) / "runwatch"
        assert any(history.rglob("*")), "the bench was not saved to the history"
        assert "output tok/s" in _text(screen.query_one("#bench-result", Static))


async def test_the_kill_dialog_shows_the_children_of_a_long_command_line_at_80x24(
    tui_demo: Any,
) -> None:
    local = demo_process(tui_demo, "local-gpu").proc
    app = _app(tui_demo)
    async with app.run_test(size=(80, 24)) as pilot:
        await _loaded(app, pilot)
        await _select_run(app, pilot, "laptop/local-gpu")
        await pilot.press("k")
        await wait_for(lambda: isinstance(app.screen, KillScreen), what="the kill dialog")
        await pilot.pause()
        identity = app.screen.query_one("#identity", Static)
        shown = "\n".join(
            strip.text for strip in identity.render_lines(identity.content_region.reset_offset)
        )
        # The demo's argv wraps to more lines than the dialog has room for: it is the part cut,
        # and the cut ends in an ellipsis.
        assert f"pid      {local.pid}" in shown
        assert "children" in shown
        lines = shown.rstrip().split("\n")
        (at,) = [i for i, ln in enumerate(lines) if ln.startswith("argv ")]
        argv_lines = [ln.rstrip() for ln in lines[at:]]
        assert len(argv_lines) == ARGV_LINES and argv_lines[-1].endswith("…"), lines
        dialog = app.screen
        assert isinstance(dialog, KillScreen) and dialog.run.process is not None
        whole = " ".join(dialog.run.process.argv_masked)
        cut = " ".join(ln.removeprefix("argv").strip() for ln in argv_lines).removesuffix("…")
        assert whole.startswith(cut) and len(cut) < len(whole)
        await pilot.press("escape")
        assert local.poll() is None


async def test_w31_the_dashboards_kill_of_a_run_waiting_for_its_restart_cancels_it(
    tui_demo: Any,
) -> None:
    """k on a run that died and waits for a watcher's restart on failure (its intent on disk):
    the restart is cancelled through the same code path as `runwatch kill` (audited, the intent
    removed), not "nothing to kill" with the restart left to come."""
    from supervisor import audit, intents

    local = demo_process(tui_demo, "local-gpu").proc
    app = _app(tui_demo)
    async with app.run_test(size=(80, 24)) as pilot:
        await _loaded(app, pilot)
        os.killpg(local.pid, signal.SIGKILL)
        local.wait(timeout=10)
        await wait_for(
            lambda: (f := app.find_run("laptop/local-gpu")) is not None and f[1].state != "running",
            timeout=15,
            what="the dashboard to show the run gone",
        )
        now = time.time()
        intents.write(
            tui_demo.config,
            intents.Intent(
                run="local-gpu", host="laptop", attempt=1, not_before=now + 60,
                reason="run-died: died (signal 9, SIGKILL)", written=now, by="a watcher",
            ),
        )  # fmt: skip
        await _select_run(app, pilot, "laptop/local-gpu")
        await pilot.press("k")
        path = intents.path_of(tui_demo.config, "local-gpu")
        await wait_for(lambda: not path.exists(), timeout=30, what="the intent cancelled")
        (rec,) = [r for r in audit.read() if r["action"] == "restart-cancelled"]
        assert rec["run"] == "local-gpu" and "restart 1 (run-died:" in rec["detail"]
        await wait_for(
            lambda: any(
                "cancelled the pending restart of local-gpu" in str(n.message)
                for n in app._notifications
            ),
            what="the notification",
        )
        assert not isinstance(app.screen, KillScreen)
