"""Secret masking: argv, URL and free text with key-shaped values replaced by ``***``.

Standard library only, Python >= 3.8 (runs on the host, and the laptop masks with the same code).
Masking happens on the host before anything leaves it; the laptop masks again what it shows or
logs, adding the secret values it knows (``secrets``).

Each rule is a class, not a list of examples: a name is secret by its words (``_is_secret_name``),
a header by what it is wherever it stands (``-H Name: K``, ``-H Name K``, ``Name: K`` alone), a
shell command line inside an argument by the same rules (``_shell_words``), a registered value
by its encodings too (``encoded_forms``: base64 at every alignment, percent, hex), a credential
name's value in free text by every form a log or a config dump gives it (``mask_text``), and a
provider's key by its shape (``_SECRET_VALUE``).
"""

from __future__ import annotations

import ast
import base64
import contextlib
import difflib
import functools
import json
import os
import posixpath
import re
import shlex
from typing import TYPE_CHECKING
from urllib.parse import quote, quote_plus, urlsplit, urlunsplit

from supervisor.agent.argflags import is_negative_number
from supervisor.agent.protocol import MASK

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

# A flag or variable is secret-named when one of its words (split on ``-``, ``_``, ``.`` and
# camelCase) is a credential word (``--api-key``, ``--db-pw``, ``--auth-header``,
# ``--client-secret``, ``OPENAI_API_KEY``), unless the name says it holds something about the
# credential rather than the credential: a count (``--max-tokens``, ``--num-tokens``: a first
# count word, or the credential word in the plural), a setting named by its last word
# (``--token-budget``, ``--api-key-env``, ``--password-file``, ``--session-dir``), or a switch
# named by its first word (``--keep-session``, ``--no-auth``, ``--skip-auth``).
_CREDENTIAL_WORDS = frozenset(
    (
        "key", "apikey", "token", "secret", "password", "passwd", "pwd", "pw", "pass",
        "passphrase", "passcode", "credential", "credentials", "creds", "auth", "authorization",
        "bearer", "cookie", "session", "signature", "jwt", "otp",
    )
)  # fmt: skip
_FUZZY_WORDS = _CREDENTIAL_WORDS - {"pw", "pwd", "jwt", "otp"}
"""Credential words recognised misspelt (``--hf-tokn``, ``--db-pasword``, ``--api-ky``); never
an abbreviation (``--tp`` is no ``otp``)."""
_MODEL_TOKEN_WORDS = frozenset(
    (
        "eos", "bos", "pad", "unk", "sep", "cls", "mask", "stop", "special", "image", "audio",
        "video", "think", "reasoning", "start", "end", "speculative", "draft", "chat", "tool",
        "vision", "placeholder", "sentinel", "added", "extra",
    )
)  # fmt: skip
"""Words that make the ``token`` after them a model's token (``--eos-token``,
``--speculative-token-map``), not a credential."""
_SWITCH_WORDS = frozenset(
    (
        "keep", "no", "enable", "disable", "skip", "with", "without", "require", "allow",
        "reuse", "print", "show", "log", "trust", "ignore", "strip", "persist",
    )
)  # fmt: skip
"""First words of an on/off switch. Not ``use``, ``new``, ``verify``: ``--use-auth-token K``,
``--new-password K`` and ``--verify-token K`` take a secret."""
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
MIN_SECRET_LEN = 8
"""Secret values shorter than this are not registered nor masked inside text (they would mask
words); a short value is still masked where its name says it is a secret (``--api-key abc``)."""
_SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])("
    # OpenAI, Anthropic, OpenRouter, DeepSeek (sk-proj-, sk-ant-api03-, sk-or-v1-), Stripe
    r"sk-[A-Za-z0-9_\-]{12,}|[sr]k_(?:live|test)_[A-Za-z0-9]{8,}|whsec_[A-Za-z0-9]{16,}"
    # Hugging Face, GitHub (classic and fine-grained), GitLab, Slack
    r"|hf_[A-Za-z0-9]{16,}|api_org_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{16,}"
    r"|github_pat_[A-Za-z0-9_]{22,}|gl(?:pat|dt|rt|ptt|cbt|soat|ffct|imt|oas)-[A-Za-z0-9_\-]{20,}"
    r"|xox[abposre]-[A-Za-z0-9\-]{8,}|xapp-[0-9]-[A-Za-z0-9\-]{8,}"
    # NVIDIA, Groq, Google, Replicate, Perplexity, xAI, Tavily, LangSmith, Fireworks, Together
    r"|nvapi-[A-Za-z0-9_\-]{20,}|gsk_[A-Za-z0-9]{20,}|AIza[0-9A-Za-z_\-]{30,}|ya29\.[\w\-]{20,}"
    r"|r8_[A-Za-z0-9]{20,}|pplx-[A-Za-z0-9]{20,}|xai-[A-Za-z0-9]{20,}|tvly-[A-Za-z0-9\-]{20,}"
    r"|lsv2_(?:pt|sk)_[A-Za-z0-9_]{20,}|fw_[A-Za-z0-9]{20,}|tgp_v1_[A-Za-z0-9_\-]{20,}"
    # npm, PyPI, DigitalOcean, Vault, SendGrid, Databricks
    r"|npm_[A-Za-z0-9]{30,}|pypi-AgE[A-Za-z0-9_\-]{20,}|do[por]_v1_[a-f0-9]{40,}"
    r"|hv[sbr]\.[A-Za-z0-9_\-]{20,}|SG\.[\w\-]{16,}\.[\w\-]{16,}|dapi[a-f0-9]{32}"
    # AWS access key ids, JWTs
    r"|(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}"
    r"|eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,})"
)
"""Key shapes that are secrets without a name: each provider's prefix and length (a git hash, a
uuid, a sha256 have none of them)."""
_AWS_CONTEXT = re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}|(?i:aws)")
_AWS_SECRET = re.compile(
    r"(?<![A-Za-z0-9+/])(?=[A-Za-z0-9+/]*[a-z])(?=[A-Za-z0-9+/]*[A-Z])(?=[A-Za-z0-9+/]*[0-9+/])"
    r"[A-Za-z0-9+/]{40}(?![A-Za-z0-9+/=])"
)
"""An AWS secret access key (40 base64 characters, mixed case), masked in a text that names AWS
or holds an access key id: alone, 40 such characters could be a path."""
_AUTH_HEADER = re.compile(r"(?i)((?:proxy-)?authorization\s*:\s*)(.+)")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{6,}")
# Query parameters whose name says credential: key, token, secret, pass(word)/passwd/pwd, auth
# (not author), sig(nature), credential, cookie, session.
_QUERY_NAMES = r"(?:key|token|secret|pass|pwd|auth(?!or)|sig|credential|cookie|session)"
_URL_QUERY_SECRET = re.compile(r"(?i)([?&#;][^=&#;]*" + _QUERY_NAMES + r"[^=&#;]*=)[^&#;]*")
"""A credential-named parameter of a URL's query or fragment (``#access_token=K&state=1``)."""


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
_RUNWATCH_OPTIONS = frozenset(
    ("set", "unset", "config", "yes", "json", "dry-run", "move-aside", "allow-change", "force")
)
"""runwatch's own options, in the commands it shows (``runwatch launch RUN --set K=V``): never
taken for a misspelling of a profile's secret flag (``--set`` is not ``--seat``)."""
_FUZZY_MIN_LEN = 5
"""A name shorter than this is a profile's secret flag only when written exactly: a typo of a
short name is as close to many public names (``seat``, ``set``, ``seed``)."""
_COUNT_WORDS = frozenset(("max", "min", "num", "n", "total", "count"))
_NOT_A_VALUE_WORDS = frozenset(
    (
        "env", "file", "path", "dir", "name", "id", "var", "len", "length", "budget", "limit",
        "count", "size", "rate", "ttl", "timeout", "type", "mode", "kind", "scheme", "format",
        "field", "column", "col", "url", "endpoint", "host", "port", "user", "username", "expiry",
        "expires", "lifetime", "interval", "retries", "per", "prefix", "suffix", "method",
        "ids", "map", "dtype", "index", "idx", "dim", "bytes", "config", "params", "options",
        "args", "kwargs", "flag", "flags", "names",
    )
)  # fmt: skip
CREDENTIAL_HEADERS = frozenset(
    (
        "authorization", "proxy-authorization", "x-api-key", "api-key", "apikey", "cookie",
        "set-cookie", "x-auth-token", "x-access-token", "x-goog-api-key", "x-token", "x-secret",
        "openai-api-key", "x-amz-security-token",
    )
)  # fmt: skip
_HEADER_FLAGS = frozenset(("-h", "--header", "--headers", "--http-header", "--extra-header"))


