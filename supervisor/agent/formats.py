"""Record formats as profiles: what a line of a dataset file holds and where its numbers are.

Standard library only, Python >= 3.8: this module is shipped to GPU hosts as part of the agent.

A :class:`Profile` names the id field, the completion-token source (a field, the length of a list
field, or a text the laptop counts with a tokenizer), the prompt-token and finish-reason fields, the
keys every record has, and the big integer arrays the scanner skips on its fast path. Built-in
profiles:

``raw``
    run_inference.py: ``sample_id, output_ids, prompt_tokens, completion_tokens, finish_reason``.
    Tokens come from ``completion_tokens``, checked against ``len(output_ids)`` on validated
    records.
``raw-legacy``
    The older run_inference.py format: ``text`` instead of ``output_ids``. ``legacy`` of ``raw``.
``specforge``
    SpecForge regenerated conversations: ``id, conversations[{role, content}]`` and, since late
    2025, ``status`` (older records have none, and only their last assistant turn was generated:
    the earlier ones are the input's); the assistant contents are counted with the
    tokenizer, their reasoning apart (``reasoning_content``, or ``thinking`` as the script wrote
    it from late 2025 to March 2026). Error and skipped files lie beside it.
``modelopt``
    Model-Optimizer ``server_generate`` output: ``conversation_id, conversations``, optional
    ``truncated``; with ``--log_empty_conversations`` a failed request is a line holding only
    ``{"conversation_id": N}`` (a failed row: the script's resume skips it) and the file ends with
    a ``{"finished": true}`` line (a marker, not a record).
``speculators``
    vLLM speculators regeneration: ``id, input_ids, loss_mask, text, metadata`` with
    ``metadata.finish_reason`` and ``metadata.usage.{prompt,completion}_tokens``.

User profiles come from the config's ``[formats.NAME]`` tables as plain dicts
(:func:`profile_from_dict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BUILTIN_FORMATS = ("raw", "raw-legacy", "specforge", "modelopt", "speculators")
"""Names of the built-in profiles (the config accepts these plus its own ``[formats.NAME]``)."""


class Profile:
    """One record format. Field names may be dotted paths into nested objects (``metadata.x``)."""

    __slots__ = (
        "big_lists",
        "check_list_field",
        "companions",
        "end_marker",
        "failed_keys",
        "finish_reason_field",
        "id_field",
        "last_turn_without",
        "legacy",
        "name",
        "optional",
        "prompt_tokens_field",
        "reasoning_keys",
        "required",
        "signature",
        "text_field",
        "text_role",
        "tokens_field",
        "tokens_list_field",
    )

    def __init__(
        self,
        name: str,
        id_field: str,
        *,
        tokens_field: str | None = None,
        tokens_list_field: str | None = None,
        text_field: str | None = None,
        text_role: str | tuple[str, ...] | None = None,
        prompt_tokens_field: str | None = None,
        finish_reason_field: str | None = None,
        check_list_field: str | None = None,
        required: tuple[str, ...] = (),
        optional: tuple[str, ...] = (),
        signature: tuple[str, ...] = (),
        big_lists: tuple[str, ...] = (),
        legacy: str | None = None,
        end_marker: str | None = None,
        companions: tuple[str, ...] = (),
        reasoning_keys: tuple[str, ...] = (),
        failed_keys: tuple[str, ...] = (),
        last_turn_without: str | None = None,
    ) -> None:
        self.name = name
        self.id_field = id_field
        self.tokens_field = tokens_field
        """Field holding the completion-token count."""
        self.tokens_list_field = tokens_list_field
        """Field holding a list whose length is the completion-token count."""
        self.text_field = text_field
        """Field holding text the laptop counts with the tokenizer (or a list of messages)."""
        self.text_role = text_role
        """When ``text_field`` holds messages: the role (or roles) whose ``content`` is counted;
        messages of other roles (prompts, reasoning or tool turns) are not."""
        self.prompt_tokens_field = prompt_tokens_field
        self.finish_reason_field = finish_reason_field
        self.check_list_field = check_list_field
        """A list whose length must equal the token count on validated records."""
        self.required = required
        """Top-level keys every record of this format has."""
        self.optional = optional
        """Top-level keys a record may have without being of another format."""
        self.signature = signature or required
        """Top-level keys that identify the format (a record with them is of this format)."""
        self.big_lists = big_lists
        """Top-level integer arrays the scanner's fast path skips instead of parsing."""
        self.legacy = legacy
        """Name of the older format of the same writer (its records give the verdict ``legacy``)."""
        self.end_marker = end_marker
        """Top-level key of a final marker line (``{"finished": true}``), not a record."""
        self.companions = companions
        """Words naming files beside the data file that hold failed or skipped prompts."""
        self.reasoning_keys = reasoning_keys
        """Keys of a counted message's reasoning text (``reasoning_content``), counted apart: the
        first one a message has (a writer stores it under one of them)."""
        self.last_turn_without = last_turn_without
        """A key whose absence means only the LAST counted message of a record was generated
        (SpecForge before ``status``: earlier assistant turns are the input's own)."""
        self.failed_keys = failed_keys
        """The exact top-level keys of a line that records a failed request (not a record: its
        id is a failed row of the input)."""

    @property
    def token_source(self) -> str:
        """``field``, ``list`` or ``tokenizer``: where completion tokens come from."""
        if self.tokens_field is not None:
            return "field"
        if self.tokens_list_field is not None:
            return "list"
        return "tokenizer"

    @property
    def known_keys(self) -> tuple[str, ...]:
        return self.required + tuple(k for k in self.optional if k not in self.required)

    def __repr__(self) -> str:
        return f"Profile({self.name!r})"


