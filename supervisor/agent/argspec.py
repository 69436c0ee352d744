"""A client's command-line flags, read from its argparse source without running it; the
``script_flags`` op.

Standard library only, Python >= 3.8 (runs on the host inside the agent). The script is found as
its launch would find it (relative to the run's workdir, or on ``PATH`` when it is executed by
name), read (bounded) and parsed with ``ast``: it is never imported or executed, because a client
that parses its argv by hand does its work whatever it is given (``--help`` included).

Every ``add_argument(...)`` call on any object counts (parsers, argument groups, mutually
exclusive groups, subparsers' parsers, parent parsers): its option strings, ``dest``, ``action``,
``type`` when it is a plain name, literal ``choices``, ``nargs``, ``default`` and ``required``.
What is not written literally is reported as unknown, never guessed. A script whose flags cannot
be read this way (it parses ``sys.argv`` by hand, uses click or typer, cannot be read or parsed)
answers ``found: false`` with the reason.
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import stat
import sys
import tokenize
from typing import Any

from supervisor.agent import safefs
from supervisor.agent.datafiles import resolve
from supervisor.agent.masking import mask_argv
from supervisor.agent.protocol import (
    MASK,
    AgentOpError,
    ScriptFlagsResult,
    ScriptOption,
    param_str,
    param_str_list,
)

MAX_SOURCE_BYTES = 1024 * 1024
"""A script larger than this is not read: no generation script is that large, and parsing one
takes about a second."""
MAX_RANGE_CHOICES = 100
"""``choices=range(...)`` longer than this is reported as unread."""

_NO_VALUE_ACTIONS = frozenset(
    (
        "store_const", "store_true", "store_false", "append_const", "count", "help", "version",
        "boolean_optional",
    )
)  # fmt: skip
_VALUE_ACTIONS = frozenset(("store", "append", "extend"))
_PLAIN_TYPES = {"int": "int", "float": "float", "str": "str", "bool": "bool"}
_OTHER_PARSERS = {
    "click": "click",
    "typer": "typer",
    "fire": "python-fire",
    "docopt": "docopt",
    "absl": "absl flags",
    "optparse": "optparse",
    "hydra": "hydra",
    "tyro": "tyro",
    "jsonargparse": "jsonargparse",
}
"""Top-level module -> the argument parser it stands for, named in a ``found: false`` reason."""


def script_path(workdir: str, script: str, executed: bool, search_path: str | None) -> str | None:
    """The file the launch runs: ``script`` relative to ``workdir`` (``~`` is not expanded: no
    shell sees the argv), or, for a script executed by a name without ``/``, the first
    executable of that name on ``search_path`` (as ``execvp`` finds it; None when none is)."""
    if executed and "/" not in script:
        for d in (search_path if search_path is not None else os.defpath).split(os.pathsep):
            candidate = os.path.join(os.path.join(workdir, d) if d else workdir, script)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
        return None
    return os.path.normpath(os.path.join(workdir, script))


def read_bounded(fd: int) -> bytes:
    """What ``fd`` holds, read up to one byte past ``MAX_SOURCE_BYTES`` (so that a caller sees a
    file too large without reading it all)."""
    chunks = []
    left = MAX_SOURCE_BYTES + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_source(path: str) -> tuple[bytes | None, str]:
    """``(source, "")``, or ``(None, why it cannot be read)``. Opened without blocking (a FIFO
    named as a script must not hang the agent) and read only when it is a regular file."""
    try:
        fd = safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK)  # never another user's link
    except safefs.UnsafePath as e:
        return None, str(e)
    except OSError as e:
        return None, f"cannot open {path}: {e.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{path} is not a regular file"
        if st.st_size > MAX_SOURCE_BYTES:
            return None, f"{path} is larger than {MAX_SOURCE_BYTES // (1024 * 1024)} MiB"
        data = read_bounded(fd)
    except OSError as e:
        return None, f"cannot read {path}: {e.strerror}"
    finally:
        os.close(fd)
    if len(data) > MAX_SOURCE_BYTES:
        return None, f"{path} is larger than {MAX_SOURCE_BYTES // (1024 * 1024)} MiB"
    return data, ""


def _name(node: ast.AST) -> str | None:
    """``x`` of ``x`` or ``a.b.x``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _literal(node: ast.AST) -> tuple[bool, Any]:
    """``(True, value)`` for a literal str, int, float, bool or None; ``(False, None)`` else."""
    if isinstance(node, ast.Constant) and (
        node.value is None or isinstance(node.value, (str, int, float, bool))
    ):
        return True, node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, (int, float))
        and not isinstance(node.operand.value, bool)
    ):
        return True, -node.operand.value
    return False, None