def _is_header_flag(name: str) -> bool:
    """A flag whose value is an HTTP header: ``-H``, ``--header``, or any flag whose last word is
    header(s) (``--add-header``, ``--proxy-header``)."""
    if name.lower() in _HEADER_FLAGS:
        return True
    return name.startswith("--") and _normal_name(name).split("-")[-1] in ("header", "headers")


_HEADER_ITEM = re.compile(r"^\s*([A-Za-z][\w\-]*)\s*:\s*\S")
"""An argument that is a header by itself (``X-Api-Key: K`` given to httpie or any tool)."""


def _credential_header_item(arg: str) -> bool:
    """``arg`` is ``Name: value`` for a known credential header (``X-Api-Key: K``)."""
    m = _HEADER_ITEM.match(arg)
    return m is not None and m.group(1).lower() in CREDENTIAL_HEADERS


_AUTH_SCHEME = re.compile(r"(?i)^(bearer|basic|token|digest|apikey)\s+")


def _normal_name(name: str) -> str:
    return "-".join(
        w.lower() for w in re.split(r"[-_.\s]+", _CAMEL.sub("_", name.strip().lstrip("-"))) if w
    )


def _credential_word(word: str) -> bool:
    """``word`` is a credential word (``pw``, ``token``), or a misspelling of one that keeps its
    first letter (``tokn``, ``pasword``; not ``bypass``); never its plural (``tokens``, ``keys``,
    ``sessions``, ``passes``: counts)."""
    if word in _CREDENTIAL_WORDS:
        return True
    for plural in ("s", "es"):
        if word.endswith(plural) and word[: -len(plural)] in _CREDENTIAL_WORDS:
            return False
    if word in ("author", "authors"):
        return False
    same_start = sorted(w for w in _FUZZY_WORDS if w[0] == word[:1])  # a typo keeps the start
    return len(word) >= 2 and bool(difflib.get_close_matches(word, same_start, n=1, cutoff=0.8))


_PROFILE_FLAGS: set[str] = set()
"""Secret flags of the clients' profiles (``secret_flags``) registered in this process
(:func:`register_secret_flags`): secret for every ``mask_*``, misspelt too."""


_SHORT_FLAGS: dict[str, set[str]] = {
    "mysql": {"-p"}, "mysqldump": {"-p"}, "mysqladmin": {"-p"}, "mariadb": {"-p"},
    "sshpass": {"-p"}, "redis-cli": {"-a"},
}  # fmt: skip
"""One-letter secret flags by the program or script name whose command lines they belong to
(``""``: every command line): the profiles' (:func:`register_secret_flags`), and those of
well-known tools (``mysql -pK``, ``redis-cli -a K``)."""


def register_secret_flags(flags: Iterable[str], scripts: Iterable[str] = ()) -> None:
    """Treat ``flags`` (a profile's ``secret_flags``, ``--org-token``) as secret flags in every
    ``mask_*`` of this process from now on: in a unit record, a lock or a listing as well as in
    the launch that named them. A one-letter flag (``-p``, its value attached too: ``-pK``) is
    secret only in a command line of one of ``scripts`` (the profile's), after the script's
    name: another command's ``-p`` is not its; with no ``scripts``, in every command line."""
    given = [f for f in flags if isinstance(f, str)]
    short = {f for f in given if _is_short_flag(f)}
    if short:
        for script in [posixpath.basename(s) for s in scripts] or [""]:
            _SHORT_FLAGS.setdefault(script, set()).update(short)
    new = {_normal_name(f) for f in given if f not in short} - _PROFILE_FLAGS - {""}
    if new:
        _PROFILE_FLAGS.update(new)
        _is_secret_name.cache_clear()


_FIELD_WORDS = frozenset(
    (
        "sort", "dataset", "data", "input", "output", "label", "text", "prompt", "response",
        "answer", "question", "message", "messages", "image", "id", "group", "column", "field",
        "partition", "primary", "foreign", "target", "source", "reward", "context", "chosen",
        "rejected", "instruction", "system", "completion", "conversation", "document", "content",
        "metadata", "row", "record", "sample", "split", "join", "lookup", "shard", "task",
        "reference", "ref", "query", "gold", "choice", "choices", "result", "score", "feature",
        "example", "turn", "role", "item", "entry", "batch", "sequence", "chat", "history",
        "caption", "title", "category", "class", "tag", "dedup", "dedupe", "unique", "order",
        "hash", "index", "cache", "dict", "json", "map", "value", "name", "eval", "solution",
    )
)  # fmt: skip
"""Words that make the ``key`` after them a field of the data (``--sort-key x``,
``--dataset-key prompt``, ``--input-key text``, ``--output-key out``), not a credential."""
_HOLDER_WORDS = frozenset(
    (
        "jar", "store", "helper", "provider", "command", "cmd", "algorithm", "algo", "alg",
        "bits", "version", "threshold", "ratio", "fraction", "weight", "location", "backend",
    )
)  # fmt: skip
"""Last words of a name that holds where or how a credential is kept or made, not its value
(``--cookie-jar c.txt``, ``--key-store``, ``--credential-helper``, ``--key-bits``)."""


def _names_no_credential(words: list[str]) -> bool:
    """``words`` (a normal name's) name no credential: a field of the data (``sort-key``), a
    holder of one (``cookie-jar``), or a metric (``pass-at-k``: pass@k)."""
    if len(words) < 2:
        return False
    if words[-1] in _HOLDER_WORDS and words[0] not in ("api", "secret", "private"):
        return True
    if words[0] == "pass" and words[1] in ("at", "k", "n"):
        return True
    return (
        words[-1] == "key"
        and words[-2] in _FIELD_WORDS
        and not any(_credential_word(w) for w in words[:-1])
    )


@functools.lru_cache(maxsize=4096)
def _is_secret_name(name: str) -> bool:
    """True when ``name`` (a flag, a variable, a JSON key) names a secret. Words are split on
    ``-``, ``_``, ``.`` and camelCase. A known secret flag (``SECRET_FLAG_NAMES``) is secret, a
    known public one is not; a misspelled name takes the class of the name it is closest to (the
    "did you mean" target: ``api-ky`` is secret, ``max-token`` is not); otherwise the name is
    secret when one of its words is a credential word (``_CREDENTIAL_WORDS``, or a misspelling of
    one), unless its first word is a count or a switch (``--max-tokens``, ``--keep-session``) or
    its last word names something else than the value (``--token-budget``, ``--api-key-env``,
    ``--password-file``)."""
    norm = _normal_name(name)
    if not norm:
        return False
    if norm in SECRET_FLAG_NAMES or norm in CREDENTIAL_HEADERS:
        return True
    if norm in _PROFILE_FLAGS:
        return True
    if norm in _PUBLIC_FLAG_NAMES or norm in _RUNWATCH_OPTIONS:
        return False
    if _PROFILE_FLAGS and len(norm) >= _FUZZY_MIN_LEN and _close_to(norm, _PROFILE_FLAGS):
        return True
    if _names_no_credential(norm.split("-")):
        return False
    close = difflib.get_close_matches(
        norm, sorted(SECRET_FLAG_NAMES | _PUBLIC_FLAG_NAMES), n=1, cutoff=0.85
    )
    if close:
        return close[0] in SECRET_FLAG_NAMES
    words = norm.split("-")
    if words[0] in _COUNT_WORDS or words[-1] in _NOT_A_VALUE_WORDS:
        return False
    if len(words) > 1 and words[0] in _SWITCH_WORDS:
        return False
    return any(
        _credential_word(w) and not (i and w == "token" and words[i - 1] in _MODEL_TOKEN_WORDS)
        for i, w in enumerate(words)
    )


_VALUE_HEADS = frozenset(
    (
        "value", "values", "str", "string", "header", "headers", "json", "yaml", "b64", "base64",
        "hex", "raw", "plain", "text", "pem", "der", "data", "content", "inline", "literal",
    )
)  # fmt: skip
"""Last words that are the credential itself, written some way (``--api-key-value``,
``--private-key-pem``, ``--auth-header``): the name is a credential's whatever its value."""


_COMPOUND = re.compile(r"(?:key|token|secret|pass|pwd|auth|cookie|creds?|session)$")
"""A credential word ending a last word written as one (``authtoken``, ``apikey``)."""


