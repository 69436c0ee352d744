"""The argument reading: a command line means to runwatch what it means to the client.

runwatch reads a command line by its own rules (``agent.argflags``, ``layout.layout_of``): the
last occurrence of a profile's flag wins, values follow their flag. The client's parser has rules
of its own (argparse: ``--no-X``, abbreviations, ``-oFILE``, ``@files``, defaults). Where they
differ, the gate would check other files than the client writes. So before any start:

- When the client's parser can be read exactly (``agent/argresolve.py``, op ``resolve_args``),
  argparse itself resolves the argv on the host. An argv it rejects (a flag the *installed*
  version does not have, a value its ``type`` refuses, a missing required option) is refused
  with argparse's own message; and for every flag the client profile gives a role, the value
  argparse resolves must equal runwatch's reading, or the start is refused naming the argument
  and the canonical way to write it. The installed script's parser says which flags exist; the
  profile only what they mean.
- When it cannot be read exactly (a dynamic ``add_argument``, a custom action, click or typer, a
  wrapper script, ``python -m``, an unreadable source), only a *canonical* argv is accepted for
  the profile's flags: ``--flag value`` or ``--flag=value`` with the profile's exact names, each
  role at most once, no abbreviation or negation (``--no-flag``) of one, no ``@file`` item, no
  attached short option (``-oFILE``), no profile flag after ``--``.

:func:`check` is the one verdict; the plan's ``preflight`` (before anything stops) and
``gate.Gate.check`` (right before every launch, the rollback's too) both use it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor import clients, display, flagcheck
from supervisor.agent import argflags, match
from supervisor.agentclient import AgentClient
from supervisor.layout import RunLayout
from supervisor.replies import ResolvedArgs


@dataclass
class Reading:
    """The verdict on how the client reads a command line."""

    problems: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    installed: frozenset[str] | None = None
    """Every option string of the installed script, when its parser was read exactly."""
    how: str = ""
    """How the command line was read, for a step's detail."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def refuse(self, problem: str, hint: str) -> None:
        self.problems.append(problem)
        if hint not in self.hints:
            self.hints.append(hint)


async def resolve(
    agent: AgentClient, layout: RunLayout, search_path: str | None, timeout: float
) -> ResolvedArgs | None:
    """The client's own reading of ``layout.argv`` (None: no script in the argv to read)."""
    idx = layout.script_index
    if idx is None:
        return None
    return await agent.resolve_args(
        workdir=layout.workdir,
        argv=list(layout.argv[: idx + 1]),
        args=list(layout.argv[idx + 1 :]),
        search_path=search_path,
        timeout=timeout,
    )


def check(layout: RunLayout, reply: ResolvedArgs | None) -> Reading:
    """The verdict on ``layout.argv`` given the client's own reading of it (see the module
    docstring)."""
    script = _script(layout)
    if reply is None or not reply.exact:
        why = reply.reason if reply is not None else "the command line names no known script"
        out = canonical(layout)
        out.how = f"canonical form ({script}'s parser cannot be read exactly: {why})"
        if not out.ok:
            out.hints.append(f"only a canonical argv is accepted: {out.how}")
        return out
    out = Reading(installed=frozenset(reply.options))
    out.how = f"by {script}'s own argparse parser ({reply.python} on the host)"
    if reply.error is not None:
        out.refuse(
            f"{script} would refuse this command line: {reply.error}",
            f"fix the command line: the installed {script} declares {_declared(reply)}",
        )
        missing = _unrecognized(reply.error)
        if missing:
            out.hints.append(flagcheck.newer_script(script, reply.path, "the run's host", missing))
        return out
    for role in clients.ROLES:
        spellings = list(getattr(layout.profile.flags, role))
        if spellings:
            _compare(out, layout, reply, role, spellings, script)
    return out


def _unrecognized(error: str) -> list[str]:
    """The options of argparse's "unrecognized arguments: ..." message (none for another
    error)."""
    _, sep, rest = error.partition("unrecognized arguments:")
    if not sep:
        return []
    return list(dict.fromkeys(a.partition("=")[0] for a in rest.split() if argflags.is_option(a)))


