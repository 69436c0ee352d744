"""Every host-side query has one deadline for the whole operation and a byte cap: a `/metrics`
that drips its answer, one that is huge, a hung or babbling `nvidia-smi` make that one figure
stale, truncated or unreadable with the reason shown, never the host disconnected; a child
started for a query is killed with its process group and reaped. Real HTTP servers, the real
agent through the real engine; `nvidia-smi` (an edge we do not own) is a script on PATH."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from supervisor.agent import bounded
from supervisor.cli.status import render
from supervisor.config import load_config
from supervisor.engine import Engine
from tests.e2e.test_servermetrics import SGLANG_TEXT
from tests.fixtures_config import write_local_config
from tests.waiting import wait_until

GOOD = SGLANG_TEXT % {"gen0": 100.0, "gen1": 50.0, "b1": 1, "b2": 2, "b3": 3}


class MetricsServer:
    """``/good``: SGLang's text; ``/drip``: headers, then one byte a second of a long body;
    ``/huge``: SGLang's text followed by more than 4 MiB of further samples."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self) -> None:
                if self.path == "/good":
                    self._send(GOOD.encode())
                elif self.path == "/huge":
                    pad = "".join(f'sglang:pad_total{{i="{i}"}} {i}.0\n' for i in range(200_000))
                    self._send((GOOD + pad).encode())
                elif self.path == "/drip":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(GOOD)))
                    self.end_headers()
                    for ch in GOOD.encode():
                        if server.stop.wait(1.0):
                            return
                        self.wfile.write(bytes([ch]))
                        self.wfile.flush()
                else:
                    self.send_error(404)

            def _send(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metrics_server() -> Iterator[MetricsServer]:
    s = MetricsServer()
    yield s
    s.close()


def _config(tmp_path: Path, endpoints: dict[str, str], command_timeout: float = 12.0) -> Path:
    body = ""
    for name, url in endpoints.items():
        body += f"""
[[runs]]
name = "run-{name}"
host = "here"
workdir = "{tmp_path}"
argv = ["python3", "run_inference.py", "--datasets", "B1"]
endpoint = "{name}"
[[endpoints]]
name = "{name}"
kind = "local"
base_url = "{url}"
metrics_url = "{url}"
"""
    cfg = write_local_config(tmp_path / "c.toml", body)
    text = cfg.read_text().replace(
        "local = true\n", f"local = true\ncommand_timeout = {command_timeout}\n", 1
    )
    cfg.write_text(text)
    return cfg


async def test_a_dripping_metrics_is_cut_at_its_deadline_and_the_host_stays_connected(
    tmp_path: Path, metrics_server: MetricsServer
) -> None:
    """`/metrics` answering one byte a second: on main the refresh waited for it until the
    command timeout and the host showed DISCONNECTED; now that endpoint says why it has no
    figures and the other endpoint of the host has its figures, in the same refresh."""
    cfg = _config(
        tmp_path, {"slow": metrics_server.url("/drip"), "fast": metrics_server.url("/good")}
    )
    async with Engine(load_config(cfg)) as engine:
        snap = await engine.refresh()
    (host,) = snap.hosts
    assert host.connected and not host.stale, host.error
    views = {em.name: em for em in host.endpoints}
    assert not views["slow"].available
    assert views["slow"].why == "no complete answer within 2 s"
    assert views["fast"].available and views["fast"].engine == "sglang", views["fast"].why


async def test_a_metrics_body_over_the_cap_is_read_up_to_its_cut(
    tmp_path: Path, metrics_server: MetricsServer
) -> None:
    """A body over 4 MiB: on main the text was cut mid-line and the whole endpoint was
    "unreadable"; now its figures come from the whole lines before the cap, marked so."""
    cfg = _config(tmp_path, {"big": metrics_server.url("/huge")})
    async with Engine(load_config(cfg)) as engine:
        snap = await engine.refresh()
    (em,) = snap.hosts[0].endpoints
    assert em.available, em.why
    assert (em.running.value, em.queued.value) == (16, 3)
    assert em.note == "/metrics over 4 MiB: figures from its first 4 MiB only"
    assert "/metrics over 4 MiB" in render(snap)


def _smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + script)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("RW_TEST_PIDS", str(tmp_path / "pids"))
    return smi


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_a_hung_nvidia_smi_is_killed_with_its_children_and_the_refresh_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung `nvidia-smi` (a wrapper whose child never ends): on main every call left that
    child behind; now the refresh comes back with the GPUs' reason and no child is left."""
    _smi(tmp_path, monkeypatch, 'sleep 300 &\necho $$ $! >> "$RW_TEST_PIDS"\nwait\n')
    cfg = _config(tmp_path, {})
    seen: list[str | None] = []
    async with Engine(load_config(cfg)) as engine:
        while not seen or "(stopped)" not in (seen[-1] or ""):
            assert len(seen) < 20, seen
            (host,) = (await engine.refresh()).hosts
            assert host.connected, host.error
            assert host.gpus == []
            seen.append(host.gpu_error)
    # The refreshes went on while nvidia-smi was asked; it was asked once, not once per refresh.
    assert seen[0] == "nvidia-smi: no answer yet after 2 s (still asked)"
    assert seen[-1] == "nvidia-smi failed: no answer within 5 s (stopped)"
    lines = (tmp_path / "pids").read_text().splitlines()
    assert len(lines) == 1
    pids = [int(p) for p in lines[0].split()]
    wait_until(lambda: not any(_alive(p) for p in pids), 10, what="the query's children gone")


