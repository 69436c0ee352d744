"""The endpoint to bench, from config or a bare URL, and its API key (masked in every message).

The API key is read from the environment variable the config names, sent as
``Authorization: Bearer``, and masked (``***``) in every message the bench produces.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

import msgspec

from supervisor.config import Config, EndpointConfig
from supervisor.errors import EndpointError, UsageError

DEFAULT_MAX_TOKENS = 512


class Target(msgspec.Struct, kw_only=True):
    """The endpoint to bench and the shape of the requests (like the run's)."""

    name: str
    base_url: str
    kind: str = "unknown"
    model: str | None = None
    api_key_env: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    price_in_per_m: float | None = None
    price_cached_in_per_m: float | None = None
    price_out_per_m: float | None = None
    gpu_cost_per_hour: float | None = None
    concurrency: int | None = None


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def mask_url(url: str) -> str:
    """The URL without user:password and without a query string (keys hide there)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


def mask(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret replaced by ``***``."""
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


def resolve_target(
    config: Config | None,
    endpoint_or_url: str,
    *,
    max_tokens: int | None = None,
    api_key_env: str | None = None,
) -> Target:
    """The endpoint named in config, or a bare URL (matched to a configured endpoint if one has
    the same base URL, for its prices and request shape)."""
    ep: EndpointConfig | None = None
    if is_url(endpoint_or_url):
        if config is not None:
            want = endpoint_or_url.rstrip("/")
            ep = next((e for e in config.endpoints if e.base_url.rstrip("/") == want), None)
    else:
        if config is None:
            raise UsageError(
                f"{endpoint_or_url!r} is not a URL and no config was given",
                "pass -c CONFIG to bench a configured endpoint, or a URL ending in /v1",
            )
        ep = config.endpoint(endpoint_or_url)
    if ep is None:
        return Target(
            name=mask_url(endpoint_or_url),
            base_url=endpoint_or_url.rstrip("/"),
            api_key_env=api_key_env,
            max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
        )
    return Target(
        name=ep.name,
        base_url=ep.base_url.rstrip("/"),
        kind=ep.kind,
        model=ep.model,
        api_key_env=api_key_env or ep.api_key_env,
        max_tokens=max_tokens or ep.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=ep.temperature,
        price_in_per_m=ep.price_in_per_m,
        price_cached_in_per_m=ep.price_cached_in_per_m,
        price_out_per_m=ep.price_out_per_m,
        gpu_cost_per_hour=ep.gpu_cost_per_hour,
        concurrency=ep.concurrency,
    )


def api_key(target: Target, env: dict[str, str] | None = None) -> str | None:
    """The key from the environment variable the target names (never from config or argv)."""
    if not target.api_key_env:
        return None
    source = os.environ if env is None else env
    key = source.get(target.api_key_env)
    if not key:
        raise EndpointError(
            f"environment variable {target.api_key_env} (API key of {target.name}) is not set",
            f"export {target.api_key_env}=... before running the bench",
        )
    return key
