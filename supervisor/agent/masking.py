"""Secret masking: argv, URL and free text with key-shaped values replaced by ``***``.

Standard library only, Python >= 3.8 (runs on the host, and the laptop masks with the same code).
Masking happens on the host before anything leaves it; the laptop masks again what it shows or
logs, adding the secret values it knows (``secrets``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from supervisor.agent.protocol import MASK

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

# A flag or variable is secret-named when its LAST word is one of these (``--api-key``,
# ``--hf-token``, ``OPENAI_API_KEY``, ``--db-password``); never for a word inside a longer name
# (``--token-budget``, ``--max-tokens``, ``--api-key-env`` and ``--tokenizer`` name public things,
# and a typo such as ``--token-buget`` stays visible).
_SECRET_LAST_WORDS = frozenset(
    (
        "key", "apikey", "token", "secret", "password", "passwd", "pass", "passphrase",
        "credential", "credentials", "auth", "authorization", "bearer", "cookie", "signature",
    )
)  # fmt: skip
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
MIN_SECRET_LEN = 4
"""Known secret values shorter than this are not masked inside text (they would mask words)."""
_SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(sk-[A-Za-z0-9_\-]{12,}|sk_(live|test)_[A-Za-z0-9]{8,}|hf_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{16,}|xox[abpr]-[A-Za-z0-9\-]{8,}|AKIA[0-9A-Z]{16}"
    r"|eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,})"
)
_AUTH_HEADER = re.compile(r"(?i)((?:proxy-)?authorization\s*:\s*)(.+)")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{6,}")
_URL_QUERY_SECRET = re.compile(r"(?i)([?&][^=&#]*(?:key|token|secret|password|sig)[^=&#]*=)[^&#]*")


def _is_secret_name(name: str) -> bool:
    """True when ``name`` (a flag, a variable, a JSON key) names a secret: its last word is a
    secret word. Words are split on ``-``, ``_``, ``.`` and camelCase."""
    words = [w for w in re.split(r"[-_.\s]+", _CAMEL.sub("_", name.strip().lstrip("-"))) if w]
    return bool(words) and words[-1].lower() in _SECRET_LAST_WORDS


def mask_value(text: str, secrets: Iterable[str] | None = None) -> str:
    """Mask the known ``secrets`` values, key-shaped substrings, ``Authorization:`` values, URL
    passwords and query secrets."""
    text = _mask_known(text, [s for s in (secrets or ()) if s])
    m = _AUTH_HEADER.search(text)
    if m:
        return text[: m.start(2)] + MASK
    text = _SECRET_VALUE.sub(MASK, text)
    text = _BEARER.sub(lambda mm: mm.group(1) + " " + MASK, text)
    if "://" in text:
        text = _mask_url(text)
    return text


# Free text: ``NAME=value`` and ``--name=value`` (value quoted or up to a space, comma, ``;``,
# ``&``), ``--name value``, ``"name": "value"`` (JSON, Python reprs), URLs inside the text.
_TEXT_AUTH = re.compile(r"(?i)((?:proxy-)?authorization\s*[:=]\s*)\S.*")
_TEXT_ASSIGN = re.compile(
    r"""(?<![\w.\-])((?:--?)?[A-Za-z_][\w\-]*)(\s*=\s*)("[^"]*"|'[^']*'|[^\s,;&]+)"""
)
_TEXT_FLAG = re.compile(r"(?<!\S)(--?[A-Za-z][\w\-]*)(\s+)(?!-)(\S+)")
_TEXT_QUOTED = re.compile(r"""(["'])([A-Za-z_][\w\-]*)\1(\s*:\s*)(["'])(.*?)\4""")
_TEXT_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>]+")


