"""Rules as data: loading, validation, matching, keys, grouped checks, shadow rules."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from stormguard import ConfigError, MemoryStore, RateLimiter, Rule
from stormguard.ratelimit.rules import RequestAttrs, RulesError, RuleSet, RuleSpec, check_flow
from stormguard.testing import FakeClock

YAML = """
rules:
  - name: search
    scope: user
    endpoint: "GET /search*"
    limit: 3
    window: 1m
  - name: per-ip
    scope: ip
    limit: 5
    window: 60
  - name: pro-api
    scope: api_key
    tier: pro
    limit: 10
    window: 1s
    algorithm: token_bucket
    burst: 20
  - name: dry
    scope: global
    limit: 1
    window: 60
    shadow: true
"""


@pytest.fixture
def rules() -> RuleSet:
    return RuleSet.loads(YAML)


@pytest.fixture
def limiter(clock: FakeClock) -> RateLimiter:
    return RateLimiter(MemoryStore(clock=clock))


def test_fields_and_conversion_to_rule(rules: RuleSet) -> None:
    search = rules.get("search")
    assert search is not None
    assert search.to_dict() == {
        "name": "search", "scope": "user", "endpoint": "GET /search*", "tier": None,
        "limit": 3, "window": 60, "algorithm": "sliding_window_counter", "burst": None,
        "shadow": False}
    assert search.rule == Rule(3, 60, "sliding_window_counter", name="search")
    pro = rules.get("pro-api")
    assert pro is not None
    assert pro.rule.capacity == 20
    assert pro.window == 1


def test_dumps_round_trips(rules: RuleSet) -> None:
    again = RuleSet.loads(rules.dumps())
    assert again == rules
    assert [r.to_dict() for r in again] == [r.to_dict() for r in rules]


def test_validation_names_rule_field_and_problem() -> None:
    bad = """
