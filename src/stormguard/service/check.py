"""The check API: ``POST /v1/check`` (a raw ASGI handler, the hot path) and
``POST /v1/check/batch``. A check is a key and a rule name, a key and an inline limit
(:mod:`.inline`), or request attributes that the rules match; every answer carries
``reset`` (epoch seconds)."""

from __future__ import annotations

import asyncio
import functools
import json
import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from stormguard._core.errors import ConfigError
from stormguard.ratelimit.rules import (
    CheckResult,
    Matched,
    Plan,
    RequestAttrs,
    RuleSet,
    acheck_plan,
    apeek_plan,
)
from stormguard.service.base import ServiceBase
from stormguard.service.http import ApiError, json_response, loads, read_body, read_json
from stormguard.service.inline import INLINE_FIELDS, InlineRule, parse_inline, reset_epoch
from stormguard.stores.base import check_cost
from stormguard.stores.memory import MemoryStore

__all__ = ["MAX_BATCH", "MAX_EVALUATIONS", "MAX_KEY", "MAX_MATCHES", "CheckEndpoints",
           "parse_check", "plan_check", "result_dict", "result_json"]

MAX_BATCH = 1000
MAX_KEY = 4096
MAX_EVALUATIONS = 500_000
"""Rule evaluations one request may cost: checks by request attributes x rules in the
set (matching such a check looks at every rule; a key+rule check looks up one). 1,000
checks against 500 rules; a single check always fits."""
MAX_MATCHES = 10_000
"""Matched (check, rule) pairs one request may cost (each is store work). A single check
always fits: a rule set holds at most ``MAX_RULES`` (10,000) rules."""
_YIELD_EVERY = 20_000
"""Rule evaluations (a matched pair counts 20) between two yields to the event loop in a
batch: about 5-10 ms of work in pure Python."""
_ATTRS = ("user", "api_key", "ip", "method", "path", "tier")
_CHECK_FIELDS = frozenset(("key", "rule", "cost", "peek", "limits", *_ATTRS, *INLINE_FIELDS))
MAX_LIMITS = 16
"""Inline limits one check may carry in ``limits`` (all-or-nothing on its key)."""


@functools.lru_cache(maxsize=4096)
def _jstr(text: str | None) -> str:
    return json.dumps(text)


def _names(names: list[str]) -> str:
    return "[" + ",".join(_jstr(n) for n in names) + "]" if names else "[]"


def result_dict(result: CheckResult, now: float) -> dict[str, object]:
    """An answer of the check API: ``CheckResult.to_dict()`` and ``reset`` (epoch s)."""
    return {**result.to_dict(), "reset": reset_epoch(result, now)}


def result_json(result: CheckResult, now: float) -> bytes:
    """:func:`result_dict` as JSON, formatted directly (the hot path of /v1/check)."""
    d = result.decision
    tail = (f'"degraded":{"true" if result.degraded else "false"},'
            f'"shadow_denied":{_names(result.shadow_denied)},"rules":{_names(result.rules)},'
            f'"reset":{reset_epoch(result, now)}}}')
    if d is None:
        return ('{"allowed":true,"limit":null,"remaining":null,"reset_after":0.0,'
                '"retry_after":0.0,"rule":null,"shadow":false,' + tail).encode()
    rule = d.rule.name if d.rule is not None else None
    return (f'{{"allowed":{"true" if result.allowed else "false"},"limit":{d.limit},'
            f'"remaining":{d.remaining},"reset_after":{round(d.reset_after, 6)!r},'
            f'"retry_after":{round(d.retry_after, 6)!r},"rule":{_jstr(rule)},'
            f'"shadow":{"true" if result.shadow else "false"},' + tail).encode()


class Check:
    """One validated check request."""

    __slots__ = ("attrs", "cost", "key", "peek", "specs")

    def __init__(self, key: str | None, specs: tuple[Matched, ...], attrs: RequestAttrs | None,
                 cost: int, peek: bool = False) -> None:
        self.key = key
        self.specs = specs
        self.attrs = attrs
        self.cost = cost
        self.peek = peek

    @property
    def spec(self) -> Matched | None:
        """The one rule of a key+rule (or key+limit) check."""
        return self.specs[0] if len(self.specs) == 1 else None


