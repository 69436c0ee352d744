"""Reads the detail screen needs beyond the snapshot: a run's log tail and its latest samples.

Both go through the engine's host connection (the agent's ``tail_log`` op); nothing is read here
directly, so the same code serves local and SSH hosts.
"""

from __future__ import annotations

from typing import Any

from supervisor.config import Config
from supervisor.errors import RunwatchError, UsageError
from tui.engine import EngineLike


def _host(engine: EngineLike, host: str) -> Any:
    getter = getattr(engine, "host", None)
    if getter is None:
        raise UsageError(
            "this engine gives no access to hosts", "log and samples need the real engine"
        )
    return getter(host)


async def read_log_tail(
    engine: EngineLike, config: Config, host: str, run: str, lines: int
) -> list[str]:
    """The last ``lines`` lines of the run's log (secrets masked by the agent)."""
    try:
        rc = config.run(run)
    except RunwatchError:
        return ["(this process is not a configured run: its log is unknown)"]
    if rc.log is None:
        return [f"(run {run} has no log = ... in the config)"]
    result = await _host(engine, host).request(
        "tail_log", {"path": rc.log, "workdir": rc.workdir, "lines": lines}
    )
    if not result.get("exists", False):
        return [f"(no log yet at {result.get('path', rc.log)})"]
    return [str(line) for line in result.get("lines", [])]


async def read_samples(
    engine: EngineLike, config: Config, host: str, run: str, path: str, count: int
) -> list[str]:
    """The latest ``count`` records of the data file ``path`` (on ``host``), newest first, their
    tokens decoded with the run's tokenizer."""
    import asyncio
    import contextlib
    import json

    from supervisor import formats

    fmt = "raw"
    with contextlib.suppress(RunwatchError):
        fmt = config.run(run).format
    user = config.formats.get(fmt)
    profile = formats.get_profile(fmt, _builtins(user) if user is not None else None)
    result = await _host(engine, host).request(
        "tail_log", {"path": path, "lines": count, "max_bytes": 4 << 20}
    )
    if not result.get("exists", False):
        return [f"(no data file yet at {path})"]
    tok = None
    if config.tokenizer:
        from supervisor.tokens import load_tokenizer

        # Loading a tokenizer takes a second or two: never on the UI's event loop.
        tok = await asyncio.to_thread(load_tokenizer, config.tokenizer, config.trust_remote_code)
    samples: list[str] = []
    for line in result.get("lines", [])[-count:]:
        try:
            record = json.loads(line)
        except ValueError:
            samples.append("(an unreadable line)")
            continue
        if not isinstance(record, dict):
            samples.append("(not a JSON object)")
            continue
        samples.append(_describe(profile, record, tok))
    return list(reversed(samples))


def _builtins(user: Any) -> dict[str, Any]:
    import msgspec

    return dict(msgspec.to_builtins(user))


def _describe(profile: Any, record: dict[str, Any], tok: Any) -> str:
    from supervisor import formats

    _ok, sample_id = formats.lookup(record, profile.id_field)
    finish = formats.finish_value(profile, record)
    head = f"{sample_id}  finish={finish or '?'}"
    texts = formats.texts_of(profile, record)
    if texts:
        return f"{head}\n{texts[-1][:1200]}"
    ids_field = profile.tokens_list_field or profile.check_list_field
    if ids_field is not None:
        found, ids = formats.lookup(record, ids_field)
        if found and isinstance(ids, list):
            if tok is None:
                return f"{head}  {len(ids)} tokens\n(no tokenizer in the config: ids not decoded)"
            from supervisor.tokens import decode_preview

            return f"{head}  {len(ids)} tokens\n{decode_preview(tok, ids, limit=400)}"
    return f"{head}\n(no text or token ids in this record)"