_OWNER_WORDS = frozenset(
    (
        "prod", "production", "prd", "live", "dev", "development", "staging", "stage", "stg",
        "test", "testing", "qa", "uat", "sandbox", "demo", "local", "remote", "cloud", "onprem",
        "primary", "secondary", "backup", "fallback", "spare", "alt", "old", "new", "current",
        "previous", "prev", "next", "rotated", "main", "default", "admin", "root", "master",
        "readonly", "ro", "rw", "write", "read", "internal", "external", "public", "private",
        "judge", "teacher", "student", "grader", "reward", "critic", "draft", "drafter", "target",
        "eval", "bench", "train", "gen", "generator", "server", "client", "worker", "bot", "ci",
        "us", "eu", "asia", "east", "west", "a", "b", "c",
    )
)  # fmt: skip
"""Words after a credential word that say whose or which one it is (``--client-secret-prod``,
``--api-key-judge``, ``--db-password-backup``): the name is still the credential's, whatever its
value, a plain word included."""


def _owned_credential(words: list[str]) -> bool:
    """``words`` end in a credential word followed only by words saying whose or which one it is
    (``_OWNER_WORDS``) or by numbers."""
    k = len(words)
    while k and (words[k - 1] in _OWNER_WORDS or words[k - 1].isdigit()):
        k -= 1
    return 0 < k < len(words) and _credential_word(words[k - 1])


@functools.lru_cache(maxsize=4096)
def _qualifier_only(name: str) -> bool:
    """``name`` is secret only by a credential word that qualifies its last word, which names
    something else (``--token-level``, ``--cookie-domain``, ``--bucket-inter-token-latency``,
    ``StrictHostKeyChecking``, ``--otp-window``; or an owner: ``--api-key-judge``): its value is
    a secret only when it looks like one (:func:`_qualified_secret`). Never a known secret flag,
    a credential header, a profile's flag, a misspelling of one of them, nor a name whose last
    word is a credential word or the credential written some way (``--private-key-pem``)."""
    norm = _normal_name(name)
    words = norm.split("-")
    if len(words) < 2:
        return False
    if norm in SECRET_FLAG_NAMES or norm in CREDENTIAL_HEADERS or norm in _PROFILE_FLAGS:
        return False
    last = words[-1]
    if _credential_word(last) or last in _VALUE_HEADS or last.isdigit() or _COMPOUND.search(last):
        return False
    if _owned_credential(words):
        return False
    if _PROFILE_FLAGS and _close_to(norm, _PROFILE_FLAGS):
        return False
    return not difflib.get_close_matches(norm, sorted(SECRET_FLAG_NAMES), n=1, cutoff=0.85)


def _qualified_secret(name: str, value: str) -> bool:
    """``value`` of a name that is secret only by a qualifying word (:func:`_qualifier_only`)
    is a secret: it looks like a key, or the name is a password's and the value is neither a
    number nor a word about the credential (``PasswordAuthentication=no``, ``--otp-window 30``
    stay; ``--password-admin hunter2x`` does not)."""
    inner = value.strip().strip("'\"")
    if _key_like(inner):
        return True
    if not set(_normal_name(name).split("-")) & _PASSWORD_WORDS:
        return False
    return inner.lower() not in _NOT_SECRET_VALUES and not _TEXT_NUMBER.match(inner)


def _value_secret(name: str, value: str) -> bool:
    """The value of a secret-named ``name`` is a secret: always, unless the name is secret
    only by a qualifying word and the value does not look like one (:func:`_qualifier_only`)."""
    return not _qualifier_only(name) or _qualified_secret(name, value)


def is_secret_flag(name: str) -> bool:
    """True when the value of flag (or key) ``name`` is a secret (see ``_is_secret_name``)."""
    return _is_secret_name(name)


_ENV_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE")
_ENV_PUBLIC = re.compile(
    r"(_TOKENS$|MAX_TOKENS|TOKENIZER|^SSH_AUTH_SOCK$|^XAUTHORITY$|KEYBOARD|AUTHOR|^RUNWATCH_LAUNCH$"
    r"|^(XDG|DBUS)_SESSION_|^SESSION_MANAGER$"
    r"|_(ENV|FILE|PATH|DIR|SOCK|HOST|PORT|USER|NAME|EMAIL|TYPE|MODE|REGION|ID|CLASS|ADDRESS)$)"
)


_ENV_SECRET_PARTS = frozenset(("PASS", "PWD", "PW", "PASSPHRASE", "SESSION", "JWT"))
"""Credential words that count only as a whole part of a name (``DB_PASS``, ``MYSQL_PWD``;
never ``PASSES`` nor ``OLDPWD``)."""


def is_secret_env_name(name: str) -> bool:
    """True for a credential-named variable: its name holds KEY, TOKEN, SECRET, PASSWORD,
    CREDENTIAL, AUTH or COOKIE (any case), or has PASS, PWD, PW, PASSPHRASE or SESSION as a part
    (``DB_PASS``), but not ``*_TOKENS``, ``MAX_TOKENS``, a tokenizer setting, an author, the
    working directory (``PWD``, ``OLDPWD``), or a name that holds a path or a public part
    (``*_FILE``, ``*_PATH``, ``*_ENV``, ``*_HOST``, ``*_USER``, ``*_ID``..., ``SSH_AUTH_SOCK``)."""
    upper = name.upper()
    if upper in ("PWD", "OLDPWD") or _ENV_PUBLIC.search(upper):
        return False
    parts = set(re.split(r"[_\-.]+", upper))
    return any(w in upper for w in _ENV_SECRET_WORDS) or bool(parts & _ENV_SECRET_PARTS)


_REGISTERED: set[str] = set()
"""Every secret value this process has seen (see :func:`register`), and its encodings; masked in
all it masks."""
_SORTED: list[str] = []
"""``_REGISTERED``, longest first (kept by :func:`register`)."""
_BASE64: set[str] = set()
"""The registered base64 forms (:func:`encoded_forms`): a whole base64 word holding one is
masked, not only the part the value alone decides."""
_B64_WORD = "[A-Za-z0-9+/_\\-]*"
_B64_TAIL = "[A-Za-z0-9+/_\\-]*={0,2}"
_STD_TO_URLSAFE = str.maketrans("+/", "-_")


def _base64_forms(raw: bytes) -> list[str]:
    """The base64 characters (standard and urlsafe) that ``raw`` alone decides, at each of the
    three offsets it can have inside a longer encoded text (``Basic base64(user:VALUE)``), so an
    encoding with or without padding, alone or inside another, holds one of them."""
    out = []
    for shift in range(3):
        text = base64.b64encode(b"\0" * shift + raw).decode("ascii")
        core = text[-(-8 * shift // 6) : 8 * (shift + len(raw)) // 6]
        out += [core, core.translate(_STD_TO_URLSAFE)]
    return out


def _percent_forms(value: str) -> list[str]:
    """``value`` URL-encoded: ``quote`` with and without ``/``, ``+`` for spaces, every byte
    encoded, hex digits upper and lower case."""
    raw = value.encode("utf-8", "surrogateescape")
    forms = [quote(raw, safe=""), quote(raw, safe="/"), quote_plus(raw, safe="")]
    forms.append("".join(f"%{b:02X}" for b in raw))
    lower = [re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), f) for f in forms]
    return forms + lower


def encoded_forms(value: str) -> list[str]:
    """The forms of ``value`` masked with it: base64 (standard and urlsafe, padded or not, also
    inside a longer encoded text), URL percent-encoding, hex, and its JSON-escaped spelling."""
    raw = value.encode("utf-8", "surrogateescape")
    forms = [json.dumps(value)[1:-1], raw.hex(), raw.hex().upper()]
    forms += _percent_forms(value) + _base64_forms(raw)
    return [f for f in dict.fromkeys(forms) if f != value and len(f) >= MIN_SECRET_LEN]


def register(values: Iterable[str]) -> None:
    """Remember ``values`` as secrets: from now on every ``mask_*`` of this process masks them,
    and their encodings (:func:`encoded_forms`), wherever they occur. Values shorter than
    ``MIN_SECRET_LEN`` are not registered."""
    for v in values:
        if isinstance(v, str) and len(v.strip()) >= MIN_SECRET_LEN:
            v = v.strip()
            if v in _REGISTERED:
                continue
            _REGISTERED.add(v)
            forms = encoded_forms(v)
            _REGISTERED.update(forms)
            _BASE64.update(_base64_forms(v.encode("utf-8", "surrogateescape")))
    if len(_SORTED) != len(_REGISTERED):
        _SORTED[:] = sorted(_REGISTERED, key=len, reverse=True)


