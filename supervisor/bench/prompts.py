"""The prompts a bench sends: a JSONL file, a dataset of the config, or the endpoint's datasets."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from supervisor.bench.target import Target
from supervisor.config import Config, RunConfig
from supervisor.errors import EndpointError, UsageError


class Prompt(msgspec.Struct, kw_only=True, frozen=True):
    """One prompt: chat messages, and their text for counting tokens when usage is missing."""

    messages: list[dict[str, Any]]
    text: str


class _PromptLine(msgspec.Struct):
    prompt: Any = None
    messages: Any = None


_prompt_line = msgspec.json.Decoder(_PromptLine)


def _prompt_from(line: bytes) -> Prompt | None:
    try:
        rec = _prompt_line.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if isinstance(rec.messages, list) and rec.messages:
        messages: list[dict[str, Any]] = []
        texts: list[str] = []
        for m in rec.messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                return None
            content = m.get("content")
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts.extend(
                    p["text"]
                    for p in content
                    if isinstance(p, dict) and isinstance(p.get("text"), str)
                )
            messages.append({"role": m["role"], "content": content})
        return Prompt(messages=messages, text="\n".join(texts))
    if isinstance(rec.prompt, str) and rec.prompt:
        return Prompt(messages=[{"role": "user", "content": rec.prompt}], text=rec.prompt)
    return None


def load_prompts(path: str | os.PathLike[str], limit: int | None = None) -> list[Prompt]:
    """Prompts of a JSONL file whose lines have ``messages`` (chat) or ``prompt`` (text).

    Reads at most ``limit`` usable prompts. Lines that are neither are skipped; a file with none
    is an error.
    """
    p = Path(path).expanduser()
    out: list[Prompt] = []
    try:
        with p.open("rb") as f:
            for line in f:
                if not line.strip():
                    continue
                prompt = _prompt_from(line)
                if prompt is not None:
                    out.append(prompt)
                    if limit is not None and len(out) >= limit:
                        break
    except FileNotFoundError:
        raise EndpointError(f"prompts file {path} does not exist") from None
    except OSError as e:
        raise EndpointError(f"cannot read prompts file {path}: {e.strerror}") from None
    if not out:
        raise EndpointError(
            f"prompts file {path} holds no prompts",
            'expected JSON lines with a "messages" list or a "prompt" string',
        )
    return out


def _dataset_prompt_path(config: Config, dataset: str) -> Path | None:
    ds = config.datasets.get(dataset)
    if ds is None or not ds.prompts:
        return None
    prompts = Path(ds.prompts).expanduser()
    if prompts.is_absolute():
        return prompts
    runs: list[RunConfig] = [r for r in config.runs if dataset in config.run_datasets(r)]
    local = [r for r in runs if config.host(r.host).local]
    if not local:
        where = ", ".join(sorted({r.host for r in runs})) or "no run's host"
        raise EndpointError(
            f"the prompts of dataset {dataset} are on {where}, not on this machine",
            "copy the file here and pass --prompts FILE",
        )
    return Path(local[0].workdir).expanduser() / prompts


def prompts_for(
    config: Config | None, spec: str | None, target: Target, wanted: int
) -> tuple[list[Prompt], str]:
    """The prompts to send and where they came from.

    ``spec`` is a dataset name of the config or a file. Without it: the datasets of the runs that
    use this endpoint (else every dataset with prompts), interleaved.
    """
    if spec is not None:
        if config is not None and spec in config.datasets:
            path = _dataset_prompt_path(config, spec)
            if path is None:
                raise UsageError(f"dataset {spec} has no prompts file in the config")
            return load_prompts(path, wanted), f"{spec} ({path})"
        if not Path(spec).expanduser().exists():
            known = ", ".join(config.datasets) if config is not None else ""
            raise UsageError(
                f"--prompts {spec}: no such file"
                + (f", and not a dataset of the config ({known})" if known else ""),
                "pass a dataset name or a JSONL file with prompt or messages",
            )
        return load_prompts(spec, wanted), spec
    if config is None:
        raise UsageError(
            "no prompts to send", "pass --prompts FILE (JSONL with prompt or messages)"
        )
    names = [
        d for r in config.runs if r.endpoint == target.name for d in config.run_datasets(r)
    ] or list(config.datasets)
    names = [n for n in dict.fromkeys(names) if n in config.datasets and config.datasets[n].prompts]
    if not names:
        raise UsageError(
            "no dataset in the config has a prompts file",
            "set [datasets.NAME].prompts or pass --prompts FILE",
        )
    per = max(1, math.ceil(wanted / len(names)))
    lists: list[list[Prompt]] = []
    for n in names:
        path = _dataset_prompt_path(config, n)
        if path is not None:
            lists.append(load_prompts(path, per))
    mixed = [p for group in _interleave(lists) for p in group]
    return mixed[:wanted], ",".join(names)


def _interleave(lists: list[list[Prompt]]) -> Iterable[list[Prompt]]:
    for i in range(max((len(x) for x in lists), default=0)):
        yield [x[i] for x in lists if i < len(x)]
