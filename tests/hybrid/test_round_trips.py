"""What a fleet's checks cost the backend on the request path: round trips outside the sync
rounds, on FakeClock fleets of HybridStores over one MemoryStore (the behaviours that keep
the 500-server simulation's Redis time down), with the admissions still exact."""

from __future__ import annotations

from stormguard import HybridStore, MemoryStore, Rule
from stormguard.testing import FakeClock


def fleet(clock: FakeClock, n: int, allowance: int = 0,
          backend: MemoryStore | None = None) -> tuple[MemoryStore, list[HybridStore]]:
    backend = backend if backend is not None else MemoryStore(clock=clock)
    members = [HybridStore(backend, sync_interval=None, clock=clock, deny_hold=0.1,
                           cold_allowance=allowance) for _ in range(n)]
    for m in members:
        m.sync()  # each counts itself in
    return backend, members


def trips(m: HybridStore) -> int:
    return int(m.stats()["backend_round_trips"])


def at_window_start(clock: FakeClock, window: float = 1.0) -> None:
    clock.set_wall((clock.wall() // window + 1) * window + 0.001)


def test_a_busy_key_near_its_limit_is_leased_its_demand_not_a_sliver(
        clock: FakeClock) -> None:
    """20 processes counted; one busy process (25 checks a round) on a key the others
    have nearly emptied: its round's lease covers its round (remaining / 20 would be 10:
    a round trip on the request path every 10 checks)."""
    at_window_start(clock)
    backend, members = fleet(clock, 20)
    rule = Rule(1000, 1, algorithm="fixed_window")
    busy = members[0]
    for _ in range(2):  # two rounds of 25 checks: its rate is known
        for _ in range(25):
            assert busy.hit("api", rule).allowed
            clock.advance(0.004)
        busy.sync()
    left = backend.peek("api", rule).remaining
    assert backend.hit("api", rule, left - 200 - busy.stats()["lease_held"]).allowed
    asked = 0
    for _ in range(4):  # rounds of 25 checks from what is left: about 200
        before = trips(busy)
        admitted = 0
        for _ in range(25):
            admitted += busy.hit("api", rule).allowed
            clock.advance(0.004)
        assert admitted == 25
        asked += trips(busy) - before
        busy.sync()
    assert asked == 0  # every check on the round's lease, none on the request path
    assert backend.peek("api", rule).remaining >= 0


def test_a_process_alone_on_a_key_leases_ahead_within_its_first_window(
        clock: FakeClock) -> None:
    """A key that reaches one process only (a sticky balancer), 20 processes counted: once
    a reply shows that the units taken from this window's counter are all its own, its
    share is all that is left, not remaining / 20 (0 for a limit of 10)."""
    at_window_start(clock)
    _, members = fleet(clock, 20, allowance=1)
    rule = Rule(10, 1, algorithm="fixed_window")
    p = members[0]
    asked = admitted = 0
    for i in range(8):  # 8 checks in the window: 2 per round
        before = trips(p)
        admitted += p.hit("user", rule).allowed
        asked += trips(p) - before
        clock.advance(0.05)
        if i % 2 == 1:
            p.sync()
    assert admitted == 8
    # the allowance, then one lease of one unit on the request path, then leases sized
    # by its demand in the rounds (remaining / 20 would be 0: one lease per check)
    assert asked == 1


def test_a_key_unseen_for_a_round_is_cold_again(clock: FakeClock) -> None:
    """A key seen twice in one round, then once a window: after a round without a check it
    is admitted on the allowance again (charged at the next round), not leased on the
    request path at each check."""
    at_window_start(clock)
    backend, members = fleet(clock, 20, allowance=1)
    rule = Rule(10, 1, algorithm="fixed_window")
    p = members[0]
    assert p.hit("user", rule).allowed
    assert p.hit("user", rule).allowed  # busy in this round
    p.sync()
    for _ in range(4):  # then one check a window
        clock.advance(1.0)
        p.sync()
        before, cold = trips(p), p.stats()["cold_admitted"]
        assert p.hit("user", rule).allowed
        assert trips(p) == before
        assert p.stats()["cold_admitted"] == cold + 1
        clock.advance(0.1)
        p.sync()  # charged
        assert backend.peek("user", rule).remaining == 9


def test_a_leased_key_on_the_board_is_denied_without_a_round_trip(clock: FakeClock) -> None:
    """A process leasing a key reads on the board that another exhausted it: when its lease
    runs out it denies in memory until the key frees, instead of asking (and being denied)."""
    at_window_start(clock)
    backend, (a, b, *_) = fleet(clock, 4, allowance=1)
    rule = Rule(100, 1, algorithm="fixed_window")
    for _ in range(3):
        for _ in range(10):
            assert a.hit("bot", rule).allowed
            clock.advance(0.01)
        a.sync()
    # b takes what is left (a lease on the request path each time its lease runs out)
    while b.hit("bot", rule).allowed:
        pass
    b.sync()  # the lease that took the last unit is on the board
    a.sync()  # a reads it
    before = trips(a)
    results = [a.hit("bot", rule).allowed for _ in range(a.stats()["lease_held"] + 20)]
    assert results.count(False) == 20
    assert not any(results[-20:])
    assert trips(a) == before  # the lease spent, then denied in memory
    assert backend.peek("bot", rule).remaining == 0
    clock.advance(1.0)  # the next window: asked again
    assert a.hit("bot", rule).allowed
    assert trips(a) == before + 1


def test_a_key_emptied_in_the_last_window_is_leased_at_the_first_round_of_the_next(
        clock: FakeClock) -> None:
    """A busy key whose last reply said 0 left (the window was emptied): the first round of
    the next window leases its demand from the new quota (remaining 0 / processes would
    lease nothing, and every check would ask on the request path)."""
    at_window_start(clock)
    backend, members = fleet(clock, 20)
    rule = Rule(100, 1, algorithm="fixed_window")
    busy = members[0]
    for _ in range(3):
        for _ in range(20):
            busy.hit("api", rule)
            clock.advance(0.005)
        busy.sync()
    backend.hit("api", rule, backend.peek("api", rule).remaining)  # the others empty it
    while busy.hit("api", rule).allowed:  # its lease spent; then a reply: 0 left
        clock.advance(0.001)
    for _ in range(20):  # denied in memory: still its demand
        assert not busy.hit("api", rule).allowed
        clock.advance(0.001)
    at_window_start(clock)
    busy.sync()  # the first round of the new window
    assert busy.stats()["lease_held"] >= 20
    before = trips(busy)
    assert all(busy.hit("api", rule).allowed for _ in range(20))
    assert trips(busy) == before


def test_a_process_that_finds_none_of_its_keys_on_the_board_reads_it_less_often(
        clock: FakeClock) -> None:
    """Behind a sticky balancer the board lists keys other processes exhausted, which this
    one never sees: once it has read 256 entries in vain it reads every 4th round (the
    entries of the rounds between are skipped), and every round again once a check
    finds news there."""
    at_window_start(clock, 60.0)
    _, (p, q) = fleet(clock, 2, allowance=1)
    rule = Rule(1, 60, algorithm="fixed_window")
    for i in range(300):  # q's own keys, each exhausted by its allowance's charge
        assert q.hit(f"q{i}", rule).allowed
    q.sync()  # 300 posts
    p.sync()
    assert p.stats()["board_entries"] == 300
    read = []
    for i in range(8):  # one more exhausted key of q's per round
        assert q.hit(f"r{i}", rule).allowed
        q.sync()
        p.sync()
        read.append(p.stats()["board_entries"])
    # rounds 1-3 read nothing (their entries are skipped), the 4th its round's entry
    assert read == [300, 300, 300, 301, 301, 301, 301, 302]
    assert not p.hit("r7", rule).allowed  # q's key, from the board: news
    assert q.hit("s", rule).allowed
    q.sync()
    p.sync()
    assert p.stats()["board_entries"] == 303  # read at the next round
    # q reads less often too (none of its checks found its key on the board), but posts
    # every round: p read the entries of its reading rounds


def test_an_allowance_charge_that_finds_its_key_exhausted_is_news(clock: FakeClock) -> None:
    """A process reading the board every 4th round that admits a key on its allowance and
    hears from the charge's reply that the key was exhausted (an entry it skipped) reads
    the board every round again."""
    at_window_start(clock, 60.0)
    _, (p, q) = fleet(clock, 2, allowance=1)
    rule = Rule(1, 60, algorithm="fixed_window")
    for i in range(300):
        assert q.hit(f"q{i}", rule).allowed
    q.sync()
    p.sync()  # 300 entries read in vain: every 4th round from now on
    assert q.hit("spread", rule).allowed
    q.sync()  # exhausted: posted
    p.sync()  # skipped
    assert p.hit("spread", rule).allowed  # on its allowance: it did not read the entry
    p.sync()  # the charge's reply: exhausted
    read = p.stats()["board_entries"]
    assert q.hit("t", rule).allowed
    q.sync()
    p.sync()
    assert p.stats()["board_entries"] == read + 1  # read at once
    assert not p.hit("t", rule).allowed  # denied from the board, no allowance


def test_its_own_exhausted_keys_on_the_board_are_no_news_to_a_process(
        clock: FakeClock) -> None:
    """A key this process exhausted itself (its own last reply said so) is on the board
    too: finding it there is no news, and the board is still read every 4th round."""
    at_window_start(clock, 60.0)
    _, (p, q) = fleet(clock, 2, allowance=1)
    rule = Rule(1, 60, algorithm="fixed_window")
    for i in range(300):
        assert q.hit(f"q{i}", rule).allowed
    q.sync()
    p.sync()  # 300 entries read in vain
    mine = Rule(3, 60, algorithm="fixed_window")
    assert p.hit("mine", mine).allowed  # the allowance
    p.sync()  # charged: 1 of 3 (p reads less often from now on)
    assert p.hit("mine", mine).allowed
    assert p.hit("mine", mine).allowed  # a lease takes the last unit: its reply says 0
    p.sync()
    p.sync()
    p.sync()  # the 4th round: reads its own entry
    assert not p.hit("mine", mine).allowed  # denied: the board and its own reply agree
    read = p.stats()["board_entries"]
    for i in range(3):
        assert q.hit(f"r{i}", rule).allowed
        q.sync()
        p.sync()
    assert p.stats()["board_entries"] == read  # still every 4th round


def test_a_key_it_exhausted_itself_is_exact_in_the_next_windows_without_the_board(
        clock: FakeClock) -> None:
    """A process that skips the board's entries (behind a sticky balancer) and exhausts its
    own key: its own reply marks the key as the board would, so the next windows admit
    exactly the limit (no allowance), not the limit plus its allowance each window."""
    at_window_start(clock, 60.0)
    _, (p, q) = fleet(clock, 2, allowance=1)
    rule = Rule(1, 60, algorithm="fixed_window")
    for i in range(300):
        assert q.hit(f"q{i}", rule).allowed
    q.sync()
    p.sync()  # 300 entries read in vain: p skips the board from now on
    own = Rule(3, 1, algorithm="fixed_window")
    per_window = []
    for _ in range(4):
        at_window_start(clock)
        admitted = 0
        for _ in range(4):  # a burst at the start of the window: exhausted
            admitted += p.hit("own", own).allowed
            clock.advance(0.001)
        for _ in range(9):  # then idle rounds (it reads every 4th: never its own post)
            clock.advance(0.1)
            p.sync()
        per_window.append(admitted)
    assert per_window[0] <= 3 + 1  # the limit and its allowance, once
    assert per_window[1:] == [3, 3, 3]