def _mask_one(text: str, value: str) -> str:
    """``text`` with ``value`` masked; a base64 form with the whole base64 word around it."""
    if value in _BASE64:
        return re.sub(_B64_WORD + re.escape(value) + _B64_TAIL, MASK, text)
    return text.replace(value, MASK)


def mask_registered(text: str) -> str:
    """``text`` with every registered value replaced by ``***`` (values only, no patterns: how a
    whole reply or output line is masked as it leaves this process)."""
    for s in _SORTED:
        if s in text:
            text = _mask_one(text, s)
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
                lit = _mask_one(lit, s)
        return lit

    return _JSON_STRING.sub(one, text)


def registered() -> list[str]:
    """The registered values, longest first (so a value that contains another is masked whole)."""
    return list(_SORTED)


_NUMBER = re.compile(r"^\s*[-+]?[0-9_.,eE]+\s*$")
"""A count or a size (``TOKEN_BUDGET=10000000``): never registered from a variable."""


_PATH_VALUE = re.compile(r"^(?:/[\w.@~+\-]+)+/?$")
_FILE_NAME = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,5}/?$")


def _is_path_value(value: str) -> bool:
    """``value`` (of a credential-named variable, ``/`` first) names a file: an existing path or
    one whose last part has an extension (``/etc/keys/sa.json``). A key that merely starts with
    ``/`` (base64 does, as often as with any letter) is no path."""
    if _PATH_VALUE.match(value) is None:
        return False
    return _FILE_NAME.search(value) is not None or os.path.exists(value)


def _is_env_secret_value(name: str, value: str) -> bool:
    """The value of variable ``name`` is a secret: its name is a credential's, and the value is
    no path to a file and no count (``TOKEN_BUDGET=10000000``). A number is a secret when the
    name is a credential's by the flag rules too (``HF_TOKEN=12345678``, a PIN, not
    ``TOKEN_LIMIT``); shorter than ``MIN_SECRET_LEN`` it is never registered."""
    if not is_secret_env_name(name) or (value.startswith("/") and _is_path_value(value)):
        return False
    if not _value_secret(name, value):
        return False
    if _NUMBER.match(value):
        return value.strip().isdigit() and _is_secret_name(name)
    return True


def env_secret_values(env: Mapping[str, str]) -> list[str]:
    """The secret values of an environment: credential-named variables' values (not paths to
    files nor counts: :func:`_is_env_secret_value`), and the secrets inside any value (URL
    credentials, JSON or ``k=v`` credential keys)."""
    out: list[str] = []
    for name, value in env.items():
        if not value:
            continue
        if _is_env_secret_value(name, value):
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


def _credential_values(value: str) -> list[str]:
    """The secrets of a credential ``value``: the token alone when an auth scheme leads it
    (``Bearer K`` -> ``K``: masked by value as ``Bearer ***``, as where it stands), with the
    scheme too when the token alone is too short to be registered."""
    token = _scheme_stripped(value)
    if token and len(token[0]) >= MIN_SECRET_LEN:
        return token
    return [value, *token]


_WORD_START = r"(?:(?<![\w.\-])|(?<=(?<![\w.\-])-)|(?<=(?<![\w.\-])--))"
"""Where a name starts: not inside a longer word (after one or two dashes of a flag at most), so a
long word holds one match to try, not one at each of its characters (linear time)."""
_KV = re.compile(_WORD_START + r"""([A-Za-z_][\w.\-]*)\s*[=:]\s*("[^"]*"|'[^']*'|[^\s,;&]+)""")
_SUBSCRIPT = re.compile(r"""\[\s*(["'])([A-Za-z_][\w.\-]*)\1\s*\]\s*=\s*(["'])(.*?)\3""")
"""``['NAME'] = 'value'`` in code given as an argument (``python -c "os.environ['K']='V'"``)."""
_URL_CRED = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://([^/\s@]+)@")
_BARE_USERINFO = re.compile(r"^[\w.%+\-]+:([^\s@/:]+)@[A-Za-z0-9][\w.\-]*(?::\d+)?(?:/\S*)?$")
"""``user:PASSWORD@host[:port]`` without a scheme (a proxy, a rendezvous endpoint); never
``git@host:path`` nor ``image@sha256:...`` (no colon before their ``@``)."""
_URL_QUERY_VALUE = re.compile(r"(?i)[?&#;][^=&#;\s]*" + _QUERY_NAMES + r"[^=&#;\s]*=([^&#;\s]+)")


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
    bare = _BARE_USERINFO.match(stripped)
    if bare is not None:
        out.append(bare.group(1))
    if stripped[:1] in ("{", "["):
        out.extend(_json_secrets(_literal(stripped)))
    for m in _SUBSCRIPT.finditer(value):
        if _is_secret_name(m.group(2)) or is_secret_env_name(m.group(2)):
            out.extend(_credential_values(m.group(4)))
    for m in _KV.finditer(value):
        if _is_secret_name(m.group(1)):
            v = m.group(2).strip("'\"")
            out.append(v)
            out.extend(_scheme_stripped(v))
    return [v for v in out if len(v) >= MIN_SECRET_LEN]


_LITERAL_MAX = 1 << 16
"""Longest JSON or Python literal read for credential keys."""


def _literal(text: str) -> object:
    """``text`` read as JSON, else as a Python literal (``{'api_key': 'K'}``: ``ast``, never
    evaluated), else None."""
    with contextlib.suppress(ValueError, RecursionError):  # ``[[[[...``: too deep to read
        return json.loads(text)
    if len(text) > _LITERAL_MAX:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


_LITERAL_DEPTH = 64
"""How deep a JSON or Python literal is searched for credential keys."""


def _json_secrets(obj: object, depth: int = 0) -> list[str]:
    out: list[str] = []
    if depth > _LITERAL_DEPTH:
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, str) and isinstance(k, str) and _is_secret_name(k):
                out.extend(_credential_values(v))
            elif isinstance(v, str):
                out.extend(value_secrets(v))
            else:
                out.extend(_json_secrets(v, depth + 1))
    elif isinstance(obj, list):
        for v in obj:
            out.extend(_json_secrets(v, depth + 1))
    return out


def _header_secret(value: str) -> list[str]:
    """The credential of a header argument (``x-api-key: K``, ``Authorization=Bearer K``)."""
    name, sep, rest = value.partition(":")
    if not sep or "=" in name:
        name, sep, rest = value.partition("=")
    if sep and (name.strip().lower() in CREDENTIAL_HEADERS or _is_secret_name(name)):
        rest = rest.strip()
        return _credential_values(rest)
    return []


def _close_to(name: str, names: set[str]) -> bool:
    """``name`` is one of ``names`` or a misspelling of one."""
    return name in names or bool(difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.85))


def _is_credential_header(name: str) -> bool:
    """A header name whose value is a credential (``Authorization``, ``X-Api-Key``)."""
    name = name.strip()
    return bool(name) and (name.lower() in CREDENTIAL_HEADERS or _is_secret_name(name))


def _masked_header(value: str) -> str:
    """A credential header argument with its value masked (``x-api-key: ***``,
    ``Authorization: ***``)."""
    sep = ":" if ":" in value.partition("=")[0] else "="
    name, _, rest = value.partition(sep)
    return name + sep + rest[: len(rest) - len(rest.lstrip())] + MASK


def _header_name_only(value: str) -> bool:
    """``value`` is a credential header's name alone (``Authorization``, ``X-Api-Key:``): its
    value is the next item."""
    name = value.strip()
    if name.endswith((":", "=")):
        name = name[:-1]
    return ":" not in name and "=" not in name and _is_credential_header(name)


