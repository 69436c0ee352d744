"""The preflight's check of the flags a new command line sets or removes (``--set`` / ``--unset``).

What the client accepts comes from two places, and the client is never run to learn it: its
profile (``known_flags``, ``switches``, ``value_types``: ``supervisor.clients``) and the options
its argparse source declares, read statically on the host (``agent/argspec.py``, op
``script_flags``). A script that parses its argv by hand would do its work whatever it is given,
``--help`` included.

- When the script's options were read (every ``add_argument`` written literally), the script
  decides: a flag it does not declare is refused, ``--force`` or not, whatever the profile lists
  (the profile describes every version of a client; the installed one may be older), and the
  fix named is a script that declares it, copied to the host, then the same command again.
  Only when the script could not be read, or names options not written literally, does the
  profile fill in, and the verdict says so. A flag neither confirms is refused unless
  ``--force``; the message says whether the script was read and does not declare it, or could
  not be read (and why).
- An abbreviation argparse would expand (``--output-file`` for ``--output-file-path``) is refused,
  ``--force`` or not: runwatch reads flags by their full names, so the files the gate checks
  would not be those the client writes. The fix is the full name.
- A value is checked against the profile's type where it has one (a wrong value is refused,
  ``--force`` or not), else against the type (``int``, ``float``) and literal choices the script
  declares (a wrong value is refused unless ``--force``: a static read can miss what the script
  does at run time). A flag that takes no value given one, or one that needs a value given none,
  is refused.
- A flag set or removed that the command line also gives abbreviated (``--temp 0.6`` beside
  ``--unset temperature``) is refused: argparse expands the abbreviation, so the old value would
  stay; the fix is the full name in the config's argv. When neither the profile nor the script
  lists the client's flags (the abbreviation could be a flag of its own) it needs ``--force``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from supervisor import clients
from supervisor.agent import argflags
from supervisor.replies import ScriptFlags


@dataclass(frozen=True)
class Declared:
    """A flag as the script declares it, every declaration of it merged (a flag declared by two
    subcommands with different types has an unknown type)."""

    takes_value: bool | None
    type: str
    """``int``, ``float``, ``str`` (also when no ``type=`` is given), ``bool`` or ``unknown``."""
    choices: tuple[str, ...] | None
    """Literal choices; None when none are given or they cannot be read (``choices_unread``)."""
    choices_unread: bool = False


def declared(reply: ScriptFlags) -> dict[str, Declared]:
    """Flag -> what the script's ``add_argument`` calls declare of it."""
    seen: dict[str, list[Declared]] = {}
    for opt in reply.options:
        one = Declared(
            takes_value=opt.takes_value,
            type=opt.type or "str",
            choices=tuple(opt.choices) if opt.choices is not None else None,
            choices_unread=opt.choices_unread,
        )
        for f in opt.flags:
            seen.setdefault(f, []).append(one)
    out: dict[str, Declared] = {}
    for f, decls in seen.items():
        first = decls[0]
        if all(d == first for d in decls):
            out[f] = first
            continue
        takes = {d.takes_value for d in decls}
        out[f] = Declared(
            takes_value=takes.pop() if len(takes) == 1 else None,
            type="unknown",
            choices=None,
            choices_unread=any(d.choices is not None or d.choices_unread for d in decls),
        )
    return out


@dataclass(frozen=True)
class ProfileFlags:
    """What the run's client profile says of its flags."""

    name: str
    known: frozenset[str] | None
    """Every flag it accepts; None when it does not list them (or no profile describes the
    script)."""
    switches: frozenset[str] = frozenset()
    types: dict[str, clients.ValueType] = field(default_factory=dict)
    ranges: dict[str, list[float]] = field(default_factory=dict)
    """Inclusive ranges of numeric values (the profile's ``value_ranges``)."""
    type_source: str = ""
    """Where ``types`` come from, for messages."""


@dataclass(frozen=True)
class ScriptRead:
    """The static read of the client's source, or why there is none."""

    script: str
    """The script's file name, for messages."""
    host: str
    reply: ScriptFlags | None
    reason: str = ""
    """Why ``reply`` is None, or why it found no argparse options."""
    which: str = "the installed"
    """Which copy of the script was read, for messages (``the installed``, or ``the new``
    for the one given with ``--script``)."""

    @property
    def found(self) -> bool:
        return self.reply is not None and self.reply.found

    @property
    def source(self) -> str:
        return f"{self.script}, read statically on {self.host}"

    @property
    def why_unread(self) -> str:
        return f"could not read {self.script}'s flags statically: {self.reason}"

    @property
    def decides(self) -> bool:
        """Every option of the script was read: the script, not the profile, says which flags
        exist."""
        return self.reply is not None and self.reply.found and not self.reply.dynamic

    @property
    def partly(self) -> str:
        """Why the profile fills in for the script, for messages."""
        if self.reply is None or not self.reply.found:
            return self.why_unread
        return (
            f"{self.reply.dynamic} of {self.script}'s add_argument calls name options not "
            "written literally"
        )


