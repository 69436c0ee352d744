"""Completeness of a client's output: its input's ids against its records' ids, and the files
beside it that hold failed or skipped prompts, counted by reason.

Standard library only, Python >= 3.8 (runs inside the host agent). The scanner asks a
:class:`Companions` for the ``sidecars`` and ``completeness`` parts of a scan result: a sidecar
file is read incrementally like a data file (only appended complete lines; a new inode or a
shorter file starts it over); an input file's ids are read again only when the file changes.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections import Counter
from typing import Any

from supervisor.agent import safefs
from supervisor.agent.idset import IdSet, remembered_id

MAX_REASONS = 10
"""Distinct reasons listed per sidecar file (the rest are summed in ``other_reasons``)."""
MAX_IDS_SHOWN = 10
MAX_NEAR = 256
"""Missing rows reported with their distance to the last row answered (in-flight candidates)."""
"""Missing ids (and ids not in the input) listed by a completeness result."""
MAX_REASON_CHARS = 160


def shown_id(key: Any) -> Any:
    """A remembered id as JSON can carry it (bytes back to text)."""
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else key


class _Sidecar:
    """What the scanner remembers about one file of failed or skipped prompts."""

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key
        self.offset = 0
        self.lines = 0
        self.reasons: Counter[str] = Counter()
        self.ids: set[Any] = set()

    def read_line(self, line: bytes, id_key: str | None) -> None:
        self.lines += 1
        try:
            row = json.loads(line)
        except ValueError:
            self.reasons["(not JSON)"] += 1
            return
        if not isinstance(row, dict):
            self.reasons["(not an object)"] += 1
            return
        why = row.get("error")
        meta = row.get("metadata")
        if not why and isinstance(meta, dict):
            why = meta.get("error")  # vLLM speculators' error file: {"id", "metadata": {...}}
        reason = str(why).strip().splitlines()[0] if why else "(no reason given)"
        self.reasons[reason[:MAX_REASON_CHARS]] += 1
        if id_key and id_key in row:
            self.ids.add(remembered_id(row[id_key]))


class Companions:
    """Sidecar files and input ids a scanner keeps between calls."""

    def __init__(self) -> None:
        self.sidecars: dict[str, _Sidecar] = {}
        self._inputs: dict[str, tuple[tuple[Any, ...], list[Any], str | None]] = {}

    def sidecar(self, path: str, id_key: str | None) -> dict[str, Any]:
        """Lines of a file of failed or skipped prompts, by reason (its rows' ``error``, else
        ``metadata.error``), and the ids of their rows (key ``id_key``), read incrementally like
        a data file."""
        try:  # never through another user's link
            f = os.fdopen(safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK), "rb", 0)
        except (OSError, safefs.UnsafePath) as e:
            missing = isinstance(e, OSError) and e.errno == errno.ENOENT
            self.sidecars.pop(path, None)
            return {"path": path, "state": "missing" if missing else "unreadable", "lines": 0,
                    "reasons": {}}  # fmt: skip
        with f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return {"path": path, "state": "not-a-file", "lines": 0, "reasons": {}}
            side = self.sidecars.get(path)
            if (
                side is None
                or side.key != (st.st_dev, st.st_ino, id_key)
                or st.st_size < side.offset
            ):
                side = self.sidecars[path] = _Sidecar((st.st_dev, st.st_ino, id_key))
            f.seek(side.offset)
            data = f.read(max(st.st_size - side.offset, 0))
            end = data.rfind(b"\n") + 1
            for line in data[:end].splitlines():
                side.read_line(line, id_key)
            side.offset += end
        return {
            "path": path,
            "state": "ok",
            "lines": side.lines,
            "reasons": dict(side.reasons.most_common(MAX_REASONS)),
            "other_reasons": sum(side.reasons.values())
            - sum(n for _, n in side.reasons.most_common(MAX_REASONS)),
            "size": side.offset,
        }

    def input_keys(self, path: str, id_key: str) -> tuple[list[Any], str | None]:
        """The id of every row of an input file, in order (cached while the file is unchanged),
        or an error saying why they cannot be read."""
        try:
            st = safefs.stat_file(path)
        except safefs.UnsafePath as e:
            return [], f"input {e}"
        except OSError as e:
            return [], f"input {path}: {e.strerror or e}"
        sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, id_key)
        cached = self._inputs.get(path)
        if cached is not None and cached[0] == sig:
            return cached[1], cached[2]
        keys: list[Any] = []
        error = None
        try:
            with os.fdopen(safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
                head = f.read(4096).lstrip()
                f.seek(0)
                if head.startswith(b"["):
                    keys, error = _array_keys(f, id_key)
                    self._inputs[path] = (sig, keys, error)
                    return keys, error
                for n, line in enumerate(f):
                    if not id_key:
                        keys.append(n)
                        continue
                    try:
                        row = json.loads(line)
                    except ValueError:
                        error = f"input line {n + 1} is not JSON"
                        break
                    if not isinstance(row, dict) or id_key not in row:
                        error = f"input line {n + 1} has no {id_key!r}"
                        break
                    keys.append(remembered_id(row[id_key]))
        except safefs.UnsafePath as e:
            return [], f"input {e}"
        except OSError as e:
            return [], f"input {path}: {e.strerror or e}"
        self._inputs[path] = (sig, keys, error)
        return keys, error

    def completeness(
        self,
        done_ids: IdSet,
        duplicates: int,
        input_path: str,
        id_key: str,
        sidecars: dict[str, Any],
        failed_inline: set[Any] | None = None,
    ) -> dict[str, Any]:
        """Input ids against output ids: done, failed (only in a sidecar, or in a line of the
        output that records a failed request: ``failed_inline``), missing (passed by the client
        without an answer), not reached yet, not in input. An output id is known by its hash
        past the recent ones (:meth:`IdSet.__contains__`); the ids not in the input are counted
        from the set's size, and listed from the ids it keeps as ids."""
        keys, error = self.input_keys(input_path, id_key)
        result: dict[str, Any] = {
            "input_path": input_path,
            "input": len(keys),
            "error": error,
            "duplicates": duplicates,
        }
        if error is not None:
            return result
        wanted = set(keys)
        failed_ids: set[Any] = set(failed_inline or ())
        for side in sidecars.values():
            cached = self.sidecars.get(side.get("path", ""))
            if cached is not None:
                failed_ids |= cached.ids
        # The client goes through its input in order: the rows up to the last one it answered
        # (or failed) are passed; one of those without an answer is missing. The rows after it
        # are not reached yet (a running run, or one stopped at its --max-samples).
        passed = -1
        for n, k in enumerate(keys):
            if k in done_ids or k in failed_ids:
                passed = n
        unanswered = [
            (n, k) for n, k in enumerate(keys) if k not in done_ids and k not in failed_ids
        ]
        passed_over = [(n, k) for n, k in unanswered if n < passed]
        missing = [k for _, k in passed_over]
        later = [k for n, k in unanswered if n > passed]
        # The missing rows nearest the last one answered, with their distance to it: a running
        # client's requests in flight (fewer than its concurrency) are not missing yet.
        near = [[passed - n, shown_id(k)] for n, k in passed_over[-MAX_NEAR:]]
        done = sum(1 for k in wanted if k in done_ids)
        strangers = [k for k in done_ids.exact() if k not in wanted]
        result.update(
            {
                "input": len(wanted),
                "input_duplicates": len(keys) - len(wanted),
                "done": done,
                "failed": sum(1 for k in failed_ids & wanted if k not in done_ids),
                "missing": len(missing),
                "missing_first": [shown_id(k) for k in missing[:MAX_IDS_SHOWN]],
                "missing_near": near,
                "not_reached": len(later),
                "not_reached_first": [shown_id(k) for k in later[:MAX_IDS_SHOWN]],
                "not_in_input": len(done_ids) - done,
                "not_in_input_first": sorted(
                    (shown_id(k) for k in strangers[: MAX_IDS_SHOWN * 10]), key=str
                )[:MAX_IDS_SHOWN],
            }
        )
        return result


def _array_keys(f: Any, id_key: str) -> tuple[list[Any], str | None]:
    """The ids of the rows of an input file that is ONE JSON array (Model-Optimizer's
    ``--data_path`` read with ``json.load``): the row index, or each row's ``id_key``."""
    try:
        rows = json.loads(f.read())
    except ValueError as e:
        return [], f"input is not a JSON array ({e})"
    if not isinstance(rows, list):
        return [], "input is not a JSON array"
    if not id_key:
        return list(range(len(rows))), None
    keys: list[Any] = []
    for n, row in enumerate(rows):
        if not isinstance(row, dict) or id_key not in row:
            return keys, f"input row {n + 1} has no {id_key!r}"
        keys.append(remembered_id(row[id_key]))
    return keys, None
