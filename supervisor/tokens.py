"""Counting tokens on the laptop with the run's own tokenizer (a local directory, never downloaded).

``transformers`` is heavy, so it is imported only inside :func:`load_tokenizer`, never when this
module is imported. Loading is offline (``local_files_only``, ``HF_HUB_OFFLINE=1``) and runs the
tokenizer directory's own Python code only when the config says ``trust_remote_code = true``.
"""

from __future__ import annotations

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
    AutoTokenizer = require(
        "transformers", f"counting tokens with tokenizer {shown}", "tokens"
    ).AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(
            str(directory), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = "check that the directory holds a complete Hugging Face tokenizer"
        if not trust_remote_code and "trust_remote_code" in str(e):
            hint = (
                "this tokenizer ships its own Python code; set `trust_remote_code = true` in the "
                "config only if you trust the directory"
            )
        raise RunwatchError(f"cannot load tokenizer {shown}: {text}", hint) from None


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