_USER_FLAGS = frozenset(("-u", "--user", "--proxy-user", "-U"))
"""Flags whose value is ``user:password`` when it has a colon (curl, wget): the password is
secret."""
_SHELL_DEPTH = 8
"""How deep command lines inside arguments are read (``bash -c "sh -c '...'"``, a flag's value
that is a command line or a flag itself: ``--server-args='--api-key K'``, ``--env=NAME=K``)."""
_FLAG_ITEM = re.compile(r"^-[^\s=]+(?:=|$)")
"""An option, alone or with its value after ``=`` (its name has no space: ``--x "a b"`` as one
item is a command line, not a flag)."""
_OPTION_WORD = r"(?:[a-z]{1,24}[0-9]{0,3}|[0-9]{1,2}[a-z]{0,24})"
_OPTION_NAME = re.compile(
    r"^(?:--" + _OPTION_WORD + r"(?:[-_.]" + _OPTION_WORD + r")*|-[A-Za-z])(?:=|$)"
)
"""What reads as an option after a secret flag: lower-case words (``--model``, ``--fp16``) or
one letter; anything else there is its value, ``-`` first or not (``--api-key -abcDEF123``,
``--password --fresh-secret-9911``, ``--api-key --deadbeef0123456789abcdef``)."""
_ASSIGNMENT = re.compile(r"^([A-Za-z_][\w.\-]*)=")
_SHELL_OPERATOR = re.compile(r"^[;&|()\n]+$")
_COMMAND_WORD = re.compile(
    r"(?:^|/)(?:python[\d.]*|bash|sh|zsh|env|exec|nohup|time|timeout|srun|torchrun|accelerate"
    r"|deepspeed|uv|node|curl|wget|docker|sudo)$|/|\.(?:py|sh)$|^[A-Za-z_][\w]*="
)
"""A word that starts a command after ``NAME=value`` (``OPENAI_API_KEY=K python x.py``); an
item ``NAME=a b c`` followed by anything else is one assignment whose value has spaces."""


def _is_short_flag(flag: str) -> bool:
    return len(flag) == 2 and flag[0] == "-" and flag[1] not in "-="


def _is_flag_item(arg: str) -> bool:
    return not is_negative_number(arg) and _FLAG_ITEM.match(arg) is not None