def canonical(layout: RunLayout) -> Reading:
    """The canonical-form rule for a client whose parser cannot be read exactly."""
    out = Reading()
    profile = layout.profile
    role_of = {f: r for r in clients.ROLES for f in getattr(profile.flags, r)}
    known = set(role_of) | set(profile.known_flags)
    start = _args_start(layout)
    count: dict[str, int] = {}
    after_dashes = False
    fix = "give each of the profile's flags once as --flag VALUE or --flag=VALUE, in full"
    args = list(layout.argv[start:])
    for i, arg in enumerate(args):
        name = arg.partition("=")[0]
        if after_dashes:
            if name in role_of:
                out.refuse(
                    f"{arg}: after --, where the client may not read it as {name}",
                    f"{fix}, before any --",
                )
            continue
        if arg == "--":
            after_dashes = True
        elif arg.startswith("@"):
            out.refuse(
                f"{arg}: an @file item, whose contents the client may read as arguments",
                f"{fix}: write the file's arguments in the command line itself",
            )
        elif name in role_of:
            role = role_of[name]
            count[role] = count.get(role, 0) + 1
            if count[role] == 2:
                out.refuse(
                    f"{name}: given more than once (the client may not take the last one)",
                    fix,
                )
            has_value = "=" in arg or (i + 1 < len(args) and not argflags.is_option(args[i + 1]))
            if role != "resume" and not has_value:
                out.refuse(f"{name}: given without a value", f"{fix}: {name} VALUE")
            elif role == "resume" and "=" in arg:
                out.refuse(f"{arg}: the resume switch takes no value", f"{fix}: {name} alone")
        elif not argflags.is_option(arg):
            continue
        elif arg.startswith("--no-") and "--" + name[5:] in role_of:
            out.refuse(
                f"{name}: a negation of {'--' + name[5:]}, which runwatch cannot read for "
                "this client",
                f"{fix}: drop {name}",
            )
        elif arg.startswith("--") and name not in known:
            full = sorted(f for f in role_of if f.startswith(name) and f != name)
            if full:
                out.refuse(
                    f"{name}: an abbreviation of {' or '.join(full)}",
                    f"{fix}: write {full[0]} in full",
                )
        elif not arg.startswith("--") and arg not in known:
            what = "with its value attached" if len(arg) > 2 else "no profile names"
            out.refuse(
                f"{arg}: a short option {what}, which runwatch cannot map to the client's flags",
                f"{fix}: use the long flag, e.g. {_first_path_flag(profile)} VALUE",
            )
    for role in ("output_dir", "output_file"):
        names = getattr(profile.flags, role)
        if names and role not in count and layout.profiled:
            out.refuse(
                f"{names[0]}: not in the command line, and what the client uses without it "
                "cannot be read",
                f"{fix}: give {names[0]} PATH explicitly",
            )
    return out


def _args_start(layout: RunLayout) -> int:
    """Where the client's own arguments begin: after its script, after ``-m MODULE`` of
    ``python -m``, else after the executable."""
    if layout.script_index is not None:
        return layout.script_index + 1
    argv = list(layout.argv)
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m":
            return i + 2
        if not arg.startswith("-"):
            break
    return 1


def _first_path_flag(profile: Any) -> str:
    for role in ("output_file", "output_dir"):
        names = getattr(profile.flags, role)
        if names:
            return str(names[0])
    return "--flag"


def _script(layout: RunLayout) -> str:
    idx = layout.script_index
    return posixpath.basename(layout.argv[idx]) if idx is not None else "the client"


def _declared(reply: ResolvedArgs) -> str:
    longs = sorted(o for o in reply.options if o.startswith("--") and o != "--help")
    shown = ", ".join(longs[:40]) + (", ..." if len(longs) > 40 else "")
    return shown or "no long option"


