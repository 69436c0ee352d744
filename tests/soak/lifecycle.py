"""The soak's run lifecycle faults and their invariants: runs that die, finish, are stopped from
another terminal, and a watcher SIGKILLed during a restart's backoff.

The soak records what it caused (plain dicts, so that the checks run on synthetic evidence too):

- a death: ``{"run", "pid", "time", "signal", "restart": bool, "backoff": s, "watcher_killed"}``
  (the soak signalled the run's client, datasets not done);
- a quiet end: ``{"run", "pid", "how": "finished" | "stopped", "from": t, "until": t}`` (the
  client ended at its own ``--token-budget``, or ``runwatch kill`` stopped it; from the end to the
  soak's own next launch of the run, nothing may restart it);
- a watcher kill: ``{"run", "pid", "intent": {...}, "killed": t, "restarted": t, "new_pid": n}``;
- a change of its own to a data file: ``{"path", "t_start", "t_end", "kind"}`` (a rotation, an
  archive).

Invariants (``add(kind, summary, evidence)`` for each violation), from the watchers' JSON output,
what the working receiver got and the audit log:

- ``death-unalerted``: a death with no run-died alert (naming the run and the pid) at the working
  receiver within 2 refreshes of the death (before the second refresh line after it, plus
  ``DELIVERY_S``);
- ``false-run-died``: a run-died event for a process that finished by itself or was stopped through
  runwatch;
- ``false-data-loss``: a data-shrank event, a "DATA LOSS" event or a ``data-loss`` audit record for
  a file the soak did not change around then (runwatch's own move-aside or repair is never loss);
- ``restart-policy``: a death on a run with ``on_exit = "restart"`` not restarted by the watcher
  within its backoff and ``RESTART_BOUND_S``, or restarted before its backoff; an automatic restart
  of a run that finished or was stopped through runwatch;
- ``intent-dropped``: after the watcher was SIGKILLed during a restart's backoff, the new watcher
  neither restarted the run (an ``auto-restart`` audit record of its own pid) within
  ``INTENT_BOUND_S`` of the later of its start and the intent's not-before, nor said it abandoned
  the intent (a ``restart-abandoned`` event).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from supervisor.quiet import MAX_WINDOW_S

Add = Callable[..., None]

RESTART_BOUND_S = MAX_WINDOW_S + 30.0
"""How long after its backoff ends a death's automatic restart must be made: its detection, the
launch's checks (the quiet window after a death is 3 x the seconds since the data file last
changed, up to ``supervisor.quiet.MAX_WINDOW_S``), its settle time and the audit record."""
EARLY_TOLERANCE_S = 0.5
"""A restart recorded this much before the death's backoff ended is still on time (clocks)."""
INTENT_BOUND_S = RESTART_BOUND_S
"""How long after the later of its start and the intent's not-before the new watcher has."""
DELIVERY_S = 1.0
"""How long after the refresh that sent it a run-died alert may reach the working receiver."""
CHANGE_WINDOW_S = 60.0
"""How long after the soak changed a file a data-loss alarm about it is the soak's own doing."""
_PID = re.compile(r"\(pid (\d+)\)")


def died_pid(event: dict[str, Any]) -> int | None:
    """The pid of a run-died event (its key ends with it; its message says ``(pid N)``)."""
    tail = str(event.get("key") or "").rsplit("|", 1)[-1]
    if tail.isdigit():
        return int(tail)
    m = _PID.search(str(event.get("message") or ""))
    return int(m.group(1)) if m else None


def check_deaths_alerted(
    deaths: Iterable[dict[str, Any]],
    received: list[tuple[float, str]],
    ticks: list[float],
    refresh_s: float,
    add: Add,
) -> list[float]:
    """``death-unalerted``: the run-died alert must reach the receiver within 2 refreshes of the
    death: before the second refresh line the watchers print after it, plus ``DELIVERY_S`` (the
    alert goes out off the loop during that refresh); without two more refreshes (the soak
    ended), within 2 x ``refresh_s`` (+ ``DELIVERY_S``). That the refreshes come every
    ``refresh_s`` is ``watch-silent``'s. Returns the latency of each death's first alert (s)."""
    latencies = []
    ticks = sorted(ticks)
    for d in deaths:
        marks = (f"(pid {d['pid']})", "not stopped through runwatch", d["run"])
        times = [t for t, m in received if all(x in m for x in marks)]
        first = min(times, default=None)
        if first is not None:
            latencies.append(first - d["time"])
        after = [t for t in ticks if t > d["time"]]
        bound = (after[1] if len(after) >= 2 else d["time"] + 2 * refresh_s) + DELIVERY_S
        if first is None or first > bound:
            got = "never" if first is None else f"after {first - d['time']:.1f} s"
            add(
                "death-unalerted",
                f"{d['run']} pid {d['pid']} killed by the soak ({d['signal']}): run-died alert "
                f"{got}, not within 2 refreshes ({bound - d['time']:.1f} s)",
                {"death": d, "first_alert": first, "bound": bound, "refreshes_after": after[:3]},
            )
    return latencies


def check_run_died(
    events: Iterable[dict[str, Any]],
    deaths: Iterable[dict[str, Any]],
    quiet_ends: Iterable[dict[str, Any]],
    add: Add,
) -> list[dict[str, Any]]:
    """``false-run-died``; returns the run-died events the soak did not cause and cannot judge
    (a process it did not signal, finish or stop: shown in the report)."""
    caused = {(d["run"], d["pid"]) for d in deaths}
    quiet = {(q["run"], q["pid"]): q for q in quiet_ends}
    other = []
    seen: set[str] = set()
    for ev in events:
        if ev.get("kind") != "run-died" or ev.get("key") in seen:
            continue
        seen.add(str(ev.get("key")))
        who = (ev.get("run"), died_pid(ev))
        if who in caused:
            continue
        q = quiet.get(who)
        if q is not None:
            add(
                "false-run-died",
                f"run-died for {who[0]} pid {who[1]}, which {q['how']}"
                + (" by itself" if q["how"] == "finished" else " through runwatch"),
                {"event": ev, "end": q},
            )
            continue
        other.append(ev)
    return other


