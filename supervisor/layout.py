"""The data layout of a run, derived from the command line it runs or will run.

One function, ``layout_of(config, run, argv)``, says where a run writes: its datasets, output
directory, data files, lock files, launch fingerprint files, prompt files and log. Every check that
protects data (the format check, the locks, the fingerprints, the writers) uses it, on the
*effective* argv of the launch it guards (the config's argv with the overrides applied), so a
restart with ``--set datasets=B2`` or ``--set output-dir=other`` checks the files it will write.

Paths are read as the client reads them (``agent.match.client_path``, the rule the host applies
too): no shell expanded the argv, so a value is taken from the workdir, the client's working
directory, and a ``~`` in it is a directory of that name (``--output-dir '~/legacy'`` writes
``<workdir>/~/legacy``); a path flag the argv does not give is the client's own default (its
profile's ``path_defaults``). A flag that decides where the data goes with neither leaves the files
unknown (``problem``), never guessed: a script no profile describes is read with the reference
client's flag names, and without its output dir flag only the run's ``output_dir`` key says where
it writes. Values of the config itself (``workdir``, ``log``, ``output_dir``) keep their ``~``:
the home directory of the host. ``--datasets`` in the argv wins over the run's ``datasets`` key.
What each flag means comes from the run's client profile (``supervisor.clients``): its flag names,
its budget flag, the flags it accepts, and its layout. A per-dataset client writes
``<out>/<dataset>/<data_file>``; a single-file client (SpecForge's ``--output-file-path``,
Model-Optimizer's ``--output_path``) writes ONE file, which is the run's one dataset, named after
the file (``out/regen.jsonl`` -> ``regen``), with its locks and fingerprints in ``.runwatch/``
beside it, its error and skipped files (``sidecars``) and its input file (``inputs``: what
completeness compares the records with).

A run whose data files cannot be determined has ``layout.problem`` set and no files; every action
on data calls ``layout.require_files()``, which raises naming how to declare them (``hint``).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from supervisor import clients
from supervisor.agent import argflags, match
from supervisor.agent.protocol import FINGERPRINT_NAME, LOCK_NAME, SIDECAR_DIR
from supervisor.config import ClientProfile, Config, RunConfig, bad_name
from supervisor.errors import ConfigError

PROMPT_DIR_FLAGS = ("--prompts-dir", "--prompt-dir", "--prompts")


@dataclass(frozen=True)
class ClientFlags:
    """What the flags of a generation script mean (the hook for a client profile)."""

    name: str
    prompt_dir_flags: tuple[str, ...] = PROMPT_DIR_FLAGS
    """Flags naming a directory of ``<dataset>.jsonl`` prompt files."""
    budget_flag: str | None = "--token-budget"
    """The flag that makes the client stop at a token budget (None: it has none)."""
    known_flags: frozenset[str] | None = None
    """Every flag the client's profile says it accepts; None: the profile does not list them
    (the script's argparse source, read statically, says)."""
    switches: frozenset[str] = frozenset()
    """Those of ``known_flags`` that take no value."""


REFERENCE_CLIENT = ClientFlags(name="run_inference")
"""The reference client (``supervisor/demo/run_inference.py``) and clients with its flags."""


@dataclass(frozen=True)
class RunLayout:
    """Where a run writes, as paths on its host (the config's ``~`` expanded for a local host;
    a ``~`` of the argv is a directory under the workdir)."""

    run: str
    argv: tuple[str, ...]
    """The argv this layout was derived from."""
    workdir: str
    out: str
    """The output directory."""
    log: str
    datasets: tuple[str, ...]
    data_files: dict[str, str] = field(default_factory=dict)
    """Dataset -> its data file."""
    locks: tuple[str, ...] = ()
    """One lock per dataset (``<out>/.runwatch/<dataset>.lock``)."""
    fingerprints: dict[str, str] = field(default_factory=dict)
    """Dataset -> its launch fingerprint file (``<out>/.runwatch/<dataset>.launch.json``)."""
    prompt_files: dict[str, str] = field(default_factory=dict)
    """Dataset -> its prompts file, relative to the workdir."""
    script_index: int | None = None
    """Index in argv of the script that is the client (None: not found)."""
    client: ClientFlags = REFERENCE_CLIENT
    problem: str | None = None
    """Why the data files cannot be determined (then ``data_files`` is empty)."""
    hint: str | None = None
    """How to declare them, when ``problem`` says why they cannot be determined."""
    profile: ClientProfile = clients.BUILTIN_CLIENTS["run_inference"]
    """The run's client profile."""
    profiled: bool = True
    """False when no profile describes the script (read with the reference client's names)."""
    sidecars: dict[str, dict[str, str]] = field(default_factory=dict)
    """Dataset -> kind (``error``, ``skipped``) -> file of failed or skipped prompts."""
    inputs: dict[str, dict[str, str]] = field(default_factory=dict)
    """Dataset -> ``{"path", "id"}``: the input whose rows the records answer (completeness)."""

    @property
    def paths(self) -> dict[str, str]:
        """``workdir``, ``out``, ``log``."""
        return {"workdir": self.workdir, "out": self.out, "log": self.log}

    def require_files(self) -> None:
        """Raise ConfigError when the data files cannot be determined (nothing to check)."""
        if self.problem is not None:
            raise ConfigError(
                f"{self.run}: cannot determine the run's data files: {self.problem}",
                self.hint
                or f"declare them: `datasets = [...]` in the [[runs]] entry of {self.run}, or "
                "--datasets in its argv; dataset names are directory names under the output dir",
            )

    def has_budget_flag(self) -> bool:
        """True when the argv gives the client's token-budget flag a value."""
        flag = self.client.budget_flag
        if flag is None:
            return False
        start = self.script_index if self.script_index is not None else 0
        read = match.parse_flags(list(self.argv), start, clients.wire(self.profile))
        return read.get("token_budget") is not None or argflags.value(self.argv, flag) is not None

    def overwrite_problem(self) -> str | None:
        """Why this argv would overwrite the client's existing output (None: it keeps it)."""
        return clients.overwrite_problem(self.profile, self.argv)


def _config_path(local: bool, workdir: str, path: str) -> str:
    """A path written in the config, as a path of its host: ``~`` is the home directory
    (expanded here for a local host, left for a remote host's agent), relative is from the
    workdir."""
    expanded = os.path.expanduser(path) if local else path
    if expanded.startswith("~"):
        return expanded
    return posixpath.normpath(posixpath.join(workdir, expanded))


def _missing(profile: ClientProfile, profiled: bool, role: str, script: str) -> tuple[str, str]:
    """``(problem, hint)`` of a run whose argv lacks the flag that says where its data goes."""
    flag = getattr(profile.flags, role)[0]
    if not profiled:
        return (
            f"no {flag} in its argv, and no client profile says where {script} writes without it",
            f"add {flag} to its argv, describe {script} in a [clients.NAME] profile with "
            f"path_defaults, or give the run an output_dir key",
        )
    return (
        f"no {flag} in its argv, and the {profile.name} profile has no default for it",
        f"add {flag} to its argv (restart --set {flag.lstrip('-')}=PATH), or give the profile "
        f'path_defaults = {{ "{flag}" = "..." }} in [clients.{profile.name}]',
    )


def client_flags(profile: ClientProfile, profiled: bool = True) -> ClientFlags:
    """What the gate needs of a profile: its name, prompt-dir and budget flags, and the flags it
    accepts (None when no profile describes the script: its argparse source, read statically,
    says)."""
    return ClientFlags(
        name=profile.name,
        prompt_dir_flags=tuple(profile.flags.prompts_dir) or PROMPT_DIR_FLAGS,
        budget_flag=profile.flags.budget[0] if profile.flags.budget else None,
        # argparse scripts all take --help.
        known_flags=(
            frozenset([*profile.known_flags, "--help"])
            if profiled and profile.known_flags
            else None
        ),
        switches=frozenset([*profile.switches, "--help"]),
    )


def layout_of(
    config: Config,
    run: RunConfig,
    argv: Sequence[str] | None = None,
    client: ClientFlags | None = None,
) -> RunLayout:
    """The layout of ``run`` launched with ``argv`` (default: the config's argv), as its client
    profile reads it (``client`` overrides the gate's view of the profile).

    Flags read from the argv (after the script) win; the run's config keys are the defaults. An
    abbreviation of one of the profile's flags (``--output-d`` for ``--output-dir``: argparse
    expands any unique prefix) makes the files unknown: the gate would check other files than
    the ones the client writes.
    """
    layout = _layout_of(config, run, argv, client)
    args = list(run.argv if argv is None else argv)
    short = abbreviation(args, clients.client_of(config, run, args), clients.all_scripts(config))
    if short is None or layout.problem is not None:
        return layout
    token, full = short
    return replace(
        layout,
        problem=f"{token} in the command line is an abbreviation of {full} (argparse accepts a "
        "prefix; runwatch reads flags by their full names)",
        hint=f"write {full} in full in the run's argv (or `--set`)",
    )


_WHERE_ROLES = ("datasets", "output_dir", "output_file", "input_file", "prompts_dir")
"""The flags that decide which files a run writes and reads."""


def abbreviation(
    args: Sequence[str], profile: ClientProfile, scripts: Sequence[str]
) -> tuple[str, str] | None:
    """The first option after the script that is not one of ``profile``'s flags but a strict
    prefix of one that says where the data is (``--output-d`` -> ``--output-dir``), with the
    flag(s) it abbreviates. (A prefix of another flag may be an option the script declares
    itself, which argparse matches exactly: ``--mode`` beside ``--model``.)"""
    spellings = {f for role in _WHERE_ROLES for f in getattr(profile.flags, role)}
    known = {f for role in clients.ROLES for f in getattr(profile.flags, role)}
    known |= set(profile.known_flags)
    idx = match.script_index(args, scripts)
    for arg in args[(idx if idx is not None else 0) + 1 :]:
        if arg == "--":
            break
        token = arg.split("=", 1)[0]
        if not token.startswith("--") or token in known:
            continue
        full = sorted(f for f in spellings if f.startswith(token) and f != token)
        if full:
            return token, " or ".join(full)
    return None


def _layout_of(
    config: Config,
    run: RunConfig,
    argv: Sequence[str] | None,
    client: ClientFlags | None,
) -> RunLayout:
    args = list(run.argv if argv is None else argv)
    local = config.host(run.host).local
    profile = clients.client_of(config, run, args)
    profiled = clients.is_profiled(config, run, args)
    client = client if client is not None else client_flags(profile, profiled)
    idx = match.script_index(args, clients.all_scripts(config))
    flags = match.parse_flags(args, idx if idx is not None else 0, clients.wire(profile))
    workdir = os.path.expanduser(run.workdir) if local else run.workdir
    if clients.single_file(profile):
        return _single_file(config, run, args, profile, profiled, client, idx, flags, workdir)
    problem: str | None = None
    hint: str | None = None
    out_flag = flags.get("output_dir")
    out_default = clients.default_of(profile, "output_dir") if profiled else None
    if isinstance(out_flag, str):
        out = match.client_path(workdir, out_flag)
    elif out_default is not None:
        out = match.client_path(workdir, out_default)
    elif not profiled and run.output_dir is not None:
        out = _config_path(local, workdir, run.output_dir)
    else:
        out = posixpath.normpath(workdir)
        script = posixpath.basename(args[idx]) if idx is not None else "the script"
        problem, hint = _missing(profile, profiled, "output_dir", script)
    side = posixpath.join(out, SIDECAR_DIR)
    log = _config_path(local, workdir, run.log) if run.log else posixpath.join(side, "run.log")
    argv_datasets = [str(d) for d in flags.get("datasets") or []]
    datasets = argv_datasets or list(run.datasets)
    source = "--datasets in the argv" if argv_datasets else "the run's datasets key"
    if not datasets:
        problem, hint = "no `datasets` key and no --datasets in its argv", None
    for ds in datasets:
        why = bad_name(ds)
        if why is not None:
            problem = f"dataset name {why} (from {source}): it would escape the output dir {out}"
            hint = None
    why = bad_name(run.data_file)
    if why is not None:
        problem, hint = f"data_file {why}: it would escape the dataset directory", None
    locks: tuple[str, ...] = (posixpath.join(side, LOCK_NAME),)
    fingerprints = {"*": posixpath.join(side, FINGERPRINT_NAME)}
    data_files: dict[str, str] = {}
    prompts: dict[str, str] = {}
    if problem is None:
        data_files = {
            ds: posixpath.normpath(posixpath.join(out, ds, run.data_file)) for ds in datasets
        }
        locks = tuple(posixpath.join(side, f"{ds}.lock") for ds in datasets)
        fingerprints = {ds: posixpath.join(side, f"{ds}.launch.json") for ds in datasets}
        pdir = None
        for f in client.prompt_dir_flags:
            pdir = argflags.value(args, f) or pdir
        if pdir is None and profiled:
            pdir = clients.default_of(profile, "prompts_dir")
        for ds in datasets:
            dc = config.datasets.get(ds)
            if dc is not None and dc.prompts:
                prompts[ds] = dc.prompts
            elif pdir:
                prompts[ds] = posixpath.join(match.argv_path(pdir), f"{ds}.jsonl")
    inputs = {
        ds: {"path": posixpath.normpath(posixpath.join(workdir, rel)), "id": profile.input_id}
        for ds, rel in prompts.items()
    }
    return RunLayout(
        run=run.name,
        argv=tuple(args),
        workdir=workdir,
        out=out,
        log=log,
        datasets=tuple(datasets),
        data_files=data_files,
        locks=locks,
        fingerprints=fingerprints,
        prompt_files=prompts,
        script_index=idx,
        client=client,
        problem=problem,
        hint=hint if problem is not None else None,
        profile=profile,
        profiled=profiled,
        inputs=inputs if profiled else {},
    )


def _single_file(
    config: Config,
    run: RunConfig,
    args: list[str],
    profile: ClientProfile,
    profiled: bool,
    client: ClientFlags,
    idx: int | None,
    flags: dict[str, object],
    workdir: str,
) -> RunLayout:
    """The layout of a client writing ONE output file: one dataset named after the file."""
    local = config.host(run.host).local
    out_flag = flags.get("output_file")
    input_flag = flags.get("input_file")
    if not isinstance(out_flag, str):
        out_flag = clients.default_of(profile, "output_file")
    if not isinstance(input_flag, str):
        input_flag = clients.default_of(profile, "input_file")
    problem = None
    hint = None
    path = ""
    ds = ""
    if out_flag is None:
        script = posixpath.basename(args[idx]) if idx is not None else "the script"
        problem, hint = _missing(profile, profiled, "output_file", script)
        problem += f" ({profile.name} writes one file)"
    elif not out_flag:
        problem = f"an empty {profile.flags.output_file[0]} in its argv (no file to write)"
    else:
        path = match.client_path(workdir, out_flag)
        ds = clients.stem(path)
        why = bad_name(ds)
        if why is not None:
            problem = f"output file name {why}"
    out = posixpath.dirname(path) if path else posixpath.normpath(workdir)
    side = posixpath.join(out, SIDECAR_DIR)
    log = _config_path(local, workdir, run.log) if run.log else posixpath.join(side, "run.log")
    if problem is not None:
        return RunLayout(
            run=run.name,
            argv=tuple(args),
            workdir=workdir,
            out=out,
            log=log,
            datasets=(),
            locks=(posixpath.join(side, LOCK_NAME),),
            fingerprints={"*": posixpath.join(side, FINGERPRINT_NAME)},
            script_index=idx,
            client=client,
            problem=problem,
            hint=hint,
            profile=profile,
            profiled=profiled,
        )
    prompts: dict[str, str] = {}
    dc = config.datasets.get(ds)
    if dc is not None and dc.prompts:
        prompts[ds] = dc.prompts
    elif input_flag:
        prompts[ds] = match.argv_path(input_flag)
    inputs = {
        d: {"path": posixpath.normpath(posixpath.join(workdir, rel)), "id": profile.input_id}
        for d, rel in prompts.items()
    }
    return RunLayout(
        run=run.name,
        argv=tuple(args),
        workdir=workdir,
        out=out,
        log=log,
        datasets=(ds,),
        data_files={ds: path},
        locks=(posixpath.join(side, f"{ds}.lock"),),
        fingerprints={ds: posixpath.join(side, f"{ds}.launch.json")},
        prompt_files=prompts,
        script_index=idx,
        client=client,
        problem=None,
        profile=profile,
        profiled=profiled,
        sidecars={ds: clients.sidecar_paths(profile, path)} if profile.sidecars else {},
        inputs=inputs,
    )
