"""The per-request check over the matched ``(key, rule)`` pairs: a sans-I/O flow and its
blocking and asyncio drivers (see the package docstring for the semantics)."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter
from stormguard.ratelimit.rule import Rule
from stormguard.stores.base import binding, check_cost

__all__ = ["CheckResult", "Flow", "Matched", "Plan", "Step", "acheck_plan", "apeek_plan",
           "check_flow", "check_plan", "note_shadow_denials", "peek_plan", "run_sync"]


class Matched(Protocol):
    """What the check needs of a matched rule (a :class:`~stormguard.ratelimit.rules.RuleSpec`)."""

    @property
    def name(self) -> str: ...

    @property
    def shadow(self) -> bool: ...

    @property
    def rule(self) -> Rule: ...


@dataclass(slots=True)
class CheckResult:
    """The answer for one request over all its matching rules.

    ``decision`` is the binding enforced decision (or the binding shadow decision, with
    ``shadow=True``, when only shadow rules matched; ``None`` when nothing matched).
    ``allowed`` is False only when an enforced rule denied.
    """

    allowed: bool
    decision: Decision | None
    shadow: bool = False
    shadow_denied: list[str] = field(default_factory=list)
    degraded: bool = False
    rules: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = self.decision
        if d is None:
            return {"allowed": True, "limit": None, "remaining": None, "reset_after": 0.0,
                    "retry_after": 0.0, "rule": None, "shadow": False,
                    "degraded": self.degraded, "shadow_denied": self.shadow_denied,
                    "rules": self.rules}
        return {"allowed": self.allowed, "limit": d.limit, "remaining": d.remaining,
                "reset_after": round(d.reset_after, 6), "retry_after": round(d.retry_after, 6),
                "rule": d.rule.name if d.rule is not None else None, "shadow": self.shadow,
                "degraded": self.degraded, "shadow_denied": self.shadow_denied,
                "rules": self.rules}

    def headers(self, reset_header: str = "seconds", now: float | None = None
                ) -> dict[str, str]:
        """The decision's response headers (see :meth:`Decision.headers`)."""
        d = self.decision
        if d is None:
            return {}
        if self.shadow and not d.allowed:
            # a shadow rule never blocks: report it as the answer the client gets
            d = Decision(True, d.limit, d.remaining, d.reset_after, 0.0, d.rule, d.degraded)
        return d.headers(reset_header, now)


# A step asks the driver for one store call: (consume, key, rules, cost).
# consume=True -> limiter.hit_all(key, rules, cost) (hit for one rule);
# consume=False -> limiter.peek(key, rules[0], cost)
Step = tuple[bool, str, tuple[Rule, ...], int]
Flow = Generator[Step, Decision, CheckResult]
Plan = Sequence[tuple[str, Matched]]


def check_flow(matched: Plan, cost: int = 1) -> Flow:
    """The sans-I/O check: yields store calls, receives decisions, returns the result."""
    if cost != 1:
        for _, spec in matched:
            check_cost(spec.rule, cost)  # before any store call: never half-charged
    groups: dict[str, list[Rule]] = {}
    shadows: list[tuple[str, Matched]] = []
    for key, spec in matched:
        if spec.shadow:
            shadows.append((key, spec))
        else:
            groups.setdefault(key, []).append(spec.rule)
    names = [spec.name for _, spec in matched]
    degraded = False
    final: Decision | None = None
    items = [(k, tuple(v)) for k, v in groups.items()]
    if len(items) > 1:
        for key, rules in items[1:]:
            for rule in rules:
                d = yield (False, key, (rule,), cost)
                degraded = degraded or d.degraded
                if not d.allowed:
                    return CheckResult(False, d, degraded=degraded, rules=names)
    for key, rules in items:
        d = yield (True, key, rules, cost)
        degraded = degraded or d.degraded
        if not d.allowed:
            return CheckResult(False, d, degraded=degraded, rules=names)
        if final is None or d.remaining < final.remaining:
            final = d
    shadow_denied: list[str] = []
    shadow_final: Decision | None = None
    for key, spec in shadows:
        d = yield (True, key, (spec.rule,), cost)
        degraded = degraded or d.degraded
        if not d.allowed:
            shadow_denied.append(spec.name)
        if shadow_final is None or (shadow_final.allowed and not d.allowed):
            shadow_final = d
    if final is None and shadow_final is not None:
        return CheckResult(True, shadow_final, True, shadow_denied, degraded, names)
    return CheckResult(True, final, False, shadow_denied, degraded, names)


