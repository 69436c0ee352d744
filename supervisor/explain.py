"""What a record format reads from each of a file's first lines, and why (``scan --explain``).

For describing a new generation script: each line is parsed as the scanner parses it and read with
the scanner's own functions (``agent.formats``), and the answer says, field by field, what was
found (the id, the completion tokens or the messages the tokenizer counts, the prompt tokens, the
finish reason) and why a value is not taken, so a ``[formats.NAME]`` table can be checked
against a real file before a run depends on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisor.agent import formats
from supervisor.agent.formats import Profile
from supervisor.agent.scan import BadLine, strict_json

EXPLAIN_RECORDS = 5
"""Records explained per file (lines that are not records are explained too, and not counted)."""
MAX_LINES = 50
"""Lines read at most, records or not."""
TEXT_CHARS = 60
"""Characters of a text shown."""


def explain_file(
    path: str, fmt: str | None, profile: Mapping[str, Any] | None, records: int = EXPLAIN_RECORDS
) -> dict[str, Any]:
    """``{"path", "format", "lines": [...]}``: the first ``records`` records of ``path`` (and the
    lines among them that are not records), each with what its format reads from it."""
    expected = None
    if fmt is not None:
        expected = formats.get_profile(fmt, profile if fmt not in formats.PROFILES else None)
    lines: list[dict[str, Any]] = []
    offset = 0
    counted = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if counted >= records or number > MAX_LINES:
                break
            entry = _explain_line(raw, expected)
            lines.append({"line": number, "offset": offset, **entry})
            offset += len(raw)
            counted += entry["kind"] == "record"
    return {"path": path, "format": expected.name if expected else None, "lines": lines}


def _explain_line(raw: bytes, expected: Profile | None) -> dict[str, Any]:
    if not raw.endswith(b"\n"):
        return {"kind": "partial", "why": "no newline yet: a line being written, not counted"}
    if not raw.strip():
        return {"kind": "empty", "why": "an empty line: skipped"}
    try:
        obj = strict_json(raw)
    except BadLine as e:
        return {"kind": "bad", "why": str(e)}
    if not isinstance(obj, dict):
        return {"kind": "bad", "why": f"not a JSON object ({type(obj).__name__})"}
    if len(obj) == 1 and "finished" in obj and (expected is None or expected.end_marker):
        return {"kind": "end marker", "why": "the client's final line: not a record"}
    prof = expected if expected is not None else formats.detect(list(obj))
    if prof is None:
        return {
            "kind": "unknown",
            "why": f"no format's keys: the record has {', '.join(obj)}; pass --format NAME",
        }
    if formats.is_failed_line(prof, obj):
        return {
            "kind": "failed request",
            "why": f"only {', '.join(prof.failed_keys)}: a failed row of the input, not a record",
        }
    missing, extra = formats.differing_keys(prof, list(obj))
    return {
        "kind": "record",
        "format": prof.name,
        "of_format": formats.matches(prof, list(obj)),
        "missing_keys": missing,
        "extra_keys": extra,
        "fields": {
            "id": _id(prof, obj),
            "tokens": _tokens(prof, obj),
            "prompt_tokens": _count_field(prof.prompt_tokens_field, obj, "prompt_tokens_field"),
            "finish_reason": _finish(prof, obj),
        },
    }


def _id(prof: Profile, obj: Mapping[str, Any]) -> dict[str, Any]:
    found, value = formats.lookup(obj, prof.id_field)
    if not found:
        return {"field": prof.id_field, "found": False, "why": "absent: no id to count it by"}
    return {"field": prof.id_field, "found": True, "value": value}


def _count_field(field: str | None, obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    if field is None:
        return {"field": None, "why": f"no {key}: not read"}
    found, value = formats.lookup(obj, field)
    if not found or value is None:
        return {"field": field, "found": found, "read_as": 0, "why": "absent or null: counted 0"}
    n, why = formats.token_count(value)
    out: dict[str, Any] = {"field": field, "found": True, "value": value, "read_as": n}
    if why is not None:
        out["why"] = f"{why}: a bad line"
    return out


def _tokens(prof: Profile, obj: Mapping[str, Any]) -> dict[str, Any]:
    source = prof.token_source
    if source == "field":
        return {"source": "field", **_count_field(prof.tokens_field, obj, "tokens_field")}
    if source == "list":
        field = prof.tokens_list_field
        found, value = formats.lookup(obj, field or "")
        if not isinstance(value, list):
            return {"source": "list", "field": field, "found": found, "why": "not a list"}
        return {"source": "list", "field": field, "found": True, "read_as": len(value)}
    return {"source": "tokenizer", "field": prof.text_field, **_texts(prof, obj)}


def _texts(prof: Profile, obj: Mapping[str, Any]) -> dict[str, Any]:
    found, value = formats.lookup(obj, prof.text_field or "")
    if not found:
        return {"found": False, "why": "absent: nothing to count"}
    if isinstance(value, str):
        return {"found": True, "texts": [{"counted": True, "text": _short(value)}]}
    if not isinstance(value, list):
        return {"found": True, "why": "neither text nor a list of messages: a bad line"}
    counted = formats.texts_of(prof, obj) or []
    reasoning = formats.reasoning_of(prof, obj)
    picked = formats.counted_messages(prof, obj, value)
    items = []
    for i, m in enumerate(value):
        role = m.get("role") if isinstance(m, dict) else None
        item: dict[str, Any] = {"index": i, "role": role}
        text = m.get("content") if isinstance(m, dict) else m
        item["text"] = _short(text) if isinstance(text, str) else None
        item["counted"] = any(m is p for p in picked) and isinstance(text, str)
        item["why"] = _why(prof, m, item["counted"])
        if item["counted"] and isinstance(m, dict):
            key = next((k for k in prof.reasoning_keys if isinstance(m.get(k), str)), None)
            if key is not None:
                item["reasoning"] = {"key": key, "text": _short(m[key])}
        items.append(item)
    return {"found": True, "messages": items, "counted": len(counted), "reasoning": len(reasoning)}


def _why(prof: Profile, message: Any, counted: bool) -> str:
    """Why a message of a record's ``text_field`` is counted or not."""
    role = prof.text_role
    roles = (role,) if isinstance(role, str) else role
    if counted:
        return "counted" if roles is None else f"counted: its role is {' or '.join(roles)}"
    if not isinstance(message, dict) and not isinstance(message, str):
        return "not a message"
    if isinstance(message, dict) and not isinstance(message.get("content"), str):
        return "no text content"
    if roles is not None and not (isinstance(message, dict) and message.get("role") in roles):
        return f"not counted: text_role is {' or '.join(roles)}"
    return (
        f"not counted: the record has no {prof.last_turn_without!r}, so only its last "
        "such turn was generated"
    )


def _finish(prof: Profile, obj: Mapping[str, Any]) -> dict[str, Any]:
    field = prof.finish_reason_field
    if field is None:
        return {"field": None, "why": "no finish_reason_field: not read"}
    found, value = formats.lookup(obj, field)
    out: dict[str, Any] = {
        "field": field,
        "found": found,
        "read_as": formats.finish_value(prof, obj),
    }
    if found:
        out["value"] = value
    if out["read_as"] is None:
        out["why"] = "absent or null: no finish reason counted"
    elif value is True or value is False or not found:
        out["why"] = "a flag: read as its name when true, else complete"
    return out


def _short(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= TEXT_CHARS else one[: TEXT_CHARS - 3] + "..."
