"""The gate: the checks every start of a run passes, whoever starts it.

A launch, a restart, the rollback of a failed restart and a restart on failure each start the
client on one command line; each passes :meth:`Gate.check` with that command line's layout right
before the ``launch`` request (a plan's steps apply the same rules earlier as well, before
anything stops). Nothing starts on a refusal:

- **the resume rule**: a client whose profile says it overwrites its output unless given its
  resume flag (``resume = "flag"``, SpecForge's ``--resume``) never starts without that flag
  while one of its data files, or of their error/skipped files, holds data. Whatever the
  client, a snapshot of its files is taken before the start (``supervisor.snapshots``; within
  ``backup_max_bytes`` where the filesystem has no reflinks, more is refused unless forced).
- **the format check**: every data file is read from its first byte against the run's format;
  ``legacy``, ``mixed``, ``unknown``, ``corrupt`` or a file that cannot be read refuses.
- **the locks**: a dataset lock held by a live process means another launcher runs the run.

The gate only reads (one ``scan`` and one ``lock_status`` request); it needs of the engine only
the host's agent client, the config and the host's command timeout. A refusal says why and,
with :func:`resume_command`, the exact command that starts the run keeping its output.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from supervisor import argcheck, clients, display, launchspec
from supervisor.agent import argflags
from supervisor.agent.masking import mask_argv, mask_text
from supervisor.agent.protocol import FileSpec
from supervisor.agentclient import AgentClient, as_data
from supervisor.argv import apply_overrides, argv_diff
from supervisor.config import Config, RunConfig, command_prefix
from supervisor.errors import RunwatchError
from supervisor.layout import RunLayout
from supervisor.plan import StepFailed
from supervisor.replies import LockHolder

BLOCKING_VERDICTS = ("legacy", "mixed", "unknown", "corrupt")
"""Verdicts that make resuming on a file unsafe."""


@dataclass
class Verdict:
    """What the gate says of one command line: ``ok``, or the reasons it must not start."""

    problems: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    overwrite: bool = False
    """Refused by the resume rule: started, the client would overwrite its output."""
    running: str | None = None
    """Who holds the run's lock (a live process): another launcher runs it."""
    sizes: dict[str, int] = field(default_factory=dict)
    """Data file -> its size as the gate saw it (0: missing)."""
    records: dict[str, int] = field(default_factory=dict)
    """Data file -> its records (distinct ids) as the gate saw it (0: missing)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def refuse(self, problem: str, hint: str) -> None:
        self.problems.append(problem)
        if hint not in self.hints:
            self.hints.append(hint)

    def failure(self) -> StepFailed:
        """The refusal as a step's failure."""
        return StepFailed("; ".join(self.problems), "; ".join(self.hints) or None)


