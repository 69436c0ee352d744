"""The environment a run is launched with, and the API key it carries (never in its argv)."""

from __future__ import annotations

import os

from supervisor.config import Config, RunConfig
from supervisor.errors import LaunchError


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