def _compare(
    out: Reading,
    layout: RunLayout,
    reply: ResolvedArgs,
    role: str,
    spellings: list[str],
    script: str,
) -> None:
    """argparse's value for ``role`` against runwatch's reading of it."""
    start = layout.script_index + 1 if layout.script_index is not None else 0
    args = list(layout.argv[start:])
    vals = argflags.values(args, spellings)
    flag = spellings[0]
    dests = {reply.options[f] for f in spellings if f in reply.options}
    if not dests:
        if vals is not None:
            given = next(n for n, _ in argflags.options(args) if n in spellings)
            out.refuse(
                f"{given}: not an option of the installed {script} (argparse reads it as "
                "something else)",
                f"drop {given}: the installed {script} declares {_declared(reply)}",
            )
        return
    if len(dests) > 1:
        out.refuse(
            f"{', '.join(spellings)}: the profile says they mean one thing, the installed "
            f"{script} stores them apart ({', '.join(sorted(dests))})",
            "describe the script's flags as they are in its [clients.NAME] profile",
        )
        return
    dest = dests.pop()
    set_by_argv = dest in reply.given
    if dest in reply.unknown:
        if vals is None and not set_by_argv and _needed(layout, role):
            out.refuse(
                f"{flag}: the value {script} uses without it is not known ({reply.unknown[dest]})",
                f"give {flag} VALUE explicitly in the command line",
            )
        return
    value = reply.values.get(dest)
    if role == "resume":
        ours = vals is not None
        theirs = bool(value)
        if ours != theirs:
            out.refuse(
                f"{flag}: argparse reads the command line as {'' if theirs else 'NOT '}resuming "
                f"({dest}={value!r}{_from(dest, args, reply)}), runwatch as "
                f"{'' if ours else 'not '}resuming",
                f"give {flag} once and no negation of it (no --no-{flag[2:]})"
                if not theirs
                else f"write {flag} in full, once",
            )
        return
    if role in clients.PATH_ROLES:
        mine = _path_of(layout, role, vals)
        if mine is None and value is None:
            return
        if (
            not isinstance(value, str)
            or mine is None
            or (match.client_path(layout.workdir, value) != mine)
        ):
            shown = repr(value) if not isinstance(value, str) else value
            out.refuse(
                f"{flag}: {script}'s argparse resolves it to {shown}{_from(dest, args, reply)}, "
                f"runwatch reads {mine if mine is not None else 'nothing'}",
                f"write it once as {flag} {value if isinstance(value, str) else 'VALUE'} "
                "(in full, not attached to a short option, not in an @file)",
            )
        return
    if vals is None and not set_by_argv:
        return  # not given: runwatch claims nothing of it
    if not _same(role, vals, value):
        mine_text = " ".join(vals) if vals else "nothing"
        out.refuse(
            f"{flag}: {script}'s argparse resolves it to {value!r}{_from(dest, args, reply)}, "
            f"runwatch reads {mine_text}",
            f"write it once as {flag} {_canonical_value(value)}",
        )


def _from(dest: str, args: Sequence[str], reply: ResolvedArgs) -> str:
    """`` (from -oX, @f)``: the argv items argparse reads as ``dest`` (by their exact name, an
    abbreviation, a short option with its value attached) and every ``@file`` item, for a
    message; empty when none is found."""
    items = []
    longs = [o for o in reply.options if o.startswith("--")]
    for arg in args:
        if arg == "--":
            break
        name = arg.partition("=")[0]
        if arg.startswith("@"):
            items.append(arg)
        elif name in reply.options:
            if reply.options[name] == dest:
                items.append(arg)
        elif arg.startswith("--"):
            full = [o for o in longs if o.startswith(name)]
            if len(full) == 1 and reply.options[full[0]] == dest:
                items.append(arg)
        elif arg.startswith("-") and reply.options.get(arg[:2]) == dest:
            items.append(arg)
    return f" (from {', '.join(items)})" if items else ""


def _needed(layout: RunLayout, role: str) -> bool:
    """True when runwatch relies on the role's value even when the argv does not give it."""
    if role == "resume":
        return layout.profile.resume == "flag"
    return role in ("output_dir", "output_file")


def _path_of(layout: RunLayout, role: str, vals: list[str] | None) -> str | None:
    """The path runwatch takes for a path role (its files for the output roles)."""
    if role == "output_file":
        files = list(layout.data_files.values())
        return files[0] if len(files) == 1 and clients.single_file(layout.profile) else None
    if role == "output_dir":
        return layout.out if layout.problem is None else None
    text = (
        vals[0] if vals else (clients.default_of(layout.profile, role) if layout.profiled else None)
    )
    return match.client_path(layout.workdir, text) if text is not None else None


def _same(role: str, vals: Sequence[str] | None, value: Any) -> bool:
    if vals is None:
        return False
    if role == "datasets":
        items = value if isinstance(value, list) else [value]
        theirs = [d for v in items if v is not None for d in str(v).split(",") if d]
        return theirs == [d for v in vals for d in v.split(",") if d]
    if not vals:
        return value is True or value is None
    if isinstance(value, list):  # nargs: the values after the flag, as runwatch reads them
        return [str(v) for v in value] == list(vals)
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        try:
            return float(vals[0]) == float(value)
        except ValueError:
            return False
    return value is not None and str(value) == vals[0]


def _canonical_value(value: Any) -> str:
    if value is None:
        return "VALUE"
    return display.command_line(
        [str(v) for v in value] if isinstance(value, list) else [str(value)]
    )
