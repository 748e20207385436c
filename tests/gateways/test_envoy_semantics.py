"""envoyproxy/ratelimit's configuration examples (tests/gateways/envoy_configs/, written
here after its README) loaded unchanged, and Envoy's semantics over a real MemoryStore on
virtual time: nested descriptors, key-only and wildcard values, replaces, unlimited, shadow
mode, requests_per_unit 0, hits_addend, the limit override, all or nothing."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import AsyncRateLimiter, MemoryStore
from stormguard.gateways import (
    EnvoyChecker,
    EnvoyConfigError,
    ShadowOverLimit,
    UnknownDescriptor,
    load_envoy_config,
    loads_envoy_config,
)
from stormguard.gateways.rls import OK, OVER_LIMIT, RULES_DOMAIN, UNLIMITED_REMAINING
from stormguard.observability.events import Event
from stormguard.ratelimit.rules import RuleSet
from stormguard.testing import FakeClock

CONFIGS = Path(__file__).parent / "envoy_configs"
Entries = list[tuple[str, str]]


def _checker(clock: FakeClock, rules: RuleSet | None = None) -> EnvoyChecker:
    limiter = AsyncRateLimiter(MemoryStore(clock=clock))
    return EnvoyChecker(limiter, load_envoy_config(CONFIGS), rules)


async def _codes(c: EnvoyChecker, domain: str, entries: Entries, n: int,
                 hits: int = 0) -> list[int]:
    return [(await c.check(domain, [(entries, 0)], hits)).code for _ in range(n)]


def test_every_readme_example_loads() -> None:
    config = load_envoy_config(CONFIGS)
    assert sorted(config.domains) == ["api", "edge_proxy_per_ip", "example_replaces",
                                      "internal", "messaging", "mongo_cps", "rl",
                                      "shadow_messaging"]
    assert len(config.files) == 8
    limits = {lim.path: lim for lim in config.limits()}
    mongo = limits["mongo_cps.database_users"]
    assert (mongo.requests_per_unit, mongo.unit, mongo.unit_code) == (500, "second", 1)
    assert mongo.rule is not None
    assert mongo.rule.algorithm == "fixed_window"
    assert limits["internal.ldap"].unlimited
    assert limits["internal.ldap"].rule is None
    assert limits["edge_proxy_per_ip.remote_address_50.0.0.5"].blocked


async def test_nested_descriptors_and_key_only_values() -> None:
    clock = FakeClock()
    c = _checker(clock)
    marketing = [("message_type", "marketing"), ("to_number", "2061111111")]
    assert await _codes(c, "messaging", marketing, 6) == [OK] * 5 + [OVER_LIMIT]
    # key-only: every phone number has its own counter
    other = [("message_type", "marketing"), ("to_number", "2062222222")]
    assert await _codes(c, "messaging", other, 1) == [OK]
    # the top-level key-only descriptor is another limit (100 a day)
    r = await c.check("messaging", [([("to_number", "2061111111")], 0)])
    st0 = r.statuses[0]
    assert (r.code, st0.limit.requests_per_unit, st0.remaining) == (OK, 100, 99)
    # a descriptor deeper than the configuration matches nothing
    r = await c.check("messaging", [([*marketing, ("extra", "x")], 0)])
    assert (r.code, r.statuses[0].kind, r.statuses[0].limit) == (OK, "unknown", None)
    # the window is a day, epoch aligned: the next day starts afresh
    clock.advance(86_400)
    assert await _codes(c, "messaging", marketing, 1) == [OK]


async def test_two_levels_and_reset_duration() -> None:
    clock = FakeClock(start=1_700_000_080.0)  # 40 s into a minute
    c = _checker(clock)
    bar = [("source_cluster", "proxy"), ("destination_cluster", "bar")]
    foo = [("source_cluster", "proxy"), ("destination_cluster", "foo")]
    assert await _codes(c, "rl", bar, 11) == [OK] * 10 + [OVER_LIMIT]
    r = await c.check("rl", [(foo, 0)])
    assert (r.code, r.statuses[0].limit.requests_per_unit, r.statuses[0].remaining) == \
        (OK, 20, 19)
    assert r.statuses[0].reset_after == pytest.approx(20.0)
    r = await c.check("rl", [(bar, 0)])
    assert r.code == OVER_LIMIT
    assert r.statuses[0].reset_after == pytest.approx(20.0)
    # only the source level: no limit there
    r = await c.check("rl", [([("source_cluster", "proxy")], 0)])
    assert (r.code, r.statuses[0].kind) == (OK, "unknown")


async def test_blocked_address_and_per_address_counters() -> None:
    c = _checker(FakeClock())
    assert await _codes(c, "edge_proxy_per_ip", [("remote_address", "50.0.0.5")], 2) == \
        [OVER_LIMIT] * 2
    assert await _codes(c, "edge_proxy_per_ip", [("remote_address", "10.0.0.1")], 11) == \
        [OK] * 10 + [OVER_LIMIT]
    assert await _codes(c, "edge_proxy_per_ip", [("remote_address", "10.0.0.2")], 1) == [OK]


async def test_wildcards_trailing_and_inside_the_value() -> None:
    c = _checker(FakeClock())
    # exact first: /foo/bar has its own limit of 10
    r = await c.check("internal", [([("path", "/foo/bar")], 0)])
    assert r.statuses[0].limit.requests_per_unit == 10
    # trailing wildcard: /foo, /foo/x, /foobar share the prefix; each path counts apart
    for path in ("/foo", "/foo/x", "/foobar"):
        r = await c.check("internal", [([("path", path)], 0)])
        assert (r.statuses[0].limit.requests_per_unit, r.statuses[0].remaining) == (20, 19)
    # inside the value
    assert await _codes(c, "internal", [("path", "/users/7/posts")], 4) == [OK] * 3 + \
        [OVER_LIMIT]
    r = await c.check("internal", [([("path", "/users/7/comments")], 0)])
    assert r.statuses[0].kind == "unknown"
    r = await c.check("internal", [([("path", "/users//posts")], 0)])  # * matches empty
    assert r.statuses[0].limit.requests_per_unit == 3


async def test_unlimited_and_unknown() -> None:
    events: list[Event] = []
    c = _checker(FakeClock())
    c.add_listener(events.append)
    r = await c.check("internal", [([("ldap", "anything")], 0)] * 3)
    assert r.code == OK
    assert [(s.kind, s.remaining) for s in r.statuses] == [("unlimited",
                                                            UNLIMITED_REMAINING)] * 3
    r = await c.check("no-such-domain", [([("a", "b")], 0)])
    assert (r.code, r.statuses[0].kind) == (OK, "unknown")
    assert [type(e) for e in events] == [UnknownDescriptor]
    assert events[0].policy == "no-such-domain"
    assert c.metrics.descriptors[("(unknown)", "unknown")] == 1
    assert c.metrics.descriptors[("internal", "unlimited")] == 3


async def test_shadow_mode_counts_and_never_denies() -> None:
    events: list[Event] = []
    c = _checker(FakeClock())
    c.add_listener(events.append)
    entries = [("message_type", "marketing"), ("to_number", "1")]
    results = [await c.check("shadow_messaging", [(entries, 0)]) for _ in range(7)]
    assert [r.code for r in results] == [OK] * 7
    assert [r.statuses[0].kind for r in results] == ["ok"] * 5 + ["shadow_over_limit"] * 2
    assert [r.statuses[0].remaining for r in results[:5]] == [4, 3, 2, 1, 0]
    assert c.metrics.descriptors[("shadow_messaging", "shadow_over_limit")] == 2
    assert [type(e) for e in events] == [ShadowOverLimit] * 2
    # the headers tell the client it passed (no Retry-After)
    assert "Retry-After" not in results[-1].headers()


async def test_replaces_drops_the_named_limit() -> None:
    c = _checker(FakeClock())
    specific = [("key1", "value1"), ("subkey1", "x")]
    general = [("key2", "y")]
    # alone, the general limit (1 a minute, named fake_name) applies
    assert await _codes(c, "example_replaces", general, 2) == [OK, OVER_LIMIT]
    # with the specific one (which replaces fake_name) in the same request: dropped
    r = await c.check("example_replaces", [(specific, 0), (general, 0)])
    assert r.code == OK
    assert [s.kind for s in r.statuses] == ["ok", "replaced"]
    assert r.statuses[0].limit.name == "bkthomps"


async def test_hits_addend_request_and_descriptor() -> None:
    c = _checker(FakeClock())
    entries = [("database", "users")]
    r = await c.check("mongo_cps", [(entries, 0)], hits_addend=0)  # 0 means 1
    assert r.statuses[0].remaining == 499
    r = await c.check("mongo_cps", [(entries, 0)], hits_addend=99)
    assert r.statuses[0].remaining == 400
    r = await c.check("mongo_cps", [(entries, 300)], hits_addend=99)  # the descriptor's
    assert r.statuses[0].remaining == 100
    r = await c.check("mongo_cps", [(entries, 0)], hits_addend=101)
    assert (r.code, r.statuses[0].remaining) == (OVER_LIMIT, 100)  # nothing consumed
    r = await c.check("mongo_cps", [(entries, 0)], hits_addend=10_000)  # above capacity
    assert r.code == OVER_LIMIT
    assert (await c.check("mongo_cps", [(entries, 100)])).code == OK


async def test_all_or_nothing_across_descriptors() -> None:
    c = _checker(FakeClock())
    a = [("database", "users")]
    b = [("database", "default")]
    assert (await c.check("mongo_cps", [(b, 500)])).code == OK  # b is spent
    r = await c.check("mongo_cps", [(a, 0), (b, 0)])
    assert r.code == OVER_LIMIT
    assert [s.code for s in r.statuses] == [OK, OVER_LIMIT]
    # a was only peeked: its quota is whole
    r = await c.check("mongo_cps", [(a, 0)])
    assert r.statuses[0].remaining == 499


async def test_limit_override() -> None:
    c = _checker(FakeClock())
    entries = [("database", "users")]
    codes = [(await c.check("mongo_cps", [(entries, 0)], 0, [(2, 2)])).code for _ in range(3)]
    assert codes == [OK, OK, OVER_LIMIT]
    # the configured 500/s counter was not touched
    assert (await c.check("mongo_cps", [(entries, 0)])).statuses[0].remaining == 499


async def test_stormguard_extension_algorithms() -> None:
    clock = FakeClock(start=1_700_000_099.0)  # one second before a minute boundary
    c = _checker(clock)
    key = [("api_key", "k1")]
    assert await _codes(c, "api", key, 60) == [OK] * 60
    clock.advance(2)  # a fixed window would start afresh (60 more); the sliding counter
    # still weighs the last minute's 60 hits at 59/60: one more fits, not 60
    assert await _codes(c, "api", key, 3) == [OK, OVER_LIMIT, OVER_LIMIT]
    tenant = [("tenant", "t1")]
    assert await _codes(c, "api", tenant, 21) == [OK] * 20 + [OVER_LIMIT]  # burst 20
    clock.advance(0.1)  # a token bucket refills 10/s: one token
    assert await _codes(c, "api", tenant, 2) == [OK, OVER_LIMIT]


async def test_the_stormguard_domain_uses_the_service_rules() -> None:
    rules = RuleSet.from_data([{"name": "per-user", "scope": "user", "limit": 2,
                                "window": 60}])
    c = _checker(FakeClock(), rules)
    user = [("user", "alice")]
    assert await _codes(c, RULES_DOMAIN, user, 3) == [OK, OK, OVER_LIMIT]
    assert await _codes(c, RULES_DOMAIN, [("user", "bob")], 1) == [OK]
    r = await c.check(RULES_DOMAIN, [([("unknown_key", "x")], 0)])
    assert (r.code, r.statuses[0].kind) == (OK, "unknown")


BAD = [
    ("descriptors:\n  - key: a\n", "<string>: domain: is required and must not be empty"),
    ("domain: d\ndescriptors:\n  - value: x\n",
     "descriptors[0].key: is required"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: minutes\n"
     "      requests_per_unit: 5\n",
     "descriptors[0] (key 'a').rate_limit.unit: invalid unit 'minutes'"),
    ("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n"
     "        rate_limit:\n          unit: second\n          requests_per_unit: lots\n",
     "descriptors[0].descriptors[0] (key 'b').rate_limit.requests_per_unit: must be an "
     "integer"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n"
     "      unit: second\n", "rate_limit.unit: must not be given when unlimited"),
    ("domain: d\ndescriptors:\n  - key: a\n    value: v\n  - key: a\n    value: v\n",
     "descriptors[1] (key 'a', value 'v').key: duplicate descriptor 'd.a_v'"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: n\n      unit: second\n"
     "      requests_per_unit: 1\n      replaces:\n        - name: n\n",
     "rate_limit.replaces[0].name: a limit cannot replace itself"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limt:\n      unit: second\n",
     "descriptors[0].rate_limt: unknown key"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n"
     "      requests_per_unit: 5\n      algorithm: magic\n",
     "rate_limit.algorithm: unknown algorithm 'magic'"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n"
     "      requests_per_unit: 5\n      algorithm: fixed_window\n      burst: 9\n",
     "rate_limit.burst: fixed_window has no burst"),
    ("domain: d\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n",
     "shadow_mode: must be true or false"),
    ("domain: [d\n", "not valid YAML: line"),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m[:30] for _, m in BAD])
def test_invalid_configuration_names_file_path_and_field(text: str, message: str) -> None:
    with pytest.raises(EnvoyConfigError) as info:
        loads_envoy_config(text)
    assert str(info.value).startswith("<string>: ")
    assert message in str(info.value)


def test_directory_errors(tmp_path: Path) -> None:
    with pytest.raises(EnvoyConfigError, match=r"no \*\.yaml"):
        load_envoy_config(tmp_path)
    (tmp_path / "a.yaml").write_text("domain: d\n")
    (tmp_path / "b.yml").write_text("domain: d\n")
    with pytest.raises(EnvoyConfigError, match=r"b\.yml: domain: duplicate domain 'd'"):
        load_envoy_config(tmp_path)
    with pytest.raises(EnvoyConfigError, match="no such file"):
        load_envoy_config(tmp_path / "missing")


def test_scalars_are_read_as_go_reads_them() -> None:
    # value: 10 / value: true are the strings "10" / "true" (yaml.v2 into a string field)
    config = loads_envoy_config("domain: d\ndescriptors:\n  - key: n\n    value: 10\n"
                                "    rate_limit: {unit: SECOND, requests_per_unit: '3'}\n"
                                "  - key: b\n    value: true\n    shadow_mode: yes\n"
                                "    rate_limit: {unit: hour, requests_per_unit: 1}\n")
    lim = config.lookup("d", [("n", "10")])
    assert lim is not None
    assert (lim.unit, lim.requests_per_unit) == ("second", 3)
    lim = config.lookup("d", [("b", "true")])
    assert lim is not None
    assert lim.shadow


_ALPHABET = st.sampled_from("ab*/")


@settings(max_examples=300, deadline=None)
@given(pattern=st.text(_ALPHABET, min_size=1, max_size=6),
       value=st.text(st.sampled_from("ab/"), max_size=8))
def test_wildcard_matches_like_a_glob(pattern: str, value: str) -> None:
    """A value with ``*`` matches exactly the values the glob (``*`` = any run) does;
    one without matches only itself."""
    config = loads_envoy_config(f"domain: d\ndescriptors:\n  - key: k\n    value: '{pattern}'\n"
                                "    rate_limit: {unit: second, requests_per_unit: 1}\n")
    expected = re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), value) is not None
    assert (config.lookup("d", [("k", value)]) is not None) == expected



_REQUEST = st.lists(st.tuples(st.sampled_from(["users", "default"]),
                              st.integers(min_value=0, max_value=260)),
                    min_size=1, max_size=3)


@settings(max_examples=60, deadline=None)
@given(requests=st.lists(_REQUEST, min_size=1, max_size=25))
def test_all_or_nothing_against_a_model(requests: list[list[tuple[str, int]]]) -> None:
    """Random multi-descriptor requests on two 500-a-second counters, in one window: a
    request passes exactly when every counter has room for its whole cost (a descriptor
    repeated in a request counts as often as it appears), and a denied request charges
    nothing at all."""
    c = _checker(FakeClock(start=1_700_000_040.0))
    used = {"users": 0, "default": 0}

    async def run() -> None:
        for req in requests:
            result = await c.check("mongo_cps", [([("database", db)], hits)
                                                 for db, hits in req])
            want: dict[str, int] = {}
            for db, hits in req:
                want[db] = want.get(db, 0) + (hits or 1)
            fits = all(used[db] + n <= 500 for db, n in want.items())
            assert result.code == (OK if fits else OVER_LIMIT), (req, used)
            if fits:
                for db, n in want.items():
                    used[db] += n
            for st_, (db, _) in zip(result.statuses, req, strict=True):
                if fits:
                    assert st_.remaining == 500 - used[db]

    asyncio.run(run())


_TEXT = st.text(st.characters(codec="utf-8"), max_size=6)


@settings(max_examples=300, deadline=None)
@given(a=st.tuples(_TEXT, st.lists(st.tuples(_TEXT, _TEXT), max_size=3)),
       b=st.tuples(_TEXT, st.lists(st.tuples(_TEXT, _TEXT), max_size=3)))
def test_counter_keys_never_collide(a: tuple[str, Entries], b: tuple[str, Entries]) -> None:
    """Two different (domain, entries) never share a counter, whatever characters the
    keys and values hold (``:``, ``%``, ``_``, non-ASCII)."""
    from stormguard.gateways.envoy import counter_key

    assert (counter_key(*a) == counter_key(*b)) == (a == b)


def test_a_blocking_limiter_works_too() -> None:
    from stormguard import RateLimiter

    checker = EnvoyChecker(RateLimiter(MemoryStore(clock=FakeClock())),
                           load_envoy_config(CONFIGS))
    bar = [("source_cluster", "proxy"), ("destination_cluster", "bar")]

    async def run() -> list[int]:
        return [(await checker.check("rl", [(bar, 0)])).code for _ in range(11)]

    assert asyncio.run(run()) == [OK] * 10 + [OVER_LIMIT]


async def test_oversized_requests_are_refused() -> None:
    from stormguard import ConfigError

    c = _checker(FakeClock())
    with pytest.raises(ConfigError, match="at most 64 descriptors"):
        await c.check("rl", [([("a", "b")], 0)] * 65)
    with pytest.raises(ConfigError, match="at most 32 entries"):
        await c.check("rl", [([("a", "b")] * 33, 0)])
    with pytest.raises(ConfigError, match="at most 4096 characters"):
        await c.check("rl", [([("a", "x" * 4096)], 0)])
    # a cost no window could ever admit: over the limit, nothing consumed
    r = await c.check("mongo_cps", [([("database", "users")], 2**40)])
    assert r.code == OVER_LIMIT
    assert (await c.check("mongo_cps", [([("database", "users")], 0)])).statuses[0].remaining \
        == 499


async def test_a_configured_stormguard_domain_wins_over_the_rules() -> None:
    rules = RuleSet.from_data([{"name": "per-user", "scope": "user", "limit": 1,
                                "window": 60}])
    config = loads_envoy_config("domain: stormguard\ndescriptors:\n  - key: user\n"
                                "    rate_limit: {unit: minute, requests_per_unit: 3}\n")
    c = EnvoyChecker(AsyncRateLimiter(MemoryStore(clock=FakeClock())), config, rules)
    assert await _codes(c, RULES_DOMAIN, [("user", "alice")], 4) == [OK] * 3 + [OVER_LIMIT]


def test_one_file_or_several() -> None:
    one = load_envoy_config(CONFIGS / "rl.yaml")
    assert list(one.domains) == ["rl"]
    two = load_envoy_config([CONFIGS / "rl.yaml", str(CONFIGS / "mongo_cps.yaml")])
    assert sorted(two.domains) == ["mongo_cps", "rl"]


PRECEDENCE = """
domain: p
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1, name: key-only}
  - key: k
    value: "a*"
    rate_limit: {unit: second, requests_per_unit: 2, name: first-wildcard}
  - key: k
    value: "ab*"
    rate_limit: {unit: second, requests_per_unit: 3, name: second-wildcard}
  - key: k
    value: abc
    rate_limit: {unit: second, requests_per_unit: 4, name: exact}
    descriptors:
      - key: sub
        rate_limit: {unit: second, requests_per_unit: 5, name: child}
"""


@pytest.mark.parametrize(("entries", "name"), [
    ([("k", "abc")], "exact"),                   # exact before any wildcard
    ([("k", "abd")], "first-wildcard"),          # wildcards in file order: "a*" first
    ([("k", "zzz")], "key-only"),                # the key alone, any value
    ([("k", "abc"), ("sub", "1")], "child"),     # a node with a limit and children
    ([("k", "zzz"), ("sub", "1")], None),        # key-only node has no children
    ([("k", "abc"), ("sub", "1"), ("x", "y")], None),  # deeper than the configuration
    ([("other", "abc")], None),
    ([], None),
])
def test_lookup_precedence(entries: Entries, name: str | None) -> None:
    lim = loads_envoy_config(PRECEDENCE).lookup("p", entries)
    assert (lim.name if lim is not None else None) == name
