"""The script given with ``launch/restart --script PATH``: a local file that becomes the run's
script on the host once the old run is stopped.

It is read here, bounded (``agent.argspec.MAX_SOURCE_BYTES``), hashed, and never run: its
options and its argparse reading of the new command line come from the same static readers
the host uses for the installed script (``agent.argspec.read_options``,
``agent.argresolve.resolve_in``), so the preflight checks the command line against the script
that will run it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tokenize
from dataclasses import dataclass

import msgspec

from supervisor.agent.argresolve import resolve_in
from supervisor.agent.argspec import read_options, read_source
from supervisor.errors import UsageError
from supervisor.replies import ResolvedArgs, ScriptFlags


@dataclass(frozen=True)
class NewScript:
    """A local script to install on the run's host."""

    path: str
    """Where it was read on this machine."""
    source: bytes
    sha256: str

    @property
    def short(self) -> str:
        return self.sha256[:12]

    @property
    def source_b64(self) -> str:
        return base64.b64encode(self.source).decode("ascii")

    def flags(self, host_path: str) -> ScriptFlags:
        """Its options, as ``script_flags`` would read them at ``host_path``."""
        return msgspec.convert(read_options(self.source, host_path), ScriptFlags)

    def resolve(self, host_path: str, workdir: str, args: list[str]) -> ResolvedArgs:
        """What ``args`` mean to its parser (as ``resolve_args`` would answer at ``host_path``)."""
        return msgspec.convert(resolve_in(self.source, host_path, workdir, args), ResolvedArgs)


def load(path: str) -> NewScript:
    """Read ``path`` (a regular file within the size bound); UsageError naming why not."""
    full = os.path.abspath(os.path.expanduser(path))
    source, why = read_source(full)
    if source is None:
        raise UsageError(
            f"--script {path}: {why}",
            "give the path of the new script on this machine (a Python file of at most 1 MiB)",
        )
    why = undecodable(source)
    if why:
        raise UsageError(
            f"--script {path}: no Python can run it: {why}",
            "save it as UTF-8, or declare its encoding on its first line "
            "(# -*- coding: latin-1 -*-), then run the same command again",
        )
    return NewScript(path=full, source=source, sha256=hashlib.sha256(source).hexdigest())


def undecodable(source: bytes) -> str:
    """Why ``source`` is not text in the encoding it declares (PEP 263: UTF-8 unless a BOM or a
    coding line says otherwise), or "". Every Python 3 refuses to run such a file, whereas
    ``ast.parse`` of its bytes lets invalid bytes in a comment pass (and so the static reading
    of its options would)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
        source.decode(encoding)
    except SyntaxError as e:
        return str(e.msg)
    except UnicodeDecodeError as e:
        line = source[: e.start].count(b"\n") + 1
        return f"byte 0x{source[e.start]:02x} on line {line} is not {e.encoding}"
    return ""
