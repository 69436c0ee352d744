"""Secret masking: argv, URL and free text with key-shaped values replaced by ``***``.

Standard library only, Python >= 3.8 (runs on the host, and the laptop masks with the same code).
Masking happens on the host before anything leaves it; the laptop masks again what it shows or
logs, adding the secret values it knows (``secrets``).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from supervisor.agent.protocol import MASK

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

# A flag or variable is secret-named when its LAST word is one of these (``--api-key``,
# ``--hf-token``, ``OPENAI_API_KEY``, ``--db-password``); never for a word inside a longer name
# (``--token-budget``, ``--max-tokens``, ``--api-key-env`` and ``--tokenizer`` name public things,
# and a typo such as ``--token-buget`` stays visible).
_SECRET_LAST_WORDS = frozenset(
    (
        "key", "apikey", "token", "secret", "password", "passwd", "pass", "passphrase",
        "credential", "credentials", "creds", "auth", "authorization", "bearer", "cookie",
        "signature",
    )
)  # fmt: skip
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
MIN_SECRET_LEN = 8
"""Secret values shorter than this are not registered nor masked inside text (they would mask
words); a short value is still masked where its name says it is a secret (``--api-key abc``)."""
_SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(sk-[A-Za-z0-9_\-]{12,}|sk_(live|test)_[A-Za-z0-9]{8,}|hf_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{16,}|xox[abpr]-[A-Za-z0-9\-]{8,}|AKIA[0-9A-Z]{16}"
    r"|eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,})"
)
_AUTH_HEADER = re.compile(r"(?i)((?:proxy-)?authorization\s*:\s*)(.+)")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{6,}")
# Query parameters whose name says credential: key, token, secret, pass(word)/passwd/pwd, auth
# (not author), sig(nature), credential, cookie, session.
_QUERY_NAMES = r"(?:key|token|secret|pass|pwd|auth(?!or)|sig|credential|cookie|session)"
_URL_QUERY_SECRET = re.compile(r"(?i)([?&][^=&#]*" + _QUERY_NAMES + r"[^=&#]*=)[^&#]*")


# Flags whose value is a secret although their last word is not a secret word, and the names a
# misspelled flag is compared with (its "did you mean" target decides: ``--api-ky`` is secret,
# ``--max-token`` and ``--token-buget`` are not).
SECRET_FLAG_NAMES = frozenset(
    (
        "k", "api-key", "apikey", "api-keys", "api-token", "auth-token", "access-token",
        "refresh-token", "hf-token", "token", "key", "secret", "client-secret", "secret-key",
        "access-key", "private-key", "password", "passwd", "credentials", "credentials-json",
        "credential", "service-account-json", "key-json", "auth", "authorization", "cookie",
        "bearer-token", "openai-api-key", "session-token", "aws-secret-access-key",
    )
)  # fmt: skip
_PUBLIC_FLAG_NAMES = frozenset(
    (
        "max-tokens", "max-new-tokens", "max-completion-tokens", "min-tokens", "max-total-tokens",
        "max-input-tokens", "max-output-tokens", "num-tokens", "tokens", "token-budget",
        "tokenizer", "tokenizer-path", "tokenizer-mode", "api-key-env", "key-env", "token-limit",
        "max-token-len", "author", "keep", "keys", "monkey",
    )
)  # fmt: skip
_COUNT_WORDS = frozenset(("max", "min", "num", "n", "total"))
_PLURAL_COUNTS = frozenset(("tokens", "keys", "passes"))
_STRONG_WORDS = frozenset(("apikey", "secret", "password", "passwd", "credential", "credentials"))
_NOT_A_VALUE_WORDS = frozenset(("env", "file", "path", "dir", "name", "id", "var", "len"))
CREDENTIAL_HEADERS = frozenset(
    (
        "authorization", "proxy-authorization", "x-api-key", "api-key", "apikey", "cookie",
        "set-cookie", "x-auth-token", "x-access-token", "x-goog-api-key", "x-token", "x-secret",
        "openai-api-key", "x-amz-security-token",
    )
)  # fmt: skip
_HEADER_FLAGS = frozenset(("-h", "--header", "--headers", "--http-header", "--extra-header"))
_AUTH_SCHEME = re.compile(r"(?i)^(bearer|basic|token|digest|apikey)\s+")


def _normal_name(name: str) -> str:
    return "-".join(
        w.lower() for w in re.split(r"[-_.\s]+", _CAMEL.sub("_", name.strip().lstrip("-"))) if w
    )


def _is_secret_name(name: str) -> bool:
    """True when ``name`` (a flag, a variable, a JSON key) names a secret. Words are split on
    ``-``, ``_``, ``.`` and camelCase. A known secret flag (``SECRET_FLAG_NAMES``) is secret, a
    known public one is not; a misspelled name takes the class of the name it is closest to (the
    "did you mean" target: ``api-ky`` is secret, ``max-token`` is not); otherwise the name is
    secret when its last word is a secret word or a strong secret word names its value
    (``--credentials-json``, not ``--api-key-env`` nor ``--password-file``)."""
    norm = _normal_name(name)
    if not norm:
        return False
    if norm in SECRET_FLAG_NAMES or norm in CREDENTIAL_HEADERS:
        return True
    if norm in _PUBLIC_FLAG_NAMES:
        return False
    close = difflib.get_close_matches(
        norm, sorted(SECRET_FLAG_NAMES | _PUBLIC_FLAG_NAMES), n=1, cutoff=0.85
    )
    if close:
        return close[0] in SECRET_FLAG_NAMES
    words = norm.split("-")
    if words[0] in _COUNT_WORDS:
        return False
    if words[-1] in _SECRET_LAST_WORDS:
        return True
    if words[-1] not in _PLURAL_COUNTS and difflib.get_close_matches(
        words[-1], sorted(_SECRET_LAST_WORDS), n=1, cutoff=0.8
    ):
        return True  # a misspelled secret word: --my-api-ky, --hf-tokn, --db-pasword
    return words[-1] not in _NOT_A_VALUE_WORDS and any(w in _STRONG_WORDS for w in words)


def is_secret_flag(name: str) -> bool:
    """True when the value of flag (or key) ``name`` is a secret (see ``_is_secret_name``)."""
    return _is_secret_name(name)


_ENV_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE")
_ENV_PUBLIC = re.compile(
    r"(_TOKENS$|MAX_TOKENS|TOKENIZER|^SSH_AUTH_SOCK$|^XAUTHORITY$|KEYBOARD|AUTHOR|^RUNWATCH_LAUNCH$"
    r"|_(ENV|FILE|PATH|DIR|SOCK|HOST|PORT|USER|NAME|EMAIL|TYPE|MODE|REGION|ID)$)"
)


def is_secret_env_name(name: str) -> bool:
    """True for a credential-named variable: its name holds KEY, TOKEN, SECRET, PASSWORD,
    CREDENTIAL, AUTH or COOKIE (any case), but not ``*_TOKENS``, ``MAX_TOKENS``, a tokenizer
    setting, an author, or a name that holds a path or a public part (``*_FILE``, ``*_PATH``,
    ``*_ENV``, ``*_HOST``, ``*_USER``, ``*_ID``..., ``SSH_AUTH_SOCK``)."""
    upper = name.upper()
    return any(w in upper for w in _ENV_SECRET_WORDS) and not _ENV_PUBLIC.search(upper)


_REGISTERED: set[str] = set()
"""Every secret value this process has seen (see :func:`register`); masked in all it masks."""
_SORTED: list[str] = []
"""``_REGISTERED``, longest first (kept by :func:`register`)."""


def register(values: Iterable[str]) -> None:
    """Remember ``values`` as secrets: from now on every ``mask_*`` of this process masks them
    wherever they occur. Values shorter than ``MIN_SECRET_LEN`` are not registered."""
    for v in values:
        if isinstance(v, str) and len(v.strip()) >= MIN_SECRET_LEN:
            v = v.strip()
            _REGISTERED.add(v)
            quoted = json.dumps(v)[1:-1]  # as it appears inside a JSON string
            if quoted != v:
                _REGISTERED.add(quoted)
    if len(_SORTED) != len(_REGISTERED):
        _SORTED[:] = sorted(_REGISTERED, key=len, reverse=True)


def mask_registered(text: str) -> str:
    """``text`` with every registered value replaced by ``***`` (values only, no patterns: how a
    whole reply or output line is masked as it leaves this process)."""
    for s in _SORTED:
        if s in text:
            text = text.replace(s, MASK)
    return text


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def mask_json_text(text: str) -> str:
    """JSON text with every registered value masked inside its strings (keys and values), never
    in its numbers or punctuation, so the text stays valid JSON of the same shape."""
    if not _REGISTERED:
        return text
    values = [s for s in _SORTED if s in text]
    if not values:
        return text

    def one(m: re.Match[str]) -> str:
        lit = m.group(0)
        for s in values:
            if s in lit:
                lit = lit.replace(s, MASK)
        return lit

    return _JSON_STRING.sub(one, text)


def registered() -> list[str]:
    """The registered values, longest first (so a value that contains another is masked whole)."""
    return list(_SORTED)


_NUMBER = re.compile(r"^\s*[-+]?[0-9_.,eE]+\s*$")
"""A count or a size (``TOKEN_BUDGET=10000000``): never registered from a variable."""


def env_secret_values(env: Mapping[str, str]) -> list[str]:
    """The secret values of an environment: credential-named variables' values (not paths nor
    numbers), and the secrets inside any value (URL credentials, JSON or ``k=v`` credential
    keys)."""
    out: list[str] = []
    for name, value in env.items():
        if not value:
            continue
        if is_secret_env_name(name) and not value.startswith("/") and not _NUMBER.match(value):
            out.append(value)
            out.extend(_scheme_stripped(value))
        out.extend(value_secrets(value))
    return [v for v in out if len(v) >= MIN_SECRET_LEN]


def register_environ(env: Mapping[str, str] | None = None) -> None:
    """Register the secret values of ``env`` (default: this process's environment)."""
    register(env_secret_values(os.environ if env is None else env))


def _scheme_stripped(value: str) -> list[str]:
    m = _AUTH_SCHEME.match(value.strip())
    return [value.strip()[m.end() :]] if m else []


_KV = re.compile(r"""([A-Za-z_][\w.\-]*)\s*[=:]\s*("[^"]*"|'[^']*'|[^\s,;&]+)""")
_URL_CRED = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://([^/\s@]+)@")
_URL_QUERY_VALUE = re.compile(r"(?i)[?&][^=&#\s]*" + _QUERY_NAMES + r"[^=&#\s]*=([^&#\s]+)")


def value_secrets(value: str) -> list[str]:
    """The secrets inside one value: URL userinfo (``https://user:PASS@host``, ``https://TOKEN@``)
    and query secrets, credential keys of a JSON object (``{"client_secret": "K"}``) and of
    ``k=v`` lists (``user=a;password=K``)."""
    out: list[str] = []
    for m in _URL_CRED.finditer(value):
        user, sep, password = m.group(1).partition(":")
        out.append(password if sep else user)
    out.extend(m.group(1) for m in _URL_QUERY_VALUE.finditer(value))
    stripped = value.strip()
    if stripped[:1] in ("{", "["):
        with contextlib.suppress(ValueError):
            out.extend(_json_secrets(json.loads(stripped)))
    for m in _KV.finditer(value):
        if _is_secret_name(m.group(1)):
            v = m.group(2).strip("'\"")
            out.append(v)
            out.extend(_scheme_stripped(v))
    return [v for v in out if len(v) >= MIN_SECRET_LEN]


def _json_secrets(obj: object) -> list[str]:
    out: list[str] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, str) and isinstance(k, str) and _is_secret_name(k):
                out.append(v)
                out.extend(_scheme_stripped(v))
            elif isinstance(v, str):
                out.extend(value_secrets(v))
            else:
                out.extend(_json_secrets(v))
    elif isinstance(obj, list):
        for v in obj:
            out.extend(_json_secrets(v))
    return out


