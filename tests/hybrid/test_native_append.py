"""The charge of a key a native forced add found present: ``APPEND key ";<window>
<units>"``, ``PEXPIRE``, ``GET`` in the round's pipeline, on a real Redis. The fixed
window's state is then ``"<window> <used>"`` and any number of appended ``";<window>
<units>"``: every script folds it (the newest window's units summed) and writes it back
folded. What is claimed and tested here: the scripts and :func:`fw_state` read the same
count from any such state; units appended by real threads while scripts check and rewrite
the key are never lost; exactly one APPEND is told it exhausted the key, whatever the
interleaving, and only that one posts it (in its next round); a key gone between two
rounds is created again with a TTL."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stormguard import HybridStore, RedisStore, Rule
from stormguard.stores.hybrid.backend import FORCED_PRESENT, RedisBackend, fw_state
from stormguard.stores.redis.protocol import Command
from stormguard.testing import FakeClock

START = 1_700_000_040.0  # a whole second: windows of 1 s and 60 s start here
RULE = Rule(1000, 60, algorithm="fixed_window")


def _clock() -> FakeClock:
    clock = FakeClock()
    clock.set_wall(START + 30.0)  # mid-window: far from its edges, the adds go native
    return clock


def _store(url: str, clock: FakeClock) -> RedisStore:
    return RedisStore(url, clock=clock, time_source="client", timeout=1.0)


def _raw(store: RedisStore, key: str, rule: Rule) -> bytes | None:
    k = store.key(key, rule)
    reply: bytes | None = store.transport.call(Command.of("GET", k, key=k))
    return reply


def _put(store: RedisStore, key: str, rule: Rule, text: str) -> None:
    k = store.key(key, rule)
    store.transport.call(Command.of("SET", k, text, "PX", 120_000, key=k))


def _window(clock: FakeClock, rule: Rule) -> int:
    return int(clock.wall() * 1e6) // rule._algo.W


def test_fw_state_reads_appended_units_of_the_newest_window() -> None:
    assert fw_state("7 3") == (7, 3)
    assert fw_state("7 3;7 2;7 1") == (7, 6)
    assert fw_state(";7 2") == (7, 2)  # created by an APPEND
    assert fw_state("6 9;7 2;6 4") == (7, 2)  # an older window's units are void
    assert fw_state("8 1;7 5") == (8, 1)  # a newer window stays (a clock behind)
    assert fw_state("") == (-1, 0)
    assert fw_state("junk;7 x") == (-1, 0)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.one_of(st.none(), st.tuples(st.integers(-2, 1), st.integers(0, 40))),
       tokens=st.lists(st.tuples(st.integers(-2, 1), st.integers(1, 9)), max_size=8))
def test_every_script_reads_the_count_fw_state_reads(redis_url: str, base: tuple[int, int]
                                                     | None, tokens: list[tuple[int, int]]
                                                     ) -> None:
    """Any state of base and appended tokens (windows around the current one): the
    rate-limit script's peek counts what :func:`fw_state` counts in the current window,
    and a check that consumes writes the state back folded."""
    clock = _clock()
    store = _store(redis_url, clock)
    rule = Rule(100, 60, algorithm="fixed_window")
    w = _window(clock, rule)
    try:
        text = "" if base is None else f"{w + base[0]} {base[1]}"
        text += "".join(f";{w + dw} {n}" for dw, n in tokens)
        if not text:
            store.reset("k", rule)
            return
        _put(store, "k", rule, text)
        win, used = fw_state(text)
        expect = used if win == w else 0 if win < w else None
        d = store.peek("k", rule)
        if expect is None:  # a newer window (a clock behind): the script stays in it
            assert d.remaining == max(0, 100 - used)
        else:
            assert d.remaining == max(0, 100 - expect)
            if expect < 100:
                assert store.hit("k", rule).allowed
                folded = _raw(store, "k", rule)
                assert folded == f"{w} {expect + 1}".encode()  # written back folded
    finally:
        store.close()


def _run_together(targets: list[tuple[Callable[..., None], tuple[object, ...]]]) -> None:
    """Start every target in its own thread at once (a barrier); raise what any raised."""
    start = threading.Barrier(len(targets))
    errors: list[BaseException] = []

    def run(fn: Callable[..., None], args: tuple[object, ...]) -> None:
        try:
            start.wait()
            fn(*args)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_appends_from_threads_and_checks_lose_no_unit(redis_url: str) -> None:
    """Eight threads charge one key with APPENDs (each its own backend, as processes
    do) while four threads check it with the rate-limit script, which folds and rewrites
    the state on every admitted check: the count at the end is every unit appended plus
    every check admitted."""
    clock = _clock()
    rule = Rule(10_000, 60, algorithm="fixed_window")
    stores = [_store(redis_url, clock) for _ in range(12)]
    backends = [RedisBackend(s) for s in stores[:8]]
    appends, checks = 200, 150
    admitted = [0] * 4

    def charge(b: RedisBackend) -> None:
        for _ in range(appends):
            (g,), _ = b.sync_many([("shared", rule, 1, FORCED_PRESENT)], None, 0)
            assert not isinstance(g, BaseException)
            assert g[0] == 1

    def check(i: int) -> None:
        for _ in range(checks):
            admitted[i] += stores[8 + i].hit("shared", rule).allowed

    try:
        _run_together([(charge, (b,)) for b in backends] + [(check, (i,)) for i in range(4)])
        assert sum(b.native_appends for b in backends) == 8 * appends
        used = 8 * appends + sum(admitted)
        assert sum(admitted) == 4 * checks  # far from the limit: every check admitted
        assert stores[8].peek("shared", rule).remaining == rule.limit - used
        _, counted = fw_state((_raw(stores[8], "shared", rule) or b"").decode())
        assert counted == used
    finally:
        for s in stores:
            s.close()


def test_exactly_one_append_is_told_it_exhausted_the_key(redis_url: str) -> None:
    """Eight threads append one unit at a time to a key of limit 50 (80 units in all):
    whatever the interleaving, exactly one APPEND crossed the limit, and only its
    backend posts the key, in its next round."""
    clock = _clock()
    rule = Rule(50, 60, algorithm="fixed_window")
    stores = [_store(redis_url, clock) for _ in range(8)]
    backends = [RedisBackend(s) for s in stores]

    def charge(b: RedisBackend) -> None:
        for _ in range(10):
            b.sync_many([("edge", rule, 1, FORCED_PRESENT)], None, 0)

    try:
        _run_together([(charge, (b,)) for b in backends])
        pending = [b for b in backends if b._pending]
        assert len(pending) == 1
        assert len(pending[0]._pending) == 1
        assert stores[0].peek("edge", rule).remaining == 0
        # its next round with a board posts it; a reader sees one entry
        (_, rd) = pending[0].sync_many([("other", RULE, 0, 0)], -1, 4096)
        assert rd is not None
        assert [bid for _, bid in rd[1]] == [pending[0].board_id("edge", rule)]
        assert pending[0].posts == 1
        assert not pending[0]._pending
    finally:
        for s in stores:
            s.close()


def test_a_key_gone_between_rounds_is_created_again_with_a_ttl(redis_url: str) -> None:
    clock = _clock()
    store = _store(redis_url, clock)
    b = RedisBackend(store)
    try:
        store.reset("gone", RULE)
        (g,), _ = b.sync_many([("gone", RULE, 3, FORCED_PRESENT)], None, 0)
        assert not isinstance(g, BaseException)
        assert g[:2] == (3, RULE.limit - 3)
        k = store.key("gone", RULE)
        ttl = store.transport.call(Command.of("PTTL", k, key=k))
        assert 0 < ttl <= 30_000 + 1_000 + 20  # to the window's end, the margins more
        assert store.peek("gone", RULE).remaining == RULE.limit - 3
    finally:
        store.close()


def test_a_charge_near_a_window_edge_goes_in_the_script(redis_url: str) -> None:
    clock = _clock()
    clock.set_wall(START + 59.995)  # 5 ms before the window ends: the script's own time
    store = _store(redis_url, clock)
    b = RedisBackend(store)
    try:
        (g,), _ = b.sync_many([("edge", RULE, 2, FORCED_PRESENT)], None, 0)
        assert not isinstance(g, BaseException)
        assert g[0] == 2
        assert b.native_appends == 0
        assert b.owe_keys == 1
        assert _raw(store, "edge", RULE) is not None
        assert b";" not in (_raw(store, "edge", RULE) or b"")
    finally:
        store.close()


@pytest.mark.parametrize("units", [1, 7])
def test_an_append_of_an_older_window_does_not_count_in_the_next(redis_url: str,
                                                                 units: int) -> None:
    clock = _clock()
    store = _store(redis_url, clock)
    rule = Rule(10, 1, algorithm="fixed_window")
    w = _window(clock, rule)
    try:
        _put(store, "old", rule, f"{w - 1} 3;{w - 1} {units}")
        assert store.peek("old", rule).remaining == 10
        _put(store, "old", rule, f"{w - 1} 3;{w} {units}")
        assert store.peek("old", rule).remaining == 10 - units
    finally:
        store.close()


def test_hybrid_stores_charge_a_key_present_with_appends_and_post_what_they_exhaust(
        redis_url: str) -> None:
    """Four processes admit one unit each of a key of limit 4 on their allowances. The
    first creates the key (SET NX); the others find it present with 1 used: 2 left after
    their unit, half the limit, so each charges with an APPEND in its next round. The
    last APPEND takes the fourth unit: its process denies the key at once and posts it
    in its next round, where the others read it."""
    clock = _clock()
    rule = Rule(4, 60, algorithm="fixed_window")
    opts = {"sync_interval": None, "clock": clock, "time_source": "client", "timeout": 1.0,
            "cold_allowance": 1}
    a, b, c, d = (HybridStore(redis_url, **opts) for _ in range(4))  # type: ignore[arg-type]
    direct = _store(redis_url, clock)
    try:
        for m in (a, b, c, d):
            m.sync()
        for m in (a, b, c, d):
            assert m.hit("k", rule).allowed
        for m in (a, b, c, d):
            m.sync()  # a: created; b, c, d: present, 1 used
        assert a._b.native_new == 1
        assert sum(m._b.native_present for m in (b, c, d)) == 3
        owe = [m._b.owe_keys for m in (b, c, d)]
        for m in (b, c, d):
            m.sync()  # APPENDs: 2, 3, then 4 of 4
        assert [m._b.native_appends for m in (b, c, d)] == [1, 1, 1]
        assert [m._b.owe_keys for m in (b, c, d)] == owe  # none in the scripts
        assert direct.peek("k", rule).remaining == 0
        assert (_raw(direct, "k", rule) or b"").count(b";") == 3
        assert [bool(m._b._pending) for m in (b, c, d)] == [False, False, True]
        assert not d.hit("k", rule).allowed  # its reply said so: denied in memory
        a.sync()
        assert a._board.get(a._b.board_id("k", rule)) is None  # not posted yet
        d.sync()  # posts it
        assert d._b.posts == 1
        a.sync()
        assert a._board.get(a._b.board_id("k", rule)) is not None
        trips = a.stats()["backend_round_trips"]
        assert not a.hit("k", rule).allowed
        assert a.stats()["backend_round_trips"] == trips  # denied in memory
    finally:
        for m in (a, b, c, d):
            m.close()
        direct.close()


def test_appends_on_a_cluster_are_one_round_trip_per_master_and_wait_for_no_board(
        cluster_url: str) -> None:
    """On a 3-master cluster the APPENDs of 300 keys present, in every slot, travel in
    the round's one pipeline per master; a cluster has no board, so a key they exhaust
    waits for no post."""
    clock = _clock()
    rule = Rule(4, 60, algorithm="fixed_window")
    a = HybridStore(cluster_url, sync_interval=None, clock=clock, time_source="client",
                    timeout=1.0, cold_allowance=1)
    b = HybridStore(cluster_url, sync_interval=None, clock=clock, time_source="client",
                    timeout=1.0, cold_allowance=1)
    try:
        for m in (a, b):
            m.sync()
        keys = [f"user:{k}" for k in range(300)]
        for m in (a, b):
            for k in keys:
                assert m.hit(k, rule).allowed
        a.sync()  # every key created
        b.sync()  # every key present, 1 used: 2 left after b's unit, half the limit
        assert b._b.native_present == 300
        round_ = b.sync()
        assert b._b.native_appends == 300
        assert round_["failed"] == 0
        assert round_["round_trips"] == 3
        assert not b._b._pending
        for k in keys:
            assert a.backend.peek(k, rule).remaining == 2
        (g,), _ = b._b.sync_many([(keys[0], rule, 2, FORCED_PRESENT)], None, 0)
        assert not isinstance(g, BaseException)
        assert g[1] == 0  # these units exhausted it
        assert b._b.native_appends == 301
        assert not b._b._pending  # no board to post it to
    finally:
        a.close()
        b.close()