class Gate:
    """The start checks of one host; see the module docstring."""

    def __init__(
        self,
        agent: AgentClient,
        config: Config,
        host: str,
        command_timeout: float,
        search_path: str | None = None,
    ) -> None:
        self.agent = agent
        self.config = config
        self.host = host
        self.command_timeout = command_timeout
        self.search_path = search_path
        """``PATH`` of the launch's environment (where a script executed by name is found)."""

    async def check(
        self,
        run: RunConfig,
        layout: RunLayout,
        *,
        validate: Literal["all", "none"] = "all",
        force: bool = False,
    ) -> Verdict:
        """The verdict on starting ``run`` on ``layout.argv`` now. ``validate="none"`` leaves
        the records' format out (a plan's data-repair step has just validated them with no
        writer alive); ``force`` is the start's ``--force`` (the snapshot's own check,
        ``supervisor.snapshots``, is where it lets data go unprotected)."""
        verdict = Verdict()
        # The argument reading first: every other check is of the files runwatch reads from
        # the argv, which must be the files the client will open (``argcheck``).
        reading = await self.read_args(layout)
        if not reading.ok:
            for problem in reading.problems:
                verdict.refuse(problem, "; ".join(reading.hints))
            return verdict
        scans = await self.scan(run, layout, validate)
        verdict.sizes = {str(s.get("path")): complete_size(s) for s in scans}
        verdict.records = {str(s.get("path")): _records(s) for s in scans}
        for s in scans:
            if blocks(s, formats=validate == "all"):
                verdict.refuse(
                    f"data not in format {run.format!r}: {explain_block(s)}",
                    blocked_hint(layout),
                )
        rule = output_rule(self.config, layout, scans, force, reading.installed)
        verdict.problems += rule.problems
        verdict.hints += [h for h in rule.hints if h not in verdict.hints]
        verdict.overwrite = rule.overwrite
        await self.check_locks(layout, verdict)
        return verdict

    async def read_args(self, layout: RunLayout) -> argcheck.Reading:
        """How the client itself reads ``layout.argv`` (``argcheck.check``)."""
        reply = await argcheck.resolve(self.agent, layout, self.search_path, self.command_timeout)
        return argcheck.check(layout, reply)

    async def scan(self, run: RunConfig, layout: RunLayout, validate: str) -> list[dict[str, Any]]:
        """Every data file of ``layout`` (with its error/skipped files), read from its first
        byte."""
        profile = self.config.formats.get(run.format)
        files = []
        for ds, path in layout.data_files.items():
            spec: FileSpec = {
                "path": path,
                "format": run.format,
                "validate": validate,
                "texts": False,  # the gate counts bytes and checks records, it tokenizes nothing
            }
            if profile is not None:
                spec["profile"] = msgspec.to_builtins(profile)
            if ds in layout.sidecars:
                spec["sidecars"] = layout.sidecars[ds]
            files.append(spec)
        reply = await self.agent.scan(
            files=files, fresh=True, timeout=max(self.command_timeout, 300.0)
        )
        found = reply.get("files") or {}
        return [
            as_data(found.get(f["path"]) or {"path": f["path"], "state": "error"}) for f in files
        ]

    async def check_locks(self, layout: RunLayout, verdict: Verdict) -> None:
        st = await self.agent.lock_status(lock_paths=list(layout.locks))
        if not st.held:
            return
        holder = st.holder or LockHolder()
        if holder.state != "launching" and not st.holder_alive:
            return  # left by a run that is gone: the launch takes it over
        who = holder.who(self.config.key)
        verdict.running = who
        verdict.refuse(
            f"already running: {who} holds the run's lock {st.lock_path}",
            "another runwatch or launch started it; refresh to see the process that runs now",
        )


def blocks(scan: dict[str, Any], formats: bool = True) -> bool:
    """True when a scanned file must not be resumed on: unreadable, or (``formats``) holding
    records of another format, or corrupt ones."""
    if scan.get("state") in ("unreadable", "not-a-file", "error"):
        return True
    return formats and scan.get("verdict") in BLOCKING_VERDICTS


def explain_block(s: dict[str, Any]) -> str:
    """Why a file blocks: its verdict, the first offending line and its keys."""
    path = s.get("path")
    verdict = s.get("verdict") if s.get("state") == "ok" else s.get("state")
    off = s.get("first_offending")
    parts = [f"{path}: {verdict}"]
    if isinstance(off, dict):
        parts.append(
            f"line {off.get('line')} is {off.get('format') or 'an unknown format'} "
            f"(missing keys: {', '.join(off.get('missing') or []) or 'none'}; "
            f"extra keys: {', '.join(off.get('extra') or []) or 'none'})"
        )
    elif s.get("bad_lines"):
        bad = s["bad_lines"][0]
        parts.append(f"line {bad.get('line')}: {bad.get('reason')}")
    if s.get("verdict_detail") and not isinstance(off, dict):
        parts.append(str(s.get("verdict_detail")))
    elif s.get("error"):
        parts.append(str(s.get("error")))
    return " - ".join(parts)


def resumes_from_output(layout: RunLayout) -> bool:
    """True when a single-file client picks up where its output file ends (it resumes always,
    or its resume flag is in the argv): moving that file aside takes its resume point away
    (SpecForge would also skip as many rows as its error and skipped files hold). A per-dataset
    client's move-aside starts that dataset afresh in the new format, which is what it is for."""
    p = layout.profile
    if not layout.profiled or not clients.single_file(p):
        return False
    return p.resume == "always" or argflags.has_flag(layout.argv, p.flags.resume)


def blocked_hint(layout: RunLayout) -> str:
    """What to do about data files the format check refuses. ``--move-aside`` only for a client
    that does not resume from them: for one that does, the rename would make it start over."""
    if resumes_from_output(layout):
        return (
            f"{layout.profile.name} resumes from that file: remove or fix the offending lines "
            "(the check names them) and launch again; --move-aside would rename it and the "
            "client would start over from the first row"
        )
    return (
        "convert or remove that file, or launch with --move-aside to rename it (nothing is deleted)"
    )


def _records(s: dict[str, Any]) -> int:
    if s.get("state", "ok") != "ok":
        return 0
    return int(s.get("unique_ids") or 0) or int(s.get("records") or 0)


