"""How long a dataset's prompts are: the characters of the first rows of its input file.

Standard library only, Python >= 3.8 (runs inside the host agent). The scanner reports it
beside a data file's ``completeness`` (``prompt_lengths`` of a scan result), so that a dataset
not started yet can be projected from its own prompts rather than from another's answers. The
read is bounded (:data:`MAX_BYTES` from the start of the file) and cached while the file is
unchanged.
"""

from __future__ import annotations

import json
import os
from typing import Any

from supervisor.agent import safefs

MAX_BYTES = 1 << 20
"""Bytes of an input file read at most (its first rows stand for all of them)."""


def text_chars(value: Any) -> int:
    """Characters of the text in a parsed row: its strings, in dicts and lists, summed."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(text_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(text_chars(v) for v in value)
    return 0


class PromptLengths:
    """The prompt lengths of input files, read again only when a file changes."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    def of(self, path: str, id_key: str) -> dict[str, Any]:
        """``{"path", "rows", "mean_chars", "whole"}`` of the JSON-lines input ``path`` (the id
        ``id_key`` of a row not counted as its text; ``whole``: every row was read), or
        ``{"path", "error"}``."""
        try:
            st = safefs.stat_file(path)
        except safefs.UnsafePath as e:
            return {"path": path, "error": str(e)}
        except OSError as e:
            return {"path": path, "error": f"{path}: {e.strerror or e}"}
        sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, id_key)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == sig:
            return cached[1]
        try:
            with os.fdopen(safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
                data = f.read(MAX_BYTES + 1)
        except safefs.UnsafePath as e:
            return {"path": path, "error": str(e)}
        except OSError as e:
            return {"path": path, "error": f"{path}: {e.strerror or e}"}
        whole = len(data) <= MAX_BYTES
        if not whole:  # the last line read may be cut: only complete lines count
            data = data[: data.rfind(b"\n", 0, MAX_BYTES) + 1]
        result = _lengths(path, data, id_key)
        if "error" not in result:
            result["whole"] = whole
        self._cache[path] = (sig, result)
        return result


def _lengths(path: str, data: bytes, id_key: str) -> dict[str, Any]:
    rows = 0
    chars = 0
    for n, line in enumerate(data.splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            return {"path": path, "error": f"line {n + 1} is not JSON"}
        if isinstance(row, dict) and id_key:
            row = {k: v for k, v in row.items() if k != id_key}
        rows += 1
        chars += text_chars(row)
    if not rows:
        return {"path": path, "error": "no rows in its first bytes"}
    return {"path": path, "rows": rows, "mean_chars": chars / rows}