def _header_secret(value: str) -> list[str]:
    """The credential of a header argument (``x-api-key: K``, ``Authorization=Bearer K``)."""
    name, sep, rest = value.partition(":")
    if not sep or "=" in name:
        name, sep, rest = value.partition("=")
    if sep and (name.strip().lower() in CREDENTIAL_HEADERS or _is_secret_name(name)):
        rest = rest.strip()
        return [rest, *_scheme_stripped(rest)]
    return []


def _close_to(name: str, names: set[str]) -> bool:
    """``name`` is one of ``names`` or a misspelling of one."""
    return name in names or bool(difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.85))


def argv_secret_values(argv: Sequence[str], secret_flags: Iterable[str] = ()) -> list[str]:
    """The secret values of a command line: values of secret flags (``--api-key K``,
    ``--api-keys K1,K2`` and each of its items, ``-k K``, ``--credentials-json '{...}'``, and the
    ``secret_flags`` of the client's profile), of credential headers (``--header "x-api-key: K"``,
    ``-H 'Authorization: Bearer K'``), of credential-named ``NAME=value`` words, and the secrets
    inside any argument (URL credentials, JSON or ``k=v`` credential keys)."""
    extra = {_normal_name(f) for f in secret_flags}
    out: list[str] = []
    prev: str | None = None
    for arg in argv:
        value: str | None = None
        name = prev
        if arg.startswith("-") and len(arg) > 1:
            flag, eq, v = arg.partition("=")
            if eq:
                name, value = flag, v
            else:
                prev = arg
                continue
        elif prev is not None:
            value = arg
        elif "=" in arg and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", arg):
            n, _, v = arg.partition("=")
            if is_secret_env_name(n) or _is_secret_name(n):
                out.append(v)
        prev = None
        if value is not None and name is not None:
            if name.lower() in _HEADER_FLAGS:
                out.extend(_header_secret(value))
            elif _is_secret_name(name) or _close_to(_normal_name(name), extra):
                out.append(value)
                out.extend(_scheme_stripped(value))
                if "," in value:
                    out.extend(p.strip() for p in value.split(","))
        out.extend(value_secrets(arg))
    return [v for v in out if len(v) >= MIN_SECRET_LEN]


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
    values = known + registered() if _REGISTERED else known
    if len(values) > 1:
        values = sorted(set(values), key=len, reverse=True)
    for s in values:
        if len(s) >= MIN_SECRET_LEN and s in text:
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
    known = [s for s in (secrets or ()) if s] + argv_secret_values(argv)
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
