"""The secret values runwatch knows, and masking them in whatever this process prints or writes.

Every value runwatch knows to be a secret is registered once (``agent.masking.register``, one
registry per process, shared with the masking functions of the agent package) and masked wherever
it occurs: the values of credential-named variables of this environment and of a run's ``env``,
of every endpoint's ``api_key_env``, of secret flags in a run's argv (built-in list plus the
profile's ``secret_flags``, credential headers), URL credentials and credential keys inside JSON
or ``k=v`` values, and the values of secret ``--set`` overrides. The host registers what it sees
(process environments, launch environments) and masks before anything crosses the channel; the
laptop masks again here. Masking by pattern (``mask_text``) stays as a second net.

A value given once (``restart --set api-key=K``) is still in the run's log after the process
that knew it has exited: its salted SHA-256 digest (never the value) is kept in
``state_dir()/secret-digests`` (0600), and text is masked where a word of the same length has
that digest (:func:`mask_digests`), in every process that shows the log later.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from supervisor.agent import masking, safefs
from supervisor.agent.masking import (
    MIN_SECRET_LEN,
    argv_secret_values,
    env_secret_values,
    register,
    register_environ,
    register_secret_flags,
    registered,
    value_secrets,
)
from supervisor.agent.protocol import MASK
from supervisor.config import Config
from supervisor.errors import UnsafeState
from supervisor.paths import open_private, private_dir, read_private, state_dir

__all__ = [
    "known_secrets",
    "mask_argv",
    "mask_json_text",
    "mask_known",
    "mask_record",
    "mask_registered",
    "mask_text",
    "note_overrides",
    "note_secrets",
    "script_secret_flags",
    "secret_env_names",
    "secret_flags",
]


def note_secrets(config: Config, environ: Mapping[str, str] | None = None) -> None:
    """Register every secret value ``config`` and this environment hold: the credential values of
    the environment, every endpoint's ``api_key_env`` value, each run's ``env`` values that are
    secrets and the secret values in each run's argv (with its profile's ``secret_flags``)."""
    source = os.environ if environ is None else environ
    register_environ(source)
    register(source.get(e.api_key_env, "") for e in config.endpoints if e.api_key_env)
    for client in config.clients.values():
        register_secret_flags(client.secret_flags, client.scripts)
    for run in config.runs:
        register(env_secret_values(run.env))
        register(argv_secret_values(run.argv))
    for url in config.alerts.urls:
        register(value_secrets(url))


def note_overrides(
    sets: Iterable[tuple[str, str | None]], secret_flags: Sequence[str] = ()
) -> None:
    """Register the values of secret ``--set`` overrides (``api-key=K``, a misspelled
    ``api-ky=K`` whose "did you mean" target is secret, or a flag of ``secret_flags``)."""
    argv: list[str] = []
    for flag, value in sets:
        if value is not None:
            argv += [flag if flag.startswith("-") else "--" + flag, value]
    values = argv_secret_values(argv, secret_flags)
    register(values)
    remember(values)


def secret_flags(config: Config) -> list[str]:
    """Every client profile's ``secret_flags`` but one-letter ones (sent to the host, which masks
    their values in what it writes and lists, in every command line)."""
    return sorted({f for c in config.clients.values() for f in c.secret_flags if not _short(f)})


def script_secret_flags(config: Config) -> dict[str, list[str]]:
    """Script name -> the one-letter ``secret_flags`` (``-p``) of its profiles: secret only in
    that script's command lines (another command's ``-p`` is not the profile's)."""
    out: dict[str, set[str]] = {}
    for c in config.clients.values():
        short = {f for f in c.secret_flags if _short(f)}
        for script in c.scripts if short else ():
            out.setdefault(script, set()).update(short)
    return {k: sorted(v) for k, v in sorted(out.items())}


def _short(flag: str) -> bool:
    return len(flag) == 2 and flag[0] == "-" and flag[1] != "-"


def secret_env_names(config: Config) -> list[str]:
    """Names of every endpoint's key variable (sent to the host, which masks their values)."""
    return sorted({e.api_key_env for e in config.endpoints if e.api_key_env})


def known_secrets(
    config: Config | None = None, environ: Mapping[str, str] | None = None
) -> list[str]:
    """The values runwatch knows to be secrets, longest first (so a key that contains another is
    masked whole): everything registered, plus those of ``config`` and ``environ`` (default this
    process's environment), registered now."""
    if config is not None:
        note_secrets(config, environ)
    else:
        register_environ(os.environ if environ is None else environ)
    return [v for v in registered() if len(v) >= MIN_SECRET_LEN]


def mask_known(value: Any, secrets: list[str] | None = None) -> Any:
    """``value`` (JSON-like: dicts, lists, strings) with every known secret value (default: every
    registered one) replaced by ``***`` wherever it occurs in a string or a key. Only values are
    masked: what the host already masked by pattern stays as it came."""
    known = known_secrets() if secrets is None else secrets
    if isinstance(value, str):
        for s in known:
            value = value.replace(s, MASK) if len(s) >= MIN_SECRET_LEN else value
        return mask_registered(value)
    if isinstance(value, (list, tuple)):
        return [mask_known(v, known) for v in value]
    if isinstance(value, dict):
        return {mask_known(k, known): mask_known(v, known) for k, v in value.items()}
    return value


