"""The HTTP server of ``/metrics``: a bounded pool of workers, and no thread for an idle connection.

prometheus_client's own server starts a thread per connection and reads it without a timeout: a
connection that sends nothing holds its thread forever (200 idle connections, 200 threads). Here
one thread accepts and keeps every accepted connection in a selector until it has bytes to read;
only then does one of :data:`WORKERS` threads take it, TLS handshake included, and every read has
:data:`READ_TIMEOUT_S`. A connection that sends nothing for :data:`IDLE_TIMEOUT_S` is closed, and
past :data:`MAX_WAITING` waiting connections the oldest are closed first. The thread count is
therefore 1 + :data:`WORKERS` whatever the clients do, and a scrape is answered while others
hold idle connections.
"""

from __future__ import annotations

import selectors
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

WORKERS = 4
"""Threads that answer requests."""
READ_TIMEOUT_S = 10.0
"""Longest wait for the next bytes of a request being read (a TLS handshake included)."""
IDLE_TIMEOUT_S = 10.0
"""A connection that sends nothing for this long is closed without a thread ever waiting on it."""
MAX_WAITING = 256
"""Accepted connections with nothing to read yet kept open at most (the oldest closed first)."""


class _Silent(WSGIRequestHandler):
    """No line per request on stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServer(WSGIServer):
    """A WSGI server for ``app`` on ``(host, port)`` (see the module docstring); TLS when
    ``context`` is given. :meth:`serve_forever` on a thread; :meth:`shutdown` ends it."""

    request_queue_size = 128
    """The listen backlog (socketserver's 5 drops the connections of a burst)."""

    def __init__(
        self, host: str, port: int, app: Any, context: ssl.SSLContext | None = None
    ) -> None:
        family, _, _, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self.address_family = family
        self._wake_r, self._wake_w = socket.socketpair()  # closed by server_close, even when
        self._stopping = False  # binding fails inside __init__
        self._stopped = threading.Event()
        super().__init__((str(sockaddr[0]), port), _Silent)
        self.set_app(app)
        self.context = context
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="metrics")

    def serve_forever(self, poll_interval: float = 1.0) -> None:
        sel = selectors.DefaultSelector()
        self.socket.setblocking(False)
        sel.register(self.socket, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        waiting: dict[socket.socket, tuple[float, Any]] = {}
        try:
            while not self._stopping:
                for key, _ in sel.select(timeout=min(poll_interval, IDLE_TIMEOUT_S)):
                    sock = key.fileobj
                    if sock is self.socket:
                        self._accept(sel, waiting)
                    elif sock is not self._wake_r and isinstance(sock, socket.socket):
                        sel.unregister(sock)
                        _, addr = waiting.pop(sock)
                        self._pool.submit(self._answer, sock, addr)
                now = time.monotonic()
                expired = [s for s, (since, _) in waiting.items() if now - since > IDLE_TIMEOUT_S]
                oldest = sorted(waiting, key=lambda s: waiting[s][0])
                for sock in {*expired, *oldest[: max(0, len(waiting) - MAX_WAITING)]}:
                    sel.unregister(sock)
                    del waiting[sock]
                    sock.close()
        finally:
            for sock in waiting:
                sock.close()
            sel.close()
            self._stopped.set()

    def _accept(self, sel: selectors.BaseSelector, waiting: dict[socket.socket, Any]) -> None:
        while True:
            try:
                sock, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, a reset before accept: the next one
                return
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ)
            waiting[sock] = (time.monotonic(), addr)

    def _answer(self, sock: socket.socket, addr: Any) -> None:
        """One request on a worker: its reads bounded, its TLS handshake here, not in accept."""
        conn: socket.socket = sock
        try:
            sock.setblocking(True)
            sock.settimeout(READ_TIMEOUT_S)
            if self.context is not None:
                conn = self.context.wrap_socket(sock, server_side=True)
            self.finish_request(conn, addr)
        except (OSError, ValueError):  # a timeout, a reset, a failed handshake: this one only
            pass
        finally:
            self.shutdown_request(conn)

    def shutdown(self) -> None:
        self._stopping = True
        self._wake_w.send(b"x")
        self._stopped.wait(10.0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def server_close(self) -> None:
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()
