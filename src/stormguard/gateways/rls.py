"""Envoy's rate-limit semantics over a stormguard limiter, free of gRPC: a request's
``domain`` and descriptors in, one status per descriptor and the overall code out.

* each descriptor selects at most one limit (:meth:`EnvoyConfig.lookup`); in the domain
  ``stormguard`` (:data:`RULES_DOMAIN`), descriptors whose keys are request attributes
  (``user``, ``api_key``, ``ip`` or ``remote_address``, ``method``, ``path``, ``tier``) are
  checked against the service's own rules instead;
* ``replaces``: a limit named by another matched limit's ``replaces`` is dropped;
* the cost is the descriptor's ``hits_addend``, else the request's, and 0 means 1;
* all or nothing: when several enforced limits apply, the later ones are peeked first and
  a request that one of them denies charges none of them (envoyproxy/ratelimit charges
  every descriptor of a request it rejects);
* shadow limits are counted and always answer OK; unknown descriptors answer OK with no
  limit, unlimited ones OK with ``limit_remaining`` 4294967295, as envoyproxy/ratelimit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from stormguard._core.clock import wall_us
from stormguard._core.errors import ConfigError
from stormguard.observability.events import Event, Listener, emit, observed
from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter
from stormguard.ratelimit.rule import Rule
from stormguard.ratelimit.rules import RequestAttrs, RuleSet
from stormguard.ratelimit.rules.check import CheckResult, note_shadow_denials

from .envoy import UNITS, EnvoyConfig, EnvoyLimit, counter_key

__all__ = ["OK", "OVER_LIMIT", "RULES_DOMAIN", "DescriptorStatus", "EnvoyChecker",
           "EnvoyResult", "ShadowOverLimit", "UnknownDescriptor"]

OK = 1
OVER_LIMIT = 2
"""``RateLimitResponse.Code`` values."""
RULES_DOMAIN = "stormguard"
UNLIMITED_REMAINING = 2**32 - 1
_ATTR_KEYS = {"user": "user", "api_key": "api_key", "ip": "ip", "remote_address": "ip",
              "method": "method", "path": "path", "tier": "tier"}
MAX_DESCRIPTORS = 64
MAX_ENTRIES = 32
MAX_DESCRIPTOR_CHARS = 4096
"""As ``/v1/check``'s ``MAX_KEY``: a descriptor names a store key."""
_UNKNOWN_DOMAIN_LABEL = "(unknown)"
_MAX_LABELS = 1000


@dataclass(frozen=True, slots=True)
class UnknownDescriptor(Event):
    """A descriptor no limit matched (answered OK, as Envoy's convention wants).
    ``policy`` is the domain."""

    entries: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class ShadowOverLimit(Event):
    """A shadow-mode limit would have denied (answered OK). ``policy`` is the domain."""

    limit: str
    entries: tuple[tuple[str, str], ...]


@dataclass(slots=True)
class DescriptorStatus:
    """One descriptor's answer. ``limit`` is None for an unknown descriptor or an
    unlimited one; ``reset_after`` is seconds (``duration_until_reset``)."""

    code: int
    limit: EnvoyLimit | None = None
    remaining: int = 0
    reset_after: float = 0.0
    decision: Decision | None = None
    kind: str = "unknown"
    """``ok``, ``over_limit``, ``shadow_over_limit``, ``unlimited``, ``unknown``,
    ``replaced``, ``rules`` (checked against the service's rules)."""


@dataclass(slots=True)
class EnvoyResult:
    code: int
    statuses: list[DescriptorStatus]
    decision: Decision | None = None
    """The binding decision (the denying one, else the one with the least remaining)."""
    degraded: bool = False
    denials: list[tuple[str, str]] = field(default_factory=list)
    """``(store key, rule name)`` of each counter that denied the request, and of each
    shadow limit that would have (only when the request was otherwise answered OK), as
    ``POST /v1/check`` feeds the service's most-denied keys (``GET /v1/top``)."""
    shadow_denied: list[str] = field(default_factory=list)
    """The rule names of the shadow limits that would have denied a request otherwise
    answered OK, as :attr:`CheckResult.shadow_denied` (the shadow-denial metrics)."""

    def headers(self) -> dict[str, str]:
        """The RateLimit headers of the binding decision (and ``Retry-After`` when over
        the limit), for ``response_headers_to_add``."""
        d = self.decision
        if d is None:
            return {}
        if self.code == OK and not d.allowed:  # a shadow decision: the client passes
            d = Decision(True, d.limit, d.remaining, d.reset_after, 0.0, d.rule, d.degraded)
        h = d.headers()
        # envoyproxy/ratelimit's own three (its LIMIT_*_HEADER defaults): whole numbers,
        # the reset in seconds, so gateways and clients reading them keep working
        h["RateLimit-Limit"] = str(d.limit)
        h["RateLimit-Remaining"] = str(d.remaining if d.remaining > 0 else 0)
        h["RateLimit-Reset"] = str(math.ceil(d.reset_after - 1e-9) if d.reset_after > 0 else 0)
        return h


