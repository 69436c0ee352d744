"""What changed between two snapshots that a person should be told about right away."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from supervisor.model import DatasetView, HostView, RunView, Snapshot

Severity = Literal["information", "warning", "error"]


@dataclass(frozen=True)
class Alert:
    """One notification: what happened, where, and how loud."""

    kind: Literal["over-budget", "stalled", "run-died", "host-lost", "host-back", "budget-policy"]
    title: str
    message: str
    severity: Severity


def stop_key(host: str, run: str, pid: int) -> str:
    """Names one process of one run: ``host/run#pid`` (a deliberate stop is keyed by this)."""
    return f"{host}/{run}#{pid}"


def _runs(host: HostView) -> dict[str, RunView]:
    return {r.name: r for r in host.runs}


def _datasets(run: RunView) -> dict[str, DatasetView]:
    return {d.name: d for d in run.datasets}


def changes(before: Snapshot | None, after: Snapshot, expected_stops: set[str]) -> Iterator[Alert]:
    """Alerts for the transitions from ``before`` to ``after``.

    Only transitions are reported (a dataset already over budget at start-up shows on the dashboard,
    it does not pop up). ``expected_stops`` holds :func:`stop_key` keys of processes this app is
    stopping on purpose, which are not reported as having died.
    """
    if before is None:
        return
    old_hosts = {h.name: h for h in before.hosts}
    for host in after.hosts:
        old = old_hosts.get(host.name)
        if old is None:
            continue
        if old.connected and not host.connected:
            why = f": {host.error}" if host.error else ""
            yield Alert(
                "host-lost", host.name, f"Host lost{why}. Showing its last values.", "error"
            )
        elif not old.connected and host.connected:
            yield Alert("host-back", host.name, "Host is back.", "information")
        if host.stale:
            continue
        old_runs = _runs(old)
        for run in host.runs:
            was = old_runs.get(run.name)
            if was is None:
                continue
            pid = was.process.identity.pid if was.process else 0
            deliberate = stop_key(host.name, run.name, pid) in expected_stops
            if was.state == "running" and run.state in ("stopped", "zombie") and not deliberate:
                shown = f" (pid {pid})" if pid else ""
                yield Alert("run-died", run.name, f"Run stopped{shown} on {host.name}.", "error")
            old_ds = _datasets(was)
            for ds in run.datasets:
                prev = old_ds.get(ds.name)
                if prev is None:
                    continue
                if ds.over_budget and not prev.over_budget:
                    text = ds.projection.message or "past its token budget"
                    yield Alert("over-budget", f"{run.name} {ds.name}", text, "warning")
                if ds.stalled and not prev.stalled:
                    yield Alert(
                        "stalled", f"{run.name} {ds.name}", "No new responses: stalled.", "warning"
                    )
