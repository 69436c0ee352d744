"""What every command shares: config loading, error reporting, JSON output, and the one output
filter every line passes (secrets masked by value, control characters from hosts escaped)."""

from __future__ import annotations

import io
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TextIO, cast

import click
import msgspec

from supervisor.config import Config, load_config, untrusted
from supervisor.display import escape_control
from supervisor.errors import ConfigError, RunwatchError, UsageError
from supervisor.secrets import mask_json_text, mask_known, mask_registered, note_secrets

DEFAULT_CONFIG_ENV = "RUNWATCH_CONFIG"

UiOpener = Callable[[str | None], None]
"""Opens the dashboard on a config path and returns when the user quits."""
_ui_opener: UiOpener | None = None


def register_ui(opener: UiOpener) -> None:
    """Called by the ``runwatch`` console script (``tui.cli``): the engine never imports the UI."""
    global _ui_opener
    _ui_opener = opener


def ui_opener() -> UiOpener | None:
    """The registered dashboard, or None when runwatch runs without one (``python -m``)."""
    return _ui_opener


def open_ui(config_path: str | None) -> None:
    if _ui_opener is None:
        raise UsageError(
            "no dashboard here: this entry point runs the engine's commands only",
            "run the `runwatch` console script, or `runwatch status --watch 2` for plain text",
        )
    _ui_opener(config_path)


def config_option(f: Any) -> Any:
    """``-c/--config`` on a subcommand (also accepted before the subcommand)."""
    return click.option(
        "-c",
        "--config",
        "config_path",
        default=None,
        metavar="PATH",
        help=f"Config file (TOML). Default: ${DEFAULT_CONFIG_ENV}, else ./runwatch.toml.",
    )(f)


class Finite(click.FloatRange):
    """A number within the option's bounds that is finite: ``nan`` and ``inf``, which click's
    ``float`` and ``FloatRange`` take, would be a grace that never ends, a deadline never
    reached or an interval never over."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


_json_wanted = False
"""Set when a command was given ``--json``: its errors are JSON on stdout too."""


def _note_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    global _json_wanted
    _json_wanted = _json_wanted or bool(value)
    return value


def json_option(f: Any) -> Any:
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        is_eager=True,
        callback=_note_json,
        help='Print JSON instead of text (errors too: {"error", "hint"}).',
    )(f)


DEFAULT_CANDIDATES = ("runwatch.toml", "configs/runwatch.toml")


def named_config_path(config_path: str | None) -> str | None:
    """The config named by -c on the command line (here or before the command), else None."""
    if config_path:
        return config_path
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        parent = ctx.params.get("config_path") if ctx.params else None
        if parent:
            return str(parent)
        ctx = ctx.parent
    return None


def resolve_config_path(config_path: str | None) -> str:
    """The config named by -c (here or before the command), else $RUNWATCH_CONFIG, else the
    first of ./runwatch.toml, ./configs/runwatch.toml that exists, else ``runwatch.toml``."""
    named = named_config_path(config_path)
    if named:
        return named
    env = os.environ.get(DEFAULT_CONFIG_ENV)
    if env:
        return env
    for candidate in DEFAULT_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    return "runwatch.toml"


_warned_untrusted: set[str] = set()
"""Configs already warned about (once per process)."""


def get_config(config_path: str | None, need: str = "", act: bool = False) -> Config:
    """The config (see ``resolve_config_path``); ``need="hosts"`` or ``"runs"``: one that names
    at least one host (and run), else ConfigError. ``act``: the command starts or stops
    processes (launch, restart, kill, adopt, guard, watch), so a config another user could have
    written (``config.untrusted``) is refused; other commands warn once on stderr."""
    path = resolve_config_path(config_path)
    if path == DEFAULT_CANDIDATES[0] and not Path(path).exists():
        # Nothing named a config and there is none here: say where runwatch looked.
        raise ConfigError(
            f"no config: no -c PATH, ${DEFAULT_CONFIG_ENV} is not set, and there is no "
            f"{' or '.join(DEFAULT_CANDIDATES)} in {Path.cwd()}",
            "pass -c PATH, or try `runwatch demo`, which writes one",
        )
    problem = untrusted(path)
    if problem is not None and act:
        raise problem
    if problem is not None and path not in _warned_untrusted:
        _warned_untrusted.add(path)
        click.echo(f"warning: {problem.message}\n  -> {problem.hint}", err=True)
    config = load_config(path)
    if need == "hosts":
        config.require_hosts()
    elif need == "runs":
        config.require_runs()
    note_secrets(config)
    return config


def print_json(value: Any) -> None:
    """``value`` as one JSON line, every known secret value masked (``secrets.mask_known``)."""
    sys.stdout.write(msgspec.json.encode(mask_known(msgspec.to_builtins(value))).decode() + "\n")


class SafeStream(io.TextIOBase):
    """stdout or stderr as every command writes to it: each write has every registered secret
    value masked (inside JSON strings only, for a JSON line) and its control characters escaped
    (``display.escape_control``). runwatch's own terminal controls (the progress line's ``\\r``,
    a screen clear) go through :func:`write_control`, never through text."""

    def __init__(self, inner: TextIO) -> None:
        super().__init__()
        self.inner = inner

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError("write() argument must be str")  # click asks: a text stream
        masked = mask_json_text(s) if s.lstrip()[:1] in ("{", "[") else mask_registered(s)
        self.inner.write(escape_control(masked))
        return len(s)

    def control(self, seq: str) -> None:
        self.inner.write(seq)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.inner, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.inner, "errors", None)

    @property
    def buffer(self) -> BinaryIO:
        """Where bytes go (click writes its shell-completion script so): decoded, then masked
        and escaped as text is."""
        return cast(BinaryIO, SafeBinary(self))


class SafeBinary(io.RawIOBase):
    """The binary side of a :class:`SafeStream`."""

    def __init__(self, text: SafeStream) -> None:
        super().__init__()
        self.text = text

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.text.write(data.decode(self.text.encoding, "replace"))
        return len(data)

    def flush(self) -> None:
        self.text.flush()


def write_control(stream: TextIO, seq: str) -> None:
    """Write runwatch's own terminal control ``seq`` (``\\r``, ``\\x1b[K``) as is."""
    if isinstance(stream, SafeStream):
        stream.control(seq)
    else:
        stream.write(seq)


def run_cli(group: click.Group) -> None:
    """Run the CLI; a RunwatchError becomes one clear message on stderr and its exit status
    (under ``--json``: ``{"error", "hint"}`` on stdout, with the same exit status). Everything
    written to stdout and stderr meanwhile passes :class:`SafeStream`."""
    saved = sys.stdout, sys.stderr
    sys.stdout = SafeStream(sys.stdout)
    sys.stderr = SafeStream(sys.stderr)
    try:
        _run_cli(group)
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = saved


def _run_cli(group: click.Group) -> None:
    global _json_wanted
    _json_wanted = False  # set by the --json option of the command that runs
    try:
        # color=True: click never strips escape sequences itself; SafeStream escapes them all.
        group.main(standalone_mode=False, color=True)
    except RunwatchError as e:
        if _json_wanted:
            print_json({"error": e.message, "hint": e.hint})
        else:
            click.echo(f"runwatch: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("runwatch: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        # A usage error can stop the parse before the --json option's callback has run.
        if _json_wanted or "--json" in sys.argv[1:]:
            print_json({"error": e.format_message(), "hint": "see --help"})
        else:
            e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