def _shell_split(arg: str) -> list[str]:
    """``arg`` split as a shell does (operators apart), tolerant of bad quoting: an unclosed
    quote or a dangling backslash is read both as if it were closed and as words split on
    spaces (the two readings apart as two commands)."""
    plain = [w.strip("'\"") for w in arg.split()]
    for tail in ("", '"', "'", "\\"):
        try:
            lexer = shlex.shlex(arg + tail, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words = list(lexer)
        except ValueError:
            continue
        words = _join_substitutions(words)
        return words if not tail else [*words, ";", *plain]
    return plain


def _join_substitutions(words: list[str]) -> list[str]:
    """``words`` with each command substitution made one word with what it is part of
    (``--api-key=$(cat k)``, ``--api-key `echo K```): the value its flag is given."""
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.endswith("$") and i < len(words) and words[i].startswith("("):
            depth, inner = 0, []
            while i < len(words):
                depth += words[i].count("(") - words[i].count(")")
                inner.append(words[i])
                i += 1
                if depth <= 0:
                    break
            word += " ".join(inner).replace("( ", "(").replace(" )", ")")
        elif word.count("`") % 2:
            while i < len(words) and word.count("`") % 2:
                word += " " + words[i]
                i += 1
        out.append(word)
    return out


@functools.lru_cache(maxsize=1024)
def _shell_words(arg: str) -> tuple[str, ...] | None:
    """The words of ``arg`` when it reads as a shell command line (``python gen.py --api-key K;
    echo``: operators split off; ``'--api-key=K'``: quotes removed), else None (one plain word,
    or a JSON or Python literal)."""
    if not any(c.isspace() or c in "'\"\\" for c in arg) or _is_mapping(arg):
        return None
    words = _shell_split(arg)
    return tuple(words) if len(words) > 1 or (words and words[0] != arg) else None


def _is_mapping(value: str) -> bool:
    return value.lstrip()[:1] in ("{", "[")


def _active_short(flag: str, scripts: set[str]) -> bool:
    """``flag`` (``-p``) is a profile's one-letter secret flag in a command line of ``scripts``."""
    return _is_short_flag(flag) and any(flag in _SHORT_FLAGS.get(s, ()) for s in ("", *scripts))


def _secret_flag(name: str, scripts: set[str], extra: set[str]) -> bool:
    """The value of flag ``name`` is a secret where it stands."""
    if _active_short(name, scripts):
        return True
    return _is_secret_name(name) or (bool(extra) and _close_to(_normal_name(name), extra))


def _public_value(name: str, value: str, scripts: set[str]) -> bool:
    """A value of a built-in secret flag that is not a secret: ``-k``'s number or URL (top-k,
    curl's ``-k``, a switch before its URL)."""
    return (
        name in ("-k", "-K")
        and not _active_short(name, scripts)
        and (re.match(r"^[-+]?\d+(?:\.\d+)?$", value) is not None or "://" in value)
    )


def _takes_value(flag: str, scripts: set[str], extra: set[str]) -> bool:
    """``flag``'s next item is its value even when it starts with ``-`` (a secret's value)."""
    return (
        _secret_flag(flag, scripts, extra) or _is_header_flag(flag) or flag.lower() in _USER_FLAGS
    )


def _is_value_of(flag: str, arg: str, scripts: set[str], extra: set[str]) -> bool:
    """``arg``, the item after ``flag``, is its value: not an option, or after a secret flag
    anything that does not read as an option (``--api-key -abc123``)."""
    if arg == "-" or not _is_flag_item(arg):
        return True
    return _takes_value(flag, scripts, extra) and _OPTION_NAME.match(arg) is None


def _attached(arg: str, scripts: set[str]) -> tuple[str, str, str] | None:
    """A one-letter flag and the value written with it (``-pK``, ``-p=K``, ``-uuser:K``,
    ``-H'X-Api-Key: K'``, ``-kLONGVALUE``), as ``(flag, joint, value)``; None when ``arg`` is not
    read so (``-vvv``, python's ``-uB``, curl's ``-ksS``)."""
    if len(arg) <= 2 or arg[1] == "-" or not arg.startswith("-"):
        return None
    flag, rest = arg[:2], arg[2:]
    joint = ""
    if rest.startswith("=") and (_active_short(flag, scripts) or _is_secret_name(flag)):
        joint, rest = "=", rest[1:]
    if _active_short(flag, scripts):
        return flag, joint, rest
    if flag in ("-H", "-h") and ":" in rest:
        return flag, joint, rest
    if flag in ("-u", "-U") and ":" in rest:
        return flag, joint, rest
    if _is_secret_name(flag) and (joint or len(rest) >= MIN_SECRET_LEN):
        return flag, joint, rest
    return None


def _sub_argv(value: str) -> list[str] | None:
    """A value read as a command line of its own: its shell words, or itself when it is a flag
    or an assignment (``--server-args=--api-key=K``, ``--env=HF_TOKEN=K``)."""
    if _ASSIGNMENT.match(value) or _is_flag_item(value):
        return [value]
    words = _shell_words(value)
    return list(words) if words is not None else None


def _flag_value(
    name: str, value: str, scripts: set[str], extra: set[str], depth: int
) -> tuple[str | None, list[str], bool]:
    """How ``value`` of flag ``name`` is shown masked by where it stands (None: as text), its
    secrets, and whether the next item is a credential (``-H Authorization 'Bearer K'``)."""
    if name.lower() in _USER_FLAGS and ":" in value:
        user, _, password = value.partition(":")
        return user + ":" + MASK, [password], False
    if (
        _secret_flag(name, scripts, extra)
        and not _public_value(name, value, scripts)
        and (_active_short(name, scripts) or _value_secret(name, value))
    ):
        found = _credential_values(value)
        if "," in value:
            found += [p.strip() for p in value.split(",")]
        return MASK, found, False
    if _is_header_flag(name) and not _is_mapping(value):
        found = [v for v in _header_secret(value) if v]
        if found:
            return _masked_header(value), found, False
        if _header_name_only(value):
            return None, [], True
    if depth < _SHELL_DEPTH:
        sub = _sub_argv(value)
    else:  # deeper: its words as they stand, read once more (no further command line)
        sub = _flat_words(value) if depth == _SHELL_DEPTH and _sub_argv(value) else None
    if sub is None:
        return None, [], False
    views, founds = _walk(sub, extra, scripts, depth + 1)
    return (views[0] if sub == [value] else None), [v for f in founds for v in f], False


def _flat_words(text: str) -> list[str]:
    """``text`` split on blanks, each word's quotes and backslashes trimmed from its ends: a
    command line nested deeper than ``_SHELL_DEPTH`` read without its quoting, so a secret flag
    and its value are still found there (``--api-key K'"'"'``)."""
    return [w for w in (word.strip("'\"\\") for word in text.split()) if w]


def _positional(
    arg: str, extra: set[str], scripts: set[str], depth: int
) -> tuple[str | None, list[str]]:
    """An item that is no flag's value: ``NAME=value`` (its value whole, spaces too, unless a
    command follows: ``OPENAI_API_KEY=K python x.py``), or a command line read word by word."""
    words = _shell_words(arg)
    m = _ASSIGNMENT.match(arg)
    secret = m is not None and (_is_secret_name(m.group(1)) or is_secret_env_name(m.group(1)))
    secret = secret and m is not None and _value_secret(m.group(1), arg[m.end() :])
    if m and secret and (words is None or len(words) < 2 or not _COMMAND_WORD.search(words[1])):
        v = arg[m.end() :]
        return m.group(0) + MASK, [*_credential_values(v), v.strip("'\"")]
    rest = arg[m.end() :] if m else ""
    if m and _ASSIGNMENT.match(rest) and words is None and depth < _SHELL_DEPTH:
        views, founds = _walk([rest], extra, scripts, depth + 1)  # ssh's ``SetEnv=NAME=K``
        return (m.group(0) + views[0] if views[0] is not None else None), founds[0]
    if words is None or depth > _SHELL_DEPTH:
        return None, []
    if depth == _SHELL_DEPTH:  # deeper: its words as they stand, read once more
        words = tuple(_flat_words(arg))
    _, founds = _walk(words, extra, scripts, depth + 1)
    return None, [v for f in founds for v in f]


def _walk(
    argv: Sequence[str], extra: set[str], scripts: set[str], depth: int
) -> tuple[list[str | None], list[list[str]]]:
    """For each item of ``argv``: how it is shown with the secrets its place decides masked
    (None: masked as text, by value), and every secret value it holds, of any length. A
    profile's one-letter secret flag counts after its script's name, up to the end of that
    command (``;``, ``&&``, ``|``); a command line inside an item is read the same way."""
    views: list[str | None] = []
    founds: list[list[str]] = []
    scripts = set(scripts)
    prev: str | None = None  # the flag the next item may be the value of
    credential = False  # the previous item was a credential header's name
    for arg in argv:
        view: str | None = None
        found: list[str] = []
        views.append(None)
        founds.append(found)
        if depth and _SHELL_OPERATOR.match(arg):
            scripts, prev, credential = set(), None, False
            continue
        base = posixpath.basename(arg)
        if base in _SHORT_FLAGS:
            scripts.add(base)
        name: str | None = None
        value: str | None = None
        joint: str | None = None  # how name and value are written in one item ("=", "")
        if credential:
            credential, prev = False, None
            scheme = _AUTH_SCHEME.match(arg.strip())
            view = scheme.group(0) + MASK if scheme else MASK
            found += _credential_values(arg)
        elif prev is not None and _is_value_of(prev, arg, scripts, extra):
            name, value = prev, arg
        elif (attached := _attached(arg, scripts)) is not None:
            name, joint, value = attached
        elif _is_flag_item(arg):
            flag, eq, rest = arg.partition("=")
            if not eq:
                prev = arg
                continue
            name, joint, value = flag, "=", rest
        else:
            view, found[:] = _positional(arg, extra, scripts, depth)
        if name is not None and value is not None:
            prev = None
            shown, values, credential = _flag_value(name, value, scripts, extra, depth)
            found += values
            if shown is not None:
                view = shown if joint is None else name + joint + shown
        elif not credential:
            prev = None
        if view is None and _credential_header_item(arg):
            found += _header_secret(arg)
            view = _masked_header(arg)
        found += value_secrets(arg)
        if joint == "=" and value is not None:
            found += value_secrets(value)  # --extra-body={'api_key': 'K'}
        views[-1] = view
    return views, founds


def argv_secret_values(argv: Sequence[str], secret_flags: Iterable[str] = ()) -> list[str]:
    """The secret values of a command line: values of secret flags (``--api-key K``,
    ``--api-keys K1,K2`` and each of its items, ``-k K``, ``--credentials-json '{...}'``,
    ``--api-key -K`` too, and the ``secret_flags`` of the client's profile, ``-pK`` attached),
    of credential headers (``--header "x-api-key: K"``, ``-H 'Authorization: Bearer K'``, and a
    header given as two items: ``-H Authorization 'Bearer K'``), of ``user:password``
    (``-u``), of credential-named ``NAME=value`` words (``env API_TOKEN=K cmd``, ``-e NAME=K``,
    ``--env=NAME=K``), the secrets inside any argument (URL credentials, JSON or Python literal
    or ``k=v`` credential keys), and the same inside any argument or value that is a command
    line (``bash -c "python gen.py --api-key K"``, ``--server-args='--api-key K'``), read
    recursively."""
    extra = {_normal_name(f) for f in secret_flags}
    _, founds = _walk(argv, extra, set(), 0)
    return list(dict.fromkeys(v for f in founds for v in f if len(v) >= MIN_SECRET_LEN))


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
    bare = _BARE_USERINFO.match(text) if "@" in text else None
    if bare is not None and bare.group(1) != MASK:  # ``user:PASSWORD@host``, a short one too
        text = text[: bare.start(1)] + MASK + text[bare.end(1) :]
    return text


# Free text: a credential-named name and its value, in every way a log or a dump writes them:
# ``NAME=value``, ``--name=value``, ``name: value`` (YAML, headers, ``x-api-key:K``), ``name =>
# value``, ``"name": "value"`` (JSON, a Python dict, escaped JSON inside a string), ``--name
# value``, ``API key is value``; the value quoted or up to a space, comma, ``;``, ``&`` or bracket.
_TEXT_AUTH = re.compile(r"(?i)((?:proxy-)?authorization\s*[:=]\s*)\S.*")
_TEXT_VALUE = (
    r"(?P<scheme>(?i:bearer|basic|token|digest|apikey)\s+)?"
    r"""(?P<value>[bfru]?\\"[^"\\]*\\"|[bfru]?"[^"]*"|[bfru]?'[^']*'|`[^`]*`"""
    r"""|\([^()]*\)|\[[^\[\]]*\]|[^\s,;&'"`\\()\[\]{}<>]+|["'`][^\s"'`,;&]+)"""
)
_TEXT_NAME = r"""(?:(?<![\w.\-])|(?<=\\[nrt]))(?P<q>\\?["'`]?)(?P<name>(?:--?)?[A-Za-z_][\w.\-]*)"""
_TEXT_PAIR = re.compile(
    _TEXT_NAME
    + r"""(?:(?P=q)|\\?["'`])?\]?(?P<sep>\s*(?:=>|:=|=(?!=)|:(?![:/=])|%3[DdAa])\s*)"""
    + _TEXT_VALUE
)
_TEXT_XML = re.compile(
    r"<(?P<name>[A-Za-z_][\w.\-]*)(?P<sep>>)(?P<scheme>)(?P<value>[^<]+)</(?P=name)>"
)
"""An XML element holding a credential (``<api_key>K</api_key>``)."""
_PEM_BODY = re.compile(
    r"(?m)^(?P<lead>[ \t]*)(?=[A-Za-z0-9+/]*[a-z])(?=[A-Za-z0-9+/]*[A-Z])(?=[A-Za-z0-9+/]*[0-9])"
    r"[A-Za-z0-9+/]{40,}={0,2}[ \t]*$"
)
"""A line that is one long base64 word of mixed case and digits: a PEM private key's body
(a line of a tail never holds its BEGIN line too)."""
_TEXT_ITEMS = re.compile(
    r"""(?P<q>["'])(?P<name>[A-Za-z_][\w.\-]*)(?P=q)(?P<sep>\s*,\s*)(?P<scheme>)"""
    r"""(?P<value>"[^"]*"|'[^']*')"""
)
"""A quoted name and a quoted value as two items: ``("api_key", "K")``, ``setenv("TOKEN", "K")``
(masked when the value looks like a key: ``["token", "logprob"]`` is a list of words)."""
_TEXT_SPACED = re.compile(
    r"(?<![\w.\-])(?P<name>[A-Za-z_][\w.\-]*)(?P<sep>[ \t]+)(?P<scheme>)"
    r"(?P<value>[A-Za-z0-9+/=_.~:\-]{12,})(?![^\s,;'\"])"
)
"""A name and its value apart by blanks only (``HF_TOKEN\tK``, ``token K accepted``): masked
when the name is strongly a credential and the value looks like a key (apart by spaces, as in
prose, a key with digits of 16 characters or more: :func:`_key_in_prose`)."""
_TEXT_FLAG = re.compile(r"(?<!\S)(?P<name>--?[A-Za-z][\w\-]*)(?P<sep>\s+)(?!-)" + _TEXT_VALUE)
_TEXT_PHRASE = re.compile(
    r"(?i)(?<![\w\-])(?P<name>(?:api|access|secret|private|auth|bearer|session|refresh|client"
    r"|license|personal\s+access)\s+(?:key|token|secret))(?P<sep>\s*(?:[:=]|\bis\b)\s*|[ \t]+)"
    + _TEXT_VALUE
)
"""A credential named in words: ``API key: K``, ``your access token is K``, ``using API key K``
(masked when the value looks like a key in prose: :func:`_key_in_prose`)."""
_TEXT_URL = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>]+")
_WEAK_WORDS = frozenset(("key", "k", "session", "pass", "sig", "signature"))
"""Credential words that often name something else (``sort_key``, ``--input-key text``,
``session: 3``, ``pass: 2``): a name whose only credential words are these masks a value only when
the value looks like a key (:func:`_key_like`)."""
_KEY_QUALIFIERS = frozenset(
    (
        "api", "access", "private", "client", "signing", "master", "license", "licence",
        "subscription", "service", "app", "encryption", "ssh", "deploy", "admin", "account",
        "openai", "anthropic", "hf", "groq", "nvidia", "nvapi", "google", "gemini", "aws",
        "azure", "mistral", "cohere", "together", "replicate", "openrouter", "deepseek",
        "fireworks", "wandb", "stripe", "github", "gitlab", "slack", "x",
    )
)  # fmt: skip
"""Words that make a ``key`` a credential whatever its value (``openai_key``, ``x-api-key``)."""
_NUMBER_SECRET_WORDS = frozenset(
    ("password", "passwd", "pwd", "pw", "passphrase", "passcode", "secret", "pin", "otp")
)
"""Credential words whose value is secret even when it is a number (a PIN); ``token: 151643`` (a
model's token id) and ``key: 3`` stay."""
_PASSWORD_WORDS = _NUMBER_SECRET_WORDS - {"secret"}
"""Credential words whose value can be a plain word (``password: hunter``)."""
_NOT_SECRET_VALUES = frozenset(
    (
        "none", "null", "nil", "true", "false", "yes", "no", "on", "off", "ok", "set", "unset",
        "empty", "missing", "required", "optional", "provided", "redacted", "hidden", "masked",
        "invalid", "expired", "valid", "enabled", "disabled", "n/a", "undefined", "failed",
        "error", "success", "succeeded", "accepted", "rejected", "denied", "refused", MASK,
    )
)  # fmt: skip
"""Values that say something of the credential, never are one (``api_key: None``)."""
_QUOTED = re.compile(
    r"""^(?P<open>[bfru]?(?P<esc>\\?)(?P<q>["'`]))(?P<inner>.*)(?P<close>(?P=esc)(?P=q))$""",
    re.S,
)
"""A quoted value (``'K'``, ``b'K'``, an escaped ``\\"K\\"``): its opening, content and closing."""
_PROSE_WORD = re.compile(r"^[A-Za-z]?[a-z]{0,9}$")
"""A word of prose (``The``, ``stored``): never a key after ``Token:`` or ``API key:``."""
_TEXT_NUMBER = re.compile(r"^[-+]?[0-9][0-9_.,]*$")
_KEY_CHARS = re.compile(r"^[A-Za-z0-9+/=_.~\-:]{12,}$")


