"""The audit log: every kill, launch, restart, move-aside, repair and budget action, one JSON line
each, appended to ``$XDG_STATE_HOME/runwatch/audit.jsonl``.

A line is written with a single ``write`` on a file opened with ``O_APPEND``, so concurrent
runwatch processes never interleave their lines. argv is stored masked (``***`` for secrets) and
``detail`` strings are masked too; an API key never reaches this file.

The log stays one append-only file for every config; each record carries ``config``, the
identity of the config it was written for (``Config.key``). ``runwatch audit`` and the watcher
read their config's records (``read(config=...)``; ``runwatch audit --all`` every record, and
those of an older runwatch, which carry no ``config``: they are never given to a config, which
could not be told apart). The file is kept 0600 in a 0700 state dir, opened with ``O_NOFOLLOW``,
and refused (``UnsafeState``) when it is a link, another user's or writable by others: a forged
log is never shown nor appended to.

Record fields: ``time`` (Unix seconds), ``config``, ``action`` (``kill``, ``launch``, ``restart``,
``move-aside``, ``repair``, ``budget``), ``host``, ``run``, ``ok``, ``identity`` (the process acted
on or started, or None), ``argv`` (masked), ``steps`` (``[{"name", "ok", "detail"}]``), plus any
action-specific keys, and ``by``: who acted and from where (``user@machine, pid N, runwatch
kill``: the front end that :func:`set_origin` named); a start the gate refused (a ``rollback``,
an ``auto-restart``) has ``refused`` and the ``command`` that starts the run keeping its output.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from supervisor.paths import open_private, read_private, state_dir
from supervisor.secrets import mask_argv, mask_json_text, mask_text

AUDIT_NAME = "audit.jsonl"
_origin = "runwatch"


def set_origin(origin: str) -> None:
    """Name the front end this process acts from (``runwatch kill``, ``dashboard``, ``runwatch
    watch``): every record it writes says so in ``by``."""
    global _origin
    _origin = origin


def actor() -> str:
    """Who acts and from where: ``user@machine, pid N, <front end>``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}, pid {os.getpid()}, {_origin}"


def audit_path() -> Path:
    """Where the audit log lives (``state_dir()/audit.jsonl``)."""
    return state_dir() / AUDIT_NAME


