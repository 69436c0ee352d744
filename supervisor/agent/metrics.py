"""Serving-engine metrics: fetch a local server's Prometheus ``/metrics`` text over this host's
loopback, for the laptop to parse (``supervisor.servermetrics``).

Standard library only, Python >= 3.8 (runs on the host inside the agent). Only ``http://`` URLs
whose host is this machine are fetched (a loopback address, ``localhost``, or this host's own
name or addresses): the agent is no proxy to elsewhere. Each fetch has one deadline for the whole
exchange (connect, headers, body: a server that drips its answer is cut off there, not after each
slow read) and a size cap (a bigger body is cut at its last whole line and marked truncated); the
endpoints are fetched at once, under the same deadline. A failure is a result saying why
(``connection refused``, ``HTTP 404``, ``no complete answer within 2 s``...), never an error of
the refresh.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import threading
import time
import urllib.parse
from typing import Any

from supervisor.agent.protocol import AgentOpError

METRICS_TIMEOUT_S = 2.0
"""Seconds one fetch may take in all (connect, redirects, headers and body)."""
MAX_REDIRECTS = 3
"""Redirects followed (``/metrics`` -> ``/metrics/`` of a mounted Prometheus app), each to a
URL of this host again."""
METRICS_MAX_BYTES = 4 << 20
"""Largest body read; a bigger one is cut and reported as such."""


@functools.lru_cache(maxsize=1)
def _local_names() -> frozenset[str]:
    names = {"localhost", "localhost.localdomain"}
    try:
        hostname = socket.gethostname()
        names.add(hostname.lower())
        names.add(socket.getfqdn().lower())
        for info in socket.getaddrinfo(hostname, None):
            names.add(str(info[4][0]).lower())
    except OSError:
        pass
    return frozenset(names)


def host_local(host: str) -> bool:
    """True when ``host`` names this machine (loopback, or its own name or addresses)."""
    h = host.strip("[]").lower()
    try:
        if ipaddress.ip_address(h).is_loopback:
            return True
    except ValueError:
        pass
    return h in _local_names()


def check_url(url: str) -> str | None:
    """Why ``url`` may not be fetched, or None when it may."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as e:
        return f"bad URL: {e}"
    if parts.scheme != "http":
        return f"only http:// URLs on this host are fetched, not {parts.scheme or 'no'} scheme"
    if not parts.hostname or not host_local(parts.hostname):
        return f"{parts.hostname or 'no host'} is not this host (only its loopback is fetched)"
    return None


class _Deadline(Exception):
    pass


