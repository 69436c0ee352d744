"""The launch fingerprint: what makes a run's data what it is, and how two compare.

It is stored at the last launch of each dataset (``.runwatch/<dataset>.launch.json`` in the
output dir: argv, model, sampling parameters, every flag but the client profile's volatile ones,
prompt-file hash, format, the sha256 of the script as read on the host) and compared with a new
launch; a change of model, of a flag or of the prompts blocks the launch unless allowed; a
changed script is listed among the allowed changes.

Each record says who wrote it (:func:`written_by`: the config's key and path, the run; the host
adds the process and its unit's launch id). Two configs may share an output dir: a record of
another config (:func:`other_config`) whose writer still runs refuses the start, naming that
config and how to stop its run there; once its writer is gone, the record only says how the data
in the dataset was made, and is compared like this config's own (never an owner that blocks).
A record without a config (an older runwatch's) is compared as before.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Sequence
from typing import Any

from supervisor.agent import argflags
from supervisor.agent.masking import mask_argv
from supervisor.argv import show_value
from supervisor.config import Config, RunConfig

SAMPLING_FLAGS = (
    "--temperature",
    "--top-p",
    "--top-k",
    "--min-p",
    "--max-tokens",
    "--max-new-tokens",
    "--presence-penalty",
    "--frequency-penalty",
    "--repetition-penalty",
    "--seed",
    "--reasoning-effort",
    "--chat-template",
    "--system-prompt",
)
"""Flags whose change alters what the run generates (fingerprinted)."""
MODEL_FLAGS = ("--model", "--model-name")


def model_of(
    argv: Sequence[str], endpoint_model: str | None, model_flags: Sequence[str] = ()
) -> str | None:
    """The model a command line generates with, as its fingerprint records it: the last given of
    its model flags (``--model-name`` over ``--model``, and the client profile's own spellings,
    ``model_flags``, over both), else its endpoint's model."""
    model = None
    for f in [*MODEL_FLAGS, *(f for f in model_flags if f not in MODEL_FLAGS)]:
        model = argflags.value(list(argv), f) or model
    return model if model is not None else endpoint_model


def run_model(run: RunConfig, argv: Sequence[str], config: Config) -> str | None:
    """The model ``run`` generates with on ``argv`` (its effective argv: the config's with its
    launch spec and overrides), read with its client profile's model flags: the one reader of a
    run's model, for the start's fingerprint and for rebalance alike."""
    from supervisor import clients  # here: clients imports the config this module reads

    profile = clients.client_of(config, run, argv)
    endpoint = config.endpoint(run.endpoint).model if run.endpoint else None
    return model_of(argv, endpoint, profile.flags.model)


def same_model(
    old: str | None, new: str | None, aliases: Sequence[Sequence[str]] = ()
) -> str | None:
    """Why ``old`` and ``new`` name one model ("" when written alike), None when they do not:
    model ids are compared case-insensitively (``moonshotai/Kimi-K2.5`` is
    ``moonshotai/kimi-k2.5``) and through the config's ``aliases`` groups. An unknown model
    (None) is one only with itself."""
    if old == new:
        return ""
    if old is None or new is None:
        return None
    if old.casefold() == new.casefold():
        return "model ids differ only in case"
    for group in aliases:
        names = {n.strip().casefold() for n in group}
        if old.casefold() in names and new.casefold() in names:
            return "aliases " + " = ".join(repr(n) for n in group)
    return None


def model_changed(old: str | None, new: str | None, aliases: Sequence[Sequence[str]] = ()) -> bool:
    """Data made with model ``old`` may not be continued with model ``new`` (unless the model
    change is allowed): the one rule of the start's fingerprint check and of rebalance
    (:func:`same_model`)."""
    return same_model(old, new, aliases) is None


def fingerprint_of(run: RunConfig, argv: Sequence[str], config: Config) -> dict[str, Any]:
    """What makes the run's data what it is (without the prompt hashes, which the host adds)."""
    model = run_model(run, argv, config)
    sampling = {}
    for f in SAMPLING_FLAGS:
        v = argflags.value(argv, f)
        if v is not None:
            sampling[f.lstrip("-")] = v
    from supervisor import clients  # here: clients imports the config this module reads

    profile = clients.client_of(config, run, argv)
    flags = clients.fingerprint_flags(profile, argv, clients.all_scripts(config))
    masked = mask_argv([a for k, v in flags.items() for a in (k, v)])
    return {
        "argv": mask_argv(list(argv)),
        "model": model,
        "sampling": sampling,
        "flags": {k: masked[2 * i + 1] for i, k in enumerate(flags) if k not in MODEL_FLAGS},
        "format": run.format,
        "run": run.name,
    }


