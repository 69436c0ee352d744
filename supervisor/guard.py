"""The budget guard: acts once on each run that passed its token budget without enforcing it.

Budget guard: ``BudgetGuard(config).observe(snapshot)`` returns the budget events not yet acted
on (a run without ``--token-budget`` whose dataset passed its budget) with the action its policy
asks for; ``await guard.act(engine, event)`` carries it out exactly once (an ``O_EXCL`` marker in
the state dir, keyed by host, run, process identity and dataset, survives restarts of runwatch and
keeps two runwatch instances from both acting); ``await guard.enforce(engine, snapshot)`` does
both. ``warn`` events are audited once and otherwise left to the front ends to show.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec

from supervisor import audit, clients, display
from supervisor.config import Config, command_prefix
from supervisor.errors import RunwatchError
from supervisor.events import Event
from supervisor.model import Identity, Snapshot
from supervisor.paths import config_state, private_dir, state_dir
from supervisor.plan import ActionResult, Looks, OnStep, Plan, make_plan
from supervisor.rates import dataset_budget
from supervisor.steps import kill_refused, kill_summary

if TYPE_CHECKING:
    from supervisor.kill import KillReport


class Acts(Looks, Protocol):
    """What the policy uses to act (``Engine`` has it): a plan of the run as it is now, its
    execution under the run's lock, and the audited kill by identity."""

    async def kill(
        self, host: str, identity: Identity, grace: float = 10.0, *, run: str | None = None
    ) -> KillReport: ...

    async def execute(
        self, plan: Plan, *, dry_run: bool = False, on_step: OnStep | None = None
    ) -> ActionResult: ...


@dataclass
class BudgetEvent:
    """A run without its client's budget flag (``--token-budget``), or whose client has none,
    whose dataset(s) passed their token budget."""

    policy: Literal["warn", "stop", "restart-with-budget"]
    host: str
    run: str
    identity: Identity
    datasets: list[str]
    budget: int
    """The budget to enforce (``--token-budget`` of a restart-with-budget): the smallest budget
    among the over-budget datasets, since the flag sets one budget for every dataset."""
    tokens: dict[str, int]
    """Completion tokens of each over-budget dataset."""
    waste_tokens: int
    message: str
    keys: list[str]
    held_elsewhere: str = ""
    """Another run's unit writes the datasets (``RunView.owner``): what stops it, through its own
    config; the policy's action is that config's, never this one's."""

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "host": self.host,
            "run": self.run,
            "pid": self.identity.pid,
            "datasets": self.datasets,
            "budget": self.budget,
            "tokens": self.tokens,
            "waste_tokens": self.waste_tokens,
            "message": self.message,
        }


@dataclass
class GuardOutcome:
    event: BudgetEvent
    acted: bool
    """False when another runwatch (or an earlier run of this one) already acted."""
    ok: bool
    detail: str
    result: ActionResult | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "event": self.event.to_json(),
            "acted": self.acted,
            "ok": self.ok,
            "detail": self.detail,
            "result": self.result.to_json() if self.result else None,
        }


