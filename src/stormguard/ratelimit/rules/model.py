"""The rules file as data: one rule (:class:`RuleSpec`), a validated set (:class:`RuleSet`),
and the errors that name every problem (:class:`RulesError`)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stormguard._core import validate
from stormguard._core.errors import ConfigError
from stormguard.ratelimit.rule import DEFAULT_ALGORITHM, Rule
from stormguard.ratelimit.rules.check import CheckResult, acheck_plan, check_plan
from stormguard.ratelimit.rules.matching import SCOPES, Matcher, RequestAttrs

if TYPE_CHECKING:
    from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter

__all__ = ["FIELDS", "MAX_RULES", "RuleProblem", "RuleSet", "RuleSpec", "RulesError"]

FIELDS = ("name", "scope", "endpoint", "tier", "limit", "window", "algorithm", "burst",
          "shadow")
_REQUIRED = ("name", "scope", "limit", "window")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
MAX_RULES = 10_000
_POSITION = re.compile(r"#\d+")


@dataclass(frozen=True, slots=True)
class RuleProblem:
    """One validation problem: which rule, which field, what is wrong.

    ``rule`` is the rule's name as written (``search``), or ``#3`` (the third rule, when
    it has no usable name), ``-`` (the file or document as a whole) or ``?``."""

    rule: str
    field: str
    problem: str

    def __str__(self) -> str:
        if self.rule == "-":  # the file as a whole: no rule to name
            if self.field in ("file", "yaml"):
                return self.problem
            return f"field {self.field!r}: {self.problem}"
        label = self.rule if self.rule == "?" or _POSITION.fullmatch(self.rule) \
            else repr(self.rule)
        return f"rule {label}: field {self.field!r}: {self.problem}"


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


def _problem(exc: ConfigError) -> str:
    return f"{exc.problem} (got {exc.value!r:.80})"


def _field_name(key: object) -> str:
    """A field's (or rule's) name as text that can always be reported (a lone surrogate,
    which no rules file, Redis entry or JSON answer can hold, as its backslash escape)."""
    text = str(key)
    try:
        return validate.text("field", text, empty=True)
    except ConfigError:
        return text.encode("utf-8", "backslashreplace").decode()


def _parse_window(value: object) -> object:
    """Seconds from a duration string (``"60"``, ``"1.5"``, ``"1m"``, ``"2 hours"``); other
    values are left to :class:`~stormguard.Rule` to check."""
    if not isinstance(value, str):
        return value
    try:
        seconds = float(value)
    except ValueError:
        seconds = validate.duration("window", value)
    return int(seconds) if seconds.is_integer() else seconds


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """One rule of a rule set (see :mod:`stormguard.ratelimit.rules` for the fields)."""

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
    _matcher: Matcher = field(init=False, repr=False, compare=False)

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
        label = _field_name(name) if isinstance(name, str) and name else where
        problems = [RuleProblem(label, _field_name(k),
                                f"unknown field; expected one of {list(FIELDS)}")
                    for k in data if k not in FIELDS]
        problems += [RuleProblem(label, f, "is required") for f in _REQUIRED
                     if data.get(f) is None]
        kwargs = {k: v for k, v in data.items() if v is not None and k in FIELDS}
        if "window" in kwargs:
            try:
                kwargs["window"] = _parse_window(kwargs["window"])
            except ConfigError as exc:
                problems.append(RuleProblem(label, "window", _problem(exc)))
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
        return self._matcher.matches(a)

    def key_for(self, a: RequestAttrs) -> str:
        """The counter key of this rule for a request it matches."""
        return self._matcher.key_for(a)


def _validate(spec: RuleSpec) -> list[RuleProblem]:
    """Check every field; on success, fill in the derived fields."""
    name = spec.name
    label = _field_name(name) if isinstance(name, str) and name else "?"
    out: list[RuleProblem] = []

    def bad(fieldname: str, problem: str) -> None:
        out.append(RuleProblem(label, fieldname, problem))

    def valid(check: Callable[..., object], fieldname: str, value: object,
              *args: object) -> bool:
        try:
            check(fieldname, value, *args)
        except ConfigError as exc:
            bad(exc.field, _problem(exc))
            return False
        return True

    if valid(validate.text, "name", name) and not _NAME.fullmatch(name):
        bad("name", "must be 1-64 characters of letters, digits, '_', '.', '-' "
            f"starting with a letter or digit (got {name!r:.80})")
    fields_ok = valid(validate.one_of, "scope", spec.scope, SCOPES)
    if spec.endpoint is not None:
        fields_ok = valid(validate.text, "endpoint", spec.endpoint) and fields_ok
    if spec.tier is not None:
        fields_ok = valid(validate.text, "tier", spec.tier) and fields_ok
    valid(validate.boolean, "shadow", spec.shadow)
    matcher = None
    if fields_ok:
        try:
            matcher = Matcher.build(spec.scope, spec.endpoint, spec.tier)
        except ValueError as exc:
            bad("endpoint", str(exc))
    rule = None
    try:
        rule = Rule(spec.limit, spec.window, spec.algorithm, spec.burst,
                    name if isinstance(name, str) else None)
    except ConfigError as exc:
        bad(exc.field, _problem(exc))
    if rule is not None:
        # the Redis scripts compute in doubles: keep rules portable across every store
        try:
            validate.exact("limit", spec.limit, rule._algo.magnitude,
                           f"capacity x window in microseconds ({rule.capacity} per "
                           f"{rule.window:g} s)")
        except ConfigError as exc:
            bad("limit", f"{exc.problem}; use a shorter window or a smaller limit")
    if not out:
        object.__setattr__(spec, "rule", rule)
        object.__setattr__(spec, "_matcher", matcher)
    return out


def _yaml_problem(exc: Exception) -> str:
    """A YAML error as ``line L, column C: problem`` (the source is named by the caller;
    PyYAML's own text names the stream ``<unicode string>``)."""
    mark = getattr(exc, "problem_mark", None)
    what = getattr(exc, "problem", None)
    if mark is None or what is None:
        return f"not valid YAML: {exc}"
    context = getattr(exc, "context", None)
    return (f"not valid YAML: line {mark.line + 1}, column {mark.column + 1}: {what}"
            + (f" ({context})" if context else ""))


class RuleSet:
    """An immutable, validated set of rules with a version (for ETags)."""

    __slots__ = ("_by_name", "_matchers", "rules", "version")

    def __init__(self, rules: Iterable[RuleSpec] = (), *, version: int = 0) -> None:
        self.rules: tuple[RuleSpec, ...] = tuple(rules)
        self.version = version
        by_name: dict[str, RuleSpec] = {}
        problems = []
        for r in self.rules:
            if r.name in by_name:
                problems.append(RuleProblem(r.name, "name", "duplicate rule name"))
            by_name[r.name] = r
        if problems:
            raise RulesError(problems)
        self._by_name = by_name
        self._matchers = tuple((r._matcher, r) for r in self.rules)

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
                try:
                    version = validate.integer("version", v, minimum=0)
                except ConfigError:
                    raise RulesError([RuleProblem("-", "version",
                                                  "must be a non-negative integer")],
                                     source) from None
            data = data.get("rules")
            if data is None:
                data = []
        if not isinstance(data, list):
            raise RulesError([RuleProblem("-", "rules", "must be a list of rules")], source)
        if len(data) > MAX_RULES:
            raise RulesError([RuleProblem("-", "rules", f"at most {MAX_RULES} rules")], source)
        specs: list[RuleSpec] = []
        problems: list[RuleProblem] = []
        seen: set[str] = set()
        for i, item in enumerate(data):
            try:
                specs.append(RuleSpec.from_dict(item, where=f"#{i + 1}"))
            except RulesError as exc:
                problems.extend(exc.problems)
            name = item.get("name") if isinstance(item, Mapping) else None
            if isinstance(name, str) and name:  # reported even when the rule is invalid
                if name in seen:
                    problems.append(RuleProblem(_field_name(name), "name",
                                                "duplicate rule name"))
                seen.add(name)
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
            raise RulesError([RuleProblem("-", "yaml", _yaml_problem(exc))], source) from None
        return cls.from_data([] if data is None else data, source=source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RuleSet:
        """Read a rules file; raises :class:`RulesError` (also for an unreadable file)."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:  # the source names the path; the problem, the OS error
            raise RulesError([RuleProblem("-", "file", f"cannot read: {exc.strerror or exc}"
                                          f"{f' (errno {exc.errno})' if exc.errno else ''}")],
                             os.fspath(path)) from None
        except UnicodeDecodeError as exc:
            raise RulesError([RuleProblem("-", "file", f"cannot read: not UTF-8 text (byte "
                                          f"{exc.start})")], os.fspath(path)) from None
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
        return [r for m, r in self._matchers if m.matches(attrs)]

    # -- checking -------------------------------------------------------------------------
    def plan(self, attrs: RequestAttrs) -> list[tuple[str, RuleSpec]]:
        return [(m.key_for(attrs), r) for m, r in self._matchers if m.matches(attrs)]

    def check(self, limiter: RateLimiter, attrs: RequestAttrs, cost: int = 1) -> CheckResult:
        """Check (and consume) a request against every matching rule."""
        return check_plan(limiter, self.plan(attrs), cost)

    async def acheck(self, limiter: AsyncRateLimiter | RateLimiter, attrs: RequestAttrs,
                     cost: int = 1) -> CheckResult:
        """:meth:`check` for the async limiter (a blocking one is called directly)."""
        return await acheck_plan(limiter, self.plan(attrs), cost)
