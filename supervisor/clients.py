"""Client profiles: the generation scripts runwatch supervises, and what their flags mean.

A :class:`~supervisor.config.ClientProfile` says how a script is recognised (its file names), what
each of its flags means (datasets, output directory or single output file, input file, samples,
budget, resume, concurrency, endpoint, model), how it resumes (``always``, or only with its resume
flag: without it the script OVERWRITES its output), which files beside its output hold failed or
skipped prompts, how an input row's id appears in a record, which flags do not change what is
generated (``volatile``), every flag it accepts, what the value of each must be
(``value_types``: ``int``, ``float``, ``str``, ``path``, or a list of choices; a restart checks
every ``--set`` value against them before it stops anything), and the value the script uses for a
path flag its argv does not give (``path_defaults``: its argparse ``default=``; a flag that decides
where the data goes, absent from the argv and without a default, leaves the run's files unknown).
Built-in profiles:

``run_inference``
    The reference client (``supervisor/demo/run_inference.py``): ``--datasets``, ``--output-dir``
    (default ``out``), one ``<out>/<dataset>/raw_responses.jsonl`` per dataset, ``--prompts-dir``
    (default ``prompts``), ``--max-samples``, ``--token-budget``; resumes always (skips the
    sample_ids present).
``specforge``
    SpecForge ``scripts/regenerate_train_data.py``: ONE ``--output-file-path``, the input file
    ``--input-file-path`` (both required), ``--num-samples`` (counted per invocation, after the
    rows its ``--resume`` skips: once it resumes, no bound on the dataset's records), no budget
    flag, ``--temperature`` within 0..1; overwrites its output, error and skipped files unless
    given ``--resume``.
``modelopt``
    Model-Optimizer ``server_generate.py``: ONE ``--output_path`` (always appended),
    ``--data_path`` (JSON lines, or one JSON array; neither has a usable default),
    ``--num_threads``, ``--url``; resumes always (skips the conversation_ids present, failed ones
    logged by ``--log_empty_conversations`` included); no sample or budget flag; its ``--api_key``
    value is a secret.

User profiles are ``[clients.NAME]`` tables of the config (same schema; a user profile of a
built-in's name replaces it). A run names its ``client``, or it is the profile whose ``scripts``
hold the script of its argv. The host is sent only :func:`wire` of each profile (plain data: the
scripts and the flag spellings) and reads every run's flags with it (``agent.match.parse_flags``).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from supervisor.agent import argflags, formats, match
from supervisor.agent.protocol import ClientSpec
from supervisor.configschema import ClientFlagNames, ClientProfile, Config, RunConfig
from supervisor.configschema import ValueType as ValueType  # one entry of value_types

_REF = match.REFERENCE_FLAGS


def _builtin() -> dict[str, ClientProfile]:
    reference = ClientProfile(
        name="run_inference",
        scripts=["run_inference.py"],
        format="raw",
        flags=ClientFlagNames(**{k: list(v) for k, v in _REF.items()}),
        data_file="raw_responses.jsonl",
        resume="always",
        input_id="sample_id",
        volatile=[
            *_REF["datasets"],
            *_REF["output_dir"],
            *_REF["samples"],
            *_REF["budget"],
            *_REF["concurrency"],
            *_REF["endpoint"],
            "--api-key-env",
            "--max-retries",
            "--max-failures",
            "--request-timeout",
            "--report-seconds",
        ],
        known_flags=[
            "--datasets",
            "--prompts-dir",
            "--output-dir",
            "--api-base",
            "--model",
            "--api-key-env",
            "--concurrency",
            "--max-samples",
            "--token-budget",
            "--max-tokens",
            "--temperature",
            "--legacy-format",
            "--max-retries",
            "--max-failures",
            "--request-timeout",
            "--report-seconds",
        ],
        switches=["--legacy-format"],
        path_defaults={"--output-dir": "out", "--prompts-dir": "prompts"},
        value_types={
            "--datasets": "str",
            "--prompts-dir": "path",
            "--output-dir": "path",
            "--api-base": "str",
            "--model": "str",
            "--api-key-env": "str",
            "--concurrency": "int",
            "--max-samples": "int",
            "--token-budget": "int",
            "--max-tokens": "int",
            "--temperature": "float",
            "--max-retries": "int",
            "--max-failures": "int",
            "--request-timeout": "float",
            "--report-seconds": "float",
        },
    )
    # SpecForge scripts/regenerate_train_data.py, every released shape of its argparse options
    # (sgl-project/SpecForge, 2025-09-28 a2cb6d84 .. 2026-07-13 1e759089): the first versions
    # launched their own server (--batch-size, --port, --tp-size, ...); --server-address and
    # --concurrency since 2025-11-18; --is-reasoning-model (reasoning saved under "thinking",
    # then "reasoning_content" from 2026-03-17) until --reasoning replaced it on 2026-06-05;
    # --resume since 2026-02-03. Every version refuses a --temperature outside 0..1 and a
    # --max-tokens (and the first ones a --batch-size) below 1.
    specforge = ClientProfile(
        name="specforge",
        scripts=["regenerate_train_data.py"],
        format="specforge",
        flags=ClientFlagNames(
            output_file=["--output-file-path"],
            input_file=["--input-file-path"],
            samples=["--num-samples"],
            resume=["--resume"],
            concurrency=["--concurrency"],
            endpoint=["--server-address"],
            model=["--model"],
        ),
        endpoint_template="http://{}/v1",
        resume="flag",
        samples_scope="invocation",
        sidecars={"error": "{stem}_error.jsonl", "skipped": "{stem}_skipped.jsonl"},
        input_id="id",
        volatile=[
            "--output-file-path",
            "--num-samples",
            "--resume",
            "--concurrency",
            "--server-address",
            "--port",
            "--batch-size",
        ],
        known_flags=[
            "--model",
            "--reasoning",
            "--is-reasoning-model",
            "--is-gpt-oss",
            "--temperature",
            "--top-p",
            "--top-k",
            "--repetition-penalty",
            "--max-tokens",
            "--concurrency",
            "--input-file-path",
            "--output-file-path",
            "--num-samples",
            "--resume",
            "--server-address",
            "--batch-size",
            "--port",
            "--tp-size",
            "--dp-size",
            "--mem-fraction-static",
            "--max-running-requests",
            "--auto-launch-server",
        ],
        switches=["--is-gpt-oss", "--is-reasoning-model", "--resume", "--auto-launch-server"],
        # --input-file-path and --output-file-path are required: no defaults.
        value_types={
            "--model": "str",
            "--reasoning": ["none", "save", "disable"],
            "--temperature": "float",
            "--top-p": "float",
            "--top-k": "int",
            "--repetition-penalty": "float",
            "--max-tokens": "int",
            "--concurrency": "int",
            "--input-file-path": "path",
            "--output-file-path": "path",
            "--num-samples": "int",
            "--server-address": "str",
            "--batch-size": "int",
            "--port": "int",
            "--tp-size": "int",
            "--dp-size": "int",
            "--mem-fraction-static": "float",
            "--max-running-requests": "int",
        },
        # Every version refuses these when it starts (ValueError before any request).
        value_ranges={"--temperature": [0.0, 1.0], "--max-tokens": [1], "--batch-size": [1]},
        defaults={
            "--reasoning": "none",
            "--temperature": "0.7 (0 before 2025-11-18)",
            "--max-tokens": "4096",
            "--concurrency": "64",
            "--num-samples": "all the rows after the skip",
        },
    )
    # Model-Optimizer examples/speculative_decoding/server_generate.py (scripts/ since
    # 2025-11-19), every release from 0.31.0 (2025-06-05) on: no version of it has any other flag
    # (--chat was a switch in 0.31.0, type=bool after: left untyped).
    modelopt = ClientProfile(
        name="modelopt",
        scripts=["server_generate.py"],
        format="modelopt",
        flags=ClientFlagNames(
            output_file=["--output_path"],
            input_file=["--data_path"],
            concurrency=["--num_threads"],
            endpoint=["--url"],
            model=["--model"],
        ),
        resume="always",
        input_id="",
        volatile=["--output_path", "--num_threads", "--url", "--api_key"],
        known_flags=[
            "--data_path",
            "--output_path",
            "--num_threads",
            "--temperature",
            "--max_tokens",
            "--chat",
            "--model",
            "--url",
            "--api_key",
            "--log_empty_conversations",
            "--system_prompt",
        ],
        switches=["--log_empty_conversations"],
        # --data_path and --output_path default to None, which the script cannot open: no
        # defaults.
        # --chat is argparse type=bool, which takes any value: left untyped.
        value_types={
            "--data_path": "path",
            "--output_path": "path",
            "--num_threads": "int",
            "--temperature": "float",
            "--max_tokens": "int",
            "--model": "str",
            "--url": "str",
            "--api_key": "str",
            "--system_prompt": "str",
        },
        defaults={
            "--num_threads": "256",
            "--temperature": "0.0",
            "--max_tokens": "2048",
            "--model": "model",
            "--url": "http://localhost:8000/v1",
        },
    )
    return {p.name: p for p in (reference, specforge, modelopt)}


BUILTIN_CLIENTS: dict[str, ClientProfile] = _builtin()
"""The built-in client profiles by name."""

ROLES: tuple[str, ...] = ClientFlagNames.__struct_fields__
"""What a flag can mean (the keys of a profile's ``flags``)."""


PATH_ROLES: tuple[str, ...] = ("output_dir", "output_file", "input_file", "prompts_dir")
"""The roles whose flag is a path the client reads or writes."""


def default_of(profile: ClientProfile, role: str) -> str | None:
    """The value the client uses for ``role`` when its argv gives none (``path_defaults`` of the
    role's first spelling that has one); None: the profile does not say."""
    for flag in getattr(profile.flags, role):
        if flag in profile.path_defaults:
            return profile.path_defaults[flag]
    return None


def path_defaults_problems(profile: ClientProfile) -> list[tuple[str, str]]:
    """What is wrong with the profile's ``path_defaults``: ``(".FLAG: what", hint)`` each;
    empty when nothing is."""
    out: list[tuple[str, str]] = []
    for flag, value in profile.path_defaults.items():
        if not flag.startswith("-") or "=" in flag or " " in flag:
            out.append((f".{flag}: {flag!r} is not a flag name", "spell it as on the command line"))
        elif not value or "\0" in value:
            out.append(
                (f".{flag}: {value!r} is not a path", "write the script's default, e.g. out")
            )
        elif profile.known_flags and flag not in profile.known_flags:
            out.append(
                (
                    f".{flag}: not one of the profile's known_flags",
                    f"add {flag} to known_flags, or correct its spelling",
                )
            )
        elif flag in profile.switches:
            out.append((f".{flag}: a switch has no path", "remove it from path_defaults"))
        elif profile.value_types.get(flag, "path") != "path":
            out.append(
                (
                    f".{flag}: its value_types entry is not path",
                    f'only path flags have defaults here: set "{flag}" = "path" in value_types',
                )
            )
    return out


VALUE_TYPES: tuple[str, ...] = ("int", "float", "str", "path")
"""The named types of a profile's ``value_types`` (a list of strings is a set of choices)."""


def value_types_problems(profile: ClientProfile) -> list[tuple[str, str]]:
    """What is wrong with the profile's ``value_types``: ``(".FLAG: what", hint)`` each (a type
    that does not exist, choices that are empty, a flag that is not one of ``known_flags`` or
    is a switch); empty when nothing is."""
    out: list[tuple[str, str]] = []
    types_hint = f"a type is one of {', '.join(VALUE_TYPES)}, or a list of choices"
    for flag, vtype in profile.value_types.items():
        if not flag.startswith("-") or "=" in flag or " " in flag:
            out.append((f".{flag}: {flag!r} is not a flag name", "spell it as on the command line"))
        elif isinstance(vtype, str) and vtype not in VALUE_TYPES:
            out.append((f".{flag}: unknown type {vtype!r}", types_hint))
        elif isinstance(vtype, list) and not vtype:
            out.append((f".{flag}: an empty list of choices", types_hint))
        elif profile.known_flags and flag not in profile.known_flags:
            out.append(
                (
                    f".{flag}: not one of the profile's known_flags",
                    f"add {flag} to known_flags, or correct its spelling",
                )
            )
        elif flag in profile.switches:
            out.append(
                (f".{flag}: a switch takes no value", "remove it from switches or value_types")
            )
    for flag, bounds in profile.value_ranges.items():
        if profile.value_types.get(flag) not in ("int", "float"):
            out.append(
                (
                    f".{flag}: a range needs a numeric type",
                    f'set "{flag}" = "float" (or "int") in value_types',
                )
            )
        elif len(bounds) not in (1, 2) or (len(bounds) == 2 and bounds[0] > bounds[1]):
            out.append(
                (
                    f".{flag}: expected [low, high] or [low]",
                    "write the range as [low, high], or [low] for at least low",
                )
            )
    return out


def value_problem(value: str, vtype: ValueType, numeric_choices: bool = False) -> str | None:
    """Why ``value`` is not of type ``vtype`` (``"is not an int"``); None when it is. ``int``
    and ``float`` read the value as argparse's ``type=int`` / ``type=float`` do. With
    ``numeric_choices`` (choices of an option whose type converts, read from the script's
    source), a value equal as a number to a choice that is a number passes too (``01`` for
    ``1``)."""
    if isinstance(vtype, list):
        if value in vtype or (numeric_choices and _number_in(value, vtype)):
            return None
        return f"is not one of {', '.join(vtype)}"
    try:
        if vtype == "int":
            int(value)
        elif vtype == "float":
            float(value)
    except ValueError:
        return f"is not {'an int' if vtype == 'int' else 'a float'}"
    if vtype == "path" and not value:
        return "is not a path (it is empty)"
    return None


def range_problem(value: str, bounds: Sequence[float]) -> str | None:
    """Why a numeric ``value`` lies outside the inclusive ``bounds`` (``[low, high]``, or
    ``[low]``: at least low); None: inside."""
    try:
        x = float(value)
    except ValueError:
        return "is not a number"
    if x < bounds[0] or (len(bounds) > 1 and x > bounds[1]):
        return f"is outside {describe_range(bounds)}, which the script refuses when it starts"
    return None


def describe_range(bounds: Sequence[float]) -> str:
    """``0..1``, or ``at least 1``."""
    if len(bounds) > 1:
        return f"{bounds[0]:g}..{bounds[1]:g}"
    return f"at least {bounds[0]:g}"


def _number_in(value: str, choices: Sequence[str]) -> bool:
    def number(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    n = number(value)
    return n is not None and any(number(c) == n for c in choices)


def describe_type(vtype: ValueType) -> str:
    """A type for humans: ``int``, or ``one of none/save/disable``."""
    return f"one of {'/'.join(vtype)}" if isinstance(vtype, list) else vtype


def profiles(config: Config) -> dict[str, ClientProfile]:
    """Every profile the config knows: the built-ins, then ``[clients.NAME]`` (replacing)."""
    return {**BUILTIN_CLIENTS, **config.clients}


def detect(config: Config, argv: Sequence[str]) -> ClientProfile | None:
    """The profile whose scripts hold the script ``argv`` executes, or None."""
    known = profiles(config)
    idx = match.script_index(argv, all_scripts(config))
    if idx is None:
        return None
    base = posixpath.basename(argv[idx])
    # User profiles first: a [clients.NAME] for a built-in's script takes it over.
    for p in [*config.clients.values(), *BUILTIN_CLIENTS.values()]:
        if base in p.scripts:
            return known[p.name]
    return None


def client_of(config: Config, run: RunConfig, argv: Sequence[str] | None = None) -> ClientProfile:
    """The run's profile: the one it names, else the one of its script, else the reference
    client's (a script without a profile is read with the reference client's flag names)."""
    if run.client is not None:
        return profiles(config)[run.client]
    found = detect(config, run.argv if argv is None else argv)
    return found if found is not None else BUILTIN_CLIENTS["run_inference"]


def is_profiled(config: Config, run: RunConfig, argv: Sequence[str] | None = None) -> bool:
    """True when a profile describes the run's script (named, or detected)."""
    return run.client is not None or detect(config, run.argv if argv is None else argv) is not None


def all_scripts(config: Config) -> list[str]:
    """Script names that make a process a run: ``scripts`` of the config and of every profile."""
    names = list(config.scripts)
    for p in [*BUILTIN_CLIENTS.values(), *config.clients.values()]:
        names.extend(s for s in p.scripts if s not in names)
    return names


def wire(profile: ClientProfile) -> ClientSpec:
    """What the host needs of a profile, as plain data (``protocol.ClientSpec``)."""
    flags = {role: list(getattr(profile.flags, role)) for role in ROLES}
    return {
        "name": profile.name,
        "scripts": list(profile.scripts),
        "flags": {k: v for k, v in flags.items() if v},
        "endpoint_template": profile.endpoint_template,
        "defaults": {r: d for r in PATH_ROLES if (d := default_of(profile, r)) is not None},
    }


def wire_all(config: Config) -> list[ClientSpec]:
    """:func:`wire` of every profile, user profiles first (they take a shared script over)."""
    known = profiles(config)
    order = [*config.clients, *(n for n in BUILTIN_CLIENTS if n not in config.clients)]
    return [wire(known[n]) for n in order]


def read_flags(
    profile: ClientProfile, argv: Sequence[str], scripts: Sequence[str]
) -> dict[str, Any]:
    """The run's flags (``model.RunFlags`` shape) read with the profile's spellings."""
    idx = match.script_index(argv, scripts)
    return match.parse_flags(list(argv), idx if idx is not None else 0, wire(profile))


def single_file(profile: ClientProfile) -> bool:
    """True when the client writes ONE output file (its one dataset is named after it)."""
    return bool(profile.flags.output_file)


def stem(path: str) -> str:
    """``out/regen.jsonl`` -> ``regen``: the dataset name of a single-file client's output."""
    base = posixpath.basename(path)
    return base[: -len(".jsonl")] if base.endswith(".jsonl") and len(base) > 6 else base


def sidecar_paths(profile: ClientProfile, output: str) -> dict[str, str]:
    """Kind -> path of the files beside ``output`` that hold failed or skipped prompts."""
    directory = posixpath.dirname(output)
    return {
        kind: posixpath.join(directory, pattern.replace("{stem}", stem(output)))
        for kind, pattern in profile.sidecars.items()
    }


def overwrite_problem(profile: ClientProfile, argv: Sequence[str]) -> str | None:
    """Why launching ``argv`` would overwrite the client's existing output (None: it would not)."""
    if profile.resume != "flag" or argflags.has_flag(argv, profile.flags.resume):
        return None
    flag = profile.flags.resume[0]
    return f"{profile.name} overwrites its output without {flag}, and the new command line lacks it"


def resume_fix(profile: ClientProfile) -> str:
    """The ``--set`` that makes the client keep its output."""
    return f"--set {profile.flags.resume[0].lstrip('-')}" if profile.flags.resume else ""


def fingerprint_flags(
    profile: ClientProfile, argv: Sequence[str], scripts: Sequence[str]
) -> dict[str, str]:
    """Every flag after the script except the profile's volatile ones: ``{flag: value}`` (``""``
    for a flag without value; several values joined by a space)."""
    idx = match.script_index(argv, scripts)
    args = list(argv[(idx if idx is not None else 0) + 1 :])
    volatile = set(profile.volatile)
    return {
        name: " ".join(values)
        for name, values in argflags.options(args)
        if name.startswith("--") and name not in volatile
    }


@dataclass(frozen=True)
class ClientInfo:
    """One profile as ``runwatch clients`` shows it."""

    name: str
    source: str
    """``built-in`` or the config file it comes from."""
    profile: ClientProfile

    def as_dict(self) -> dict[str, Any]:
        d = msgspec.to_builtins(self.profile)
        d["flags"] = {k: v for k, v in d["flags"].items() if v}
        d["source"] = self.source
        d["layout"] = "single-file" if single_file(self.profile) else "per-dataset"
        d["budget_flag"] = self.profile.flags.budget[0] if self.profile.flags.budget else None
        d["lines"] = format_lines(self.profile.format)
        return dict(d)


def format_lines(fmt: str) -> dict[str, Any]:
    """What the lines of a built-in format are besides records: its end marker, its line for a
    failed request, the keys its reasoning is under, the key whose absence means only the last
    answer was generated; empty for a user format."""
    prof = formats.PROFILES.get(fmt)
    if prof is None:
        return {}
    return {
        "end_marker": {prof.end_marker: True} if prof.end_marker else None,
        "failed_line": list(prof.failed_keys) or None,
        "reasoning_keys": list(prof.reasoning_keys),
        "last_turn_without": prof.last_turn_without,
    }


def list_clients(config: Config) -> list[ClientInfo]:
    """Every profile, built-ins first, each with where it comes from."""
    out = [
        ClientInfo(name, "built-in", p)
        for name, p in BUILTIN_CLIENTS.items()
        if name not in config.clients
    ]
    out += [ClientInfo(name, config.path or "config", p) for name, p in config.clients.items()]
    return out


def describe(info: ClientInfo) -> list[str]:
    """Lines for humans: what the profile knows."""
    p = info.profile
    d = info.as_dict()
    flags = d["flags"]
    lines = [f"{info.name}  ({info.source})", f"  scripts: {', '.join(p.scripts)}"]
    if single_file(p):
        lines.append(f"  layout: single file {'/'.join(flags['output_file'])}; dataset = file name")
    else:
        lines.append(
            f"  layout: per dataset <{'/'.join(flags.get('output_dir', ['?']))}>/<dataset>/"
            f"{p.data_file}"
        )
    lines.append(f"  records: format {p.format}")
    fl = format_lines(p.format)
    if fl.get("end_marker"):
        lines.append(f"  end marker line (not a record): {json.dumps(fl['end_marker'])}")
    if fl.get("failed_line"):
        keys = ", ".join(f'"{k}": N' for k in fl["failed_line"])
        lines.append(f"  failed-request line (a failed row, not missing): {{{keys}}}")
    if fl.get("reasoning_keys"):
        lines.append(f"  reasoning under: {' or '.join(fl['reasoning_keys'])} (counted apart)")
    if fl.get("last_turn_without"):
        lines.append(
            f"  a record without {fl['last_turn_without']!r}: only its last answer was generated"
        )
    for role in ROLES:
        if role in flags and role not in ("output_file", "output_dir", "resume"):
            lines.append(f"  {role.replace('_', ' ')}: {', '.join(flags[role])}")
    if not p.flags.budget:
        lines.append("  budget: no budget flag (the guard can only stop it at its budget)")
    if p.resume == "flag":
        lines.append(f"  resume: OVERWRITES its output unless given {p.flags.resume[0]}")
    else:
        lines.append("  resume: always (keeps and extends its output)")
    if p.samples_scope == "invocation" and p.flags.samples:
        lines.append(
            f"  {p.flags.samples[0]} counts this invocation's samples, after the rows its resume "
            "skips: launched by runwatch the bound is the records at the launch plus it, started "
            "by hand and resumed there is no bound"
        )
    for kind, pattern in p.sidecars.items():
        lines.append(f"  {kind} file: {pattern}")
    defaults = ", ".join(f"{f} {v}" for f, v in p.path_defaults.items())
    lines.append(f"  path defaults: {defaults or 'none (a path flag it needs must be in argv)'}")
    lines.append(
        f"  input id: {'row index' if not p.input_id else p.input_id}; "
        f"volatile: {', '.join(p.volatile) or 'none'}"
    )
    lines.append(
        f"  known flags: {len(p.known_flags)}"
        if p.known_flags
        else "  known flags: read from the script's argparse source"
    )
    if p.value_types:
        lines.append("  value types (checked for every --set):")
        for name in VALUE_TYPES:
            typed = [f for f, t in p.value_types.items() if t == name]
            if typed:
                lines.append(f"    {name}: {', '.join(typed)}")
        for f, t in p.value_types.items():
            if isinstance(t, list):
                lines.append(f"    {f}: {describe_type(t)}")
    for f, bounds in p.value_ranges.items():
        lines.append(f"  {f} must be {describe_range(bounds)}")
    if p.defaults:
        lines.append("  defaults: " + ", ".join(f"{f} {v}" for f, v in p.defaults.items()))
    return lines
