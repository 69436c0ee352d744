"""A real webhook receiver on loopback, for alerts sent through apprise's ``json://``.

- ``receiver``: a ``http.server`` in a thread on 127.0.0.1 (free port) that records every POST
  body (parsed JSON) and answers 200; ``receiver.url(path)`` is the apprise URL
  (``json://127.0.0.1:PORT/path``), ``receiver.bodies`` what came (``receiver.times`` when),
  ``receiver.wait(n)`` waits until ``n`` bodies came. ``Receiver(port)`` listens on that port;
  ``Receiver(status=500)`` records every POST and refuses it (a receiver that fails each time).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.waiting import wait_until


class Receiver:
    """The recording webhook server."""

    def __init__(self, port: int = 0, status: int = 200) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.times: list[float] = []
        """When each body came (Unix time)."""
        self.paths: list[str] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(size)
                with receiver.lock:
                    receiver.bodies.append(json.loads(raw))
                    receiver.times.append(time.time())
                    receiver.paths.append(self.path)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def url(self, path: str = "hook") -> str:
        return f"json://127.0.0.1:{self.port}/{path}"

    def messages(self) -> list[str]:
        """Each body's title and message, as one string."""
        with self.lock:
            return [f"{b.get('title')}\n{b.get('message')}" for b in self.bodies]

    def wait(self, count: int, timeout: float = 30.0) -> list[str]:
        """The messages once at least ``count`` came."""
        wait_until(lambda: len(self.bodies) >= count, timeout=timeout, what=f"{count} alert(s)")
        return self.messages()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()
