"""A real Prometheus server (Debian's ``prometheus`` package) and its ``promtool``.

``prometheus_server(targets)`` starts ``/usr/bin/prometheus`` on a free loopback port with its own
config and storage under the test's temp dir, scraping ``targets`` (``HOST:PORT``) every half
second, and stops it at teardown. Absent binaries skip the test with the reason, and fail it under
``CI=true`` (``.ci/run`` installs the package).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import wait_until

PROMETHEUS = "/usr/bin/prometheus"


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Prometheus tests cannot run on CI: {reason}")
    pytest.skip(f"needs Debian's prometheus package: {reason}")


@pytest.fixture(scope="session")
def promtool() -> str:
    """The path of ``promtool`` (skipped where absent, failing under CI=true)."""
    path = shutil.which("promtool")
    if path is None:
        _skip_or_fail("promtool is not installed (apt-get install prometheus)")
    assert path is not None
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Prometheus:
    """One running Prometheus; :meth:`query` asks its HTTP query API."""

    def __init__(self, root: Path, targets: list[str]) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "500ms", "scrape_timeout": "400ms"},
            "scrape_configs": [
                {"job_name": "runwatch", "static_configs": [{"targets": targets}]},
            ],
        }
        # JSON is YAML: no YAML writer needed.
        (root / "prometheus.yml").write_text(json.dumps(config))
        self.log = root / "prometheus.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={root / 'prometheus.yml'}",
                    f"--storage.tsdb.path={root / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(self.ready, 60, what=f"Prometheus ready on {self.url}", interval=0.2)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"Prometheus exited: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of ``expr`` (``result`` of ``/api/v1/query``)."""
        q = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def targets_up(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=5) as r:
            body = json.loads(r.read())
        active = body["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def prometheus_server(tmp_path: Path) -> Iterator[Callable[[list[str]], Prometheus]]:
    """Factory: ``prometheus_server(["127.0.0.1:9464"])`` starts one scraping those targets."""
    if not os.access(PROMETHEUS, os.X_OK):
        _skip_or_fail(f"{PROMETHEUS} is not installed (apt-get install prometheus)")
    started: list[Prometheus] = []

    def start(targets: list[str]) -> Prometheus:
        server = Prometheus(tmp_path / f"prometheus-{len(started)}", targets)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
