"""Issue 21, part 5: text from hosts is data. Escape sequences and control characters in a
serving engine's ``/metrics`` body and in a Slurm job's comment and name arrive escaped
(``\\x1b``) in the CLI and the dashboard, never raw and never as markup; runwatch's own terminal
controls still work. (Argv and log lines: ``test_trust_secrets``.)"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import load_config
from supervisor.display import escape_control
from supervisor.engine import Engine
from supervisor.hosts import LocalHost
from tests.fixtures_config import write_local_config
from tests.fixtures_slurm import SlurmCluster
from tests.fixtures_tui import figure_text
from tests.waiting import wait_for, wait_until
from tui.app import make_app
from tui.widgets.serving import FigureRow

RUNWATCH = [sys.executable, "-m", "supervisor.cli"]
TITLE = "\x1b]0;owned-title\x07"
BODY = f'sglang:num_running_reqs{{model="a",,{TITLE}\x1b[2J[bold]not markup[/bold]}} 1\n'


@pytest.fixture
def hostile_metrics() -> Iterator[str]:
    """A loopback server whose ``/metrics`` body is not Prometheus text: escapes and markup."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = BODY.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RUNWATCH, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=180, check=False,
    )  # fmt: skip


def _screen_text(app: Any) -> str:
    svg = app.export_screenshot()
    return html.unescape("".join(re.findall(r">([^<]*)</text>", svg))).replace("\xa0", " ")


async def test_t3_an_escape_sequence_in_metrics_arrives_escaped_in_cli_and_dashboard(
    tmp_path: Path, hostile_metrics: str
) -> None:
    cfg = write_local_config(
        tmp_path / "c.toml",
        f"""
[[runs]]
name = "gen"
host = "here"
workdir = "{tmp_path}"
argv = ["python3", "run_inference.py", "--datasets", "B1"]
endpoint = "srv"
[[endpoints]]
name = "srv"
kind = "local"
base_url = "{hostile_metrics}"
""",
    )
    status = _cli("status", "-c", str(cfg))
    assert status.returncode == 0, status.stderr
    assert "\x1b" not in status.stdout + status.stderr
    assert "\\x1b]0;owned-title\\x07\\x1b[2J" in status.stdout
    as_json = _cli("status", "-c", str(cfg), "--json")
    assert "\x1b" not in as_json.stdout  # JSON carries it as \u001b: data, escaped by JSON
    (ep,) = json.loads(as_json.stdout)["hosts"][0]["endpoints"]
    assert TITLE in ep["why"]  # the data itself is unchanged

    app = make_app(load_config(cfg), Engine(load_config(cfg)))
    async with app.run_test(size=(160, 48)):

        def row() -> FigureRow | None:
            return next((r for r in app.screen.query(FigureRow) if r.key == "ep-srv"), None)

        await wait_for(
            lambda: row() is not None and "metrics" in figure_text(row()), 30, what="row"
        )
        shown = figure_text(row())
    assert "\\x1b]0;owned-title\\x07" in shown and "\x1b" not in shown
    assert "[bold]not markup[/bold]" in shown  # shown as written, never parsed as markup


async def test_t4_escapes_in_a_slurm_comment_arrive_escaped_in_cli_and_dashboard(
    tmp_path: Path, state_home: Path, slurm_env: SlurmCluster
) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nsleep 120\n")
    comment = f"runwatch:gen{TITLE}\x1b[31m"
    name = "\x1b[2Jjob\rname"
    out = slurm_env.run(
        "sbatch", "--parsable", f"--chdir={tmp_path}", f"--output={tmp_path / 'j-%j.log'}",
        f"--comment={comment}", f"--job-name={name}", str(script),
    )  # fmt: skip
    job_id = out.stdout.strip().split(";")[0]
    wait_until(lambda: slurm_env.job_state(job_id) in ("RUNNING", "PENDING"), 30, what="the job")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[[hosts]]\nname = "login"\nlocal = true\nkind = "slurm"\n\n'
        f'[[runs]]\nname = "gen"\nhost = "login"\nworkdir = "{tmp_path}"\n'
        'argv = ["python3", "run_inference.py", "--datasets", "B1", "--output-dir", "out"]\n'
    )
    ps = _cli("ps", "-c", str(cfg))
    assert ps.returncode == 0, ps.stderr
    assert f"job {job_id}" in ps.stdout, ps.stdout
    assert "\x1b" not in ps.stdout + ps.stderr and "\r" not in ps.stdout
    assert escape_control(comment) in ps.stdout  # runwatch:gen\x1b]0;owned-title\x07\x1b[31m

    # Adopted, the job is the run's: its squeue fields reach the dashboard as data.
    adopted = _cli("adopt", "gen", "--job", job_id, "-c", str(cfg), "--yes")
    assert adopted.returncode == 0, adopted.stdout + adopted.stderr
    assert "\x1b" not in adopted.stdout + adopted.stderr
    assert escape_control(comment) in adopted.stdout + adopted.stderr
    app = make_app(load_config(cfg), Engine(load_config(cfg)))
    async with app.run_test(size=(160, 48)):
        await wait_for(
            lambda: (found := app.find_run("login/gen")) is not None and found[1].job is not None,
            30,
            what="the adopted job in the dashboard",
        )
        found = app.find_run("login/gen")
        assert found is not None and found[1].job is not None
        shown_tag = found[1].job.tag
        await wait_for(
            lambda: f"Slurm job {job_id}" in _screen_text(app), 30, what="the job on screen"
        )
        screen = _screen_text(app)
    assert shown_tag == escape_control(comment)
    assert f"Slurm job {job_id}" in screen and "\x1b" not in screen