@dataclass
class Outcome:
    """The verdict on a new command line's flags."""

    confirmed: list[str] = field(default_factory=list)
    """The flags the profile or the script confirms."""
    problems: list[str] = field(default_factory=list)
    """Refused, ``--force`` or not."""
    profile_types: bool = False
    """Some of ``problems`` are values of the wrong type for the profile."""
    unconfirmed: list[str] = field(default_factory=list)
    """Flags neither the profile nor the script confirms: refused unless ``--force``."""
    unsure: list[str] = field(default_factory=list)
    """Values the script's declared type or choices reject: refused unless ``--force``."""
    typed: int = 0
    """Values found of their expected type."""
    missing: list[str] = field(default_factory=list)
    """Flags the script, wholly read, does not declare (a newer version may)."""
    sources: list[str] = field(default_factory=list)
    """What confirmed the flags (the profile, the static read)."""


def check(
    flags: Sequence[str],
    sets: Sequence[tuple[str, str | None]],
    kept: Callable[[str], bool],
    profile: ProfileFlags,
    read: ScriptRead | None,
    shown: Callable[[str, str], str],
) -> Outcome:
    """The verdict on ``flags`` (every flag set or removed) and the values of ``sets``.
    ``kept(flag)``: the value comes from the run's launch spec, not this command; ``shown(flag,
    value)``: the value as a message may show it (secrets are not)."""
    out = Outcome()
    script = declared(read.reply) if read is not None and read.reply is not None else {}
    decides = read is not None and read.decides
    listed = profile.known if profile.known is not None else frozenset()
    given = {f for f, _ in sets}
    by_profile = by_script = False
    for f in flags:
        if f in script:
            by_script = True
        elif not decides and f in listed:
            by_profile = True
        elif decides and f in listed and f not in given:
            pass  # removing a flag of another version the installed script lacks: what it needs
        else:
            _refuse_flag(out, f, profile, read, script)
            continue
        out.confirmed.append(f)
    if by_script and read is not None:
        out.sources.append(read.source)
    if by_profile:
        why = read.partly if read is not None else "the client's script is not known"
        out.sources.append(f"the client profile {profile.name!r}, as {why}")
    for f, value in sets:
        in_profile = profile.known is not None and f in profile.known
        if f not in script and (decides or not in_profile):
            continue  # refused above
        takes = (f not in profile.switches) if in_profile else script[f].takes_value
        if value is None and takes:
            out.problems.append(f"{f}: needs a value (--set {f.lstrip('-')}=VALUE)")
        elif value is not None and takes is False:
            out.problems.append(f"{f}: takes no value (--set {f.lstrip('-')})")
        elif value is not None and f in profile.types:
            wrong = clients.value_problem(value, profile.types[f])
            if wrong is None and f in profile.ranges:
                wrong = clients.range_problem(value, profile.ranges[f])
            src = f"type from {profile.type_source}"
            if wrong is None:
                out.typed += 1
            else:
                out.problems.append(_bad(f, value, wrong, src, kept, shown))
                out.profile_types = True
        elif value is not None and f in script and read is not None:
            _check_declared(out, f, value, script[f], read, kept, shown)
    return out


