"""The history's ring: a flat array of floats that behaves exactly as a bounded deque of points,
whatever the mix of appends, replacements of the newest point and points of other widths."""

from __future__ import annotations

import random
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.history import MAX_POINTS, History, Ring
from tests.properties import examples

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
point = st.lists(finite, min_size=1, max_size=6).map(tuple)
op = st.tuples(st.sampled_from(["append", "replace"]), point)


@settings(max_examples=examples(150), deadline=None)
@given(first=point, ops=st.lists(op, max_size=60), fill=st.integers(0, MAX_POINTS + 40))
def test_a_ring_reads_back_as_the_bounded_deque_of_its_points(
    first: tuple[float, ...], ops: list[tuple[str, tuple[float, ...]]], fill: int
) -> None:
    ring = Ring(len(first))
    model: deque[tuple[float, ...]] = deque(maxlen=MAX_POINTS)
    # A long run of points first, so that the operations also land on a ring that has wrapped.
    for i in range(fill):
        ring.append((float(i), 1.0, 2.0))
        model.append((float(i), 1.0, 2.0))
    for name, p in ops:
        if name == "replace" and model:
            ring[-1] = p
            model[-1] = p
        else:
            ring.append(p)
            model.append(p)
    assert len(ring) == len(model)
    assert list(ring) == list(model)
    assert list(reversed(ring)) == list(reversed(model))
    if model:
        assert ring[-1] == model[-1] and ring[0] == model[0]


def test_a_full_ring_costs_its_floats_and_no_more() -> None:
    """3 hours of a dataset's points (time, responses, tokens) in about 26 KB: the floats
    themselves, where tuples of float objects cost five times as much."""
    ring = Ring(3)
    for i in range(MAX_POINTS * 2):
        ring.append((float(i), float(i), float(i)))
    assert len(ring) == MAX_POINTS
    assert ring[0] == (float(MAX_POINTS),) * 3
    assert ring.nbytes() <= MAX_POINTS * 3 * 8 * 1.1


def test_a_columns_last_values_are_those_of_the_whole_ring() -> None:
    """``History.values`` reads only the newest ``limit`` points: the same values as the whole
    ring's last ``limit``, on a ring that has wrapped, with replaced newest points."""
    rng = random.Random(3)
    h = History(None)
    t = 0.0
    for i in range(3000):
        t += rng.choice([10.0, 3.0, 12.0])
        h.add("k", t, float(i), float(2 * i), keep_newest=rng.random() < 0.1)
    for limit in (1, 7, 120, MAX_POINTS + 5):
        for column in (1, 2, 3):
            whole = [p[column] for p in h.points("k")[-limit:] if len(p) > column]
            assert h.values("k", column, limit) == whole
    assert h.values("absent") == []