_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class BudgetGuard:
    """Acts on budget events once each; see the module docstring."""

    def __init__(self, config: Config, marker_dir: Path | None = None) -> None:
        self.config = config
        self.marker_dir = marker_dir or (config_state(config.key) / "guard")
        self._in_memory: set[str] = set()
        """Keys claimed here because the state dir refused their marker (W22)."""
        self.unmarked: dict[str, str] = {}
        """First key of an event claimed in memory -> why its marker was not written."""

    def _key(self, host: str, run: str, ident: Identity, dataset: str, policy: str) -> str:
        """The once-only marker of acting on ``policy`` for one dataset of one process: a policy's
        action (a refused one too) never uses up another's (set ``stop`` after a refused
        ``restart-with-budget`` and the run is stopped)."""
        raw = json.dumps([host, run, ident.boot_id, ident.pid, ident.start_time, dataset, policy])
        return hashlib.sha256(raw.encode()).hexdigest()[:32]

    def _marked(self, key: str) -> bool:
        if key in self._in_memory:
            return True
        return (self.marker_dir / f"{key}.json").exists() or self._legacy(key)

    @staticmethod
    def _legacy(key: str) -> bool:
        """A marker an older runwatch left in the shared ``guard/`` dir: read, never written.
        Its key names the host, run and process identity, so it is unambiguous: that event
        was acted on."""
        return (state_dir() / "guard" / f"{key}.json").exists()

    def _claim(self, event: BudgetEvent) -> bool:
        """Claim every key of the event: on disk (atomically, shared with every runwatch), or in
        this process when the state dir refuses the marker (W22: the policy still acts, once
        here, and says so; :attr:`unmarked`). False when any key was claimed before."""
        if any(k in self._in_memory for k in event.keys):
            return False
        try:
            return self._claim_on_disk(event)
        except (OSError, RunwatchError) as e:
            self._in_memory.update(event.keys)
            self.unmarked[event.keys[0]] = str(e)
            return True

    def _claim_on_disk(self, event: BudgetEvent) -> bool:
        private_dir(self.marker_dir)
        from supervisor.secrets import mask_known

        body = json.dumps(mask_known({"time": time.time(), **event.to_json()})).encode()
        if any(self._legacy(k) for k in event.keys):
            return False
        first = self.marker_dir / f"{event.keys[0]}.json"
        try:
            fd = os.open(first, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        except FileExistsError:
            return False
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        for key in event.keys[1:]:
            try:
                path = self.marker_dir / f"{key}.json"
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
            except FileExistsError:
                continue
            try:
                os.write(fd, body)
            finally:
                os.close(fd)
        return True

    def _release(self, event: BudgetEvent) -> None:
        self._in_memory.difference_update(event.keys)
        for key in event.keys:
            with contextlib.suppress(OSError):
                (self.marker_dir / f"{key}.json").unlink(missing_ok=True)

    def observe(self, snapshot: Snapshot) -> list[BudgetEvent]:
        """Budget events in ``snapshot`` not acted on yet (pure: changes nothing)."""
        events: list[BudgetEvent] = []
        runs = {r.name: r for r in self.config.runs}
        for hv in snapshot.hosts:
            if not hv.connected or hv.stale:
                continue
            for rv in hv.runs:
                rc = runs.get(rv.name)
                proc = rv.process
                if rc is None or proc is None or rv.state != "running":
                    continue
                if proc.flags.token_budget is not None:
                    continue  # the run enforces its own budget
                over: dict[str, int] = {}
                budgets: dict[str, int] = {}
                waste = 0
                for dv in rv.datasets:
                    dc = self.config.datasets.get(dv.name)
                    budget = dataset_budget(dc, proc.flags.token_budget)
                    if budget is None or dv.completion_tokens <= budget:
                        continue
                    key = self._key(hv.name, rv.name, proc.identity, dv.name, rc.budget_policy)
                    if self._marked(key):
                        continue
                    over[dv.name] = dv.completion_tokens
                    budgets[dv.name] = budget
                    waste += max(dv.projection.waste_tokens, dv.completion_tokens - budget)
                if not over:
                    continue
                names = sorted(over)
                budget = min(budgets.values())
                parts = [f"{d} {display.budget(over[d], budgets[d])}" for d in names]
                flag = clients.client_of(self.config, rc).flags.budget
                lacks = f"with no {flag[0]}" if flag else "(its client has no budget flag)"
                events.append(
                    BudgetEvent(
                        policy=rc.budget_policy,
                        host=hv.name,
                        run=rv.name,
                        identity=proc.identity,
                        datasets=names,
                        budget=budget,
                        tokens=over,
                        waste_tokens=waste,
                        message=f"{rv.name}: past the token budget {lacks}: " + ", ".join(parts),
                        held_elsewhere=(
                            rv.owner.held_text(proc.identity.pid) + rv.owner.owner()
                            if rv.owner is not None
                            else ""
                        ),
                        keys=[
                            self._key(hv.name, rv.name, proc.identity, d, rc.budget_policy)
                            for d in names
                        ],
                    )
                )
        return events

    async def act(
        self, engine: Acts, event: BudgetEvent, on_step: OnStep | None = None
    ) -> GuardOutcome:
        """Carry out the event's policy once (claimed atomically first) and audit it."""
        if not self._claim(event):
            return GuardOutcome(event, acted=False, ok=True, detail="already acted on")
        result: ActionResult | None = None
        if event.policy == "warn":
            ok, detail = True, event.message
        elif event.held_elsewhere:
            # Once, not at every refresh: the owning config's own policy or its user acts.
            ok, detail = (
                False,
                f"{event.policy} not done: the run is {event.held_elsewhere}; only that config "
                "acts on it",
            )
        elif event.policy == "stop":
            try:
                grace = self.config.run(event.run).stop_grace_seconds
                res = await engine.kill(event.host, event.identity, grace, run=event.run)
                outcome = msgspec.to_builtins(res)
                refused = kill_refused(outcome)
                ok = refused is None
                detail = f"stopped pid {event.identity.pid}: {kill_summary(outcome)}"
                if refused:
                    detail = f"kill refused: {refused}"
            except RunwatchError as e:
                ok, detail = False, f"stop failed: {e}"
        elif not (flags := clients.client_of(self.config, self.config.run(event.run)).flags.budget):
            client = clients.client_of(self.config, self.config.run(event.run)).name
            ok, detail = (
                False,
                (
                    f"restart with budget refused: {client} has no budget flag, so a restart would "
                    "not stop at the budget either; set budget_policy = 'stop' to stop it there"
                ),
            )
        else:
            try:
                plan = await make_plan(
                    engine,
                    event.run,
                    action="restart",
                    overrides=[(flags[0], str(event.budget))],
                )
                if plan.old is None or plan.old.identity != event.identity:
                    ok, detail = False, "the run changed since the event; not restarted"
                else:
                    plan.budget_reason = event.message
                    result = await engine.execute(plan, on_step=on_step)  # under the run's lock
                    ok = result.ok
                    failed = result.failed_step
                    detail = (
                        f"restarted with {flags[0]} {event.budget}: pid "
                        f"{(result.identity or {}).get('pid')}"
                        if ok
                        else f"restart with budget failed at {failed.name if failed else '?'}: "
                        f"{failed.detail if failed else ''}"
                        + (f"\n{result.rollback['detail']}" if result.rollback else "")
                    )
            except RunwatchError as e:
                ok, detail = False, f"restart with budget failed: {e}"
        unmarked = self.unmarked.pop(event.keys[0], None)
        if unmarked is not None:
            detail += f" (its once-only marker not written: {unmarked}; kept by this process only)"
        if not ok and event.policy == "stop" and not event.held_elsewhere:
            # A stop that failed is tried again at the next refresh, never dropped: the run would
            # go on spending past its budget. The claim is released for that.
            self._release(event)
            detail += "; will try again at the next refresh"
        try:
            audit.record(
                "budget",
                config=engine.config.key,
                host=event.host,
                run=event.run,
                ok=ok,
                identity=msgspec.to_builtins(event.identity),
                policy=event.policy,
                datasets=event.datasets,
                budget=event.budget,
                tokens=event.tokens,
                waste_tokens=event.waste_tokens,
                detail=detail,
            )
        except (OSError, RunwatchError) as e:  # said, never raised: the refresh goes on (W22)
            detail += f" (not in the audit log: {e})"
        return GuardOutcome(event, acted=True, ok=ok, detail=detail, result=result)

    async def enforce(
        self, engine: Acts, snapshot: Snapshot, on_step: OnStep | None = None
    ) -> list[GuardOutcome]:
        """``observe`` then ``act`` on each event."""
        return [await self.act(engine, e, on_step) for e in self.observe(snapshot)]


def budget_event(outcome: GuardOutcome, config: Config) -> Event | None:
    """The event of a budget policy's action (None for ``warn``, which over-budget says)."""
    ev = outcome.event
    if not outcome.acted or ev.policy == "warn":
        return None
    prefix = command_prefix(config)
    return Event(
        kind="budget-policy",
        severity="info" if outcome.ok else "critical",
        host=ev.host,
        run=ev.run,
        title=f"Budget policy {ev.policy}: {ev.run}",
        message=f"{ev.message}\n{outcome.detail}",
        command=f"{prefix} audit",
        key=f"budget-policy|{ev.host}|{ev.run}|{ev.identity.pid}",
        time=time.time(),
    )
