"""Rules as data: the rules file, request matching and the per-request check.

A rules file (YAML) is a list of rules, or a mapping with ``rules:`` (and optionally
``version:``)::

    rules:
      - name: search
        scope: user              # user | api_key | ip | global
        endpoint: "GET /search*" # METHOD /path-glob; "*" or no method = any method
        tier: free               # optional: only requests of this tier
        limit: 100
        window: 60               # seconds, or "1m", "30s", "2 hours"
        algorithm: sliding_window_counter
        burst: null              # bucket algorithms only
        shadow: false            # dry run: decide and count, always allow

Several rules may match one request; all enforced (non-shadow) rules must admit it.

**Keys.** The counter key of a matched rule is ``"<scope>:<value>"`` (``"user:42"``,
``"ip:10.0.0.1"``, ``"api_key:k1"``) or ``"global"``. Each rule is turned into a
:class:`stormguard.Rule` carrying its name, so two rules on the same key never share
counters (the name is part of the rule id), and ``{"key": "user:42", "rule": "search"}``
on the service hits the same counter as a request of user 42 matched by ``search``.

**All-or-nothing.** Matched rules are grouped by key. One group is one ``hit_all``:
atomic on every store. Several groups (say a per-user and a per-IP rule) cannot be
one atomic store call, so the check first *peeks* every group but the first (consuming
nothing; a denial there ends the check with nothing consumed), then ``hit_all``\\ s
the groups in order, stopping at the first denial. Limits are never exceeded (each
``hit_all`` is atomic); only when concurrent requests race between the peek and the
hit can a denied request have been charged to an earlier group.

**Shadow rules** are evaluated only when the enforced rules admit the request (a
denied request consumes nothing anywhere), each on its own (``hit``), and never change
the answer; their denials are reported in ``shadow_denied``.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from stormguard._core import validate
from stormguard._core.errors import ConfigError
from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter
from stormguard.ratelimit.rule import _UNITS, DEFAULT_ALGORITHM, Rule
from stormguard.stores.base import check_cost

__all__ = [
    "FIELDS",
    "SCOPES",
    "CheckResult",
    "Plan",
    "RequestAttrs",
    "RuleProblem",
    "RuleSet",
    "RuleSpec",
    "RulesError",
    "acheck_plan",
    "check_flow",
    "check_plan",
]

SCOPES = ("user", "api_key", "ip", "global")
FIELDS = ("name", "scope", "endpoint", "tier", "limit", "window", "algorithm", "burst",
          "shadow")
_REQUIRED = ("name", "scope", "limit", "window")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE",
                      "CONNECT"})
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*")
MAX_RULES = 10_000
_EXACT = 2**53
_EXACT_ANY_SIZE = frozenset({"fixed_window", "sliding_window_log"})


@dataclass(frozen=True, slots=True)
class RuleProblem:
    """One validation problem: which rule, which field, what is wrong."""

    rule: str
    field: str
    problem: str

    def __str__(self) -> str:
        return f"rule {self.rule}: field {self.field!r}: {self.problem}"


class RulesError(ConfigError):
    """A rule set is invalid. ``problems`` lists every problem found (rule, field, problem);
    the message names them. Nothing was applied."""

    def __init__(self, problems: Sequence[RuleProblem], source: str | None = None) -> None:
        first = problems[0]
        super().__init__(first.field, None, first.problem)
        self.problems = list(problems)
        self.source = source
        text = "; ".join(str(p) for p in self.problems)
        self.args = (f"{source}: {text}" if source else text,)

    def to_list(self) -> list[dict[str, str]]:
        return [{"rule": p.rule, "field": p.field, "problem": p.problem} for p in self.problems]


class RequestAttrs(NamedTuple):
    """What the rules match on. ``None`` means "not known"; a rule scoped to an
    attribute that is ``None`` does not apply to the request. (A named tuple: built
    once per request on the hot path.)"""

    user: str | None = None
    api_key: str | None = None
    ip: str | None = None
    method: str | None = None
    path: str | None = None
    tier: str | None = None


def _parse_window(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("must be a number of seconds or a duration like '1m'")
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        m = _DURATION.fullmatch(value)
        if m is not None and m[2].lower() in _UNITS:
            w = float(m[1]) * _UNITS[m[2].lower()]
            return int(w) if w == int(w) else w
        try:
            return float(value)
        except ValueError:
            pass
    raise ValueError("must be a number of seconds or a duration like '60s', '1m', '2 hours'")


def _parse_endpoint(endpoint: str) -> tuple[str | None, re.Pattern[str] | None]:
    text = endpoint.strip()
    method: str | None = None
    path = text
    if " " in text:
        method, _, path = text.partition(" ")
        path = path.strip()
        method = method.upper()
        if method == "*":
            method = None
        elif method not in _METHODS:
            raise ValueError(f"unknown HTTP method {method!r} in {endpoint!r}")
    elif text.upper() in _METHODS:
        return text.upper(), None
    if not path.startswith("/") and path != "*":
        raise ValueError(f"expected 'METHOD /path-glob' such as 'GET /search*', got {endpoint!r}")
    pattern = None if path in ("*", "/*") else re.compile(fnmatch.translate(path))
    return method, pattern


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """One rule of a rule set (see the module docstring for the fields)."""

    name: str
    scope: str
    limit: int
    window: float
    endpoint: str | None = None
    tier: str | None = None
    algorithm: str = DEFAULT_ALGORITHM
    burst: int | None = None
    shadow: bool = False
    rule: Rule = field(init=False, repr=False, compare=False)
    _method: str | None = field(init=False, repr=False, compare=False)
    _path: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = _validate(self)
        if problems:
            raise RulesError(problems)

    @classmethod
    def from_dict(cls, data: object, *, where: str = "#1") -> RuleSpec:
        """Build from a mapping with the fields of :data:`FIELDS`; raises RulesError."""
        if not isinstance(data, Mapping):
            raise RulesError([RuleProblem(where, "rule", "must be a mapping of fields")])
        name = data.get("name")
        label = repr(name) if isinstance(name, str) and name else where
        problems = [RuleProblem(label, _field_name(k),
                                f"unknown field; expected one of {list(FIELDS)}")
                    for k in data if k not in FIELDS]
        problems += [RuleProblem(label, f, "is required") for f in _REQUIRED
                     if data.get(f) is None]
        kwargs = {k: v for k, v in data.items() if v is not None and k in FIELDS}
        if "window" in kwargs:
            try:
                kwargs["window"] = _parse_window(kwargs["window"])
            except ValueError as exc:
                problems.append(RuleProblem(label, "window", str(exc)))
                kwargs["window"] = 1
        if any(p.problem == "is required" for p in problems):
            raise RulesError(problems)
        try:
            spec = cls(**kwargs)
        except RulesError as exc:
            problems += [RuleProblem(label, p.field, p.problem) for p in exc.problems]
        if problems:
            raise RulesError(problems)
        return spec

    def to_dict(self, *, full: bool = True) -> dict[str, Any]:
        """The rule as data; ``full=False`` leaves out fields at their default."""
        d: dict[str, Any] = {"name": self.name, "scope": self.scope, "endpoint": self.endpoint,
                             "tier": self.tier, "limit": self.limit, "window": self.window,
                             "algorithm": self.algorithm, "burst": self.burst,
                             "shadow": self.shadow}
        if not full:
            d = {k: v for k, v in d.items() if v is not None and v is not False}
        return d

    def matches(self, a: RequestAttrs) -> bool:
        if self.tier is not None and a.tier != self.tier:
            return False
        if self._method is not None and (a.method is None or a.method.upper() != self._method):
            return False
        if self._path is not None and (a.path is None or self._path.match(a.path) is None):
            return False
        return self.scope == "global" or getattr(a, self.scope) is not None

    def key_for(self, a: RequestAttrs) -> str:
        """The counter key of this rule for a request it matches."""
        if self.scope == "global":
            return "global"
        return f"{self.scope}:{getattr(a, self.scope)}"


def _not_text(fieldname: str, value: str) -> str | None:
    """The problem of a string no rules file, Redis entry or JSON answer could hold (a
    lone UTF-16 surrogate such as ``"\\ud800"``: stored, it could never be read back)."""
    try:
        validate.text(fieldname, value, empty=True)
    except ConfigError as exc:
        return f"{exc.problem}: no rules file, Redis entry or JSON answer can hold it"
    return None


def _field_name(key: object) -> str:
    text = str(key)
    return text if _not_text("field", text) is None else \
        text.encode("utf-8", "backslashreplace").decode()


def _validate(spec: RuleSpec) -> list[RuleProblem]:
    """Check every field; on success, fill in the derived fields."""
    name = spec.name
    label = repr(name) if isinstance(name, str) else "?"
    out: list[RuleProblem] = []

    def bad(fieldname: str, problem: str) -> None:
        out.append(RuleProblem(label, fieldname, problem))

    if not isinstance(name, str) or not _NAME.fullmatch(name):
        bad("name", "must be 1-64 characters of letters, digits, '_', '.', '-' "
            f"starting with a letter or digit (got {name!r:.80})")
    if spec.scope not in SCOPES:
        bad("scope", f"must be one of {list(SCOPES)} (got {spec.scope!r:.80})")
    method: str | None = None
    path: re.Pattern[str] | None = None
    if spec.endpoint is not None:
        if not isinstance(spec.endpoint, str):
            bad("endpoint", f"must be a string like 'GET /search*' (got {spec.endpoint!r:.80})")
        elif (problem := _not_text("endpoint", spec.endpoint)) is not None:
            bad("endpoint", problem)
        else:
            try:
                method, path = _parse_endpoint(spec.endpoint)
            except ValueError as exc:
                bad("endpoint", str(exc))
    if spec.tier is not None and (not isinstance(spec.tier, str) or not spec.tier):
        bad("tier", f"must be a non-empty string (got {spec.tier!r:.80})")
    elif spec.tier is not None and (problem := _not_text("tier", spec.tier)) is not None:
        bad("tier", problem)
    if not isinstance(spec.shadow, bool):
        bad("shadow", f"must be true or false (got {spec.shadow!r:.80})")
    rule = None
    try:
        rule = Rule(spec.limit, spec.window, spec.algorithm, spec.burst,
                    name if isinstance(name, str) else None)
    except ConfigError as exc:
        bad(exc.field, f"{exc.problem} (got {exc.value!r:.80})")
    except TypeError as exc:  # pragma: no cover - Rule validates types itself
        bad("rule", str(exc))
    if rule is not None and rule.algorithm not in _EXACT_ANY_SIZE \
            and rule.capacity * round(rule.window * 1_000_000) + rule.limit >= _EXACT:
        # the Redis scripts compute in doubles: keep rules portable across every store
        bad("limit", f"{rule.capacity} per {rule.window:g} s is too large for exact "
            "arithmetic on Redis: capacity x window in microseconds must stay below 2**53; "
            "use a shorter window or a smaller limit")
    if not out:
        object.__setattr__(spec, "rule", rule)
        object.__setattr__(spec, "_method", method)
        object.__setattr__(spec, "_path", path)
    return out


class RuleSet:
    """An immutable, validated set of rules with a version (for ETags)."""

    __slots__ = ("_by_name", "rules", "version")

    def __init__(self, rules: Iterable[RuleSpec] = (), *, version: int = 0) -> None:
        self.rules: tuple[RuleSpec, ...] = tuple(rules)
        self.version = version
        by_name: dict[str, RuleSpec] = {}
        problems = []
        for r in self.rules:
            if r.name in by_name:
                problems.append(RuleProblem(repr(r.name), "name", "duplicate rule name"))
            by_name[r.name] = r
        if problems:
            raise RulesError(problems)
        self._by_name = by_name

    # -- loading ------------------------------------------------------------------------
    @classmethod
    def from_data(cls, data: object, *, source: str | None = None,
                  version: int | None = None) -> RuleSet:
        """From a list of rule mappings or ``{"rules": [...], "version": n}``; all problems
        of all rules are collected into one :class:`RulesError`."""
        if isinstance(data, Mapping):
            extra = [k for k in data if k not in ("rules", "version")]
            if extra:
                raise RulesError([RuleProblem("-", str(extra[0]),
                                              "unknown top-level key; expected 'rules' "
                                              "(and optionally 'version')")], source)
            v = data.get("version", 0)
            if version is None:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise RulesError([RuleProblem("-", "version",
                                                  "must be a non-negative integer")], source)
                version = v
            data = data.get("rules")
            if data is None:
                data = []
        if not isinstance(data, list):
            raise RulesError([RuleProblem("-", "rules", "must be a list of rules")], source)
        if len(data) > MAX_RULES:
            raise RulesError([RuleProblem("-", "rules", f"at most {MAX_RULES} rules")], source)
        specs: list[RuleSpec] = []
        problems: list[RuleProblem] = []
        for i, item in enumerate(data):
            try:
                specs.append(RuleSpec.from_dict(item, where=f"#{i + 1}"))
            except RulesError as exc:
                problems.extend(exc.problems)
        if not problems:
            try:
                return cls(specs, version=version or 0)
            except RulesError as exc:
                problems.extend(exc.problems)
        raise RulesError(problems, source)

    @classmethod
    def loads(cls, text: str, *, source: str = "<rules>") -> RuleSet:
        """Parse YAML (or JSON, which is YAML) text."""
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise RulesError([RuleProblem("-", "yaml", f"not valid YAML: {exc}")],
                             source) from None
        return cls.from_data([] if data is None else data, source=source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RuleSet:
        """Read a rules file; raises :class:`RulesError` (also for an unreadable file)."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise RulesError([RuleProblem("-", "file", f"cannot read: {exc}")],
                             os.fspath(path)) from None
        return cls.loads(text, source=os.fspath(path))

    @classmethod
    def coerce(cls, rules: RuleSet | Iterable[RuleSpec | Mapping[str, Any]] | str
               | os.PathLike[str]) -> RuleSet:
        """A RuleSet from a RuleSet, a rules-file path, or a list of specs/mappings."""
        if isinstance(rules, RuleSet):
            return rules
        if isinstance(rules, str | os.PathLike):
            return cls.load(rules)
        items = list(rules)
        if all(isinstance(r, RuleSpec) for r in items):
            return cls(r for r in items if isinstance(r, RuleSpec))
        return cls.from_data([r.to_dict() if isinstance(r, RuleSpec) else r for r in items])

    def to_data(self) -> dict[str, Any]:
        return {"version": self.version, "rules": [r.to_dict(full=False) for r in self.rules]}

    def dumps(self) -> str:
        """YAML text that :meth:`loads` reads back to an equal rule set."""
        import yaml

        text: str = yaml.safe_dump(self.to_data(), sort_keys=False, allow_unicode=True)
        return text

    # -- editing (each returns a new set) -----------------------------------------------
    def with_rule(self, spec: RuleSpec, *, version: int) -> RuleSet:
        rules = [spec if r.name == spec.name else r for r in self.rules]
        if spec.name not in self._by_name:
            rules.append(spec)
        return RuleSet(rules, version=version)

    def without(self, name: str, *, version: int) -> RuleSet:
        return RuleSet((r for r in self.rules if r.name != name), version=version)

    # -- lookups --------------------------------------------------------------------------
    def get(self, name: str) -> RuleSpec | None:
        return self._by_name.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[RuleSpec]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RuleSet):
            return NotImplemented
        return self.rules == other.rules

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value: no hashing

    def __repr__(self) -> str:
        return f"RuleSet({len(self.rules)} rules, version={self.version})"

    def match(self, attrs: RequestAttrs) -> list[RuleSpec]:
        """The rules that apply to a request, in file order."""
        return [r for r in self.rules if r.matches(attrs)]

    # -- checking -------------------------------------------------------------------------
    def plan(self, attrs: RequestAttrs) -> list[tuple[str, RuleSpec]]:
        return [(r.key_for(attrs), r) for r in self.rules if r.matches(attrs)]

    def check(self, limiter: RateLimiter, attrs: RequestAttrs, cost: int = 1) -> CheckResult:
        """Check (and consume) a request against every matching rule."""
        return check_plan(limiter, self.plan(attrs), cost)

    async def acheck(self, limiter: AsyncRateLimiter | RateLimiter, attrs: RequestAttrs,
                     cost: int = 1) -> CheckResult:
        """:meth:`check` for the async limiter (a blocking one is called directly)."""
        return await acheck_plan(limiter, self.plan(attrs), cost)


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

    def headers(self) -> dict[str, str]:
        d = self.decision
        if d is None:
            return {}
        if self.shadow and not d.allowed:
            # a shadow rule never blocks: report it as the answer the client gets
            d = Decision(True, d.limit, d.remaining, d.reset_after, 0.0, d.rule, d.degraded)
        return d.headers()


