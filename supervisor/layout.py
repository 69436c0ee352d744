"""The data layout of a run, derived from the command line it runs or will run.

One function, ``layout_of(config, run, argv)``, says where a run writes: its datasets, output
directory, data files, lock files, launch fingerprint files, prompt files and log. Every check that
protects data (the format check, the locks, the fingerprints, the writers) uses it, on the
*effective* argv of the launch it guards (the config's argv with the overrides applied), so a
restart with ``--set datasets=B2`` or ``--set output-dir=other`` checks the files it will write.

The argv rules; config values are the defaults: ``--datasets`` in the argv wins over the run's
``datasets`` key, ``--output-dir`` over ``output_dir``. What each flag means comes from a
``ClientFlags`` description; ``REFERENCE_CLIENT`` describes the reference client (and the flag
spellings ``match.parse_flags`` reads). A client profile plugs in by passing its own
``ClientFlags`` (its flag names, its budget flag, the flags it accepts).

A run whose data files cannot be determined has ``layout.problem`` set and no files; every action
on data calls ``layout.require_files()``, which raises naming how to declare them.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field

from supervisor.agent import match
from supervisor.agent.protocol import FINGERPRINT_NAME, LOCK_NAME, SIDECAR_DIR
from supervisor.config import Config, RunConfig, bad_name, flag_value
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
    """Every flag the client accepts, when known; None: ask the script (``--help``)."""


REFERENCE_CLIENT = ClientFlags(name="run_inference")
"""The reference client (``supervisor/demo/run_inference.py``) and clients with its flags."""


@dataclass(frozen=True)
class RunLayout:
    """Where a run writes, as paths on its host (``~`` expanded for a local host)."""

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

    @property
    def paths(self) -> dict[str, str]:
        """``workdir``, ``out``, ``log``."""
        return {"workdir": self.workdir, "out": self.out, "log": self.log}

    def require_files(self) -> None:
        """Raise ConfigError when the data files cannot be determined (nothing to check)."""
        if self.problem is not None:
            raise ConfigError(
                f"{self.run}: cannot determine the run's data files: {self.problem}",
                f"declare them: `datasets = [...]` in the [[runs]] entry of {self.run}, or "
                "--datasets in its argv; dataset names are directory names under the output dir",
            )

    def has_budget_flag(self) -> bool:
        """True when the argv gives the client's token-budget flag a value."""
        flag = self.client.budget_flag
        if flag is None:
            return False
        start = self.script_index if self.script_index is not None else 0
        spelled = match.parse_flags(list(self.argv), start).get("token_budget") is not None
        return spelled or flag_value(list(self.argv), flag) is not None


def _host_path(local: bool, path: str) -> str:
    return os.path.expanduser(path) if local else path


def layout_of(
    config: Config,
    run: RunConfig,
    argv: Sequence[str] | None = None,
    client: ClientFlags = REFERENCE_CLIENT,
) -> RunLayout:
    """The layout of ``run`` launched with ``argv`` (default: the config's argv).

    Flags read from the argv (after the script) win; the run's config keys are the defaults.
    """
    args = list(run.argv if argv is None else argv)
    local = config.host(run.host).local
    idx = match.script_index(args, config.scripts)
    flags = match.parse_flags(args, idx if idx is not None else 0)
    workdir = _host_path(local, run.workdir)
    out_flag = flags.get("output_dir")
    out_rel = out_flag if isinstance(out_flag, str) and out_flag else run.output_dir
    out = posixpath.normpath(posixpath.join(workdir, _host_path(local, out_rel)))
    side = posixpath.join(out, SIDECAR_DIR)
    log = (
        posixpath.normpath(posixpath.join(workdir, _host_path(local, run.log)))
        if run.log
        else posixpath.join(side, "run.log")
    )
    argv_datasets = [str(d) for d in flags.get("datasets") or []]
    datasets = argv_datasets or list(run.datasets)
    source = "--datasets in the argv" if argv_datasets else "the run's datasets key"
    problem = None
    if not datasets:
        problem = "no `datasets` key and no --datasets in its argv"
    for ds in datasets:
        why = bad_name(ds)
        if why is not None:
            problem = f"dataset name {why} (from {source}): it would escape the output dir {out}"
    why = bad_name(run.data_file)
    if why is not None:
        problem = f"data_file {why}: it would escape the dataset directory"
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
            pdir = flag_value(args, f) or pdir
        for ds in datasets:
            dc = config.datasets.get(ds)
            if dc is not None and dc.prompts:
                prompts[ds] = dc.prompts
            elif pdir:
                prompts[ds] = posixpath.join(pdir, f"{ds}.jsonl")
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
    )
