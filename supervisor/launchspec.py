"""A run's launch spec: the overrides its last restart or launch was given, kept until changed.

``runwatch restart RUN --set token-budget=10000000`` makes ``--token-budget 10000000`` part of the
run's launch spec, so a later ``runwatch launch RUN`` (or the budget guard's restart) keeps it;
``--unset FLAG`` removes a flag of the config's argv the same way; ``--reset`` forgets the spec.
The spec also keeps the argv of the last confirmed launch (masked), to show every launch's
difference against it.

Stored per config and run in
``$XDG_STATE_HOME/runwatch/configs/<config key>/launch-spec/<run>.json`` (``Config.key``: two
configs with a run of one name share nothing), mode 0600 in 0700 directories (its values are
command-line arguments and may be sensitive), written atomically, never through a link, and
refused when another user owns it (``paths.read_private``).

Migration: an older runwatch kept one spec per run name in ``launch-spec/<run>.json``, shared by
every config with a run of that name. Which config it belongs to cannot be known, so it is never
applied (applying it to the wrong config is the fault this layout removes); it is left in place,
and a plan of a run that has one says so (:func:`legacy_note`) with the file to read and the
flags it changes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

import msgspec

from supervisor.agent.masking import is_secret_flag
from supervisor.argv import apply_overrides, remove_flags
from supervisor.config import Config, RunConfig
from supervisor.errors import ConfigError, RunwatchError
from supervisor.paths import config_state, read_private, state_dir, write_private
from supervisor.secrets import mask_argv, mask_registered, mask_text

SPEC_DIR = "launch-spec"


class Invocation(msgspec.Struct, kw_only=True):
    """A process runwatch launched, and what its data files held when it started: a client whose
    sample flag counts after the rows its resume skips (SpecForge's ``--num-samples``) stops at
    those records plus its flag."""

    pid: int
    start_time: int
    """In clock ticks since boot, as ``model.Identity``."""
    records: dict[str, int] = {}
    """Data file -> its records (distinct ids) at the launch."""


class LaunchSpec(msgspec.Struct, kw_only=True):
    """The overrides of one run, in the order they apply."""

    run: str
    sets: list[tuple[str, str | None]] = []
    """``(flag, value)`` set on top of the config's argv; value None: a flag without value."""
    unsets: list[str] = []
    """Flags removed from the config's argv."""
    last_argv: list[str] | None = None
    """The argv of the last confirmed launch (masked), or None."""
    started: Invocation | None = None
    """The process of the last confirmed launch and the records its data files held then."""
    script_sha256: str | None = None
    """sha256 of the script of the last confirmed launch, as read on the host (None: not read)."""
    time: float = 0.0

    @property
    def empty(self) -> bool:
        return not self.sets and not self.unsets

    def argv(self, base: Sequence[str], switches: Collection[str] = ()) -> list[str]:
        """``base`` (the config's argv) with this spec applied: unsets, then sets, each
        replacing a flag's whole value (``switches``: the client's flags that take none)."""
        return apply_overrides(remove_flags(base, self.unsets, switches), self.sets, switches)

    def merged(self, sets: Iterable[tuple[str, str | None]], unsets: Iterable[str]) -> LaunchSpec:
        """This spec with more overrides: a new set of a flag replaces its set or unset, a new
        unset replaces its set."""
        new_sets = list(sets)
        new_unsets = list(unsets)
        touched = {f for f, _ in new_sets} | set(new_unsets)
        kept_sets = [(f, v) for f, v in self.sets if f not in touched]
        kept_unsets = [f for f in self.unsets if f not in touched]
        return LaunchSpec(
            run=self.run,
            sets=kept_sets + new_sets,
            unsets=kept_unsets + [f for f in new_unsets if f not in kept_unsets],
            last_argv=self.last_argv,
            started=self.started,
            script_sha256=self.script_sha256,
            time=self.time,
        )

    def flags(self) -> list[str]:
        """Every flag this spec sets or removes."""
        return [f for f, _ in self.sets] + list(self.unsets)


_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def spec_path(key: str, run: str) -> Path:
    """``configs/<config key>/launch-spec/<run>.json`` (other characters of the name as ``_``)."""
    name = _SAFE.sub("_", run) or "_"
    return config_state(key) / SPEC_DIR / f"{name}.json"


def legacy_path(run: str) -> Path:
    """Where an older runwatch kept the spec of every run named ``run``, whatever its config."""
    return state_dir() / SPEC_DIR / f"{_SAFE.sub('_', run) or '_'}.json"


def legacy_note(run: str) -> str | None:
    """A note for a plan of ``run`` when an older runwatch left a spec of that run name (never
    applied: see the module docstring), or None."""
    path = legacy_path(run)
    try:
        spec = msgspec.json.decode(read_private(path), type=LaunchSpec)
    except (OSError, RunwatchError, msgspec.DecodeError):
        return None
    if spec.empty:
        return None
    flags = ", ".join(spec.flags())
    return (
        f"not applied: {path}, kept by an older runwatch for every config with a run named "
        f"{run!r} (it changes {flags}); if it is this config's, read it and pass its flags once "
        "with --set/--unset, then remove the file"
    )


def load(key: str, run: str) -> LaunchSpec:
    """The stored spec of ``run`` of the config ``key`` (empty when there is none). A damaged
    file is an error, and so is one that is a link or another user's."""
    path = spec_path(key, run)
    try:
        raw = read_private(path)
    except FileNotFoundError:
        return LaunchSpec(run=run)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the launch spec of {run}: {e.strerror}") from None
    try:
        spec = msgspec.json.decode(raw, type=LaunchSpec)
    except msgspec.DecodeError as e:
        raise ConfigError(
            f"{path}: the launch spec of {run} is damaged: {e}",
            "look at it, then pass --reset to start again from the config's argv",
        ) from None
    return spec


def secret_sets(spec: LaunchSpec) -> list[str]:
    """Flags of ``spec`` set to a secret value (a secret flag, a misspelling of one, or a value
    that holds a known secret): never written to the spec file, so they last one launch."""
    return [
        f
        for f, v in spec.sets
        if v is not None and (is_secret_flag(f) or mask_registered(v) != v or mask_text(v) != v)
    ]


def save(key: str, spec: LaunchSpec) -> Path:
    """Write ``spec`` of the config ``key`` atomically, mode 0600 (its directories 0700),
    without its secret sets (:func:`secret_sets`) and with its last argv masked."""
    path = spec_path(key, spec.run)
    spec.time = time.time()
    secret = set(secret_sets(spec))
    spec = msgspec.structs.replace(
        spec,
        sets=[(f, v) for f, v in spec.sets if f not in secret],
        last_argv=mask_argv(spec.last_argv) if spec.last_argv is not None else None,
    )
    write_private(path, msgspec.json.encode(spec) + b"\n")
    return path


def launch_argv(config: Config, run: RunConfig) -> list[str]:
    """The argv a launch of ``run`` uses now: its config argv with its stored spec applied."""
    try:
        spec = load(config.key, run.name)
    except RunwatchError:
        return list(run.argv)
    return spec.argv(run.argv, switches_of(config, run))


def switches_of(config: Config, run: RunConfig) -> list[str]:
    """The flags of ``run``'s client that take no value (its profile's ``switches``): an
    override never takes what follows one of them for its value."""
    from supervisor import clients  # here: clients imports the config this module reads

    return list(clients.client_of(config, run).switches)
