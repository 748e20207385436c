"""RegionalStore in virtual time over in-process stores (one MemoryStore per region).

FakeClock throughout: the shares, the lease and the windows are arithmetic on the
clock, so every figure here is exact and repeatable. The same scenarios run over real
Redis servers behind latency-injecting links in test_redis_regions.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import (
    ConfigError,
    Decision,
    MemoryStore,
    RateLimiter,
    RegionalStore,
    Rule,
    StorageError,
    Store,
)
from stormguard.observability.events import Event
from stormguard.stores.regional import (
    Board,
    MemoryBoard,
    PeerLost,
    PeerRecovered,
    ShareChanged,
    SyncFailed,
    waterfill,
)
from stormguard.stores.regional.store import _Entry
from stormguard.testing import FakeClock
from tests.regional.harness import REGIONS, Regions, demand_shift


def _entry(store: RegionalStore, rule: Rule, share: float) -> _Entry:
    """A share table entry as a sync would leave it (this region enforcing ``share``)."""
    return _Entry(dict.fromkeys(REGIONS, share), share, share, rule)


class CutBoard(Board):
    """A board behind a link that can be cut (raises StorageError, as a timeout does)."""

    def __init__(self, inner: Board, calls: list[str],
                 held: list[tuple[Board, str, bytes, float]] | None = None) -> None:
        self.inner = inner
        self.cut = False
        self.calls = calls
        self.hold = False  # writes wait in `held` until the world delivers them
        self.held = held if held is not None else []

    def write(self, sender: str, payload: bytes, ttl: float) -> None:
        self.calls.append("write")
        if self.cut:
            raise StorageError("link cut")
        if self.hold:
            self.held.append((self.inner, sender, payload, ttl))
        else:
            self.inner.write(sender, payload, ttl)

    def read(self) -> dict[str, bytes]:
        self.calls.append("read")
        if self.cut:
            raise StorageError("link cut")
        return self.inner.read()


class World:
    """Three regions in one process; ``links[(a, b)]`` is a's view of b's board."""

    def __init__(self, clock: FakeClock, **options: object) -> None:
        self.clock = clock
        self.locals = {r: MemoryStore(clock=clock) for r in REGIONS}
        self.inbox = {r: MemoryBoard(clock) for r in REGIONS}
        self.calls: list[str] = []
        self.held: list[tuple[Board, str, bytes, float]] = []
        self.links = {(a, b): CutBoard(self.inbox[b], self.calls, self.held)
                      for a in REGIONS for b in REGIONS}
        opts = {"sync_interval": None, "lease": 3.0, "min_share": 0.05, **options}
        self.stores = {
            a: RegionalStore(region=a, stores=self.locals, clock=clock,
                             boards={b: self.links[(a, b)] for b in REGIONS},
                             **opts)  # type: ignore[arg-type]
            for a in REGIONS}

    def simultaneous(self, on: bool = True) -> None:
        """Hold every report until :meth:`deliver`: regions that sync in one round all
        read the reports of the round before, as when they sync at the same instant."""
        for link in self.links.values():
            link.hold = on

    def deliver(self) -> None:
        for inner, sender, payload, ttl in self.held:
            inner.write(sender, payload, ttl)
        self.held.clear()

    def partition(self, region: str, cut: bool = True) -> None:
        for (a, b), link in self.links.items():
            if a != b and region in (a, b):
                link.cut = cut


@pytest.fixture
def clock() -> FakeClock:
    c = FakeClock()
    c.advance(0.5)  # syncs happen in the middle of a window: share changes carry counts
    return c


RULE = Rule(1000, 1, algorithm="fixed_window")


# -- the contract ---------------------------------------------------------------------
def test_checks_touch_only_the_local_store_and_the_first_check_waits_on_nobody(
        clock: FakeClock) -> None:
    world = World(clock)
    us = world.stores["us"]
    limiter = RateLimiter(us)
    world.calls.clear()  # construction read this region's own board (its last report)
    d = limiter.hit("new-key", RULE)
    assert d.allowed
    assert d.limit == 333  # a key nobody reported: the static weight (1/3)
    assert world.calls == []  # no board touched by a check, not even for a new key
    for s in world.stores.values():
        s.sync()
    assert world.calls  # the sync did the talking
    assert len(world.locals["eu"]) == 0  # and nothing reached the peers' counters


def test_static_split_enforces_limit_times_weight(clock: FakeClock) -> None:
    stores = {r: MemoryStore(clock=clock) for r in REGIONS}
    weights = {"us": 0.5, "eu": 0.3, "ap": 0.2}
    for r, w in weights.items():
        s = RegionalStore(region=r, stores=stores, split="static", weights=weights,
                          clock=clock)
        admitted = sum(s.hit("k", RULE).allowed for _ in range(1000))
        assert admitted == int(1000 * w)
        assert s.shares("k", RULE) == weights
        s.sync()  # nothing to do, and no board
        assert s.stats()["state"] == "static"


def test_demand_split_follows_demand_and_sums_to_one(clock: FakeClock) -> None:
    world = World(clock)
    regions = Regions(world.stores, clock, RULE)
    for _ in range(4):
        regions.run_interval({"us": 1600, "eu": 200, "ap": 200})
    expected = dict(zip(REGIONS, waterfill([1.6, 0.2, 0.2], 1.0, 0.05), strict=True))
    for s in world.stores.values():
        shares = s.shares(regions.key, RULE)
        assert shares == pytest.approx(expected, abs=1e-6)
        assert sum(shares.values()) == pytest.approx(1.0)
    assert world.stores["us"].local_rule(regions.key, RULE).limit == 600


ALIGNMENTS = {
    # every region syncs at the same instant, one after the other: each reads the
    # reports of the regions before it in this round, the others' of the round before
    "same instant, us first": (("us", "eu", "ap"), False),
    "same instant, ap first": (("ap", "eu", "us"), False),
    # at the same instant, all of them read before any report lands: each reads only
    # the reports of the round before (the worst alignment)
    "same instant, simultaneous": (REGIONS, True),
}


@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_demand_shift_back_within_five_percent_in_three_intervals(
        clock: FakeClock, alignment: str) -> None:
    """80/10/10 of twice the limit, then 10/10/80 (the shift lands half-way through a
    window, at a sync): every window from the one in progress three sync intervals
    after the shift is within 5 % of the limit."""
    order, simultaneous = ALIGNMENTS[alignment]
    world = World(clock)
    world.simultaneous(simultaneous)
    regions = Regions(world.stores, clock, RULE, order=order, after_round=world.deliver)
    shift = demand_shift(regions, 1000, before=8)
    shifted_at = shift - 0.5  # wall seconds, in windows of 1 s
    windows = regions.windows()
    assert windows[-1] >= shift + 4
    for w in windows:
        # the first windows: the regions meet (from the weights, with nobody's report)
        if w >= windows[0] + 4 and not shift - 1 <= w < shifted_at + 3 - 1:
            assert abs(regions.total(w) - 1000) <= 50, (w, dict(regions.admitted[w]))
    # every window, even the ones where shares moved: a region admits at most the largest
    # limit it enforced in that window (the count carries across a share change), so the
    # global total is at most the sum of those (the stated bound while shares move)
    for w in windows:
        for r in REGIONS:
            assert regions.admitted[w][r] <= regions.limits[w][r], (w, r)
        assert regions.total(w) <= sum(regions.limits[w].values())
    # nobody starved while another region's share sits unused: after the shift has
    # settled each region gets its water-filled share of what it asked for
    fair = dict(zip(REGIONS, waterfill([0.2, 0.2, 1.6], 1.0, 0.05), strict=True))
    last = windows[-1]
    for r in REGIONS:
        assert regions.admitted[last][r] >= 0.95 * fair[r] * 1000, (r, regions.admitted[last])


@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_a_key_new_everywhere_squeezes_nobody(clock: FakeClock, alignment: str) -> None:
    """A key whose traffic starts in every region at once: each region's first reports
    carry only its own demand, so a claim into the room a peer "will release" would be
    a guess (every region would claim nearly all of it, and each hold the others to
    nothing). A region claims beyond a peer's share only once that peer reported its
    demand: no region goes below the smaller of its weight and its water-filled share
    at any sync."""
    order, simultaneous = ALIGNMENTS[alignment]
    world = World(clock)
    world.simultaneous(simultaneous)
    fair = dict(zip(REGIONS, waterfill([1.6, 0.2, 0.2], 1.0, 0.05), strict=True))
    lowest = dict.fromkeys(REGIONS, 1.0)

    def after_round() -> None:
        world.deliver()
        for r, s in world.stores.items():
            lowest[r] = min(lowest[r], s.shares("api_key:acme", RULE)[r])

    regions = Regions(world.stores, clock, RULE, order=order, after_round=after_round)
    for _ in range(2):
        regions.run_interval({})  # connected (heartbeats), nobody has the key yet
    assert all(s.state() == "connected" for s in world.stores.values())
    for _ in range(6):
        regions.run_interval({"us": 1600, "eu": 200, "ap": 200})
    for r in REGIONS:
        assert lowest[r] >= min(1 / 3, fair[r]) - 1e-9, lowest
    assert regions.total(regions.windows()[-1]) == 1000


def test_a_share_change_carries_the_count_for_every_algorithm(clock: FakeClock) -> None:
    """A region that admitted `a` under a larger share admits at most `new limit - a`
    after the share shrinks in the same window: the scaled rule keeps the counters."""
    for algorithm in ("fixed_window", "sliding_window_counter", "sliding_window_log",
                      "token_bucket", "gcra", "leaky_bucket"):
        world = World(clock)
        us = world.stores["us"]
        rule = Rule(300, 60, algorithm=algorithm)
        big = us._scale(rule, 0.6)
        small = us._scale(rule, 0.2)
        assert big.id == small.id
        key = f"carry-{algorithm}"
        first = sum(world.locals["us"].hit(key, big).allowed for _ in range(100))
        assert first == 100
        more = sum(world.locals["us"].hit(key, small).allowed for _ in range(100))
        assert more == 0, algorithm  # 100 admitted already >= the new limit 60
        # through the regional store a spent-over share reads as nothing left, not -40
        us._table[(rule.id, key)] = us._table.get((rule.id, key)) or _entry(us, rule, 0.2)
        assert us.peek(key, rule).remaining == 0
        us.reset(key, rule)  # the regional store resets the counters its shares use
        assert world.locals["us"].hit(key, small).remaining == small.capacity - 1


def test_token_bucket_and_gcra_are_enforced_as_the_leaky_bucket(clock: FakeClock) -> None:
    """Both admit what the leaky bucket admits, but their state keeps what is left (or a
    time scaled by the limit), which a share change would misread: under demand shares
    they run as the leaky bucket, which keeps what was spent, under its own counters."""
    world = World(clock)
    us = world.stores["us"]
    for algorithm in ("token_bucket", "gcra"):
        rule = Rule(300, 60, algorithm=algorithm, burst=30)
        local = us.local_rule("k", rule)
        assert local.algorithm == "leaky_bucket"
        assert (local.limit, local.burst) == (100, 10)
        assert local.id == Rule(300, 60, algorithm="leaky_bucket", burst=30).id
        assert sum(us.hit(algorithm, rule).allowed for _ in range(20)) == 10
    static = RegionalStore(region="us", stores=world.locals, split="static", clock=clock)
    assert static.local_rule("k", Rule(100, 1, algorithm="gcra")).algorithm == "gcra"


def test_release_before_take(clock: FakeClock) -> None:
    """A cut applies at the sync that computes it; a raise waits until every peer has
    acknowledged the claim (and goes no further than the room the peers leave). While
    a raise is pending the regions say so (``pending()``) and sync again half-way to
    the next regular sync: the raise comes an interval sooner."""
    reached = {}
    for hurry in (False, True):
        c = FakeClock()
        c.advance(0.5)
        world = World(c)
        us, ap = world.stores["us"], world.stores["ap"]
        regions = Regions(world.stores, c, RULE, hurry=hurry)
        regions.run_interval({"us": 1600, "eu": 200, "ap": 200})  # us hears nobody yet
        # ap heard both: it cut to 0.2 at once
        assert ap.shares(regions.key, RULE)["ap"] == pytest.approx(0.2)
        assert not any(s.pending() for s in world.stores.values())
        regions.run_interval({"us": 1600, "eu": 200, "ap": 200})
        # us wants 0.6 and claims the room its peers leave (eu, first by name, still
        # claimed its weight): nothing taken before they have read the claim
        assert us.shares(regions.key, RULE)["us"] == pytest.approx(1 / 3)
        assert us._table[(RULE.id, regions.key)].claim == pytest.approx(1 - 1 / 3 - 0.2)
        assert us.pending()
        assert us.stats()["pending"]
        assert all(s.pending() for s in world.stores.values())  # they read no claim yet
        for n in range(3, 7):
            regions.run_interval({"us": 1600, "eu": 200, "ap": 200})
            if us.shares(regions.key, RULE)["us"] == pytest.approx(0.6):
                reached[hurry] = n
                break
        assert not any(s.pending() for s in world.stores.values())
    # regular syncs only: the peers read the claim at their next sync, us reads their
    # acknowledgements at the one after; hurried: both within the same interval
    assert reached == {False: 4, True: 3}


def test_the_half_step_syncs_only_while_a_raise_is_pending(clock: FakeClock) -> None:
    """In steady state the half step reads this region's board and does nothing; after a
    shift every region syncs once more per interval until the raise has landed, then
    stops again: at most two syncs per interval, the second only while shares move."""
    world = World(clock)
    regions = Regions(world.stores, clock, RULE, hurry=False)
    steady = {"us": 1600, "eu": 200, "ap": 200}
    for _ in range(5):
        regions.run_interval(steady)
    assert not any(s.pending() for s in world.stores.values())

    def interval(offered: dict[str, int]) -> list[bool]:
        before = [s.stats()["syncs"] for s in world.stores.values()]
        for r, n in offered.items():
            for _ in range(n // 2):
                world.stores[r].hit(regions.key, RULE)
        clock.advance(0.5)
        hurried = [s.half_sync() for s in world.stores.values()]
        for r, n in offered.items():
            for _ in range(n // 2):
                world.stores[r].hit(regions.key, RULE)
        clock.advance(0.5)
        for s in world.stores.values():
            s.sync()
        after = [s.stats()["syncs"] for s in world.stores.values()]
        assert [a - b for a, b in zip(after, before, strict=True)] == [
            2 if h else 1 for h in hurried]
        return hurried

    world.calls.clear()
    assert interval(steady) == [False, False, False]
    assert world.calls.count("write") == 9  # the regular syncs' reports, no more
    shifted = {"us": 200, "eu": 200, "ap": 1600}
    steps = [interval(shifted) for _ in range(5)]
    assert any(any(h) for h in steps)  # the shift hurried them
    assert steps[-1] == [False, False, False]  # and they calmed down
    assert world.stores["ap"].shares(regions.key, RULE)["ap"] == pytest.approx(0.6)


def test_a_poll_raises_only_to_what_every_peer_acknowledged(clock: FakeClock) -> None:
    """ap claims 0.4 at its sync after the shift; a poll (its board read, no write)
    raises nothing while a peer has not read the claim (us cut already, so there is
    room: only eu's acknowledgement is missing), and raises once both have."""
    world = World(clock)
    regions = Regions(world.stores, clock, RULE, hurry=False)
    for _ in range(5):
        regions.run_interval({"us": 1600, "eu": 200, "ap": 200})
    us, eu, ap = (world.stores[r] for r in REGIONS)
    assert not ap.poll()  # nothing pending: not even a read
    for r, n in {"us": 200, "eu": 200, "ap": 1600}.items():
        for _ in range(n):
            world.stores[r].hit(regions.key, RULE)
    clock.advance(1.0)
    world.calls.clear()
    ap.sync()
    entry = ap._table[(RULE.id, regions.key)]
    assert (entry.enforced, entry.claim) == (pytest.approx(0.2), pytest.approx(0.4))
    assert not ap.poll()
    us.sync()
    assert us.shares(regions.key, RULE)["us"] == pytest.approx(0.2)  # room for ap
    assert not ap.poll()  # eu has not read the claim
    assert ap.shares(regions.key, RULE)["ap"] == pytest.approx(0.2)
    eu.sync()
    writes = world.calls.count("write")
    assert ap.poll()
    assert ap.shares(regions.key, RULE)["ap"] == pytest.approx(0.4)
    assert world.calls.count("write") == writes  # a poll writes nothing
    total = sum(world.stores[r].shares(regions.key, RULE)[r] for r in REGIONS)
    assert total <= 1 + 1e-9


def test_a_small_dip_of_demand_keeps_the_share(clock: FakeClock) -> None:
    """eu's demand measured 200, 180, 200, 180 per interval (a request or two of noise at
    a low rate): it keeps its 0.2 (a cut below 3 % of the limit waits), so its users are
    never denied; a real fall (to 100) is cut at once, and us takes the room."""
    world = World(clock)
    regions = Regions(world.stores, clock, RULE)
    for _ in range(5):
        regions.run_interval({"us": 1600, "eu": 200, "ap": 200})
    eu = world.stores["eu"]
    assert eu.local_rule(regions.key, RULE).limit == 200
    start = regions.window() + 1
    for n in (180, 200, 180, 200, 180, 200):
        regions.run_interval({"us": 1600, "eu": n, "ap": 200})
        assert eu.local_rule(regions.key, RULE).limit == 200
    for w in regions.windows():
        if w >= start:
            assert regions.admitted[w]["eu"] == regions.offered[w]["eu"], w
            assert regions.total(w) >= 0.97 * 1000, w
    for _ in range(4):
        regions.run_interval({"us": 1600, "eu": 100, "ap": 200})
    assert eu.local_rule(regions.key, RULE).limit == 100
    assert world.stores["us"].local_rule(regions.key, RULE).limit == 700


def test_a_link_down_one_way_keeps_the_claims_bounded(clock: FakeClock) -> None:
    """us cannot write to eu while eu's reports still reach us: eu is fresh for us but
    acknowledges none of us's reports, so us may raise nothing, however its demand
    moves; the claims it remembers for the grant rule stay bounded."""
    world = World(clock)
    regions = Regions(world.stores, clock, RULE)
    for _ in range(4):
        regions.run_interval({"us": 200, "eu": 200, "ap": 1600})
    us = world.stores["us"]
    held = us.shares(regions.key, RULE)["us"]
    world.links[("us", "eu")].cut = True
    for i in range(60):
        regions.run_interval({"us": 1600 if i % 2 else 400 + 10 * i, "eu": 200, "ap": 200})
        assert us.state() == "connected"
        assert us.shares(regions.key, RULE)["us"] <= held + 1e-9
        total = sum(world.stores[r].shares(regions.key, RULE)[r] for r in REGIONS)
        assert total <= 1 + 1e-9
    assert len(us._table[(RULE.id, regions.key)].published) <= 17


# -- partitions -----------------------------------------------------------------------
def test_partition_keeps_the_global_total_within_the_limit_then_heals(
        clock: FakeClock) -> None:
    world = World(clock, lease=3.0)
    regions = Regions(world.stores, clock, RULE)
    offered = {"us": 1600, "eu": 200, "ap": 200}
    for _ in range(4):
        regions.run_interval(offered)
    before = {r: s.shares(regions.key, RULE)[r] for r, s in world.stores.items()}
    cut_at = regions.window()
    world.partition("ap")
    # demand moves during the partition: ap wants everything
    offered = {"us": 200, "eu": 200, "ap": 1600}
    for _ in range(6):
        regions.run_interval(offered)
    ap, us = world.stores["ap"], world.stores["us"]
    assert ap.stats()["state"] == "isolated"
    assert us.stats()["state"] == "partial"
    assert ap.stats()["publish_failures"] >= 6
    # the isolated region enforces min(last share, weight); the others keep its share aside
    assert ap.shares(regions.key, RULE)["ap"] == pytest.approx(min(before["ap"], 1 / 3))
    assert us.shares(regions.key, RULE)["ap"] >= ap.shares(regions.key, RULE)["ap"] - 1e-9
    assert sum(world.stores[r].shares(regions.key, RULE)[r] for r in REGIONS) <= 1 + 1e-9
    for w in regions.windows():
        if w > cut_at:
            assert regions.total(w) <= 1000, (w, dict(regions.admitted[w]))
    world.partition("ap", cut=False)
    healed = regions.window()
    for _ in range(4):
        regions.run_interval(offered)
    assert ap.stats()["state"] == "connected"
    assert ap.shares(regions.key, RULE)["ap"] == pytest.approx(0.6, abs=1e-6)
    for w in regions.windows():
        if w > healed + 3:
            assert abs(regions.total(w) - 1000) <= 50


def test_a_region_that_hears_from_nobody_enforces_its_weight_at_most(
        clock: FakeClock) -> None:
    world = World(clock, lease=3.0)
    regions = Regions(world.stores, clock, RULE)
    for _ in range(4):
        regions.run_interval({"us": 1600, "eu": 200, "ap": 200})
    for r in REGIONS:
        world.partition(r)
    for _ in range(5):
        regions.run_interval({"us": 1600, "eu": 1600, "ap": 1600})
    enforced = {r: s.shares(regions.key, RULE)[r] for r, s in world.stores.items()}
    assert enforced == pytest.approx({"us": 1 / 3, "eu": 0.2, "ap": 0.2})
    assert all(s.stats()["state"] == "isolated" for s in world.stores.values())
    last = regions.windows()[-1]
    assert regions.total(last) <= 1000


# -- failures and observability ---------------------------------------------------------
class Broken(Board):
    def write(self, sender: str, payload: bytes, ttl: float) -> None:
        raise RuntimeError("not even a StorageError")

    def read(self) -> dict[str, bytes]:
        return {"eu": b"{not json", "zz": b"from a region nobody configured"}


def test_sync_never_raises_and_counts_failures(clock: FakeClock) -> None:
    stores = {r: MemoryStore(clock=clock) for r in REGIONS}
    seen: list[Event] = []
    s = RegionalStore(region="us", stores=stores, clock=clock, sync_interval=None,
                      boards=dict.fromkeys(REGIONS, Broken()), listeners=[seen.append])
    s.hit("k", RULE)
    s.sync()
    st = s.stats()
    assert st["syncs"] == 1
    assert st["publish_failures"] == 2  # to the two peers
    assert st["decode_failures"] == 1
    assert st["sync_failures"] == 4  # and this region's own copy of its report
    assert st["peers"]["eu"]["fresh"] is False
    failed = [e for e in seen if isinstance(e, SyncFailed)]
    assert sorted(e.operation for e in failed) == ["decode", "publish", "publish", "publish"]
    assert s.hit("k", RULE).allowed  # checks go on


def test_events_for_shares_and_peers(clock: FakeClock) -> None:
    seen: list[Event] = []
    world = World(clock, lease=3.0, listeners=[seen.append])
    regions = Regions(world.stores, clock, RULE)
    for _ in range(4):
        regions.run_interval({"us": 1600, "eu": 200, "ap": 200})
    changes = [e for e in seen if isinstance(e, ShareChanged) and e.policy == "regional:us"]
    assert changes
    assert changes[-1].new == pytest.approx(0.6)
    assert changes[-1].limit == 600
    world.partition("ap")
    for _ in range(5):
        regions.run_interval({"us": 1600, "eu": 200, "ap": 200})
    lost = [e for e in seen if isinstance(e, PeerLost)]
    assert {(e.policy, e.peer) for e in lost} >= {("regional:us", "ap"), ("regional:ap", "us")}
    assert all(e.silent > 3.0 for e in lost)
    world.partition("ap", cut=False)
    regions.run_interval({"us": 1600, "eu": 200, "ap": 200})
    assert any(isinstance(e, PeerRecovered) and e.peer == "ap" for e in seen)


def test_more_cost_than_the_share_holds_is_a_denial_not_an_error(clock: FakeClock) -> None:
    world = World(clock)
    us = world.stores["us"]
    rule = Rule(30, 1, algorithm="fixed_window")
    d = us.hit("k", rule, cost=20)  # global capacity 30, this region's share 10
    assert not d.allowed
    assert d.limit == 10
    with pytest.raises(ConfigError, match="cost"):
        us.hit("k", rule, cost=31)


def test_hit_all_peek_reserve_reset_and_async(clock: FakeClock) -> None:
    world = World(clock)
    us = world.stores["us"]
    a = Rule(30, 1, algorithm="fixed_window")
    b = Rule(300, 60, algorithm="token_bucket")
    d = us.hit_all("k", [a, b])
    assert d.allowed
    assert d.limit in (10, 100)
    assert us.peek("k", a).remaining == 9
    r = us.reserve("k", b)
    assert r.ok
    us.reset("k", [a, b])
    assert us.peek("k", a).remaining == 10

    async def flow() -> None:
        assert (await us.ahit("k", a)).remaining == 9
        assert (await us.apeek("k", a)).remaining == 9
        assert (await us.ahit_all("k", [a, b])).allowed
        assert (await us.areserve("k", b)).ok
        await us.areset("k", a)
        assert await us.aping()

    clock.run(flow())
    assert us.peek("k", a).remaining == 10


def test_bad_configuration_names_the_field(clock: FakeClock) -> None:
    stores = {r: MemoryStore(clock=clock) for r in REGIONS}
    cases = [
        ({"region": "xx"}, "region"),
        ({"stores": {}}, "stores"),
        ({"stores": {"us": 42}}, "stores"),
        ({"split": "dynamic"}, "split"),
        ({"weights": {"us": 0.5, "eu": 0.5}}, "weights"),
        ({"weights": {"us": 0.5, "eu": 0.3, "ap": 0.3}}, "weights"),
        ({"weights": {"us": 0.9, "eu": 0.07, "ap": 0.03}}, "weights"),
        ({"min_share": 0.5}, "min_share"),
        ({"sync_interval": 0}, "sync_interval"),
        ({"sync_interval": 5.0, "lease": 5.0}, "lease"),
        ({"peer_timeout": -1}, "peer_timeout"),
        ({"stores": {"us": stores["us"], "eu": "memory://"}}, "stores"),
        ({"boards": {"eu": object()}}, "boards"),
    ]
    for extra, name in cases:
        options = {"region": "us", "stores": stores, "clock": clock, "sync_interval": None,
                   **extra}
        with pytest.raises(ConfigError) as info:
            RegionalStore(**options)  # type: ignore[arg-type]
        assert info.value.field == name, (extra, info.value)


def test_max_keys_bounds_what_is_tracked(clock: FakeClock) -> None:
    world = World(clock, max_keys=5)
    us = world.stores["us"]
    for i in range(20):
        us.hit(f"k{i}", RULE)
    us.sync()
    assert us.stats()["untracked"] >= 15
    assert us.stats()["keys"] <= 5


def test_background_sync_runs_and_stops() -> None:
    # real time: the background thread's period is real seconds (kept to ~0.3 s)
    stores = {r: MemoryStore() for r in REGIONS}
    regional = [RegionalStore(region=r, stores=stores, sync_interval=0.05, lease=0.5)
                for r in REGIONS]
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not all(
                s.stats()["state"] == "connected" for s in regional):
            time.sleep(0.02)  # real time: waiting for the real thread
        assert all(s.stats()["state"] == "connected" for s in regional)
    finally:
        for s in regional:
            s.close()
    assert not any(s._thread is not None and s._thread.is_alive() for s in regional)


# -- the invariant --------------------------------------------------------------------
@given(st.data())
@settings(max_examples=150, deadline=None)
def test_the_shares_in_force_never_sum_to_more_than_one(data: st.DataObject) -> None:
    """Random demand per interval, random sync order, links cut and healed at random
    (each direction on its own, a region's own board included), extra syncs, half steps
    and polls at the quarters of an interval by any of the regions (whether pending or
    not), and rounds whose reports all land only after every region synced (the same
    instant): after every step the shares the three regions enforce sum to at most 1."""
    clock = FakeClock()
    clock.advance(0.5)
    world = World(clock, lease=2.5)
    stores = world.stores
    rule = Rule(100, 1, algorithm="fixed_window")
    levels = st.sampled_from([0, 2, 10, 20, 40, 80, 160])

    def round_of(steps: Sequence[tuple[str, str]]) -> None:
        for r, step in steps:
            getattr(stores[r], step)()
            total = sum(stores[x].shares("k", rule)[x] for x in REGIONS)
            assert total <= 1 + 1e-9, {x: stores[x].shares("k", rule)[x] for x in REGIONS}
        world.deliver()

    extra = st.lists(st.tuples(st.sampled_from(REGIONS),
                               st.sampled_from(["sync", "half_sync", "poll"])), max_size=4)
    for _ in range(data.draw(st.integers(4, 14))):
        offered = {r: data.draw(levels) for r in REGIONS}
        for link in world.links.values():
            if data.draw(st.booleans()) and data.draw(st.booleans()):
                link.cut = not link.cut
        world.simultaneous(data.draw(st.booleans()))
        for quarter in range(4):
            for r, n in offered.items():
                for _ in range(n // 4):
                    stores[r].hit("k", rule)
            clock.advance(0.25)
            if quarter < 3:  # half steps, polls, syncs at any time by any of them
                round_of(data.draw(extra))
            else:
                round_of([(r, "sync") for r in data.draw(st.permutations(REGIONS))])


def test_a_restarted_region_enforces_the_claims_it_had_published(clock: FakeClock) -> None:
    """Its peers hold themselves to its last claims; restarting at the weights instead
    would take up to a weight more than that until they hear from it."""
    world = World(clock)
    regions = Regions(world.stores, clock, RULE)
    for _ in range(4):
        regions.run_interval({"us": 200, "eu": 200, "ap": 1600})
    before = world.stores["us"].shares(regions.key, RULE)["us"]
    assert before == pytest.approx(0.2)
    world.stores["us"].close()
    # the same stores and boards, a new process
    world.stores["us"] = RegionalStore(region="us", stores=world.locals, clock=clock,
                                       sync_interval=None, lease=3.0,
                                       boards={b: world.links[("us", b)] for b in REGIONS})
    us = world.stores["us"]
    assert us.local_rule(regions.key, RULE).limit == 200
    total = sum(world.stores[r].shares(regions.key, RULE)[r] for r in REGIONS)
    assert total <= 1 + 1e-9
    regions.stores = world.stores
    for _ in range(3):
        regions.run_interval({"us": 200, "eu": 200, "ap": 1600})
    assert abs(regions.total(regions.windows()[-1]) - 1000) <= 50
    # nothing to restore (a store that lost it): the weights, and the sync still works
    fresh = RegionalStore(region="us", stores={r: MemoryStore(clock=clock) for r in REGIONS},
                          clock=clock, sync_interval=None)
    assert fresh.local_rule("k", RULE).limit == 333


def test_a_board_is_found_beside_a_wrapped_backend(clock: FakeClock) -> None:
    """A store over a store (``.backend``, as a HybridStore has) puts its board beside
    its backend: two such wrappers of one MemoryStore meet at the same board."""
    from stormguard.stores.regional.board import board_for

    class Wrapper(Store):
        def __init__(self, backend: MemoryStore) -> None:
            self.backend = backend
            self.clock = clock

        def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
            return self.backend.hit(key, rule, cost)

        def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
            return self.backend.peek(key, rule, cost)

        def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
            return self.backend.hit_all(key, rules, cost)

        def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
            self.backend.reset(key, rule)

    inner = MemoryStore(clock=clock)
    a = board_for(Wrapper(inner), group="g", timeout=0.5)
    b = board_for(inner, group="g", timeout=0.5)
    assert a is b


def test_demand_counted_exactly_under_threads(clock: FakeClock) -> None:
    """Four real threads check one key at once: the report the sync publishes counts
    every check (offered = admitted + denied = all of them)."""
    import json

    world = World(clock)
    us = world.stores["us"]
    rule = Rule(3000, 1, algorithm="fixed_window")
    barrier = threading.Barrier(4)

    def worker() -> None:
        barrier.wait()
        for _ in range(2000):
            us.hit("k", rule)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    us.sync()
    report = json.loads(world.inbox["eu"].read()["us"])
    (row,) = [r for r in report["keys"] if r[1] == "k"]
    offered, admitted, denied = row[3:6]
    assert offered == 8000
    assert admitted == 1000  # its third of 3000 (nobody reported yet: the weight)
    assert denied == 7000


def test_a_rule_that_is_not_a_rule_is_named(clock: FakeClock) -> None:
    world = World(clock)
    with pytest.raises(ConfigError, match="rule"):
        world.stores["us"].hit("k", "100/second")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key"):
        world.stores["us"].hit(42, RULE)  # type: ignore[arg-type]


def test_one_region_alone_enforces_the_whole_limit(clock: FakeClock) -> None:
    only = RegionalStore(region="us", stores={"us": MemoryStore(clock=clock)}, clock=clock,
                         sync_interval=None)
    assert sum(only.hit("k", RULE).allowed for _ in range(1200)) == 1000
    only.sync()
    assert only.shares("k", RULE) == {"us": 1.0}
    assert only.state() == "connected"


def test_a_restart_that_lost_its_report_takes_no_old_acknowledgement(
        clock: FakeClock) -> None:
    """The peers acknowledged the reports of the old instance (seq up to n); the new one
    numbers its reports from 1 again: those acknowledgements must not grant its claims."""
    world = World(clock)
    regions = Regions(world.stores, clock, RULE)
    for _ in range(6):
        regions.run_interval({"us": 200, "eu": 200, "ap": 1600})
    world.stores["us"].close()
    world.inbox["us"]._data.pop("us")  # its own copy is lost
    world.stores["us"] = RegionalStore(region="us", stores=world.locals, clock=clock,
                                       sync_interval=None, lease=3.0,
                                       boards={b: world.links[("us", b)] for b in REGIONS})
    regions.stores = world.stores
    for _ in range(5):
        regions.run_interval({"us": 1600, "eu": 200, "ap": 1600})
        total = sum(world.stores[r].shares(regions.key, RULE)[r] for r in REGIONS)
        assert total <= 1 + 1e-9


def test_a_share_change_carries_the_count_over_a_hybrid_store(clock: FakeClock) -> None:
    """A region's local store may be a HybridStore: a scaled rule keeps its counters
    there too (leases are taken from the same backend counter), for the window
    algorithms it decides locally. A sharded HybridStore cannot follow demand shares
    (its shard counters are named by their limits) and is refused."""
    from stormguard import HybridStore

    backend = MemoryStore(clock=clock)
    hybrid = HybridStore(backend, sync_interval=None, clock=clock)
    us = RegionalStore(region="us", stores={"us": hybrid, "eu": MemoryStore(clock=clock)},
                       clock=clock, sync_interval=None)
    for algorithm in ("fixed_window", "sliding_window_counter"):
        rule = Rule(300, 60, algorithm=algorithm)
        big, small = us._scale(rule, 0.6), us._scale(rule, 0.2)
        key = f"hybrid-carry-{algorithm}"
        assert sum(hybrid.hit(key, big).allowed for _ in range(100)) == 100
        hybrid.sync()
        assert sum(hybrid.hit(key, small).allowed for _ in range(100)) == 0, algorithm
    hybrid.close()
    with pytest.raises(ConfigError, match="shards"):
        RegionalStore(region="us", stores={"us": HybridStore(backend, sync_interval=None,
                                                             shards=3, clock=clock),
                                           "eu": MemoryStore(clock=clock)},
                      clock=clock, sync_interval=None)
    static = RegionalStore(region="us", split="static", weights={"us": 0.5, "eu": 0.5},
                           stores={"us": HybridStore(backend, sync_interval=None, shards=3,
                                                     clock=clock),
                                   "eu": MemoryStore(clock=clock)},
                           clock=clock, sync_interval=None)
    assert static.local_rule("k", Rule(300, 60)).limit == 150


def test_regions_over_memory_stores_are_freed_without_a_crash() -> None:
    """Boards of in-process regions live on their MemoryStores, never behind a weak
    reference: the compiled MemoryStore (mypyc) does not clear weak references when it is
    freed, and a weak reference to one crashed the interpreter at garbage collection (the
    CI's compiled run segfaulted). A child process, so a crash fails this test alone."""
    code = textwrap.dedent("""
        import gc
        from stormguard import MemoryStore, RegionalStore, Rule
        rule = Rule(100, 1, algorithm="fixed_window")
        for _ in range(200):
            stores = {r: MemoryStore() for r in ("us", "eu")}
            regional = [RegionalStore(region=r, stores=stores, sync_interval=None)
                        for r in stores]
            for s in regional:
                s.hit("k", rule)
                s.sync()
            del stores, regional, s
        gc.collect()
        print("freed")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         timeout=120, env={**os.environ})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "freed"
