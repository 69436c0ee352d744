"""The detail screen's log view shows the launch log ``<out>/.runwatch/run.log`` of a run whose
config has no ``log =``: a real reference-client run launched through the engine, read back
through ``Engine.tail_log`` by the real app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.widgets import Log

from supervisor.engine import Engine
from tests import fixtures_actions as actions
from tests.fixtures_actions import DemoRun, why
from tests.fixtures_tui import show_tab
from tests.waiting import wait_for
from tui.app import make_app
from tui.screens.run_detail import RunDetailScreen


async def test_detail_shows_the_launch_log_of_a_run_without_log(
    tmp_path: Path, state_home: Path, mock_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    demo = DemoRun(tmp_path, mock_endpoint.url, datasets=("B1",), max_samples=300, log=None)
    kill_runs_in.append(demo.workdir)
    config = demo.config
    assert config.run("demo").log is None
    launch_log = demo.workdir / "data" / ".runwatch" / "run.log"
    engine = Engine(config)
    launched = await actions.launch(engine, "demo")
    assert launched.ok, why(launched)

    def client_line(lines: list[str]) -> str | None:
        # The reference client's own line once it opened its data file.
        return next((x for x in lines if "B1: 0 samples" in x and "prompts to go" in x), None)

    app = make_app(config, engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(lambda: app.find_run("local/demo") is not None, 30, what="the run")
        app.open_run("local/demo")
        await wait_for(lambda: isinstance(app.screen, RunDetailScreen), what="the detail screen")
        await show_tab(pilot, "log")
        view = app.screen.query_one("#log-view", Log)
        await wait_for(
            lambda: client_line(list(view.lines)) is not None, 30, what="the client's log line"
        )
        shown = client_line(list(view.lines))
    assert shown is not None
    assert shown in launch_log.read_text().splitlines()
    assert not (demo.workdir / "logs").exists()  # no other log it could have come from
