"""What an OpenAI-compatible server answers, decoded lean, and the record kept per response.

Responses are decoded by a typed ``msgspec`` decoder that skips every field it does not need.
"""

from __future__ import annotations

import msgspec


class Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None


class Message(msgspec.Struct):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None


class Choice(msgspec.Struct):
    message: Message | None = None
    delta: Message | None = None
    text: str | None = None
    finish_reason: str | None = None


class Response(msgspec.Struct):
    choices: list[Choice] = []
    usage: Usage | None = None


class Model(msgspec.Struct):
    id: str


class Models(msgspec.Struct):
    data: list[Model] = []


decode_response = msgspec.json.Decoder(Response).decode
decode_models = msgspec.json.Decoder(Models).decode


def text_of(m: Message | None) -> str:
    if m is None:
        return ""
    parts = [x for x in (m.reasoning_content, m.reasoning, m.content) if x]
    return parts[0] if len(parts) == 1 else "".join(parts)


class Done(msgspec.Struct, array_like=True):
    """One successful request (kept small: the timed window appends one per response)."""

    latency: float
    prompt: int
    """Index of the prompt sent."""
    prompt_tokens: int | None
    completion_tokens: int | None
    cost: float | None
    text: str | None
    finish: str | None
    ttft: float | None = None
    gaps: list[float] | None = None
