"""What a command line means to the client's own argparse parser; the ``resolve_args`` op.

Standard library only, Python >= 3.8 (runs on the host inside the agent). The client's source is
read with ``ast`` (never imported or executed, as in ``argspec``). When its parser can be read
*exactly* - one ``ArgumentParser(...)`` whose keywords that change parsing are literal, every
``add_argument`` / ``add_argument_group`` / ``add_mutually_exclusive_group`` / ``set_defaults``
call on it made once, in the straight-line statements of the block that builds it, with literal
option strings, a known action (``BooleanOptionalAction`` too), a plain type and literal
``nargs``, ``choices``, ``required`` and ``dest``; no custom action, no parents, no subparsers,
no ``parse_known_args``, no ``sys.argv`` read but ``sys.argv[0]`` - a real
``argparse.ArgumentParser`` is built here with those arguments and the argv is handed to it.
Python's own argparse then resolves repeats, ``--no-X``, abbreviations, attached short options
(``-oFILE``), ``@files`` (read relative to the run's workdir, bounded) and defaults exactly as
the client will. A default that is not literal (``os.environ.get(...)``) is reported unknown.

The reply: the resolved namespace (dest -> value), the dests the argv itself set, option string ->
dest, or argparse's own error message; or ``exact: false`` and why the parser cannot be read
exactly (then the laptop accepts only a canonical argv).

Limits: the host's argparse decides, which is the client's when the client runs under the same
Python version (argparse changed little from 3.8 on; the agent's version is in the reply).
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import pathlib
import sys
from typing import Any, NoReturn

from supervisor.agent.argspec import read_options, read_source, script_path
from supervisor.agent.datafiles import resolve
from supervisor.agent.masking import mask_argv
from supervisor.agent.protocol import (
    MASK,
    AgentOpError,
    ResolveArgsResult,
    param_str,
    param_str_list,
)

MAX_ARGS_FILE_BYTES = 256 * 1024
"""An ``@file`` larger than this is not read (the argv is refused)."""
MAX_ARGS_FILE_DEPTH = 8
"""``@file`` inside ``@file`` deeper than this is refused (argparse would recurse)."""

_ACTIONS = frozenset(
    (
        "store", "store_const", "store_true", "store_false", "append", "append_const", "count",
        "help", "version", "extend",
    )
)  # fmt: skip
_BUILTIN_TYPES: dict[str, Any] = {"int": int, "float": float, "str": str, "bool": bool}
_NARGS_NAMES = {"OPTIONAL": "?", "ZERO_OR_MORE": "*", "ONE_OR_MORE": "+", "REMAINDER": "..."}
_PARSER_KW = frozenset(
    ("prefix_chars", "fromfile_prefix_chars", "argument_default", "conflict_handler", "add_help")
) | {"allow_abbrev"}
"""Constructor keywords that change parsing: they must be literal."""
_PARSER_KW_IGNORED = frozenset(
    ("prog", "usage", "description", "epilog", "formatter_class", "exit_on_error", "color")
) | {"suggest_on_error"}
"""Constructor keywords that change only messages (or what ``error()`` does, overridden here)."""
_ARG_KW_IGNORED = frozenset(("help", "metavar", "version", "deprecated"))
_TRACKED_CALLS = frozenset(
    (
        "add_argument", "add_argument_group", "add_mutually_exclusive_group", "set_defaults",
        "ArgumentParser",
    )
)  # fmt: skip
_NEVER_CALLS = frozenset(
    (
        "add_subparsers", "add_parser", "parse_known_args", "parse_intermixed_args",
        "parse_known_intermixed_args", "register",
    )
)  # fmt: skip
_OPAQUE_CALLS = frozenset(("exec", "eval", "setattr", "__import__"))
"""Builtins that could change the parser out of sight (``setattr(p, ...)``, code in a string)."""
_HARMLESS_METHODS = frozenset(
    ("parse_args", "print_help", "print_usage", "format_help", "format_usage", "error", "exit")
)


class NotExact(Exception):
    """The parser cannot be read exactly; the message says why."""


class _Unknown:
    """A value not written literally (``default=os.environ.get(...)``)."""

    def __init__(self, why: str) -> None:
        self.why = why


class _Refused(Exception):
    """argparse's ``error()``: the client would exit with this message."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a refusal raises instead of exiting, nothing is printed, and an
    ``@file`` is read from the run's workdir, bounded."""

    workdir = "/"
    depth = 0

    def error(self, message: str) -> NoReturn:
        raise _Refused(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _Refused(
            "the command line asks for the client's help or version: it would print it and exit"
            + (f" ({message.strip()})" if message else "")
        )

    def _print_message(self, message: str, file: Any = None) -> None:
        pass

    def _read_args_from_files(self, arg_strings: list[str]) -> list[str]:
        # argparse's own loop (Lib/argparse.py), with the file opened relative to the workdir.
        out: list[str] = []
        chars = self.fromfile_prefix_chars or ""
        for arg in arg_strings:
            if not arg or arg[0] not in chars:
                out.append(arg)
                continue
            if self.depth >= MAX_ARGS_FILE_DEPTH:
                self.error(f"{arg}: @files nested deeper than {MAX_ARGS_FILE_DEPTH}")
            path = os.path.join(self.workdir, arg[1:])
            data, why = read_source(path)
            if data is None:
                self.error(why)
            assert data is not None
            if len(data) > MAX_ARGS_FILE_BYTES:
                self.error(f"{path} is larger than {MAX_ARGS_FILE_BYTES} bytes")
            text = data.decode(sys.getfilesystemencoding(), "surrogateescape")
            inner: list[str] = []
            for line in text.splitlines():
                inner.extend(self.convert_arg_line_to_args(line))
            self.depth += 1
            try:
                out.extend(self._read_args_from_files(inner))
            finally:
                self.depth -= 1
        return out


def _literal(node: ast.AST) -> tuple[bool, Any]:
    """``(True, value)`` for a literal (``ast.literal_eval``; ``argparse.SUPPRESS`` too)."""
    if isinstance(node, ast.Attribute) and node.attr == "SUPPRESS":
        return True, argparse.SUPPRESS
    if isinstance(node, ast.Name) and node.id == "SUPPRESS":
        return True, argparse.SUPPRESS
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None
    if isinstance(value, (dict, set, bytes, complex)):
        return False, None
    return True, value


def _method(node: ast.AST) -> tuple[str | None, str | None]:
    """``(receiver name, method)`` of ``name.method(...)``; ``(None, method)`` for another
    receiver; ``(None, None)`` for a call of a plain name."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        recv = node.func.value
        return (recv.id if isinstance(recv, ast.Name) else None), node.func.attr
    return None, None


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    return None


class _Script:
    """What the whole module says, for the checks that no parsing happens out of sight."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.bound: set[str] = set()
        self.from_imports: dict[str, str] = {}
        """Local name -> ``module.name`` of each ``from module import name``."""
        self.calls: dict[str, list[ast.Call]] = {}
        self.parents: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.bound.add(node.name)
                if isinstance(node, ast.ClassDef) and any(
                    (_name_of(b) or "").endswith("ArgumentParser") or _name_of(b) == "Action"
                    for b in node.bases
                ):
                    raise NotExact(f"line {node.lineno}: a class of its own built on argparse")
            elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                self.bound.add(node.id)
            elif isinstance(node, ast.arg):
                self.bound.add(node.arg)
            elif isinstance(node, ast.ImportFrom):
                for a in node.names:
                    local = a.asname or a.name
                    self.from_imports[local] = f"{node.module or ''}.{a.name}"
                    if node.module == "sys" and a.name == "argv":
                        raise NotExact(f"line {node.lineno}: it imports sys.argv")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.bound.add(a.asname)
            elif isinstance(node, ast.Call):
                name = _call_name(node)
                if name is not None:
                    self.calls.setdefault(name, []).append(node)
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "argv"
                and _name_of(node.value) == "sys"
                and not _argv0(tree, node)
            ):
                raise NotExact(f"line {node.lineno}: it reads sys.argv itself")
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for sub in ast.walk(t):
                        if isinstance(sub, ast.Attribute) and (
                            sub.attr.startswith("_")
                            or sub.attr
                            in ("convert_arg_line_to_args", "error", "exit", *_PARSER_KW)
                        ):
                            raise NotExact(
                                f"line {node.lineno}: it sets the parser attribute {sub.attr}"
                            )

    def enclosing(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The function whose body holds ``node``."""
        up = self.parents.get(id(node))
        while up is not None:
            if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return up
            up = self.parents.get(id(up))
        return None

    def builtin(self, name: str) -> bool:
        """True when ``name`` is the builtin: the script binds no name of its own to it."""
        return name not in self.bound and name not in self.from_imports


def _name_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _argv0(tree: ast.Module, attr: ast.Attribute) -> bool:
    """True when ``sys.argv`` at ``attr`` is read as ``sys.argv[0]`` (the script's name)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and node.value is attr:
            idx: Any = node.slice
            index = getattr(ast, "Index", None)
            if index is not None and isinstance(idx, index):  # Python 3.8
                idx = idx.value
            return (
                isinstance(idx, ast.Constant) and idx.value == 0 and isinstance(node.ctx, ast.Load)
            )
    return False


def _blocks(tree: ast.Module) -> list[list[ast.stmt]]:
    """The statement lists that run straight through once per entry: the module's body, each
    function's body, and ``if __name__ == "__main__":`` at the top."""
    out: list[list[ast.stmt]] = [tree.body]
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and "__name__" in ast.dump(stmt.test):
            out.append(stmt.body)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(node.body)
    return out


def _call_of(stmt: ast.stmt) -> tuple[str | None, ast.Call | None]:
    """``(assigned name, call)`` of ``x = call(...)``, ``call(...)``; ``(None, None)`` else."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return None, stmt.value
    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
        if len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            return stmt.targets[0].id, stmt.value
        return "", stmt.value
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.value, ast.Call):
        return (stmt.target.id if isinstance(stmt.target, ast.Name) else ""), stmt.value
    return None, None


def _assigned(stmt: ast.stmt) -> list[str]:
    """The names a statement binds at its top (``x = ...``, ``x: T = ...``, ``for x in``)."""
    return [
        n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    ]


class _Builder:
    """The parser of a script whose parser can be read exactly (else :class:`NotExact`)."""

    def __init__(self, script: _Script, prog: str) -> None:
        self.script = script
        self.prog = prog
        self.done: set[int] = set()
        """ids of the calls interpreted."""
        self.seen: list[str] = []

    def build(self) -> _Parser:
        ctors = self.script.calls.get("ArgumentParser", [])
        if len(ctors) != 1:
            raise NotExact(
                "no ArgumentParser(...) call" if not ctors else f"{len(ctors)} ArgumentParser calls"
            )
        ctor = ctors[0]
        if not self._is(ctor.func, "ArgumentParser"):
            raise NotExact(f"line {ctor.lineno}: an ArgumentParser that is not argparse's")
        for name in _NEVER_CALLS:
            for bad in self.script.calls.get(name, []):
                raise NotExact(f"line {bad.lineno}: it calls {name}")
        for name in _OPAQUE_CALLS:
            for bad in self.script.calls.get(name, []):
                if isinstance(bad.func, ast.Name):
                    raise NotExact(f"line {bad.lineno}: it calls {name}, which could do anything")
        parses = self.script.calls.get("parse_args", [])
        if not parses:
            raise NotExact("it never calls parse_args()")
        for parse in parses:
            if parse.keywords or len(parse.args) > 1:
                raise NotExact(f"line {parse.lineno}: parse_args is given its own arguments")
            if parse.args and not self._passes_argv(parse, parse.args[0], 0):
                raise NotExact(
                    f"line {parse.lineno}: parse_args is given arguments that may not be the "
                    "command line's (only a parameter ``argv=None`` that every caller leaves "
                    "out is)"
                )
        block = next(
            (b for b in _blocks(self.script.tree) if any(_call_of(s)[1] is ctor for s in b)), None
        )
        if block is None:
            raise NotExact(f"line {ctor.lineno}: the parser is not built in straight-line code")
        parser: _Parser | None = None
        objects: dict[str, Any] = {}
        for stmt in block:
            target, call = _call_of(stmt)
            for t in _assigned(stmt):
                if t != target or call is None:
                    objects.pop(t, None)
            if call is None:
                continue
            if call is ctor:
                if not target:
                    raise NotExact(f"line {ctor.lineno}: the parser is not assigned to a name")
                parser = self._parser(ctor)
                objects = {target: parser}
                self.done.add(id(ctor))
                continue
            recv, method = _method(call)
            if recv is None or recv not in objects:
                continue
            obj = objects[recv]
            self.done.add(id(call))
            if method == "add_argument":
                self._add_argument(obj, call)
            elif method in ("add_argument_group", "add_mutually_exclusive_group"):
                group = self._group(obj, method, call)
                if target:
                    objects[target] = group
            elif method == "set_defaults":
                if call.args:
                    raise NotExact(f"line {call.lineno}: set_defaults with positional arguments")
                values = {}
                for k in call.keywords:
                    if k.arg is None:
                        raise NotExact(f"line {call.lineno}: set_defaults(**...)")
                    ok, v = _literal(k.value)
                    values[k.arg] = v if ok else _Unknown(f"set_defaults at line {call.lineno}")
                obj.set_defaults(**values)
            elif method not in _HARMLESS_METHODS:
                raise NotExact(f"line {call.lineno}: it calls {method} on the parser")
            if target and method not in ("add_argument_group", "add_mutually_exclusive_group"):
                objects.pop(target, None)
        for name in _TRACKED_CALLS:
            for left in self.script.calls.get(name, []):
                if id(left) not in self.done:
                    raise NotExact(
                        f"line {left.lineno}: a {name} call runwatch cannot place (in a loop, a "
                        "branch, another function, or on another object)"
                    )
        assert parser is not None
        self._uses(block, set(objects))
        return parser

    def _passes_argv(self, call: ast.Call, arg: ast.expr, depth: int) -> bool:
        """True when ``arg`` of ``call`` is the command line: a parameter of the enclosing
        function with the default None, which every call of that function in the script leaves
        out or passes on the same way (``main(argv=None)`` called as ``main()``)."""
        if depth > 4 or not isinstance(arg, ast.Name):
            return False
        func = self.script.enclosing(call)
        if func is None:
            return False
        params = [*func.args.posonlyargs, *func.args.args]
        defaults = dict(zip([a.arg for a in params][::-1], func.args.defaults[::-1]))
        defaults.update(
            (a.arg, d) for a, d in zip(func.args.kwonlyargs, func.args.kw_defaults) if d
        )
        default = defaults.get(arg.id)
        if not (isinstance(default, ast.Constant) and default.value is None):
            return False
        position = next((i for i, a in enumerate(params) if a.arg == arg.id), None)
        parses = {id(c) for c in self.script.calls.get("parse_args", [])}
        for caller in self.script.calls.get(func.name, []):
            if id(caller) in parses:
                continue  # argparse's parse_args, not a function of the script named so
            given = [k.value for k in caller.keywords if k.arg == arg.id]
            if position is not None and len(caller.args) > position:
                given.append(caller.args[position])
            if any(isinstance(a, ast.Starred) for a in caller.args) or any(
                k.arg is None for k in caller.keywords
            ):
                return False
            if any(not self._passes_argv(caller, g, depth + 1) for g in given):
                return False
        return True

    def _uses(self, block: list[ast.stmt], names: set[str]) -> None:
        """The parser and its groups are used only by the calls read (or as ``return p``): a
        parser handed to a function could get arguments out of sight."""
        for stmt in block:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call):
                    for arg in [*node.args, *(k.value for k in node.keywords)]:
                        if isinstance(arg, ast.Name) and arg.id in names:
                            raise NotExact(
                                f"line {node.lineno}: the parser is handed to another call"
                            )

    def _parser(self, call: ast.Call) -> _Parser:
        if len(call.args) > 4:
            raise NotExact(f"line {call.lineno}: ArgumentParser with parents given positionally")
        kwargs: dict[str, Any] = {}
        for k in call.keywords:
            if k.arg is None:
                raise NotExact(f"line {call.lineno}: ArgumentParser(**...)")
            if k.arg in _PARSER_KW_IGNORED:
                continue
            ok, value = _literal(k.value)
            if k.arg == "parents" and ok and value in ([], ()):
                continue
            if k.arg not in _PARSER_KW or not ok:
                raise NotExact(f"line {call.lineno}: ArgumentParser({k.arg}=...) is not literal")
            kwargs[k.arg] = value
        try:
            return _Parser(prog=self.prog, **kwargs)
        except (TypeError, ValueError) as e:
            raise NotExact(f"line {call.lineno}: ArgumentParser(...) fails: {e}") from None

    def _group(self, obj: Any, method: str, call: ast.Call) -> Any:
        kwargs: dict[str, Any] = {}
        for k in call.keywords:
            if k.arg in ("title", "description"):
                continue
            ok, value = _literal(k.value) if k.arg is not None else (False, None)
            if k.arg != "required" or not ok:
                raise NotExact(f"line {call.lineno}: {method}({k.arg or '**'}=...)")
            kwargs[k.arg] = value
        if method == "add_mutually_exclusive_group" and call.args:
            raise NotExact(f"line {call.lineno}: {method} with positional arguments")
        return getattr(obj, method)(**kwargs)

    def _add_argument(self, obj: Any, call: ast.Call) -> None:
        line = call.lineno
        names = []
        for a in call.args:
            ok, value = _literal(a)
            if not ok or not isinstance(value, str):
                raise NotExact(f"line {line}: add_argument with a name not written literally")
            names.append(value)
        kwargs: dict[str, Any] = {}
        for k in call.keywords:
            if k.arg is None:
                raise NotExact(f"line {line}: add_argument(**...)")
            if k.arg in _ARG_KW_IGNORED:
                continue
            kwargs[k.arg] = self._keyword(k.arg, k.value, line)
        if kwargs.get("action") == "version":
            kwargs["version"] = ""
        try:
            action = obj.add_argument(*names, **kwargs)
        except (argparse.ArgumentError, TypeError, ValueError) as e:
            raise NotExact(f"line {line}: add_argument(...) fails here: {e}") from None
        seen = self.seen

        class _Seen(type(action)):  # type: ignore[misc]
            def __call__(self, *args: Any, **kw: Any) -> None:
                seen.append(self.dest)
                super().__call__(*args, **kw)

        action.__class__ = _Seen

    def _keyword(self, key: str, node: ast.AST, line: int) -> Any:
        if key == "action":
            ok, value = _literal(node)
            if ok and value in _ACTIONS:
                return value
            if self._is(node, "BooleanOptionalAction"):
                boolean = getattr(argparse, "BooleanOptionalAction", None)
                if boolean is None:
                    raise NotExact(f"line {line}: BooleanOptionalAction needs Python >= 3.9")
                return boolean
            raise NotExact(f"line {line}: action is not one of argparse's own")
        if key == "type":
            builtin = isinstance(node, ast.Name) and self.script.builtin(node.id)
            if builtin and isinstance(node, ast.Name) and node.id in _BUILTIN_TYPES:
                return _BUILTIN_TYPES[node.id]
            if self._is(node, "Path", "pathlib"):
                return pathlib.Path
            raise NotExact(f"line {line}: type is not int, float, str, bool or pathlib.Path")
        if key == "nargs":
            if isinstance(node, ast.Attribute) and node.attr in _NARGS_NAMES:
                return _NARGS_NAMES[node.attr]
            ok, value = _literal(node)
            if ok and (value in ("?", "*", "+", "...") or type(value) is int):
                return value
            raise NotExact(f"line {line}: nargs is not written literally")
        if key == "choices":
            if (
                isinstance(node, ast.Call)
                and _call_name(node) == "range"
                and self.script.builtin("range")
            ):
                bounds = [_literal(a) for a in node.args]
                if not node.keywords and all(ok and type(v) is int for ok, v in bounds):
                    return range(*[v for _, v in bounds])
            ok, value = _literal(node)
            if ok and isinstance(value, (list, tuple)):
                return value
            raise NotExact(f"line {line}: choices are not written literally")
        if key in ("default", "const"):
            ok, value = _literal(node)
            return value if ok else _Unknown(f"{key} at line {line} is not written literally")
        if key in ("dest", "required"):
            ok, value = _literal(node)
            if ok and isinstance(value, (str, bool)):
                return value
            raise NotExact(f"line {line}: {key} is not written literally")
        raise NotExact(f"line {line}: add_argument({key}=...) is not one runwatch reads")

    def _is(self, node: ast.AST, name: str, module: str = "argparse") -> bool:
        """True for ``module.name``, or ``name`` imported ``from module``."""
        if isinstance(node, ast.Attribute) and node.attr == name:
            return _name_of(node.value) == module
        if isinstance(node, ast.Name) and node.id == name:
            return self.script.from_imports.get(name) == f"{module}.{name}"
        return False


def build(source: bytes, path: str) -> tuple[_Parser, list[str]]:
    """The script's parser and the list each parse appends the dests it sets to; NotExact when
    it cannot be read exactly."""
    try:
        tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError) as e:
        raise NotExact(f"{path} is not Python this host's {_version()} parses: {e}") from None
    except (RecursionError, MemoryError):
        raise NotExact(f"{path} is nested too deeply to parse") from None
    builder = _Builder(_Script(tree), os.path.basename(path))
    return builder.build(), builder.seen


def _version() -> str:
    return f"Python {sys.version_info[0]}.{sys.version_info[1]}"


def _plain(value: Any) -> Any:
    """A resolved value as JSON: paths as text, lists of plain values, non-finite floats as
    text."""
    if isinstance(value, pathlib.PurePath):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _masked(flags: list[str], value: Any) -> Any:
    """A value of a secret-named option (``--api-key``), or a key-shaped one, masked: the
    namespace would otherwise carry it off the host in clear."""
    if isinstance(value, list):
        return [_masked(flags, v) for v in value]
    if not isinstance(value, str):
        return value
    for flag in flags or ["--value"]:
        if mask_argv([f"{flag}={value}"])[0].partition("=")[2] != value:
            return MASK
    return value


def resolve_in(source: bytes, path: str, workdir: str, args: list[str]) -> ResolveArgsResult:
    """What ``args`` (the argv after the script) mean to the parser of ``source``."""
    result: ResolveArgsResult = {
        "path": path,
        "exact": False,
        "reason": "",
        "error": None,
        "values": {},
        "unknown": {},
        "given": [],
        "options": {},
        "python": _version(),
    }
    try:
        parser, seen = build(source, path)
    except NotExact as e:
        result["reason"] = str(e)
        declared = read_options(source, path) if str(e).startswith("no ArgumentParser") else None
        if declared is not None and not declared["found"] and declared["reason"]:
            result["reason"] = declared["reason"]  # click, typer, sys.argv by hand...
        return result
    result["exact"] = True
    result["options"] = {s: a.dest for s, a in parser._option_string_actions.items()}
    parser.workdir = workdir
    try:
        namespace = parser.parse_args(args)
    except _Refused as e:
        result["error"] = str(e)
        return result
    except RecursionError:
        result["error"] = "the command line nests too deeply"
        return result
    flags: dict[str, list[str]] = {}
    for option, action in parser._option_string_actions.items():
        flags.setdefault(action.dest, []).append(option)
    for dest, value in vars(namespace).items():
        if isinstance(value, _Unknown):
            result["unknown"][dest] = value.why
        elif isinstance(value, list) and any(isinstance(v, _Unknown) for v in value):
            result["unknown"][dest] = next(v.why for v in value if isinstance(v, _Unknown))
        else:
            result["values"][dest] = _masked(flags.get(dest, []), _plain(value))
    result["given"] = list(dict.fromkeys(seen))
    return result


def resolve_args(params: dict[str, Any]) -> ResolveArgsResult:
    """``{workdir, argv, args, search_path?}``: ``argv`` is the command up to its script (as for
    ``script_flags``), ``args`` what follows it. The script is read, never run."""
    workdir = resolve(param_str(params, "workdir"))
    argv = param_str_list(params, "argv")
    args = param_str_list(params, "args")
    search_path = params.get("search_path")
    if search_path is not None and not isinstance(search_path, str):
        raise AgentOpError("parameter 'search_path': expected a string", "bad-params")
    found = script_path(workdir, argv[-1], len(argv) == 1, search_path)
    if found is None:
        source, why = None, f"no executable {argv[-1]} on the launch's PATH"
    else:
        source, why = read_source(found)
    if source is None:
        return {
            "path": found or argv[-1],
            "exact": False,
            "reason": why,
            "error": None,
            "values": {},
            "unknown": {},
            "given": [],
            "options": {},
            "python": _version(),
        }
    return resolve_in(source, found or argv[-1], workdir, args)
