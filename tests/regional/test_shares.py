"""The share arithmetic (pure, deterministic): water-filling, partitions, local limits."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard.stores.regional.shares import (
    enforced_share,
    local_limit,
    plan_shares,
    waterfill,
)

EPS = 1e-9
demands = st.lists(st.floats(min_value=0.0, max_value=50.0, allow_nan=False), min_size=1,
                   max_size=6)
floors = st.floats(min_value=0.0, max_value=0.2)


@given(demands, floors)
@settings(max_examples=200, deadline=None)
def test_shares_sum_to_one_and_respect_the_floor(demand: list[float], floor: float) -> None:
    shares = waterfill(demand, 1.0, floor)
    assert math.isclose(sum(shares), 1.0, abs_tol=1e-9)
    assert all(s >= min(floor, 1.0 / len(demand)) - EPS for s in shares)


@given(demands, floors)
@settings(max_examples=200, deadline=None)
def test_shares_follow_demand(demand: list[float], floor: float) -> None:
    """More demand never gets a smaller share; if every demand (raised to the floor) fits,
    every demand is met; otherwise nobody short of its demand gets less than anyone."""
    shares = waterfill(demand, 1.0, floor)
    for i in range(len(demand)):
        for j in range(len(demand)):
            if demand[i] > demand[j]:
                assert shares[i] >= shares[j] - EPS
    if sum(max(floor, d) for d in demand) <= 1.0:
        assert all(s >= d - EPS for s, d in zip(shares, demand, strict=True))
    for i, (s, d) in enumerate(zip(shares, demand, strict=True)):
        if s < d - 1e-7:  # cut: max-min fair
            assert all(s >= t - 1e-7 for t in shares), (i, shares, demand)


def test_the_demand_shift_of_the_docs() -> None:
    # offered 1.6 / 0.2 / 0.2 of the limit: the two small regions are served in full,
    # the big one gets the rest
    assert [round(s, 6) for s in waterfill([1.6, 0.2, 0.2], 1.0, 0.05)] == [0.6, 0.2, 0.2]
    # under the limit, the leftover is shared in proportion to demand
    assert [round(s, 6) for s in waterfill([0.4, 0.05, 0.05], 1.0, 0.05)] == [0.8, 0.1, 0.1]
    # nobody asks: the prior (static weights)
    assert waterfill([0.0, 0.0], 1.0, 0.05, [0.7, 0.3]) == [0.7, 0.3]
    # a floor that cannot fit n times is lowered to an equal split
    assert [round(s, 9) for s in waterfill([5.0, 0.0, 0.0], 0.3, 0.2)] == [0.1, 0.1, 0.1]


@given(demands, floors, st.data())
@settings(max_examples=150, deadline=None)
def test_a_stale_region_keeps_its_last_share(demand: list[float], floor: float,
                                             data: st.DataObject) -> None:
    regions = [f"r{i}" for i in range(len(demand))]
    floor = min(floor, 1.0 / len(regions))
    weights = dict.fromkeys(regions, 1.0 / len(regions))
    last = dict(zip(regions, waterfill(
        data.draw(st.lists(st.floats(0, 5), min_size=len(regions), max_size=len(regions))),
        1.0, floor), strict=True))
    fresh = set(data.draw(st.lists(st.sampled_from(regions), unique=True)))
    out = plan_shares(regions, dict(zip(regions, demand, strict=True)), fresh, last, weights,
                      floor)
    assert math.isclose(sum(out.values()), 1.0, abs_tol=1e-9)
    for r in regions:
        if r not in fresh:
            assert out[r] == last[r]
    # without a last share, a stale region is given its static weight
    out = plan_shares(regions, dict(zip(regions, demand, strict=True)), fresh, None, weights,
                      floor)
    for r in regions:
        if r not in fresh:
            assert out[r] == weights[r]


@given(st.floats(0, 1), st.one_of(st.none(), st.floats(0, 1)), st.floats(0.01, 1))
@settings(deadline=None)
def test_enforced_share_releases_before_it_takes(computed: float, previous: float | None,
                                                 weight: float) -> None:
    connected = enforced_share(computed, previous, weight, False)
    assert connected <= computed
    assert connected <= (previous if previous is not None else weight)
    isolated = enforced_share(computed, previous, weight, True)
    assert isolated <= weight
    assert isolated <= (previous if previous is not None else weight)


@given(st.integers(1, 10**9), st.lists(st.floats(0, 1), min_size=1, max_size=6))
@settings(deadline=None)
def test_local_limits_never_add_up_to_more_than_the_limit(limit: int,
                                                          raw: list[float]) -> None:
    shares = waterfill(raw, 1.0, 0.0)
    limits = [local_limit(limit, s) for s in shares]
    assert all(n >= 1 for n in limits)
    # rounded down: at most the limit, plus one per region whose share is under one unit
    assert sum(limits) <= limit + sum(1 for s in shares if limit * s < 1)
    assert sum(limits) >= limit - len(shares) - sum(1 for s in shares if limit * s < 1) - 1