def test_t5_the_cli_filter_escapes_host_text_but_keeps_runwatch_controls() -> None:
    """The one output filter of the CLI: a control character written as text is escaped, a
    terminal control runwatch writes for itself (``write_control``) goes through as it is."""
    code = (
        "import sys\n"
        "from supervisor.cli._common import SafeStream, write_control\n"
        "out = SafeStream(sys.stdout)\n"
        "write_control(out, '\\r\\x1b[K')\n"
        "out.write('host says \\x1b]0;t\\x07 \\x9b2J \\u202edone\\ttab\\n')\n"
        "out.flush()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True)
    assert done.stdout == (b"\r\x1b[K" + b"host says \\x1b]0;t\\x07 \\x9b2J \\u202edone\ttab\n")


HOST_SCRIPT = r"""
import os, sys, time
with open(sys.argv[-1], "w") as log:
    log.write("token " + os.environ["MY_SERVICE_TOKEN"] + " accepted\n")
    log.write("sent x-api-key: " + sys.argv[sys.argv.index("--header") + 1].split(": ")[1] + "\n")
    log.flush()
    open(sys.argv[-1] + ".ready", "w").close()
    time.sleep(120)
"""


async def test_t6_the_host_masks_what_it_read_before_text_crosses_the_channel(
    tmp_path: Path, host: LocalHost
) -> None:
    """A secret only the host knows (the run's environment, its argv) never reaches the laptop:
    this process does not know the values, so only the agent can have masked them."""
    env_value, header_value = "host-only-env-" + os.urandom(6).hex(), "hdr-" + os.urandom(8).hex()
    script = tmp_path / "run_inference.py"
    script.write_text(HOST_SCRIPT)
    log = tmp_path / "run.log"
    proc = subprocess.Popen(
        [sys.executable, str(script), "--header", f"x-api-key: {header_value}", str(log)],
        env={**os.environ, "MY_SERVICE_TOKEN": env_value},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: Path(f"{log}.ready").exists(), 30, what="the run's log")
        assert env_value in log.read_text() and header_value in log.read_text()
        listing = await host.request("ps", {"scripts": ["run_inference.py"]})
        assert any(p["identity"]["pid"] == proc.pid for p in listing["processes"])
        tail = await host.request("tail_log", {"path": str(log), "lines": 10})
    finally:
        proc.kill()
        proc.wait(10)
    text = json.dumps([listing, tail])
    assert env_value not in text and header_value not in text
    assert tail["lines"] == ["token *** accepted", "sent x-api-key: ***"]


def test_t9_a_file_name_with_an_escape_sequence_is_shown_escaped(tmp_path: Path) -> None:
    name = f"{TITLE}\x1b[2Jdata.jsonl"
    path = tmp_path / name
    record = {"sample_id": "B1-0", "output_ids": [1, 2], "prompt_tokens": 1,
              "completion_tokens": 2, "finish_reason": "stop"}  # fmt: skip
    path.write_text(json.dumps(record) + "\n")
    done = _cli("scan", str(path))
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout + done.stderr
    assert escape_control(str(path)) in done.stdout
    as_json = _cli("scan", str(path), "--json")
    assert as_json.returncode == 0, as_json.stderr
    (entry,) = json.loads(as_json.stdout)["files"]
    assert entry["path"] == str(path)  # the data keeps the real name