def _parse_limits(obj: dict[str, object], where: str) -> tuple[InlineRule, ...]:
    items = obj["limits"]
    if not isinstance(items, list) or not items or len(items) > MAX_LIMITS:
        raise ApiError(422, f"{where}limits: must be a list of 1 to {MAX_LIMITS} inline "
                       "limits ({\"limit\", \"window\", ...})", field=f"{where}limits")
    out = []
    for i, item in enumerate(items):
        at = f"{where}limits[{i}]."
        if not isinstance(item, dict):
            raise ApiError(422, f"{at[:-1]}: must be a JSON object", field=at[:-1])
        out.append(parse_inline(item, at, named=True))
    ids = [s.rule.id for s in out]
    dup = next((i for i, rid in enumerate(ids) if rid in ids[:i]), None)
    if dup is not None:
        raise ApiError(422, f"{where}limits[{dup}]: the same limit twice (give each a "
                       "different 'name' to count them apart)", field=f"{where}limits[{dup}]")
    return tuple(out)


def parse_check(obj: object, rules: RuleSet, where: str = "") -> Check:
    if not isinstance(obj, dict):
        raise ApiError(422, f"{where or 'body'}: must be a JSON object")
    unknown = [k for k in obj if k not in _CHECK_FIELDS]
    if unknown:
        raise ApiError(422, f"{where}{unknown[0]}: unknown field; expected some of "
                       f"{sorted(_CHECK_FIELDS)}", field=f"{where}{unknown[0]}"[:200])
    cost = obj.get("cost", 1)
    if isinstance(cost, bool) or not isinstance(cost, int) or cost <= 0:
        raise ApiError(422, f"{where}cost: must be a positive integer (got {cost!r:.40})",
                       field=f"{where}cost")
    for name in _ATTRS:
        v = obj.get(name)
        if v is not None and not isinstance(v, str):
            raise ApiError(422, f"{where}{name}: must be a string (got {v!r:.40})",
                           field=f"{where}{name}")
    peek = obj.get("peek", False)
    if not isinstance(peek, bool):
        raise ApiError(422, f"{where}peek: must be true or false (got {peek!r:.40})",
                       field=f"{where}peek")
    key, rule = obj.get("key"), obj.get("rule")
    inline = [n for n in INLINE_FIELDS if obj.get(n) is not None]
    if obj.get("limits") is not None:
        inline.append("limits")
    if key is not None or rule is not None or inline:
        if not isinstance(key, str) or not key or len(key) > MAX_KEY:
            raise ApiError(422, f"{where}key: must be a non-empty string of at most {MAX_KEY} "
                           f"characters when 'rule' or 'limit' is given (got {key!r:.40})",
                           field=f"{where}key")
        if inline and rule is not None:
            raise ApiError(422, f"{where}{inline[0]}: give either a rule name or an inline "
                           "limit, not both", field=f"{where}{inline[0]}")
        attrs = [n for n in _ATTRS if obj.get(n) is not None]
        if attrs:
            raise ApiError(422, f"{where}{attrs[0]}: give either key+rule (or key+limit) or "
                           "request attributes, not both", field=f"{where}{attrs[0]}")
        if "limits" in inline:
            if len(inline) > 1:
                raise ApiError(422, f"{where}{inline[0]}: give either one inline limit or "
                               "'limits', not both", field=f"{where}{inline[0]}")
            return Check(key, _parse_limits(obj, where), None, cost, peek)
        if inline:
            return Check(key, (parse_inline(obj, where),), None, cost, peek)
        names = rule if isinstance(rule, list) else [rule]
        if (not names or len(names) > MAX_LIMITS
                or not all(isinstance(n, str) for n in names)):
            raise ApiError(422, f"{where}rule: must be a rule name (or a list of 1 to "
                           f"{MAX_LIMITS} rule names, all or nothing on the key) when 'key' "
                           f"is given (got {rule!r:.40})", field=f"{where}rule")
        specs = []
        for n in names:
            assert isinstance(n, str)
            spec = rules.get(n)
            if spec is None:
                raise ApiError(404, f"{where}rule: unknown rule {n!r:.80}", field=f"{where}rule")
            if spec in specs:
                raise ApiError(422, f"{where}rule: {n!r:.80} given twice", field=f"{where}rule")
            specs.append(spec)
        return Check(key, tuple(specs), None, cost, peek)
    if peek:
        raise ApiError(422, f"{where}peek: only with key+rule or key+limit checks",
                       field=f"{where}peek")
    a = RequestAttrs(obj.get("user"), obj.get("api_key"), obj.get("ip"), obj.get("method"),
                     obj.get("path"), obj.get("tier"))
    return Check(None, (), a, cost)


def plan_check(c: Check, rules: RuleSet, where: str = "") -> Plan:
    """The ``(key, rule)`` pairs of a check; a cost above any of their capacities is
    a 422 here, before anything is consumed (a batch is refused whole)."""
    if c.specs and c.key is not None:
        key = c.key
        plan: Plan = [(key, spec) for spec in c.specs]
    else:
        assert c.attrs is not None
        plan = rules.plan(c.attrs)
    if c.cost != 1:
        for _, spec in plan:
            try:
                check_cost(spec.rule, c.cost)
            except ConfigError as exc:
                raise ApiError(422, f"{where}{exc}", field=f"{where}cost") from None
    return plan


