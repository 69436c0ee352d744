"""The laptop side of a kill: send it by identity, and reconcile when its outcome is unknown.

The agent does the work (see ``supervisor.agent.kill``): it refuses when the identity does not
name the live process, signals the tree TERM then KILL, and confirms every exit. Because a kill
names an identity it is idempotent: sending it again can never hit another process. Still, a kill
whose reply was lost (the connection dropped) is never repeated blindly: :func:`reconcile` asks the
host whether that identity is gone or still alive, and the caller decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import msgspec

from supervisor.agent import protocol
from supervisor.agent.protocol import KILL_CONFIRM_S
from supervisor.agentclient import AgentClient
from supervisor.errors import HostError, OutcomeUnknown
from supervisor.model import Identity
from supervisor.replies import Kill, Probe, decode

if TYPE_CHECKING:
    from collections.abc import Sequence

    from supervisor.hosts import Host

Outcome = Literal["terminated", "killed", "already-gone", "refused"]
GONE_OUTCOMES = frozenset(("terminated", "killed", "already-gone"))


class KillResult(msgspec.Struct, kw_only=True):
    """What happened to one process of a kill (the run or one of its descendants)."""

    pid: int
    outcome: Outcome
    detail: str
    role: Literal["run", "child", "holder"] = "run"
    """``child``: a descendant, a member of its session or group, or a fork made during the kill;
    ``holder``: a process that held the run's data files (for writing) or its lock."""
    signals: list[str] = []
    """Signals actually sent (``SIGTERM``, ``SIGKILL``); empty for already-gone and refused."""
    confirmed: bool = False
    """True when the exit was observed (the process is gone or a zombie)."""
    exit_code: int | None = None
    """Exit status when the agent could collect it (its own children only)."""
    after_s: float | None = None
    """Seconds from the first signal to the observed exit."""

    @property
    def gone(self) -> bool:
        return self.outcome in GONE_OUTCOMES and self.confirmed


class KillReport(msgspec.Struct, kw_only=True):
    """The answer to one kill: a result per process."""

    host: str
    identity: Identity
    results: list[KillResult] = []
    reconciled: bool = False
    """True when the kill's reply was lost and the results come from re-checking the host."""
    held_by: Literal["cgroup", "token"] | None = None
    """Set when the process was in a unit runwatch started: the whole unit was stopped, and
    it is gone only when the unit is empty (``unit_detail`` says what was found)."""
    launch_id: str | None = None
    unit_detail: str | None = None

    @property
    def all_gone(self) -> bool:
        """Every targeted process is confirmed gone (what exit status 0 means)."""
        return bool(self.results) and all(r.gone for r in self.results)

    @property
    def refused(self) -> bool:
        return any(r.outcome == "refused" for r in self.results)


Reconciliation = Probe
"""What re-checking an identity found (the ``probe`` reply)."""


def identity_params(identity: Identity) -> protocol.Identity:
    return {
        "boot_id": identity.boot_id,
        "pid": identity.pid,
        "start_time": identity.start_time,
        "uid": identity.uid,
        "argv": list(identity.argv),
    }


def _report(host: Host, identity: Identity, raw: protocol.KillResult) -> KillReport:
    reply = decode(raw, Kill, host.name, "kill")
    results = [
        KillResult(
            pid=t.pid,
            outcome=t.outcome,
            detail=t.detail,
            role=t.role,
            signals=t.signals,
            confirmed=t.exit.confirmed,
            exit_code=t.exit.code,
            after_s=t.exit.after_s,
        )
        for t in reply.results
    ]
    if reply.confirmed is False and all(r.gone for r in results):
        # The unit is not empty although every process the stop saw is gone: never "confirmed".
        results.append(
            KillResult(pid=identity.pid, outcome="refused", detail=reply.detail or "unit not empty")
        )
    return KillReport(
        host=host.name,
        identity=identity,
        results=results,
        held_by=reply.held_by,
        launch_id=reply.launch_id,
        unit_detail=reply.detail,
    )