def _builtin() -> dict[str, Profile]:
    raw_keys = ("sample_id", "prompt_tokens", "completion_tokens", "finish_reason")
    return {
        "raw": Profile(
            "raw",
            "sample_id",
            tokens_field="completion_tokens",
            prompt_tokens_field="prompt_tokens",
            finish_reason_field="finish_reason",
            check_list_field="output_ids",
            required=("sample_id", "output_ids", *raw_keys[1:]),
            signature=("sample_id", "output_ids"),
            big_lists=("output_ids",),
            legacy="raw-legacy",
        ),
        "raw-legacy": Profile(
            "raw-legacy",
            "sample_id",
            tokens_field="completion_tokens",
            prompt_tokens_field="prompt_tokens",
            finish_reason_field="finish_reason",
            required=("sample_id", "text", *raw_keys[1:]),
            signature=("sample_id", "text"),
        ),
        "specforge": Profile(
            "specforge",
            "id",
            text_field="conversations",
            text_role="assistant",
            finish_reason_field="status",
            required=("id", "conversations"),
            optional=("status",),
            signature=("id", "conversations"),
            companions=("error", "skipped"),
            reasoning_keys=("reasoning_content", "thinking"),
            last_turn_without="status",
        ),
        "modelopt": Profile(
            "modelopt",
            "conversation_id",
            text_field="conversations",
            text_role="assistant",
            finish_reason_field="truncated",
            required=("conversation_id", "conversations"),
            optional=("truncated",),
            end_marker="finished",
            failed_keys=("conversation_id",),
        ),
        "speculators": Profile(
            "speculators",
            "id",
            tokens_field="metadata.usage.completion_tokens",
            prompt_tokens_field="metadata.usage.prompt_tokens",
            finish_reason_field="metadata.finish_reason",
            required=("id", "input_ids", "loss_mask", "text", "metadata"),
            signature=("id", "input_ids", "loss_mask"),
            big_lists=("input_ids", "loss_mask"),
        ),
    }


PROFILES: dict[str, Profile] = _builtin()
"""The built-in profiles by name."""


def profile_from_dict(name: str, d: Mapping[str, Any]) -> Profile:
    """A user profile from a config ``[formats.NAME]`` table given as a plain dict.

    Keys: ``id_field`` (required), exactly one of ``tokens_field`` / ``tokens_list_field`` /
    ``text_field``, optional ``text_role`` (a role or a list of roles: only their messages are
    counted), ``reasoning_keys``, ``prompt_tokens_field``, ``finish_reason_field``, ``required``.
    """
    if not isinstance(d.get("id_field"), str):
        raise ValueError(f"format {name}: id_field must be a string")

    def opt(key: str) -> str | None:
        v = d.get(key)
        if v is not None and not isinstance(v, str):
            raise ValueError(f"format {name}: {key} must be a string")
        return v

    def strings(key: str) -> tuple[str, ...]:
        v = d.get(key) or []
        if not isinstance(v, (list, tuple)) or not all(isinstance(k, str) for k in v):
            raise ValueError(f"format {name}: {key} must be a list of strings")
        return tuple(v)

    tokens_field = opt("tokens_field")
    tokens_list_field = opt("tokens_list_field")
    text_field = opt("text_field")
    prompt = opt("prompt_tokens_field")
    finish = opt("finish_reason_field")
    role = d.get("text_role")
    text_role = role if isinstance(role, str) or role is None else strings("text_role")
    named = [d["id_field"], tokens_field, tokens_list_field, text_field, prompt, finish]
    top = tuple(dict.fromkeys(f.split(".")[0] for f in named if f))
    req = strings("required")
    required = tuple(dict.fromkeys(k.split(".")[0] for k in req)) if req else top
    big = (tokens_list_field,) if tokens_list_field and "." not in tokens_list_field else ()
    return Profile(
        name,
        d["id_field"],
        tokens_field=tokens_field,
        tokens_list_field=tokens_list_field,
        text_field=text_field,
        text_role=text_role,
        prompt_tokens_field=prompt,
        finish_reason_field=finish,
        required=required,
        signature=required,
        big_lists=big,
        reasoning_keys=strings("reasoning_keys"),
    )