def check_plan(limiter: RateLimiter, plan: Plan, cost: int = 1) -> CheckResult:
    """Check a request's matched ``(key, rule)`` pairs with a blocking limiter."""
    if len(plan) == 1 and not plan[0][1].shadow:  # the common case, without the flow
        key, spec = plan[0]
        d = limiter.hit(key, spec.rule, cost)
        return CheckResult(d.allowed, d, False, [], d.degraded, [spec.name])
    result = run_sync(limiter, check_flow(plan, cost))
    note_shadow_denials(limiter, result)
    return result


def note_shadow_denials(limiter: AsyncRateLimiter | RateLimiter, result: CheckResult) -> None:
    """Report a checked request's ``shadow_denied`` rules in the limiter's decision metric
    (``stormguard_limiter_decisions_total{result="shadow_denied"}``; their decisions were
    counted as "denied" by the limiter's ``hit``), as :func:`check_plan` does; for a check
    driven outside these drivers (Envoy's gRPC path). Nothing for a degraded result (its
    decisions were counted as "degraded") or a limiter whose metrics are not enabled."""
    if result.shadow_denied and not result.degraded and limiter._counting:
        limiter._note_shadow(result.shadow_denied)


async def acheck_plan(limiter: AsyncRateLimiter | RateLimiter, plan: Plan,
                      cost: int = 1) -> CheckResult:
    """:func:`check_plan` for an async limiter (a blocking one is called directly)."""
    if not isinstance(limiter, AsyncRateLimiter):
        return check_plan(limiter, plan, cost)
    if len(plan) == 1 and not plan[0][1].shadow:
        key, spec = plan[0]
        d = await limiter.hit(key, spec.rule, cost)
        return CheckResult(d.allowed, d, False, [], d.degraded, [spec.name])
    flow = check_flow(plan, cost)
    try:
        step = next(flow)
        while True:
            consume, key, rules, cost = step
            if not consume:
                d = await limiter.peek(key, rules[0], cost)
            elif len(rules) == 1:
                d = await limiter.hit(key, rules[0], cost)
            else:
                d = await limiter.hit_all(key, rules, cost)
            step = flow.send(d)
    except StopIteration as stop:
        result: CheckResult = stop.value
        note_shadow_denials(limiter, result)
        return result


def run_sync(limiter: RateLimiter, flow: Flow) -> CheckResult:
    """Drive a check flow with a blocking limiter."""
    try:
        step = next(flow)
        while True:
            consume, key, rules, cost = step
            if not consume:
                d = limiter.peek(key, rules[0], cost)
            elif len(rules) == 1:
                d = limiter.hit(key, rules[0], cost)
            else:
                d = limiter.hit_all(key, rules, cost)
            step = flow.send(d)
    except StopIteration as stop:
        result: CheckResult = stop.value
        return result


def _peek_result(plan: Plan, decisions: Sequence[Decision]) -> CheckResult:
    names = [spec.name for _, spec in plan]
    degraded = any(d.degraded for d in decisions)
    enforced = [d for (_, spec), d in zip(plan, decisions, strict=True) if not spec.shadow]
    shadow_denied = [spec.name for (_, spec), d in zip(plan, decisions, strict=True)
                     if spec.shadow and not d.allowed]
    if enforced:
        d = binding(enforced)
        return CheckResult(d.allowed, d, False, shadow_denied, degraded, names)
    d = binding(decisions)
    return CheckResult(True, d, True, shadow_denied, degraded, names)


def peek_plan(limiter: RateLimiter, plan: Plan, cost: int = 1) -> CheckResult:
    """What :func:`check_plan` would answer, consuming nothing (one peek per pair)."""
    if not plan:
        return CheckResult(True, None)
    for _, spec in plan:
        check_cost(spec.rule, cost)
    return _peek_result(plan, [limiter.peek(key, spec.rule, cost) for key, spec in plan])


async def apeek_plan(limiter: AsyncRateLimiter | RateLimiter, plan: Plan,
                     cost: int = 1) -> CheckResult:
    """:func:`peek_plan` for an async limiter (a blocking one is called directly)."""
    if not isinstance(limiter, AsyncRateLimiter):
        return peek_plan(limiter, plan, cost)
    if not plan:
        return CheckResult(True, None)
    for _, spec in plan:
        check_cost(spec.rule, cost)
    return _peek_result(plan, [await limiter.peek(key, spec.rule, cost) for key, spec in plan])
