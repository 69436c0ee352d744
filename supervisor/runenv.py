"""The environment a run is launched with, and the API key it carries (never in its argv)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from supervisor.agent.masking import MIN_SECRET_LEN
from supervisor.agent.protocol import MASK
from supervisor.config import Config, RunConfig
from supervisor.errors import LaunchError

_NOTED: set[str] = set()
"""Key variable names of every config loaded in this process (see :func:`note_secrets`)."""


def note_secrets(config: Config) -> None:
    """Remember the key variables (``api_key_env``) of ``config``: from now on their values are
    masked in everything this process prints or writes (:func:`known_secrets`)."""
    _NOTED.update(e.api_key_env for e in config.endpoints if e.api_key_env)


def secret_env_names(config: Config) -> list[str]:
    """Names of every endpoint's key variable (sent to the host, which masks their values)."""
    return sorted({e.api_key_env for e in config.endpoints if e.api_key_env})


def known_secrets(
    config: Config | None = None, environ: Mapping[str, str] | None = None
) -> list[str]:
    """The values runwatch knows to be secrets: every endpoint's ``api_key_env`` value present in
    the environment (of ``config`` and of every config noted by :func:`note_secrets`), longest
    first (so a key that contains another is masked whole)."""
    source = os.environ if environ is None else environ
    names = set(_NOTED)
    if config is not None:
        names.update(e.api_key_env for e in config.endpoints if e.api_key_env)
    values = {source[n] for n in names if len(source.get(n) or "") >= MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


def mask_known(value: Any, secrets: list[str] | None = None) -> Any:
    """``value`` (JSON-like: dicts, lists, strings) with every known secret value (default
    :func:`known_secrets`) replaced by ``***`` wherever it occurs in a string or a key. Only
    values are masked: what the host already masked by pattern stays as it came."""
    known = known_secrets() if secrets is None else secrets
    if not known:
        return value
    if isinstance(value, str):
        for s in known:
            value = value.replace(s, MASK)
        return value
    if isinstance(value, (list, tuple)):
        return [mask_known(v, known) for v in value]
    if isinstance(value, dict):
        return {mask_known(k, known): mask_known(v, known) for k, v in value.items()}
    return value


def launch_env(
    config: Config, run: RunConfig, environ: dict[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """(environment for the child, names of its secret entries). The API key comes from this
    machine's environment variable named by the endpoint's ``api_key_env``."""
    env = dict(run.env)
    secret: list[str] = []
    if run.endpoint is None:
        return env, secret
    ep = config.endpoint(run.endpoint)
    if ep.api_key_env:
        source = os.environ if environ is None else environ
        value = source.get(ep.api_key_env)
        if value:
            env[ep.api_key_env] = value
            secret.append(ep.api_key_env)
        elif ep.kind == "api":
            raise LaunchError(
                f"{run.name}: environment variable {ep.api_key_env} is not set "
                f"(endpoint {ep.name} needs an API key)",
                f"export {ep.api_key_env}=... in this shell; the key is passed to the run's "
                "environment, never its argv",
            )
    return env, secret


def api_key_names(config: Config, run: RunConfig) -> list[str]:
    """Names of the environment variables holding the run's API key (none without endpoint)."""
    if run.endpoint is None:
        return []
    name = config.endpoint(run.endpoint).api_key_env
    return [name] if name else []
