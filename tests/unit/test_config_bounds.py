"""The bounds of numeric config keys: declared once on the field (``msgspec.Meta``), enforced by
the loader reading a real file, and said in the error (key, what is allowed, the value found)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest

from supervisor import configschema
from supervisor.config import Config, load_config
from supervisor.errors import ConfigError

# Where each table of the schema sits in TEXT, and the keys it needs to be valid.
TABLES: dict[type[msgspec.Struct], tuple[str, str]] = {
    configschema.Config: ("", ""),
    configschema.HostConfig: ("hosts[0]", '[[hosts]]\nname = "h"\nlocal = true\nkind = "slurm"\n'),
    configschema.RunConfig: (
        "runs[0]",
        '[[runs]]\nname = "r"\nhost = "h"\nworkdir = "/w"\n'
        'argv = ["python3", "run_inference.py", "--datasets", "D"]\n',
    ),
    configschema.SlurmRunConfig: ("runs[0].slurm", "[runs.slurm]\n"),
    configschema.DatasetConfig: ("datasets.D", "[datasets.D]\n"),
    configschema.EndpointConfig: (
        "endpoints[0]",
        '[[endpoints]]\nname = "e"\nkind = "api"\nbase_url = "http://127.0.0.1:9/v1"\n',
    ),
    configschema.AlertsConfig: ("alerts", "[alerts]\n"),
}


def config_text(table: type[msgspec.Struct], line: str) -> str:
    """A valid config with one of each table, ``line`` added to ``table``."""
    return "".join(body + (line + "\n" if t is table else "") for t, (_, body) in TABLES.items())


def error_of(tmp_path: Path, text: str) -> ConfigError:
    path = tmp_path / "rw.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.message.startswith(f"{path}: "), info.value.message
    return info.value


def loaded(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "rw.toml"
    path.write_text(text)
    return load_config(path, env={})


def number_type(t: mi.Type) -> mi.IntType | mi.FloatType | None:
    """The int or float type of a field (``X | None`` unwrapped), None for any other."""
    if isinstance(t, mi.UnionType):
        found = [m for m in t.types if isinstance(m, (mi.IntType, mi.FloatType))]
        return found[0] if found else None
    return t if isinstance(t, (mi.IntType, mi.FloatType)) else None


def numeric_fields() -> list[tuple[type[msgspec.Struct], str, mi.IntType | mi.FloatType]]:
    out = []
    for table in TABLES:
        info = mi.type_info(table)
        assert isinstance(info, mi.StructType)
        for field in info.fields:
            number = number_type(field.type)
            if number is not None:
                out.append((table, field.encode_name, number))
    return out


def edges(t: mi.IntType | mi.FloatType) -> list[tuple[float, bool]]:
    """``(value, allowed)`` on both sides of each bound ``t`` declares."""
    step = 1 if isinstance(t, mi.IntType) else 0.001
    out: list[tuple[float, bool]] = []
    if t.ge is not None:
        out += [(t.ge - step, False), (t.ge, True)]
    if t.gt is not None:
        out += [(t.gt, False), (t.gt + step, True)]
    if t.le is not None:
        out += [(t.le + step, False), (t.le, True)]
    if t.lt is not None:
        out += [(t.lt, False), (t.lt - step, True)]
    return out


def toml_number(value: float) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def test_every_numeric_key_of_the_schema_declares_its_bounds() -> None:
    """A numeric key without ``Meta`` bounds would take -5 seconds or 0 retries silently."""
    fields = numeric_fields()
    assert len(fields) >= 25, fields  # every table with numbers is in TABLES
    unbounded = [f"{t.__name__}.{name}" for t, name, n in fields if not edges(n)]
    assert unbounded == []


@pytest.mark.parametrize(
    ("table", "key", "number"),
    [pytest.param(t, k, n, id=f"{TABLES[t][0] or 'top'}.{k}") for t, k, n in numeric_fields()],
)
def test_each_bound_is_enforced_on_both_sides(
    tmp_path: Path, table: type[msgspec.Struct], key: str, number: mi.IntType | mi.FloatType
) -> None:
    prefix = TABLES[table][0]
    shown = f"{prefix}.{key}" if prefix else key
    for value, allowed in edges(number):
        text = config_text(table, f"{key} = {toml_number(value)}")
        if allowed:
            config = loaded(tmp_path, text)
            holder: Any = {
                configschema.Config: config,
                configschema.HostConfig: config.hosts[0],
                configschema.RunConfig: config.runs[0],
                configschema.SlurmRunConfig: config.runs[0].slurm,
                configschema.DatasetConfig: config.datasets["D"],
                configschema.EndpointConfig: config.endpoints[0],
                configschema.AlertsConfig: config.alerts,
            }[table]
            assert getattr(holder, key) == value
        else:
            message = error_of(tmp_path, text).message
            kind = "an integer" if isinstance(number, mi.IntType) else "a number"
            assert message.split(": ", 1)[1].startswith(f"{shown}: expected {kind} "), message
            assert message.endswith(f", got {toml_number(value)}"), message
    if isinstance(number, mi.FloatType):
        for word in ("inf", "-inf", "nan"):
            message = error_of(tmp_path, config_text(table, f"{key} = {word}")).message
            assert f"{shown}: expected a finite number" in message and message.endswith(word)


@pytest.mark.parametrize(
    ("table", "line", "message", "hint"),
    [
        (
            configschema.HostConfig,
            "port = 0",
            "hosts[0].port: expected an integer from 1 to 65535, got 0",
            None,
        ),
        (
            configschema.HostConfig,
            "port = 65536",
            "hosts[0].port: expected an integer from 1 to 65535, got 65536",
            None,
        ),
        (
            configschema.HostConfig,
            "keepalive_interval = 0",
            "hosts[0].keepalive_interval: expected a number > 0, got 0",
            "remove the key to use the default, 5.0",
        ),
        (
            configschema.RunConfig,
            "stop_grace_seconds = -0.5",
            "runs[0].stop_grace_seconds: expected a number >= 0, got -0.5",
            "remove the key to use the default, 10.0",
        ),
        (
            configschema.RunConfig,
            "restart_max = -1",
            "runs[0].restart_max: expected an integer >= 0, got -1",
            "remove the key to use the default, 3",
        ),
        (
            configschema.DatasetConfig,
            "max_samples = 0",
            "datasets.D.max_samples: expected an integer >= 1, got 0",
            None,
        ),
        (
            configschema.SlurmRunConfig,
            "cpus_per_task = 0",
            "runs[0].slurm.cpus_per_task: expected an integer >= 1, got 0",
            None,
        ),
        (
            configschema.Config,
            "refresh_seconds = inf",
            "refresh_seconds: expected a finite number > 0, got inf",
            "remove the key to use the default, 2.0",
        ),
        (
            configschema.RunConfig,
            'restart_max = "3"',
            "runs[0].restart_max: expected an integer >= 0, got str",
            None,
        ),
    ],
)
def test_the_message_says_the_key_what_it_allows_and_the_value(
    tmp_path: Path, table: type[msgspec.Struct], line: str, message: str, hint: str | None
) -> None:
    error = error_of(tmp_path, config_text(table, line))
    assert error.message == f"{tmp_path / 'rw.toml'}: {message}"
    assert error.hint == hint


def test_just_inside_the_bounds_loads(tmp_path: Path) -> None:
    config = loaded(
        tmp_path,
        config_text(configschema.HostConfig, "port = 65535\nconnect_timeout = 0.001")
        .replace("[runs.slurm]\n", "[runs.slurm]\nnodes = 1\n")
        .replace("[datasets.D]\n", "[datasets.D]\ntoken_budget = 1\n"),
    )
    host, run = config.hosts[0], config.runs[0]
    assert host.port == 65535 and math.isclose(host.connect_timeout, 0.001)
    assert run.slurm is not None and run.slurm.nodes == 1
    assert config.datasets["D"].token_budget == 1


def test_a_list_bound_and_a_nested_table_are_named_by_their_keys(tmp_path: Path) -> None:
    text = config_text(configschema.Config, "").replace(
        'argv = ["python3", "run_inference.py", "--datasets", "D"]', "argv = []"
    )
    assert error_of(tmp_path, text).message.endswith(
        "runs[0].argv: expected a non-empty list of strings, got an empty list"
    )
    text = config_text(configschema.Config, "") + (
        '[clients.mine]\nscripts = ["g.py"]\nvalue_ranges = { "--t" = [0.0, nan] }\n'
        '[clients.mine.flags]\noutput_file = ["--o"]\n'
    )
    assert error_of(tmp_path, text).message.endswith(
        "clients.mine.value_ranges.--t[1]: expected a finite number, got nan"
    )
    text = config_text(configschema.Config, "") + (
        '[clients.mine]\nscripts = ["g.py"]\n[clients.mine.flags]\noutput_fil = ["--o"]\n'
    )
    assert ": clients.mine.flags.output_fil: unknown key (allowed: datasets, output_dir," in (
        error_of(tmp_path, text).message
    )


def test_an_annotated_type_is_told_in_the_words_of_its_meta(tmp_path: Path) -> None:
    """``value_types`` entries carry a description and a hint in their ``Meta``."""
    client = '[clients.mine]\nscripts = ["g.py"]\n[clients.mine.flags]\noutput_file = ["--o"]\n'
    text = config_text(configschema.Config, "") + client
    for entry, message in [
        (
            "3",
            "clients.mine.value_types.--n: expected a type name or a list of strings "
            "(choices), got int",
        ),
        ('["a", 3]', "clients.mine.value_types.--n[1]: expected a string, got int"),
    ]:
        typed = text.replace(
            'scripts = ["g.py"]\n', f'scripts = ["g.py"]\nvalue_types = {{ "--n" = {entry} }}\n'
        )
        error = error_of(tmp_path, typed)
        assert error.message.endswith(message), error.message
        assert error.hint is not None and "value_types = {" in error.hint