def _exchange(url: str, deadline: float, limit: int) -> tuple[int, dict[str, str], bytes, bool]:
    """One HTTP/1.0 GET of ``url`` before ``deadline``: (status, headers, body, cut at
    ``limit``). Each socket wait is bounded by what is left of the deadline."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def left() -> float:
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise _Deadline()
        return rest

    sock = socket.create_connection((host, port), timeout=left())
    try:
        name = f"[{host}]" if ":" in host else host
        sock.settimeout(left())
        sock.sendall(
            f"GET {path} HTTP/1.0\r\nHost: {name}:{port}\r\nAccept: text/plain\r\n"
            "User-Agent: runwatch-agent\r\nConnection: close\r\n\r\n".encode("latin-1")
        )
        buf = bytearray()
        head_end = -1
        length: int | None = None
        while True:
            sock.settimeout(left())
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                raise _Deadline() from None
            if not chunk:
                break
            buf += chunk
            if head_end < 0:
                head_end = buf.find(b"\r\n\r\n")
                if head_end < 0:
                    if len(buf) > 65536:
                        raise ValueError("headers over 64 KiB")
                    continue
                status, headers = _head(bytes(buf[:head_end]))
                if "content-length" in headers and headers["content-length"].isdigit():
                    length = int(headers["content-length"])
            body_len = len(buf) - head_end - 4
            if length is not None and body_len >= length:
                break
            if body_len > limit:
                return status, headers, bytes(buf[head_end + 4 : head_end + 4 + limit]), True
        if head_end < 0:
            raise ValueError("no HTTP answer")
        body = bytes(buf[head_end + 4 :])
        if length is not None:
            if len(body) < length:
                raise ValueError(f"the answer ended after {len(body)} of {length} bytes")
            body = body[:length]
        return status, headers, body, False
    finally:
        sock.close()


def _head(raw: bytes) -> tuple[int, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    first = lines[0].split(None, 2)
    if len(first) < 2 or not first[0].startswith("HTTP/") or not first[1].isdigit():
        raise ValueError(f"not an HTTP status line: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep:
            headers[key.strip().lower()] = value.strip()
    return int(first[1]), headers


def _dechunk(body: bytes) -> bytes:
    """A ``Transfer-Encoding: chunked`` body (sent even to an HTTP/1.0 request by some servers)."""
    out = bytearray()
    pos = 0
    while True:
        eol = body.find(b"\r\n", pos)
        if eol < 0:
            return bytes(out)
        size = int(body[pos:eol].split(b";")[0] or b"0", 16)
        if size == 0:
            return bytes(out)
        out += body[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2


def fetch_one(
    url: str, timeout: float = METRICS_TIMEOUT_S, max_bytes: int = METRICS_MAX_BYTES
) -> dict[str, Any]:
    """``{"ok": True, "text", "truncated", "seconds", "time"}`` or ``{"ok": False, "error",
    "kind", "status"?}``, all within ``timeout`` seconds."""
    refused = check_url(url)
    if refused is not None:
        return {"ok": False, "error": refused, "kind": "refused-url"}
    started = time.monotonic()
    deadline = started + timeout
    try:
        for _ in range(MAX_REDIRECTS + 1):
            status, headers, body, truncated = _exchange(url, deadline, max_bytes)
            if status in (301, 302, 303, 307, 308) and headers.get("location"):
                url = urllib.parse.urljoin(url, headers["location"])
                refused = check_url(url)
                if refused is not None:
                    return {"ok": False, "error": f"redirected: {refused}", "kind": "refused-url"}
                continue
            break
        else:
            return {"ok": False, "error": "too many redirects", "kind": "http"}
    except _Deadline:
        return {
            "ok": False,
            "error": f"no complete answer within {timeout:g} s",
            "kind": "timeout",
        }
    except ConnectionRefusedError:
        return {"ok": False, "error": "connection refused", "kind": "refused"}
    except socket.timeout:
        return {"ok": False, "error": f"no answer within {timeout:g} s", "kind": "timeout"}
    except (OSError, ValueError) as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "kind": "network"}
    if status != 200:
        return {"ok": False, "error": f"HTTP {status}", "status": status, "kind": "http"}
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _dechunk(body)
    if truncated:
        # Only whole lines: a cut line would make the whole text unreadable.
        body = body[: body.rfind(b"\n") + 1]
    return {
        "ok": True,
        "text": body.decode("utf-8", "replace"),
        "truncated": truncated,
        "max_bytes": max_bytes,
        "seconds": round(time.monotonic() - started, 4),
        "time": time.time(),
    }


def parse_specs(specs: Any) -> list[tuple[str, str]]:
    """``[{"name", "url"}]`` -> ``[(name, url)]``; AgentOpError for anything else."""
    if not isinstance(specs, list):
        raise AgentOpError("metrics: expected a list of {name, url}", "bad-params")
    out = []
    for spec in specs:
        if not (
            isinstance(spec, dict)
            and isinstance(spec.get("name"), str)
            and isinstance(spec.get("url"), str)
        ):
            raise AgentOpError("metrics: each entry needs a string name and url", "bad-params")
        out.append((spec["name"], spec["url"]))
    return out


def fetch_all(specs: list[tuple[str, str]], timeout: float = METRICS_TIMEOUT_S) -> dict[str, Any]:
    """``{name: fetch_one(url)}`` for each ``(name, url)``, all at once on threads of their own,
    the whole within ``timeout`` seconds (and a moment): one slow endpoint never delays another."""
    out: dict[str, Any] = {}
    lock = threading.Lock()

    def one(name: str, url: str) -> None:
        result = fetch_one(url, timeout)
        with lock:
            out[name] = result

    threads = [
        threading.Thread(target=one, args=spec, name=f"metrics-{spec[0]}", daemon=True)
        for spec in specs
    ]
    deadline = time.monotonic() + timeout + 1.0
    for th in threads:
        th.start()
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    with lock:
        done = dict(out)
    for name, _url in specs:
        done.setdefault(
            name,
            {"ok": False, "error": f"no complete answer within {timeout:g} s", "kind": "timeout"},
        )
    return done
