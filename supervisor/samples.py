"""The latest samples of a dataset, decoded for a preview.

The host reads the last complete records of the data file (the agent's ``tail_records`` op,
bounded in bytes and read from the end); here they are described with the run's record format
(``supervisor.agent.formats``) and their token ids decoded with the configured tokenizer
(``supervisor.tokens``). Front ends only render the result.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from supervisor.agent import formats
from supervisor.agent.masking import mask_text
from supervisor.agentclient import AgentClient
from supervisor.errors import RunwatchError

if TYPE_CHECKING:
    from supervisor.config import Config
    from supervisor.hosts import Host
    from supervisor.model import RunView
    from supervisor.tokens import Tokenizer

TEXT_CHARS = 1200
"""A record's text is cut to this many characters."""
DECODE_IDS = 400
"""Token ids decoded per record (the preview's length)."""
MAX_BYTES = 4 << 20
"""Bytes read at most from the end of a data file."""


class SamplePreview(msgspec.Struct, kw_only=True):
    """One record, as a preview shows it."""

    id: str | None = None
    """The record's id (the format's id field), when it has one."""
    finish_reason: str | None = None
    tokens: int | None = None
    """Number of token ids of the record's output, when it carries them."""
    text: str | None = None
    """The output: the record's text or its decoded token ids (cut, secrets masked)."""
    note: str | None = None
    """Why there is no text (no tokenizer configured, nothing readable in the record)."""


class LatestSamples(msgspec.Struct, kw_only=True):
    """The latest records of one dataset file."""

    path: str
    exists: bool
    samples: list[SamplePreview] = []
    """Newest first."""
    bad_lines: int = 0
    """Lines among the last ones read that are not JSON objects."""
    complete: bool = True
    """False when fewer records than asked fit in the bytes read although the file holds more."""


class HostsEngine(Protocol):
    """What :func:`latest_samples` needs of ``supervisor.engine.Engine``."""

    @property
    def config(self) -> Config: ...

    def host(self, name: str) -> Host: ...


async def latest_samples(engine: HostsEngine, run: RunView, dataset: str, n: int) -> LatestSamples:
    """The last ``n`` complete records of ``dataset`` of ``run`` (newest first), described.

    Raises RunwatchError when the run has no such dataset, HostError/AgentError when the host
    cannot be asked. A tokenizer that cannot be loaded is a note on each sample, not an error.
    """
    ds = next((d for d in run.datasets if d.name == dataset), None)
    if ds is None:
        known = ", ".join(d.name for d in run.datasets) or "none"
        raise RunwatchError(f"run {run.name} has no dataset {dataset!r}", f"its datasets: {known}")
    config = engine.config
    profile = _profile(config, run)
    agent = AgentClient(engine.host(run.host))
    result = await agent.tail_records(path=ds.path, count=n, max_bytes=MAX_BYTES)
    records = [r for r in result.get("records", []) if isinstance(r, dict)]
    tok: Tokenizer | None = None
    problem = None
    if config.tokenizer and any(_ids_of(profile, r) is not None for r in records):
        from supervisor.tokens import load_tokenizer

        try:
            # Loading takes a second or two the first time: off the caller's event loop.
            tok = await asyncio.to_thread(
                load_tokenizer, config.tokenizer, config.trust_remote_code
            )
        except RunwatchError as e:
            problem = f"ids not decoded: {e.message}"
    elif not config.tokenizer:
        problem = "no tokenizer in the config: ids not decoded"
    return LatestSamples(
        path=str(result.get("path", ds.path)),
        exists=bool(result.get("exists", False)),
        samples=[describe(profile, r, tok, problem) for r in reversed(records)],
        bad_lines=int(result.get("bad_lines", 0)),
        complete=bool(result.get("complete", True)),
    )


def describe(
    profile: formats.Profile,
    record: Mapping[str, Any],
    tok: Tokenizer | None,
    no_tokenizer: str | None = None,
) -> SamplePreview:
    """The preview of one parsed record of format ``profile``.

    ``no_tokenizer`` is the note for a record that carries only token ids when ``tok`` is None.
    """
    found, sample_id = formats.lookup(record, profile.id_field)
    preview = SamplePreview(
        id=str(sample_id) if found and sample_id is not None else None,
        finish_reason=formats.finish_value(profile, record),
    )
    texts = formats.texts_of(profile, record)
    ids = _ids_of(profile, record)
    if ids is not None:
        preview.tokens = len(ids)
    if texts:
        preview.text = mask_text(texts[-1][:TEXT_CHARS])
    elif ids is not None and tok is not None:
        from supervisor.tokens import decode_preview

        preview.text = mask_text(decode_preview(tok, ids, limit=DECODE_IDS))
    elif ids is not None:
        preview.note = no_tokenizer or "no tokenizer: ids not decoded"
    else:
        preview.note = "no text or token ids in this record"
    return preview


def _ids_of(profile: formats.Profile, record: Mapping[str, Any]) -> list[int] | None:
    field = profile.tokens_list_field or profile.check_list_field
    if field is None:
        return None
    found, ids = formats.lookup(record, field)
    if not found or not isinstance(ids, list):
        return None
    return [i for i in ids if isinstance(i, int) and not isinstance(i, bool)]


def _profile(config: Config, run: RunView) -> formats.Profile:
    """The record format of ``run``: its config run's, else ``raw``."""
    fmt = "raw"
    if run.configured:
        with contextlib.suppress(RunwatchError):
            fmt = config.run(run.name).format
    user = config.formats.get(fmt)
    return formats.get_profile(fmt, msgspec.to_builtins(user) if user is not None else None)
