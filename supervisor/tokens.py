"""Counting tokens on the laptop with the run's own tokenizer (a local directory, never downloaded).

A directory whose ``tokenizer.json`` is all there is to it (no tokenizer class of its own, no
settings that change the tokenizer's pipeline, every special token already in the file) is loaded
with ``tokenizers`` alone (:func:`plain_fast`): what ``transformers``' ``PreTrainedTokenizerFast``
would make of it, without importing ``transformers`` (a second and more). Any other directory is
loaded by ``transformers``, imported only then, never when this module is imported. Loading is
offline (``local_files_only``, ``HF_HUB_OFFLINE=1``) and runs the tokenizer directory's own Python
code only when the config says ``trust_remote_code = true``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from supervisor.errors import ConfigError, RunwatchError
from supervisor.extras import require

Tokenizer = Any
"""A loaded Hugging Face tokenizer (``transformers`` is untyped, and imported lazily)."""

_cache: dict[tuple[str, bool], Tokenizer] = {}
_lock = threading.Lock()

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")

_SPECIAL_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_PIPELINE_KEYS = ("auto_map", "add_prefix_space", "from_slow", "legacy", "tokenizer_file")
"""tokenizer_config.json keys with which transformers builds another pipeline than the file's."""


class FastTokenizer:
    """A ``tokenizer.json`` loaded with ``tokenizers``: the two calls runwatch makes of a
    tokenizer (``backend_tokenizer.encode_batch``, ``decode``)."""

    def __init__(self, backend: Any) -> None:
        self.backend_tokenizer = backend

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(
            self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        )


def plain_fast(directory: Path) -> bool:
    """Whether ``transformers`` would load ``directory`` as its ``tokenizer.json`` alone: the
    file is there; ``tokenizer_config.json`` (if any) names no class but
    ``PreTrainedTokenizerFast``, has none of :data:`_PIPELINE_KEYS`, no space clean-up on decode,
    and every special token it or ``special_tokens_map.json`` names is an added token of the
    file; no ``added_tokens.json``."""
    if not (directory / "tokenizer.json").is_file() or (directory / "added_tokens.json").exists():
        return False
    try:
        config = _json_object(directory / "tokenizer_config.json")
        special = _json_object(directory / "special_tokens_map.json")
        with (directory / "tokenizer.json").open("rb") as f:
            added = json.load(f).get("added_tokens") or []
    except (OSError, ValueError, AttributeError):
        return False
    if config.get("tokenizer_class", "PreTrainedTokenizerFast") != "PreTrainedTokenizerFast":
        return False
    if any(k in config for k in _PIPELINE_KEYS) or config.get("clean_up_tokenization_spaces"):
        return False
    known = {t.get("content") for t in added if isinstance(t, dict)}
    named: list[Any] = []
    for source in (config, special):
        named += [source.get(k) for k in _SPECIAL_KEYS]
        named += list(source.get("additional_special_tokens") or [])
        named += [t.get("content") for t in (source.get("added_tokens_decoder") or {}).values()]
    return all(
        (t.get("content") if isinstance(t, dict) else t) in known for t in named if t is not None
    )


def _json_object(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"{path.name} is not a JSON object")
    return value


def load_tokenizer(path: str | os.PathLike[str], trust_remote_code: bool = False) -> Tokenizer:
    """Load the tokenizer in local directory ``path`` (``~`` expanded), once per process.

    Raises ConfigError when the directory is missing or holds no tokenizer, RunwatchError when it
    cannot be loaded (for example it needs its own code and ``trust_remote_code`` is off).
    """
    directory = Path(path).expanduser()
    shown = str(path)
    if not directory.exists():
        raise ConfigError(
            f"tokenizer directory {shown} does not exist",
            "set `tokenizer` in the config to a local directory holding the model's tokenizer "
            "files (tokenizer.json, tokenizer_config.json); runwatch never downloads one",
        )
    if not directory.is_dir():
        raise ConfigError(f"tokenizer {shown} is not a directory", "point it at the directory")
    if not any((directory / name).exists() for name in _TOKENIZER_FILES):
        raise ConfigError(
            f"tokenizer directory {shown} holds no tokenizer files",
            f"expected one of {', '.join(_TOKENIZER_FILES)}",
        )
    key = (str(directory.resolve()), trust_remote_code)
    with _lock:
        cached = _cache.get(key)
        if cached is not None:
            return cached
        tok = _load(directory, shown, trust_remote_code)
        _cache[key] = tok
        return tok


def _load(directory: Path, shown: str, trust_remote_code: bool) -> Tokenizer:
    # Never reach the network, and keep transformers' "no PyTorch" advice off the terminal.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    # runwatch starts subprocesses (host agents, ssh) after counting; a tokenizer that used its
    # thread pool before a fork prints a warning on every fork. Counting batches are small anyway.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if plain_fast(directory):
        Tokenizer = require("tokenizers", f"counting tokens with tokenizer {shown}", "tokens")
        try:
            return FastTokenizer(Tokenizer.Tokenizer.from_file(str(directory / "tokenizer.json")))
        except Exception as e:
            raise _unloadable(shown, e, trust_remote_code) from None
    AutoTokenizer = require(
        "transformers", f"counting tokens with tokenizer {shown}", "tokens"
    ).AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(
            str(directory), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as e:
        raise _unloadable(shown, e, trust_remote_code) from None


def _unloadable(shown: str, e: Exception, trust_remote_code: bool) -> RunwatchError:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    hint = "check that the directory holds a complete Hugging Face tokenizer"
    if not trust_remote_code and "trust_remote_code" in str(e):
        hint = (
            "this tokenizer ships its own Python code; set `trust_remote_code = true` in the "
            "config only if you trust the directory"
        )
    return RunwatchError(f"cannot load tokenizer {shown}: {text}", hint)


def count_tokens(tok: Tokenizer, texts: Sequence[str]) -> list[int]:
    """Token counts of ``texts`` (no special tokens added), in one batch."""
    if not texts:
        return []
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        # The Rust tokenizer encodes the batch in parallel and skips the max-length check.
        encodings = backend.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encodings]
    ids = tok(list(texts), add_special_tokens=False)["input_ids"]
    return [len(x) for x in ids]


def decode_preview(tok: Tokenizer, ids: Sequence[int], limit: int = 200) -> str:
    """The text of the first ``limit`` ids (``…`` appended when there are more), for previews."""
    head = [int(i) for i in ids[:limit]]
    text = str(tok.decode(head, skip_special_tokens=False))
    return text + "…" if len(ids) > limit else text