class CheckEndpoints(ServiceBase):
    """``POST /v1/check`` and ``POST /v1/check/batch``."""

    @staticmethod
    def _plan(c: Check, rules: RuleSet, where: str = "") -> Plan:
        return plan_check(c, rules, where)

    async def _run(self, plan: Plan, cost: int, peek: bool = False) -> CheckResult:
        t0 = time.perf_counter()
        try:
            if peek:
                result = await apeek_plan(self.limiter, plan, cost)
            else:
                result = await acheck_plan(self.limiter, plan, cost)
        except ConfigError as exc:  # a rule this store cannot enforce: say so, never a 500
            raise ApiError(422, f"the store refuses the rule: {exc}"[:500],
                           field=exc.field) from None
        if not peek:  # a peek decides nothing: it is not counted as a check
            self.metrics.record(result, time.perf_counter() - t0)
            self.observe(plan, result)
        if plan and all(type(spec) is InlineRule for _, spec in plan):
            # inline limits are not rules of the service: no rule names in the answer
            result.rules = [spec.name for _, spec in plan if spec.name]
        return result

    async def check(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/check`` as a raw ASGI handler (the hot path skips the router)."""
        headers: list[tuple[bytes, bytes]]
        try:
            if not self._started:
                await self.start()
            rules = self.source.current
            c = parse_check(loads(await read_body(scope, receive)), rules)
            result = await self._run(plan_check(c, rules), c.cost, c.peek)
            status, body = 200, result_json(result, self.limiter.store.clock.wall())
            headers = [(k.lower().encode(), v.encode()) for k, v in result.headers().items()]
        except ApiError as exc:
            status, body = exc.status, exc.body()
            headers = [(k.lower().encode(), v.encode("latin-1")) for k, v in exc.headers.items()]
        headers.append((b"content-type", b"application/json"))
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def check_batch(self, request: Request) -> Response:
        if not self._started:
            await self.start()
        body = await read_json(request)
        items = body.get("checks") if isinstance(body, dict) else None
        if not isinstance(body, dict) or set(body) != {"checks"} or not isinstance(items, list):
            raise ApiError(422, "body: must be {\"checks\": [check, ...]}", field="checks")
        if len(items) > MAX_BATCH:
            raise ApiError(422, f"checks: at most {MAX_BATCH} checks per batch", field="checks")
        rules = self.source.current
        # plan everything before any store call: a refused batch consumes nothing
        plans = []
        evaluations = matches = work = 0
        for i, item in enumerate(items):
            c = parse_check(item, rules, f"checks[{i}].")
            if c.attrs is not None:  # matching by attributes looks at every rule
                evaluations += len(rules)
                if evaluations > MAX_EVALUATIONS:
                    most = MAX_EVALUATIONS // len(rules)
                    raise ApiError(422, f"checks: matching the batch against the {len(rules)} "
                                   f"rules takes more than {MAX_EVALUATIONS} rule evaluations "
                                   f"(at checks[{i}]), more than one request may cost: send "
                                   f"at most {most} checks by request attributes per batch",
                                   field="checks")
                work += len(rules)
            plan = plan_check(c, rules, f"checks[{i}].")
            matches += len(plan)
            if matches > MAX_MATCHES:
                raise ApiError(422, f"checks: the batch matches more than {MAX_MATCHES} "
                               f"(check, rule) pairs (at checks[{i}]), more than one request "
                               "may cost: send smaller batches", field="checks")
            plans.append((plan, c.cost, c.peek))
            if work >= _YIELD_EVERY:
                work = 0
                await asyncio.sleep(0)  # let other requests in between
        if isinstance(self.limiter.store, MemoryStore):
            # never waits on I/O: one task per check would only add overhead
            results = []
            for plan, cost, peek in plans:
                results.append(await self._run(plan, cost, peek))
                work += 20 * len(plan)
                if work >= _YIELD_EVERY:
                    work = 0
                    await asyncio.sleep(0)
        else:
            # concurrently, as the library's own concurrent path: the store batches the
            # checks in flight together (one round trip per batch and node, not per check)
            answers = await asyncio.gather(*(self._run(plan, cost, peek)
                                             for plan, cost, peek in plans),
                                           return_exceptions=True)
            for answer in answers:
                if isinstance(answer, BaseException):
                    raise answer
            results = [a for a in answers if not isinstance(a, BaseException)]
        now = self.limiter.store.clock.wall()
        return json_response({"results": [result_dict(r, now) for r in results]})
