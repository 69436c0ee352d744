"""A flag the installed script does not declare is refused before anything stops, whatever the
client profile lists (row A12 of ``docs/reliability.md``): the incident's over-budget alert,
``restart eagle3-kimi --set token-budget=10000000``, on a host whose script is an older one without
``--token-budget``. Real clients, a real mock endpoint, the real CLI."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from supervisor.engine import Engine
from tests.fixtures_actions import (
    DemoRun,
    launch,
    old_script,
    pid_alive,
    runwatch,
    why,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("state_home")


@pytest.mark.parametrize("exact", [True, False], ids=["parser-read-exactly", "options-read-only"])
def test_a12_a_flag_the_installed_script_lacks_is_refused_before_the_stop(
    tmp_path: Path, slow_endpoint: Any, kill_after: list[int], exact: bool
) -> None:
    """The profile lists ``--token-budget``; the host's script does not declare it. The alert's
    command (confirmed: ``--yes``) is refused before the stop, exit non-zero, naming the fix;
    the run keeps running under the same pid, the bytes it had written untouched."""
    demo = DemoRun(tmp_path, slow_endpoint.url, datasets=("B1",), max_samples=300)
    old_script(demo, exact=exact)

    async def go() -> Any:
        async with Engine(demo.config) as engine:
            return await launch(engine, "demo")

    launched = asyncio.run(go())
    assert launched.ok, why(launched)
    pid = int(launched.identity["pid"])
    kill_after.append(pid)
    wait_until(lambda: len(demo.complete_ids("B1")) >= 2, timeout=60)
    before = demo.data_file("B1").read_bytes()
    out = runwatch(
        "-c", str(demo.config_path), "restart", "demo", "--set", "token-budget=10000000", "--yes"
    )
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "[FAILED] preflight" in text and "nothing was stopped" in text, text
    assert "--token-budget: not a flag of the client" in text, text
    assert "the installed run_inference.py does not declare it" in text, text
    script = demo.workdir / "run_inference.py"
    assert f"copy it to {script} on local" in text, text
    assert "run the same command again with --script PATH" in text, text
    assert "stop:" not in text.split("running:", 1)[1], text
    assert pid_alive(pid), text
    assert "did you mean" not in text, text
    after = demo.data_file("B1").read_bytes()
    assert after[: len(before)] == before
    assert "unrecognized arguments" not in demo.log_text()