async def kill(
    host: Host,
    identity: Identity,
    grace: float = 10.0,
    scripts: Sequence[str] | None = None,
    files: Sequence[str] = (),
    writer: bool = False,
) -> KillReport:
    """Kill the process named by ``identity`` and its descendants on ``host``; ``files`` (the
    run's data files and locks, as paths of the host) are held by no process once it reports.
    ``writer``: the user named it as a writer of the run; it may execute no configured script
    if the host sees it hold one of ``files`` open for writing.

    Returns the report (refusals included: check ``report.refused`` / ``report.all_gone``).
    Raises OutcomeUnknown when the reply was lost: call :func:`reconcile`, never repeat blindly.
    """
    timeout = float(grace) + KILL_CONFIRM_S + host.cfg.command_timeout
    result = await AgentClient(host).kill(
        identity=identity_params(identity),
        grace=float(grace),
        scripts=list(scripts) if scripts else None,
        files=list(files) if files else None,
        writer=writer or None,
        timeout=timeout,
    )
    return _report(host, identity, result)


async def reconcile(host: Host, identity: Identity, timeout: float | None = None) -> Reconciliation:
    """Re-check ``identity`` on ``host`` (reconnecting if needed): gone, or still alive?"""
    try:
        result = await AgentClient(host).probe(identity=identity_params(identity), timeout=timeout)
    except OutcomeUnknown as e:  # pragma: no cover - probe does not act
        raise HostError(e.message) from None
    return decode(result, Probe, host.name, "probe")


async def kill_or_reconcile(
    host: Host,
    identity: Identity,
    grace: float = 10.0,
    scripts: Sequence[str] | None = None,
    files: Sequence[str] = (),
) -> KillReport:
    """:func:`kill`; when its outcome is unknown, reconcile instead of repeating it.

    A reconciled report has ``reconciled=True``: the run is ``already-gone`` (confirmed by the
    re-check) or OutcomeUnknown is raised again saying it is still alive.
    """
    try:
        return await kill(host, identity, grace, scripts, files)
    except OutcomeUnknown as lost:
        return await after_lost_reply(host, identity, lost)


async def after_lost_reply(host: Host, identity: Identity, lost: OutcomeUnknown) -> KillReport:
    """The report of a kill whose reply was lost, from re-checking the host (reconnecting).

    Gone: a reconciled ``already-gone`` report. Still alive: OutcomeUnknown saying so.
    """
    state = await reconcile(host, identity)
    if state.alive:
        raise OutcomeUnknown(
            f"{host.name}: the kill of pid {identity.pid} was sent but its reply was lost, "
            f"and the process is still running ({lost.message})",
            "run the kill again: it names the identity, so it cannot hit another process",
        ) from None
    result = KillResult(
        pid=identity.pid,
        outcome="already-gone",
        detail=f"reply lost; re-checked after reconnect: {state.detail}",
        confirmed=True,
    )
    return KillReport(host=host.name, identity=identity, results=[result], reconciled=True)


def audit_kill(report: KillReport, run: str | None, config: str) -> dict[str, Any]:
    """Append ``report`` to the audit log (action ``kill``); ``Engine.kill`` calls this."""
    from supervisor import audit

    return audit.record(
        "kill",
        config=config,
        host=report.host,
        run=run,
        ok=report.all_gone,
        identity=identity_params(report.identity),
        argv=list(report.identity.argv),
        steps=[
            {"name": f"pid {r.pid} ({r.role})", "ok": r.gone, "detail": f"{r.outcome}: {r.detail}"}
            for r in report.results
        ],
        reconciled=report.reconciled,
    )


def audit_kill_failed(
    host: str, identity: Identity, run: str | None, detail: str, *, config: str
) -> None:
    """Append a kill that failed before any outcome (refused while another action held the
    run, the host unreachable...): action ``kill``, ``outcome: "error"``."""
    from supervisor import audit

    audit.record(
        "kill",
        config=config,
        host=host,
        run=run,
        ok=False,
        identity=identity_params(identity),
        argv=list(identity.argv),
        outcome="error",
        detail=detail,
    )


def audit_kill_unknown(
    host: str,
    identity: Identity,
    run: str | None,
    detail: str,
    *,
    config: str,
    reconciled: bool = False,
) -> dict[str, Any]:
    """Append a kill whose outcome is not known (action ``kill``, ``outcome: "unknown"``).

    Written when the reply was lost, before the host is re-checked (``reconciled=False``), and
    again when the re-check finds the process still alive (``reconciled=True``).
    """
    from supervisor import audit

    return audit.record(
        "kill",
        config=config,
        host=host,
        run=run,
        ok=False,
        identity=identity_params(identity),
        argv=list(identity.argv),
        outcome="unknown",
        detail=detail,
        reconciled=reconciled,
    )
