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
    """An inline limit as a matched rule of a check plan (without a name, answers say
    ``"rule": null`` and ``"rules": []``). Two checks with the same parameters and name
    on the same key share counters; different names never do (the name is in the id)."""

    rule: Rule
    shadow: bool = field(default=False, init=False)

    @property
    def name(self) -> str:
        return self.rule.name or ""


def parse_inline(obj: dict[str, object], where: str = "", *, named: bool = False
                 ) -> InlineRule:
    """The inline limit of a check object (``limit`` given); 422 naming the field.

    With ``named`` (an entry of ``limits``), the object may also carry a ``name``: the
    rule's name, part of its counters' identity (two limits with the same parameters
    but different names count separately, as two named rules do)."""
    if named:
        unknown = [k for k in obj if k not in (*INLINE_FIELDS, "name")]
        if unknown:
            raise ApiError(422, f"{where}{unknown[0]}: unknown field; expected some of "
                           f"{sorted((*INLINE_FIELDS, 'name'))}",
                           field=f"{where}{unknown[0]}"[:200])
    name = obj.get("name") if named else None
    data = {"name": name if name is not None else "inline", "scope": "global",
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
    if name is not None:
        return InlineRule(Rule(spec.limit, spec.window, spec.algorithm, spec.burst,
                               name=spec.name))
    return InlineRule(Rule(spec.limit, spec.window, spec.algorithm, spec.burst))


def reset_epoch(result: CheckResult, now: float) -> int:
    """``reset`` of an answer: when the binding quota is fully restored, as epoch seconds
    (an integer, rounded up); ``now`` rounded up when no rule applied."""
    d: Decision | None = result.decision
    if d is None:
        return math.ceil(now)
    return d.reset_epoch(now)
