"""The restart screen's New script field (``restart --script PATH`` in the dashboard, row A18 of
``docs/reliability.md``): the incident's fix typed into the real app, against the demo client
run on an older script (no ``--token-budget``), a real mock endpoint, real processes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import psutil
import pytest
from rich.console import Console
from textual.widgets import Button, Input, Static

from supervisor.engine import ActionResult, Engine, Plan
from tests.fixtures_actions import RUN_INFERENCE, DemoRun, launch, old_script, pid_alive, why
from tests.waiting import wait_for
from tui.app import make_app
from tui.screens.confirm import ConfirmScreen
from tui.screens.restart import RestartScreen
from tui.widgets.dataset_table import DatasetTable

pytestmark = pytest.mark.usefixtures("state_home")


def _text(widget: Static) -> str:
    console = Console(width=240, file=io.StringIO(), record=True)
    console.print(widget.content)
    return console.export_text()


def _plan_of(screen: RestartScreen) -> Plan | None:
    return screen.plan


def _result_of(screen: RestartScreen) -> ActionResult | None:
    return screen.result


async def _enter(pilot: Any, screen: RestartScreen, field: str, value: str) -> None:
    """``value`` in the field ``#field``, then Enter: the plan is made again."""
    box = screen.query_one(f"#{field}", Input)
    box.value = value
    box.focus()
    await pilot.pause()
    await pilot.press("enter")
    await wait_for(lambda: not screen.planning, timeout=30, what="the plan")


async def test_a18_the_restart_screen_installs_a_new_script_that_declares_the_flag(
    tmp_path: Path, slow_endpoint: Any, kill_after: list[int]
) -> None:
    """The flag the host's script lacks fails the checks, nothing stopped; a path that cannot be
    read is no plan, said so, nothing to run; the newer script is shown in the plan (its path
    and sha256) and its checks pass; executed, the host's script is the new one, the old one is
    kept beside it and the run is up again with the flag."""
    demo = DemoRun(tmp_path, slow_endpoint.url, datasets=("B1",), max_samples=300)
    old = old_script(demo).encode()
    script = demo.workdir / "run_inference.py"

    async def go() -> Any:
        async with Engine(demo.config) as engine:
            return await launch(engine, "demo")

    launched = await go()
    assert launched.ok, why(launched)
    pid = int(launched.identity["pid"])
    kill_after.append(pid)
    await wait_for(lambda: len(demo.complete_ids("B1")) >= 2, timeout=60, what="records")

    app = make_app(demo.config, Engine(demo.config))
    async with app.run_test(size=(120, 40)) as pilot:

        def table() -> DatasetTable | None:
            return next(
                (t for t in app.screen.query(DatasetTable) if t.run_key == "local/demo"), None
            )

        await wait_for(lambda: table() is not None, timeout=30, what="the run on the dashboard")
        found = table()
        assert found is not None
        found.focus()
        await pilot.press("R")
        await wait_for(lambda: isinstance(app.screen, RestartScreen), what="the restart screen")
        screen = app.screen
        assert isinstance(screen, RestartScreen)
        await wait_for(lambda: screen.plan is not None, timeout=20, what="the plan")
        problem = screen.query_one("#problem", Static)

        # The alert's flag on the old script: the checks refuse it and point at the field.
        await _enter(pilot, screen, "flags", "token-budget=100000")
        await pilot.press("c")
        await wait_for(lambda: screen.result is not None, timeout=30, what="the checks")
        assert screen.result is not None and screen.result.ok is False, screen.steps
        assert screen.result.failed_step is not None
        assert screen.result.failed_step.name == "preflight", screen.steps
        assert "under 'New script'" in _text(problem)
        assert pid_alive(pid) and script.read_bytes() == old

        # A path that is not a readable script: no plan, why, and nothing can run.
        missing = tmp_path / "no-such-script.py"
        await _enter(pilot, screen, "script", str(missing))
        assert screen.plan is None
        said = _text(problem)
        assert f"--script {missing}:" in said, said
        assert screen.query_one("#execute", Button).disabled

        # The newer script: shown in the plan, and what the checks read.
        await _enter(pilot, screen, "script", str(RUN_INFERENCE))
        plan = _plan_of(screen)  # made again: not the None asserted above
        assert plan is not None and plan.script is not None
        assert "script" in [s.name for s in plan.steps]
        shown = _text(screen.query_one("#diff", Static))
        assert f"{RUN_INFERENCE} (sha256 {plan.script.short})" in shown, shown
        await pilot.press("c")
        await wait_for(lambda: screen.result is not None, timeout=30, what="the checks")
        checked = _result_of(screen)  # checked again: not the failure asserted above
        assert checked is not None and checked.ok is True, screen.steps
        assert pid_alive(pid) and script.read_bytes() == old

        await pilot.press("x")
        await wait_for(lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        await pilot.click("#confirm")
        await wait_for(
            lambda: screen.result is not None and not screen.result.dry_run,
            timeout=90,
            what="the restart",
        )
        done = screen.result
        assert done is not None and done.ok is True and done.identity is not None, screen.steps
        new_pid = int(done.identity["pid"])
        kill_after.append(new_pid)
        assert new_pid != pid
        await wait_for(lambda: not pid_alive(pid), timeout=30, what="the old run gone")
        assert script.read_bytes() == RUN_INFERENCE.read_bytes()
        kept = [p.read_bytes() for p in script.parent.iterdir() if ".runwatch-" in p.name]
        assert kept == [old]
        argv = psutil.Process(new_pid).cmdline()
        assert argv[argv.index("--token-budget") + 1] == "100000", argv