async def test_garbage_from_nvidia_smi_is_marked_unreadable_never_shown_as_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Output that is not nvidia-smi's CSV: on main it showed as "GPUNone inf%"."""
    _smi(
        tmp_path,
        monkeypatch,
        'case "$1" in\n  --query-gpu=*) echo "NVIDIA, x, y, z, inf"; echo "oops";;\n'
        '  *) echo "No devices were found";;\nesac\n',
    )
    cfg = _config(tmp_path, {})
    async with Engine(load_config(cfg)) as engine:
        snap = await engine.refresh()
    (host,) = snap.hosts
    assert host.connected and host.gpus == []
    assert host.gpu_error is not None
    assert host.gpu_error.startswith("nvidia-smi output unreadable (2 line(s)")
    text = render(snap)
    assert "GPUs: nvidia-smi output unreadable" in text
    assert "GPUNone" not in text and "inf%" not in text


def test_a_child_over_the_byte_cap_is_cut_and_its_group_killed(tmp_path: Path) -> None:
    """The output cap ends the query as the deadline does: the child and its own children go."""
    pids = tmp_path / "pids"
    script = f'sleep 300 &\necho $! > "{pids}"\nexec yes runwatch\n'
    done = bounded.run(["sh", "-c", script], 30.0, 1 << 16)
    assert done.problem == "output over 65536 bytes" and done.returncode is None
    assert len(done.stdout) == 1 << 16 and done.stdout.startswith(b"runwatch\n")
    sleeper = int(pids.read_text())
    wait_until(lambda: not _alive(sleeper), 10, what="the child's child gone")


def test_a_quick_child_keeps_its_exit_status_and_whole_output() -> None:
    done = bounded.run(["sh", "-c", "echo out; echo err >&2; exit 3"], 10.0, 1 << 16)
    assert (done.stdout, done.stderr, done.returncode, done.problem) == (
        b"out\n",
        b"err\n",
        3,
        None,
    )


def test_metrics_on_a_port_that_accepts_and_never_answers_is_bounded() -> None:
    """A listener whose backlog accepts the connection but never reads or answers."""
    from supervisor.agent.metrics import fetch_one

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        got = fetch_one(f"http://127.0.0.1:{port}/metrics", timeout=1.0)
    assert got == {"ok": False, "error": "no complete answer within 1 s", "kind": "timeout"}
    assert json.dumps(got)  # travels on the channel as is