def _key_like(value: str) -> bool:
    """``value`` could be a key: 12 key characters or more, of two kinds at least (letters and
    digits, or both cases), with no space (``Zq8vR2mXk4LpT9wB``; not ``length``, ``prompt``)."""
    if not _KEY_CHARS.match(value):
        return False
    kinds = [any(c.islower() for c in value), any(c.isupper() for c in value)]
    kinds.append(any(c.isdigit() for c in value))
    return sum(kinds) >= 2


def _key_in_prose(value: str) -> bool:
    """``value``, after a name with only blanks between (``token K accepted``), could be a key:
    key-like, 16 characters or more, with digits and letters (not ``base64-encoded``)."""
    return (
        len(value) >= 16
        and _key_like(value)
        and any(c.isdigit() for c in value)
        and any(c.isalpha() for c in value)
    )


def _weak_name(words: Sequence[str]) -> bool:
    """A name whose credential words are all weak ones (``sort-key``, ``session``), with no word
    that makes a key a credential (``api``, ``openai``); never a profile's secret flag."""
    norm = "-".join(words)
    if norm in _PROFILE_FLAGS:
        return False
    creds = [w for w in words if _credential_word(w)]
    if not creds:  # secret only as a near miss of a name (``dkey``), or ``-k``
        return norm == "k" or (norm not in SECRET_FLAG_NAMES and norm not in CREDENTIAL_HEADERS)
    return all(w in _WEAK_WORDS for w in creds) and not (set(words) & _KEY_QUALIFIERS)


def _text_value_shown(name: str, value: str, sep: str = "") -> bool:
    """``value``, given to the secret-named ``name`` in free text, is shown as it is: empty, a
    word about the credential (``None``, ``missing``), a variable's name (``$OPENAI_API_KEY``), a
    count or a token id, a word of prose after a colon (``Token: The``; neither of these for a
    password or a PIN), an example in markdown (``a secret: `a b` ``), or a plain value of a
    name that is only weakly a credential (``sort_key=length``, ``key: prompt``)."""
    quoted = _QUOTED.match(value)
    inner = (quoted.group("inner") if quoted else value).strip()
    if len(inner) < 2 or inner.lower() in _NOT_SECRET_VALUES or inner.startswith("$"):
        return True  # ``k=v``, ``None``, ``$OPENAI_API_KEY``
    if not any(c.isalnum() for c in inner):
        return True  # ``...``, ``***``
    if sep.strip() == ":" and quoted and quoted.group("q") == "`" and " " in inner:
        return True  # markdown: "a secret: `max_tokens: 2048`" quotes an example
    if not _value_secret(name, inner):
        return True  # ``token_level='sequence'``, ``otp_window: 30``
    words = _normal_name(name).split("-")
    if _TEXT_NUMBER.match(inner) and not set(words) & _NUMBER_SECRET_WORDS:
        return True
    if sep.strip() == ":" and not quoted and _PROSE_WORD.match(inner):
        return not set(words) & _PASSWORD_WORDS
    return _weak_name(words) and not _key_like(inner)


_CODE_PATH = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")


def _code_value(m: re.Match[str]) -> bool:
    """The value is a Python expression, as a traceback's source line shows it: a call or a
    subscript (``frozenset(``, ``s.get(k)``, ``Iterable[str]``), an f-string, an attribute path
    (``self._key``, ``rate.cost_per_request``)."""
    value = m.group("value")
    if m.string[m.end("value") : m.end("value") + 1] in ("(", "["):
        return True
    if value[:1] == "f" and value[1:2] in ("'", '"'):
        return True
    if set(_normal_name(m.group("name")).split("-")) & _PASSWORD_WORDS:
        return False  # ``password=hunter2.x`` may well be one
    return bool(_CODE_PATH.match(value)) and not _key_like(value)


def _masked_pair(m: re.Match[str], secret: bool) -> str:
    """The match of a name and its value with the value masked (its quotes kept) when ``secret``
    and the value is not one shown as it is."""
    value = m.group("value")
    if not secret or _code_value(m) or _text_value_shown(m.group("name"), value, m.group("sep")):
        return m.group(0)
    quoted = _QUOTED.match(value)
    value = quoted.group("open") + MASK + quoted.group("close") if quoted else MASK
    whole = m.group(0)
    return whole[: m.start("value") - m.start(0)] + value + whole[m.end("value") - m.start(0) :]


def _mask_pairs(
    pattern: re.Pattern[str], text: str, key_like: Callable[[str], bool] | None = None
) -> str:
    """``text`` with the value of each match of ``pattern`` whose name is secret masked; with
    ``key_like``, only a value that looks like a key after a name that is strongly a credential.
    A match of another name is passed by its name only, so its value is read again
    as a name of its own (``args: --hf-token=K``, ``x=1,api_key=K``)."""
    out: list[str] = []
    pos = 0
    m = _next_pair(pattern, text, 0)
    while m is not None:
        name = m.group("name")
        if key_like:
            looks = _key_like if "\t" in m.group("sep") else key_like  # a table: no prose
            secret = (
                _is_secret_name(name)
                and not _weak_name(_normal_name(name).split("-"))
                and looks(m.group("value").strip("\"'"))
            )
        else:
            secret = _is_secret_name(name)
        if secret:
            out += [text[pos : m.start()], _masked_pair(m, True)]
            pos = m.end()
            m = _next_pair(pattern, text, pos)
        else:
            m = _next_pair(pattern, text, m.end("sep"))
    return "".join(out) + text[pos:] if out else text


