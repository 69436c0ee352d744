"""The dashboard during a first connect: provisional counts marked ``~`` and the scan's progress on
the host's line, then the scan's own numbers; against the real engine and local agent too."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from pathlib import Path

import msgspec
from rich.console import Console
from textual.widgets import Static

from supervisor import display
from supervisor.config import Config, HostConfig, RunConfig
from supervisor.engine import Engine
from supervisor.model import ScanProgress, Snapshot
from tests.fixtures_data import make_raw
from tests.fixtures_tui import FixedEngine, fixed_config, fixed_snapshot
from tests.waiting import wait_for
from tui.app import make_app
from tui.widgets.dataset_table import DatasetTable


def _text(widget: Static) -> str:
    console = Console(width=300, file=io.StringIO(), record=True)
    console.print(widget.content)
    return console.export_text()


def _row(table: DatasetTable, dataset: str) -> str:
    return table.render_line(1 + table.row_keys.index(dataset)).text


class FirstScan(FixedEngine):
    """A fixed engine whose first refresh reports provisional counts, then waits to be let go."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.calls = 0

    async def refresh(self, on_progress: Callable[[Snapshot], None] | None = None) -> Snapshot:
        self.calls += 1
        if self.calls == 1 and on_progress is not None:
            host = self.snapshot.hosts[0]
            run = host.runs[0]
            datasets = [
                msgspec.structs.replace(d, records=d.records + 5, provisional=True)
                for d in run.datasets
            ]
            progress = ScanProgress(
                files_done=1, files_total=8, bytes_done=3 << 30, bytes_total=8 << 30
            )
            early = msgspec.structs.replace(
                host, runs=[msgspec.structs.replace(run, datasets=datasets)], progress=progress
            )
            on_progress(Snapshot(time=self.snapshot.time, hosts=[early, *self.snapshot.hosts[1:]]))
            await self.release.wait()
        return self.snapshot


async def test_dashboard_shows_provisional_counts_and_progress_then_the_scan() -> None:
    engine = FirstScan()
    final = fixed_snapshot().hosts[0].runs[0].datasets[0]
    app = make_app(fixed_config(), engine, refresh_seconds=3600)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(lambda: app.snapshot is not None, what="the provisional snapshot")
        await pilot.pause()
        header = _text(app.screen.query(".host-header").first(Static))
        assert "scanning 1/8 files, 3.0 GB of 8.0 GB" in header
        table = next(t for t in app.screen.query(DatasetTable) if t.run_key.startswith("gpu-box"))
        row = _row(table, final.name)
        assert f"~{final.records + 5:,}" in row and "reading" in row
        # Tokens are not known before the scan: none are shown (the struct's are stale).
        assert display.budget(final.completion_tokens, final.token_budget) not in row
        assert app.refreshes == 0 and app.alerts == []
        engine.release.set()
        await wait_for(lambda: app.refreshes == 1, what="the scan's snapshot")
        await pilot.pause()
        header = _text(app.screen.query(".host-header").first(Static))
        assert "scanning" not in header
        row = _row(table, final.name)
        assert f"{final.records:,}" in row and "~" not in row and "reading" not in row
        assert display.budget(final.completion_tokens, final.token_budget) in row


def _one_run(work: Path) -> Config:
    """A local host and one reference-client run ``gen`` of dataset B1 in ``work``."""
    return Config(
        hosts=[HostConfig(name="here", local=True, command_timeout=30.0)],
        runs=[
            RunConfig(
                name="gen",
                host="here",
                workdir=str(work),
                argv=["python3", "run_inference.py", "--datasets", "B1"],
            )
        ],
    )


async def test_dashboard_on_a_real_first_scan_ends_with_exact_counts(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "out" / "B1").mkdir(parents=True)
    truth = make_raw(work / "out" / "B1" / "raw_responses.jsonl", 300, seed=9)
    config = _one_run(work)
    app = make_app(config, Engine(config), refresh_seconds=3600)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(lambda: app.refreshes >= 1, timeout=30, what="the first refresh")
        await pilot.pause()
        table = next(t for t in app.screen.query(DatasetTable) if t.run_key == "here/gen")
        row = _row(table, "B1")
        assert f"{truth.records:,}" in row and "~" not in row
        assert app.snapshot is not None and app.snapshot.hosts[0].progress is None


class CountingEngine(Engine):
    """The real engine, counting the refreshes asked of it."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.asked = 0

    async def refresh(
        self, on_progress: Callable[[Snapshot], None] | None = None, wait: float | None = None
    ) -> Snapshot:
        self.asked += 1
        return await super().refresh(on_progress, wait)


async def test_a_refresh_finished_before_the_app_mounts_is_its_first_frame(tmp_path: Path) -> None:
    """``runwatch tui`` begins the first refresh before Textual loads: when it is done by the
    time the app mounts, the dashboard shows its exact counts at once, without refreshing
    again; the next refresh reads what was appended since."""
    work = tmp_path / "work"
    data = work / "out" / "B1" / "raw_responses.jsonl"
    data.parent.mkdir(parents=True)
    truth = make_raw(data, 120, seed=11)
    config = _one_run(work)
    engine = CountingEngine(config)
    first = asyncio.ensure_future(engine.refresh())
    await asyncio.wait_for(asyncio.shield(first), 30)
    app = make_app(config, engine, refresh_seconds=3600, first_refresh=first)
    async with app.run_test(size=(160, 48)) as pilot:
        assert app.refreshes == 1 and app.snapshot is first.result()
        await pilot.pause()
        table = next(t for t in app.screen.query(DatasetTable) if t.run_key == "here/gen")
        assert _row(table, "B1").split()[:2] == ["B1", f"{truth.records:,}"]
        assert engine.asked == 1
        more = make_raw(tmp_path / "more.jsonl", 30, seed=12)
        with data.open("ab") as f:
            f.write((tmp_path / "more.jsonl").read_bytes())
        await pilot.press("r")
        await wait_for(lambda: app.refreshes == 2, timeout=30, what="the next refresh")
        await pilot.pause()
        assert _row(table, "B1").split()[:2] == ["B1", f"{truth.records + more.records:,}"]
        assert engine.asked == 2
