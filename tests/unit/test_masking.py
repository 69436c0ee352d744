"""Secrets masked in free text (log lines, messages): the values of secret flags and assignments
and secret-looking tokens, never ordinary words such as "token budget None" (E3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.agent import masking
from supervisor.hosts import Host

SECRET = "sk-or-v1-0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("export OPENAI_API_KEY=abc123xyz; go", "export OPENAI_API_KEY=***; go"),
        ("HF_TOKEN=hunter2 python run.py", "HF_TOKEN=*** python run.py"),
        ('DB_PASSWORD="a b c" next', 'DB_PASSWORD="***" next'),
        ("args: --api-key s3cr3t --model m", "args: --api-key *** --model m"),
        ("args: --hf-token=s3cr3t", "args: --hf-token=***"),
        ('config {"api_key": "s3cr3t", "model": "m"}', 'config {"api_key": "***", "model": "m"}'),
        ("opts {'hf_token': 'xyz', 'n': 1}", "opts {'hf_token': '***', 'n': 1}"),
        (f"using key {SECRET} now", "using key *** now"),
        ("Authorization: Bearer abcdefghijkl", "Authorization: ***"),
        ("retrying with Bearer abcdefghijkl", "retrying with Bearer ***"),
        ("POST https://u:pw@h/v1?api_key=abc&x=1", "POST https://u:***@h/v1?api_key=***&x=1"),
    ],
)
def test_mask_text(text: str, masked: str) -> None:
    assert masking.mask_text(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "token budget None",
        "B2: token budget None, 10.7 M tokens so far",
        "max_tokens=8192 --token-budget 10000000 --max-tokens 5",
        "the key is in the token file; auth ok",
        "author=Bob tokenizer=/models/kimi",
    ],
)
def test_ordinary_words_are_not_secrets(text: str) -> None:
    assert masking.mask_text(text) == text


def test_known_secrets_are_masked_wherever_they_appear() -> None:
    assert masking.mask_text("key was hunter22!", ["hunter22"]) == "key was ***!"
    # shorter than MIN_SECRET_LEN: it would mask ordinary words, so only a name masks it
    assert masking.mask_text("key was hunter2!", ["hunter2"]) == "key was hunter2!"


async def test_a_log_tail_is_masked_but_keeps_its_words(host: Host, tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "starting: token budget None\n"
        "env OPENAI_API_KEY=abc123xyz TOKEN=t0k3n\n"
        f"argv --api-key {SECRET} --token-budget 5\n"
    )
    reply = await host.request("tail_log", {"path": str(log), "lines": 10})
    assert reply["lines"] == [
        "starting: token budget None",
        "env OPENAI_API_KEY=*** TOKEN=***",
        "argv --api-key *** --token-budget 5",
    ]


@pytest.mark.parametrize("name", ["auth", "pwd", "passwd", "password", "X-Auth", "session_id"])
def test_a_credential_named_query_parameter_is_masked_in_argv_and_text(name: str) -> None:
    url = f"http://127.0.0.1:9/v1?{name}=QueryValue55zz&author=bob&n=1"
    shown = f"http://127.0.0.1:9/v1?{name}=***&author=bob&n=1"
    assert masking.mask_argv(["--api-base", url]) == ["--api-base", shown]
    assert masking.mask_text(f"GET {url} failed") == f"GET {shown} failed"