def _size(s: Mapping[str, Any]) -> int:
    return int(s.get("size") or 0) if s.get("state", "ok") == "ok" else 0


def complete_size(s: Mapping[str, Any]) -> int:
    """Complete bytes of a scanned file (to its last newline; 0: not there): what a launch must
    not shrink. A partial last line the client cuts off itself when it resumes (its own
    torn-tail repair) is no loss. A scan that stopped early (``texts_more``) read no tail: what
    it read (``offset``) is complete."""
    if s.get("texts_more") and s.get("state", "ok") == "ok":
        return int(s.get("offset") or 0)
    return max(0, _size(s) - int(s.get("partial_tail_bytes") or 0))


def output_rule(
    config: Config,
    layout: RunLayout,
    scans: Sequence[dict[str, Any]],
    force: bool,
    installed: frozenset[str] | None = None,
) -> Verdict:
    """No start loses a byte of existing output: the resume rule of a profiled client (the
    snapshot keeps what any other client rewrites); see the module docstring. ``installed``: the
    option strings of the installed script (None: not read exactly); a fix names only those."""
    verdict = Verdict()
    full = [s for s in scans if s.get("state") == "ok" and _size(s) > 0]
    problem = layout.overwrite_problem()
    if layout.profiled and problem is not None:
        # The client truncates its error/skipped files too, and counts them to skip its input.
        sides = [
            side
            for s in scans
            for side in (s.get("sidecars") or {}).values()
            if isinstance(side, dict) and _size(side) > 0
        ]
        held = full + sides
        if held:
            size = display.size(sum(_size(s) for s in held))
            names = ", ".join(str(s.get("path")) for s in held)
            verdict.overwrite = True
            verdict.refuse(
                f"{problem}: it would overwrite {size} in {names}", _keep_hint(layout, installed)
            )
        return verdict
    # A client without a profile, or one that appends: the snapshot taken before every start
    # (``supervisor.snapshots``) keeps what it may rewrite.
    return verdict


def _keep_hint(layout: RunLayout, installed: frozenset[str] | None) -> str:
    """How to keep the output: the resume flag, when the installed script has it."""
    flags = layout.profile.flags.resume
    if installed is not None and not any(f in installed for f in flags):
        script = posixpath.basename(layout.argv[layout.script_index or 0])
        return (
            f"the installed {script} has no {flags[0] if flags else 'resume flag'}: it cannot "
            "keep this output; move it aside first (launch with --move-aside, nothing is "
            "deleted) or install a version of the client that resumes"
        )
    return f"keep the output: {clients.resume_fix(layout.profile)} (the client then appends to it)"


def resume_argv(layout: RunLayout) -> list[str]:
    """``layout.argv`` with the client's resume flag, when its profile resumes only with it."""
    profile = layout.profile
    if profile.resume != "flag" or not profile.flags.resume:
        return list(layout.argv)
    if argflags.has_flag(layout.argv, profile.flags.resume):
        return list(layout.argv)
    return apply_overrides(layout.argv, [(profile.flags.resume[0], None)], profile.switches)


def resume_command(config: Config, run: RunConfig, argv: Sequence[str], secrets: list[str]) -> str:
    """The command that starts ``run`` on exactly ``argv``, masked: ``runwatch launch RUN`` with
    the ``--set`` / ``--unset`` that turn the run's launch spec into ``argv`` (they then become
    its spec); when no such flags give ``argv`` back, ``argv`` itself and where to run it."""
    wanted = list(argv)
    try:
        spec = launchspec.load(config.key, run.name)
    except RunwatchError:
        spec = launchspec.LaunchSpec(run=run.name)
    sets: list[tuple[str, str | None]] = []
    unsets: list[str] = []
    switches = launchspec.switches_of(config, run)
    for d in argv_diff(spec.argv(run.argv, switches), wanted):
        if d["new"] is None:
            unsets.append(d["flag"])
        else:
            sets.append((d["flag"], None if d["new"] is True else str(d["new"])))
    if spec.merged(sets, unsets).argv(run.argv, switches) != wanted:
        shown = display.command_line(mask_argv(wanted, secrets))
        return mask_text(f"on {run.host} in {run.workdir}: {shown}", secrets)
    args = ["launch", run.name]
    for flag, value in sets:
        arg = flag if value is None else mask_argv([f"{flag}={value}"], secrets)[0]
        args += ["--set", arg.lstrip("-")]
    for flag in unsets:
        args += ["--unset", flag.lstrip("-")]
    return mask_text(f"{command_prefix(config)} {display.command_line(args)}", secrets)