def get_profile(name: str, user: Mapping[str, Any] | None = None) -> Profile:
    """The profile called ``name``: a user profile when ``user`` is given, else a built-in one."""
    if user is not None:
        return profile_from_dict(name, user)
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            "unknown format {!r} (built-in: {})".format(name, ", ".join(BUILTIN_FORMATS))
        ) from None


# --------------------------------------------------------------------------- records


def lookup(record: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    """``(found, value)`` of a dotted path in a parsed record."""
    if "." not in path:
        return (True, record[path]) if path in record else (False, None)
    cur: Any = record
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


def matches(profile: Profile, keys: Any) -> bool:
    """True when a record with these top-level keys is of this format (its signature keys)."""
    return all(k in keys for k in profile.signature)


def detect(keys: Any, candidates: list[Profile] | None = None) -> Profile | None:
    """The most specific profile whose signature a record's keys carry, or None."""
    best: Profile | None = None
    for p in candidates if candidates is not None else list(PROFILES.values()):
        if matches(p, keys) and (best is None or len(p.signature) > len(best.signature)):
            best = p
    return best


def differing_keys(profile: Profile, keys: Any) -> tuple[list[str], list[str]]:
    """``(missing, extra)`` top-level keys of a record relative to a profile."""
    have = list(keys)
    missing = [k for k in profile.required if k not in have]
    known = profile.known_keys
    extra = [k for k in have if k not in known]
    return missing, extra


def token_count(value: Any) -> tuple[int | None, str | None]:
    """``(count, None)`` for a valid token count, ``(None, reason)`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str):
            return None, "is a string"
        if value is None:
            return None, "is null"
        return None, "is not an integer"
    if value < 0:
        return None, "is negative"
    return value, None


def finish_value(profile: Profile, record: Mapping[str, Any]) -> str | None:
    """A record's finish reason as a string (a boolean flag maps to its name or ``complete``)."""
    if profile.finish_reason_field is None:
        return None
    found, v = lookup(record, profile.finish_reason_field)
    if not found or v is None or v is False:
        # modelopt writes `truncated` only when true; absence means the answer is complete.
        return "complete" if isinstance(v, bool) or profile.name == "modelopt" else None
    if v is True:
        return profile.finish_reason_field.split(".")[-1]
    return v if isinstance(v, str) else str(v)


def texts_of(profile: Profile, record: Mapping[str, Any]) -> list[str] | None:
    """Texts the tokenizer must count for a record (None when the record has none readable)."""
    if profile.text_field is None:
        return None
    found, v = lookup(record, profile.text_field)
    if not found:
        return None
    if isinstance(v, str):
        return [v]
    if isinstance(v, list):
        out: list[str] = []
        for m in counted_messages(profile, record, v):
            if isinstance(m, str) and profile.text_role is None:
                out.append(m)
            elif isinstance(m, dict) and isinstance(m.get("content"), str):
                out.append(m["content"])
        return out
    return None


def counted_messages(profile: Profile, record: Mapping[str, Any], messages: list[Any]) -> list[Any]:
    """The messages of a record whose texts are counted: those of ``text_role`` (every one, or
    only the last when the record lacks ``last_turn_without``); without it, every message."""
    role = profile.text_role
    if role is None:
        picked = list(messages)
    else:
        roles = (role,) if isinstance(role, str) else role
        picked = [m for m in messages if isinstance(m, dict) and m.get("role") in roles]
    if profile.last_turn_without is not None and profile.last_turn_without not in record:
        return picked[-1:]
    return picked


def reasoning_of(profile: Profile, record: Mapping[str, Any]) -> list[str]:
    """Reasoning texts of a record's counted messages, for the tokenizer: per message the first of
    ``reasoning_keys`` it holds as text (one text per message, never counted twice)."""
    keys = profile.reasoning_keys
    if not keys or profile.text_field is None:
        return []
    found, v = lookup(record, profile.text_field)
    if not found or not isinstance(v, list):
        return []
    out: list[str] = []
    for m in counted_messages(profile, record, v):
        if not isinstance(m, dict):
            continue
        for key in keys:
            text = m.get(key)
            if isinstance(text, str):
                out.append(text)
                break
    return out


def is_failed_line(profile: Profile | None, record: Mapping[str, Any]) -> bool:
    """True when ``record`` is the profile's line for a failed request (only its id)."""
    return (
        profile is not None
        and bool(profile.failed_keys)
        and len(record) == len(profile.failed_keys)
        and all(k in record for k in profile.failed_keys)
    )