def _masked(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        return mask_text(value, secrets)
    if isinstance(value, list):
        return [_masked(v, secrets) for v in value]
    if isinstance(value, tuple):
        return [_masked(v, secrets) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k == "argv" and isinstance(v, (list, tuple)):
                out[k] = mask_argv([str(a) for a in v], secrets)
            else:
                out[k] = _masked(v, secrets)
        return out
    return value


def by_this_process(entry: dict[str, Any]) -> bool:
    """Whether ``entry`` was written by this process (its ``by`` names this pid and machine)."""
    parts = str(entry.get("by") or "").split(", ")
    return (
        len(parts) >= 2
        and parts[1] == f"pid {os.getpid()}"
        and (parts[0].endswith(f"@{socket.gethostname()}"))
    )


def actor_alive(by: str) -> bool:
    """Whether the process an ``actor()`` text names is alive on this machine (False for one
    that ended, or of another machine: what it did is all its records say)."""
    parts = by.split(", ")
    if len(parts) < 2 or not parts[0].endswith(f"@{socket.gethostname()}"):
        return False
    try:
        pid = int(parts[1].removeprefix("pid "))
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def record(
    action: str,
    *,
    host: str,
    run: str | None,
    ok: bool,
    identity: Mapping[str, Any] | None = None,
    argv: list[str] | None = None,
    steps: list[dict[str, Any]] | None = None,
    secrets: list[str] | None = None,
    config: str = "",
    **extra: Any,
) -> dict[str, Any]:
    """Append one record of the config ``config`` (its ``Config.key``; every action of the
    engine passes it, a record without one is shown by ``runwatch audit --all`` only) and return
    it (as written). ``secrets`` are masked wherever they occur."""
    entry: dict[str, Any] = {
        "time": time.time(),
        "config": config,
        "action": action,
        "host": host,
        "run": run,
        "ok": ok,
        "identity": identity,
        "argv": argv,
        "steps": steps or [],
        "by": actor(),
    }
    entry.update(extra)
    from supervisor.secrets import known_secrets

    masked = _masked(entry, [s for s in (secrets or []) if s] + known_secrets())
    append(masked)
    return dict(masked)


def append(entry: dict[str, Any]) -> None:
    """Append one JSON line with a single ``O_APPEND`` write."""
    path = audit_path()
    line = (mask_json_text(json.dumps(entry, sort_keys=True, default=str)) + "\n").encode()
    fd = open_private(path, os.O_WRONLY | os.O_APPEND)
    try:
        written = os.write(fd, line)
        if written != len(line):  # pragma: no cover - a full disk
            raise OSError(f"short write to {path}: {written} of {len(line)} bytes")
    finally:
        os.close(fd)


def read(
    limit: int | None = None, path: Path | None = None, config: str | None = None
) -> list[dict[str, Any]]:
    """The records, oldest first (the last ``limit`` when given), of the config ``config``
    (its ``Config.key``; None: every record). Unparseable lines are skipped; a log that is a link,
    another user's or writable by others is refused (``UnsafeState``)."""
    p = path or audit_path()
    try:
        raw = read_private(p)
    except FileNotFoundError:
        return []
    return _parse(raw, limit, config)


Mark = tuple[int, int]
"""A place in the audit log: its inode and size (:func:`mark`)."""


def mark(path: Path | None = None) -> Mark:
    """Where the audit log ends now: what :func:`read_marked` tells from. Records after a mark
    were written after it, whatever their times say (a wall clock stepped back, W23)."""
    try:
        st = (path or audit_path()).stat()
    except FileNotFoundError:
        return (0, 0)
    return (st.st_ino, st.st_size)


def read_marked(
    since: Mark, limit: int | None = None, path: Path | None = None, config: str | None = None
) -> list[tuple[bool, dict[str, Any]]]:
    """:func:`read`, each record with whether it was written after ``since`` (:func:`mark`;
    every record is when the log is another file than the one marked)."""
    p = path or audit_path()
    try:
        st = p.stat()
        raw = read_private(p)
    except FileNotFoundError:
        return []
    ino, size = since
    cut = size if st.st_ino == ino and len(raw) >= size else 0
    before = _parse(raw[:cut], None, config)
    after = _parse(raw[cut:], None, config)
    out = [(False, r) for r in before] + [(True, r) for r in after]
    if limit is not None:
        out = out[-limit:] if limit > 0 else []
    return out


def _parse(raw: bytes, limit: int | None, config: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and (config is None or value.get("config") == config):
            out.append(value)
    if limit is not None:
        out = out[-limit:] if limit > 0 else []
    return out


def format_record(entry: dict[str, Any]) -> str:
    """One line for humans: time, action, host/run, outcome, pid and the failing step if any."""
    t = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(entry.get("time", 0))))
    ident = entry.get("identity") or {}
    pid = f" pid {ident.get('pid')}" if isinstance(ident, dict) and ident.get("pid") else ""
    outcome = "ok" if entry.get("ok") else "REFUSED" if entry.get("refused") else "FAILED"
    where = f"{entry.get('host')}/{entry.get('run') or '-'}"
    steps = entry.get("steps") or []
    failed = next((s for s in steps if isinstance(s, dict) and not s.get("ok")), None)
    detail = ""
    if failed is not None:
        detail = f" - {_step_label(failed)}: {_first_line(failed.get('detail'))}"
    elif entry.get("detail"):
        detail = f" - {_first_line(entry.get('detail'))}"
    return f"{t}  {entry.get('action', '?'):<10} {where:<24} {outcome}{pid}{detail}"


def _step_label(step: dict[str, Any]) -> str:
    """A step's name: a gate step's ``name``, a plan step's ``action`` and ``run`` (a rebalance)."""
    if step.get("name"):
        return str(step["name"])
    label = " ".join(str(step[k]) for k in ("action", "run") if step.get(k))
    return label or "a step"


def _first_line(text: Any) -> str:
    return str(text).strip().split("\n", 1)[0]
