"""A run's script replaced on the host: the ``script_install`` op.

Standard library only, Python >= 3.8. The new script's bytes come in the request (base64),
never as shell text. The file is replaced only when it is still the one the laptop read (its
sha256): the old one is kept beside it as ``<script>.runwatch-<sha12>``, the new one written
to a file in the same directory and renamed over it (``safefs.write_atomic``), with the old
one's mode. With ``from_path`` (a rollback) the bytes are those of a kept copy on the host,
checked against ``from_sha256``. The reply carries both hashes, the new one read back from
the file now installed. With ``check`` (the preflight, before the old run is stopped) nothing
is written: the script must still have its sha256 and its directory must take a new file (a
read-only mount or a directory this user cannot write fails here, not after the stop). A
script that is a symbolic link is never replaced (it would become a file).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from typing import Any

from . import safefs
from .argspec import MAX_SOURCE_BYTES, read_bounded
from .protocol import AgentOpError, ScriptInstallResult, param_str

KEPT_INFIX = ".runwatch-"
"""The old script is kept as ``<script>.runwatch-<first 12 hex digits of its sha256>``."""


def _read(path: str) -> tuple[bytes, int]:
    """The bytes of ``path`` (a regular file of at most ``MAX_SOURCE_BYTES``) and its mode."""
    try:
        fd = safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise AgentOpError(f"{path}: no such file", "missing") from None
    except (OSError, safefs.UnsafePath) as e:
        raise AgentOpError(f"cannot open {path}: {e}", "unreadable") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise AgentOpError(f"{path} is not a regular file", "unreadable")
        data = read_bounded(fd)
    finally:
        os.close(fd)
    if len(data) > MAX_SOURCE_BYTES:
        raise AgentOpError(f"{path} is larger than {MAX_SOURCE_BYTES} bytes", "unreadable")
    return data, stat.S_IMODE(st.st_mode)


def _not_a_link(path: str) -> None:
    """Refuse a script that is a symbolic link (the user's own; another user's is refused on
    the way): replacing it would put a file where the link was, which no rollback puts back,
    and leave the file it names, the one the run executes from then on elsewhere, as it was."""
    try:
        st = safefs.lstat(path)
    except (OSError, safefs.UnsafePath):
        return  # _read says why
    if stat.S_ISLNK(st.st_mode):
        target = os.path.realpath(path)
        raise AgentOpError(
            f"{path} is a symbolic link (to {target}): it would be replaced by a file; name "
            f"{target} in the run's argv, or copy the new script over {target} yourself",
            "link",
        )


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _new_bytes(params: dict[str, Any]) -> bytes:
    """The bytes to install: ``source_b64``, or the kept copy ``from_path`` (its hash checked)."""
    if "from_path" in params:
        kept, _ = _read(param_str(params, "from_path"))
        want = param_str(params, "from_sha256")
        if _sha(kept) != want:
            raise AgentOpError(
                f"{params['from_path']} is not the script kept before (sha256 {_sha(kept)[:12]}, "
                f"expected {want[:12]})",
                "changed",
            )
        return kept
    try:
        data = base64.b64decode(param_str(params, "source_b64"), validate=True)
    except (binascii.Error, ValueError):
        raise AgentOpError("parameter 'source_b64': not base64", "bad-params") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise AgentOpError(f"the new script is larger than {MAX_SOURCE_BYTES} bytes", "bad-params")
    return data


def script_install(params: dict[str, Any]) -> ScriptInstallResult:
    """``{path, expect_sha256, source_b64 | from_path + from_sha256, keep?, check?}``: replace
    the script at ``path`` (absolute) when its sha256 is still ``expect_sha256``; with ``keep``
    (default true) the old one is kept beside it first; with ``check`` only whether it could be
    (no bytes to install; ``new_sha256`` and ``kept`` empty)."""
    path = param_str(params, "path")
    if not os.path.isabs(path):
        raise AgentOpError(f"parameter 'path': not an absolute path: {path!r}", "bad-params")
    expect = param_str(params, "expect_sha256")
    keep = params.get("keep", True)
    check = params.get("check", False)
    if not isinstance(keep, bool) or not isinstance(check, bool):
        raise AgentOpError("parameters 'keep' and 'check': expected booleans", "bad-params")
    new = b"" if check else _new_bytes(params)
    _not_a_link(path)
    old, mode = _read(path)
    old_sha = _sha(old)
    if old_sha != expect:
        raise AgentOpError(
            f"{path} changed since runwatch read it (sha256 {old_sha[:12]} now, "
            f"{expect[:12]} then); nothing was replaced",
            "changed",
        )
    kept = ""
    try:
        if check:
            safefs.check_replaceable(path)
            return {"path": path, "old_sha256": old_sha, "new_sha256": "", "kept": "", "mode": mode}
        if keep:
            kept = path + KEPT_INFIX + old_sha[:12]
            safefs.write_atomic(kept, old, mode)
        safefs.write_atomic(path, new, mode)
    except (OSError, safefs.UnsafePath) as e:
        raise AgentOpError(f"cannot replace {path}: {e}", "io") from None
    installed, now_mode = _read(path)
    return {
        "path": path,
        "old_sha256": old_sha,
        "new_sha256": _sha(installed),
        "kept": kept,
        "mode": now_mode,
    }