def mask_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """Free text (a log line, an error message) with its secrets masked.

    Masks the values of secret-named assignments and flags (``OPENAI_API_KEY=...``,
    ``TOKEN=...``, ``--api-key ...``, ``--hf-token=...``, ``"api_key": "..."``), key-shaped tokens
    anywhere (``sk-...``, ``hf_...``), ``Bearer``/``Basic`` tokens, ``Authorization`` values and
    URL credentials, and any of the given ``secrets`` wherever it appears. Words are never masked
    for what they are: ``token budget None``, ``max_tokens=8192`` and ``--token-budget 10`` stay
    as they are, and names never are (``--api-key-env OPENAI_API_KEY`` stays whole).
    """
    text = _mask_known(text, [s for s in (secrets or ()) if s])
    text = _TEXT_AUTH.sub(lambda m: m.group(1) + MASK, text)
    text = _TEXT_ASSIGN.sub(
        lambda m: m.group(1) + m.group(2) + MASK if _is_secret_name(m.group(1)) else m.group(0),
        text,
    )
    text = _TEXT_FLAG.sub(
        lambda m: m.group(1) + m.group(2) + MASK if _is_secret_name(m.group(1)) else m.group(0),
        text,
    )
    text = _TEXT_QUOTED.sub(
        lambda m: (
            m.group(0)[: m.start(5) - m.start(0)] + MASK + m.group(4)
            if _is_secret_name(m.group(2))
            else m.group(0)
        ),
        text,
    )
    text = _SECRET_VALUE.sub(MASK, text)
    text = _BEARER.sub(lambda mm: mm.group(1) + " " + MASK, text)
    if "://" in text:
        text = _TEXT_URL.sub(lambda m: _mask_url(m.group(0)), text)
    return text


def _mask_url(text: str) -> str:
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    netloc = parts.netloc
    if "@" in netloc:
        creds, _, hostpart = netloc.rpartition("@")
        user = creds.split(":", 1)[0]
        netloc = (user + ":" + MASK if ":" in creds else MASK) + "@" + hostpart
    query = _URL_QUERY_SECRET.sub(lambda mm: mm.group(1) + MASK, "?" + parts.query)[1:]
    if netloc == parts.netloc and query == parts.query:
        return text
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _mask_known(text: str, known: list[str]) -> str:
    for s in known:
        if len(s) >= MIN_SECRET_LEN:
            text = text.replace(s, MASK)
    return text


def mask_argv(argv: Sequence[str], secrets: Iterable[str] | None = None) -> list[str]:
    """argv with secrets replaced by ``***``; everything else unchanged.

    Masks the value of any flag whose name is a secret name (``--api-key X``, ``--api-key=X``,
    ``--hf-token X``, ``OPENAI_API_KEY=X``; never ``--token-budget``, ``--max-tokens`` or
    ``--api-key-env``: see ``_is_secret_name``), key-shaped values anywhere (``sk-...``,
    ``hf_...``), ``Authorization:`` header values, ``Bearer`` tokens and URL credentials; and any
    of the given ``secrets`` wherever it appears inside an argument. Names are never masked.
    """
    known = [s for s in (secrets or ()) if s]
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            mask_next = False
            if not arg.startswith("-") or arg == "-":
                out.append(MASK)
                continue
        if arg.startswith("-") and len(arg) > 1:
            name, eq, _value = arg.partition("=")
            if _is_secret_name(name):
                if eq:
                    out.append(name + "=" + MASK)
                else:
                    out.append(_mask_known(arg, known))
                    mask_next = True
                continue
        elif "=" in arg and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", arg):
            name, _, _value = arg.partition("=")
            if _is_secret_name(name):
                out.append(name + "=" + MASK)
                continue
        out.append(mask_value(arg, known))
    return out


def masked_equal(masked: Sequence[str], argv: Sequence[str]) -> bool:
    """``masked`` could be ``argv`` after masking: equal, except that each ``***`` in an element
    stands for a non-empty part of the same element (how a kill checks a listed, masked argv)."""
    if len(masked) != len(argv):
        return False
    for i, m in enumerate(masked):
        a = argv[i]
        if m == a:
            continue
        if MASK not in m:
            return False
        pattern = "(?s)" + ".+".join(re.escape(part) for part in m.split(MASK))
        if not re.fullmatch(pattern, a):
            return False
    return True
