"""``runwatch clients``: the client profiles (built-in and configured) and what each knows."""

from __future__ import annotations

from pathlib import Path

import click

from supervisor.cli._common import (
    DEFAULT_CANDIDATES,
    config_option,
    get_config,
    json_option,
    print_json,
    resolve_config_path,
)
from supervisor.config import Config


@click.command()
@config_option
@json_option
def clients(config_path: str | None, as_json: bool) -> None:
    """List the client profiles: scripts, layout, flags, resume rule, sidecars, volatile flags."""
    from supervisor.engine import client_lines, client_profiles

    config = _config_or_none(config_path) or Config()
    if as_json:
        print_json({"clients": client_profiles(config)})
        return
    for n, lines in enumerate(client_lines(config)):
        if n:
            click.echo("")
        for line in lines:
            click.echo(line)


def _config_or_none(config_path: str | None) -> Config | None:
    """The config when one is named or found; None lists the built-in profiles alone."""
    path = resolve_config_path(config_path)
    if path == DEFAULT_CANDIDATES[0] and not Path(path).exists():
        return None
    return get_config(path)
