"""The first pass of a first scan: lines counted at C speed, and progress while the scan runs.

Standard library only, Python >= 3.8: this module runs inside the host agent on GPU hosts.

A full scan parses records; on a host holding gigabytes of small records it takes seconds. Before
it starts, :func:`start` counts the newlines of every file not scanned yet in the background, while
the agent lists the processes, and the agent sends those counts at once as a *progress* line of
the request: ``{"id": <request id>, "progress": {...}}``, never ``ok`` nor ``result``, so the
laptop keeps waiting for the reply. The counts are provisional: a line is not yet known to be a
record (bad lines, an end marker, duplicates are told apart only by the scan).

The host's ``wc -l`` counts whole files (vectorised, about twice as fast per core as Python can),
one process per file, as many at a time as the host has cores, each reading the file on its stdin
(no path on a command line). Where there is no ``wc``, or where slices of the files would keep more
cores busy than whole files (a few big files on a many-core host), forked Python processes count
slices (``memchr`` over large reads). A file ``wc`` fails on is counted in Python, and so is a file
under :data:`PROCESS_MIN_BYTES`, on the counting thread (no process is started for it).

:class:`Reporter` then writes how far the scan is (files and bytes), at most every
:data:`PROGRESS_INTERVAL_S`, until the reply.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from supervisor.agent import safefs

if TYPE_CHECKING:  # annotations only: subscripting collections.abc fails on Python 3.8
    from collections.abc import Callable

READ_BYTES = 1 << 20
"""Bytes per read when counting lines."""
SLICE_BYTES = 64 << 20
"""Bytes of a file one counting process takes at a time."""
SHORT_LINES = 256
"""Below this many bytes per line on average, ``bytes.count`` beats one ``find`` per line."""
PROCESS_MIN_BYTES = 16 << 20
"""Files smaller than this are counted on the counting thread itself: starting a process for
them (``wc`` or a fork) costs more than counting them, and a dashboard's first connect to a fleet
of short files must not wait on dozens of process starts."""
PROGRESS_INTERVAL_S = 0.5
"""Shortest time between two progress lines of one request."""


def _count(fd: int, start: int, end: int) -> int:
    """Newlines in bytes ``[start, end)`` of ``fd`` (fewer if the file is shorter).

    One ``find`` per newline (``memchr``: the bytes are scanned at memory speed, the per-line
    cost is one call) while lines are long; ``bytes.count`` (a byte loop) for the rest of a read
    whose first lines are short.
    """
    lines = 0
    pos = start
    while pos < end:
        buf = os.pread(fd, min(READ_BYTES, end - pos), pos)
        n = len(buf)
        if not n:
            break
        pos += n
        find = buf.find
        i = find(b"\n", 0, n)
        k = 0
        while i >= 0:
            k += 1
            if k == 64 and i < 64 * SHORT_LINES:
                k += buf.count(b"\n", i + 1, n)
                break
            i = find(b"\n", i + 1, n)
        lines += k
    return lines


def cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def count_all(paths: list[str], workers: int) -> dict[str, tuple[int, int]]:
    """``(newlines, size)`` of every readable regular file of ``paths``, counted by up to
    ``workers`` processes at a time (see :func:`start`)."""
    return start(paths, workers).wait()


def start(paths: list[str], workers: int) -> Counting:
    """Start counting the newlines of ``paths`` on a thread of its own; :meth:`Counting.wait`
    gives what :func:`count_all` returns."""
    return Counting(paths, workers)


_EARLY: list[tuple[frozenset[str], Counting]] = []


def start_early(line: bytes) -> None:
    """Start counting the files of the bundle's last line, ``{"count": [path, ...]}``, before the
    agent imports the rest of itself; :func:`take_early` hands the counting to the first refresh.

    A line that is not such an object starts nothing.
    """
    try:
        msg = json.loads(line.decode("utf-8"))
    except ValueError:
        return
    paths = msg.get("count") if isinstance(msg, dict) else None
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
        return
    expanded = [os.path.expanduser(p) for p in paths]
    _EARLY[:] = [(frozenset(expanded), start(expanded, cores()))]


def take_early(paths: list[str]) -> Counting | None:
    """The counting :func:`start_early` started, when it counts every one of ``paths`` (once)."""
    if not _EARLY:
        return None
    counted, counting = _EARLY.pop()
    return counting if counted.issuperset(paths) else None


_WC: list[str | None] = []


def wc_program() -> str | None:
    """The path of the host's ``wc``, or None (looked up once)."""
    if not _WC:
        _WC.append(shutil.which("wc"))
    return _WC[0]


