"""Fixtures of the TUI tests: deterministic snapshots for screenshots, and an engine serving them.

The fixed-snapshot engine is used for screenshot tests only (their pixels must not depend on
timing); every flow test drives the real app against the real engine and real demo processes.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.css.query import NoMatches
from textual.widgets import Static, TabbedContent

from supervisor.config import Config, DatasetConfig, EndpointConfig, HostConfig, RunConfig
from supervisor.engine import (
    Action,
    ActionResult,
    KillReport,
    KillResult,
    LatestSamples,
    LogTail,
    OnStep,
    Plan,
    Supervision,
    Tick,
)
from supervisor.model import (
    DatasetView,
    HostView,
    Identity,
    ProcessInfo,
    Projection,
    Rates,
    RunFlags,
    RunView,
    Snapshot,
)
from tests.waiting import wait_for

FROZEN_TIME = 1_764_460_800.0  # 2025-11-30 00:00:00 UTC
BUDGET = 10_000_000
MAX_SAMPLES = 7000
NAMES = [f"B{i}" for i in range(1, 9)]


def _history(seed: int, n: int = 30) -> list[float]:
    # A deterministic wobble, so the sparkline has a shape without any randomness.
    return [float(800 + ((i * 37 + seed * 11) % 23) * 40) for i in range(n)]


def _dataset(name: str, i: int, out: str, *, live: bool) -> DatasetView:
    records = [6100, 2912, 1480, 4022, 5310, 980, 3333, 150][i]
    tokens = [
        8_400_000,
        10_712_345,
        4_900_000,
        6_100_000,
        9_310_000,
        2_400_000,
        5_550_000,
        410_000,
    ][i]
    length = [120, 488, 40, 60, 301, 12, 90, 3][i]
    over = tokens > BUDGET
    projection = Projection(
        stop_reason="max_samples",
        eta_s=[4200, 25320, 30000, 18000, 3900, 40000, 22000, 80000][i] if live else None,
        over_budget_tokens=tokens - BUDGET if over else 0,
        remaining_samples=MAX_SAMPLES - records,
        remaining_tokens=14_000_000 if over else BUDGET - tokens,
        waste_tokens=14_700_000 if over else 0,
        message="10.7 M / 10 M, +14 M projected over 7 h - no --token-budget" if over else None,
    )
    return DatasetView(
        name=name,
        path=f"{out}/{name}/raw_responses.jsonl",
        records=records,
        unique_ids=records - (2 if name == "B5" else 0),
        duplicates=2 if name == "B5" else 0,
        prompt_tokens=records * 312,
        completion_tokens=tokens,
        finish_reasons={"stop": records - length, "length": length},
        verdict="legacy" if name == "B3" else "current",
        verdict_detail="line 1: has 'text', expected 'output_ids' (legacy format)"
        if name == "B3"
        else None,
        max_samples=MAX_SAMPLES,
        token_budget=BUDGET,
        rates=Rates(
            req_per_s_1m=0.2 + i / 100,
            req_per_s_10m=0.19 + i / 100,
            tok_per_s_1m=700.0 + i * 55,
            tok_per_s_10m=690.0 + i * 50,
            tok_per_s_all=650.0 + i * 40,
            tok_per_s=700.0 + i * 55,
            tok_per_s_err=(700.0 + i * 55) / 10,
            req_per_s=0.2 + i / 100,
            window_s=600.0,
            responses=100,
        )
        if live
        else Rates(),
        projection=projection,
        over_budget=over,
        stalled=name == "B6" and live,
        history=_history(i) if live else [],
    )


def _process(pid: int, argv: list[str], *, backend: str, run: str) -> ProcessInfo:
    return ProcessInfo(
        identity=Identity(
            boot_id="6f1c2a9e-boot", pid=pid, start_time=1234567, uid=1000, argv=tuple(argv)
        ),
        user="ml",
        uptime_s=11_520.0,
        cpu_percent=12.0,
        rss_mb=812.0,
        state="S",
        cwd="/data/eagle3",
        argv_masked=[a if not a.startswith("sk-") else "***" for a in argv],
        children=[pid + 1, pid + 2],
        flags=RunFlags(
            datasets=NAMES,
            max_samples=MAX_SAMPLES,
            concurrency=64,
            output_dir="out",
            api_base="http://127.0.0.1:30000/v1"
            if backend == "local"
            else "https://api.example/v1",
            model="moonshotai/Kimi-K2.5",
            backend=backend,  # type: ignore[arg-type]
        ),
        gpu_memory_mb=612_000.0 if backend == "local" else None,
        run=run,
    )


LOCAL_ARGV = [
    "python3", "run_inference.py", "--datasets", ",".join(NAMES), "--api-base",
    "http://127.0.0.1:30000/v1", "--model", "moonshotai/Kimi-K2.5", "--concurrency", "64",
    "--max-samples", "7000", "--output-dir", "out",
]  # fmt: skip
API_ARGV = [
    "python3", "run_inference.py", "--datasets", "C1,C2", "--api-base", "https://api.example/v1",
    "--api-key", "sk-live-123", "--max-samples", "7000", "--output-dir", "out-api",
]  # fmt: skip


def fixed_snapshot() -> Snapshot:
    """Two hosts: a busy GPU box (B2 over budget, B3 legacy, B6 stalled) and a lost API box."""
    gpu_run = RunView(
        name="eagle3-kimi",
        host="gpu-box",
        state="running",
        process=_process(4242, LOCAL_ARGV, backend="local", run="eagle3-kimi"),
        datasets=[_dataset(n, i, "/data/eagle3/out", live=True) for i, n in enumerate(NAMES)],
        # The run's own window across its datasets (not their windows added up).
        rates=Rates(
            tok_per_s=2160.0, tok_per_s_err=96.0, req_per_s=0.6, window_s=600, responses=506
        ),
    )
    api_run = RunView(
        name="eagle3-api",
        host="api-box",
        state="running",
        process=_process(777, API_ARGV, backend="api", run="eagle3-api"),
        datasets=[_dataset(n, i, "/srv/out-api", live=True) for i, n in enumerate(["C1", "C2"])],
        rates=Rates(
            tok_per_s=5400.0, tok_per_s_err=300.0, req_per_s=1.5, window_s=600, responses=324
        ),
    )
    return Snapshot(
        time=FROZEN_TIME,
        hosts=[
            HostView(
                name="gpu-box",
                connected=True,
                rtt_ms=12.4,
                last_ok=FROZEN_TIME,
                has_gpu=True,
                runs=[gpu_run],
            ),
            HostView(
                name="api-box",
                connected=False,
                stale=True,
                error="connection lost (keepalive timeout)",
                last_ok=FROZEN_TIME - 125,
                runs=[api_run],
            ),
        ],
    )


def fixed_config() -> Config:
    """The config the fixed snapshot belongs to."""
    return Config(
        path="configs/fleet.toml",
        refresh_seconds=3600.0,  # screenshots: no refresh tick while the picture is taken
        hosts=[HostConfig(name="gpu-box", address="gpu-box"), HostConfig(name="api-box")],
        runs=[
            RunConfig(name="eagle3-kimi", host="gpu-box", workdir="/data/eagle3", argv=LOCAL_ARGV,
                      log="logs/inference.log"),
            RunConfig(name="eagle3-api", host="api-box", workdir="/srv", argv=API_ARGV,
                      output_dir="out-api"),
        ],
        datasets={n: DatasetConfig(token_budget=BUDGET, max_samples=MAX_SAMPLES) for n in NAMES},
    )  # fmt: skip


def compare_config() -> Config:
    """The fixed config with a local endpoint (GPU time priced) and a priced API, one per run."""
    import msgspec

    base = fixed_config()
    endpoints = [
        EndpointConfig(name="local-gpu", kind="local", base_url="http://127.0.0.1:30000/v1",
                       gpu_cost_per_hour=20.0),
        EndpointConfig(name="api", kind="api", base_url="https://api.example/v1",
                       price_in_per_m=0.60, price_out_per_m=2.50),
    ]  # fmt: skip
    runs = [
        msgspec.structs.replace(base.runs[0], endpoint="local-gpu"),
        msgspec.structs.replace(base.runs[1], endpoint="api"),
    ]
    return msgspec.structs.replace(base, endpoints=endpoints, runs=runs)


class FixedHost:
    """A host whose log tail is a fixed text (screenshots of the detail screen)."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def request(
        self, op: str, params: dict[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        if op == "tail_log":
            lines = [f"[00:0{i}:00] B2 wrote 50 responses ({i * 50} total)" for i in range(1, 6)]
            return {"path": params["path"], "exists": True, "size": 1000, "lines": lines}
        if op == "read_fingerprint":
            # No launch recorded a fingerprint here: the start's check has nothing to compare.
            return {"fingerprints": {}, "hashes": {}}
        if op == "resolve_args":
            # No script on this host to read: only the canonical argv passes the reading.
            return {
                "path": params["argv"][1] if len(params["argv"]) > 1 else "",
                "exact": False,
                "reason": "the fixed host holds no script",
            }
        if op == "script_flags":
            # No script on this host to read: the client's profile fills in.
            argv = params.get("argv") or [""]
            return {
                "path": argv[-1], "readable": False, "found": False,
                "reason": "the fixed host holds no script", "options": [],
                "allow_abbrev": True, "dynamic": 0, "known_args": False,
            }  # fmt: skip
        if op == "snapshot_check":
            # Every data file could be kept by reflink.
            files = [{"path": p, "size": 0, "method": "reflink"} for p in params["paths"]]
            return {"files": files, "copy_bytes": 0, "unprotected": []}
        raise NotImplementedError(op)


class FixedEngine:
    """Returns the same snapshot on every refresh and records what it was asked to do.

    Implements ``tui.engine.EngineLike`` whole (mypy checks it where the app is made); the
    operations the screenshots never reach say so."""

    def __init__(self, snapshot: Snapshot | None = None, config: Config | None = None) -> None:
        self.snapshot = snapshot or fixed_snapshot()
        self.config = config or fixed_config()
        self.kills: list[tuple[str, Identity, float]] = []
        self.closed = False
        self.stopping: set[str] = set()
        """As ``Engine.stopping``: the stops a plan of this engine is making."""
        self._supervision: Supervision | None = None

    async def refresh(self, on_progress: Callable[[Snapshot], None] | None = None) -> Snapshot:
        return self.snapshot

    async def list_processes(self, host: str) -> list[ProcessInfo]:
        return [
            r.process
            for h in self.snapshot.hosts
            for r in h.runs
            if h.name == host and r.process is not None
        ]

    async def kill(
        self, host: str, identity: Identity, grace: float = 10.0, *, run: str | None = None
    ) -> KillReport:
        self.kills.append((host, identity, grace))
        return KillReport(
            host=host,
            identity=identity,
            results=[
                KillResult(
                    pid=identity.pid, outcome="terminated", detail="exited on TERM after 0.4 s"
                ),
                KillResult(
                    pid=identity.pid + 1, outcome="terminated", detail="exited with its parent"
                ),
                KillResult(pid=identity.pid + 2, outcome="killed", detail="KILL after 10 s grace"),
            ],
        )

    async def plan(
        self,
        run: str,
        *,
        action: Action = "restart",
        overrides: Iterable[str] | Iterable[tuple[str, str]] = (),
        move_aside: bool = False,
        force: bool = False,
        allow_change: Iterable[str] = (),
        environ: dict[str, str] | None = None,
        script: str | None = None,
    ) -> Plan:
        # The real planner over the fixed snapshot (it needs only config and refresh).
        from supervisor.plan import make_plan

        return await make_plan(
            self,
            run,
            action=action,
            overrides=overrides,
            move_aside=move_aside,
            force=force,
            allow_change=allow_change,
            environ=environ,
            script=script,
        )

    async def execute(
        self, plan: Plan, *, dry_run: bool = False, on_step: OnStep | None = None
    ) -> ActionResult:
        # The real steps: the checks read ``check_run``; the first failing one stops the plan.
        from supervisor.steps import execute

        return await execute(self, plan, dry_run=dry_run, on_step=on_step)  # type: ignore[arg-type]

    async def tail_log(self, host: str, run: str, lines: int = 50) -> LogTail:
        shown = [f"[00:0{i}:00] B2 wrote 50 responses ({i * 50} total)" for i in range(1, 6)]
        return LogTail(path=f"/data/{run}.log", exists=True, lines=shown[-lines:])

    def secret_values(self) -> list[str]:
        return []

    async def samples(self, run: RunView, dataset: str, count: int) -> LatestSamples:
        raise NotImplementedError("tail_records")

    def supervise(
        self, *, report_initial: bool = True, others: bool = True, started: float | None = None
    ) -> Supervision:
        self._supervision = Supervision(
            self.config, report_initial=report_initial, others=others, started=started
        )
        return self._supervision

    @property
    def supervision(self) -> Supervision:
        return self._supervision or self.supervise()

    async def tick(
        self,
        *,
        wait: float | None = None,
        on_progress: Callable[[Snapshot], None] | None = None,
        on_snapshot: Callable[[Snapshot], None] | None = None,
        snapshot: Snapshot | None = None,
        act: bool = True,
        events: bool = True,
    ) -> Tick:
        # The real loop over the fixed snapshots; no budget policy to apply.
        async def refresh() -> Snapshot:
            return snapshot if snapshot is not None else await self.refresh(on_progress)

        return await self.supervision.tick(
            refresh, stopping=self.stopping, on_snapshot=on_snapshot, events=events
        )

    async def cancel_restarts(
        self, run: str, why: str = "kill", on_wait: Callable[[str], None] | None = None
    ) -> str | None:
        return None  # no watcher intends anything for the fixed runs

    def record_stopped(self, run: str, why: str = "kill") -> str:
        return f"no restart of {run} pending"

    async def check_run(
        self, run: str, argv: list[str] | None = None, *, tokens: bool = False
    ) -> list[dict[str, Any]]:
        # What a full validation finds: B3 still holds records of the legacy text format.
        out = []
        for host in self.snapshot.hosts:
            for r in host.runs:
                for d in r.datasets if r.name == run else []:
                    legacy = d.verdict == "legacy"
                    out.append(
                        {
                            "path": d.path,
                            "state": "ok",
                            "verdict": d.verdict,
                            "verdict_detail": d.verdict_detail,
                            "records": d.records,
                            "partial_tail_bytes": 0,
                            "first_offending": {
                                "line": 1,
                                "format": "raw-legacy",
                                "missing": ["output_ids"],
                                "extra": ["text"],
                            }
                            if legacy
                            else None,
                        }
                    )
        return out

    def host(self, name: str) -> FixedHost:
        """What the real plan steps ask the host (not part of ``EngineLike``)."""
        return FixedHost(name)

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture
def fixed_engine() -> FixedEngine:
    return FixedEngine()


@pytest.fixture
def tui_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_cache_dir: Path
) -> Iterator[Any]:
    """The real demo (mock servers and two live runs of the reference client) in ``tmp_path``.

    Yields the ``supervisor.demo.launcher.Demo``; everything it started is stopped afterwards
    (and the test fails if anything could not be).
    """
    from supervisor.demo.launcher import new_demo, start_demo, stop_demo

    # The demo exports its variables into os.environ; keep them inside this test.
    for name in list(os.environ):
        if name.startswith("RUNWATCH_DEMO"):
            monkeypatch.delenv(name)
    saved = dict(os.environ)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(demo_cache_dir))
    directory = tmp_path / "demo"
    directory.mkdir()
    demo = new_demo(directory)
    out = io.StringIO()
    try:
        start_demo(demo, out)
        yield demo
    finally:
        stopped = stop_demo(demo, out)
        os.environ.clear()
        os.environ.update(saved)
        assert stopped, out.getvalue()


def demo_process(demo: Any, run: str) -> Any:
    """The ``Started`` record of a demo run (its Popen is ``.proc``)."""
    return next(s for s in demo.started if s.label == f"run {run}")


DETAIL_TABS = {"overview": "1", "log": "2", "samples": "3", "history": "4"}


def figure_text(row: Any) -> str:
    """A ``FigureRow``'s text; empty while it is mounted but not composed yet (no Static inside
    yet), so a wait on its text polls on instead of failing."""
    try:
        content = row.query_one(Static).content
    except NoMatches:
        return ""
    return str(getattr(content, "plain", content))


async def show_tab(pilot: Any, tab: str) -> None:
    """Press the run detail screen's key for ``tab`` and wait until the tab is active: a key the
    app has not handled yet when the test ends reaches an app with no screen left
    (``ScreenStackError``), and a test reading the tab's widget before then reads the wrong tab."""
    await pilot.press(DETAIL_TABS[tab])
    contents = pilot.app.screen.query_one(TabbedContent)
    await wait_for(lambda: contents.active == tab, what=f"the {tab} tab")
