"""A receiver that answers a byte at a time (W25): every read gets its byte within apprise's
socket timeout, so an attempt never ends by itself. The outbox's deadline gives up waiting, but
the attempt's thread and socket stay; a retry must not add another each time (over a day of
retries a watcher would hold a thousand threads and sockets). Real apprise ``json://`` to a real
socket on loopback."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from supervisor.alerts import _apprise_for, _notify
from supervisor.outbox import Message, Outbox
from tests.waiting import wait_until


class Dripping:
    """Answers every POST with a 200 whose body comes one byte a second, until released."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.posts = 0
        self.released = threading.Event()
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        size = 20
        with conn:
            try:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(65536)
                self.posts += 1
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
                sent = 0
                while sent < size and not self.closed.is_set():
                    if self.released.is_set():
                        conn.sendall(b"x" * (size - sent))
                        break
                    conn.sendall(b"x")
                    sent += 1
                    self.released.wait(1.0)
            except OSError:
                return

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


@pytest.fixture
def dripping() -> Iterator[Dripping]:
    d = Dripping()
    yield d
    d.close()


def attempt_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "alert to drip" and t.is_alive())


def test_w25_a_dripping_receiver_holds_one_attempt_not_one_per_retry(dripping: Dripping) -> None:
    url = f"json://127.0.0.1:{dripping.port}/drip"
    box = Outbox(target="drip", send=_notify(_apprise_for([url])), deadline_s=1.0)
    box.start()
    try:
        box.post(Message(title="run died", body="b", severity="critical", created=time.time()))
        # Four attempts (backoff 2, 4, 8 s): each gives up waiting after its 1 s deadline.
        # (Or a second connection: the fault, seen sooner.)
        wait_until(lambda: box.attempts >= 4 or dripping.connections > 1, 60, what="four attempts")
        assert attempt_threads() <= 1
        assert dripping.connections == 1  # the hung attempt is waited for, never doubled
        (first,) = box.collect()
        assert not first.ok and "no answer within 1 s" in str(first.error)
        # The receiver finishes its answer: the attempt under way delivers, once.
        dripping.released.set()
        wait_until(lambda: box.waiting == 0, 60, what="the message delivered")
        delivered = box.collect()
        assert [d.ok for d in delivered] == [True]
        assert dripping.posts == 1
        wait_until(lambda: attempt_threads() == 0, 30, what="no attempt left")
    finally:
        box.close()
        box.join(10)