def test_a_slow_nvidia_smi_leaves_the_last_figures_marked_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvidia-smi answers, then hangs: the next refresh has the last figures, said to be old
    and why, instead of waiting for it."""
    from supervisor.agent import gpu

    hang = tmp_path / "hang"
    _smi(
        tmp_path,
        monkeypatch,
        f'if [ -e "{hang}" ]; then sleep 300 & echo $! >> "$RW_TEST_PIDS"; wait; fi\n'
        'case "$1" in\n  --query-gpu=*) echo "0, GPU-a, H100, 97, 100, 200, 300.5, 70";;\n'
        '  *) echo "4242, GPU-a, 100";;\nesac\n',
    )
    poller = gpu.Poller(lambda: gpu.query_gpu(timeout=3.0), wait_s=0.5)
    per_pid, summary = poller.get()
    assert per_pid == {4242: 100.0} and summary["gpus"][0]["utilization_pct"] == 97.0
    hang.touch()
    per_pid, summary = poller.get()
    assert per_pid == {4242: 100.0} and summary["gpus"][0]["pids"] == [4242]
    assert re.fullmatch(
        r"nvidia-smi slow: no answer for \d+ s; figures from \d+ s ago", summary["error"]
    )
    sleeper = int((tmp_path / "pids").read_text().split()[0])
    wait_until(lambda: not _alive(sleeper), 15, what="the hung query's child gone")
    hang.unlink()
    per_pid, summary = wait_until(lambda: poller.get(), 15)
    while "error" in summary:  # the answer of the query asked while it still hung, once
        assert "no answer within 3 s (stopped)" in summary["error"]
        per_pid, summary = poller.get()
    assert per_pid == {4242: 100.0} and summary["gpus"][0]["utilization_pct"] == 97.0


async def test_a_hung_squeue_leaves_the_last_jobs_shown_stale_and_the_host_connected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slurm_env: Any
) -> None:
    """A login node whose `squeue` hangs after a first good listing: on main the refresh
    waited for it until the command timeout and the host showed DISCONNECTED; now the listing
    has a deadline of its own, the last jobs are shown with their age and why, and the hung
    squeue is killed with its children."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("RW_TEST_PIDS", str(tmp_path / "pids"))
    cfg = write_local_config(tmp_path / "c.toml", "")
    cfg.write_text(
        cfg.read_text().replace("local = true\n", 'local = true\nkind = "slurm"\n')
        + "command_timeout = 10.0\n"
    )
    async with Engine(load_config(cfg)) as engine:
        (first,) = (await engine.refresh()).hosts
        assert first.connected and first.notes == [], first.error
        squeue = bin_dir / "squeue"  # found first on PATH from now on
        squeue.write_text('#!/bin/sh\nsleep 300 &\necho $$ $! >> "$RW_TEST_PIDS"\nwait\n')
        squeue.chmod(0o755)
        try:
            (host,) = (await engine.refresh()).hosts
            text = render(await engine.refresh())
        finally:
            squeue.unlink()  # the fixture's teardown lists the queue with the real one
    assert host.connected and not host.stale, host.error
    (note,) = host.notes
    assert re.fullmatch(r"Slurm jobs as of \d+ s ago: squeue gave no answer within 5 s", note), note
    assert "Slurm jobs as of" in text and "DISCONNECTED" not in text
    pids = [int(p) for line in (tmp_path / "pids").read_text().splitlines() for p in line.split()]
    wait_until(lambda: not any(_alive(p) for p in pids), 10, what="the hung squeue's children gone")


async def test_an_agent_that_exits_during_a_hung_query_leaves_no_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine closes (the agent's stdin ends) while nvidia-smi hangs: its group goes too."""
    _smi(tmp_path, monkeypatch, 'sleep 300 &\necho $$ $! >> "$RW_TEST_PIDS"\nwait\n')
    async with Engine(load_config(_config(tmp_path, {}))) as engine:
        (host,) = (await engine.refresh()).hosts
        assert host.gpu_error == "nvidia-smi: no answer yet after 2 s (still asked)"
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    wait_until(lambda: not any(_alive(p) for p in pids), 10, what="the query's children gone")


async def test_a_host_that_does_not_answer_in_time_shows_its_last_values_and_the_others_go_on(
    tmp_path: Path,
) -> None:
    """The watcher's refresh waits a bounded time: a host whose agent is frozen (SIGSTOP) is
    shown with its last values, stale, with how long it has been asked, and the other host's
    figures are fresh; once it answers again, a later refresh takes its answer."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[[hosts]]\nname = "here"\nlocal = true\n\n'
        '[[hosts]]\nname = "there"\nlocal = true\ncommand_timeout = 60.0\n'
    )
    async with Engine(load_config(cfg)) as engine:
        first = {h.name: h for h in (await engine.refresh()).hosts}
        assert first["here"].connected and first["there"].connected
        hello = engine.host("there").hello
        assert hello is not None
        pid = int(hello["pid"])
        os.kill(pid, signal.SIGSTOP)
        try:
            views = {h.name: h for h in (await engine.refresh(wait=1.0)).hosts}
            assert views["here"].connected and not views["here"].stale
            assert views["here"].last_ok is not None
            assert views["here"].last_ok > (first["here"].last_ok or 0)
            there = views["there"]
            assert there.stale and there.last_ok == first["there"].last_ok
            assert there.notes and re.fullmatch(
                r"no answer for \d+ s yet: showing its last values", there.notes[-1]
            ), there.notes
        finally:
            os.kill(pid, signal.SIGCONT)
        for _ in range(60):  # its answer comes in at a later refresh
            views = {h.name: h for h in (await engine.refresh(wait=1.0)).hosts}
            if not views["there"].stale:
                break
        else:
            pytest.fail("the host's answer never came in")
        assert views["there"].connected and views["there"].notes == []
        assert (views["there"].last_ok or 0) > (first["there"].last_ok or 0)
