"""Limit strings as teams migrating from limits / Flask-Limiter / slowapi write them:
``month`` and ``year`` units, several limits in one string (``Rule.parse_many``)."""

from __future__ import annotations

import pytest

from stormguard import ConfigError, MemoryStore, RateLimiter, Rule
from stormguard.ruleset import RuleSpec
from stormguard.testing import FakeClock


@pytest.mark.parametrize(("text", "window"), [
    ("1/year", 365 * 86400), ("10/years", 365 * 86400), ("5/month", 30 * 86400),
    ("5 per 2 months", 60 * 86400), ("3/1y", 365 * 86400), ("3/mo", 30 * 86400),
])
def test_month_and_year(text: str, window: int) -> None:
    assert Rule.parse(text).window == window


def test_a_year_fits_the_maximum_window_two_do_not() -> None:
    assert Rule(1, 365 * 86400).window == 365 * 86400
    with pytest.raises(ConfigError, match="window"):
        Rule.parse("1 per 2 years")


def test_rules_as_data_take_month_windows() -> None:
    spec = RuleSpec.from_dict({"name": "m", "scope": "user", "limit": 1, "window": "1 month"})
    assert spec.window == 30 * 86400


def test_unknown_unit_lists_month_and_year() -> None:
    with pytest.raises(ConfigError, match="month, year"):
        Rule.parse("100/fortnight")


@pytest.mark.parametrize("text", ["10/minute;100/hour", "10/minute, 100/hour",
                                  "10/minute | 100/hour", " 10 per minute ;100/hour "])
def test_parse_many(text: str) -> None:
    assert Rule.parse_many(text) == [Rule.parse("10/minute"), Rule.parse("100/hour")]


def test_parse_many_one_limit_and_algorithm() -> None:
    assert Rule.parse_many("5/second", algorithm="gcra") == [Rule(5, 1, "gcra")]


@pytest.mark.parametrize("text", ["", " ; ", "10/minute;;100/hour", "10/minute;nonsense",
                                  "10/minute;", 42])
def test_parse_many_refuses(text: object) -> None:
    with pytest.raises(ConfigError) as exc:
        Rule.parse_many(text)  # type: ignore[arg-type]
    assert exc.value.field == "rule"


def test_parse_many_with_hit_all(clock: FakeClock) -> None:
    limiter = RateLimiter(MemoryStore(clock=clock))
    rules = Rule.parse_many("2/second;3/minute")
    answers = []
    for _ in range(4):
        answers.append(limiter.hit_all("k", rules).allowed)
        clock.advance(1.0)
    assert answers == [True, True, True, False]  # the per-minute limit binds the fourth