@dataclass(slots=True)
class _Item:
    """One store counter of a request; ``indices``: the descriptors it answers (the same
    counter named twice in one request is one item of the summed cost)."""

    indices: list[int]
    key: str
    rule: Rule
    cost: int
    shadow: bool


def _add(items: list[_Item], index: int, key: str, rule: Rule, cost: int,
         shadow: bool) -> None:
    for it in items:
        if it.key == key and it.rule.id == rule.id and it.shadow == shadow:
            it.cost += cost
            it.indices.append(index)
            return
    items.append(_Item([index], key, rule, cost, shadow))


@dataclass(slots=True)
class EnvoyMetrics:
    """Counters behind ``stormguard_envoy_*`` on ``/metrics``: descriptors by domain and
    result, requests by domain and overall code."""

    descriptors: dict[tuple[str, str], int] = field(default_factory=dict)
    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    reloads: dict[str, int] = field(default_factory=dict)
    """Configuration reloads by result (``ok``, ``error``)."""

    def count(self, table: dict[tuple[str, str], int], domain: str, what: str) -> None:
        k = (domain, what)
        if k in table:
            table[k] += 1
        elif len(table) < _MAX_LABELS:
            table[k] = 1


class EnvoyChecker:
    """``ShouldRateLimit`` without the wire: :meth:`check` answers an :class:`EnvoyResult`.

    ``rules`` gives the service's current rules (for the ``stormguard`` domain)."""

    def __init__(self, limiter: AsyncRateLimiter | RateLimiter, config: EnvoyConfig | None,
                 rules: object = None, *, listeners: Sequence[Listener] = ()) -> None:
        self.limiter = limiter
        self.config = config if config is not None else EnvoyConfig()
        self._rules = rules
        self.listeners: list[Listener] = list(listeners)
        self.metrics = EnvoyMetrics()
        self._overrides: dict[tuple[str, int, int], EnvoyLimit] = {}

    def add_listener(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def _domain_label(self, domain: str) -> str:
        if domain in self.config.domains or domain == RULES_DOMAIN:
            return domain
        return _UNKNOWN_DOMAIN_LABEL

    def _current_rules(self) -> RuleSet | None:
        src = self._rules
        if src is None:
            return None
        current = getattr(src, "current", src)
        return current if isinstance(current, RuleSet) else None

    async def check(self, domain: str, descriptors: Sequence[tuple[Sequence[tuple[str, str]],
                                                                     int]],
                    hits_addend: int = 0,
                    overrides: Sequence[tuple[int, int] | None] | None = None) -> EnvoyResult:
        """``descriptors``: ``(entries, hits_addend of the descriptor or 0)`` each;
        ``overrides``: per descriptor, Envoy's ``limit`` override ``(requests_per_unit,
        unit enum)`` or None (it replaces the configured limit in a configured domain)."""
        if len(descriptors) > MAX_DESCRIPTORS:
            raise ConfigError("descriptors", len(descriptors),
                              f"at most {MAX_DESCRIPTORS} descriptors per request")
        label = self._domain_label(domain)
        base_cost = hits_addend if hits_addend > 0 else 1
        statuses: list[DescriptorStatus] = []
        items: list[_Item] = []
        matched: list[EnvoyLimit | None] = []
        # the service's rules answer the domain "stormguard" unless a file configures it
        rules = self._current_rules() if domain == RULES_DOMAIN and \
            domain not in self.config.domains else None
        for entries, _own in descriptors:
            if len(entries) > MAX_ENTRIES:
                raise ConfigError("entries", len(entries),
                                  f"at most {MAX_ENTRIES} entries per descriptor")
            size = sum(len(k) + len(v) for k, v in entries)
            if size > MAX_DESCRIPTOR_CHARS:
                raise ConfigError("entries", size, f"a descriptor's keys and values hold at "
                                  f"most {MAX_DESCRIPTOR_CHARS} characters (they name a "
                                  "counter in the store)")
            matched.append(self.config.lookup(domain, entries) if rules is None else None)
        if overrides is not None and domain in self.config.domains:
            for i, ov in enumerate(overrides):
                if ov is not None:
                    matched[i] = self._override(domain, *ov)
        replaced = {r for lim in matched if lim is not None for r in lim.replaces}
        for i, ((entries, own), lim) in enumerate(zip(descriptors, matched, strict=True)):
            cost = own if own > 0 else base_cost
            if lim is not None and lim.name and lim.name in replaced:
                statuses.append(DescriptorStatus(OK, kind="replaced"))
                continue
            if lim is None:
                if rules is not None and self._rules_items(rules, i, entries, cost, items):
                    statuses.append(DescriptorStatus(OK, kind="rules"))
                    continue
                statuses.append(DescriptorStatus(OK, kind="unknown"))
                if observed(self.listeners):
                    emit(self.listeners, UnknownDescriptor(domain, time.monotonic(),
                                                           tuple(entries)))
                continue
            if lim.unlimited:
                statuses.append(DescriptorStatus(OK, lim, UNLIMITED_REMAINING, kind="unlimited"))
                continue
            key = counter_key(domain, entries)
            if lim.rule is None:  # requests_per_unit: 0, every request is over the limit
                statuses.append(self._blocked_status(lim))
                continue
            statuses.append(DescriptorStatus(OK, lim, kind="ok"))
            _add(items, i, key, lim.rule, cost, lim.shadow)
        result = await self._run(items, statuses)
        result.denials[:0] = _blocked(domain, descriptors, statuses)
        for st in statuses:
            kind = st.kind
            if kind == "over_limit" and st.limit is not None and st.limit.shadow:
                kind = "shadow_over_limit"
            self.metrics.count(self.metrics.descriptors, label, kind)
        self.metrics.count(self.metrics.requests, label,
                           "OVER_LIMIT" if result.code == OVER_LIMIT else "OK")
        if observed(self.listeners):
            for st, (entries, _) in zip(statuses, descriptors, strict=True):
                if st.kind == "shadow_over_limit" and st.limit is not None:
                    emit(self.listeners, ShadowOverLimit(domain, time.monotonic(),
                                                         st.limit.path, tuple(entries)))
        return result

    def _rules_items(self, rules: RuleSet, index: int, entries: Sequence[tuple[str, str]],
                     cost: int, items: list[_Item]) -> bool:
        values: dict[str, str] = {}
        for k, v in entries:
            attr = _ATTR_KEYS.get(k)
            if attr is None:
                return False
            values[attr] = v.rsplit(":", 1)[0] if k == "remote_address" and \
                v.count(":") == 1 else v
        attrs = RequestAttrs(values.get("user"), values.get("api_key"), values.get("ip"),
                             values.get("method"), values.get("path"), values.get("tier"))
        plan = rules.plan(attrs)
        if not plan:
            return False
        for key, spec in plan:
            _add(items, index, key, spec.rule, cost, spec.shadow)
        return True

    def _override(self, domain: str, rpu: int, code: int) -> EnvoyLimit | None:
        """The limit of Envoy's per-descriptor override (a fixed window; cached)."""
        unit = next((u for u, (_, c) in UNITS.items() if c == code), None)
        if unit is None:
            return None  # UNKNOWN unit: no limit, as envoyproxy/ratelimit
        hit = self._overrides.get((domain, rpu, code))
        if hit is not None:
            return hit
        seconds = UNITS[unit][0]
        path = f"{domain}.override"
        rule = Rule(rpu, seconds, "fixed_window", None, f"{path}:{rpu}/{unit}") if rpu else None
        lim = EnvoyLimit(path, "", unit, code, rpu, False, False, (), rule, seconds)
        if len(self._overrides) < _MAX_LABELS:
            self._overrides[(domain, rpu, code)] = lim
        return lim

    def _blocked_status(self, lim: EnvoyLimit) -> DescriptorStatus:
        now = wall_us(self.limiter.store.clock)
        w = lim.seconds * 1_000_000
        reset = (w - now % w) / 1e6
        return DescriptorStatus(OVER_LIMIT, lim, 0, reset, kind="over_limit")

    async def _call(self, consume: bool, item: _Item) -> Decision:
        lim = self.limiter
        if item.cost > item.rule.capacity:
            # never admissible: over the limit without touching the store
            now = wall_us(lim.store.clock)
            w = round(item.rule.window * 1_000_000)
            reset = (w - now % w) / 1e6
            return Decision(False, item.rule.limit, 0, reset, reset, item.rule)
        if isinstance(lim, AsyncRateLimiter):
            if consume:
                return await lim.hit(item.key, item.rule, item.cost)
            return await lim.peek(item.key, item.rule, item.cost)
        if consume:
            return lim.hit(item.key, item.rule, item.cost)
        return lim.peek(item.key, item.rule, item.cost)

    async def _run(self, items: list[_Item], statuses: list[DescriptorStatus]) -> EnvoyResult:
        enforced = [it for it in items if not it.shadow]
        shadows = [it for it in items if it.shadow]
        degraded = False
        denied: Decision | None = None
        denials: list[tuple[str, str]] = []
        shadow_denied: list[str] = []
        blocked = any(st.code == OVER_LIMIT for st in statuses)
        decisions: dict[int, Decision] = {}
        # all or nothing: peek every enforced limit but the first, then charge in order
        peeks = enforced if blocked else enforced[1:]
        for it in peeks:
            d = await self._call(False, it)
            degraded = degraded or d.degraded
            decisions[id(it)] = d
            if not d.allowed:
                denied = d
                denials.append(_denial(it))
                break
        if denied is None and not blocked:
            for it in enforced:
                d = await self._call(True, it)
                degraded = degraded or d.degraded
                decisions[id(it)] = d
                if not d.allowed:
                    denied = d
                    denials.append(_denial(it))
                    break
        charge_shadows = denied is None and not blocked
        for it in shadows:
            d = await self._call(charge_shadows, it)
            degraded = degraded or d.degraded
            decisions[id(it)] = d
            if charge_shadows and not d.allowed:  # a denied request: its shadows only peek
                denials.append(_denial(it))
                if it.rule.name is not None:
                    shadow_denied.append(it.rule.name)
        binding = self._statuses(items, statuses, decisions)
        if denied is not None:
            binding = denied
        if binding is None:
            shadow_ds = [decisions[id(it)] for it in shadows if id(it) in decisions]
            binding = next((d for d in shadow_ds if not d.allowed),
                           shadow_ds[0] if shadow_ds else None)
        code = OVER_LIMIT if any(st.code == OVER_LIMIT for st in statuses) else OK
        result = EnvoyResult(code, statuses, binding, degraded, denials, shadow_denied)
        # the limiter counted the shadow limits' denials as "denied": say shadow_denied, as
        # POST /v1/check's check does
        note_shadow_denials(self.limiter, self.check_result(result))
        return result

    @staticmethod
    def _statuses(items: list[_Item], statuses: list[DescriptorStatus],
                  decisions: dict[int, Decision]) -> Decision | None:
        """Fill each descriptor's status from the tightest decision of its items; the
        binding enforced decision (a denial, else the least remaining)."""
        binding: Decision | None = None
        # one status per descriptor: the tightest decision of its items
        for it in items:
            d = decisions.get(id(it))
            if d is None:
                continue
            for index in it.indices:
                _status(statuses[index], d, it.shadow)
            if not it.shadow and (binding is None or not d.allowed
                                  or (binding.allowed and d.remaining < binding.remaining)):
                binding = d
        return binding

    def check_result(self, result: EnvoyResult) -> CheckResult:
        """The answer as the service's :class:`CheckResult` (for its metrics)."""
        d = result.decision
        shadow = d is not None and result.code == OK and not d.allowed
        return CheckResult(result.code == OK, d, shadow, list(result.shadow_denied),
                           result.degraded, [])


def _blocked(domain: str, descriptors: Sequence[tuple[Sequence[tuple[str, str]], int]],
             statuses: list[DescriptorStatus]) -> list[tuple[str, str]]:
    """The denials of the limits of ``requests_per_unit: 0`` (no counter, always over)."""
    return [(counter_key(domain, entries), st.limit.name or st.limit.path)
            for st, (entries, _) in zip(statuses, descriptors, strict=True)
            if st.limit is not None and st.limit.blocked]


def _denial(item: _Item) -> tuple[str, str]:
    """The key and rule label a denial is counted under (as ``POST /v1/check`` does)."""
    return item.key, item.rule.name or "(inline)"


def _status(st: DescriptorStatus, d: Decision, shadow: bool) -> None:
    """Keep the tightest decision for a descriptor (a denial, else the least remaining)."""
    prev = st.decision
    if prev is not None and (not prev.allowed or (d.allowed and prev.remaining <= d.remaining)):
        return
    st.decision = d
    st.remaining = d.remaining if d.remaining > 0 else 0
    st.reset_after = d.reset_after if d.allowed else max(d.retry_after, 0.0)
    if not d.allowed:
        st.kind = "over_limit"
        if shadow:
            st.kind = "shadow_over_limit"
        else:
            st.code = OVER_LIMIT

