"""Text fields of rules as data are valid Unicode: a lone surrogate (which JSON, YAML,
files and Redis cannot carry) is a ConfigError naming the field, never a crash later."""

from __future__ import annotations

import json

import pytest

from stormguard import ConfigError, Rule
from stormguard.ratelimit.rules import RequestAttrs, RulesError, RuleSet, RuleSpec

LONE = "\udc80"
BASE = {"name": "a", "scope": "user", "limit": 1, "window": 1}


@pytest.mark.parametrize(("field", "value"), [
    ("name", f"a{LONE}"), ("tier", f"pro{LONE}"), ("endpoint", f"GET /x{LONE}"),
    ("scope", LONE), ("window", f"1{LONE}m"), ("algorithm", LONE),
])
def test_a_lone_surrogate_is_refused_naming_the_field(field: str, value: str) -> None:
    with pytest.raises(RulesError) as exc:
        RuleSet.from_data([{**BASE, field: value}])
    assert isinstance(exc.value, ConfigError)
    assert field in {p.field for p in exc.value.problems}
    json.dumps(exc.value.to_list(), ensure_ascii=False).encode("utf-8")  # reportable
    str(exc.value).encode("utf-8")


@pytest.mark.parametrize("field", ["tier", "endpoint"])
def test_empty_text_is_refused(field: str) -> None:
    with pytest.raises(RulesError) as exc:
        RuleSpec(**{**BASE, field: ""})  # type: ignore[arg-type]
    assert [p.field for p in exc.value.problems] == [field]


def test_rule_name_is_valid_unicode() -> None:
    with pytest.raises(ConfigError) as exc:
        Rule(limit=1, window=1, name=f"x{LONE}")
    assert exc.value.field == "name"
    assert Rule(limit=1, window=1, name="prüfung ✓").name == "prüfung ✓"


def test_unicode_that_is_valid_passes() -> None:
    spec = RuleSpec.from_dict({**BASE, "tier": "prüfung", "endpoint": "GET /straße/*"})
    assert spec.tier == "prüfung"
    attrs = RequestAttrs(user="1", method="GET", path="/straße/1", tier="prüfung")
    assert RuleSet([spec]).match(attrs) == [spec]
