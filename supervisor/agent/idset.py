"""The ids of one file's records, exact and small per id: what counting duplicates needs.

Standard library only, Python >= 3.8 (runs inside the host agent).

A Python set of ids costs about 70 bytes an id (733 MB for a file of 10 M records). An
:class:`IdSet` keeps the most recent ids exactly, in a set of at most ``recent_max`` ids (a file
with fewer distinct ids is counted exactly as a set counts it), and moves them in batches into
buckets of 46-bit hashes: ``2**14`` buckets by the hash's top 14 bits, each a sorted
``array('I')`` of the next 32 bits, about 4 bytes an id plus the buckets themselves (a scan of
10 M distinct ids peaks at 95 MB, ``tests/perf/bench_scan_ids.py``; a set of them: 725 MB).

A hash is never taken for an id. An id whose hash is already in a bucket is *pending*: the
scanner decides it against the file (:meth:`IdSet.resolve`, given the first id of the file with
each pending hash, read back by :func:`first_ids`: the id that put the hash there), at the end
of its call or as soon as ``recent_max`` hashes wait. From then on the ids of that hash are kept
exactly (``owners``), so a hash is read back from the file at most once. Two ids of one hash met
while both are recent are distinct by comparison and go to ``owners`` directly. A file whose
records repeat ids long hashed therefore costs a read of the file per batch of such hashes, and
keeps those ids exactly.

The hash is keyed (:func:`hash` of the id with a random salt, per process): ids chosen to
collide cannot be prepared in advance; a collision only costs a read of the file.
"""

from __future__ import annotations

import json
import os
import re
from array import array
from bisect import bisect_left
from functools import partial
from itertools import chain, repeat
from operator import and_
from typing import Any, Callable, Iterable, Iterator

from supervisor.agent.formats import lookup

RECENT_MAX = 1 << 18
"""Ids kept exactly before they move to the hash buckets."""
HASH_BITS = 46
_LOW_BITS = 32
_LOW_MASK = (1 << _LOW_BITS) - 1
_HASH_MASK = (1 << HASH_BITS) - 1