# A step asks the driver for one store call: (consume, key, rules, cost).
# consume=True -> limiter.hit_all(key, rules, cost) (hit for one rule);
# consume=False -> limiter.peek(key, rules[0], cost)
Step = tuple[bool, str, tuple[Rule, ...], int]
Flow = Generator[Step, Decision, CheckResult]


def check_flow(matched: Sequence[tuple[str, RuleSpec]], cost: int = 1) -> Flow:
    """The sans-I/O check: yields store calls, receives decisions, returns the result."""
    if cost != 1:
        for _, spec in matched:
            check_cost(spec.rule, cost)  # before any store call: never half-charged
    groups: dict[str, list[Rule]] = {}
    shadows: list[tuple[str, RuleSpec]] = []
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


Plan = Sequence[tuple[str, RuleSpec]]


def check_plan(limiter: RateLimiter, plan: Plan, cost: int = 1) -> CheckResult:
    """Check a request's matched ``(key, rule)`` pairs with a blocking limiter."""
    if len(plan) == 1 and not plan[0][1].shadow:  # the common case, without the flow
        key, spec = plan[0]
        d = limiter.hit(key, spec.rule, cost)
        return CheckResult(d.allowed, d, False, [], d.degraded, [spec.name])
    return run_sync(limiter, check_flow(plan, cost))


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
