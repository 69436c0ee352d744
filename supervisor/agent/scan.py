"""Incremental scanning of JSONL dataset files: counts, tokens, bad lines and a format verdict.

Standard library only, Python >= 3.8: this module runs inside the host agent on GPU hosts. It may
import :mod:`supervisor.agent.formats`, :mod:`supervisor.agent.follow`,
:mod:`supervisor.agent.completeness`, :mod:`supervisor.agent.idset` and
:mod:`supervisor.agent.promptlengths` (and through them :mod:`supervisor.agent.safefs`) and
nothing else from ``supervisor``.

A :class:`Scanner` keeps per-file state between calls, so a refresh reads only the bytes appended
since the last one. Following the file - the offset of the last complete line, the fingerprint,
the clean rescan of a truncated, replaced or rewritten file, companion files - is
:mod:`supervisor.agent.follow`; this module parses and counts the new bytes. A partial last line
is left for later (D1); a rescan starts with fresh counters, so nothing is counted twice (D4, D5).

Cold and incremental scans take the same fast path: the big integer arrays of a format
(``output_ids``; ``input_ids`` and ``loss_mask``) are located by byte search and cut out, and only
the small rest of the line is parsed with :mod:`json`. Token counts come from the format's count
field. A sample of records - the first and last complete line of every call, and one every
``1/32`` of the bytes read (at least every MiB) - is fully validated: the arrays are parsed and
their length checked against the count. ``validate="all"`` validates every record. A record that
fails validation is reported as a bad line and not counted; corruption only a full parse can see
(``[1,,2]`` inside an array) is therefore caught on validated records only.

Plain lines skip even that parse. After a record is counted one by one, its shape (keys in order,
separators, value types) becomes a template: a regular expression matching exactly the lines that
would parse to the same keys and count the same way unvalidated (strings of printable ASCII
without escapes, integer token counts, the big array cut at its first ``]``). Runs of short lines
are matched by one ``findall`` over the chunk and their tokens, ids and finish reasons summed per
batch; a long line by the template's head and tail around one ``memchr`` for its array's end. A
line that does not match (escapes, UTF-8 text, other spacing, anything malformed) goes one by one
as before, in file order; sampled lines are never batched. ``Scanner(batch=False)`` counts every
line one by one: the reference the batches are tested against.

Memory is bounded by the longest line: the file is read in chunks (``chunk_size``), a line is
buffered only until its newline arrives, and lines longer than ``max_line_bytes`` are skipped
without being buffered. The ids seen, which counting duplicates needs, are kept exactly in an
:class:`~supervisor.agent.idset.IdSet`: about 6 bytes per distinct id past its recent ones, an id
whose hash was seen before decided against the file at the end of the call. A partial last line
is read again by every call until its newline arrives (nothing of it is kept between calls).

Bad lines (bad JSON, NUL blocks, invalid UTF-8, NaN/Infinity, duplicate keys, non-objects, bad
token counts, a BOM, empty lines) are reported with byte offset, 1-based line number and reason,
and counting continues. A missing, unreadable or non-regular file is a ``state``, never an
exception.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from supervisor.agent.completeness import Companions, shown_id
from supervisor.agent.follow import Follower, Position, Unfollowable, unfollowable
from supervisor.agent.formats import (
    PROFILES,
    Profile,
    detect,
    differing_keys,
    finish_value,
    get_profile,
    is_failed_line,
    lookup,
    matches,
    reasoning_of,
    texts_of,
    token_count,
)
from supervisor.agent.idset import IdSet, first_ids, remembered_id
from supervisor.agent.promptlengths import PromptLengths

DEFAULT_CHUNK = 1 << 20
"""Bytes read per ``read()`` call."""
MAX_LINE_BYTES = 1 << 30
"""Lines longer than this are reported and skipped without being held in memory."""
MAX_DUPLICATE_IDS = 10
"""Ids seen again that a scan result names (the count is exact; these are the first ones)."""
MAX_BAD_LINES = 100
"""Bad lines listed per file (all are counted in ``bad_lines_total``)."""
MAX_TEXT_BYTES = 8 << 20
"""Bytes of text handed back per call for tokenizer-counted formats; the rest waits for the next."""
SAMPLES_PER_SCAN = 32
MIN_SAMPLE_STRIDE = 1 << 20
FULL_PARSE_MAX = 4 << 20
"""Arrays larger than this are validated by a character check instead of a full parse."""
BATCH_LINE_MAX = 8 << 10
"""Lines up to this long are counted in batches by a line template; longer ones one by one, by
the template's head and tail around a ``memchr`` for the end of the array (a regular expression
walking a long array is slower than ``memchr``)."""
TEMPLATE_LINE_MAX = 1 << 20
"""Templates are built from lines up to this long (building copies the line)."""
MAX_TEMPLATES = 16
"""Record shapes per file for which a line template is built (or found impossible)."""

if TYPE_CHECKING:  # annotations only: subscripting collections.abc fails on Python 3.8
    from collections.abc import Callable, Iterable

    Progress = Callable[[int, int], None]


class BadLine(Exception):
    """A line that is not a countable record (the message is the reason)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise BadLine(f"duplicate key {k!r}")
        d[k] = v
    return d