def written_by(config: Config) -> dict[str, str]:
    """What a launch record says of the config that wrote it: its key and its path."""
    return {
        "config": config.key,
        "config_path": os.path.abspath(config.path) if config.path else "",
    }


def other_config(stored: dict[str, Any] | None, config: Config) -> str | None:
    """``config PATH's run RUN`` when ``stored`` was written by a config other than ``config``,
    else None (this config's, or a record of an older runwatch that names no config)."""
    if not stored or not isinstance(stored.get("config"), str) or stored["config"] == config.key:
        return None
    where = str(stored.get("config_path") or "") or f"key {stored['config']}"
    return f"config {where}'s run {stored.get('run')!r}"


def stop_command(stored: dict[str, Any]) -> str:
    """The command that stops the run that wrote ``stored``, through its own config."""
    path = str(stored.get("config_path") or "")
    prefix = f"runwatch -c {shlex.quote(path)}" if path else "runwatch -c ITS_CONFIG"
    return f"`{prefix} kill {shlex.quote(str(stored.get('run') or 'RUN'))}`"


def compare_fingerprints(
    stored: dict[str, Any] | None,
    new: dict[str, Any],
    hashes: dict[str, Any],
    allow: Iterable[str] = (),
    aliases: Sequence[Sequence[str]] = (),
) -> tuple[list[str], list[str]]:
    """(blocking changes, allowed changes) between the stored fingerprint and the new launch;
    a model written otherwise but the same (case, ``aliases``) is among the allowed, saying why.

    Keys: ``model``, ``format``, ``sampling`` (or one parameter: ``temperature``...), ``prompts``
    (or ``prompts:B1``). ``hashes`` are the prompt files' hashes now (``read_fingerprint``).
    """
    allowed = {a.strip().lstrip("-") for a in allow}
    changes: list[tuple[set[str], str]] = []
    same: list[str] = []
    if stored is None:
        return [], []
    one = same_model(stored.get("model"), new.get("model"), aliases)
    moved = f"model {stored.get('model')!r} -> {new.get('model')!r}"
    if one is None:
        changes.append(({"model"}, f"{moved} (not one model by case or the config's aliases)"))
    elif one:
        same.append(f"{moved}: the same model ({one})")
    if stored.get("format") is not None and stored.get("format") != new.get("format"):
        changes.append(({"format"}, f"format {stored.get('format')} -> {new.get('format')}"))
    old_s = stored.get("sampling") or {}
    new_s = new.get("sampling") or {}
    if isinstance(stored.get("flags"), dict) and isinstance(new.get("flags"), dict):
        # Every flag but the client profile's volatile ones (a fingerprint from before profiles
        # has only the sampling flags).
        old_s = {k.lstrip("-"): v for k, v in stored["flags"].items()}
        new_s = {k.lstrip("-"): v for k, v in new["flags"].items()}
    for k in sorted(set(old_s) | set(new_s)):
        if old_s.get(k) != new_s.get(k):
            text = f"{k} {show_value(old_s.get(k))} -> {show_value(new_s.get(k))}"
            changes.append(({"sampling", k}, text))
    old_script, new_script = stored.get("script_sha256"), new.get("script_sha256")
    if old_script and new_script and old_script != new_script:
        # A newer script is how a run gets a flag: never blocking, always said.
        same.append(f"script changed ({_short(old_script)} -> {_short(new_script)})")
    old_p = stored.get("prompts") or {}
    for ds in sorted(set(old_p) | set(hashes)):
        before = (old_p.get(ds) or {}).get("sha256")
        now = (hashes.get(ds) or {}).get("sha256")
        if ds in old_p and ds in hashes and before != now:
            changes.append(
                (
                    {"prompts", f"prompts:{ds}"},
                    f"prompts of {ds} changed ({_short(before)} -> {_short(now)})",
                )
            )
    blocking = [text for keys, text in changes if not keys & allowed]
    allowed_changes = same + [text for keys, text in changes if keys & allowed]
    return blocking, allowed_changes


def grouped_changes(changes: dict[str, list[str]]) -> str:
    """``{"model 'a' -> 'b'": ["B1", "B2"]}`` -> ``model 'a' -> 'b' (B1, B2)``."""
    return "; ".join(
        f"{text} ({', '.join(d for d in dss if d != '*')})" if dss != ["*"] else text
        for text, dss in changes.items()
    )


def _short(digest: Any) -> str:
    return str(digest)[:12] if digest else "missing"
