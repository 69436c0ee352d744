"""The watcher follows its config file (``supervisor.reload``): a run added under a running
watcher is launched and its death seen without a restart of the watcher; a broken edit and a
change of what cannot change (the state key) are refused once each, naming the file, and the
watcher goes on with the config it had. Real watcher process, real demo runs, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.e2e.test_watch_cli import start, text
from tests.fixtures_actions import DemoRun
from tests.waiting import wait_until


def records(out: Path) -> list[dict[str, Any]]:
    """The JSON lines the watcher printed so far (a line being written is left for later)."""
    found = []
    for line in text(out).splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def events(out: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in records(out) if r.get("kind") == kind]


def ticks(out: Path) -> list[dict[str, Any]]:
    return [r for r in records(out) if "tick" in r]


def run_block(demo: DemoRun, name: str) -> str:
    """The ``[[runs]]`` table of ``demo``'s config, renamed ``name``."""
    body = demo.config_path.read_text()
    block = body[body.index("[[runs]]") : body.index("[[endpoints]]")]
    return block.replace('name = "demo"', f'name = "{name}"', 1)


def edit(path: Path, body: str) -> None:
    """As an editor saves: a new file renamed over the old one."""
    new = path.with_name(path.name + ".new")
    new.write_text(body)
    os.replace(new, path)


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "-c", str(config), *args],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def test_a_run_added_under_a_running_watcher_is_watched_and_bad_edits_are_refused_once(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    spawn: Callable[..., Any],
) -> None:
    demo = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    other = DemoRun(tmp_path / "b", slow_endpoint.url, max_samples=300)
    kill_runs_in += [demo.workdir, other.workdir]
    original = demo.config_path.read_text()
    out = tmp_path / "watch.out"
    watcher = start(spawn, demo.config_path, out, "--json")
    wait_until(lambda: len(ticks(out)) >= 2, 60, what="the watcher's refreshes")
    # Before the edit the run is not the config's: launching it is refused.
    refused = cli(demo.config_path, "launch", "second", "--yes")
    assert refused.returncode != 0 and "second" in refused.stderr

    # A run added: taken at the next refresh, said once.
    edit(demo.config_path, original + "\n" + run_block(other, "second"))
    wait_until(lambda: events(out, "config-reloaded"), 60, what="the reload")
    (reloaded,) = events(out, "config-reloaded")
    assert (
        str(demo.config_path) in reloaded["message"] and "run second added" in reloaded["message"]
    )
    launched = cli(demo.config_path, "launch", "second", "--yes", "--json")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    pid = int(json.loads(launched.stdout)["identity"]["pid"])
    wait_until(lambda: ticks(out)[-1]["running"] == 1, 60, what="the new run seen running")
    os.kill(pid, signal.SIGKILL)
    wait_until(
        lambda: [e for e in events(out, "run-died") if e["run"] == "second"],
        60,
        what="the new run's death seen by the same watcher",
    )

    # A broken edit: refused once for this version of the file, the watcher goes on.
    edit(demo.config_path, demo.config_path.read_text() + "\n[[runs]\n")
    wait_until(lambda: events(out, "config-refused"), 60, what="the refusal")
    seen = len(ticks(out))
    wait_until(lambda: len(ticks(out)) >= seen + 3, 60, what="refreshes after the refusal")
    (broken,) = events(out, "config-refused")
    assert str(demo.config_path) in broken["message"]
    assert "keeps the config it has" in broken["message"]
    assert broken["severity"] == "warning"

    # A change of the state key: refused, naming the fix; the runs stay those of the old config.
    edit(demo.config_path, 'project = "elsewhere"\n' + original + "\n" + run_block(other, "second"))
    wait_until(lambda: len(events(out, "config-refused")) == 2, 60, what="the second refusal")
    keyed = events(out, "config-refused")[1]
    assert "state key" in keyed["message"] and "restart it" in keyed["message"]
    assert len(events(out, "config-reloaded")) == 1

    # Back to the original: the added run is dropped, said as such.
    edit(demo.config_path, original)
    wait_until(lambda: len(events(out, "config-reloaded")) == 2, 60, what="the second reload")
    assert "run second dropped" in events(out, "config-reloaded")[1]["message"]
    watcher.send_signal(signal.SIGTERM)
    assert watcher.wait(30) == 0
    assert "Traceback" not in text(out)
