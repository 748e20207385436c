"""The board on a real Redis (lease.lua): one string of entries, read as one bulk reply
from a byte offset. What each reader gets, whatever it last read: the new entries, whole
and in order; at most its capacity's, the newest; the whole string after a first sync, a
lost board or a reader left behind by the string's trim; keys whose text holds any
character (a rule name with a newline, a space)."""

from __future__ import annotations

import redis

from stormguard import RedisStore, Rule
from stormguard.stores.hybrid.backend import FORCED, RedisBackend


def _backend(url: str, prefix: str = "sg") -> RedisBackend:
    b = RedisBackend(RedisStore(url, timeout=5.0, prefix=prefix))
    b.native = False  # every forced add through the script: each one that exhausts posts
    return b


def _exhaust(b: RedisBackend, keys: list[str], rule: Rule, since: int, cap: int = 4096
             ) -> tuple[int, list[tuple[int, str]]]:
    """One round: a forced add on each key (limit 1: each goes on the board), reading
    the board from ``since``."""
    read = b.sync_many([(k, rule, 1, FORCED) for k in keys], since, cap)[1]
    assert read is not None
    return read


BIG = Rule(10**6, 60, algorithm="fixed_window")


def _read(b: RedisBackend, since: int, cap: int = 4096) -> tuple[int, list[tuple[int, str]]]:
    """A round that only reads the board (a lease of nothing on a key of its own)."""
    read = b.sync_many([("reader", BIG, 0, 0)], since, cap)[1]
    assert read is not None
    return read


def _ids(b: RedisBackend, keys: list[str], rule: Rule) -> list[str]:
    return [b.board_id(k, rule) for k in keys]


def test_each_reader_gets_the_entries_since_its_last_read_in_order(redis_url: str) -> None:
    writer, reader = _backend(redis_url), _backend(redis_url)
    rule = Rule(1, 60, algorithm="fixed_window")
    try:
        seq, first = _exhaust(writer, ["a", "b"], rule, -1)
        assert [bid for _, bid in first] == _ids(writer, ["a", "b"], rule)
        rseq, got = _read(reader, -1)  # a first sync: the whole board
        assert rseq == seq
        assert [bid for _, bid in got] == _ids(writer, ["a", "b"], rule)
        assert all(until > 0 for until, _ in got)
        seq2, mine = _exhaust(writer, ["c"], rule, seq)  # the writer: only what is new
        assert [bid for _, bid in mine] == _ids(writer, ["c"], rule)
        _, more = _exhaust(writer, ["d", "e"], rule, seq2)
        assert [bid for _, bid in more] == _ids(writer, ["d", "e"], rule)
        end, caught_up = _read(reader, rseq)
        assert [bid for _, bid in caught_up] == _ids(writer, ["c", "d", "e"], rule)
        assert _read(reader, end) == (end, [])  # nothing new
        assert end > rseq
    finally:
        writer.redis.close()
        reader.redis.close()


def test_a_capacity_keeps_the_newest_entries_whole(redis_url: str) -> None:
    writer, reader = _backend(redis_url), _backend(redis_url)
    rule = Rule(1, 60, algorithm="fixed_window")
    keys = [f"k{i}" for i in range(300)]
    try:
        _exhaust(writer, keys, rule, -1)
        for cap in (1, 7, 64):
            _, got = _read(reader, -1, cap=cap)
            assert [bid for _, bid in got] == _ids(writer, keys[-cap:], rule)
    finally:
        writer.redis.close()
        reader.redis.close()


def test_any_text_in_a_key_round_trips(redis_url: str) -> None:
    """Byte 255 ends an entry: it is never part of UTF-8 text, so a rule name or prefix
    with a newline, a space or any character cannot split one."""
    b = _backend(redis_url, prefix="sg one\nprefix")
    rules = [Rule(1, 60, algorithm="fixed_window", name="two\nlines and spaces \u00ff"),
             Rule(1, 60, algorithm="fixed_window", name="\U0001f511 key")]
    try:
        got: list[str] = []
        for rule in rules:
            got += [bid for _, bid in _exhaust(b, ["x", "y z"], rule, -1)[1]]
        expected = [b.board_id(k, r) for r in rules for k in ("x", "y z")]
        # the second round read the first round's entries too (since -1: a first sync)
        assert got[-4:] == expected
        assert all("\n" in bid or "\U0001f511" in bid for bid in expected)
    finally:
        b.redis.close()


def test_a_lost_board_and_a_reader_left_behind_read_the_whole_string(redis_url: str
                                                                    ) -> None:
    writer, reader = _backend(redis_url), _backend(redis_url)
    rule = Rule(1, 60, algorithm="fixed_window")
    client = redis.Redis.from_url(redis_url)
    try:
        seq, _ = _exhaust(writer, ["a", "b", "c"], rule, -1)
        client.flushall()  # the server lost the board (a restart without persistence)
        _, got = _exhaust(reader, ["d"], rule, seq)  # its last offset is past the new end
        assert [bid for _, bid in got] == _ids(reader, ["d"], rule)
        # past the string's most (1 MiB) it keeps its last 512 KiB from an entry's start:
        # a reader whose offset fell off the front reads all that is kept, whole entries
        start = _read(reader, -1)[0]
        keys = [f"fill-{i:06d}" for i in range(20_000)]
        for i in range(0, len(keys), 500):
            _exhaust(writer, keys[i:i + 500], rule, 0, cap=0)  # posts only
        size = client.strlen("sg:hybrid.log")
        assert 400_000 < size <= 1_048_576
        assert _read(reader, -1)[0] - start > 1_048_576  # more than the string holds
        _, kept = _read(reader, start, cap=60_000)
        ids = [bid for _, bid in kept]
        assert ids == _ids(writer, keys[-len(ids):], rule)  # the newest, in order, whole
        assert len(ids) * 80 < size  # every byte kept was read
    finally:
        writer.redis.close()
        reader.redis.close()
        client.close()
