"""The dashboard over a real SSH host (OpenSSH sshd on 127.0.0.1): a host that is lost shows its
last values as stale and is notified, then notified again when it is back."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Static

from supervisor.config import Config, DatasetConfig, RunConfig
from supervisor.engine import Engine
from supervisor.model import HostView
from tests.fixtures_data import make_raw
from tests.fixtures_sshd import SshdPool
from tests.waiting import wait_for
from tui.app import make_app
from tui.widgets.dataset_table import DatasetTable
from tui.widgets.fleet import HostCard

pytestmark = pytest.mark.ssh


async def test_host_lost_and_back(sshd_pool: SshdPool, tmp_path: Path) -> None:
    server = sshd_pool.start("tui-flaky")
    work = tmp_path / "w"
    (work / "out" / "B1").mkdir(parents=True)
    truth = make_raw(work / "out" / "B1" / "raw_responses.jsonl", 21, seed=3)
    config = Config(
        refresh_seconds=0.5,
        hosts=[server.host_config("gpu-box")],
        runs=[
            RunConfig(
                name="gen",
                host="gpu-box",
                workdir=str(work),
                argv=["python3", "run_inference.py", "--datasets", "B1"],
            )
        ],
        datasets={"B1": DatasetConfig(token_budget=1000, max_samples=100)},
    )
    app = make_app(config, Engine(config))
    try:
        async with app.run_test(size=(120, 30)) as pilot:

            def host_view() -> HostView | None:
                return app.snapshot.hosts[0] if app.snapshot else None

            await wait_for(lambda: (h := host_view()) is not None and h.connected, timeout=30)

            # (Other processes of this user that run run_inference.py show up as runs too.)
            def table() -> DatasetTable | None:
                found = [t for t in app.screen.query(DatasetTable) if t.run_key == "gpu-box/gen"]
                return found[0] if found and found[0].row_keys == ["B1"] else None

            def scanned() -> bool:
                """The first scan's answer is shown (not the provisional line counts of the
                scan under way: a host lost before its first answer has no values to keep)."""
                view = host_view()
                runs = [r for r in view.runs if r.name == "gen"] if view is not None else []
                done = [d for r in runs for d in r.datasets if not d.provisional]
                return table() is not None and [d.records for d in done] == [truth.records]

            await wait_for(scanned, what="the run and its dataset, scanned")

            before = list(app.alerts)
            server.stop()
            await wait_for(
                lambda: any(a.kind == "host-lost" for a in app.alerts if a not in before),
                timeout=30,
                what="the host-lost notification",
            )
            await pilot.pause()
            card = app.screen.query_one(HostCard)
            assert card.has_class("-stale")
            header = str(card.query_one(".host-header", Static).content)
            assert "STALE" in header and "disconnected" in header
            # The last values are still there, marked stale.
            view = host_view()
            assert view is not None and view.stale
            (gen,) = [r for r in view.runs if r.name == "gen"]
            assert gen.datasets[0].records == truth.records
            assert table() is not None

            before = list(app.alerts)
            server.restart()
            await wait_for(
                lambda: any(a.kind == "host-back" for a in app.alerts if a not in before),
                timeout=60,
                what="the host-back notification",
            )
            await pilot.pause()
            assert not card.has_class("-stale")
    finally:
        server.stop()
