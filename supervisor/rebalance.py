"""Finish by a deadline: split the remaining datasets between the runs' endpoints.

Pure arithmetic over a :class:`~supervisor.compare.Comparison` (measured rates, their errors,
prices) and the runs that may take datasets. Each run is a *slot*: one endpoint, the datasets it
writes. The datasets of a slot run one after another on its endpoint's shared throughput, so its
time is the sum of theirs and their errors add (one rate behind them all); the plan finishes when
its slowest slot does. Every assignment of datasets to slots is tried (at most a few thousand:
eight datasets, three runs), and the best is kept:

- with a deadline: the cheapest that meets it (expected finish, not finish plus error) under the
  cost cap; when none does, the fastest under the cap, with "cannot meet the deadline";
- without one: the fastest under the cap.

Ties go to the plan that moves fewer datasets. The unit of work is a whole dataset: a dataset moves
from one run to another only through the receiving client's dataset flag, and resumes from its
records there (the reference client skips the sample ids its file holds).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from supervisor import display
from supervisor.compare import Comparison, Estimate
from supervisor.errors import RunwatchError, UsageError
from supervisor.paths import config_state, read_private, write_private

if TYPE_CHECKING:
    from pathlib import Path

    from supervisor.config import Config
    from supervisor.model import PlanProgress, RunView, Snapshot

RESTART_S = 5.0
"""Seconds a run that changes datasets loses to its restart (the stop, the quiet window, the
start), added to its time: a move must gain more than that."""
# Beyond this many assignments (slots ** datasets) the search is greedy instead of exhaustive.
_EXHAUSTIVE = 200_000


class Slot(msgspec.Struct, kw_only=True):
    """A run that can take datasets: its endpoint and what it writes now."""

    run: str
    host: str
    endpoint: str
    kind: str
    datasets: list[str]
    running: bool = False
    frozen: bool = False
    """The run cannot be restarted as it is (a dataset's data is not in the current format):
    it neither gives nor takes datasets."""
    model: str | None = None
    """The model the run generates with, as the start's fingerprint reads it
    (``fingerprint.run_model`` on its launch argv): a dataset moves only between runs of the
    same model (``fingerprint.model_changed``; the gate refuses a change of model)."""


class Share(msgspec.Struct, kw_only=True):
    """One slot's part of an option."""

    run: str
    endpoint: str
    kind: str
    datasets: list[str] = []
    seconds: float = 0.0
    seconds_err: float | None = 0.0
    cost_usd: float | None = 0.0
    cost_err: float | None = 0.0


class Option(msgspec.Struct, kw_only=True):
    """A way to finish: who writes what, when it ends, what it costs."""

    name: str
    shares: list[Share] = []
    seconds: float = 0.0
    seconds_err: float | None = None
    cost_usd: float | None = None
    cost_err: float | None = None
    meets_deadline: bool | None = None
    within_cap: bool | None = None
    moves: int = 0
    possible: bool = True
    """False for an alternative that would move a dataset that must stay where it is."""
    never: list[str] = []
    """The runs that hold datasets with work left and are not running: this option (``as
    now``) never finishes them (its ``seconds`` is infinite, null in JSON)."""


class Move(msgspec.Struct, kw_only=True):
    dataset: str
    from_run: str | None
    to_run: str


class RefusedMove(msgspec.Struct, kw_only=True):
    """A move the gate refuses (its dry checks of the start that would make it): never
    proposed."""

    dataset: str
    from_run: str | None
    to_run: str
    reason: str


class Step(msgspec.Struct, kw_only=True):
    """One action of the plan, in order: runs that give datasets away go first."""

    run: str
    action: str
    """``restart`` (with ``datasets``), ``launch`` (a run not running that takes datasets) or
    ``stop`` (a run left with none)."""
    datasets: list[str] = []
    previous: list[str] = []


class Rebalance(msgspec.Struct, kw_only=True):
    """The ``rebalance --json`` output."""

    time: float
    deadline_s: float | None = None
    max_usd: float | None = None
    move_aside: bool = False
    allow_model_change: bool = False
    """``--allow-change model``: a dataset may move to a run of another model (its start passes
    the fingerprint's model check)."""
    plan: Option | None = None
    alternatives: list[Option] = []
    """``all <endpoint>`` for each endpoint, and ``as now`` (nothing moves)."""
    moves: list[Move] = []
    steps: list[Step] = []
    verdict: str = ""
    refused: str | None = None
    kept: dict[str, str] = {}
    """Runs and datasets left as they are, and why."""
    gate_refused: list[RefusedMove] = []
    """Moves the gate's checks refused: the plan was made again without them."""


def _share(slot: Slot, datasets: Sequence[str], est: dict[tuple[str, str], Estimate]) -> Share:
    out = Share(run=slot.run, endpoint=slot.endpoint, kind=slot.kind, datasets=list(datasets))
    for d in datasets:
        e = est[(d, slot.endpoint)]
        out.seconds += e.seconds or 0.0
        if out.seconds_err is not None:
            out.seconds_err = None if e.seconds_err is None else out.seconds_err + e.seconds_err
        if out.cost_usd is not None:
            out.cost_usd = None if e.cost_usd is None else out.cost_usd + e.cost_usd
        if out.cost_err is not None:
            out.cost_err = out.cost_err + (e.cost_err or 0.0)
    return out


def _option(
    name: str,
    slots: Sequence[Slot],
    choice: Sequence[int],
    datasets: Sequence[str],
    est: dict[tuple[str, str], Estimate],
    deadline_s: float | None,
    max_usd: float | None,
) -> Option:
    by_slot: list[list[str]] = [[] for _ in slots]
    for d, i in zip(datasets, choice, strict=True):
        by_slot[i].append(d)
    shares = [_share(s, ds, est) for s, ds in zip(slots, by_slot, strict=True)]
    for slot, sh in zip(slots, shares, strict=True):
        mine = {d for d in datasets if d in slot.datasets}
        if sh.datasets and (set(sh.datasets) != mine or not slot.running):
            sh.seconds += RESTART_S  # its restart or its launch: stop, quiet window, start
    busy = [sh for sh in shares if sh.datasets]
    slowest = max(busy, key=lambda sh: sh.seconds) if busy else None
    costs = [sh.cost_usd for sh in shares]
    cost = None if any(c is None for c in costs) else sum(c or 0.0 for c in costs)
    errs = [sh.cost_err for sh in shares]
    moves = sum(1 for d, i in zip(datasets, choice, strict=True) if d not in slots[i].datasets)
    return Option(
        name=name,
        shares=shares,
        seconds=slowest.seconds if slowest else 0.0,
        seconds_err=slowest.seconds_err if slowest else 0.0,
        cost_usd=cost,
        cost_err=None if any(e is None for e in errs) else sum(e or 0.0 for e in errs),
        meets_deadline=None
        if deadline_s is None
        else (slowest.seconds if slowest else 0.0) <= deadline_s,
        # A cost that equals the cap is within it (sums of floats land a hair above).
        within_cap=None if max_usd is None else (cost is not None and cost <= max_usd + 1e-9),
        moves=moves,
    )


def _better(a: Option, b: Option, deadline: bool) -> bool:
    """Is ``a`` better than ``b`` (both within the cap)?"""
    if deadline and a.meets_deadline != b.meets_deadline:
        return bool(a.meets_deadline)
    if deadline and a.meets_deadline:
        ka = (a.cost_usd if a.cost_usd is not None else math.inf, a.moves, a.seconds)
        kb = (b.cost_usd if b.cost_usd is not None else math.inf, b.moves, b.seconds)
    else:
        ka = (round(a.seconds, 6), a.moves, a.cost_usd or 0.0)
        kb = (round(b.seconds, 6), b.moves, b.cost_usd or 0.0)
    return ka < kb


def _choices(n_slots: int, n_data: int) -> itertools.product[tuple[int, ...]] | None:
    if n_slots**n_data > _EXHAUSTIVE:
        return None
    return itertools.product(range(n_slots), repeat=n_data)


def plan(
    comparison: Comparison,
    slots: Sequence[Slot],
    *,
    deadline_s: float | None,
    max_usd: float | None,
    kept: dict[str, str] | None = None,
    pinned: dict[str, str] | None = None,
    allow_model_change: bool = False,
    refused_moves: dict[tuple[str, str], str] | None = None,
) -> Rebalance:
    """The best split of the compared datasets between ``slots`` (pure). ``pinned`` datasets
    (and why) stay with the run that writes them: their time still counts there.
    ``refused_moves`` (``(dataset, run)`` -> the gate's reason) are moves never made."""
    out = Rebalance(time=comparison.time, deadline_s=deadline_s, max_usd=max_usd)
    out.kept = dict(kept or {})
    for name, why in comparison.skipped.items():
        out.kept.setdefault(name, why)
    if len(slots) < 1:
        out.refused = "no run can take datasets: " + (
            "; ".join(f"{k}: {v}" for k, v in out.kept.items()) or "the config has no runs"
        )
        return out
    held = {d for s in slots for d in s.datasets}
    est: dict[tuple[str, str], Estimate] = {}
    datasets: list[str] = []
    for dc in comparison.datasets:
        name = dc.work.dataset
        if name not in held:
            out.kept.setdefault(name, "no run that can take datasets writes it")
            continue
        for e in dc.estimates:
            est[(name, e.endpoint)] = e
        datasets.append(name)
    unmeasured = sorted({s.endpoint for s in slots for d in datasets if _no_time(est, d, s)})
    if unmeasured:
        out.refused = (
            f"no throughput measured for {', '.join(unmeasured)}: let its run write for a few "
            "minutes, or measure it with `runwatch bench`"
        )
        return out
    if not datasets:
        out.refused = "nothing left to split: every dataset is done or has no budget"
        return out
    # A dataset's home is the run that writes it now: a running run that names it before a
    # stopped one whose command line still names it too.
    home = [
        min((i for i, s in enumerate(slots) if d in s.datasets), key=lambda i: not slots[i].running)
        for d in datasets
    ]
    # What each run takes to finish what it has at its rate, left as it is.
    own = [
        _share(s, [d for d, h in zip(datasets, home, strict=True) if h == i], est).seconds
        for i, s in enumerate(slots)
    ]
    pinned = pinned or {}
    fixed = [j for j, d in enumerate(datasets) if d in pinned]
    no_go = refused_moves or {}
    for d, why in pinned.items():
        out.kept.setdefault(d, f"stays with its run: {why}")

    def allowed(choice: Sequence[int]) -> bool:
        return (
            not any(choice[j] != home[j] for j in fixed)
            and not any(
                (i != home[j] or not slots[i].running) and (datasets[j], slots[i].run) in no_go
                for j, i in enumerate(choice)
            )
            and not any(slots[i].frozen and i != home[j] for j, i in enumerate(choice))
            and (
                allow_model_change
                or not any(_other_model(slots[i], slots[home[j]]) for j, i in enumerate(choice))
            )
        )

    for s in slots if not allow_model_change else []:
        if any(_other_model(s, slots[h]) for h in home) and s.run not in out.kept:
            out.kept[s.run] = (
                f"takes only datasets of its own model ({s.model or 'unknown'}): another "
                "model's data would mix two models' outputs (pass --allow-change model to "
                "move datasets between models)"
            )

    def hands_to_slower(opt: Option, choice: Sequence[int]) -> bool:
        """Does ``opt`` take work from a running run to a run that ends later than the
        giver would finish everything it has?"""
        return any(
            i != home[j] and slots[home[j]].running and opt.shares[i].seconds >= own[home[j]]
            for j, i in enumerate(choice)
        )

    as_now = _as_now(slots, home, datasets, est, deadline_s, max_usd)
    out.alternatives = [as_now]
    for i, s in enumerate(slots):
        if any(t.endpoint == s.endpoint for t in slots[:i]):
            continue
        alt = _option(
            f"all on {s.endpoint}", slots, [i] * len(datasets), datasets, est, deadline_s, max_usd
        )
        alt.possible = allowed([i] * len(datasets))
        out.alternatives.append(alt)
    best: Option | None = None
    fastest: Option | None = None
    cheapest: float | None = None
    """The cost of the cheapest split that may be made (whatever the cap)."""
    candidates = _choices(len(slots), len(datasets))
    for choice in candidates if candidates is not None else _greedy(slots, datasets, est, home):
        if not allowed(choice):
            continue
        opt = _option("plan", slots, choice, datasets, est, deadline_s, max_usd)
        if hands_to_slower(opt, choice):
            continue
        if opt.cost_usd is not None and (cheapest is None or opt.cost_usd < cheapest):
            cheapest = opt.cost_usd
        if opt.within_cap is False:
            continue
        if fastest is None or _better(opt, fastest, False):
            fastest = opt
        if best is None or _better(opt, best, deadline_s is not None):
            best = opt
    if best is None and cheapest is None and no_go:
        out.refused = "no split passes the start checks: " + "; ".join(sorted(set(no_go.values())))
        return out
    if best is None:
        out.refused = f"no split costs at most {_usd(max_usd)}" + (
            f"; the cheapest that can be made costs {_usd(cheapest)}"
            if cheapest is not None
            else ""
        )
        return out
    out.plan = best
    finished = [d for d, why in comparison.skipped.items() if why.endswith("reached")]
    out.moves, out.steps = _moves_and_steps(slots, best, finished)
    out.verdict = _verdict(best, deadline_s, max_usd)
    return out


def _as_now(
    slots: Sequence[Slot],
    home: Sequence[int],
    datasets: Sequence[str],
    est: dict[tuple[str, str], Estimate],
    deadline_s: float | None,
    max_usd: float | None,
) -> Option:
    """The runs left as they are: a stopped run makes nothing, so its datasets never finish
    (``never`` names it; ``seconds`` is then infinite)."""
    out = _option("as now", slots, home, datasets, est, deadline_s, max_usd)
    out.never = [
        s.run for s, sh in zip(slots, out.shares, strict=True) if sh.datasets and not s.running
    ]
    if out.never:
        out.seconds, out.seconds_err = math.inf, None
        out.meets_deadline = None if deadline_s is None else False
    return out


def _no_time(est: dict[tuple[str, str], Estimate], dataset: str, slot: Slot) -> bool:
    e = est.get((dataset, slot.endpoint))
    return e is None or e.seconds is None


def _greedy(
    slots: Sequence[Slot],
    datasets: Sequence[str],
    est: dict[tuple[str, str], Estimate],
    home: Sequence[int],
) -> list[tuple[int, ...]]:
    """Longest datasets first, each to the slot that would finish it soonest."""
    order = sorted(
        range(len(datasets)),
        key=lambda j: -(est[(datasets[j], slots[home[j]].endpoint)].seconds or 0),
    )
    load = [0.0] * len(slots)
    choice = list(home)
    for j in order:
        i = min(
            range(len(slots)),
            key=lambda k: load[k] + (est[(datasets[j], slots[k].endpoint)].seconds or 0.0),
        )
        choice[j] = i
        load[i] += est[(datasets[j], slots[i].endpoint)].seconds or 0.0
    return [tuple(home), tuple(choice)]


def _moves_and_steps(
    slots: Sequence[Slot], best: Option, best_finished: Sequence[str]
) -> tuple[list[Move], list[Step]]:
    owner = {d: s.run for s in slots for d in s.datasets}
    moves = [
        Move(dataset=d, from_run=owner.get(d), to_run=sh.run)
        for sh in best.shares
        for d in sh.datasets
        if owner.get(d) != sh.run
    ]
    planned = {d for sh in best.shares for d in sh.datasets}
    # What the plan does not split stays with its run, unless it is finished (its budget or
    # sample count reached): a run left with finished datasets only is stopped.
    finished = set(best_finished)
    givers: list[Step] = []
    takers: list[Step] = []
    for slot, sh in zip(slots, best.shares, strict=True):
        now = list(slot.datasets)
        # Finished datasets are dropped; what the plan does not split stays.
        after = sorted(
            set(sh.datasets) | {d for d in now if d not in planned and d not in finished},
            key=_natural,
        )
        gives = set(now) - finished - set(after)
        takes = set(after) - set(now)
        if not slot.running:
            # A stopped run makes nothing: it is launched when the plan gives it datasets,
            # whether or not its command line names them already, else left stopped.
            if sh.datasets:
                takers.append(Step(run=slot.run, action="launch", datasets=after, previous=now))
            continue
        if set(after) == set(now) - finished:
            continue
        if not after:
            givers.append(Step(run=slot.run, action="stop", previous=now))
        elif not takes:
            givers.append(Step(run=slot.run, action="restart", datasets=after, previous=now))
        elif gives:
            # It gives and takes (a swap): it stops first, with the other givers, and starts
            # with its new datasets once every giver has stopped writing them.
            givers.append(Step(run=slot.run, action="stop", previous=now))
            takers.append(Step(run=slot.run, action="launch", datasets=after, previous=[]))
        else:
            takers.append(Step(run=slot.run, action="restart", datasets=after, previous=now))
    return moves, givers + takers


def _natural(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return (head, int(tail) if tail else -1)


def _usd(v: float | None) -> str:
    return "?" if v is None else f"${v:,.2f}"


def _verdict(best: Option, deadline_s: float | None, max_usd: float | None) -> str:
    when = display.duration(best.seconds)
    err = f" ± {display.duration(best.seconds_err)}" if best.seconds_err else ""
    cost = _usd(best.cost_usd)
    if deadline_s is not None and not best.meets_deadline:
        return (
            f"cannot finish within {display.duration(deadline_s)}"
            + (f" for at most {_usd(max_usd)}" if max_usd is not None else "")
            + f": the fastest split ends in {when}{err} and costs {cost}"
        )
    return f"finishes in {when}{err} for {cost}"


# --------------------------------------------------------------------------- from a snapshot


_MOVABLE = ("current", "empty", "missing")
# With --move-aside, a restart renames data of an earlier format aside (nothing is deleted)
# and starts the dataset afresh.
_ASIDE = ("legacy", "mixed")


def runs_itself(view: RunView) -> bool:
    """The run's own process runs: not merely its data files written by another run's unit (of
    this config under another name, which a plan stops and then launches this run in its place,
    or of another config)."""
    return view.state == "running" and view.owner is None


def slots_from(
    config: Config, snapshot: Snapshot, move_aside: bool = False
) -> tuple[list[Slot], dict[str, str], dict[str, str], str | None]:
    """The runs that can take datasets, the runs left as they are (and why), the datasets that
    cannot move (data not in the current format: the run that takes it would refuse to start
    on it), and a refusal (a host of such a run is down: its datasets' state is unknown)."""
    from supervisor.clients import client_of
    from supervisor.fingerprint import run_model
    from supervisor.launchspec import launch_argv

    views = {(h.name, r.name): (h, r) for h in snapshot.hosts for r in h.runs}
    slots: list[Slot] = []
    kept: dict[str, str] = {}
    pinned: dict[str, str] = {}
    for run in config.runs:
        # What a start of the run would run: the config's argv with its launch spec.
        argv = launch_argv(config, run)
        profile = client_of(config, run, argv)
        if run.endpoint is None:
            kept[run.name] = "the run names no endpoint (`endpoint = ...` in its [[runs]] table)"
            continue
        if config.host(run.host).kind == "slurm":
            kept[run.name] = "a Slurm run: rebalance moves datasets between process runs only"
            continue
        if not profile.flags.datasets:
            kept[run.name] = f"its client ({profile.name}) has no dataset flag to split its work by"
            continue
        if not profile.flags.endpoint:
            kept[run.name] = (
                f"its client ({profile.name}) has no endpoint flag: runwatch cannot tell that it "
                f"writes through {run.endpoint}"
            )
            continue
        host, view = views.get((run.host, run.name), (None, None))
        if host is None or view is None or not host.connected or host.stale:
            why = host.error if host is not None and host.error else "not reachable"
            return (
                [],
                kept,
                pinned,
                f"host {run.host} of run {run.name} is down ({why}): nothing moved",
            )
        if view.owner is not None and not view.owner.mine:
            kept[run.name] = (
                f"its data files are {view.state_detail or 'held by another config'}: only that "
                "config moves its datasets"
            )
            continue
        ep = next((e for e in config.endpoints if e.name == run.endpoint), None)
        slots.append(
            Slot(
                run=run.name,
                host=run.host,
                endpoint=run.endpoint,
                kind=ep.kind if ep is not None else "api",
                datasets=[d.name for d in view.datasets],
                running=runs_itself(view),
                model=run_model(run, argv, config),
            )
        )
        ok = _MOVABLE + (_ASIDE if move_aside else ())
        bad = [d for d in view.datasets if d.verdict not in ok]
        for d in bad:
            pinned[d.name] = (
                f"its data is {d.verdict}"
                + (f" ({d.verdict_detail})" if d.verdict_detail else "")
                + (
                    ": check it with `runwatch check`, or pass --move-aside"
                    if d.verdict in _ASIDE
                    else ": check it with `runwatch check`"
                )
            )
        if bad:
            # Restarting the run would start it on that data: the gate refuses, so the run
            # keeps what it has.
            slots[-1].frozen = True
            for d in view.datasets:
                pinned.setdefault(
                    d.name,
                    f"its run {run.name} also writes {bad[0].name}, whose data is "
                    f"{bad[0].verdict}: fix that first (`runwatch check {run.name}`)",
                )
    return slots, kept, pinned, None


def _other_model(a: Slot, b: Slot) -> bool:
    """Data of ``b``'s model may not continue in ``a``: the start's fingerprint rule."""
    from supervisor.fingerprint import model_changed

    return model_changed(b.model, a.model)


def parse_deadline(text: str) -> float:
    """``45m``, ``2h``, ``1h30m``, ``90s`` or plain seconds -> seconds."""
    import re

    t = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", t)
    if not parts or "".join(n + u for n, u in parts) != t:
        raise UsageError(
            f"--by {text!r}: not a duration", "write it as 45m, 2h, 1h30m, 90s or seconds"
        )
    unit = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(n) * unit[u] for n, u in parts)


def describe(result: Rebalance) -> list[str]:
    """The plan in words, each option beside it."""
    lines: list[str] = []
    if result.refused:
        return (
            [f"refused: {result.refused}"]
            + [f"  kept: {k}: {v}" for k, v in result.kept.items()]
            + _refused_lines(result)
        )
    assert result.plan is not None
    head = "finish"
    if result.deadline_s is not None:
        head += f" within {display.duration(result.deadline_s)}"
    if result.max_usd is not None:
        head += f", at most {_usd(result.max_usd)}"
    lines.append(f"{head}: {result.verdict}")
    for opt in [result.plan, *result.alternatives]:
        ends = (
            f"never ({', '.join(opt.never)} not running)"
            if opt.never
            else f"in {display.duration_pm(opt.seconds, opt.seconds_err)}"
        )
        lines.append(
            f"  {opt.name:<24} ends {ends:<21} "
            f"costs {_usd(opt.cost_usd)}"
            + (f" ± {_usd(opt.cost_err)}" if opt.cost_err else "")
            + ("" if opt.meets_deadline is not False else "  (misses the deadline)")
            + ("" if opt.within_cap is not False else "  (over the cap)")
            + ("" if opt.possible else "  (not possible now: see the datasets kept below)")
        )
        if opt is result.plan:
            for sh in opt.shares:
                lines.append(
                    f"      {sh.run} on {sh.endpoint}: {', '.join(sh.datasets) or '-'}"
                    f"  ({display.duration_pm(sh.seconds, sh.seconds_err)}, {_usd(sh.cost_usd)})"
                )
    if result.steps:
        lines.append("steps:")
        for i, st in enumerate(result.steps, 1):
            what = (
                f"stop {st.run}"
                if st.action == "stop"
                else f"{st.action} {st.run} --set datasets={','.join(st.datasets)}"
            )
            lines.append(f"  {i}. {what}   (now: {','.join(st.previous) or '-'})")
    else:
        lines.append("nothing to move: the runs already hold the best split")
    for k, v in result.kept.items():
        lines.append(f"  kept as it is: {k}: {v}")
    lines += _refused_lines(result)
    return lines


def _refused_lines(result: Rebalance) -> list[str]:
    """The moves the start checks refused, those of one reason together."""
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for m in result.gate_refused:
        grouped.setdefault((m.from_run or "-", m.to_run, m.reason), []).append(m.dataset)
    return [
        f"  refused by the start checks: {', '.join(ds)} from {src} to {dst}: "
        + reason.replace("\n", " ")
        for (src, dst, reason), ds in grouped.items()
    ]


# --------------------------------------------------------------------------- carrying it out


class StepOutcome(msgspec.Struct, kw_only=True):
    run: str
    action: str
    ok: bool
    detail: str
    rolled_back: bool = False
    at: float | None = None
    """When the step ended (Unix time): a run that takes datasets writes them from then."""


async def apply(
    engine: Any,
    result: Rebalance,
    *,
    on_step: Callable[[str], None] | None = None,
    interrupted: Callable[[], bool] | None = None,
) -> list[StepOutcome]:
    """Carry the plan's steps out in order through the one gate (``engine.plan`` and
    ``engine.execute``: writers, format, quiet window), runs that give datasets away first, so a
    dataset never has two writers. The first step that fails stops the plan, and the steps done
    before it are undone in reverse order (each run restarted with the datasets it had); so does
    ``interrupted()`` turning true (Ctrl-C), checked once the step under way has ended. The plan
    is kept as an intent (:mod:`supervisor.planintent`) from before its first step until it is
    applied or rolled back. Every step and the whole plan are audited."""
    from supervisor import audit, planintent

    say = on_step or (lambda _line: None)
    if result.plan is not None and result.plan.meets_deadline is False:
        # The fastest split still misses the deadline: a refusal, nothing is changed.
        detail = f"{result.verdict}: nothing changed (give a later --by, or a larger --max-usd)"
        say(f"refused: {detail}")
        return [StepOutcome(run="-", action="plan", ok=False, detail=detail)]
    outcomes: list[StepOutcome] = []
    # 1. Every start's own checks first (flags, values, format, budget, key), while nothing has
    # stopped: a plan that would fail half-way is refused whole.
    for st, problem in await check_steps(engine, result):
        say(f"check of {st.action} {st.run} FAILED: {problem}")
        outcomes.append(StepOutcome(run=st.run, action=st.action, ok=False, detail=problem))
    failed: StepOutcome | None = outcomes[0] if outcomes else None
    done: list[tuple[Step, StepOutcome]] = []
    # The projection counts from here: planning and checking took what they took (a plan made
    # on the compare screen may be applied long after).
    started_at = time.time()
    intent = planintent.PlanIntent(
        written=started_at,
        by=audit.actor(),
        pid=os.getpid(),
        steps=[
            planintent.StepState(
                run=st.run, action=st.action, datasets=st.datasets, previous=st.previous
            )
            for st in result.steps
        ],
        move_aside=result.move_aside,
        allow_model_change=result.allow_model_change,
    )
    # 2. The steps, in order (givers first); the first failure stops the plan. The intent is
    # on disk before anything stops, and says where the plan got to after each step.
    for i, st in enumerate(result.steps if failed is None else []):
        if interrupted is not None and interrupted():
            failed = StepOutcome(
                run="-", action="interrupt", ok=False, detail="interrupted", at=time.time()
            )
            outcomes.append(failed)
            say("interrupted: rolling back the steps done")
            break
        intent.steps[i].state = "begun"
        planintent.write(engine.config, intent)
        say(
            f"{st.action} {st.run}" + (f": datasets {','.join(st.datasets)}" if st.datasets else "")
        )
        out = await _carry_out(
            engine,
            st.run,
            st.action,
            st.datasets,
            result.move_aside,
            allow_model_change=result.allow_model_change,
        )
        out.at = time.time()
        outcomes.append(out)
        intent.steps[i].state = "done" if out.ok else "failed"
        planintent.write(engine.config, intent)
        say(f"  {'ok' if out.ok else 'FAILED'}: {out.detail}")
        if not out.ok:
            failed = out
            break
        done.append((st, out))
    if failed is None and result.steps and interrupted is not None and interrupted():
        failed = StepOutcome(run="-", action="interrupt", ok=False, detail="interrupted")
        outcomes.append(failed)
        say("interrupted: rolling back the steps done")
    # 3. The plan's runs, confirmed: each run the plan gives datasets with work left to is
    # running once the steps are done, else the plan failed.
    if failed is None and result.plan is not None:
        for run, why in await _not_running(engine, result.plan):
            failed = StepOutcome(run=run, action="confirm", ok=False, detail=why, at=time.time())
            outcomes.append(failed)
            say(f"confirm {run}: FAILED: {why}")
    # 4. Undo what was done, last first: each run back to the command line it ran (its own
    # budget checks do not stop that; the guard still applies its policy).
    if failed is not None:
        for st, out in reversed(done):
            back = {"stop": "launch", "launch": "stop"}.get(st.action, "restart")
            say(
                f"rolling back: {back} {st.run}"
                + (f": datasets {','.join(st.previous)}" if back != "stop" else "")
            )
            undo = await _carry_out(
                engine,
                st.run,
                back,
                st.previous,
                result.move_aside,
                force=True,
                allow_model_change=result.allow_model_change,
            )
            out.rolled_back = undo.ok
            if undo.ok:
                intent.steps[result.steps.index(st)].state = "rolled back"
                planintent.write(engine.config, intent)
            say(f"  {'ok' if undo.ok else 'FAILED'}: {undo.detail}")
    if failed is None:
        save_applied(engine.config, result, started_at)
    if failed is None or all(out.rolled_back for _st, out in done):
        planintent.remove(engine.config)  # applied, or undone: nothing is left half-way
    audit.record(
        "rebalance",
        config=engine.config.key,
        host="-",
        run=None,
        ok=failed is None,
        steps=[msgspec.to_builtins(o) for o in outcomes],
        plan=msgspec.to_builtins(result.plan),
        deadline_s=result.deadline_s,
        max_usd=result.max_usd,
        secrets=engine.secret_values(),
    )
    return outcomes


async def resume(
    engine: Any, *, on_step: Callable[[str], None] | None = None
) -> list[StepOutcome] | None:
    """Take up the plan an apply left half-applied (its intent; None when there is none): every
    step it began or did, last first, is undone from what the runs are now (a run that ran before
    the plan runs again with the datasets it had, one that did not is stopped). Audited as
    ``rebalance-resume``; the intent is removed once every run is back as it was."""
    from supervisor import audit, planintent

    say = on_step or (lambda _line: None)
    intent = planintent.read(engine.config)
    if intent is None:
        return None
    outcomes: list[StepOutcome] = []
    for st in reversed(intent.steps):
        if st.state in ("pending", "rolled back"):
            continue
        ran_before = st.action in ("stop", "restart")
        snap = await engine.refresh()
        view = next((r for h in snap.hosts for r in h.runs if r.name == st.run), None)
        running = view is not None and view.process is not None
        if not ran_before:
            say(f"rolling back {st.action} {st.run} ({st.state}): stop {st.run}")
            out = (
                await _stop(engine, st.run)
                if running
                else StepOutcome(run=st.run, action="stop", ok=True, detail="not running")
            )
        else:
            back = "restart" if running else "launch"
            say(
                f"rolling back {st.action} {st.run} ({st.state}): {back} {st.run}: datasets "
                f"{','.join(st.previous)}"
            )
            out = await _carry_out(
                engine,
                st.run,
                back,
                st.previous,
                intent.move_aside,
                force=True,
                allow_model_change=intent.allow_model_change,
            )
        out.at = time.time()
        out.rolled_back = out.ok
        outcomes.append(out)
        say(f"  {'ok' if out.ok else 'FAILED'}: {out.detail}")
        if out.ok:
            st.state = "rolled back"
            planintent.write(engine.config, intent)
    ok = all(o.ok for o in outcomes)
    if ok:
        planintent.remove(engine.config)
    audit.record(
        "rebalance-resume",
        config=engine.config.key,
        host="-",
        run=None,
        ok=ok,
        steps=[msgspec.to_builtins(o) for o in outcomes],
        intent=msgspec.to_builtins(intent),
        secrets=engine.secret_values(),
    )
    return outcomes


_CHECKS = ("preflight", "format-check", "fingerprint")


async def check_steps(engine: Any, result: Rebalance) -> list[tuple[Step, str]]:
    """The gate's dry checks of every start of the plan (``_CHECKS``: flags, values, format,
    fingerprint), while nothing has stopped; nothing is changed. The steps refused, and why."""
    refused: list[tuple[Step, str]] = []
    stopped_first = {st.run for st in result.steps if st.action == "stop"}
    for st in result.steps:
        if st.action == "stop":
            continue
        # A run stopped by an earlier step and launched again is checked as a restart of the
        # process that runs now.
        act = "restart" if st.run in stopped_first else st.action
        problem = await _precheck(
            engine, st.run, act, st.datasets, result.move_aside, result.allow_model_change
        )
        if problem is not None:
            refused.append((st, problem))
    return refused


async def _plan(
    engine: Any,
    run: str,
    action: str,
    datasets: Sequence[str],
    move_aside: bool,
    force: bool = False,
    allow_model_change: bool = False,
) -> Any:
    """The launch or restart plan of ``run`` writing ``datasets`` (its dataset flag set)."""
    return await engine.plan(
        run,
        action="launch" if action == "launch" else "restart",
        overrides=[("--datasets", ",".join(datasets))],
        move_aside=move_aside,
        force=force,
        allow_change=("model",) if allow_model_change else (),
    )


async def _precheck(
    engine: Any,
    run: str,
    action: str,
    datasets: Sequence[str],
    move_aside: bool,
    allow_model_change: bool = False,
) -> str | None:
    """The checks of a start that do not depend on who writes now (those of the writers and
    the quiet window run when the step does, after the runs that give datasets stopped)."""
    import dataclasses

    from supervisor.errors import RunwatchError

    try:
        plan = await _plan(
            engine, run, action, datasets, move_aside, allow_model_change=allow_model_change
        )
        checks = dataclasses.replace(plan, steps=[s for s in plan.steps if s.name in _CHECKS])
        res = await engine.execute(checks, dry_run=True)
    except RunwatchError as e:
        return str(e)
    failed = res.failed_step
    return None if failed is None else f"{failed.name}: {failed.detail}"


async def _carry_out(
    engine: Any,
    run: str,
    action: str,
    datasets: Sequence[str],
    move_aside: bool = False,
    force: bool = False,
    allow_model_change: bool = False,
) -> StepOutcome:
    from supervisor.errors import RunwatchError

    try:
        if action == "stop":
            return await _stop(engine, run)
        plan = await _plan(engine, run, action, datasets, move_aside, force, allow_model_change)
        res = await engine.execute(plan)
    except RunwatchError as e:
        return StepOutcome(run=run, action=action, ok=False, detail=str(e))
    failed = res.failed_step
    detail = (
        f"running (pid {res.identity.get('pid')})"
        if res.ok and res.identity
        else ("nothing to do: all its datasets are done" if res.ok else "")
    )
    if failed is not None:
        detail = f"stopped at {failed.name}: {failed.detail}"
    if res.rollback is not None:
        detail += f"; {res.rollback.get('detail')}"
    return StepOutcome(run=run, action=action, ok=res.ok, detail=detail)


async def _not_running(engine: Any, best: Option) -> list[tuple[str, str]]:
    """The runs of ``best`` given datasets that still have work left (by a fresh snapshot)
    which are not running, and what they are instead."""
    from supervisor.bench.history import load_history
    from supervisor.compare import comparison_from

    snap = await engine.refresh()
    left = {dc.work.dataset for dc in comparison_from(engine.config, snap, load_history()).datasets}
    views = {r.name: r for h in snap.hosts for r in h.runs if r.configured}
    out: list[tuple[str, str]] = []
    for sh in best.shares:
        todo = [d for d in sh.datasets if d in left]
        view = views.get(sh.run)
        if todo and (view is None or not runs_itself(view)):
            state = view.state if view is not None else "not seen"
            out.append((sh.run, f"{state}, not running, with {', '.join(todo)} left to write"))
    return out


async def _stop(engine: Any, run: str) -> StepOutcome:
    snap = await engine.refresh()
    view = next((r for h in snap.hosts for r in h.runs if r.name == run), None)
    if view is None or view.process is None:
        return StepOutcome(run=run, action="stop", ok=True, detail="not running")
    report = await engine.kill(view.host, view.process.identity, run=run)
    gone = report.all_gone
    return StepOutcome(
        run=run,
        action="stop",
        ok=gone,
        detail="stopped, exit confirmed" if gone else (report.unit_detail or "exit NOT confirmed"),
    )


async def gather(
    config: Config,
    engine: Any,
    *,
    deadline_s: float | None,
    max_usd: float | None,
    sample_s: float = 10.0,
    move_aside: bool = False,
    allow_model_change: bool = False,
) -> Rebalance:
    """Refresh (again every ``refresh_seconds``, for at most ``sample_s``, while a running run
    has no rate yet: as ``compare`` does), compare, and plan."""
    import asyncio

    from supervisor.bench.history import load_history
    from supervisor.compare import comparison_from, waiting_for_rates

    start = time.monotonic()
    snapshot = await engine.refresh()
    while waiting_for_rates(config, snapshot) and time.monotonic() - start < sample_s:
        await asyncio.sleep(max(0.2, config.refresh_seconds))  # the measuring interval
        snapshot = await engine.refresh()
    return await checked_plan(
        config,
        engine,
        snapshot,
        comparison_from(config, snapshot, load_history()),
        deadline_s=deadline_s,
        max_usd=max_usd,
        move_aside=move_aside,
        allow_model_change=allow_model_change,
    )


async def checked_plan(
    config: Config,
    engine: Any,
    snapshot: Snapshot,
    comparison: Comparison,
    *,
    deadline_s: float | None,
    max_usd: float | None,
    move_aside: bool = False,
    allow_model_change: bool = False,
) -> Rebalance:
    """The plan for a snapshot and its comparison, every start of it passed through the gate's
    dry checks (:func:`check_steps`) before it is shown: a move whose start the gate refuses is
    never proposed. It is listed in ``gate_refused`` with the gate's reason and the plan is made
    again without it, until every start passes; a start refused for a reason no move causes
    refuses the plan."""
    refused_moves: dict[tuple[str, str], str] = {}
    gate_refused: list[RefusedMove] = []
    while True:
        result = plan_for(
            config,
            snapshot,
            comparison,
            deadline_s=deadline_s,
            max_usd=max_usd,
            move_aside=move_aside,
            allow_model_change=allow_model_change,
            refused_moves=refused_moves,
        )
        result.gate_refused = gate_refused
        problems = await check_steps(engine, result) if result.steps else []
        if not problems:
            return result
        before = len(refused_moves)
        for st, problem in problems:
            # The moves that make this start: those into the run, else those out of it.
            into = [m for m in result.moves if m.to_run == st.run]
            if not into and st.action == "launch" and result.plan is not None:
                # A stopped run launched with what its command line names: the plan is made
                # again without it writing those datasets.
                share = next((sh for sh in result.plan.shares if sh.run == st.run), None)
                into = [
                    Move(dataset=d, from_run=None, to_run=st.run)
                    for d in (share.datasets if share is not None else [])
                ]
            for m in into or [m for m in result.moves if m.from_run == st.run]:
                if (m.dataset, m.to_run) not in refused_moves:
                    refused_moves[(m.dataset, m.to_run)] = problem
                    gate_refused.append(
                        RefusedMove(
                            dataset=m.dataset, from_run=m.from_run, to_run=m.to_run, reason=problem
                        )
                    )
        if len(refused_moves) == before:
            # No move of the plan causes it: the start is refused whatever the split.
            st, problem = problems[0]
            result.refused = f"the start checks refuse {st.action} {st.run}: {problem}"
            return result


def plan_for(
    config: Config,
    snapshot: Snapshot,
    comparison: Comparison,
    *,
    deadline_s: float | None,
    max_usd: float | None,
    move_aside: bool = False,
    allow_model_change: bool = False,
    refused_moves: dict[tuple[str, str], str] | None = None,
) -> Rebalance:
    """The plan for a snapshot and its comparison the caller already has (pure, instant; not
    checked by the gate: :func:`checked_plan` is)."""
    slots, kept, pinned, refused = slots_from(config, snapshot, move_aside)
    if refused is not None:
        return Rebalance(
            time=snapshot.time, deadline_s=deadline_s, max_usd=max_usd, refused=refused, kept=kept
        )
    result = plan(
        comparison,
        slots,
        deadline_s=deadline_s,
        max_usd=max_usd,
        kept=kept,
        pinned=pinned,
        allow_model_change=allow_model_change,
        refused_moves=refused_moves,
    )
    result.time = snapshot.time
    result.move_aside = move_aside
    result.allow_model_change = allow_model_change
    return result


# --------------------------------------------------------------------------- progress


def plan_path(config: Config) -> Path:
    """Where the config's applied plan is kept: one per config (``Config.key``)."""
    return config_state(config.key) / "rebalance.json"


class Applied(msgspec.Struct, kw_only=True):
    """What ``--apply`` carried out, kept until the next plan replaces it."""

    applied_at: float
    """When the plan was made (its snapshot): its deadline counts from then."""
    started_at: float | None = None
    """When its steps began (after the start checks): its projection counts from then, as its
    time includes the restarts (None: a plan kept by an older runwatch, from ``applied_at``)."""
    datasets: list[str]
    deadline_s: float | None = None
    max_usd: float | None = None
    projected_s: float
    projected_err: float | None = None
    projected_usd: float | None = None
    ended_at: float | None = None


def save_applied(config: Config, result: Rebalance, started_at: float) -> None:
    assert result.plan is not None
    applied = Applied(
        applied_at=result.time,
        started_at=started_at,
        datasets=sorted({d for sh in result.plan.shares for d in sh.datasets}, key=_natural),
        deadline_s=result.deadline_s,
        max_usd=result.max_usd,
        projected_s=result.plan.seconds,
        projected_err=result.plan.seconds_err,
        projected_usd=result.plan.cost_usd,
    )
    write_private(plan_path(config), msgspec.json.encode(applied))


def _load_applied(config: Config) -> Applied | None:
    try:
        return msgspec.json.decode(read_private(plan_path(config)), type=Applied)
    except (OSError, RunwatchError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def progress(config: Config, snapshot: Snapshot, comparison: Comparison) -> PlanProgress | None:
    """The applied plan against the snapshot: done, on track, or going to miss its deadline
    (by today's rates, as ``compare`` measures them); when done, how the projection held."""
    applied = _load_applied(config)
    if applied is None:
        return None
    from supervisor.model import PlanProgress

    now = snapshot.time
    started = applied.started_at if applied.started_at is not None else applied.applied_at
    left = {
        dc.work.dataset: dc for dc in comparison.datasets if dc.work.dataset in applied.datasets
    }
    out = PlanProgress(
        applied_at=applied.applied_at,
        started_at=started,
        datasets=applied.datasets,
        deadline_at=None if applied.deadline_s is None else applied.applied_at + applied.deadline_s,
        max_usd=applied.max_usd,
        projected_end=started + applied.projected_s,
        projected_err=applied.projected_err,
        projected_usd=applied.projected_usd,
    )
    stamp = time.strftime("%H:%M", time.localtime(applied.applied_at))
    projected = _clock(out.projected_end) + (
        f" ± {display.duration(applied.projected_err)}" if applied.projected_err else ""
    )
    if not left:
        if applied.ended_at is None:
            views = [
                d for h in snapshot.hosts for r in h.runs if r.configured for d in r.datasets
                if d.name in applied.datasets
            ]  # fmt: skip
            idle = min((d.idle_s for d in views), default=0.0)
            applied.ended_at = max(started, now - idle)
            with contextlib.suppress(OSError):
                write_private(plan_path(config), msgspec.json.encode(applied))
        out.ended_at = applied.ended_at
        took = applied.ended_at - started
        off = (took / applied.projected_s - 1) * 100 if applied.projected_s > 0 else 0.0
        out.will_miss = out.deadline_at is not None and applied.ended_at > out.deadline_at
        out.text = (
            f"plan of {stamp}: done at {_clock(applied.ended_at)}, projected {projected} "
            f"({off:+.0f} %)" + ("; the deadline was missed" if out.will_miss else "")
        )
        return out
    # By today's rates: each running run's datasets one after another on its endpoint (a
    # stopped run makes nothing, whatever its command line names).
    per_run: dict[str, float] = {}
    written: set[str] = set()
    for h in snapshot.hosts:
        for r in h.runs:
            if not r.configured or not runs_itself(r):
                continue
            ep = next((c.endpoint for c in config.runs if c.name == r.name), None)
            for d in r.datasets:
                dc = left.get(d.name)
                if dc is None or d.name in written:
                    continue
                written.add(d.name)
                e = next((e for e in dc.estimates if e.endpoint == ep), None)
                if e is not None and e.seconds is not None:
                    per_run[r.name] = per_run.get(r.name, 0.0) + e.seconds
    out.unwritten = sorted(set(left) - written, key=_natural)
    if per_run and not out.unwritten:
        out.expected_end = now + max(per_run.values())
    out.will_miss = out.deadline_at is not None and (
        bool(out.unwritten) or (out.expected_end is not None and out.expected_end > out.deadline_at)
    )
    expected = (
        f"never ({', '.join(out.unwritten)}: no running run writes it)"
        if out.unwritten
        else ("unknown yet" if out.expected_end is None else _clock(out.expected_end))
    )
    out.text = (
        f"plan of {stamp}: {len(left)} of {len(applied.datasets)} datasets left; projected "
        f"end {projected}, now {expected}"
        + (
            f"; WILL MISS the deadline {_clock(out.deadline_at)}"
            if out.will_miss and out.deadline_at is not None
            else (" (on track)" if out.deadline_at is not None else "")
        )
    )
    return out


def half_applied(config: Config) -> PlanProgress | None:
    """A plan an apply left half-applied (its intent, and no apply holds the plan lock), as the
    front ends show it: what it did and the command that rolls it back; None when there is none
    (or it cannot be read: ``rebalance --apply --resume`` says why)."""
    from supervisor import planintent
    from supervisor.config import command_prefix
    from supervisor.model import PlanProgress

    try:
        intent = planintent.read(config)
    except (OSError, RunwatchError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    if intent is None or planintent.applying(config):
        return None
    resume = f"{command_prefix(config)} rebalance --apply --resume --yes"
    return PlanProgress(
        applied_at=intent.written,
        started_at=intent.written,
        datasets=sorted({d for s in intent.steps for d in s.datasets}, key=_natural),
        projected_end=intent.written,
        will_miss=True,
        half_applied=True,
        runs=planintent.runs_of(intent),
        text=planintent.describe(intent, resume),
    )


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