- {name: a, scope: usr, limit: -1, window: 1m, foo: 1}
- {name: b, scope: user, limit: 1, window: soon}
- {scope: user, limit: 1, window: 1}
- {name: d, scope: user, limit: 1, window: 1, algorithm: fixed_window, burst: 3}
- {name: e, scope: ip, limit: 1, window: 1, endpoint: "FETCH /x"}
"""
    with pytest.raises(RulesError) as info:
        RuleSet.loads(bad, source="r.yaml")
    got = {(p.rule, p.field) for p in info.value.problems}
    assert got == {("a", "foo"), ("a", "scope"), ("a", "limit"), ("b", "window"),
                   ("#3", "name"), ("d", "burst"), ("e", "endpoint")}
    msg = str(info.value)
    assert msg.startswith("r.yaml: ")
    assert "rule 'a': field 'scope': must be one of" in msg
    assert "rule 'e': field 'endpoint': unknown HTTP method 'FETCH'" in msg
    assert isinstance(info.value, ConfigError)


@pytest.mark.parametrize(("text", "field"), [
    ("- {name: a, scope: ip, limit: 1, window: 1}\n- {name: a, scope: ip, limit: 2, window: 1}",
     "name"),
    ("rules: 5", "rules"),
    ("{rules: [], extra: 1}", "extra"),
    ("rules: [\n  - {", "yaml"),
    ("- {name: 'bad name', scope: ip, limit: 1, window: 1}", "name"),
    ("- {name: a, scope: ip, limit: 1, window: 1, shadow: maybe}", "shadow"),
    ("- {name: a, scope: ip, limit: 1, window: 1, endpoint: search}", "endpoint"),
    ("- {name: a, scope: ip, limit: true, window: 1}", "limit"),
    ("- 7", "rule"),
])
def test_each_kind_of_invalid_input(text: str, field: str) -> None:
    with pytest.raises(RulesError) as info:
        RuleSet.loads(text)
    assert field in {p.field for p in info.value.problems}


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match="cannot read"):
        RuleSet.load(tmp_path / "missing.yaml")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(RulesError, match="cannot read"):
        RuleSet.load(tmp_path / "bin.yaml")


def test_windows_as_durations() -> None:
    rs = RuleSet.from_data([
        {"name": "a", "scope": "ip", "limit": 1, "window": "30s"},
        {"name": "b", "scope": "ip", "limit": 1, "window": "2 hours"},
        {"name": "c", "scope": "ip", "limit": 1, "window": "1.5"},
        {"name": "d", "scope": "ip", "limit": 1, "window": 0.5},
    ])
    assert [r.window for r in rs] == [30, 7200, 1.5, 0.5]


def test_matching_scope_endpoint_tier(rules: RuleSet) -> None:
    def names(**kw: str) -> list[str]:
        return [r.name for r in rules.match(RequestAttrs(**kw))]

    assert names(user="1", method="GET", path="/search/books") == ["search", "dry"]
    assert names(user="1", method="get", path="/search") == ["search", "dry"]
    assert names(user="1", method="POST", path="/search") == ["dry"]
    assert names(method="GET", path="/search") == ["dry"]  # no user: user rule does not apply
    assert names(ip="1.2.3.4", path="/x") == ["per-ip", "dry"]
    assert names(api_key="k", tier="pro") == ["pro-api", "dry"]
    assert names(api_key="k", tier="free") == ["dry"]


def test_endpoint_patterns() -> None:
    def spec(endpoint: str) -> RuleSpec:
        return RuleSpec("r", "global", 1, 1, endpoint=endpoint)

    assert spec("/a/*").matches(RequestAttrs(method="DELETE", path="/a/b"))
    assert spec("* /a/*").matches(RequestAttrs(method="PUT", path="/a/b/c"))
    assert not spec("/a/*").matches(RequestAttrs(method="GET", path="/b"))
    assert spec("POST").matches(RequestAttrs(method="POST", path="/anything"))
    assert not spec("POST").matches(RequestAttrs(method="GET", path="/anything"))
    assert spec("GET /items/?").matches(RequestAttrs(method="GET", path="/items/7"))
    assert not spec("GET /items/?").matches(RequestAttrs(method="GET", path="/items/77"))


def test_keys_per_scope(rules: RuleSet) -> None:
    a = RequestAttrs(user="42", ip="10.0.0.1", api_key="k", tier="pro", method="GET",
                     path="/search")
    assert [(k, r.name) for k, r in rules.plan(a)] == [
        ("user:42", "search"), ("ip:10.0.0.1", "per-ip"), ("api_key:k", "pro-api"),
        ("global", "dry")]


def test_rules_on_one_key_are_all_or_nothing(limiter: RateLimiter) -> None:
    rs = RuleSet.from_data([
        {"name": "burst", "scope": "user", "limit": 2, "window": 1,
         "algorithm": "fixed_window"},
        {"name": "hourly", "scope": "user", "limit": 3, "window": 3600,
         "algorithm": "fixed_window"},
    ])
    a = RequestAttrs(user="u")
    assert [rs.check(limiter, a).allowed for _ in range(3)] == [True, True, False]
    r = rs.check(limiter, a)
    assert r.decision is not None
    assert r.decision.rule is not None
    assert r.decision.rule.name == "burst"
    limiter.store.clock.advance(1.0)  # type: ignore[attr-defined]
    # the hourly rule was charged only for the 2 admitted requests: 1 left
    assert [rs.check(limiter, a).allowed for _ in range(2)] == [True, False]
    r = rs.check(limiter, a)
    assert r.decision is not None
    assert r.decision.rule is not None
    assert r.decision.rule.name == "hourly"


def test_denial_in_another_group_consumes_nothing(limiter: RateLimiter) -> None:
    rs = RuleSet.from_data([
        {"name": "user", "scope": "user", "limit": 10, "window": 60},
        {"name": "ip", "scope": "ip", "limit": 1, "window": 60},
    ])
    assert rs.check(limiter, RequestAttrs(user="u", ip="1.1.1.1")).allowed
    for _ in range(5):
        r = rs.check(limiter, RequestAttrs(user="u", ip="1.1.1.1"))
        assert not r.allowed
        assert r.decision is not None
        assert r.decision.rule is not None
        assert r.decision.rule.name == "ip"
    user_rule = rs.get("user")
    assert user_rule is not None
    assert limiter.peek("user:u", user_rule.rule).remaining == 9  # only the admitted one


def test_shadow_rules_never_block_and_are_reported(limiter: RateLimiter) -> None:
    rs = RuleSet.from_data([
        {"name": "real", "scope": "user", "limit": 3, "window": 60},
        {"name": "dry", "scope": "user", "limit": 1, "window": 60, "shadow": True},
    ])
    results = [rs.check(limiter, RequestAttrs(user="u")) for _ in range(4)]
    assert [r.allowed for r in results] == [True, True, True, False]
    assert [r.shadow_denied for r in results] == [[], ["dry"], ["dry"], []]
    only_shadow = RuleSet.from_data([{"name": "dry", "scope": "ip", "limit": 1, "window": 60,
                                      "shadow": True}])
    r1, r2 = (only_shadow.check(limiter, RequestAttrs(ip="9.9.9.9")) for _ in range(2))
    assert r1.allowed
    assert r2.allowed
    assert r2.shadow
    assert r2.shadow_denied == ["dry"]
    assert "Retry-After" not in r2.headers()
    assert r2.to_dict()["shadow"] is True


def test_no_matching_rule_allows(limiter: RateLimiter, rules: RuleSet) -> None:
    r = rules.check(limiter, RequestAttrs(method="GET"))
    assert r.allowed  # the shadow global rule matched only
    empty = RuleSet()
    r = empty.check(limiter, RequestAttrs(user="1"))
    assert r.allowed
    assert r.decision is None
    assert r.headers() == {}
    assert r.to_dict()["rule"] is None


def test_cost_over_capacity_fails_before_any_store_call(limiter: RateLimiter) -> None:
    rs = RuleSet.from_data([
        {"name": "big", "scope": "user", "limit": 100, "window": 60},
        {"name": "small", "scope": "ip", "limit": 5, "window": 60},
    ])
    flow = check_flow(rs.plan(RequestAttrs(user="u", ip="i")), cost=10)
    with pytest.raises(ConfigError, match="cost"):
        next(flow)
    big = rs.get("big")
    assert big is not None
    assert limiter.peek("user:u", big.rule).remaining == 100


def test_coerce_accepts_paths_lists_and_specs(tmp_path: Path, rules: RuleSet) -> None:
    p = tmp_path / "r.yaml"
    p.write_text(YAML)
    assert RuleSet.coerce(p) == rules
    assert RuleSet.coerce(str(p)) == rules
    assert RuleSet.coerce(list(rules)) == rules
    assert RuleSet.coerce([r.to_dict() for r in rules]) == rules
    assert RuleSet.coerce(rules) is rules


def test_grouped_check_is_exact_under_threads(clock: FakeClock) -> None:
    """8 threads x 200 requests over two rules on one key and one on another: the
    admitted count is exactly the tightest limit, and no group is over its limit."""
    limiter = RateLimiter(MemoryStore(clock=clock))
    rs = RuleSet.from_data([
        {"name": "a", "scope": "user", "limit": 100, "window": 60},
        {"name": "b", "scope": "user", "limit": 150, "window": 3600},
        {"name": "c", "scope": "ip", "limit": 1000, "window": 60},
    ])
    attrs = RequestAttrs(user="u", ip="i")
    admitted = []

    def work() -> None:
        n = sum(rs.check(limiter, attrs).allowed for _ in range(200))
        admitted.append(n)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 100
    c = rs.get("c")
    assert c is not None
    assert limiter.peek("ip:i", c.rule).remaining == 900


def test_rules_too_large_for_exact_redis_arithmetic_are_refused() -> None:
    with pytest.raises(RulesError, match="2\\*\\*53") as info:
        RuleSet.from_data([{"name": "huge", "scope": "ip", "limit": 10**9, "window": 60}])
    assert info.value.problems[0].field == "limit"
    ok = RuleSet.from_data([  # the counting windows have no such bound
        {"name": "fw", "scope": "ip", "limit": 10**9, "window": 60,
         "algorithm": "fixed_window"},
        {"name": "fine", "scope": "ip", "limit": 10**8, "window": 60}])
    assert len(ok) == 2