def check_data_loss(
    events: Iterable[dict[str, Any]],
    audit_records: Iterable[dict[str, Any]],
    changes: list[dict[str, Any]],
    add: Add,
) -> int:
    """``false-data-loss``; returns how many alarms the soak's own changes explained."""
    explained = 0

    def cause(path_in: Callable[[str], bool], t: float) -> dict[str, Any] | None:
        for c in changes:
            if path_in(c["path"]) and c["t_start"] - 1.0 <= t <= c["t_end"] + CHANGE_WINDOW_S:
                return c
        return None

    seen: set[str] = set()
    for ev in events:
        message = str(ev.get("message") or "")
        if ev.get("kind") != "data-shrank" and "DATA LOSS" not in message:
            continue
        if ev.get("key") in seen:
            continue
        seen.add(str(ev.get("key")))
        if cause(lambda p, m=message: p in m, float(ev.get("time") or 0)) is not None:  # type: ignore[misc]
            explained += 1
            continue
        add(
            "false-data-loss",
            f"{ev.get('kind')} event on {ev.get('title')} with no change of the soak's: {message}",
            {"event": ev},
        )
    for rec in audit_records:
        if rec.get("action") != "data-loss":
            continue
        path = str(rec.get("path") or "")
        if cause(lambda p, x=path: p == x, float(rec.get("time") or 0)) is not None:  # type: ignore[misc]
            explained += 1
            continue
        add(
            "false-data-loss",
            f"data-loss audit record for {path} with no change of the soak's: {rec.get('detail')}",
            {"audit": rec},
        )
    return explained


def auto_restarts(audit_records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``auto-restart`` audit records that made or tried a restart (not the give-ups)."""
    return [
        r
        for r in audit_records
        if r.get("action") == "auto-restart" and not str(r.get("detail", "")).startswith("gave up")
    ]


def check_restart_policy(
    deaths: Iterable[dict[str, Any]],
    quiet_ends: Iterable[dict[str, Any]],
    restarts: list[dict[str, Any]],
    add: Add,
) -> list[float]:
    """``restart-policy``; returns each death's delay to its restart (s)."""
    delays = []
    for d in deaths:
        if not d["restart"] or d.get("watcher_killed"):
            continue  # a watcher killed in the backoff: intent-dropped judges
        mine = [r for r in restarts if r.get("run") == d["run"] and r["time"] >= d["time"]]
        mine = [r for r in mine if d.get("next") is None or r["time"] < d["next"]]
        early = [r for r in mine if r["time"] < d["time"] + d["backoff"] - EARLY_TOLERANCE_S]
        bound = d["time"] + d["backoff"] + RESTART_BOUND_S
        ok = [r for r in mine if r.get("ok") and r["time"] <= bound and r not in early]
        if ok and not early:
            delays.append(ok[0]["time"] - d["time"])
        if early:
            add(
                "restart-policy",
                f"{d['run']} pid {d['pid']} restarted {early[0]['time'] - d['time']:.1f} s after "
                f"its death, before its backoff of {d['backoff']:g} s",
                {"death": d, "restarts": mine},
            )
        elif not ok:
            add(
                "restart-policy",
                f"{d['run']} pid {d['pid']} (on_exit = restart) died and was not restarted "
                f"within {d['backoff']:g} + {RESTART_BOUND_S:g} s",
                {"death": d, "restarts": mine},
            )
    for q in quiet_ends:
        wrong = [
            r
            for r in restarts
            if r.get("run") == q["run"] and q["from"] <= r["time"] <= (q["until"] or float("inf"))
        ]
        if wrong:
            add(
                "restart-policy",
                f"{q['run']} pid {q['pid']} {q['how']} (not a death) and was restarted "
                "automatically",
                {"end": q, "restarts": wrong},
            )
    return delays


def check_intents(
    kills: Iterable[dict[str, Any]],
    restarts: list[dict[str, Any]],
    events: Iterable[dict[str, Any]],
    add: Add,
) -> int:
    """``intent-dropped``; returns how many intents the new watcher took over and carried out."""
    events = list(events)
    done = 0
    for k in kills:
        start = max(k["restarted"], float(k["intent"].get("not_before") or 0))
        bound = start + INTENT_BOUND_S
        by = f"pid {k['new_pid']},"
        made = [
            r
            for r in restarts
            if r.get("run") == k["run"]
            and r.get("ok")
            and by in str(r.get("by"))
            and k["restarted"] <= r["time"] <= bound
        ]
        abandoned = [
            e
            for e in events
            if e.get("kind") == "restart-abandoned"
            and e.get("run") == k["run"]
            and k["restarted"] <= float(e.get("time") or 0) <= bound
        ]
        if made:
            done += 1
            continue
        if abandoned:
            continue
        add(
            "intent-dropped",
            f"watcher SIGKILLed in {k['run']}'s backoff: the next watcher (pid {k['new_pid']}) "
            f"neither restarted it within {INTENT_BOUND_S:g} s nor said it abandoned the intent",
            {"kill": k, "restarts": [r for r in restarts if r.get("run") == k["run"]]},
        )
    return done
