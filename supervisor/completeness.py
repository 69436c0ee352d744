"""A dataset's completeness and its sidecar files, from a scan result into the model.

The host's scan compares the ids of the input file with the ids of the records (``completeness``:
done, failed, missing, not in the input, duplicates) and counts the files beside the output that
hold failed or skipped prompts, by reason (``sidecars``). This module turns those parts of a scan
result into :class:`model.CompletenessView` and :class:`model.SidecarView`, and says them in one
line for humans.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from supervisor import display
from supervisor.model import CompletenessView, DatasetView, SidecarView


def sidecar_views(scan: Mapping[str, Any]) -> list[SidecarView]:
    """The sidecars of a scan result (``error`` first, then ``skipped``, then the rest)."""
    raw = scan.get("sidecars") or {}
    order = sorted(raw, key=lambda k: (k not in ("error", "skipped"), k != "error", k))
    return [
        msgspec.convert({**raw[kind], "kind": kind}, SidecarView, strict=False) for kind in order
    ]


def completeness_view(scan: Mapping[str, Any]) -> CompletenessView | None:
    """The completeness of a scan result, or None when the scan did not compare ids."""
    raw = scan.get("completeness")
    if not isinstance(raw, dict):
        return None
    fields = set(CompletenessView.__struct_fields__)
    return msgspec.convert({k: v for k, v in raw.items() if k in fields}, CompletenessView)


def with_client_parts(view: DatasetView, scan: Mapping[str, Any]) -> DatasetView:
    """``view`` with the sidecars, the completeness and the prompts' length of its scan."""
    view.sidecars = sidecar_views(scan)
    view.completeness = completeness_view(scan)
    lengths = scan.get("prompt_lengths")
    if isinstance(lengths, Mapping) and isinstance(lengths.get("mean_chars"), (int, float)):
        view.prompt_chars = float(lengths["mean_chars"])
    return view


LIMITS = ("max_samples", "token_budget")
"""The stop conditions short of the input's end (``Projection.etas``)."""


def discount_in_flight(view: DatasetView, concurrency: int | None) -> None:
    """A running client with ``concurrency`` requests in flight: the missing rows fewer than
    that before the last row answered may still be answered (a later row overtook them); they
    are ``in_flight``, not missing."""
    c = view.completeness
    if c is None or not concurrency or concurrency < 2 or not c.missing_near:
        return
    flying = [shown for distance, shown in c.missing_near if 0 < int(distance) < concurrency]
    if not flying:
        return
    c.in_flight = len(flying)
    c.missing = max(0, c.missing - len(flying))
    gone = set(map(str, flying))
    c.missing_first = [i for i in c.missing_first if str(i) not in gone]


def settle_missing(view: DatasetView, finished: bool) -> None:
    """A run that ``finished`` by itself (exit 0) without reaching a limit of the dataset claims
    its whole input: the rows it never reached are missing too. A run still going, or stopped at
    its ``--max-samples`` or budget, leaves them not reached (never missing)."""
    c = view.completeness
    if c is None or not finished or not c.not_reached:
        return
    done = view.unique_ids or view.records
    at_limit = any(view.projection.etas.get(stop) == 0 for stop in LIMITS) or bool(
        view.max_samples and done >= view.max_samples
    )
    if at_limit:
        return
    c.missing += c.not_reached
    c.missing_first = (c.missing_first + c.not_reached_first)[:10]
    c.not_reached, c.not_reached_first = 0, []


def completeness_line(c: CompletenessView) -> str:
    """``980 / 1,000 done, 12 failed, 8 missing (B1-000017, ...), 3 not in the input``; the rows
    after the last one answered are ``not attempted yet``, not missing."""
    if c.error is not None:
        return f"completeness unknown: {c.error}"
    parts = [f"{display.count(c.done)} / {display.count(c.input)} done"]
    if c.failed:
        parts.append(f"{display.count(c.failed)} failed")
    if c.missing:
        shown = ", ".join(str(i) for i in c.missing_first[:3])
        more = ", ..." if c.missing > len(c.missing_first[:3]) else ""
        parts.append(f"{display.count(c.missing)} missing ({shown}{more})")
    if c.in_flight:
        parts.append(f"{display.count(c.in_flight)} in flight")
    if c.not_reached:
        parts.append(f"{display.count(c.not_reached)} not attempted yet")
    if c.not_in_input:
        parts.append(f"{display.count(c.not_in_input)} not in the input")
    if c.duplicates:
        parts.append(f"{display.count(c.duplicates)} duplicates")
    return ", ".join(parts)


def sidecar_line(s: SidecarView) -> str:
    """``error file: 12 lines (8 Connection refused, 4 timeout)``."""
    if s.state != "ok":
        return f"{s.kind} file: {s.state}"
    if not s.lines:
        return f"{s.kind} file: empty"
    reasons = ", ".join(f"{display.count(n)} {why}" for why, n in list(s.reasons.items())[:3])
    more = f", {display.count(s.other_reasons)} other" if s.other_reasons else ""
    return f"{s.kind} file: {display.count(s.lines)} lines ({reasons}{more})"


def scan_notes(scan: Mapping[str, Any]) -> list[str]:
    """What ``status`` says of a scan's client parts, for ``check``: failed requests logged in the
    output, the completeness against the input, and the error / skipped files that hold lines."""
    notes = []
    failed = int(scan.get("failed_lines") or 0)
    if failed:
        notes.append(f"{display.count(failed)} failed requests logged in the file (id only)")
    c = completeness_view(scan)
    if c is not None:
        notes.append(completeness_line(c))
    notes.extend(sidecar_line(s) for s in sidecar_views(scan) if s.lines)
    return notes