def remembered_id(value: Any) -> Any:
    """What an id is remembered as (the scanner's rule): an int, the UTF-8 bytes of a string,
    else its JSON text."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return json.dumps(value, sort_keys=True)


def _salted_hash() -> tuple[Callable[[Any], int], Callable[[Iterable[Any]], Iterable[int]]]:
    """The hash of one id, and of many at once (no Python call per id)."""
    salt = int.from_bytes(os.urandom(8), "little")

    def hash48(key: Any) -> int:
        return hash((salt, key)) & _HASH_MASK

    def hash_many(keys: Iterable[Any]) -> Iterable[int]:
        return map(and_, map(hash, zip(repeat(salt), keys)), repeat(_HASH_MASK))

    return hash48, hash_many


class IdSet:
    """The distinct ids of a file's records and the number of duplicates among them (see the
    module's docstring).

    Args:
        recent_max: ids kept exactly before they are hashed into the buckets; also the most
            pending hashes held before they are decided (by :attr:`resolver`, when set).
        hasher: the 46-bit hash of an id (tests force collisions with it).
    """

    def __init__(
        self, recent_max: int = RECENT_MAX, hasher: Callable[[Any], int] | None = None
    ) -> None:
        self.recent_max = recent_max
        if hasher is None:
            self.hash48, self.hash_many = _salted_hash()
        else:
            self.hash48, self.hash_many = hasher, partial(map, hasher)
        self.duplicates = 0
        """Records whose id was seen before (pending ones not yet)."""
        self.resolver: Callable[[frozenset[int]], dict[int, Any]] | None = None
        """The first id of the file with each of some hashes (:func:`first_ids`): set while a
        scan reads the file, so that pending ids are decided before they pile up."""
        self._recent: set[Any] = set()
        self._buckets: dict[int, array[int]] = {}
        self._owners: dict[int, set[Any]] = {}
        """The ids of a hash met more than once, exactly."""
        self._pending: dict[int, tuple[set[Any], list[int]]] = {}
        """Per hash in a bucket, the distinct ids met since and their number of records."""
        self._unique = 0

    def __len__(self) -> int:
        """Distinct ids, pending ones not included."""
        return self._unique

    @property
    def pending(self) -> frozenset[int]:
        """The hashes whose first id must be read back from the file (:meth:`resolve`)."""
        return frozenset(self._pending)

    def add(self, key: Any) -> None:
        """Count a record of id ``key``."""
        recent = self._recent
        if key in recent:
            self.duplicates += 1
            return
        if not self._buckets:
            recent.add(key)
            self._grew(1)
            return
        v = self.hash48(key)
        owners = self._owners.get(v)
        if owners is not None:
            if key in owners:
                self.duplicates += 1
            else:
                owners.add(key)
                self._unique += 1
            return
        if self._in_buckets(v):
            entry = self._pending.get(v)
            if entry is None:
                self._pending[v] = entry = (set(), [0])
            entry[0].add(key)
            entry[1][0] += 1
            if len(self._pending) >= self.recent_max and self.resolver is not None:
                self.resolve(self.resolver(self.pending))
            return
        recent.add(key)
        self._grew(1)

    def add_many(self, keys: Iterable[Any]) -> None:
        """Count records of these ids."""
        if self._buckets:
            for k in keys:
                self.add(k)
            return
        recent = self._recent
        items = keys if isinstance(keys, list) else list(keys)
        before = len(recent)
        recent.update(items)
        new = len(recent) - before
        self.duplicates += len(items) - new
        self._grew(new)

    def resolve(self, first_ids: dict[int, Any]) -> None:
        """Decide the pending ids, given the first id of the file with each pending hash (the
        one its bucket holds)."""
        for v, (keys, (records,)) in self._pending.items():
            # An owner not found again (the file changed under the read, which the next scan
            # sees and rescans) leaves the ids of that hash new.
            owners = self._owners.setdefault(v, {first_ids[v]} if v in first_ids else set())
            before = len(owners)
            owners |= keys
            new = len(owners) - before
            self._unique += new
            self.duplicates += records - new
        self._pending = {}

    def __contains__(self, key: Any) -> bool:
        """Whether ``key`` is an id of the set: exact for the recent ids and for hashes met
        twice, by its 46-bit hash for the others (an input row counted as answered)."""
        if key in self._recent:
            return True
        if not self._buckets:
            return False
        v = self.hash48(key)
        owners = self._owners.get(v)
        return key in owners if owners is not None else self._in_buckets(v)

    def exact(self) -> Iterator[Any]:
        """The ids of the set that are kept as ids (recent ones, and those of shared hashes)."""
        yield from self._recent
        for owners in self._owners.values():
            yield from owners

    def _in_buckets(self, v: int) -> bool:
        b = self._buckets.get(v >> _LOW_BITS)
        if b is None:
            return False
        low = v & _LOW_MASK
        i = bisect_left(b, low)
        return i < len(b) and b[i] == low

    def _grew(self, n: int) -> None:
        self._unique += n
        if len(self._recent) >= self.recent_max:
            self._flush()

    def _flush(self) -> None:
        """Move the recent ids into the buckets; two of one hash become that hash's owners.

        One id at a time (no list of the batch's hashes beside the batch: that would be the
        peak of the set's memory); a hash met twice in the batch (two distinct ids: a set's) is
        looked for among the batch's ids again, which is rare."""
        batch, self._recent = self._recent, set()
        buckets = self._buckets
        shared: set[int] = set()
        hash48 = self.hash48
        for v in self.hash_many(batch):
            top = v >> _LOW_BITS
            b = buckets.get(top)
            if b is None:
                buckets[top] = b = array("I")
            low = v & _LOW_MASK
            i = bisect_left(b, low)
            if i < len(b) and b[i] == low:
                shared.add(v)
            else:
                b.insert(i, low)
        for v in shared:
            self._owners[v] = {key for key in batch if hash48(key) == v}


READ_BACK_CHUNK = 1 << 20
_KEY_ESCAPE = re.compile(rb"\\u00[2-7][0-9a-fA-F]")
"""A printable ASCII character written as an escape: a key may be spelled with one."""


