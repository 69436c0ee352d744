"""Serving-engine metrics: fetch a local server's Prometheus ``/metrics`` text over this host's
loopback, for the laptop to parse (``supervisor.servermetrics``).

Standard library only, Python >= 3.8 (runs on the host inside the agent). Only ``http://`` URLs
whose host is this machine are fetched (a loopback address, ``localhost``, or this host's own
name or addresses): the agent is no proxy to elsewhere. Each fetch has a short timeout and a size
cap; a failure is a result saying why (``connection refused``, ``HTTP 404``...), never an error
of the refresh.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from supervisor.agent.protocol import AgentOpError

METRICS_TIMEOUT_S = 2.0
"""Seconds one fetch may take (connect plus body)."""
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


def fetch_one(url: str, timeout: float = METRICS_TIMEOUT_S) -> dict[str, Any]:
    """``{"ok": True, "text", "seconds", "time"}`` or ``{"ok": False, "error", "status"?}``."""
    refused = check_url(url)
    if refused is not None:
        return {"ok": False, "error": refused, "kind": "refused-url"}
    started = time.monotonic()
    # No proxy: the URL is this host's own loopback.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    try:
        with opener.open(request, timeout=timeout) as resp:
            body = resp.read(METRICS_MAX_BYTES + 1)
    except urllib.error.HTTPError as e:
        return {"ok": False, "error": f"HTTP {e.code}", "status": e.code, "kind": "http"}
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, ConnectionRefusedError):
            return {"ok": False, "error": "connection refused", "kind": "refused"}
        if isinstance(reason, socket.timeout):
            return {"ok": False, "error": f"no answer within {timeout:g} s", "kind": "timeout"}
        return {"ok": False, "error": str(reason), "kind": "network"}
    except (OSError, ValueError) as e:
        if isinstance(e, socket.timeout):  # TimeoutError from 3.10 on, its own class before
            return {"ok": False, "error": f"no answer within {timeout:g} s", "kind": "timeout"}
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "kind": "network"}
    truncated = len(body) > METRICS_MAX_BYTES
    return {
        "ok": True,
        "text": body[:METRICS_MAX_BYTES].decode("utf-8", "replace"),
        "truncated": truncated,
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


def fetch_all(specs: list[tuple[str, str]]) -> dict[str, Any]:
    """``{name: fetch_one(url)}`` for each ``(name, url)``, one after another, each bounded."""
    return {name: fetch_one(url) for name, url in specs}