def _no_constant(name: str) -> Any:
    raise BadLine(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
_FAST_DECODER = json.JSONDecoder(parse_constant=_no_constant)
"""Without the duplicate-key hook (a Python call per object): used where duplicates are ruled out
by counting colons (see :func:`_parse`)."""
_ARRAY_CHARS = b"0123456789,- \t\r\n"
_WS = b" \t\r\n"


def _parse(text: bytes | memoryview, brace: bool = False) -> Any:
    """Strict JSON: UTF-8 without BOM, no NaN/Infinity, no duplicate keys.

    ``text`` may be a memoryview into the read buffer (a long line is then decoded without a
    copy). ``brace``: the text starts with ``{`` (no blanks to skip: the quicker entry point).
    """
    try:
        s = str(text, "utf-8")
    except UnicodeDecodeError as e:
        raise BadLine(f"invalid UTF-8 (byte 0x{text[e.start]:02x})") from None
    try:
        if brace:
            value, end = _FAST_DECODER.raw_decode(s)
            if end != len(s) and not s[end:].isspace():
                raise BadLine(f"bad JSON: extra data after the object (char {end})")
            # Every key occurrence is followed by one colon, so when the text has no more colons
            # than the object has keys, no key occurred twice (nor is any object nested).
            # Otherwise parse again with the hook that names a duplicate key.
            if isinstance(value, dict) and s.count(":") == len(value):
                return value
            value, end = _DECODER.raw_decode(s)
            return value
        return _DECODER.decode(s)
    except ValueError as e:
        msg = str(e)
        if "BOM" in msg:
            raise BadLine("UTF-8 BOM at start of line") from None
        raise BadLine(f"bad JSON: {msg}") from None
    except RecursionError:
        raise BadLine("bad JSON: nested too deeply") from None


def strict_json(line: bytes) -> Any:
    """A line parsed as the scanner parses it (:class:`BadLine` saying why it is not strict
    JSON)."""
    return _parse(line)


def _check_int_array(buf: Any, lb: int, rb: int) -> int:
    """Validate ``buf[lb:rb+1]`` as a JSON array of integers; its length."""
    size = rb - lb + 1
    if size <= FULL_PARSE_MAX:
        text = bytes(buf[lb : rb + 1])
        # Valid JSON made of digits, commas, minus signs and blanks only is a list of integers
        # (floats need '.' or 'e', strings '"', constants letters): two C-speed passes.
        if text[1:-1].translate(None, _ARRAY_CHARS):
            raise BadLine("array holds something other than integers")
        try:
            value = json.loads(text)
        except ValueError as e:
            raise BadLine(f"bad JSON in array: {e}") from None
        return len(value)
    # Too big to materialise as Python ints: check characters and comma structure piecewise.
    mv = memoryview(buf)
    commas = 0
    digits_seen = False
    prev = b","
    pos = lb + 1
    while pos < rb:
        end = min(pos + (1 << 20), rb)
        piece = bytes(mv[pos:end])
        if piece.translate(None, _ARRAY_CHARS):
            raise BadLine("array holds something other than integers")
        compact = piece.translate(None, _WS)
        if compact:
            joined = prev[-1:] + compact
            if b",," in joined or b"-," in joined or b"--" in joined:
                raise BadLine("array is not a list of integers")
            digits_seen = True
            prev = compact
        commas += piece.count(b",")
        pos = end
    if digits_seen and prev.endswith((b",", b"-")):
        raise BadLine("array is not a list of integers")
    return commas + 1 if digits_seen else 0


_ABSENT = object()


_id_key = remembered_id
"""How a record's id is remembered (shared with the completeness of an input)."""


def _note_duplicates(state: _FileState, ids: list[Any]) -> None:
    """Keep the first of a batch's ids already seen (before the batch or in it)."""
    seen = state.ids
    fresh: set[Any] = set()
    for key in ids:
        if key in seen or key in fresh:
            state.duplicate_ids.append(key)
            if len(state.duplicate_ids) >= MAX_DUPLICATE_IDS:
                return
        else:
            fresh.add(key)


_T_TEXT = rb"[\x20\x21\x23-\x5b\x5d-\x7e]*"
"""Printable ASCII without quote or backslash: a JSON string body that is its own value."""
_T_PLAIN = re.compile(_T_TEXT.decode() + r"\Z")
# Numbers; integer parts of up to 18 digits (longer ones go one by one: Python limits the digits
# int() and json read). Token counts are non-negative integers, ids integers.
_T_NUMBER = rb"-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_T_COUNT = rb"(0|[1-9][0-9]{0,17})"
_T_INT = rb"(-?(?:0|[1-9][0-9]{0,17}))"
_T_ARRAY = rb"\[[^\]]*\]"
"""A big array as the fast path cuts it: up to its first ``]`` (its items are not read)."""


class _Template:
    """A regular expression matching the lines of one record shape that need no JSON parse.

    Built from a record just counted one by one: the same keys in the same order and with the
    same separators; strings of printable ASCII without escapes; numbers where it had numbers
    (token counts as non-negative integers); ``true``/``false``/``null`` where it had them; big
    arrays as the fast path cuts them. Such a line parses to the same keys, is of the same
    profile and kind, and counts exactly as :meth:`Scanner._count` would count it unvalidated:
    its numbers (tokens, prompt tokens), id and finish reason are captured and summed per batch.
    Anything else (nested objects, escapes, non-ASCII text, other spacing) fails to match and is
    counted one by one.
    """

    def __init__(
        self,
        pattern: re.Pattern[bytes],
        prof: Profile,
        kind: str,
        roles: dict[str, int],
        int_id: bool,
        finish: str | None,
    ) -> None:
        self.pattern = pattern
        self.prof = prof
        self.kind = kind
        self.roles = roles
        self.int_id = int_id
        self.finish = finish
        self.head: re.Pattern[bytes] | None = None
        self.tail: re.Pattern[bytes] | None = None

    @classmethod
    def build(
        cls,
        prof: Profile,
        kind: str,
        obj: dict[str, Any],
        arrays: dict[str, tuple[int, int]],
        line: bytes,
    ) -> _Template | None:
        """The template of ``line`` (parsed as ``obj``), or None when its shape has none."""
        tokens = prof.tokens_field
        if tokens is None or prof.text_field is not None or type(obj.get(tokens)) is not int:
            return None
        fields = {"id": prof.id_field, "tokens": tokens}
        if prof.prompt_tokens_field is not None:
            fields["prompt"] = prof.prompt_tokens_field
        if prof.finish_reason_field is not None:
            fields["finish"] = prof.finish_reason_field
        role_of = {f: r for r, f in fields.items()}
        if len(role_of) != len(fields) or any("." in f for f in role_of):
            return None
        for colon, comma in ((b": ", b", "), (b":", b",")):
            parts = [rb"(?m)^", rb"\{"]
            roles: dict[str, int] = {}
            int_id = False
            for k, v in obj.items():
                if not _T_PLAIN.match(k):
                    return None
                if len(parts) > 2:
                    parts.append(re.escape(comma))
                parts.append(re.escape(b'"' + k.encode() + b'"' + colon))
                role = role_of.get(k)
                if k in arrays and isinstance(v, list):
                    if role is not None:
                        return None
                    parts.append(_T_ARRAY)
                elif v is None or isinstance(v, bool):
                    if role in ("id", "tokens") or (role == "prompt" and v is not None):
                        return None
                    parts.append(re.escape(json.dumps(v).encode()))
                elif isinstance(v, int):
                    if role == "finish" or (role in ("tokens", "prompt") and v < 0):
                        return None
                    if role is not None:
                        roles[role] = len(roles) + 1
                    int_id = int_id or role == "id"
                    parts.append(_T_INT if role == "id" else _T_COUNT if role else _T_NUMBER)
                elif isinstance(v, float) and role is None:
                    parts.append(_T_NUMBER)
                elif isinstance(v, str) and role in (None, "id", "finish"):
                    if role is not None:
                        roles[role] = len(roles) + 1
                    parts.append(b'"(' + _T_TEXT + b')"' if role else b'"' + _T_TEXT + b'"')
                else:
                    return None
            parts.append(rb"\}\r?\n")
            pattern = re.compile(b"".join(parts))
            if pattern.fullmatch(line + b"\n"):
                finish = None if "finish" in roles else finish_value(prof, obj)
                tpl = cls(pattern, prof, kind, roles, int_id, finish)
                if parts.count(_T_ARRAY) == 1:
                    at = parts.index(_T_ARRAY)
                    tpl.head = re.compile(b"".join(parts[1:at]) + rb"\[")
                    tpl.tail = re.compile(rb"\]" + b"".join(parts[at + 1 :]))
                return tpl
        return None

    def long_row(self, data: bytearray, s: int, e: int) -> Any:
        """The row of the line ``data[s:e]`` (newline at ``e``) if it is plain, else None: the
        head and tail matched around one ``memchr`` for the first ``]`` (a long line)."""
        assert self.head is not None and self.tail is not None
        m = self.head.match(data, s, e)
        if m is None:
            return None
        rb = data.find(b"]", m.end(), e)
        t = self.tail.match(data, rb, e + 1) if rb >= 0 else None
        if t is None:
            return None
        row = m.groups() + t.groups()
        return row if len(row) > 1 else row[0]

    def add(self, state: _FileState, rows: list[Any]) -> None:
        """Count the matches of :attr:`pattern` (``findall`` rows) as records of ``state``."""
        n = len(rows)
        if not n:
            return
        state.lines += n
        state.records += n
        name = self.prof.name
        state.formats[name] = state.formats.get(name, 0) + n
        state.kinds[self.kind] += n
        roles = self.roles
        many = len(roles) > 1

        def col(role: str) -> Iterable[bytes]:
            return map(itemgetter(roles[role] - 1), rows) if many else rows

        state.completion_tokens += sum(map(int, col("tokens")))
        if "prompt" in roles:
            state.prompt_tokens += sum(map(int, col("prompt")))
        if "id" in roles:
            ids: Iterable[Any] = map(int, col("id")) if self.int_id else col("id")
            if len(state.duplicate_ids) < MAX_DUPLICATE_IDS:
                ids = list(ids)
                _note_duplicates(state, ids)
            state.ids.add_many(ids)
        finish = state.finish
        if "finish" in roles:
            for value, count in Counter(col("finish")).items():
                key = value.decode()
                finish[key] = finish.get(key, 0) + count
        elif self.finish is not None:
            finish[self.finish] = finish.get(self.finish, 0) + n


_NO_TEMPLATE = _Template(re.compile(b"$^"), PROFILES["raw"], "other", {}, False, None)
"""A template with no rows: a placeholder where one is expected."""


class _FileState(Position):
    """What the scanner remembers about one file between calls: its position and counters."""

    def __init__(
        self, epoch: int, settings: tuple[Any, ...], expected: Profile | None, ids: IdSet
    ) -> None:
        super().__init__(epoch, settings)
        self.lines = 0
        self.records = 0
        self.ids = ids
        self.duplicate_ids: list[Any] = []
        """The first ids seen again (at most ``MAX_DUPLICATE_IDS``), as remembered."""
        self.failed = 0
        """Lines recording a failed request (``Profile.failed_keys``)."""
        self.failed_ids: set[Any] = set()
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.texts_records = 0
        self.finish: dict[str, int] = {}
        self.formats: dict[str, int] = {}
        self.kinds = {"current": 0, "legacy": 0, "other": 0}
        self.bad: list[dict[str, Any]] = []
        self.bad_total = 0
        self.validated = 0
        self.finished = False
        self.expected = expected
        self.shapes: dict[tuple[str, ...], tuple[Profile | None, str]] = {}
        self.cut_for: Profile | bool | None = False
        self.cut_keys: list[tuple[str, bytes]] = []
        self.first_offending: dict[str, Any] | None = None
        self.first_unknown: tuple[int, int, list[str]] | None = None
        self.texts: list[str] = []
        self.reasoning: list[str] = []
        self.text_bytes = 0
        self.template: _Template | None = None
        self.templates: dict[tuple[str, ...], _Template | None] = {}


class Scanner:
    """Incremental scanner of dataset files; one instance keeps the state of many files.

    Args:
        chunk_size: bytes per read (tests make it tiny to split lines and characters).
        max_line_bytes: longer lines are skipped and reported.
        max_text_bytes: texts handed back per call for tokenizer-counted formats.
        batch: count runs of plain lines in batches (see :class:`_Template`); False counts every
            line on its own, the reference the batches are tested against.
        id_set: makes the ids of a file (tests force hash collisions with it).
    """

    def __init__(
        self,
        chunk_size: int = DEFAULT_CHUNK,
        max_line_bytes: int = MAX_LINE_BYTES,
        max_text_bytes: int = MAX_TEXT_BYTES,
        batch: bool = True,
        id_set: Callable[[], IdSet] = IdSet,
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        self.chunk_size = chunk_size
        self.batch = batch
        self._id_set = id_set
        self.max_line_bytes = max_line_bytes
        self.max_text_bytes = max_text_bytes
        self._follow: Follower[_FileState] = Follower(chunk_size)
        self._companions = Companions()
        self._prompt_lengths = PromptLengths()
        self._want_texts = True

    # ------------------------------------------------------------------ public

    def scan(
        self,
        path: str,
        fmt: str | None = None,
        expected: str | None = None,
        validate: str = "sample",
        profile: dict[str, Any] | None = None,
        texts: bool = True,
        progress: Progress | None = None,
        sidecars: dict[str, str] | None = None,
        input_file: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Scan the bytes of ``path`` appended since the last call; the JSON-able result.

        Args:
            path: the JSONL file.
            fmt: the format the file is expected to hold (a built-in name, or the name of
                ``profile``); None detects it from the first record.
            expected: the format the verdict is relative to (default: ``fmt``).
            validate: ``sample`` (first, last and spread records), ``all`` or ``none``.
            profile: a user profile as a plain dict (see :func:`formats.profile_from_dict`).
            texts: hand back texts of new records for tokenizer-counted formats.
            progress: called with ``(bytes_done, bytes_total)`` after every chunk.
            sidecars: kind -> path of files beside it holding failed or skipped prompts (counted
                with their reasons, ``sidecars`` of the result).
            input_file: ``{"path": INPUT, "id": KEY}``: the input file whose rows the records
                answer, ``KEY`` the id of a row (echoed in the record's id) or ``""`` for its
                index; the result's ``completeness`` compares the two, its ``prompt_lengths``
                says how long the input's rows are (``promptlengths``).
        """
        if validate not in ("sample", "all", "none"):
            raise ValueError("validate must be sample, all or none")
        want = expected or fmt
        user = None
        if want is not None:
            try:
                user = get_profile(want, profile if want not in PROFILES else None)
            except ValueError as e:
                return self._state_only(path, "error", str(e), want)
        self._want_texts = texts
        settings = (want, json.dumps(profile, sort_keys=True) if profile else None)
        started = time.monotonic()
        result = self._scan_path(path, want, settings, user, validate, texts, progress, started)
        if sidecars:
            result["sidecars"] = {
                kind: self._companions.sidecar(side, (input_file or {}).get("id") or None)
                for kind, side in sidecars.items()
            }
        if input_file and isinstance(input_file.get("path"), str):
            state = self._follow.get(path)
            result["completeness"] = self._companions.completeness(
                state.ids if state is not None else IdSet(),
                state.ids.duplicates if state is not None else 0,
                input_file["path"],
                str(input_file.get("id") or ""),
                result.get("sidecars") or {},
                failed_inline=state.failed_ids if state is not None else set(),
            )
            result["prompt_lengths"] = self._prompt_lengths.of(
                input_file["path"], str(input_file.get("id") or "")
            )
        return result

    def _scan_path(
        self,
        path: str,
        want: str | None,
        settings: tuple[Any, ...],
        user: Profile | None,
        validate: str,
        texts: bool,
        progress: Progress | None,
        started: float,
    ) -> dict[str, Any]:
        try:
            f, st = self._follow.open(path)
            with f:
                return self._scan_open(
                    path, f, st, settings, user, validate, texts, progress, started
                )
        except OSError as e:
            self._follow.drop(path)
            err = unfollowable(e)
        except Unfollowable as e:
            err = e
        return self._state_only(path, err.state, err.message, want)

    def following(self, path: str) -> bool:
        """Whether ``path`` was scanned before: its next scan reads only the appended bytes."""
        return self._follow.following(path)

    # ------------------------------------------------------------------ states

    def _state_only(
        self, path: str, state: str, error: str | None, want: str | None
    ) -> dict[str, Any]:
        result = _empty_result(path, want)
        result["state"] = state
        result["error"] = error
        result["verdict"] = "missing" if state == "missing" else "error"
        result["verdict_detail"] = error
        return result

    # ------------------------------------------------------------------ scanning

    def _scan_open(
        self,
        path: str,
        f: Any,
        st: os.stat_result,
        settings: tuple[Any, ...],
        want: Profile | None,
        validate: str,
        texts: bool,
        progress: Progress | None,
        started: float,
    ) -> dict[str, Any]:
        size = st.st_size
        state, reason = self._follow.resume(
            path, f, st, settings, lambda epoch: _FileState(epoch, settings, want, self._id_set())
        )
        start = state.offset
        ids = state.ids

        def read_back(hashes: frozenset[int]) -> dict[int, Any]:
            # Every record counted is before the position read to (a partial line is not read).
            limit = f.tell()
            return first_ids(f, limit, _id_fields(state), hashes, ids, self.max_line_bytes)

        ids.resolver = read_back
        try:
            stopped = self._consume(state, f, start, size, validate, texts, progress)
            if ids.pending:
                ids.resolve(read_back(ids.pending))
        finally:
            ids.resolver = None
        self._follow.advanced(state, f, start)
        result = self._result(path, state, st, size)
        if state.expected is not None and state.expected.companions:
            result["companions"] = self._follow.companions(path, state.expected.companions)
        result["rescan_reason"] = reason
        result["bytes_read"] = size - start
        result["texts_more"] = stopped
        if stopped:
            result["partial_tail_bytes"] = 0
        result["scan_seconds"] = round(time.monotonic() - started, 6)
        state.texts = []
        state.reasoning = []
        state.text_bytes = 0
        return result

    def _consume(
        self,
        state: _FileState,
        f: Any,
        start: int,
        size: int,
        validate: str,
        texts: bool,
        progress: Progress | None,
    ) -> bool:
        """Count the complete lines in ``[start, size)``; True when stopped early for texts."""
        chunk = self.chunk_size
        f.seek(start)
        span = size - start
        stride = max(span // SAMPLES_PER_SCAN, MIN_SAMPLE_STRIDE)
        next_mark = start
        all_ = validate == "all"
        sample = validate == "sample"
        first = True
        pos = start  # file offset of data[0]
        pending = bytearray()
        pending_off = start
        skipping = -1  # length of an over-long line being skipped, or -1
        line = self._line
        batch = self.batch
        rows: list[Any] = []  # rows of long plain lines not yet counted, of template rows_of
        rows_of = _NO_TEMPLATE
        # One buffer for every read: bytes past `n` are stale, so every search is bounded by n.
        data = bytearray(min(chunk, max(span, 1)))
        view = memoryview(data)
        while pos < size:
            n = f.readinto(view[: min(len(data), size - pos)])
            if not n:
                break  # the file shrank while we read; the next call sees it
            last_chunk = pos + n >= size
            last_nl = data.rfind(b"\n", 0, n) if last_chunk else -2
            i = 0
            nl = data.find(b"\n", 0, n)
            if skipping >= 0 or pending:
                if nl < 0:
                    if skipping >= 0:
                        skipping += n
                    else:
                        pending += view[:n]
                        if len(pending) > self.max_line_bytes:
                            skipping = len(pending)
                            pending = bytearray()
                    pos += n
                    if progress is not None:
                        progress(pos - start, span)
                    continue
                if skipping >= 0:
                    self._bad(
                        state,
                        pending_off,
                        f"line longer than {self.max_line_bytes} bytes "
                        f"({skipping + nl} bytes), skipped",
                    )
                    skipping = -1
                else:
                    pending += data[:nl]
                    check = all_ or (
                        sample and (first or pending_off >= next_mark or nl == last_nl)
                    )
                    if check and pending_off >= next_mark:
                        next_mark = pending_off + stride
                    if line(state, pending, 0, len(pending), pending_off, check):
                        state.offset = pos + nl + 1
                        return True
                    first = False
                pending = bytearray()
                state.offset = pos + nl + 1
                i = nl + 1
                nl = data.find(b"\n", i, n)
            while nl >= 0:
                off = pos + i
                check = all_ or (sample and (first or off >= next_mark or nl == last_nl))
                tpl = state.template if batch and not check else None
                if tpl is not None and tpl.tail is not None and nl - i > BATCH_LINE_MAX:
                    row = tpl.long_row(data, i, nl)
                    if row is not None:
                        if rows_of is not tpl:
                            rows_of.add(state, rows)
                            rows, rows_of = [], tpl
                        rows.append(row)
                        first = False
                        state.offset = pos + nl + 1
                        i = nl + 1
                        nl = data.find(b"\n", i, n)
                        continue
                # Rows held back are counted before any other line, in file order.
                rows_of.add(state, rows)
                rows = []
                if tpl is not None and nl - i <= BATCH_LINE_MAX:
                    # The lines from here that need no check: up to the last complete line of
                    # the buffer, stopping before the last line of the call and before the line
                    # at the next sample mark.
                    end = data.rfind(b"\n", i, n) + 1
                    if sample and last_nl >= 0:
                        end = min(end, data.rfind(b"\n", i, last_nl) + 1)
                    if sample and next_mark - pos < end:
                        end = data.find(b"\n", next_mark - pos - 1, end) + 1
                    stop, i = self._batch(state, data, i, end, pos)
                    state.offset = pos + i
                    if stop:
                        return True
                    first = False
                    nl = data.find(b"\n", i, n)
                    continue
                if check and off >= next_mark:
                    next_mark = off + stride
                stop = line(state, data, i, nl, off, check)
                first = False
                state.offset = pos + nl + 1
                if stop:
                    return True
                i = nl + 1
                nl = data.find(b"\n", i, n)
            rows_of.add(state, rows)
            rows = []
            if i < n:
                pending_off = pos + i
                if n - i > self.max_line_bytes:
                    skipping = n - i
                else:
                    pending += view[i:n]
            pos += n
            if progress is not None:
                progress(pos - start, span)
        return False

    def _batch(
        self, state: _FileState, data: bytearray, i: int, end: int, pos: int
    ) -> tuple[bool, int]:
        """Count the short whole lines of ``data[i:end]``, plain ones by the file's template.

        Stops before the first line longer than :data:`BATCH_LINE_MAX` (those are matched one
        by one, see :meth:`_Template.long_row`). Returns ``(stopped for texts, index after the
        last line counted)``. One ``findall`` over the span counts it when every line is plain
        (as many matches as newlines: a match starts at a line start and holds at least its
        closing newline). Otherwise the matches are walked and the lines between them go one by
        one through :meth:`_line`, in file order so that line numbers stay right.
        """
        tpl = state.template
        assert tpl is not None
        # Newlines by memchr, line by line: faster than bytes.count (a byte loop) on lines of a
        # few hundred bytes and more, and it finds the first long line.
        lines = 0
        at = i
        find = data.find
        while at < end:
            nl = find(b"\n", at, end)
            if nl - at > BATCH_LINE_MAX:
                break
            lines += 1
            at = nl + 1
        end = at
        rows = tpl.pattern.findall(data, i, end)
        if len(rows) == lines:
            tpl.add(state, rows)
            return False, end
        rows = []
        at = i
        one = tpl.pattern.groups == 1
        for m in tpl.pattern.finditer(data, i, end):
            s0, e0 = m.span()
            if data.find(b"\n", s0, e0 - 1) >= 0:
                continue  # an array ran into the next line: those lines are not plain
            if s0 != at:
                tpl.add(state, rows)
                rows = []
                stop, at = self._lines(state, data, at, s0, pos)
                if stop:
                    return True, at
            rows.append(m.group(1) if one else m.groups())
            at = e0
        tpl.add(state, rows)
        if at < end:
            return self._lines(state, data, at, end, pos)
        return False, end

    def _lines(
        self, state: _FileState, data: bytearray, i: int, end: int, pos: int
    ) -> tuple[bool, int]:
        """Count the whole lines of ``data[i:end]`` one by one (none of them sampled)."""
        while i < end:
            nl = data.find(b"\n", i, end)
            if self._line(state, data, i, nl, pos + i, False):
                return True, nl + 1
            i = nl + 1
        return False, end

    # ------------------------------------------------------------------ one line

    def _bad(self, state: _FileState, offset: int, reason: str) -> None:
        state.lines += 1
        state.bad_total += 1
        if len(state.bad) < MAX_BAD_LINES:
            state.bad.append({"offset": offset, "line": state.lines, "reason": reason})

    def _line(self, state: _FileState, buf: Any, s: int, e: int, off: int, check: bool) -> bool:
        """Count one complete line ``buf[s:e]`` (newline excluded). True: stop for texts."""
        try:
            return self._record(state, buf, s, e, off, check)
        except BadLine as err:
            reason = str(err)
            if reason.startswith(("bad JSON", "invalid UTF-8")) and buf.find(b"\x00", s, e) >= 0:
                reason = "NUL bytes (zeroed block) inside the line"
            self._bad(state, off, reason)
            return False

    def _record(self, state: _FileState, buf: Any, s: int, e: int, off: int, check: bool) -> bool:
        if e > s and buf[e - 1] == 13:  # CRLF line ending
            e -= 1
        if e == s:
            raise BadLine("empty line")
        c = buf[s]
        if c != 123:  # "{"
            if c == 0:
                raise BadLine("NUL bytes (zeroed block)")
            if c == 0xEF and buf[s : s + 3] == b"\xef\xbb\xbf":
                raise BadLine("UTF-8 BOM at start of line")
            if e - s <= FULL_PARSE_MAX:
                value = _parse(memoryview(buf)[s:e])
                if isinstance(value, dict):
                    return self._count(state, value, {}, buf, s, e, off, check, True)
                raise BadLine(f"not a JSON object ({type(value).__name__})")
            raise BadLine("bad JSON: line does not start with '{'")
        if state.cut_for is not state.expected:
            state.cut_keys = _cut_keys(state.expected)
            state.cut_for = state.expected
        cuts: list[tuple[int, int, str]] = []
        for key, pattern in state.cut_keys:
            k = buf.find(pattern, s, e)
            if k < 0:
                continue
            p = k + len(pattern)
            lb = buf.find(b"[", p, min(e, p + 64))
            if lb < 0:
                continue
            # json.dumps writes '": [': skip the general check in that common case.
            if not (lb == p + 2 and buf[p] == 58 and buf[p + 1] == 32) and (
                bytes(buf[p:lb]).strip() != b":"
            ):
                continue
            rb = buf.find(b"]", lb, e)
            if rb < 0:
                raise BadLine(f"bad JSON: unterminated array {key!r}")
            cuts.append((lb, rb, key))
        full = not cuts
        if full:
            obj = _parse(memoryview(buf)[s:e], True)
        else:
            if len(cuts) == 1:
                lb, rb, _ = cuts[0]
                text = bytes(buf[s : lb + 1]) + bytes(buf[rb:e])
            else:
                cuts.sort()
                pieces = []
                at = s
                for lb, rb, _ in cuts:
                    if lb < at:
                        raise BadLine("bad JSON: overlapping arrays")
                    pieces.append(bytes(buf[at : lb + 1]))
                    at = rb
                pieces.append(bytes(buf[at:e]))
                text = b"".join(pieces)
            try:
                obj = _parse(text, True)
            except BadLine:
                if e - s <= FULL_PARSE_MAX:
                    # The cut changed the meaning (nested arrays...): judge the line as written.
                    obj = _parse(memoryview(buf)[s:e])
                    full = True
                else:
                    raise
        if not isinstance(obj, dict):
            raise BadLine(f"not a JSON object ({type(obj).__name__})")
        arrays = {} if full else {key: (lb, rb) for lb, rb, key in cuts}
        return self._count(state, obj, arrays, buf, s, e, off, check, full)

    def _count(
        self,
        state: _FileState,
        obj: dict[str, Any],
        arrays: dict[str, tuple[int, int]],
        buf: Any,
        s: int,
        e: int,
        off: int,
        check: bool,
        full: bool,
    ) -> bool:
        exp = state.expected
        if len(obj) == 1:
            marker = next(iter(obj))
            if (exp is None or exp.end_marker == marker) and marker == "finished":
                state.lines += 1
                state.finished = True
                return False
        failed_prof = exp if exp is not None else _FAILED_LINE_PROFILES.get(frozenset(obj))
        if failed_prof is not None and failed_prof.failed_keys and is_failed_line(failed_prof, obj):
            # A failed request the client logged (its resume skips the row): not a record. A
            # file of no expected format is of the format whose failed line it is.
            if exp is None and state.first_unknown is None:
                state.expected = exp = failed_prof
            state.lines += 1
            state.failed += 1
            found, ident = lookup(obj, failed_prof.id_field)
            if found:
                state.failed_ids.add(_id_key(ident))
            return False
        # Records of one file nearly always share their keys: classify a key set once.
        shape = tuple(obj)
        cached = state.shapes.get(shape) if exp is not None else None
        if cached is not None:
            prof, kind = cached
        else:
            prof = None
            if exp is not None and matches(exp, obj):
                prof = exp
            elif exp is not None and exp.legacy is not None and matches(PROFILES[exp.legacy], obj):
                prof = PROFILES[exp.legacy]
            else:
                prof = detect(obj)
                if exp is None and prof is not None:
                    state.expected = exp = prof
                    early = state.first_unknown
                    if early is not None:  # records before the first known one were unknown
                        missing, extra = differing_keys(exp, early[2])
                        state.first_offending = {
                            "line": early[0],
                            "offset": early[1],
                            "format": None,
                            "missing": missing,
                            "extra": extra,
                        }
            kind = "other"
            if prof is not None and prof is exp and all(k in obj for k in prof.required):
                kind = "current"
            elif prof is not None and exp is not None and prof.name == exp.legacy:
                kind = "legacy"
            if exp is not None and len(state.shapes) < 64:
                state.shapes[shape] = (prof, kind)

        lengths: dict[str, int] = {}

        def length(key: str) -> int:
            if key in lengths:
                return lengths[key]
            if key in arrays:
                lb, rb = arrays[key]
                n = _check_int_array(buf, lb, rb) if check else _count_items(buf, lb, rb)
            else:
                value = obj.get(key)
                if not isinstance(value, list):
                    raise BadLine(f"{key} is not a list")
                n = len(value)
            lengths[key] = n
            return n

        tokens = 0
        prompt = 0
        record_texts: list[str] | None = None
        record_reasoning: list[str] = []
        if prof is not None:
            if prof.tokens_field is not None:
                v = obj.get(prof.tokens_field, _ABSENT)  # a flat key: the common case
                if v is _ABSENT:
                    found, v = lookup(obj, prof.tokens_field)
                    if not found:
                        raise BadLine(f"missing {prof.tokens_field}")
                if type(v) is int and v >= 0:
                    tokens = v
                else:
                    n, why = token_count(v)
                    if n is None:
                        raise BadLine(f"{prof.tokens_field} {why}")
                    tokens = n
            elif prof.tokens_list_field is not None:
                if (
                    prof.tokens_list_field not in arrays
                    and not lookup(obj, prof.tokens_list_field)[0]
                ):
                    raise BadLine(f"missing {prof.tokens_list_field}")
                tokens = length(prof.tokens_list_field)
            if prof.prompt_tokens_field is not None:
                v = obj.get(prof.prompt_tokens_field, _ABSENT)
                if v is _ABSENT:
                    v = lookup(obj, prof.prompt_tokens_field)[1]
                if type(v) is int and v >= 0:
                    prompt = v
                elif v is not None:  # null or absent: the endpoint gave no usage; count 0
                    n, why = token_count(v)
                    if n is None:
                        raise BadLine(f"{prof.prompt_tokens_field} {why}")
                    prompt = n
            if check:
                self._validate(prof, obj, arrays, buf, full, tokens, length)
            if prof.text_field is not None:
                record_texts = texts_of(prof, obj)
                record_reasoning = reasoning_of(prof, obj) if prof.reasoning_keys else []
        # Counted from here on: the line is a record.
        state.lines += 1
        state.records += 1
        if check:
            state.validated += 1
        if prof is not None:
            state.formats[prof.name] = state.formats.get(prof.name, 0) + 1
            state.prompt_tokens += prompt
            state.completion_tokens += tokens
            found, ident = lookup(obj, prof.id_field)
            if found:
                key = _id_key(ident)
                if len(state.duplicate_ids) < MAX_DUPLICATE_IDS and key in state.ids:
                    state.duplicate_ids.append(key)
                state.ids.add(key)
            fr = finish_value(prof, obj)
            if fr is not None:
                state.finish[fr] = state.finish.get(fr, 0) + 1
        else:
            state.formats["unknown"] = state.formats.get("unknown", 0) + 1
        state.kinds[kind] += 1
        if exp is None and state.first_unknown is None:
            state.first_unknown = (state.lines, off, list(obj))
        if kind != "current" and state.first_offending is None and exp is not None:
            missing, extra = differing_keys(exp, list(obj))
            state.first_offending = {
                "line": state.lines,
                "offset": off,
                "format": prof.name if prof is not None else None,
                "missing": missing,
                "extra": extra,
            }
        if (
            prof is not None
            and exp is not None
            and record_texts is None
            and e - s <= TEMPLATE_LINE_MAX
        ):
            tpl = state.templates.get(shape, _ABSENT)
            if tpl is _ABSENT and len(state.templates) < MAX_TEMPLATES:
                tpl = state.templates[shape] = _Template.build(
                    prof, kind, obj, arrays, bytes(buf[s:e])
                )
            if isinstance(tpl, _Template):
                state.template = tpl
        if record_texts is not None:
            state.texts_records += 1
            if self._want_texts:
                state.texts.extend(record_texts)
                state.reasoning.extend(record_reasoning)
                state.text_bytes += sum(len(t) for t in record_texts)
                state.text_bytes += sum(len(t) for t in record_reasoning)
                return state.text_bytes >= self.max_text_bytes
        return False

    def _validate(
        self,
        prof: Profile,
        obj: dict[str, Any],
        arrays: dict[str, tuple[int, int]],
        buf: Any,
        full: bool,
        tokens: int,
        length: Callable[[str], int],
    ) -> None:
        """Full checks of one record (raises BadLine with an ``invalid record`` reason)."""
        try:
            for key in prof.big_lists:
                if key in arrays:
                    length(key)
                elif key in obj:
                    value = obj[key]
                    if not isinstance(value, list) or not set(map(type, value)) <= {int}:
                        raise BadLine(f"{key} is not a list of integers")
            if prof.check_list_field is not None and prof.check_list_field in obj:
                n = length(prof.check_list_field)
                if n != tokens:
                    raise BadLine(
                        f"{prof.tokens_field} is {tokens} but {prof.check_list_field} has {n} items"
                    )
            if prof.name == "speculators" and "input_ids" in obj and "loss_mask" in obj:
                a, b = length("input_ids"), length("loss_mask")
                if a != b:
                    raise BadLine(f"input_ids has {a} items but loss_mask has {b}")
            if prof.text_field is not None:
                found, v = lookup(obj, prof.text_field)
                if found and not isinstance(v, (str, list)):
                    raise BadLine(f"{prof.text_field} is neither text nor a list of messages")
        except BadLine as err:
            raise BadLine(f"invalid record: {err}") from None

    # ------------------------------------------------------------------ results

    def _result(
        self, path: str, state: _FileState, st: os.stat_result, size: int
    ) -> dict[str, Any]:
        exp = state.expected
        result = _empty_result(path, exp.name if exp is not None else None)
        fmt = max(state.formats, key=lambda k: state.formats[k]) if state.formats else None
        verdict, detail = _verdict(state)
        result.update(
            {
                "state": "ok",
                "format": fmt,
                "expected": exp.name if exp is not None else None,
                "verdict": verdict,
                "verdict_detail": detail,
                "records": state.records,
                "unique_ids": len(state.ids),
                "duplicates": state.ids.duplicates,
                # Named only when counted: an old id is known by its hash, the count exactly.
                "duplicate_ids": [shown_id(k) for k in state.duplicate_ids]
                if state.ids.duplicates
                else [],
                "failed_lines": state.failed,
                "prompt_tokens": state.prompt_tokens,
                "completion_tokens": state.completion_tokens,
                "token_source": exp.token_source if exp is not None else None,
                "texts_records": state.texts_records,
                "finish_reasons": dict(state.finish),
                "formats": dict(state.formats),
                "kinds": dict(state.kinds),
                "first_offending": state.first_offending,
                "bad_lines": list(state.bad),
                "bad_lines_total": state.bad_total,
                "partial_tail_bytes": size - state.offset,
                "lines": state.lines,
                "offset": state.offset,
                "size": size,
                "mtime": st.st_mtime,
                "validated": state.validated,
                "finished": state.finished,
                "stream": self._follow.stream(state),
                "texts": list(state.texts),
                "reasoning_texts": list(state.reasoning),
            }
        )
        return result


_FAILED_LINE_PROFILES = {frozenset(p.failed_keys): p for p in PROFILES.values() if p.failed_keys}
"""The built-in formats by the keys of their failed-request line."""

_ALL_BIG_LISTS = tuple(dict.fromkeys(k for p in PROFILES.values() for k in p.big_lists))


def _id_fields(state: _FileState) -> list[str]:
    """The id fields of the formats a file's records were counted as."""
    profs = [PROFILES[name] for name in state.formats if name in PROFILES]
    exp = state.expected
    if exp is not None:
        profs.append(exp)
        if exp.legacy is not None:
            profs.append(PROFILES[exp.legacy])
    return list(dict.fromkeys(p.id_field for p in profs))


def _cut_keys(prof: Profile | None) -> list[tuple[str, bytes]]:
    """The big arrays the fast path cuts out of a line, with their quoted keys as bytes."""
    keys = prof.big_lists if prof is not None else _ALL_BIG_LISTS
    if prof is not None and prof.legacy is not None:
        keys = keys + PROFILES[prof.legacy].big_lists
    return [(k, b'"' + k.encode() + b'"') for k in keys]


def _count_items(buf: Any, lb: int, rb: int) -> int:
    """Items of an integer array without parsing it: commas + 1, or 0 when empty."""
    commas = buf.count(b",", lb, rb)
    if commas:
        return int(commas) + 1
    return 0 if not bytes(buf[lb + 1 : rb]).strip() else 1


def _verdict(state: _FileState) -> tuple[str, str | None]:
    exp = state.expected
    c, lg, o = state.kinds["current"], state.kinds["legacy"], state.kinds["other"]
    first_bad = state.bad[0] if state.bad else None
    bad_note = None
    if first_bad is not None:
        plural = "" if state.bad_total == 1 else "s"
        bad_note = (
            f"{state.bad_total} bad line{plural}, first at line {first_bad['line']} "
            f"(offset {first_bad['offset']}): {first_bad['reason']}"
        )
    if c + lg + o == 0:
        return ("corrupt", bad_note) if state.bad_total else ("empty", None)
    off = state.first_offending
    name = exp.name if exp is not None else "a known format"
    if (c > 0) + (lg > 0) + (o > 0) > 1 and off is not None:
        what = off["format"] or "unknown format"
        missing = ", ".join(off["missing"]) or "none"
        extra = ", ".join(off["extra"]) or "none"
        detail = (
            f"line {off['line']} (offset {off['offset']}) is {what}, not {name}: "
            f"missing {missing}; extra {extra}"
        )
        return "mixed", detail + ("; " + bad_note if bad_note else "")
    tail = "; " + bad_note if bad_note else ""
    if lg:
        return "legacy", f"records are {exp.legacy if exp else '?'}, expected {name}" + tail
    if o:
        detail = f"records do not match {name}"
        if off is not None:
            missing = ", ".join(off["missing"]) or "none"
            extra = ", ".join(off["extra"]) or "none"
            detail += f": missing {missing}; extra {extra}"
        return "unknown", detail + tail
    if state.bad_total:
        return "corrupt", bad_note
    return "current", None


def _empty_result(path: str, fmt: str | None) -> dict[str, Any]:
    return {
        "path": path,
        "state": "ok",
        "error": None,
        "format": fmt,
        "expected": fmt,
        "verdict": "empty",
        "verdict_detail": None,
        "records": 0,
        "unique_ids": 0,
        "duplicates": 0,
        "duplicate_ids": [],
        "failed_lines": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "token_source": None,
        "texts_records": 0,
        "finish_reasons": {},
        "formats": {},
        "kinds": {"current": 0, "legacy": 0, "other": 0},
        "first_offending": None,
        "bad_lines": [],
        "bad_lines_total": 0,
        "partial_tail_bytes": 0,
        "lines": 0,
        "offset": 0,
        "size": 0,
        "mtime": None,
        "validated": 0,
        "finished": False,
        "stream": None,
        "texts": [],
        "reasoning_texts": [],
        "texts_more": False,
        "companions": [],
        "rescan_reason": None,
        "bytes_read": 0,
        "scan_seconds": 0.0,
    }