def first_ids(
    f: Any,
    limit: int,
    fields: Iterable[str],
    wanted: frozenset[int],
    ids: IdSet,
    max_line_bytes: int,
) -> dict[int, Any]:
    """The first id (as remembered, :func:`remembered_id`) of each ``wanted`` hash
    among the lines of ``f`` before ``limit``, an id being the value of one of ``fields`` (dotted
    paths) in a line that is a JSON object.

    A line is parsed only when it may hold a wanted id: an id field whose value is a plain
    string or integer is hashed where it stands, and the line is parsed when that hash is
    wanted; a field with any other value, or a line with a key character written as an escape,
    is parsed. A block of lines whose id fields all have such values, none of them of a wanted
    hash (hashed all at once), and without escaped key characters is passed over whole. Lines
    longer than ``max_line_bytes`` are skipped, as the scanner skips them.
    """
    hash48 = ids.hash48
    found: dict[int, Any] = {}
    names = sorted({fld.rsplit(".", 1)[-1] for fld in fields})
    paths = list(dict.fromkeys(fields))
    keys = [re.compile(b'"' + re.escape(n.encode()) + rb'"\s*:\s*') for n in names]
    plain = [
        re.compile(
            b'"' + re.escape(n.encode()) + rb'"\s*:\s*(?:"([^"\\]*)"|(-?(?:0|[1-9][0-9]*)))'
            rb"\s*(?=[,}\]])"
        )
        for n in names
    ]
    literals = [b'"' + n.encode() + b'"' for n in names]
    end = rb"\s*(?=[,}\]])"
    plain_str = [re.compile(re.escape(k) + rb'\s*:\s*"([^"\\]*)"' + end) for k in literals]
    plain_int = [
        re.compile(re.escape(k) + rb"\s*:\s*(-?(?:0|[1-9][0-9]*))" + end) for k in literals
    ]
    for buf in _line_blocks(f, limit, max_line_bytes):
        if _passed_over(buf, literals, plain_str, plain_int, wanted, ids):
            continue
        starts: set[int] = set()
        for key, simple in zip(keys, plain):
            easy = set()
            for m in simple.finditer(buf):
                easy.add(m.start())
                text, number = m.group(1), m.group(2)
                try:
                    ident = int(number) if number is not None else text.decode("utf-8")
                except ValueError:
                    starts.add(m.start())
                    continue
                if hash48(remembered_id(ident)) in wanted:
                    starts.add(m.start())
            starts.update(m.start() for m in key.finditer(buf) if m.start() not in easy)
        starts.update(m.start() for m in _KEY_ESCAPE.finditer(buf))
        lines = sorted({buf.rfind(b"\n", 0, s) + 1 for s in starts})
        for s in lines:
            e = buf.find(b"\n", s)
            _parsed(buf[s:e], paths, wanted, hash48, found)
        if len(found) == len(wanted):
            break
    return found


def _passed_over(
    buf: bytes,
    literals: list[bytes],
    plain_str: list[re.Pattern[bytes]],
    plain_int: list[re.Pattern[bytes]],
    wanted: frozenset[int],
    ids: IdSet,
) -> bool:
    """Whether no line of ``buf`` can hold a wanted id: every id field's name in it is followed
    by a plain string or integer (as many matches as occurrences of the quoted name), none of
    them of a wanted hash, and no key character is written as an escape."""
    if _KEY_ESCAPE.search(buf):
        return False
    strs = [m for p in plain_str for m in p.findall(buf)]
    ints = [m for p in plain_int for m in p.findall(buf)]
    if len(strs) + len(ints) != sum(buf.count(k) for k in literals):
        return False
    try:
        keys = chain(strs, map(int, ints))
        return wanted.isdisjoint(ids.hash_many(keys))
    except ValueError:
        return False


def _parsed(
    line: bytes,
    paths: list[str],
    wanted: frozenset[int],
    hash48: Callable[[Any], int],
    found: dict[int, Any],
) -> None:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return
    if not isinstance(obj, dict):
        return
    for path in paths:
        ok, ident = lookup(obj, path)
        if ok:
            key = remembered_id(ident)
            v = hash48(key)
            if v in wanted and v not in found:
                found[v] = key


def _line_blocks(f: Any, limit: int, max_line_bytes: int) -> Iterator[bytes]:
    """The bytes of ``f`` before ``limit`` in blocks of whole lines (each ending in a newline;
    a line longer than ``max_line_bytes`` left out), read with ``pread`` (the file's position
    is left alone)."""
    fd = f.fileno()
    pos = 0
    carry = b""
    skipping = False
    while pos < limit:
        chunk = os.pread(fd, min(READ_BACK_CHUNK, limit - pos), pos)
        if not chunk:
            return
        pos += len(chunk)
        if skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                continue
            skipping, chunk = False, chunk[nl + 1 :]
        last = chunk.rfind(b"\n")
        if last < 0:
            carry += chunk
            if len(carry) > max_line_bytes:
                carry, skipping = b"", True
            continue
        block, carry = carry + chunk[: last + 1], chunk[last + 1 :]
        if len(carry) > max_line_bytes:
            carry, skipping = b"", True
        yield block