def _refuse_flag(
    out: Outcome,
    flag: str,
    profile: ProfileFlags,
    read: ScriptRead | None,
    script: dict[str, Declared],
) -> None:
    names = sorted({*script, *(() if read is not None and read.decides else profile.known or ())})
    close = difflib.get_close_matches(flag, names, n=1, cutoff=0.6)
    # "FLAG: ..." - a word right after a flag name would read as its value (and be masked).
    guess = f" (did you mean {close[0]}?)" if close else ""
    if read is not None and read.found:
        assert read.reply is not None
        full = _expansion(flag, script) if read.reply.allow_abbrev else None
        if full is not None:
            out.problems.append(
                f"{flag}: {read.script} would take it as an abbreviation of {full}; write "
                "that in full"
            )
            return
        notes = [f"read statically on {read.host}"]
        if read.decides and not read.reply.known_args:
            if profile.known is not None and flag in profile.known:
                notes.append(
                    f"the client profile {profile.name!r} lists it, but {read.which} script decides"
                )
            out.missing.append(flag)
            out.problems.append(
                f"{flag}: not a flag of the client{guess}: {read.which} {read.script} does not "
                f"declare it ({'; '.join(notes)})"
            )
            return
        if profile.known is not None:
            notes.append(f"nor does the client profile {profile.name!r} list it")
        if read.reply.dynamic:
            notes.append(
                f"{read.reply.dynamic} of its add_argument calls name options not written literally"
            )
        if read.reply.known_args:
            notes.append("it calls parse_known_args, which lets undeclared flags by")
        out.unconfirmed.append(
            f"{flag}: not a flag of the client{guess}: {read.script} does not declare it "
            f"({'; '.join(notes)})"
        )
        return
    why = read.why_unread if read is not None else "the client's script is not known"
    if profile.known is not None:
        out.unconfirmed.append(
            f"{flag}: not a flag of the client profile {profile.name!r}{guess}, and {why}"
        )
    else:
        out.unconfirmed.append(f"{flag}: cannot be confirmed: {why}")


def newer_script(script: str, path: str, host: str, flags: Sequence[str]) -> str:
    """The fix when the installed script lacks ``flags``: a version that declares them, given
    with ``--script`` (runwatch copies it over the installed one once the run is stopped)."""
    return (
        f"if a newer {script} declares {', '.join(flags)}, copy it to {path} on {host}: run "
        f"the same command again with --script PATH (PATH: the newer {script} on this machine; "
        "it is copied once the run is stopped, the old one kept beside it)"
    )


def hidden_abbreviations(
    out: Outcome,
    argv: Sequence[str],
    flags: Sequence[str],
    profile: ProfileFlags,
    read: ScriptRead | None,
) -> None:
    """Refuse each flag of ``flags`` (set or removed) that ``argv`` also gives as an
    abbreviation argparse would expand to it: an override replaces a flag's whole value, and
    ``--temp 0.6`` is the old value of ``--temperature`` under another name."""
    known = set(profile.known or ())
    if read is not None and read.reply is not None and read.reply.found:
        if not read.reply.allow_abbrev:
            return
        known |= set(declared(read.reply))
    given = {name for name, _ in argflags.options(argv)}
    for flag in dict.fromkeys(flags):
        for short in sorted(given):
            if short == flag or short in known or not short.startswith("--") or len(short) < 3:
                continue
            if not flag.startswith(short):
                continue
            text = (
                f"{flag}: the command line also gives it as {short}, which argparse expands to "
                f"{flag}, so its old value would stay; write {flag} in full in the config's argv"
            )
            (out.problems if known else out.unsure).append(text)


def _expansion(flag: str, script: dict[str, Declared]) -> str | None:
    """The one declared long option ``flag`` is a prefix of (argparse's abbreviation), if one."""
    if not flag.startswith("--"):
        return None
    matches = [f for f in script if f.startswith("--") and f.startswith(flag)]
    return matches[0] if len(matches) == 1 else None


def _check_declared(
    out: Outcome,
    flag: str,
    value: str,
    decl: Declared,
    read: ScriptRead,
    kept: Callable[[str], bool],
    shown: Callable[[str, str], str],
) -> None:
    """A value against the type and choices the script declares."""
    checked = False
    if decl.type in ("int", "float"):
        checked = True
        wrong = clients.value_problem(value, decl.type)
        if wrong is not None:
            out.unsure.append(_bad(flag, value, wrong, f"type from {read.source}", kept, shown))
            return
    if decl.choices is not None:
        checked = True
        # argparse compares the converted value: "02" is the choice 2 of a type=int option.
        numeric = decl.type != "str"
        wrong = clients.value_problem(value, list(decl.choices), numeric_choices=numeric)
        if wrong is not None:
            src = f"choices from {read.source}"
            out.unsure.append(_bad(flag, value, wrong, src, kept, shown))
            return
    if checked:
        out.typed += 1


def _bad(
    flag: str,
    value: str,
    wrong: str,
    src: str,
    kept: Callable[[str], bool],
    shown: Callable[[str, str], str],
) -> str:
    if kept(flag):
        src += "; kept in the run's launch spec, --reset drops it"
    return f"{flag}: {shown(flag, value)} {wrong} ({src})"
