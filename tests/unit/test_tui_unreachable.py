"""A run on a host that cannot be reached is unknown on the dashboard, and its actions say so:
never "not running" (nobody knows whether it runs)."""

from __future__ import annotations

import socket
from pathlib import Path

from supervisor.config import Config, HostConfig, RunConfig
from supervisor.engine import Engine
from tests.waiting import wait_for
from tui.app import make_app
from tui.screens.kill import KillScreen
from tui.widgets.dataset_table import DatasetTable


def _refused_port() -> int:
    """A loopback port nothing listens on (bound, then released): connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_kill_on_an_unreachable_host_says_unknown_not_not_running(tmp_path: Path) -> None:
    config = Config(
        refresh_seconds=0.5,
        hosts=[
            HostConfig(name="ghost", address="127.0.0.1", port=_refused_port(), connect_timeout=2)
        ],
        runs=[
            RunConfig(
                name="far-run",
                host="ghost",
                workdir=str(tmp_path / "w"),
                argv=["python3", "run_inference.py", "--datasets", "B1"],
            )
        ],
    )
    app = make_app(config, Engine(config))
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(lambda: app.refreshes >= 1, timeout=30, what="the first snapshot")
        (run,) = [r for _h, r in app.runs() if r.name == "far-run"]
        assert run.state_text == "unknown (host unreachable)"

        def run_table() -> DatasetTable | None:
            tables = app.screen.query(DatasetTable)
            return next((t for t in tables if t.run_key == "ghost/far-run"), None)

        # The table is mounted after the snapshot that lists the run: wait for it too.
        await wait_for(lambda: run_table() is not None, what="the run's dataset table")
        table = run_table()
        assert table is not None
        table.focus()
        await pilot.pause()
        await pilot.press("k")
        await wait_for(lambda: app._notifications, what="the answer to k")
        (shown,) = [n.message for n in app._notifications]
        assert "unknown (host unreachable)" in shown and "not running" not in shown
        assert not isinstance(app.screen, KillScreen)
