"""The hot path (``apply``, on a mutable entry) decides exactly as the reference form
(``decide``, a plain pure function on immutable state): every algorithm, random traces with
clocks stepping back, peeks, costs, and limits and windows far beyond machine integers."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard.ratelimit.algorithms import ALGORITHMS
from tests.core.util import ALGORITHMS as NAMES

steps = st.lists(
    st.tuples(
        st.one_of(st.integers(-3_000_000, 3_000_000),  # µs; negative: the clock stepped back
                  st.integers(0, 10**12)),  # a long silence
        st.integers(1, 5),  # cost (clipped to the capacity)
        st.booleans(),  # consume (False: a peek)
    ),
    min_size=1, max_size=80,
)
limits = st.one_of(st.integers(1, 12), st.sampled_from([997, 10**6, 10**9, 2**40, 10**18]))
windows = st.one_of(st.integers(1, 5_000_000),
                    st.sampled_from([60_000_000, 3_600_000_000, 604_800_000_000,
                                     31_622_400_000_000]))


@settings(max_examples=500, deadline=None)
@given(name=st.sampled_from(NAMES), limit=limits, window_us=windows,
       burst=st.one_of(st.integers(1, 40), st.sampled_from([10**6, 10**15])),
       trace=steps, start=st.integers(0, 2**51))
def test_apply_decides_like_the_reference(name: str, limit: int, window_us: int, burst: int,
                                          trace: list[tuple[int, int, bool]],
                                          start: int) -> None:
    algo = ALGORITHMS[name](limit, window_us, burst)
    entry = algo.fresh()
    state: Any = None
    now = start
    for step, cost, consume in trace:
        now = max(0, now + step)
        c = min(cost, algo.B)
        allowed, new_state, remaining, reset, retry, expires = algo.decide(state, now, c, consume)
        assert algo.apply(entry, now, c, consume) == (allowed, remaining, reset, retry)
        if not (allowed and consume):
            assert new_state is state  # nothing consumed: the very same state
        state = new_state
        if state is None:
            assert entry == algo.fresh()
        else:
            assert algo.state_of(entry) == state
            assert entry[0] == algo.expires_of(state) == expires
            assert algo.state_of(algo.entry_of(state)) == state


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(NAMES), limit=st.integers(1, 6), window_us=st.integers(1, 3000),
       burst=st.integers(1, 8), trace=steps, start=st.integers(0, 2**51))
def test_an_entry_rebuilt_from_the_reference_state_decides_the_same(
        name: str, limit: int, window_us: int, burst: int, trace: list[tuple[int, int, bool]],
        start: int) -> None:
    """``entry_of`` (what a store writes after a reservation) is a valid hot-path entry."""
    algo = ALGORITHMS[name](limit, window_us, burst)
    state: Any = None
    now = start
    for step, cost, consume in trace:
        now = max(0, now + step)
        c = min(cost, algo.B)
        verdict = algo.decide(state, now, c, consume)
        if state is not None:
            entry = algo.entry_of(state)
            assert algo.apply(entry, now, c, consume) == verdict[:1] + verdict[2:5]
        state = verdict[1]
