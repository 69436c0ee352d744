"""What an OpenAI-compatible server answers, decoded lean, and the record kept per response.

Responses are decoded by a typed ``msgspec`` decoder that skips every field it does not need.
"""

from __future__ import annotations

import msgspec


class CostDetails(msgspec.Struct):
    upstream_inference_cost: float | None = None


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int | None = None
    """Prompt tokens the API served from its prompt cache (OpenAI; billed at its cached price)."""


class Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: PromptTokensDetails | None = None
    cost: float | None = None
    """OpenRouter's charge: with the user's own provider key (``is_byok``) only its fee."""
    is_byok: bool | None = None
    cost_details: CostDetails | None = None

    def true_cost(self) -> float | None:
        """What the request cost: ``cost``, plus, when the provider was paid with the user's own
        key (OpenRouter BYOK), ``cost_details.upstream_inference_cost`` (without BYOK the
        upstream cost is part of ``cost``)."""
        upstream = self.cost_details.upstream_inference_cost if self.cost_details else None
        if self.is_byok and upstream is not None:
            return (self.cost or 0.0) + upstream
        return self.cost

    def cached_tokens(self) -> int | None:
        """``prompt_tokens_details.cached_tokens`` (None: the server did not say)."""
        details = self.prompt_tokens_details
        return details.cached_tokens if details is not None else None


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


def reasoning_text(a: str | None, b: str | None) -> str:
    """The reasoning of a message that may carry it under two names (vLLM fills both
    ``reasoning`` and ``reasoning_content`` with the same text; SGLang only the second): once,
    when the two are equal or one holds the other."""
    if not a or not b:
        return a or b or ""
    if b in a:
        return a
    if a in b:
        return b
    return a + b


def text_of(m: Message | None) -> str:
    """The generated text of a message or a streamed delta: its reasoning, once, then its
    content."""
    if m is None:
        return ""
    return reasoning_text(m.reasoning_content, m.reasoning) + (m.content or "")


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
    cached_tokens: int | None = None
    """Of ``prompt_tokens``, those served from the API's prompt cache."""
