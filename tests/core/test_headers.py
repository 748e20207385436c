"""Decision.headers(): X-RateLimit-*, IETF RateLimit / RateLimit-Policy, Retry-After."""

from __future__ import annotations

import pytest

from stormguard import Decision, Rule
from tests.core.util import ALGORITHMS, at, limiter_at


def test_allowed_headers() -> None:
    limiter, _ = limiter_at(at(0, 48))
    rule = Rule(limit=100, window=60, algorithm="fixed_window", name="api")
    h = limiter.hit("k", rule).headers()
    assert h == {
        "X-RateLimit-Limit": "100",
        "X-RateLimit-Remaining": "99",
        "X-RateLimit-Reset": "12",
        "RateLimit-Policy": '"api";q=100;w=60',
        "RateLimit": '"api";r=99;t=12',
    }


def test_denied_headers_round_up_and_carry_retry_after() -> None:
    limiter, clock = limiter_at(at(0, 47.5))
    rule = Rule(limit=100, window=60, algorithm="fixed_window", name="api")
    for _ in range(100):
        limiter.hit("k", rule)
    h = limiter.hit("k", rule).headers()
    assert h == {
        "X-RateLimit-Limit": "100",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "13",  # 12.5 s rounded up
        "RateLimit-Policy": '"api";q=100;w=60',
        "RateLimit": '"api";r=0;t=13',
        "Retry-After": "13",
    }
    clock.set_wall(at(0, 59.999))
    h = limiter.hit("k", rule).headers()
    assert h["Retry-After"] == "1"  # 1 ms rounds up to at least 1
    assert h["X-RateLimit-Reset"] == "1"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_retry_after_only_when_denied_and_always_an_integer_of_at_least_1(
        algorithm: str) -> None:
    limiter, clock = limiter_at(at(0, 10))
    rule = Rule(limit=2, window=1, algorithm=algorithm)
    for i in range(40):
        d = limiter.hit("k", rule)
        h = d.headers()
        assert ("Retry-After" in h) == (not d.allowed)
        if not d.allowed:
            assert int(h["Retry-After"]) >= 1
            assert int(h["Retry-After"]) >= d.retry_after
        assert int(h["X-RateLimit-Reset"]) >= d.reset_after
        assert int(h["X-RateLimit-Remaining"]) == d.remaining
        assert h["RateLimit"] == (
            f'"default";r={d.remaining};t={h["X-RateLimit-Reset"]}')
        assert h["RateLimit-Policy"] == '"default";q=2;w=1'
        clock.advance(0.05 * (i % 3))


def test_token_bucket_headers_use_the_capacity_as_limit_and_the_rate_as_policy() -> None:
    limiter, _ = limiter_at(at(0))
    rule = Rule(limit=2, window=1, burst=10, algorithm="token_bucket")
    h = limiter.hit("k", rule).headers()
    assert h["X-RateLimit-Limit"] == "10"
    assert h["X-RateLimit-Remaining"] == "9"
    assert h["X-RateLimit-Reset"] == "1"  # 0.5 s to refill one token, rounded up
    assert h["RateLimit-Policy"] == '"default";q=2;w=1'


def test_exact_integer_reset_is_not_rounded_up() -> None:
    d = Decision(False, 10, 0, 12.0, 3.0, Rule(10, 60))
    h = d.headers()
    assert (h["X-RateLimit-Reset"], h["Retry-After"]) == ("12", "3")
    d = Decision(False, 10, 0, 12.000001, 3.000001, Rule(10, 60))
    h = d.headers()
    assert (h["X-RateLimit-Reset"], h["Retry-After"]) == ("13", "4")


def test_policy_name_is_a_valid_structured_field_string() -> None:
    d = Decision(True, 5, 4, 1.0, 0.0, Rule(5, 0.5, name='a"b\\c ü'))
    h = d.headers()
    assert h["RateLimit-Policy"] == '"a\\"b\\\\c ?";q=5;w=1'  # sub-second windows: w=1
    assert h["RateLimit"] == '"a\\"b\\\\c ?";r=4;t=1'
    assert Decision(True, 5, 4, 1.0, 0.0, Rule(5, 90.5)).headers()["RateLimit-Policy"] \
        == '"default";q=5;w=91'


def test_headers_without_a_rule_and_negative_remaining_clamped() -> None:
    h = Decision(False, 5, -3, 0.0, 0.0).headers()
    assert h == {"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "0",
                 "X-RateLimit-Reset": "0", "RateLimit": '"default";r=0;t=0',
                 "Retry-After": "1"}