def _head(pattern: re.Pattern[str]) -> re.Pattern[str]:
    return re.compile(pattern.pattern[: -len(_TEXT_VALUE)], pattern.flags)


def _next_pair(pattern: re.Pattern[str], text: str, pos: int) -> re.Match[str] | None:
    """The next match of ``pattern`` from ``pos`` whose name is secret-named, or of any name for
    a pattern whose value is not read last. The name and separator are found first, the value
    only after a secret name: a long value holding many ``name:`` is not read again after each
    one (``a:a:a:...``: linear, not quadratic)."""
    head = _HEADS.get(pattern)
    if head is None:
        return pattern.search(text, pos)
    h = head.search(text, pos)
    while h is not None:
        if _is_secret_name(h.group("name")):
            full = pattern.match(text, h.start())
            if full is not None:
                return full
            h = head.search(text, h.start() + 1)
        else:
            h = head.search(text, h.end("sep"))
    return None


_HEADS = {p: _head(p) for p in (_TEXT_PAIR, _TEXT_FLAG, _TEXT_PHRASE)}
"""The name-and-separator part of the patterns whose value is read last."""


def mask_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """Free text (a log line, an error message) with its secrets masked.

    Masks the values of secret-named names in every form a log or a config dump writes them
    (``OPENAI_API_KEY=...``, ``api_key: ...``, ``"apiKey": "..."``, ``{'api_key': '...'}``,
    ``token => ...``, ``x-api-key:...``, ``--api-key ...``, ``API key is ...``), key shapes of
    every provider anywhere (``sk-...``, ``hf_...``, ``nvapi-...``, ``AIza...``, JWTs...),
    ``Bearer``/``Basic`` tokens, ``Authorization`` values and URL credentials, and any of the
    given ``secrets`` wherever it appears. Words are never masked for what they are, nor names:
    ``token budget None``, ``max_tokens: 2048``, ``sort_key=length``, ``--token-budget 10`` and
    ``--api-key-env OPENAI_API_KEY`` stay as they are.
    """
    text = _mask_known(text, [s for s in (secrets or ()) if s])
    text = _TEXT_AUTH.sub(lambda m: m.group(1) + MASK, text)
    # A value apart from its name by blanks goes whole before the pairs inside it are read
    # (``api_key\t_KY=K``: not ``_KY=`` shown as if it were a name of its own).
    text = _mask_pairs(_TEXT_SPACED, text, key_like=_key_in_prose)
    text = _mask_pairs(_TEXT_PAIR, text)
    text = _mask_pairs(_TEXT_FLAG, text)
    text = _mask_pairs(_TEXT_ITEMS, text, key_like=_key_like)
    low = text.lower()
    if "key" in low or "token" in low or "secret" in low:
        text = _mask_pairs(_TEXT_PHRASE, text, key_like=_key_in_prose)
    text = _mask_pairs(_TEXT_XML, text)
    text = _PEM_BODY.sub(lambda m: m.group("lead") + MASK, text)
    if ("aws" in low or "AKIA" in text or "ASIA" in text) and _AWS_CONTEXT.search(text):
        text = _AWS_SECRET.sub(MASK, text)
    text = _SECRET_VALUE.sub(MASK, text)
    text = _BEARER.sub(lambda mm: mm.group(1) + " " + MASK, text)
    if "://" in text:
        text = _TEXT_URL.sub(lambda m: _mask_url(m.group(0)), text)
    if "@" in text:
        text = _TEXT_USERINFO.sub(_masked_userinfo, text)
    return text


_TEXT_USERINFO = re.compile(
    r"(?<![\w.%+\-:/])(?P<user>[\w.%+\-]+):(?P<pw>[^\s@/:'\"]+)@(?=[A-Za-z0-9][\w.\-]*)"
)
"""``user:PASSWORD@host`` without a scheme in free text (``proxy admin:K@proxy:3128``)."""


def _masked_userinfo(m: re.Match[str]) -> str:
    """The userinfo with its password masked when it looks like a key (``mailto:alice@x``,
    ``user:bob@example.com`` are an address after a label)."""
    if not _key_like(m.group("pw")):
        return m.group(0)
    return m.group("user") + ":" + MASK + "@"


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
    fragment = _URL_QUERY_SECRET.sub(lambda mm: mm.group(1) + MASK, "#" + parts.fragment)[1:]
    if netloc == parts.netloc and query == parts.query and fragment == parts.fragment:
        return text
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def _mask_known(text: str, known: list[str]) -> str:
    values = known + registered() if _REGISTERED else known
    if len(values) > 1:
        values = sorted(set(values), key=len, reverse=True)
    for s in values:
        if len(s) >= MIN_SECRET_LEN and s in text:
            text = _mask_one(text, s)
    return text


def mask_argv(
    argv: Sequence[str], secrets: Iterable[str] | None = None, secret_flags: Iterable[str] = ()
) -> list[str]:
    """argv with secrets replaced by ``***``; everything else unchanged.

    Masks what :func:`_walk` finds where it stands: the value of any flag whose name is a
    secret name (``--api-key X``, ``--api-key=X``, ``--api-key -X``, ``--hf-token X``,
    ``--db-pw X``, ``OPENAI_API_KEY=X``; never ``--token-budget``, ``--max-tokens``,
    ``--sort-key`` or ``--api-key-env``: see ``_is_secret_name``) or one of ``secret_flags`` (a
    profile's, ``-pX`` attached), the item after a credential header's name (``-H
    Authorization 'Bearer X'``), ``user:X``, and inside a JSON or Python literal the string of a
    credential key (``{"X-Api-Key": "***"}``, still valid JSON); key-shaped values anywhere
    (``sk-...``, ``hf_...``), ``Authorization:`` header values, ``Bearer`` tokens and URL
    credentials; any of the given ``secrets`` and of the secrets of ``argv``
    (:func:`argv_secret_values`, command lines inside items included) wherever it appears
    inside an argument, a short one where it stands as a word. Names are never masked, and the
    rest of a command line inside an item stays as written.
    """
    extra = {_normal_name(f) for f in secret_flags}
    views, founds = _walk(argv, extra, set(), 0)
    known = [s for s in (secrets or ()) if s]
    known += [v for f in founds for v in f if len(v) >= MIN_SECRET_LEN]
    out: list[str] = []
    for arg, view, found in zip(argv, views, founds):
        if view is not None:
            out.append(mask_value(view, known) if view != MASK else view)
            continue
        text = _mask_literal(arg) if "{" in arg or "[" in arg else arg
        text = mask_value(text, known)
        out.append(_mask_words(text, [v for v in found if 0 < len(v.strip()) < MIN_SECRET_LEN]))
    return out


_LITERAL_PAIR = re.compile(
    r"""(["'])((?:\\.|(?!\1).)*)\1(\s*:\s*)(["'])((?:\\.|(?!\4).)*)\4""", re.DOTALL
)
"""A ``"key": "value"`` pair of a JSON object or a Python dict literal (either quotes)."""


def _mask_literal(text: str) -> str:
    """A JSON or Python literal with the string of each credential key masked inside its quotes
    (an auth scheme kept: ``{"Authorization": "Bearer ***"}``): still valid JSON."""

    def one(m: re.Match[str]) -> str:
        if not m.group(5).strip() or not _is_credential_header(m.group(2)):
            return m.group(0)
        scheme = _AUTH_SCHEME.match(m.group(5))
        shown = (scheme.group(0) if scheme else "") + MASK
        return m.group(0)[: m.start(5) - m.start(0)] + shown + m.group(4)

    return _LITERAL_PAIR.sub(one, text)


def _mask_words(text: str, values: Sequence[str]) -> str:
    """``text`` with each of ``values`` (short secrets of a command line) masked where it
    stands as a word: after a space, quote, ``=`` or ``:``, or written with its one-letter flag
    (``-pK``); a secret of ``MIN_SECRET_LEN`` or more is masked by value already."""
    for value in sorted(set(values), key=len, reverse=True):
        text = re.sub(
            r"(?:(?<![^\s'\"=:\\])|(?<=(?<![^\s'\"\\])-[A-Za-z]))"
            + re.escape(value)
            + r"(?![^\s'\";&|)\\@])",
            MASK,
            text,
        )
    return text


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
