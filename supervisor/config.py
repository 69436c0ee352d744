"""Reading a config file: TOML through ``tomllib``, ``${NAME}`` expanded, every key checked.

The schema is ``supervisor.configschema`` (its structs are re-exported here). A value is checked
against the declared type of its key before it is converted, walking the parsed TOML beside
``msgspec.inspect.type_info(Config)``: an error names the file, the key path (tables of tables by
their names: ``clients.mine.flags``), what the key allows (its type and the bounds its
``msgspec.Meta`` declares) and the value found, e.g.
``configs/x.toml: hosts[0].port: expected an integer from 1 to 65535, got 70000``.

String values may refer to environment variables as ``${NAME}`` (the demo uses this for its
directory and ports); an undefined variable is an error naming the key. No value from the config is
ever turned into shell text.
"""

from __future__ import annotations

import functools
import math
import os
import re
import shlex
import sys
import typing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi

from supervisor.agent.argflags import DEFAULT_SCRIPTS
from supervisor.configschema import (
    AlertsConfig,
    BudgetPolicy,
    ClientFlagNames,
    ClientProfile,
    Config,
    DatasetConfig,
    EndpointConfig,
    ExporterConfig,
    FormatProfile,
    HostConfig,
    HostKind,
    OnExit,
    RunConfig,
    SlurmRunConfig,
    bad_name,
)
from supervisor.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "DEFAULT_SCRIPTS",
    "AlertsConfig",
    "BudgetPolicy",
    "ClientFlagNames",
    "ClientProfile",
    "Config",
    "DatasetConfig",
    "EndpointConfig",
    "ExporterConfig",
    "FormatProfile",
    "HostConfig",
    "HostKind",
    "OnExit",
    "RunConfig",
    "SlurmRunConfig",
    "bad_name",
    "command_prefix",
    "load_config",
    "untrusted",
]

