"""Fixtures for launch, restart, repair and the budget guard: real processes and real files."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.waiting import wait_until

if TYPE_CHECKING:
    from tests.fixtures_procs import FakeRun, FakeRuns

# A stand-in workload: prints, then runs until a stop file appears (or forever), ignoring nothing.
WORKLOAD = r"""
import os, sys, time
print("workload started", " ".join(sys.argv[1:]), flush=True)
print("key present" if os.environ.get("RW_TEST_KEY") else "no key", flush=True)
stop = os.environ.get("RW_STOP_FILE")
while not (stop and os.path.exists(stop)):
    time.sleep(0.05)
print("workload stopping", flush=True)
"""


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> digest)."""
    return {str(p.relative_to(root)): sha256_of(p) for p in sorted(root.rglob("*")) if p.is_file()}


def pid_alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    """A script that behaves like a long run: prints to stdout and waits for ``RW_STOP_FILE``."""
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    return script


@pytest.fixture
def python_exe() -> str:
    return sys.executable


@pytest.fixture
def kill_after() -> Iterator[list[int]]:
    """Append PIDs (session leaders) launched by a test; their groups are killed at teardown."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for pid in pids:
        wait_until(lambda pid=pid: not pid_alive(pid), timeout=10)  # type: ignore[misc]


# --------------------------------------------------------------------------- a demo run to act on

RUN_INFERENCE = Path(__file__).resolve().parent.parent / "supervisor" / "demo" / "run_inference.py"
API_KEY = "sk-demo-secret-key-0123456789"
KEY_ENV = "RW_DEMO_API_KEY"


def raw_record(sample_id: str, tokens: int = 5) -> bytes:
    """One complete line in the current (raw) format."""
    import json

    rec = {
        "sample_id": sample_id,
        "output_ids": list(range(tokens)),
        "prompt_tokens": 3,
        "completion_tokens": tokens,
        "finish_reason": "stop",
    }
    return (json.dumps(rec) + "\n").encode()


def legacy_record(sample_id: str) -> bytes:
    """One complete line in the older text format."""
    import json

    rec = {
        "sample_id": sample_id,
        "text": "an older response",
        "prompt_tokens": 3,
        "completion_tokens": 3,
        "finish_reason": "stop",
    }
    return (json.dumps(rec) + "\n").encode()


def write_legacy(path: Path, count: int) -> None:
    """A new data file (and its directory) of ``count`` complete lines in the older text format,
    sample ids ``B2-000000`` onwards."""
    path.parent.mkdir(parents=True)
    path.write_bytes(b"".join(legacy_record(f"B2-{i:06d}") for i in range(count)))


def why(result: Any) -> str:
    """The steps of a result, one per line, for assertion messages."""
    return "\n".join(f"{s.name} {s.state}: {s.detail}" for s in result.steps)


class DemoRun:
    """A workdir with demo prompts, a mock endpoint and a config whose run is the demo client
    (``log = None``: no ``log =``, so the launch log is ``data/.runwatch/run.log``;
    ``endpoint_toml``: the endpoint's kind and prices, ``kind = "api"`` unless given)."""

    def __init__(
        self,
        root: Path,
        url: str,
        *,
        datasets: tuple[str, ...] = ("B1", "B2"),
        max_samples: int = 40,
        prompts: int = 400,
        concurrency: int = 2,
        budgets: dict[str, int] | None = None,
        policy: str = "warn",
        host_toml: str = '[[hosts]]\nname = "local"\nlocal = true\n',
        host_name: str = "local",
        extra_argv: tuple[str, ...] = (),
        run_toml: str = "",
        log: str | None = "logs/run.log",
        endpoint_toml: str = 'kind = "api"',
    ) -> None:
        from supervisor.demo.prompts import write_prompts

        self.root = root
        self.workdir = root / "work"
        self.workdir.mkdir(parents=True, exist_ok=True)
        write_prompts(self.workdir / "prompts", datasets, prompts)
        self.datasets = datasets
        self.max_samples = max_samples
        self.argv = [
            sys.executable,
            str(RUN_INFERENCE),
            "--datasets",
            ",".join(datasets),
            "--api-base",
            url,
            "--api-key-env",
            KEY_ENV,
            "--model",
            "demo-model",
            "--max-samples",
            str(max_samples),
            "--concurrency",
            str(concurrency),
            "--output-dir",
            "data",
            "--prompts-dir",
            "prompts",
            "--report-seconds",
            "1",
            *extra_argv,
        ]
        lines = [
            host_toml,
            "[[runs]]",
            'name = "demo"',
            f'host = "{host_name}"',
            f"workdir = {_toml_str(str(self.workdir))}",
            "argv = [" + ", ".join(_toml_str(a) for a in self.argv) + "]",
            'output_dir = "data"',
            f"log = {_toml_str(log)}" if log else "",
            'endpoint = "mock"',
            f'budget_policy = "{policy}"',
            run_toml,
            "",
            "[[endpoints]]",
            'name = "mock"',
            endpoint_toml,
            f"base_url = {_toml_str(url)}",
            f'api_key_env = "{KEY_ENV}"',
            "",
        ]
        for ds, budget in (budgets or {}).items():
            lines += [f"[datasets.{ds}]", f"token_budget = {budget}", ""]
        self.config_path = root / "runwatch.toml"
        self.config_path.write_text("\n".join(lines))

    @property
    def config(self) -> Any:
        from supervisor.config import load_config

        return load_config(self.config_path)

    def data_file(self, ds: str) -> Path:
        return self.workdir / "data" / ds / "raw_responses.jsonl"

    def lines(self, ds: str) -> list[bytes]:
        try:
            return self.data_file(ds).read_bytes().splitlines(keepends=True)
        except FileNotFoundError:
            return []

    def complete_ids(self, ds: str) -> list[str]:
        import json

        return [json.loads(line)["sample_id"] for line in self.lines(ds) if line.endswith(b"\n")]

    def log_text(self) -> str:
        try:
            return (self.workdir / "logs" / "run.log").read_text()
        except FileNotFoundError:
            return ""


# --------------------------------------------------------------------------- an old script

BUDGET_LINE = (
    '    p.add_argument("--token-budget", type=int, default=None, '
    'help="completion tokens per dataset")\n'
)


EXACT_TYPE = 'p.add_argument("--concurrency", type=int,'
INEXACT_TYPE = 'p.add_argument("--concurrency", type=lambda text: int(text),'


def old_script(demo: DemoRun, *, exact: bool = True) -> str:
    """The run's script becomes a copy of the demo client from before ``--token-budget``: the
    option removed from its parser, its uses read as "no budget". ``exact=False``: its
    ``--concurrency`` has a type of its own, so its parser cannot be read exactly (only its
    options are). Returns the old script's source."""
    source = RUN_INFERENCE.read_text()
    assert BUDGET_LINE in source and EXACT_TYPE in source
    old = source.replace(BUDGET_LINE, "").replace("args.token_budget", "None")
    if not exact:
        old = old.replace(EXACT_TYPE, INEXACT_TYPE)
    (demo.workdir / "run_inference.py").write_text(old)
    text = demo.config_path.read_text()
    demo.config_path.write_text(text.replace(str(RUN_INFERENCE), "run_inference.py"))
    return old


async def launch(
    engine: Any, run: str, overrides: Iterable[str] = (), *, dry_run: bool = False
) -> Any:
    """Plan and execute a launch through the front door, as ``runwatch launch --yes`` does."""
    plan = await engine.plan(run, action="launch", overrides=overrides)
    return await engine.execute(plan, dry_run=dry_run)


async def restart(
    engine: Any,
    run: str,
    overrides: Iterable[str] = (),
    *,
    move_aside: bool = False,
    allow_change: Iterable[str] = (),
    dry_run: bool = False,
    on_step: Any = None,
) -> Any:
    """Plan and execute a restart through the front door, as ``runwatch restart --yes`` does."""
    plan = await engine.plan(
        run, action="restart", overrides=overrides, move_aside=move_aside, allow_change=allow_change
    )
    return await engine.execute(plan, dry_run=dry_run, on_step=on_step)


def _toml_str(s: str) -> str:
    import json

    return json.dumps(s)  # a JSON string is a valid TOML basic string


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private XDG state dir (audit log, guard markers) with the demo API key set."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(KEY_ENV, API_KEY)
    return tmp_path / "state" / "runwatch"


@pytest.fixture
def mock_endpoint() -> Iterator[Any]:
    """A paced mock server requiring the demo API key: about 0.4 s per response."""
    from supervisor.demo.server import MockSettings, serve_in_thread

    settings = MockSettings(decode_tps=100.0, mean_tokens=40, length_sigma=0.3, api_key=API_KEY)
    with serve_in_thread(settings) as handle:
        yield handle


@pytest.fixture
def slow_endpoint() -> Iterator[Any]:
    """A mock server slow enough that a run stays mid-flight for the whole test (~1 s each)."""
    from supervisor.demo.server import MockSettings, serve_in_thread

    settings = MockSettings(decode_tps=40.0, mean_tokens=40, length_sigma=0.3, api_key=API_KEY)
    with serve_in_thread(settings) as handle:
        yield handle


def run_pids(workdir: Path) -> list[int]:
    """PIDs of live demo clients whose working directory is ``workdir``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if str(RUN_INFERENCE).encode() in argv and cwd == str(workdir) and pid_alive(pid):
            found.append(pid)
    return found


@pytest.fixture
def kill_runs_in() -> Iterator[list[Path]]:
    """Append workdirs; every demo client still running in them is killed at teardown."""
    dirs: list[Path] = []
    yield dirs
    for d in dirs:
        for pid in run_pids(d):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda d=d: not run_pids(d), timeout=10)  # type: ignore[misc]


@pytest.fixture
def slow_demo(tmp_path: Path, slow_endpoint: Any, kill_runs_in: list[Path]) -> DemoRun:
    """A demo run of 300 samples against ``slow_endpoint``; its clients are killed at teardown."""
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    return demo


def host_toml(cfg: Any) -> str:
    """A ``[[hosts]]`` table for a HostConfig (e.g. the test sshd's)."""
    import msgspec

    lines = ["[[hosts]]"]
    for key, value in msgspec.to_builtins(cfg).items():
        if value is None or value == [] or value is False:
            continue
        if isinstance(value, list):
            lines.append(f"{key} = [" + ", ".join(_toml_str(str(v)) for v in value) + "]")
        elif isinstance(value, bool):
            lines.append(f"{key} = true")
        elif isinstance(value, (int, float)):
            lines.append(f"{key} = {value}")
        else:
            lines.append(f"{key} = {_toml_str(str(value))}")
    return "\n".join(lines) + "\n"


@contextlib.asynccontextmanager
async def engine_for(demo: DemoRun) -> AsyncIterator[Any]:
    """An engine over the demo's config, closed on the way out."""
    from supervisor.engine import Engine

    engine = Engine(demo.config)
    try:
        yield engine
    finally:
        await engine.aclose()


# --------------------------------------------------------------------------- a run past its budget

OVER_BUDGET_ARGS = ("--datasets", "B1", "--output-dir", "out")


def over_budget_stop_run(
    tmp_path: Path, fake_runs: FakeRuns, *, seed: int, top: str = "", ignore_term: bool = False
) -> tuple[FakeRun, Path]:
    """A live fake run ``gen`` on this machine whose B1 data (40 records) is already twice its
    token budget, under ``budget_policy = "stop"``: the run and its config ``<tmp>/rw.toml``.
    ``ignore_term``: the run ignores SIGTERM (its stop lasts the 5 s grace, then KILL)."""
    # Imported here: fixture modules are loaded as plugins, each before anything imports it.
    from tests.fixtures_config import write_local_config
    from tests.fixtures_data import make_raw

    work = tmp_path / "w"
    (work / "out" / "B1").mkdir(parents=True)
    truth = make_raw(work / "out" / "B1" / "raw_responses.jsonl", 40, seed=seed)
    run = fake_runs.start(*OVER_BUDGET_ARGS, cwd=work, ignore_term=ignore_term)
    cfg = write_local_config(
        tmp_path / "rw.toml",
        f"""
[datasets.B1]
token_budget = {truth.completion_tokens // 2}

[[runs]]
name = "gen"
host = "here"
workdir = "{work}"
argv = {json.dumps(["python3", "run_inference.py", *OVER_BUDGET_ARGS])}
budget_policy = "stop"
stop_grace_seconds = 5.0
""",
        top=f'scripts = ["run_inference.py"]\n{top}',
    )
    return run, cfg


def runwatch(*args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """``runwatch ARGS`` as a separate process (the engine's CLI), stdin closed, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --------------------------------------------------------------------------- rebalance


def status_json(cfg: Path) -> dict[str, Any]:
    """``runwatch status --json`` of ``cfg``, parsed."""
    p = runwatch("-c", str(cfg), "status", "--json")
    assert p.returncode in (0, 1), p.stderr
    return dict(json.loads(p.stdout))


def datasets_of(status: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Dataset name -> its views in ``status`` (one per configured run naming it), each with
    its ``run``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for host in status["hosts"]:
        for run in host["runs"]:
            if not run.get("configured", True):
                continue  # another's process on this machine
            for d in run["datasets"]:
                out.setdefault(d["name"], []).append(dict(d, run=run["name"]))
    return out


def bench_endpoint(cfg: Path, endpoint: str, prompts: str, requests: int = 16) -> None:
    """``runwatch bench ENDPOINT --prompts PROMPTS`` (a dataset of the config, or a file) at
    concurrency 16, as a user measures an endpoint no run uses yet."""
    p = runwatch(
        "-c", str(cfg), "bench", endpoint, "--prompts", prompts, "--requests", str(requests),
        "--concurrency", "16", "--json",
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def pids_by_run(cfg: Path) -> dict[str, int | None]:
    """Configured run -> the pid ``status`` shows running it (None: not running)."""
    return {
        r["name"]: (r["process"] or {}).get("identity", {}).get("pid")
        for h in status_json(cfg)["hosts"]
        for r in h["runs"]
        if r.get("configured", True)
    }


def rebalance_applied(cfg: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """``rebalance --apply --yes --json`` once the running runs have rates (until then the
    plan is refused, nothing changed): its exit status and its output."""
    last: list[str] = []

    def applied_once() -> tuple[int, dict[str, Any]] | None:
        p = runwatch("-c", str(cfg), "rebalance", *args, "--apply", "--yes", "--json")
        last[:] = [p.stdout + p.stderr]
        out = json.loads(p.stdout) if p.stdout.strip() else {}
        if "no throughput measured" in str(out.get("refused")):
            return None
        return p.returncode, dict(out)

    try:
        return wait_until(applied_once, timeout=240, interval=0.5)
    except AssertionError:
        raise AssertionError(f"never applied: {last}") from None
