"""The secret values runwatch knows (every endpoint's API key present in the environment), and
masking them in whatever this process prints or writes.

The host masks by pattern before anything crosses the channel (``supervisor.agent.masking``);
this adds the values themselves, which only the laptop knows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from supervisor.agent.masking import MIN_SECRET_LEN
from supervisor.agent.protocol import MASK
from supervisor.config import Config

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