def mask_record(value: Any) -> Any:
    """A stored record (an audit record; JSON-like) masked as it is shown, with what this process
    knows now: every registered or remembered value and today's rules by pattern, whatever the
    process that wrote it knew (a secret declared later, a form an older runwatch missed). An
    ``argv`` list is masked as a command line (:func:`mask_argv`), every other string as text."""
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, dict):
        return {
            k: (
                mask_argv([str(a) for a in v])
                if k == "argv" and isinstance(v, list)
                else mask_record(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [mask_record(v) for v in value]
    return value


# ------------------------------------------------------------------ values given once: digests

DIGESTS_NAME = "secret-digests"
_BOUNDARY_RE = re.compile(r"""[\s"'`=:,;&@/()\[\]{}<>|]""")
DIGEST_SCAN_MAX = 1 << 18
"""Longest text searched for remembered values (256 KiB: a log tail, an event, an error; a bulk
JSON listing holds no log text)."""
_digests: dict[int, set[str]] = {}
_salt: bytes = b""
_seen: tuple[int, int] | None = None
_checked = 0.0


def _digests_path() -> Path:
    return state_dir() / DIGESTS_NAME


def _digest(value: str) -> str:
    return hashlib.sha256(_salt + value.encode("utf-8", "surrogateescape")).hexdigest()


def _load(force: bool = False) -> None:
    """(Re)read the digests file when it changed (looked at most once a second)."""
    global _salt, _seen, _checked
    now = time.monotonic()
    if not force and now - _checked < 1.0:
        return
    _checked = now
    path = _digests_path()
    try:  # never through another user's link (a world-writable parent of the state dir)
        st = safefs.lstat(str(path))
    except (OSError, safefs.UnsafePath):
        return
    if (st.st_size, st.st_mtime_ns) == _seen:
        return
    try:
        text = read_private(path).decode()
    except (OSError, UnsafeState, UnicodeDecodeError):
        return
    _seen = (st.st_size, st.st_mtime_ns)
    lines = text.splitlines()
    if not lines or not lines[0].startswith("salt "):
        return
    _salt = bytes.fromhex(lines[0].split()[1])
    _digests.clear()
    for line in lines[1:]:
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            _digests.setdefault(int(parts[0]), set()).add(parts[1])


def _ensure_file(path: Path) -> None:
    """The digests file, created whole (its salt line) or not at all, in the private state dir
    (:func:`private_dir`: never made or written through another user's link)."""
    private_dir(path.parent)
    dfd, name = safefs.walk(str(path), follow_last=False)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.stat(name, dir_fd=dfd, follow_symlinks=False)
            return
        tmp = f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600, dir_fd=dfd)  # fmt: skip
        try:
            os.write(fd, f"salt {os.urandom(16).hex()}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # never replaces one made meanwhile
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        os.unlink(tmp, dir_fd=dfd)
    finally:
        os.close(dfd)


def word_forms(value: str) -> list[str]:
    """The encodings of ``value`` that stand as one word in text (:func:`mask_digests`): base64
    (urlsafe, and standard when it has no ``/``) without padding, percent-encoded, hex."""
    raw = value.encode("utf-8", "surrogateescape")
    std = base64.b64encode(raw).decode("ascii").rstrip("=")
    forms = [std, base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")]
    forms += [quote(raw, safe=""), raw.hex(), raw.hex().upper()]
    return [f for f in dict.fromkeys(forms) if f != value and not _BOUNDARY_RE.search(f)]


def remember(values: Iterable[str]) -> None:
    """Keep the digests of ``values`` (at least ``MIN_SECRET_LEN`` long), and of their encodings
    that stand as a word (:func:`word_forms`), for later processes."""
    given = {v.strip() for v in values if len(v.strip()) >= MIN_SECRET_LEN}
    wanted = sorted(given | {f for v in given for f in word_forms(v)})
    if not wanted:
        return
    path = _digests_path()
    try:
        _ensure_file(path)
        _load(force=True)
        new = [v for v in wanted if _digest(v) not in _digests.get(len(v), set())]
        if not new:
            return
        lines = "".join(f"{len(v)} {_digest(v)}\n" for v in new)
        fd = open_private(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        _load(force=True)
    except (OSError, UnsafeState, safefs.UnsafePath):
        pass  # the value is still registered in this process; only later ones miss it


def mask_digests(text: str) -> str:
    """``text`` with every word whose digest was remembered (:func:`remember`) masked: a word
    starts and ends at a boundary (space, quote, ``=``, ``:``, ``,``, ``/``...). Text longer
    than ``DIGEST_SCAN_MAX`` is left as it is (a bulk JSON listing holds no log text)."""
    _load()
    if not _digests or len(text) < min(_digests) or len(text) > DIGEST_SCAN_MAX:
        return text
    n = len(text)
    ends = {m.start() for m in _BOUNDARY_RE.finditer(text)}
    ends.add(n)
    spans: list[tuple[int, int]] = []
    covered = 0
    for start in [0, *(e + 1 for e in sorted(ends) if e < n)]:
        if start < covered:
            continue
        for length, digests in _digests.items():
            end = start + length
            if end in ends and _digest(text[start:end]) in digests:
                spans.append((start, end))
                covered = end
                break
    if not spans:
        return text
    out, last = [], 0
    for start, end in spans:
        out += [text[last:start], MASK]
        last = end
    out.append(text[last:])
    return "".join(out)


def mask_registered(text: str) -> str:
    """``text`` with every registered value and every remembered one masked (values only)."""
    return mask_digests(masking.mask_registered(text))


def mask_json_text(text: str) -> str:
    """JSON text with every registered or remembered value masked inside its strings."""
    return mask_digests(masking.mask_json_text(text))


def mask_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """Free text masked by value (registered, remembered, ``secrets``) and by pattern."""
    return mask_digests(masking.mask_text(text, secrets))


def mask_argv(argv: Sequence[str], secrets: Iterable[str] | None = None) -> list[str]:
    """An argv masked by value (registered, remembered, ``secrets``) and by pattern."""
    return [mask_digests(a) for a in masking.mask_argv(argv, secrets)]
