"""``--set`` / ``--unset`` through the real CLI and the start gate (O10).

An override replaces a flag's whole value: the plan's argv holds no stray piece of the old
value, and a flag the config's argv gives abbreviated (``--temp 0.6``, which argparse expands to
``--temperature``) is refused at the preflight, since replacing the full name would leave the
abbreviation's value to the client. Real parts: the CLI as a process, the engine, the agent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.fixtures_actions import DemoRun, engine_for, run_pids, runwatch, why


def test_o10_the_cli_plan_replaces_a_dash_value_whole(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url, extra_argv=("--extra-args", "--y 2", "--shift=-x"))
    kill_runs_in.append(demo.workdir)
    cfg = str(demo.config_path)
    out = runwatch(
        "-c", cfg, "launch", "demo", "--set", "extra-args=--x 1", "--unset", "shift",
        "--force", "--dry-run", "--json",
    )  # fmt: skip
    result = json.loads(out.stdout)
    argv = result["argv"]
    assert "--extra-args=--x 1" in argv, argv
    assert "--y 2" not in argv and not any(a.startswith("--shift") for a in argv), argv
    assert argv.count("--extra-args=--x 1") == 1
    assert run_pids(demo.workdir) == []  # a dry run starts nothing


async def test_o10_a_flag_also_given_abbreviated_is_refused_at_the_preflight(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url, extra_argv=("--temp", "0.6", "--max-tok", "50"))
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        for sets, unsets, flag, short in (
            ([], ["temperature"], "--temperature", "--temp"),
            (["temperature=0.9"], [], "--temperature", "--temp"),
            (["max-tokens=20"], [], "--max-tokens", "--max-tok"),
        ):
            plan = await engine.plan("demo", action="launch", overrides=sets, unsets=unsets)
            result = await engine.execute(plan)
            assert not result.ok
            step = result.failed_step
            assert step is not None and step.name == "preflight", why(result)
            assert f"{flag}: the command line also gives it as {short}" in step.detail
            assert f"write {flag} in full in the config's argv" in step.detail
            assert run_pids(demo.workdir) == []
        # without an override the config's argv is the user's to write: it launches
        plain = await engine.plan("demo", action="launch")
        assert (await engine.execute(plain, dry_run=True)).ok