def _choices(node: ast.AST) -> list[Any] | None:
    """The literal choices (a list, tuple or set of literals, or ``range`` of int literals);
    None when they are not written literally."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        out = []
        for elt in node.elts:
            ok, value = _literal(elt)
            if not ok:
                return None
            out.append(value)
        return out
    if isinstance(node, ast.Call) and _name(node.func) == "range" and not node.keywords:
        bounds = [_literal(a) for a in node.args]
        if not 1 <= len(bounds) <= 3 or not all(
            ok and isinstance(v, int) and not isinstance(v, bool) for ok, v in bounds
        ):
            return None
        r = range(*[v for _, v in bounds])
        return list(r) if len(r) <= MAX_RANGE_CHOICES else None
    return None


def _text(value: Any) -> str:
    """A choice as the value a command line gives for it."""
    return value if isinstance(value, str) else str(value)


class _Reader(ast.NodeVisitor):
    def __init__(self) -> None:
        self.options: list[ScriptOption] = []
        self.dynamic = 0
        """``add_argument`` calls whose option strings are not all written literally."""
        self.positionals = 0
        self.parsers: list[dict[str, Any]] = []
        """Literal keywords of each ``ArgumentParser(...)`` / ``add_parser(...)`` call."""
        self.prefix = "-"
        """Every ``prefix_chars`` of the parsers seen."""
        self.imports: set[str] = set()
        self.reads_sys_argv = False
        self.known_args = False

    def visit_Import(self, node: ast.Import) -> None:
        self.imports.update(a.name.split(".")[0] for a in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and not node.level:
            self.imports.add(node.module.split(".")[0])

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "argv" and _name(node.value) == "sys":
            self.reads_sys_argv = True
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self.call(_name(node.func), isinstance(node.func, ast.Attribute), node, node.lineno)
        self.generic_visit(node)

    def call(self, name: str | None, method: bool, node: ast.Call, line: int) -> None:
        """A call of ``name`` (``method``: as ``x.name(...)``) at ``line``."""
        if name == "add_argument" and method:
            self._add_argument(node, line)
        elif name in ("ArgumentParser", "add_parser"):
            kw = {}
            for k in node.keywords:
                ok, value = _literal(k.value)
                if k.arg is not None and ok:
                    kw[k.arg] = value
            self.parsers.append(kw)
            chars = kw.get("prefix_chars")
            if isinstance(chars, str):
                self.prefix += "".join(c for c in chars if c not in self.prefix)
        elif name in ("parse_known_args", "parse_known_intermixed_args"):
            self.known_args = True

    def _add_argument(self, node: ast.Call, line: int) -> None:
        names: list[str] = []
        literal = True
        for arg in node.args:
            ok, value = _literal(arg)
            if ok and isinstance(value, str):
                names.append(value)
            else:
                literal = False
        if not literal:
            self.dynamic += 1
        prefix = self.prefix
        flags = [n for n in names if n and n[0] in prefix]
        if not flags:
            if names and literal:
                self.positionals += 1
            return
        kw: dict[str, ast.AST] = {}
        spread = False  # add_argument(..., **options): nothing but the names is known
        for k in node.keywords:
            if k.arg is None:
                spread = True
            else:
                kw[k.arg] = k.value
        action = "unknown" if spread else "store"
        if "action" in kw:
            ok, value = _literal(kw["action"])
            if ok and isinstance(value, str):
                action = value
            elif _name(kw["action"]) == "BooleanOptionalAction":
                action = "boolean_optional"
            else:
                action = "custom"
        if action == "boolean_optional":
            # BooleanOptionalAction also declares --no-NAME for each --NAME.
            flags += ["--no-" + f[2:] for f in flags if f.startswith("--")]
        option: ScriptOption = {
            "flags": flags,
            "dest": _dest(flags, kw, prefix),
            "action": action,
            "takes_value": None,
            "type": None,
            "choices": None,
            "choices_unread": False,
            "nargs": None,
            "default": None,
            "has_default": False,
            "required": False,
            "line": line,
        }
        if "type" in kw:
            tname = kw["type"].id if isinstance(kw["type"], ast.Name) else None
            option["type"] = _PLAIN_TYPES.get(tname or "", "unknown")
        elif spread:
            option["type"] = "unknown"
        if "choices" in kw:
            choices = _choices(kw["choices"])
            if choices is None:
                option["choices_unread"] = True
            else:
                option["choices"] = [_text(c) for c in choices]
        elif spread:
            option["choices_unread"] = True
        if "nargs" in kw:
            ok, value = _literal(kw["nargs"])
            if ok and isinstance(value, (str, int)) and not isinstance(value, bool):
                option["nargs"] = str(value)
            elif _name(kw["nargs"]) == "REMAINDER":
                option["nargs"] = "..."
            else:
                option["nargs"] = "unknown"
        if "default" in kw:
            ok, value = _literal(kw["default"])
            if ok:
                option["default"] = _masked_default(flags, value)
                option["has_default"] = True
        if "required" in kw:
            ok, value = _literal(kw["required"])
            option["required"] = value if ok and isinstance(value, bool) else None
        option["takes_value"] = _takes_value(action, option["nargs"])
        self.options.append(option)


_HELP: ScriptOption = {
    "flags": ["-h", "--help"],
    "dest": "help",
    "action": "help",
    "takes_value": False,
    "type": None,
    "choices": None,
    "choices_unread": False,
    "nargs": "0",
    "default": None,
    "has_default": False,
    "required": False,
    "line": 0,
}
"""What argparse adds to every parser built without ``add_help=False``."""


def _dest(flags: list[str], kw: dict[str, ast.AST], prefix: str) -> str:
    """``dest=`` when literal, else argparse's own: the first long option (else the first
    option) without its prefix, ``-`` as ``_``."""
    if "dest" in kw:
        ok, value = _literal(kw["dest"])
        return value if ok and isinstance(value, str) else ""
    longs = [f for f in flags if len(f) > 1 and f[1] in prefix]
    first = (longs or flags)[0]
    return first.lstrip(prefix).replace("-", "_")


def _takes_value(action: str, nargs: str | None) -> bool | None:
    """True: the option needs a value; False: it takes none; None: either, or not known."""
    if action in _NO_VALUE_ACTIONS:
        return False
    if action not in _VALUE_ACTIONS:
        return None
    if nargs is None or nargs == "+" or (nargs.isdigit() and int(nargs) > 0):
        return True
    if nargs == "0":
        return False
    return None


def _masked_default(flags: list[str], value: Any) -> Any:
    """A default of a secret-named option (``--api_key``) or a key-shaped one, masked: it would
    otherwise leave the host in clear."""
    if not isinstance(value, str):
        return value
    for flag in flags:
        shown = mask_argv([f"{flag}={value}"])[0].partition("=")[2]
        if shown != value:
            return MASK
    return value


_CALLS = frozenset(
    (
        "add_argument", "ArgumentParser", "add_parser", "parse_known_args",
        "parse_known_intermixed_args",
    )
)  # fmt: skip
_OPENING = {"(": ")", "[": "]", "{": "}"}


def _read_by_tokens(source: bytes, reader: _Reader) -> bool:
    """What :meth:`_Reader.visit` reads, for a file this Python cannot parse whole (a client run
    by a newer interpreter than the agent's: ``with (a, b):``, ``match``, ``type X = ...``):
    the tokenizer finds each call of interest and each is parsed alone. False when the file
    cannot even be tokenized."""
    try:
        tokens = list(tokenize.tokenize(io.BytesIO(source).readline))
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):
        return False
    encoding = tokens[0].string if tokens and tokens[0].type == tokenize.ENCODING else "utf-8"
    lines = source.decode(encoding, "replace").split("\n")
    words = [t for t in tokens if t.type in (tokenize.NAME, tokenize.OP)]
    for i, tok in enumerate(words):
        if tok.type != tokenize.NAME:
            continue
        before = words[i - 1].string if i else ""
        if tok.string in ("import", "from") and i + 1 < len(words):
            if words[i + 1].type == tokenize.NAME and words[i + 1].string != "import":
                reader.imports.add(words[i + 1].string)
        elif tok.string == "argv" and before == "." and i > 1 and words[i - 2].string == "sys":
            reader.reads_sys_argv = True
        elif tok.string in _CALLS and i + 1 < len(words) and words[i + 1].string == "(":
            node = _call_at(words, i + 1, lines)
            if node is not None:
                reader.call(tok.string, before == ".", node, tok.start[0])
            elif tok.string == "add_argument" and before == ".":
                reader.dynamic += 1
    return True


def _call_at(words: list[tokenize.TokenInfo], open_at: int, lines: list[str]) -> ast.Call | None:
    """The call whose ``(`` is ``words[open_at]``, parsed alone; None when it does not parse."""
    depth = 0
    for j in range(open_at, len(words)):
        s = words[j].string
        if words[j].type != tokenize.OP:
            continue
        if s in _OPENING:
            depth += 1
        elif s in _OPENING.values():
            depth -= 1
            if depth == 0:
                (r1, c1), (r2, c2) = words[open_at].start, words[j].end
                if r1 == r2:
                    text = lines[r1 - 1][c1:c2]
                else:
                    text = "\n".join([lines[r1 - 1][c1:], *lines[r1 : r2 - 1], lines[r2 - 1][:c2]])
                try:
                    node = ast.parse("_" + text, mode="eval").body
                except (SyntaxError, ValueError, RecursionError, MemoryError):
                    return None
                return node if isinstance(node, ast.Call) else None
    return None


def read_options(source: bytes, path: str) -> ScriptFlagsResult:
    """What the argparse calls of ``source`` declare (see the module docstring)."""
    result: ScriptFlagsResult = {
        "path": path,
        "readable": True,
        "found": False,
        "reason": "",
        "options": [],
        "allow_abbrev": True,
        "dynamic": 0,
        "positionals": 0,
        "known_args": False,
        "sha256": hashlib.sha256(source).hexdigest(),
    }
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    reader = _Reader()
    try:
        reader.visit(ast.parse(source, filename=path))
    except SyntaxError as e:
        reader = _Reader()
        if not _read_by_tokens(source, reader) or not (reader.options or reader.dynamic):
            where = f" (line {e.lineno})" if e.lineno else ""
            result["reason"] = f"{path} is not Python {version} can parse{where}: {e.msg}"
            return result
    except ValueError as e:  # null bytes: a binary, not a script
        result["reason"] = f"{path} is not Python {version} can parse: {e}"
        return result
    except (RecursionError, MemoryError):
        result["reason"] = f"{path} is nested too deeply for Python {version} to parse"
        return result
    result["options"] = reader.options
    result["dynamic"] = reader.dynamic
    result["positionals"] = reader.positionals
    result["known_args"] = reader.known_args
    # argparse's prefix matching is off only where every parser turns it off.
    result["allow_abbrev"] = not reader.parsers or not all(
        p.get("allow_abbrev") is False for p in reader.parsers
    )
    if reader.options or reader.dynamic:
        result["found"] = True
        if any(p.get("add_help") is not False for p in reader.parsers):
            result["options"] = [_HELP, *reader.options]
        return result
    others = sorted(_OTHER_PARSERS[m] for m in reader.imports if m in _OTHER_PARSERS)
    if others:
        result["reason"] = f"{path} uses {', '.join(others)}, not argparse"
    elif "argparse" in reader.imports:
        result["reason"] = f"{path} imports argparse but declares no option in itself"
    elif reader.reads_sys_argv:
        result["reason"] = f"{path} reads sys.argv itself (no argparse)"
    else:
        result["reason"] = f"{path} declares no option with argparse"
    return result


def script_flags(params: dict[str, Any]) -> ScriptFlagsResult:
    """``{workdir, argv, search_path?}`` -> the flags the script of ``argv`` declares. ``argv``
    is the run's command up to its script (interpreter and script, or the script alone when it
    is executed directly); ``search_path`` is the ``PATH`` of the launch's environment. The
    script is read, never run."""
    workdir = resolve(param_str(params, "workdir"))
    argv = param_str_list(params, "argv")
    search_path = params.get("search_path")
    if search_path is not None and not isinstance(search_path, str):
        raise AgentOpError("parameter 'search_path': expected a string", "bad-params")
    found = script_path(workdir, argv[-1], len(argv) == 1, search_path)
    path = found or argv[-1]
    if found is None:
        source, why = None, f"no executable {path} on the launch's PATH"
    else:
        source, why = read_source(found)
    if source is None:
        return {
            "path": path,
            "readable": False,
            "found": False,
            "reason": why,
            "options": [],
            "allow_abbrev": True,
            "dynamic": 0,
            "positionals": 0,
            "known_args": False,
            "sha256": "",
        }
    return read_options(source, path)
