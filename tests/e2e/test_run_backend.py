"""Whether a run talks to a local server or an API: the endpoint its config run names decides;
the host's guess from ``--api-base`` stands only for processes of no config run. Real processes,
the real engine and ``ps``, and the real demo."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.config import Config, EndpointConfig, HostConfig, RunConfig
from supervisor.engine import Engine
from supervisor.hosts import LocalHost, list_processes
from supervisor.model import ProcessInfo, RunView
from tests.fixtures_procs import FakeRuns

# One local router in front of both a local server and an API (a LiteLLM-style proxy): the URL
# alone cannot tell which backend a run uses, and a loopback URL says "local" to the host.
ROUTER = "http://127.0.0.1:4000/v1"


def _args(api_base: str, dataset: str) -> list[str]:
    return ["--datasets", dataset, "--output-dir", "out", "--api-base", api_base]


def _config(gpu_dir: Path, api_dir: Path) -> Config:
    def run(name: str, work: Path, dataset: str, endpoint: str) -> RunConfig:
        argv = ["python3", "run_inference.py", *_args(ROUTER, dataset)]
        return RunConfig(name=name, host="here", workdir=str(work), argv=argv, endpoint=endpoint)

    return Config(
        scripts=["run_inference.py"],
        hosts=[HostConfig(name="here", local=True, command_timeout=30.0)],
        runs=[run("gpu", gpu_dir, "B1", "router-local"), run("api", api_dir, "B5", "router-api")],
        endpoints=[
            EndpointConfig(name="router-local", kind="local", base_url=ROUTER),
            EndpointConfig(name="router-api", kind="api", base_url=ROUTER + "/"),
            EndpointConfig(name="vendor", kind="api", base_url="http://10.1.2.3:8000/v1"),
        ],
    )


async def test_the_config_runs_endpoint_decides_the_backend(
    tmp_path: Path, fake_runs: FakeRuns
) -> None:
    gpu_dir, api_dir, other_dir = (tmp_path / n for n in ("gpu", "api", "other"))
    for d in (gpu_dir, api_dir, other_dir):
        d.mkdir()
    gpu = fake_runs.start(*_args(ROUTER, "B1"), cwd=gpu_dir)
    api = fake_runs.start(*_args(ROUTER, "B5"), cwd=api_dir)
    # Processes of no config run: the host's guess, unless the URL is a configured endpoint's.
    stray = fake_runs.start(*_args("http://127.0.0.1:9/v1", "C1"), cwd=other_dir)
    remote = fake_runs.start(*_args("https://api.example.com/v1", "C2"), cwd=other_dir)
    vendor = fake_runs.start(*_args("http://10.1.2.3:8000/v1", "C3"), cwd=other_dir)
    config = _config(gpu_dir, api_dir)
    want = {
        gpu.pid: ("gpu", "local"),
        api.pid: ("api", "api"),
        stray.pid: (None, "local"),
        remote.pid: (None, "api"),
        vendor.pid: (None, "api"),
    }

    def seen(procs: list[ProcessInfo]) -> dict[int, tuple[str | None, str]]:
        return {p.identity.pid: (p.run, p.flags.backend) for p in procs if p.identity.pid in want}

    async with Engine(config) as engine:
        snap = await engine.refresh()
    (host,) = snap.hosts
    assert seen(host.processes) == want
    runs = {r.name: r for r in host.runs}
    assert runs["api"].process is not None and runs["api"].process.flags.backend == "api"
    assert runs["gpu"].process is not None and runs["gpu"].process.flags.backend == "local"
    # `ps` (and `kill RUN`) list the same backends.
    agent = LocalHost(config.hosts[0])
    try:
        assert seen(await list_processes(agent, config)) == want
    finally:
        await agent.close()


async def test_the_demo_api_run_on_loopback_is_an_api(tui_demo: Any) -> None:
    runs: dict[str, RunView] = {}
    async with Engine(tui_demo.config) as engine:
        # The demo confirmed both runs started; each refresh is one real poll of the host.
        for _ in range(50):
            snap = await engine.refresh()
            runs = {r.name: r for h in snap.hosts for r in h.runs}
            if all(runs.get(n) and runs[n].process for n in ("api", "local-gpu")):
                break
    api, local = runs["api"].process, runs["local-gpu"].process
    assert api is not None and local is not None, runs
    assert (api.flags.api_base or "").startswith("http://127.0.0.1:")  # the host guesses local
    assert api.flags.backend == "api"
    assert local.flags.backend == "local"
