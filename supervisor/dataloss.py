"""Data that shrinks or is replaced under a running run: an alarm, never a quiet rescan.

A run's data files only grow. When a refresh finds one's complete records (its bytes up to the
last newline) smaller than the last refresh saw them, or a
new file in its place (another inode, rewritten bytes), while a process of the run is alive (a
relaunch without its resume flag, a second writer, someone's ``> out.jsonl``), that is data loss:
:class:`DataLossWatch` raises an alarm naming the file and the byte counts, keeps it on the dataset
until runwatch exits (a later refresh of the new, growing file must not hide it), and writes it to
the audit log once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from supervisor import audit, display

_LOSS_REASONS = ("file truncated", "file replaced", "file rewritten")
"""Rescan reasons of the scanner that mean the bytes seen before are gone from the file."""


@dataclass
class _Seen:
    size: int
    stream: str | None


class DataLossWatch:
    """Remembers each data file's size between refreshes and raises alarms; see the module."""

    def __init__(self, config_key: str = "") -> None:
        self.config_key = config_key
        """The identity of the config whose runs are watched (``Config.key``), on its records."""
        self._seen: dict[tuple[str, str], _Seen] = {}
        self._alarms: dict[tuple[str, str], str] = {}

    def observe(
        self, host: str, run: str, scan: Mapping[str, Any], writer_alive: bool
    ) -> str | None:
        """The alarm of this data file (raised now or earlier), or None."""
        path = str(scan.get("path") or "")
        key = (host, path)
        before = self._seen.get(key)
        state = scan.get("state")
        if state == "ok":
            # Complete records only: a partial last line is not data yet, and its removal (the
            # torn-tail repair of runwatch or of the client itself) loses nothing.
            size = int(scan.get("size") or 0) - int(scan.get("partial_tail_bytes") or 0)
            self._seen[key] = _Seen(size, scan.get("stream"))
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
        self._alarms[key] = message
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
        return message

    def alarms(self) -> dict[tuple[str, str], str]:
        """Every alarm raised so far: (host, path) -> message."""
        return dict(self._alarms)
