"""Bad input: ConfigError naming the field and the value; TypeError for non-str keys;
nothing half-updated afterwards."""

from __future__ import annotations

import math
from typing import Any

import pytest

from stormguard import ConfigError, MemoryStore, RateLimiter, Rule
from stormguard.stores import from_url
from tests.core.util import ALGORITHMS, NOON, limiter_at, snapshot


def check(exc: pytest.ExceptionInfo[ConfigError], field: str, value: object) -> None:
    assert isinstance(exc.value, ValueError)
    assert exc.value.field == field
    assert exc.value.value is value or exc.value.value == value or (
        isinstance(value, float) and math.isnan(value))
    assert str(exc.value).startswith(f"{field}: ")
    assert repr(value) in str(exc.value)


@pytest.mark.parametrize("limit", [0, -1, 1.5, "100", True, None])
def test_bad_limit(limit: Any) -> None:
    with pytest.raises(ConfigError) as exc:
        Rule(limit=limit, window=60)
    check(exc, "limit", limit)


@pytest.mark.parametrize("window", [0, -1, 0.0009, math.inf, math.nan, "60", True,
                                    366 * 86400 + 1, None])
def test_bad_window(window: Any) -> None:
    with pytest.raises(ConfigError) as exc:
        Rule(limit=10, window=window)
    check(exc, "window", window)


@pytest.mark.parametrize("burst", [0, -5, 2.5, "10"])
def test_bad_burst(burst: Any) -> None:
    with pytest.raises(ConfigError) as exc:
        Rule(limit=10, window=60, algorithm="token_bucket", burst=burst)
    check(exc, "burst", burst)


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_log",
                                       "sliding_window_counter"])
def test_burst_on_a_window_algorithm(algorithm: str) -> None:
    with pytest.raises(ConfigError) as exc:
        Rule(limit=10, window=60, algorithm=algorithm, burst=20)
    check(exc, "burst", 20)
    assert algorithm in str(exc.value)


@pytest.mark.parametrize("algorithm", ["nope", "Fixed_Window", "", 3])
def test_bad_algorithm(algorithm: Any) -> None:
    with pytest.raises(ConfigError) as exc:
        Rule(limit=10, window=60, algorithm=algorithm)
    check(exc, "algorithm", algorithm)
    assert "sliding_window_counter" in str(exc.value)  # lists the valid names


def test_bad_name() -> None:
    with pytest.raises(ConfigError) as exc:
        Rule(limit=10, window=60, name="")
    check(exc, "name", "")


@pytest.mark.parametrize(("text", "limit", "window", "algorithm", "capacity"), [
    ("100/minute", 100, 60, "sliding_window_counter", 100),
    ("10/second", 10, 1, "sliding_window_counter", 10),
    ("5 per 2 seconds", 5, 2, "sliding_window_counter", 5),
    ("100/minute burst 150", 100, 60, "token_bucket", 150),
    ("1000/hour", 1000, 3600, "sliding_window_counter", 1000),
    ("20/5m", 20, 300, "sliding_window_counter", 20),
    ("  7 PER 1.5 Minutes ", 7, 90, "sliding_window_counter", 7),
    ("3/250ms", 3, 0.25, "sliding_window_counter", 3),
    ("1/day", 1, 86400, "sliding_window_counter", 1),
])
def test_parse_forms(text: str, limit: int, window: float, algorithm: str,
                     capacity: int) -> None:
    rule = Rule.parse(text)
    assert (rule.limit, rule.window, rule.algorithm, rule.capacity) == (
        limit, window, algorithm, capacity)


def test_parse_with_algorithm_name_and_burst() -> None:
    assert Rule.parse("100/minute", algorithm="fixed_window") == Rule(100, 60, "fixed_window")
    r = Rule.parse("100/minute burst 150", algorithm="gcra", name="api")
    assert (r.algorithm, r.capacity, r.name) == ("gcra", 150, "api")
    assert Rule.parse("2/second", burst=10).capacity == 10
    with pytest.raises(ConfigError) as exc:
        Rule.parse("100/minute burst 150", algorithm="fixed_window")
    check(exc, "burst", 150)
    with pytest.raises(ConfigError) as exc:
        Rule.parse("100/minute burst 150", burst=5)
    check(exc, "burst", 5)


@pytest.mark.parametrize("text", ["", "abc", "100", "/minute", "100/", "100/fortnight",
                                  "100/0 seconds", "100/minute burst", "-1/minute",
                                  "100/minute burst -1", "1e3/minute", "100 minute"])
