"""A run's launch spec: the overrides its last restart or launch was given, kept until changed.

``runwatch restart RUN --set token-budget=10000000`` makes ``--token-budget 10000000`` part of the
run's launch spec, so a later ``runwatch launch RUN`` (or the budget guard's restart) keeps it;
``--unset FLAG`` removes a flag of the config's argv the same way; ``--reset`` forgets the spec.
The spec also keeps the argv of the last confirmed launch (masked), to show every launch's
difference against it.

Stored per run in ``$XDG_STATE_HOME/runwatch/launch-spec/<run>.json``, mode 0600 (its values are
command-line arguments and may be sensitive), written atomically.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec

from supervisor.agent.masking import is_secret_flag
from supervisor.argv import apply_overrides, remove_flags
from supervisor.config import RunConfig
from supervisor.errors import ConfigError
from supervisor.paths import state_dir
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
    time: float = 0.0

    @property
    def empty(self) -> bool:
        return not self.sets and not self.unsets

    def argv(self, base: Sequence[str]) -> list[str]:
        """``base`` (the config's argv) with this spec applied: unsets, then sets."""
        return apply_overrides(remove_flags(base, self.unsets), self.sets)

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
            time=self.time,
        )

    def flags(self) -> list[str]:
        """Every flag this spec sets or removes."""
        return [f for f, _ in self.sets] + list(self.unsets)


_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def spec_path(run: str) -> Path:
    """``state_dir()/launch-spec/<run>.json`` (other characters of the name as ``_``)."""
    name = _SAFE.sub("_", run) or "_"
    return state_dir() / SPEC_DIR / f"{name}.json"


def load(run: str) -> LaunchSpec:
    """The stored spec of ``run`` (empty when there is none). A damaged file is an error."""
    path = spec_path(run)
    try:
        raw = path.read_bytes()
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


def save(spec: LaunchSpec) -> Path:
    """Write ``spec`` atomically, mode 0600 (the directory 0700), without its secret sets
    (:func:`secret_sets`) and with its last argv masked."""
    path = spec_path(spec.run)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    spec.time = time.time()
    secret = set(secret_sets(spec))
    spec = msgspec.structs.replace(
        spec,
        sets=[(f, v) for f, v in spec.sets if f not in secret],
        last_argv=mask_argv(spec.last_argv) if spec.last_argv is not None else None,
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(msgspec.json.encode(spec) + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def launch_argv(run: RunConfig) -> list[str]:
    """The argv a launch of ``run`` uses now: its config argv with its stored spec applied."""
    try:
        spec = load(run.name)
    except ConfigError:
        return list(run.argv)
    return spec.argv(run.argv)
