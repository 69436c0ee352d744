"""Data that shrinks or is replaced under a running run: an alarm, never a quiet rescan.

A run's data files only grow. When a refresh finds one's complete records (its bytes up to the
last newline) smaller than the last refresh saw them, or a
new file in its place (another inode, rewritten bytes), while a process of the run is alive (a
relaunch without its resume flag, a second writer, someone's ``> out.jsonl``), that is data loss:
:class:`DataLossWatch` raises an alarm naming the file and the byte counts, keeps it on the dataset
until runwatch exits (a later refresh of the new, growing file must not hide it), and writes it to
the audit log once. A file replaced by one that begins with every line read before (a client's
atomic rewrite, ``agent.follow.KEPT``) lost nothing (W24). runwatch's own changes are not
loss: a move-aside or a torn-tail repair recorded in the audit log (by any runwatch process)
since the file was last seen. Only the config's own runs are judged (W20): a process the
config does not know (another config's run, a colleague's) is listed, but its owner's move-aside
is in another audit log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from supervisor import audit, display
from supervisor.errors import RunwatchError

_LOSS_REASONS = ("file truncated", "file replaced", "file rewritten")
"""Rescan reasons of the scanner that mean the bytes seen before are gone from the file."""


OWN_CHANGES = ("move-aside", "repair")
"""Audit actions of runwatch's own changes to a data file: never data loss."""


@dataclass
class _Seen:
    size: int
    stream: str | None
    at: float
    mark: audit.Mark
    """Where the audit log ended when the file was seen."""


def complete_bytes(scan: Mapping[str, Any]) -> int | None:
    """The bytes of a scanned file up to the end of its last complete record; None when the scan
    stopped early (its texts budget full, ``texts_more``): it read no tail, so the file's size
    would count a record still being written (which a torn-tail repair later removes), and its
    offset may be short of records it has not read yet."""
    if scan.get("texts_more"):
        return None
    return int(scan.get("size") or 0) - int(scan.get("partial_tail_bytes") or 0)


def own_change(host: str, path: str, since: float, after: audit.Mark) -> dict[str, Any] | None:
    """runwatch's own move-aside or repair of ``path`` on ``host`` since ``since`` (Unix time)
    or written in the audit log after ``after`` (``audit.mark``: whatever its time says, as the
    wall clock may have been stepped back, W23), from any runwatch process, or None."""
    for new, rec in reversed(audit.read_marked(after, limit=1000)):
        if not new and float(rec.get("time") or 0) < since:
            break
        if rec.get("action") in OWN_CHANGES and rec.get("path") == path and rec.get("host") == host:
            return dict(rec)
    return None


class DataLossWatch:
    """Remembers each data file's size between refreshes and raises alarms; see the module."""

    def __init__(self, config_key: str = "", clock: Callable[[], float] = time.time) -> None:
        self.config_key = config_key
        self.clock = clock
        """The wall clock (the audit records' times)."""
        """The identity of the config whose runs are watched (``Config.key``), on its records."""
        self._seen: dict[tuple[str, str], _Seen] = {}
        self._alarms: dict[tuple[str, str], str] = {}

    def observe(
        self, host: str, run: str, scan: Mapping[str, Any], writer_alive: bool
    ) -> str | None:
        """The alarm of this data file (raised now or earlier), or None. Asked for the config's
        own runs only (W20): nothing is kept of a process the config does not know."""
        path = str(scan.get("path") or "")
        key = (host, path)
        before = self._seen.get(key)
        state = scan.get("state")
        now = self.clock()
        complete = complete_bytes(scan) if state == "ok" else None
        if state == "ok" and complete is None:
            # Read part way: its size is not known this time (the last one seen is kept).
            size = before.size if before is not None else 0
        elif state == "ok" and complete is not None:
            # Complete records only: a partial last line is not data yet, and its removal (the
            # torn-tail repair of runwatch or of the client itself) loses nothing.
            size = complete
            self._seen[key] = _Seen(size, scan.get("stream"), now, audit.mark())
        elif state == "missing":
            size = 0
            self._seen.pop(key, None)
        else:
            return self._alarms.get(key)
        if before is None or not writer_alive or key in self._alarms:
            return self._alarms.get(key)
        reason = str(scan.get("rescan_reason") or "")
        if size < before.size:
            what = "disappeared" if state == "missing" else "shrank"
        elif reason.startswith(_LOSS_REASONS) and not reason.startswith("file truncated"):
            # (A truncation that kept every complete record cut a partial line only.)
            what = "was replaced" if reason.startswith("file replaced") else "was rewritten"
        else:
            return None
        try:
            own = own_change(host, path, before.at - 1.0, before.mark)
        except (OSError, RunwatchError) as e:  # unknown: an alarm too many, never one too few
            return self.raise_alarm(
                host, run, path, before.size, size,
                f"{what} under the running run (the audit log, which would say whether runwatch "
                f"did it, could not be read: {e})",
            )  # fmt: skip
        if own is not None:
            return None  # runwatch moved it aside or repaired it itself: nothing was lost
        return self.raise_alarm(host, run, path, before.size, size, f"{what} under the running run")

    def raise_alarm(
        self, host: str, run: str, path: str, bytes_before: int, bytes_after: int, what: str
    ) -> str:
        """Raise (once per file) and audit the alarm of ``path``; its message."""
        key = (host, path)
        if key in self._alarms:
            return self._alarms[key]
        message = (
            f"DATA LOSS: {path} {what}: "
            f"{display.count(bytes_before)} bytes before, {display.count(bytes_after)} bytes now"
        )
        try:
            audit.record(
                "data-loss",
                config=self.config_key,
                host=host,
                run=run,
                ok=False,
                path=path,
                bytes_before=bytes_before,
                bytes_after=bytes_after,
                detail=message,
            )
        except (OSError, RunwatchError) as e:
            # A state dir that refuses the record never swallows the alarm (W22).
            message += f" (not in the audit log: {e})"
        self._alarms[key] = message
        return message

    def alarms(self) -> dict[tuple[str, str], str]:
        """Every alarm raised so far: (host, path) -> message."""
        return dict(self._alarms)
