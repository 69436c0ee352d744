"""The secret values runwatch knows, and masking them in whatever this process prints or writes.

Every value runwatch knows to be a secret is registered once (``agent.masking.register``, one
registry per process, shared with the masking functions of the agent package) and masked wherever
it occurs: the values of credential-named variables of this environment and of a run's ``env``,
of every endpoint's ``api_key_env``, of secret flags in a run's argv (built-in list plus the
profile's ``secret_flags``, credential headers), URL credentials and credential keys inside JSON
or ``k=v`` values, and the values of secret ``--set`` overrides. The host registers what it sees
(process environments, launch environments) and masks before anything crosses the channel; the
laptop masks again here. Masking by pattern (``mask_text``) stays as a second net.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from supervisor.agent.masking import (
    MIN_SECRET_LEN,
    argv_secret_values,
    env_secret_values,
    mask_argv,
    mask_json_text,
    mask_registered,
    mask_text,
    register,
    register_environ,
    registered,
    value_secrets,
)
from supervisor.config import Config

__all__ = [
    "known_secrets",
    "mask",
    "mask_argv",
    "mask_json_text",
    "mask_known",
    "mask_registered",
    "mask_text",
    "note_overrides",
    "note_secrets",
    "secret_env_names",
]


def note_secrets(config: Config, environ: Mapping[str, str] | None = None) -> None:
    """Register every secret value ``config`` and this environment hold: the credential values of
    the environment, every endpoint's ``api_key_env`` value, each run's ``env`` values that are
    secrets and the secret values in each run's argv (with its profile's ``secret_flags``)."""
    source = os.environ if environ is None else environ
    register_environ(source)
    register(source.get(e.api_key_env, "") for e in config.endpoints if e.api_key_env)
    extra = [f for c in config.clients.values() for f in c.secret_flags]
    for run in config.runs:
        register(env_secret_values(run.env))
        register(argv_secret_values(run.argv, extra))
    for url in config.alerts.urls:
        register(value_secrets(url))


def note_overrides(
    sets: Iterable[tuple[str, str | None]], secret_flags: Sequence[str] = ()
) -> None:
    """Register the values of secret ``--set`` overrides (``api-key=K``, a misspelled
    ``api-ky=K`` whose "did you mean" target is secret, or a flag of ``secret_flags``)."""
    argv: list[str] = []
    for flag, value in sets:
        if value is not None:
            argv += [flag if flag.startswith("-") else "--" + flag, value]
    register(argv_secret_values(argv, secret_flags))


def secret_env_names(config: Config) -> list[str]:
    """Names of every endpoint's key variable (sent to the host, which masks their values)."""
    return sorted({e.api_key_env for e in config.endpoints if e.api_key_env})


def known_secrets(
    config: Config | None = None, environ: Mapping[str, str] | None = None
) -> list[str]:
    """The values runwatch knows to be secrets, longest first (so a key that contains another is
    masked whole): everything registered, plus those of ``config`` and ``environ`` (default this
    process's environment), registered now."""
    if config is not None:
        note_secrets(config, environ)
    else:
        register_environ(os.environ if environ is None else environ)
    return [v for v in registered() if len(v) >= MIN_SECRET_LEN]


def mask_known(value: Any, secrets: list[str] | None = None) -> Any:
    """``value`` (JSON-like: dicts, lists, strings) with every known secret value (default: every
    registered one) replaced by ``***`` wherever it occurs in a string or a key. Only values are
    masked: what the host already masked by pattern stays as it came."""
    known = known_secrets() if secrets is None else secrets
    if isinstance(value, str):
        for s in known:
            value = value.replace(s, "***") if len(s) >= MIN_SECRET_LEN else value
        return mask_registered(value)
    if isinstance(value, (list, tuple)):
        return [mask_known(v, known) for v in value]
    if isinstance(value, dict):
        return {mask_known(k, known): mask_known(v, known) for k, v in value.items()}
    return value


def mask(value: Any) -> Any:
    """``value`` (JSON-like) with every secret masked: registered values everywhere, and by
    pattern (``mask_text``) in strings; a list under an ``argv`` key is masked as an argv."""
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, (list, tuple)):
        return [mask(v) for v in value]
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            key = mask_registered(k) if isinstance(k, str) else k
            if k in ("argv", "argv_masked") and isinstance(v, (list, tuple)):
                out[key] = mask_argv([str(a) for a in v])
            else:
                out[key] = mask(v)
        return out
    return value