class Counting:
    """Line counts being made in the background; files are opened and sized at once.

    Args:
        paths: the files to count (not regular files and unreadable ones are left out).
        workers: processes counting at the same time.
    """

    def __init__(self, paths: list[str], workers: int) -> None:
        self.sizes: dict[str, int] = {}
        self._fds: dict[str, int] = {}
        self._workers = max(1, workers)
        self._lines: dict[str, int] = {}
        self._error: BaseException | None = None
        for path in paths:
            if path in self._fds:
                continue
            try:  # another user's link: never counted (the scan says why)
                fd = safefs.open_file(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            except (OSError, safefs.UnsafePath):
                continue
            self._fds[path] = fd
            try:
                st = os.fstat(fd)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                self.sizes[path] = st.st_size
        self._thread = threading.Thread(target=self._run, name="firstpass", daemon=True)
        self._thread.start()

    def wait(self) -> dict[str, tuple[int, int]]:
        """``(newlines, size)`` per regular file, once every file is counted."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return {path: (self._lines[path], size) for path, size in self.sizes.items()}

    def _run(self) -> None:
        try:
            small = {p: s for p, s in self.sizes.items() if s < PROCESS_MIN_BYTES}
            big = {p: s for p, s in self.sizes.items() if p not in small}
            lines = {p: _count(self._fds[p], 0, s) for p, s in small.items()}
            slices = [
                (path, a, min(a + SLICE_BYTES, size))
                for path, size in big.items()
                for a in range(0, size, SLICE_BYTES)
            ]
            wc = wc_program() if big else None
            if wc is not None and len(big) >= min(self._workers, len(slices)):
                lines.update(self._by_wc(wc, big))
            elif big:
                lines.update(self._by_slices(big, slices))
            self._lines = lines
        except BaseException as e:  # given to the caller of wait()
            self._error = e
        finally:
            for fd in self._fds.values():
                os.close(fd)

    def _by_wc(self, wc: str, sizes: dict[str, int]) -> dict[str, int]:
        """Newlines per file of ``sizes`` by ``wc -l`` on each file's descriptor, ``workers``
        at a time."""
        lines = dict.fromkeys(sizes, 0)
        todo = sorted(sizes, key=sizes.__getitem__, reverse=True)
        running: list[tuple[str, subprocess.Popen[bytes]]] = []
        failed = []
        while todo or running:
            while todo and len(running) < self._workers:
                path = todo.pop(0)
                try:
                    proc = subprocess.Popen(
                        [wc, "-l"],
                        stdin=self._fds[path],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                        env={"LC_ALL": "C"},
                    )
                except OSError:
                    failed.append(path)
                    continue
                running.append((path, proc))
            if not running:
                break
            path, proc = running.pop(0)
            out, _ = proc.communicate()
            words = out.split()
            if proc.returncode == 0 and len(words) == 1 and words[0].isdigit():
                lines[path] = int(words[0])
            else:
                failed.append(path)
        for path in failed:
            lines[path] = _count(self._fds[path], 0, sizes[path])
        return lines

    def _by_slices(
        self, sizes: dict[str, int], slices: list[tuple[str, int, int]]
    ) -> dict[str, int]:
        """Newlines per file of ``sizes`` by forked Python processes over ``slices`` (one: no
        fork).

        A child only reads, counts and writes its counts to a pipe, then leaves with ``os._exit``:
        nothing of the agent's threads or locks is touched after the fork.
        """
        lines = dict.fromkeys(sizes, 0)
        fds = self._fds
        if self._workers < 2 or len(slices) < 2 or not hasattr(os, "fork"):
            for path, a, b in slices:
                lines[path] += _count(fds[path], a, b)
            return lines
        try:
            counted = _forked(fds, slices, min(self._workers, len(slices)))
        except OSError:  # no fork here (limits), or a child failed: count in this process
            counted = [(i, _count(fds[p], a, b)) for i, (p, a, b) in enumerate(slices)]
        for i, n in counted:
            lines[slices[i][0]] += n
        return lines


def _forked(
    fds: dict[str, int], slices: list[tuple[str, int, int]], workers: int
) -> list[tuple[int, int]]:
    """``(slice index, newlines)`` of every slice, counted by ``workers`` child processes."""
    import warnings

    children: list[tuple[int, int]] = []
    for w in range(workers):
        try:
            r, wr = os.pipe()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
                    pid = os.fork()
            except OSError:
                os.close(r)
                os.close(wr)
                raise
        except OSError:  # no more processes: reap those started, the caller counts alone
            for pid, r in children:
                os.close(r)
                os.waitpid(pid, 0)
            raise
        if pid == 0:  # the child: count, write, leave
            code = 0
            try:
                os.close(r)
                out = []
                for i in range(w, len(slices), workers):
                    path, start, end = slices[i]
                    out.append(f"{i} {_count(fds[path], start, end)}\n")
                data = "".join(out).encode()
                while data:
                    data = data[os.write(wr, data) :]
            except BaseException:
                code = 1
            os._exit(code)
        os.close(wr)
        children.append((pid, r))
    results: list[tuple[int, int]] = []
    failed = False
    for pid, r in children:
        chunks = []
        try:
            while True:
                piece = os.read(r, 65536)
                if not piece:
                    break
                chunks.append(piece)
        except OSError:
            failed = True
        os.close(r)
        _, status = os.waitpid(pid, 0)
        if status != 0 or failed:
            failed = True
            continue
        text = b"".join(chunks).decode().split()
        results.extend((int(text[k]), int(text[k + 1])) for k in range(0, len(text), 2))
    if failed:
        raise OSError("a counting process failed")
    return results


class Reporter:
    """Progress lines of one request: first the provisional counts, then files and bytes done.

    Args:
        write: writes one message line (the agent's locked writer).
        rid: the request's id.
        totals: bytes to scan per file, in the order they are scanned.
    """

    def __init__(
        self, write: Callable[[dict[str, Any]], None], rid: int, totals: list[int]
    ) -> None:
        self._write = write
        self.rid = rid
        self.totals = totals
        self.files_total = len(totals)
        self.bytes_total = sum(totals)
        self.files_done = 0
        self.bytes_before = 0  # bytes of the files already done
        self.partial = 0  # bytes done of the file being scanned
        self._last = 0.0

    def counts(self, files: dict[str, dict[str, int]], processes: list[Any]) -> None:
        """Send the provisional line counts (``{path: {"lines", "size"}}``) and the processes."""
        self._send({"files": files, "processes": processes})
        self._last = time.monotonic()

    def file_done(self) -> None:
        """The next file is scanned."""
        if self.files_done < self.files_total:
            self.bytes_before += self.totals[self.files_done]
        self.files_done += 1
        self.partial = 0
        self.tick(0, 0)

    def tick(self, done: int, total: int) -> None:
        """The scanner's progress callback: ``done`` of ``total`` bytes of the current file."""
        self.partial = done
        now = time.monotonic()
        if now - self._last < PROGRESS_INTERVAL_S:
            return
        self._last = now
        self._send({})

    def _send(self, extra: dict[str, Any]) -> None:
        body = {
            "files_done": self.files_done,
            "files_total": self.files_total,
            "bytes_done": self.bytes_before + self.partial,
            "bytes_total": self.bytes_total,
        }
        body.update(extra)
        self._write({"id": self.rid, "progress": body})