# --------------------------------------------------------------------------- loading

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def load_config(
    path: str | os.PathLike[str], env: typing.Mapping[str, str] | None = None
) -> Config:
    """Read, expand and validate a config file. Raises ConfigError (exit status 2)."""
    p = Path(path)
    shown = str(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{shown}: no such config file", "pass -c CONFIG or create it") from None
    except OSError as e:
        raise ConfigError(f"{shown}: cannot read: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{shown}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{shown}: invalid TOML: {e}") from None
    data = _expand(data, os.environ if env is None else env, shown, "")
    problem = _problem(data, _schema(), "")
    if problem is not None:
        raise ConfigError(f"{shown}: {problem.key or '(top level)'}: {problem.what}", problem.hint)
    try:
        config = msgspec.convert(data, Config, strict=True)
    except msgspec.ValidationError as e:  # pragma: no cover - the walk above found none
        raise ConfigError(f"{shown}: {e}") from None
    config.path = shown
    for cname, client in config.clients.items():
        client.name = cname
    _check_references(config)
    _apply_clients(config, data)
    return config


def untrusted(path: str) -> ConfigError | None:
    """Why the config file at ``path`` cannot be trusted to act (its argv is launched, its
    hosts and runs are stopped), or None: the file (links followed) must belong to the invoking
    user or root and be writable by no one else, and so must the directory holding it, unless
    that directory is sticky (``/tmp``), as OpenSSH's StrictModes asks of ``authorized_keys``."""
    real = os.path.realpath(path)
    me = os.geteuid()
    try:
        st = os.stat(real)
        parent = os.stat(os.path.dirname(real) or ".")
    except OSError:
        return None  # the loader says what is wrong with a missing file
    shown = real if real == os.path.abspath(path) else f"{path} (-> {real})"
    if st.st_uid not in (me, 0):
        return ConfigError(
            f"{shown}: the config belongs to uid {st.st_uid}, not to you (uid {me}) or root: "
            "its command lines would run as you",
            f"read it, then make it yours (cp it to a file of your own, or chown {me} {real})",
        )
    if st.st_mode & 0o022:
        return ConfigError(
            f"{shown}: the config is writable by group or others (mode "
            f"{st.st_mode & 0o7777:04o}): anyone who can write it chooses what runs as you",
            f"read it, then chmod go-w {real}",
        )
    where = os.path.dirname(real) or "."
    if parent.st_uid not in (me, 0) and not parent.st_mode & 0o1000:
        return ConfigError(
            f"{shown}: its directory {where} belongs to uid {parent.st_uid}: its owner can "
            "replace the config",
            "move the config into a directory of your own",
        )
    if parent.st_mode & 0o022 and not parent.st_mode & 0o1000:
        return ConfigError(
            f"{shown}: its directory {where} is writable by group or others (mode "
            f"{parent.st_mode & 0o7777:04o}) without the sticky bit: anyone can replace the config",
            f"chmod go-w {where}, or move the config into a directory of your own",
        )
    return None


def _expand(value: Any, env: typing.Mapping[str, str], shown: str, key: str) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in env:
                raise ConfigError(f"{shown}: {key}: environment variable {name} is not set")
            return env[name]

        return _ENV_REF.sub(sub, value)
    if isinstance(value, list):
        return [_expand(v, env, shown, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _expand(v, env, shown, f"{key}.{k}" if key else k) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------- checking values


@dataclass(frozen=True)
class _Problem:
    """What is wrong at one key of the parsed TOML."""

    key: str
    """The key path: ``runs[0].argv``, ``clients.mine.flags.output_file``."""
    what: str
    hint: str | None = None
    bound: bool = False
    """The value is of the right type but outside the bounds its key declares."""


NOT_IN_FILE: dict[type, frozenset[str]] = {
    Config: frozenset({"path"}),
    ClientProfile: frozenset({"name"}),
}
"""Fields the loader sets (the file's path, a profile's table name): not keys of the file."""

_INT64 = (-(2**63), 2**64 - 1)
"""The integers msgspec holds (int64 and uint64)."""


@functools.cache
def _schema() -> mi.Type:
    return mi.type_info(Config)


def _problem(value: Any, t: mi.Type, key: str) -> _Problem | None:
    """The first thing wrong with ``value`` as the type ``t`` declares (None: nothing is)."""
    if isinstance(t, mi.Metadata):
        return _annotated_problem(value, t, key)
    if isinstance(t, mi.UnionType):
        fitting = [m for m in t.types if _fits(value, m)]
        if not fitting:
            return _Problem(key, f"expected {_describe(t)}, got {_kind(value)}")
        t = fitting[0]
    if not _fits(value, t):
        return _Problem(key, f"expected {_describe(t)}, got {_kind(value)}")
    if isinstance(t, mi.StructType):
        return _struct_problem(value, t, key)
    if isinstance(t, mi.ListType):
        if t.min_length is not None and len(value) < t.min_length:
            got = f"a list of {len(value)}" if value else "an empty list"
            return _Problem(key, f"expected {_describe(t)}, got {got}", bound=True)
        for i, item in enumerate(value):
            problem = _problem(item, t.item_type, f"{key}[{i}]")
            if problem is not None:
                return problem
    elif isinstance(t, mi.DictType):
        for name, item in value.items():
            problem = _problem(item, t.value_type, _join(key, name))
            if problem is not None:
                return problem
    elif isinstance(t, mi.LiteralType) and value not in t.values:
        return _Problem(key, f"expected {_describe(t)}, got {value!r}")
    elif isinstance(t, (mi.IntType, mi.FloatType)):
        return _number_problem(value, t, key)
    return None


def _annotated_problem(value: Any, t: mi.Metadata, key: str) -> _Problem | None:
    """A problem with a value of an annotated type is told in the words of its ``Meta``: its
    ``description`` says what the value allows, ``extra["hint"]`` what to write (also for a
    problem inside the value)."""
    problem = _problem(value, t.type, key)
    if problem is None:
        return None
    description = (t.extra_json_schema or {}).get("description")
    hint = (t.extra or {}).get("hint")
    if description and problem.key == key and not problem.bound:
        problem = replace(problem, what=f"expected {description}, got {_kind(value)}")
    return replace(problem, hint=hint) if hint and problem.hint is None else problem


def _struct_problem(value: dict[str, Any], t: mi.StructType, key: str) -> _Problem | None:
    hidden = NOT_IN_FILE.get(t.cls, frozenset())
    fields = [f for f in t.fields if f.encode_name not in hidden]
    names = [f.encode_name for f in fields]
    for name in value:
        if name not in names:
            return _Problem(_join(key, name), f"unknown key (allowed: {', '.join(names)})")
    for f in fields:
        if f.required and f.encode_name not in value:
            return _Problem(_join(key, f.encode_name), "required key is missing")
    for f in fields:
        if f.encode_name not in value:
            continue
        problem = _problem(value[f.encode_name], f.type, _join(key, f.encode_name))
        if problem is None:
            continue
        if problem.bound and problem.hint is None and f.default not in (msgspec.NODEFAULT, None):
            problem = replace(problem, hint=f"remove the key to use the default, {f.default!r}")
        return problem
    return None


def _number_problem(value: int | float, t: mi.IntType | mi.FloatType, key: str) -> _Problem | None:
    allowed = _describe(t)
    if isinstance(value, float) and not math.isfinite(value):
        allowed = allowed.replace("a number", "a finite number", 1)
    elif isinstance(t, mi.IntType) and not _INT64[0] <= value <= _INT64[1]:
        allowed += " (of at most 64 bits)"
    elif (
        (t.ge is None or value >= t.ge)
        and (t.gt is None or value > t.gt)
        and (t.le is None or value <= t.le)
        and (t.lt is None or value < t.lt)
    ):
        return None
    return _Problem(key, f"expected {allowed}, got {value}", bound=True)


def _fits(value: Any, t: mi.Type) -> bool:
    """Whether ``value`` is of the kind ``t`` declares (its bounds aside)."""
    if isinstance(t, mi.Metadata):
        return _fits(value, t.type)
    if isinstance(t, (mi.StructType, mi.DictType)):
        return isinstance(value, dict)
    if isinstance(t, mi.ListType):
        return isinstance(value, list)
    if isinstance(t, mi.StrType):
        return isinstance(value, str)
    if isinstance(t, mi.BoolType):
        return isinstance(value, bool)
    if isinstance(t, mi.IntType):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(t, mi.FloatType):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(t, mi.LiteralType):
        return any(type(value) is type(v) for v in t.values)
    if isinstance(t, mi.NoneType):
        return value is None
    return True  # a type this schema does not use: msgspec decides


def _describe(t: mi.Type, plural: bool = False) -> str:
    """What a key of type ``t`` allows, for humans: ``an integer from 1 to 65535`` (``plural``:
    ``integers from 1 to 65535``, what a list of them holds)."""

    def noun(one: str, many: str) -> str:
        return many if plural else one

    if isinstance(t, mi.Metadata):
        description = (t.extra_json_schema or {}).get("description")
        return str(description) if description and not plural else _describe(t.type, plural)
    if isinstance(t, mi.UnionType):
        members = [m for m in t.types if not isinstance(m, mi.NoneType)]
        return " or ".join(_describe(m, plural) for m in members)
    if isinstance(t, mi.StrType):
        return (
            noun("a non-empty string", "non-empty strings")
            if t.min_length
            else noun("a string", "strings")
        )
    if isinstance(t, mi.IntType):
        return noun("an integer", "integers") + _bounds(t)
    if isinstance(t, mi.FloatType):
        return noun("a number", "numbers") + _bounds(t)
    if isinstance(t, mi.BoolType):
        return noun("true or false", "true or false values")
    if isinstance(t, mi.ListType):
        items = _describe(t.item_type, plural=True)
        if t.min_length is not None and t.min_length > 1:
            return f"{noun('a list', 'lists')} of at least {t.min_length} {items}"
        whole = (
            noun("a non-empty list", "non-empty lists") if t.min_length else noun("a list", "lists")
        )
        return f"{whole} of {items}"
    if isinstance(t, (mi.DictType, mi.StructType)):
        return noun("a table", "tables")
    if isinstance(t, mi.LiteralType):
        return "one of " + ", ".join(repr(v) for v in t.values)
    return noun("another value", "other values")


def _bounds(t: mi.IntType | mi.FloatType) -> str:
    """`` from 1 to 65535``, `` > 0``, `` >= 1``; empty for none."""
    if t.ge is not None and t.le is not None:
        return f" from {_number(t.ge)} to {_number(t.le)}"
    bounds = ((">=", t.ge), (">", t.gt), ("<=", t.le), ("<", t.lt))
    return "".join(f" {op} {_number(b)}" for op, b in bounds if b is not None)


def _number(x: int | float) -> str:
    """``1000000`` as written; a float without a trailing ``.0`` (``0.5``, ``1``)."""
    return str(x) if isinstance(x, int) else f"{x:g}"


def _kind(value: Any) -> str:
    """What the TOML holds, in TOML's words where msgspec's differ (``table``, ``list``)."""
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "list"
    return type(value).__name__


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _check_aliases(config: Config) -> None:
    seen: dict[str, int] = {}
    for i, group in enumerate(config.aliases):
        names = {n.strip().casefold() for n in group}
        if len(group) < 2 or "" in names:
            raise ConfigError(
                f"{config.path}: aliases[{i}]: a group names one model by two names or more, "
                f"none empty (found {group!r})",
                'write it as ["name-a", "name-b"]',
            )
        for name in sorted(names):
            if name in seen and seen[name] != i:
                raise ConfigError(
                    f"{config.path}: aliases[{i}]: {name!r} is in aliases[{seen[name]}] too",
                    "merge the two groups: a name is of one model only",
                )
            seen[name] = i


def _check_key_file(config: Config) -> None:
    """The exporter's TLS private key must be its owner's alone (as OpenSSH asks of a private
    key): one that others may read is no secret, and serving with it would say otherwise."""
    key = config.exporter.key_file
    if key is None:
        return
    where = f"{config.path}: [exporter].key_file {key}"
    try:
        mode = os.stat(key).st_mode & 0o777
    except OSError as e:
        raise ConfigError(
            f"{where}: {e.strerror}", "give the path of the PEM private key"
        ) from None
    if mode & 0o077:
        raise ConfigError(
            f"{where}: the private key is readable or writable by others (mode {mode:04o})",
            f"chmod 600 {shlex.quote(key)}",
        )


def _check_references(config: Config) -> None:
    _check_aliases(config)
    _check_key_file(config)
    shown = config.path
    named: dict[str, list[str]] = {
        "hosts": [h.name for h in config.hosts],
        "runs": [r.name for r in config.runs],
        "endpoints": [e.name for e in config.endpoints],
    }
    for section, names in named.items():
        seen: set[str] = set()
        for i, name in enumerate(names):
            if name in seen:
                raise ConfigError(f"{shown}: {section}[{i}].name: duplicate name {name!r}")
            seen.add(name)
    hosts = {h.name for h in config.hosts}
    endpoints = {e.name for e in config.endpoints}
    from supervisor.agent.formats import BUILTIN_FORMATS  # here: formats is bundled into the agent

    formats = set(BUILTIN_FORMATS) | set(config.formats)
    for i, h in enumerate(config.hosts):
        if not h.local and not (h.address or h.name):
            raise ConfigError(f"{shown}: hosts[{i}].address: required for an SSH host")
    for i, r in enumerate(config.runs):
        if r.host not in hosts:
            raise ConfigError(
                f"{shown}: runs[{i}].host: no host named {r.host!r}",
                f"hosts defined: {', '.join(sorted(hosts)) or 'none'}",
            )
        if r.endpoint is not None and r.endpoint not in endpoints:
            raise ConfigError(
                f"{shown}: runs[{i}].endpoint: no endpoint named {r.endpoint!r}",
                f"endpoints defined: {', '.join(sorted(endpoints)) or 'none'}",
            )
        if not (r.workdir.startswith(("/", "~")) and "\0" not in r.workdir):
            # The client's relative paths, and a literal ``~`` in its argv, are read from the
            # workdir: a relative one would be relative to wherever runwatch or its agent runs.
            raise ConfigError(
                f"{shown}: runs[{i}].workdir: expected an absolute path or ~/..., "
                f"got {r.workdir!r}",
                "write the directory the command runs in on its host, e.g. /data/run or ~/run",
            )
        if r.format not in formats:
            raise ConfigError(
                f"{shown}: runs[{i}].format: unknown format {r.format!r}",
                f"known: {', '.join(sorted(formats))}",
            )
        _check_slurm(config, i, r)
        for j, d in enumerate(r.datasets):
            why = bad_name(d)
            if why is not None:
                raise ConfigError(
                    f"{shown}: runs[{i}].datasets[{j}]: not a dataset name: {why} "
                    "(it would escape the output dir)"
                )
        why = bad_name(r.data_file)
        if why is not None:
            raise ConfigError(
                f"{shown}: runs[{i}].data_file: not a file name: {why} "
                "(it would escape the dataset directory)"
            )
    for name in config.datasets:
        why = bad_name(name)
        if why is not None:
            raise ConfigError(
                f"{shown}: datasets.{name}: not a dataset name: {why} "
                "(it would escape the output dir)"
            )
    for i, e in enumerate(config.endpoints):
        if e.api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", e.api_key_env):
            raise ConfigError(
                f"{shown}: endpoints[{i}].api_key_env: "
                "expected the NAME of an environment variable",
                "put the key in the environment, never in the config",
            )
    _check_clients(config, formats)
    for name, prof in config.formats.items():
        sources = [prof.tokens_field, prof.tokens_list_field, prof.text_field]
        if sum(s is not None for s in sources) != 1:
            raise ConfigError(
                f"{shown}: formats.{name}: set exactly one of tokens_field, tokens_list_field, "
                "text_field"
            )
        if prof.text_field is None and (prof.text_role is not None or prof.reasoning_keys):
            raise ConfigError(
                f"{shown}: formats.{name}: text_role and reasoning_keys apply to a text_field "
                "of messages",
                'set text_field (e.g. text_field = "messages"), or drop them',
            )


def _check_clients(config: Config, formats: set[str]) -> None:
    """Client profiles name known formats and real flags; runs name known clients."""
    # here: the profiles (and the agent's matcher they use) load only when a file is read
    from supervisor.clients import BUILTIN_CLIENTS, path_defaults_problems, value_types_problems

    shown = config.path
    for name, c in config.clients.items():
        key = f"clients.{name}"
        if not c.scripts or not all(c.scripts):
            raise ConfigError(f"{shown}: {key}.scripts: expected a non-empty list of script names")
        if c.format not in formats:
            raise ConfigError(
                f"{shown}: {key}.format: unknown format {c.format!r}",
                f"known: {', '.join(sorted(formats))}",
            )
        named = [f for field in c.flags.__struct_fields__ for f in getattr(c.flags, field)]
        for flag in [*named, *c.volatile, *c.known_flags, *c.switches]:
            if not flag.startswith("-") or "=" in flag or " " in flag:
                raise ConfigError(
                    f"{shown}: {key}: {flag!r} is not a flag name",
                    "flags are spelled as on the command line, e.g. --output-file-path",
                )
        if bool(c.flags.output_file) == bool(c.flags.output_dir or c.flags.datasets):
            raise ConfigError(
                f"{shown}: {key}.flags: name either output_file (one output file) or "
                "output_dir/datasets (a file per dataset)"
            )
        wrong_types = value_types_problems(c)
        if wrong_types:
            problem, hint = wrong_types[0]
            raise ConfigError(f"{shown}: {key}.value_types{problem}", hint)
        wrong_defaults = path_defaults_problems(c)
        if wrong_defaults:
            problem, hint = wrong_defaults[0]
            raise ConfigError(f"{shown}: {key}.path_defaults{problem}", hint)
        if c.resume == "flag" and not c.flags.resume:
            raise ConfigError(f"{shown}: {key}.flags.resume: required when resume = 'flag'")
        if "{}" not in c.endpoint_template:
            raise ConfigError(f"{shown}: {key}.endpoint_template: must contain {{}}")
        for kind, pattern in c.sidecars.items():
            if "{stem}" not in pattern or "/" in pattern:
                raise ConfigError(
                    f"{shown}: {key}.sidecars.{kind}: expected a file name with {{stem}}, "
                    f"got {pattern!r}"
                )
    known = set(BUILTIN_CLIENTS) | set(config.clients)
    for i, r in enumerate(config.runs):
        if r.client is not None and r.client not in known:
            raise ConfigError(
                f"{shown}: runs[{i}].client: unknown client {r.client!r}",
                f"known: {', '.join(sorted(known))} (see runwatch clients)",
            )


def _apply_clients(config: Config, data: Any) -> None:
    """A run without its own ``format`` / ``data_file`` keys takes its client profile's."""
    from supervisor.clients import client_of

    raw_runs = data.get("runs") if isinstance(data, dict) else None
    for i, r in enumerate(config.runs):
        given = raw_runs[i] if isinstance(raw_runs, list) and i < len(raw_runs) else {}
        profile = client_of(config, r)
        if "format" not in given:
            r.format = profile.format
        if "data_file" not in given:
            r.data_file = profile.data_file


_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^(?i:unlimited|infinite)$")


def _check_slurm(config: Config, i: int, run: RunConfig) -> None:
    shown = config.path
    kind = config.host(run.host).kind
    if run.slurm is not None and kind != "slurm":
        raise ConfigError(
            f"{shown}: runs[{i}].slurm: host {run.host!r} is not a Slurm host",
            'set kind = "slurm" on the host, or remove the [runs.slurm] table',
        )
    sl = run.slurm
    if sl is None:
        return
    for key in ("partition", "gres", "gpus", "job_name", "output"):
        value = getattr(sl, key)
        if value is not None and (not value or any(c in value for c in "\n\r\0")):
            raise ConfigError(f"{shown}: runs[{i}].slurm.{key}: expected one non-empty line")
    if sl.time is not None and not _SLURM_TIME.match(sl.time):
        raise ConfigError(
            f"{shown}: runs[{i}].slurm.time: not a Slurm time limit: {sl.time!r}",
            "use minutes, HH:MM:SS or D-HH:MM:SS",
        )
    for j, line in enumerate(sl.extra):
        if not line.startswith("-") or any(c in line for c in "\n\r\0"):
            raise ConfigError(
                f"{shown}: runs[{i}].slurm.extra[{j}]: expected one sbatch option line "
                f"starting with '-', got {line!r}"
            )
    if sl.array and len(config.run_datasets(run)) < 1:
        raise ConfigError(
            f"{shown}: runs[{i}].slurm.array: the run names no datasets",
            "list them in datasets = [...] or --datasets in argv",
        )


def command_prefix(config: Config) -> str:
    """``runwatch``, plus ``-c PATH`` when the config is not the one runwatch finds by default."""
    path = config.path
    default = os.environ.get("RUNWATCH_CONFIG") or "runwatch.toml"
    if not path or os.path.abspath(path) == os.path.abspath(default):
        return "runwatch"
    return f"runwatch -c {shlex.quote(os.path.abspath(path))}"