def test_bad_parse_strings(text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        Rule.parse(text)
    assert exc.value.field in ("rule", "limit", "window", "burst")
    assert repr(text) in str(exc.value) or exc.value.field != "rule"


def test_parse_non_string() -> None:
    with pytest.raises(ConfigError) as exc:
        Rule.parse(100)  # type: ignore[arg-type]
    check(exc, "rule", 100)
    with pytest.raises(ConfigError) as exc:
        Rule.parse("0/minute")
    check(exc, "limit", 0)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("cost", [0, -1, 1.0, 2.5, "2", True, None])
def test_bad_cost(algorithm: str, cost: Any) -> None:
    # Regression for cost=1.0: it compared equal to 1, skipped validation and crashed
    # sliding_window_log with a TypeError (and put floats into the other states).
    limiter, _ = limiter_at(NOON)
    rule = Rule(limit=5, window=60, algorithm=algorithm)
    for call in (limiter.hit, limiter.peek):
        with pytest.raises(ConfigError) as exc:
            call("k", rule, cost)
        check(exc, "cost", cost)
    with pytest.raises(ConfigError) as exc:
        limiter.hit_all("k", [rule, Rule(limit=9, window=1)], cost)
    check(exc, "cost", cost)
    assert len(limiter.store) == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_cost_above_capacity_names_cost_and_capacity(algorithm: str) -> None:
    limiter, _ = limiter_at(NOON)
    burst = 7 if algorithm in ("token_bucket", "gcra", "leaky_bucket") else None
    rule = Rule(limit=5, window=60, algorithm=algorithm, burst=burst)
    assert limiter.hit("k", rule, rule.capacity).allowed
    with pytest.raises(ConfigError) as exc:
        limiter.hit("k", rule, rule.capacity + 1)
    check(exc, "cost", rule.capacity + 1)
    assert f"capacity {rule.capacity}" in str(exc.value)


def test_hit_all_with_one_bad_rule_or_cost_changes_nothing() -> None:
    limiter, _ = limiter_at(NOON)
    small = Rule(limit=3, window=1, name="small")
    big = Rule(limit=100, window=60, name="big")
    limiter.hit_all("k", [small, big])
    store = limiter.store
    assert isinstance(store, MemoryStore)
    before = snapshot(store)
    with pytest.raises(ConfigError) as exc:
        limiter.hit_all("k", [big, small], cost=50)  # fits big, not small
    check(exc, "cost", 50)
    with pytest.raises(ConfigError) as exc:
        limiter.hit_all("k", [big, "10/second"], cost=1)  # type: ignore[list-item]
    check(exc, "rules", "10/second")
    with pytest.raises(ConfigError):
        limiter.hit_all("k", [])
    assert snapshot(store) == before
    assert limiter.peek("k", big).remaining == 99
    assert limiter.peek("k", small).remaining == 2


@pytest.mark.parametrize("key", [42, b"user", None, ("a",), 4.2])
def test_non_string_key_is_a_type_error(key: Any) -> None:
    limiter, _ = limiter_at(NOON)
    rule = Rule(10, 60)
    for call in (lambda: limiter.hit(key, rule), lambda: limiter.peek(key, rule),
                 lambda: limiter.hit_all(key, [rule, Rule(5, 1)]),
                 lambda: limiter.hit_all(key, [rule]), lambda: limiter.reset(key, rule)):
        with pytest.raises(TypeError, match="key: must be a str"):
            call()
    assert len(limiter.store) == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_unicode_and_4kib_keys(algorithm: str) -> None:
    limiter, _ = limiter_at(NOON)
    rule = Rule(limit=1, window=60, algorithm=algorithm)
    keys = ["用户:42", "🙂", "caf\u00e9", "cafe\u0301", "", "\x00nul", "a" * 4096,
            "ж" * 4096, "a" * 4095 + "b"]
    for key in keys:
        assert limiter.hit(key, rule).allowed, key
    for key in keys:
        assert not limiter.hit(key, rule).allowed, key  # each its own counter
    assert len(limiter.store) == len(keys)


def test_bad_store_and_limiter_options() -> None:
    for max_keys in (0, -1, 1.5, "10", True):
        with pytest.raises(ConfigError) as exc:
            MemoryStore(max_keys=max_keys)  # type: ignore[arg-type]
        check(exc, "max_keys", max_keys)
    with pytest.raises(ConfigError) as exc:
        from_url("memory://?max_keys=lots")
    check(exc, "max_keys", "lots")
    assert from_url("memory://?max_keys=5").max_keys == 5  # type: ignore[attr-defined]
    with pytest.raises(ConfigError) as exc:
        RateLimiter("nope://x")
    check(exc, "store", "nope://x")
    with pytest.raises(ConfigError) as exc:
        RateLimiter(42)  # type: ignore[arg-type]
    check(exc, "store", 42)
    with pytest.raises(ConfigError) as exc:
        RateLimiter(on_error="maybe")  # type: ignore[arg-type]
    check(exc, "on_error", "maybe")
    with pytest.raises(ConfigError) as exc:
        RateLimiter(MemoryStore(), max_keys=5)
    assert exc.value.field == "store_options"
    for share in (0, 1.5, True, "x"):
        with pytest.raises(ConfigError) as exc:
            RateLimiter(local_share=share)  # type: ignore[arg-type]
        check(exc, "local_share", share)
