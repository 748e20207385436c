"""Inline limits on the check API: ``{"key": "user:42:GET:/search", "limit": 100,
"window": 60}`` (plus optional ``algorithm``, ``burst``; ``window`` also as ``"1m"``), the
design document's ``ALLOW? key limit window`` call, validated as a rule of the rules file
is, and the ``reset`` (epoch seconds) every answer carries."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.rule import Rule
from stormguard.ratelimit.rules import CheckResult, RulesError, RuleSpec
from stormguard.service.http import ApiError

__all__ = ["INLINE_FIELDS", "InlineRule", "parse_inline", "reset_epoch"]

INLINE_FIELDS = ("limit", "window", "algorithm", "burst")


@dataclass(frozen=True, slots=True)
class InlineRule:
    """An inline limit as a matched rule of a check plan (it has no name: answers say
    ``"rule": null`` and ``"rules": []``). Two checks with the same parameters on the
    same key share counters; a named rule never shares them (its name is in its id)."""

    rule: Rule
    name: str = field(default="", init=False)
    shadow: bool = field(default=False, init=False)


def parse_inline(obj: dict[str, object], where: str = "") -> InlineRule:
    """The inline limit of a check object (``limit`` given); 422 naming the field."""
    data = {"name": "inline", "scope": "global",
            **{k: obj[k] for k in INLINE_FIELDS if obj.get(k) is not None}}
    for required in ("limit", "window"):
        if required not in data:
            raise ApiError(422, f"{where}{required}: is required with an inline limit "
                           "(key + limit + window)", field=f"{where}{required}")
    try:
        spec = RuleSpec.from_dict(data)
    except RulesError as exc:
        p = exc.problems[0]
        raise ApiError(422, f"{where}{p.field}: {p.problem}"[:500],
                       field=f"{where}{p.field}"[:200]) from None
    return InlineRule(Rule(spec.limit, spec.window, spec.algorithm, spec.burst))


def reset_epoch(result: CheckResult, now: float) -> int:
    """``reset`` of an answer: when the binding quota is fully restored, as epoch seconds
    (an integer, rounded up); ``now`` rounded up when no rule applied."""
    d: Decision | None = result.decision
    if d is None:
        return math.ceil(now)
    return d.reset_epoch(now)
