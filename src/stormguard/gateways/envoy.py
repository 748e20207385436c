"""envoyproxy/ratelimit's configuration format, loaded unchanged, and its descriptor lookup.

A file holds one ``domain`` and a tree of ``descriptors``; each node has a ``key``, an
optional ``value`` (``*`` matches any run of characters, at the end or inside the value),
an optional ``rate_limit`` and child ``descriptors``. A request descriptor (a list of
``(key, value)`` entries) walks the tree one entry per level, as envoyproxy/ratelimit does:
at each level the node ``key_value`` (exact) is tried first, then the wildcard nodes of that
key in file order, then the key-only node (which matches any value, each value counted
apart). The limit is the one on the node reached by the descriptor's last entry.

stormguard's extension inside ``rate_limit``: ``algorithm`` (default ``fixed_window``, what
envoyproxy/ratelimit counts) and ``burst``; envoyproxy/ratelimit itself refuses both keys, so
a file using them is a stormguard file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from stormguard._core import validate
from stormguard._core.errors import ConfigError
from stormguard.ratelimit.algorithms import ALGORITHMS
from stormguard.ratelimit.rule import Rule

__all__ = ["UNITS", "EnvoyConfig", "EnvoyConfigError", "EnvoyLimit", "load_envoy_config"]

UNITS: dict[str, tuple[int, int]] = {
    # unit -> (seconds, the RateLimitResponse.RateLimit.Unit enum value)
    "second": (1, 1), "minute": (60, 2), "hour": (3600, 3), "day": (86400, 4),
    "week": (7 * 86400, 7), "month": (30 * 86400, 5), "year": (365 * 86400, 6),
}
"""The units of envoyproxy/ratelimit (a month is 30 days, a year 365, as there)."""
DEFAULT_ALGORITHM = "fixed_window"
_ROOT_KEYS = ("domain", "descriptors")
_DESCRIPTOR_KEYS = ("key", "value", "rate_limit", "descriptors", "shadow_mode",
                    "detailed_metric")
_LIMIT_KEYS = ("unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm",
               "burst")
_TRUE = frozenset(("y", "yes", "true", "on"))  # YAML 1.1 booleans, as Go's yaml.v2 reads them
_FALSE = frozenset(("n", "no", "false", "off"))
_SAFE = re.compile(r"[A-Za-z0-9_.\-*]*")
MAX_REQUESTS = 2**32 - 1  # requests_per_unit is a uint32 in the protocol


class EnvoyConfigError(ConfigError):
    """An invalid envoyproxy/ratelimit configuration: the message names the file, the
    descriptor path (``descriptors[0].descriptors[1]``) and the field."""

    def __init__(self, file: str, path: str, fieldname: str, problem: str) -> None:
        self.file = file
        self.path = path
        where = f"{path}.{fieldname}" if path and fieldname else path or fieldname
        ConfigError.__init__(self, fieldname or "config", None, problem)
        self.args = (f"{file}: {where}: {problem}" if where else f"{file}: {problem}",)


@dataclass(frozen=True, slots=True, eq=False)
class EnvoyLimit:
    """The ``rate_limit`` of one descriptor node.

    ``rule`` is None for ``unlimited: true`` and for ``requests_per_unit: 0`` (every request
    over the limit, as envoyproxy/ratelimit answers it: ``blocked``)."""

    path: str
    """The node's full key, ``domain.key_value.key`` (envoyproxy/ratelimit's stats key)."""
    name: str
    """``rate_limit.name`` (empty when not given): what ``replaces`` refers to."""
    unit: str
    unit_code: int
    requests_per_unit: int
    shadow: bool
    unlimited: bool
    replaces: tuple[str, ...]
    rule: Rule | None
    seconds: int

    @property
    def blocked(self) -> bool:
        return not self.unlimited and self.requests_per_unit == 0


@dataclass(slots=True, eq=False)
class _Node:
    limit: EnvoyLimit | None = None
    children: dict[str, _Node] = field(default_factory=dict)
    wildcards: list[tuple[str, re.Pattern[str], _Node]] = field(default_factory=list)


def _wildcard(value: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in value.split("*")), re.DOTALL)


@dataclass(slots=True, eq=False)
class EnvoyConfig:
    """Every domain of an envoyproxy/ratelimit configuration (one or more files)."""

    domains: dict[str, _Node] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    def lookup(self, domain: str, entries: Sequence[tuple[str, str]]) -> EnvoyLimit | None:
        """The limit of one request descriptor (None: unknown domain or descriptor)."""
        node = self.domains.get(domain)
        if node is None:
            return None
        found: EnvoyLimit | None = None
        last = len(entries) - 1
        for i, (key, value) in enumerate(entries):
            nxt = node.children.get(f"{key}_{value}")
            if nxt is None and node.wildcards:
                for wkey, pattern, wnode in node.wildcards:
                    if wkey == key and pattern.fullmatch(value):
                        nxt = wnode
                        break
            if nxt is None:
                nxt = node.children.get(key)
            if nxt is None:
                break
            if nxt.limit is not None and i == last:
                found = nxt.limit
            if not nxt.children and not nxt.wildcards:
                break
            node = nxt
        return found

    def limits(self) -> list[EnvoyLimit]:
        """Every limit of every domain (file order)."""
        out: list[EnvoyLimit] = []
        stack = list(reversed(self.domains.values()))
        while stack:
            node = stack.pop()
            if node.limit is not None:
                out.append(node.limit)
            kids = [*node.children.values()]
            stack.extend(reversed(kids))
        return out


def counter_key(domain: str, entries: Sequence[tuple[str, str]]) -> str:
    """The store key of a request descriptor: the domain and the request's own entries
    (so a key-only or wildcard node counts each value apart), each part percent-encoded
    unless it is plain (no ambiguity between ``a_b`` + ``c`` and ``a`` + ``b_c``)."""
    parts = [domain if _SAFE.fullmatch(domain) else quote(domain, safe="")]
    for k, v in entries:
        parts.append(k if _SAFE.fullmatch(k) else quote(k, safe=""))
        parts.append(v if _SAFE.fullmatch(v) else quote(v, safe=""))
    return "envoy:" + ":".join(parts)


def _text(file: str, path: str, fieldname: str, value: object, *,
          required: bool = False) -> str:
    if value is None or value == "":
        if required:
            raise EnvoyConfigError(file, path, fieldname, "is required and must not be empty")
        return ""
    if not isinstance(value, str):
        raise EnvoyConfigError(file, path, fieldname,
                               f"must be a string (got {type(value).__name__})")
    return value


def _bool(file: str, path: str, fieldname: str, value: object) -> bool:
    if value is None:
        return False
    if isinstance(value, str):
        low = value.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    raise EnvoyConfigError(file, path, fieldname, f"must be true or false (got {value!r:.40})")


def _int(file: str, path: str, fieldname: str, value: object, *, lo: int, hi: int) -> int:
    try:
        n = int(str(value).strip(), 10)
    except ValueError:
        raise EnvoyConfigError(file, path, fieldname,
                               f"must be an integer (got {value!r:.40})") from None
    if not lo <= n <= hi:
        raise EnvoyConfigError(file, path, fieldname, f"must be {lo}..{hi} (got {n})")
    return n


def _mapping(file: str, path: str, value: object, allowed: tuple[str, ...],
             what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise EnvoyConfigError(file, path, "", f"{what} must be a mapping")
    for k in value:
        if k not in allowed:
            raise EnvoyConfigError(file, path, str(k),
                                   f"unknown key; expected one of {', '.join(allowed)}")
    return value


def _limit(file: str, path: str, full_key: str, data: object, shadow: bool) -> EnvoyLimit:
    where = f"{path}.rate_limit"
    d = _mapping(file, where, data, _LIMIT_KEYS, "rate_limit")
    unlimited = _bool(file, where, "unlimited", d.get("unlimited"))
    unit = _text(file, where, "unit", d.get("unit")).lower()
    name = _text(file, where, "name", d.get("name"))
    if unlimited:
        if unit in UNITS:
            raise EnvoyConfigError(file, where, "unit", "must not be given when unlimited "
                                   "is true")
        unit = ""
    elif unit not in UNITS:
        raise EnvoyConfigError(file, where, "unit", f"invalid unit {d.get('unit')!r:.40}; "
                               f"expected one of {', '.join(UNITS)}")
    rpu = 0
    if d.get("requests_per_unit") is not None:
        rpu = _int(file, where, "requests_per_unit", d.get("requests_per_unit"), lo=0,
                   hi=MAX_REQUESTS)
    replaces: list[str] = []
    raw = d.get("replaces")
    if raw is not None:
        if not isinstance(raw, list):
            raise EnvoyConfigError(file, where, "replaces", "must be a list of {name: ...}")
        for i, item in enumerate(raw):
            r = _mapping(file, f"{where}.replaces[{i}]", item, ("name",), "a replaces entry")
            rname = _text(file, f"{where}.replaces[{i}]", "name", r.get("name"),
                          required=True)
            if rname == name:
                raise EnvoyConfigError(file, f"{where}.replaces[{i}]", "name",
                                       f"a limit cannot replace itself ({rname!r})")
            replaces.append(rname)
    algorithm = _text(file, where, "algorithm", d.get("algorithm")) or DEFAULT_ALGORITHM
    if algorithm not in ALGORITHMS:
        raise EnvoyConfigError(file, where, "algorithm", f"unknown algorithm {algorithm!r:.40}"
                               f"; expected one of {', '.join(sorted(ALGORITHMS))}")
    burst = None
    if d.get("burst") is not None:
        burst = _int(file, where, "burst", d.get("burst"), lo=1, hi=MAX_REQUESTS)
    if (unlimited or rpu == 0) and (d.get("algorithm") is not None or burst is not None):
        raise EnvoyConfigError(file, where, "algorithm" if burst is None else "burst",
                               "has no meaning for a limit that counts nothing (unlimited, "
                               "or requests_per_unit 0)")
    seconds, code = UNITS.get(unit, (0, 0))
    rule = None
    if not unlimited and rpu > 0:
        try:
            rule = Rule(rpu, seconds, algorithm, burst, name or full_key)
        except ConfigError as exc:
            raise EnvoyConfigError(file, where, exc.field, exc.problem) from None
        try:
            validate.exact("requests_per_unit", rpu, rule._algo.magnitude,
                           f"capacity x window in microseconds ({rule.capacity} per {unit})")
        except ConfigError as exc:
            raise EnvoyConfigError(file, where, "requests_per_unit",
                                   f"{exc.problem}; use a shorter unit") from None
    return EnvoyLimit(full_key, name, unit, code, rpu, shadow, unlimited, tuple(replaces),
                      rule, seconds)


def _descriptors(file: str, prefix: str, parent: _Node, items: object, path: str) -> None:
    if items is None:
        return
    if not isinstance(items, list):
        raise EnvoyConfigError(file, path, "descriptors", "must be a list of descriptors")
    for i, item in enumerate(items):
        where = f"{path}.descriptors[{i}]" if path else f"descriptors[{i}]"
        d = _mapping(file, where, item, _DESCRIPTOR_KEYS, "a descriptor")
        key = _text(file, where, "key", d.get("key"), required=True)
        value = _text(file, where, "value", d.get("value"))
        final = f"{key}_{value}" if value else key
        full = f"{prefix}.{final}"
        label = f"{where} (key {key!r}{f', value {value!r}' if value else ''})"
        if final in parent.children:
            raise EnvoyConfigError(file, label, "key",
                                   f"duplicate descriptor {full!r} (key and value both "
                                   "already used at this level)")
        shadow = _bool(file, label, "shadow_mode", d.get("shadow_mode"))
        _bool(file, label, "detailed_metric", d.get("detailed_metric"))
        node = _Node()
        if d.get("rate_limit") is not None:
            node.limit = _limit(file, label, full, d["rate_limit"], shadow)
        _descriptors(file, full, node, d.get("descriptors"), where)
        parent.children[final] = node
        if "*" in value:
            parent.wildcards.append((key, _wildcard(value), node))


def _parse(file: str, text: str, config: EnvoyConfig) -> None:
    import yaml

    try:
        # BaseLoader: every scalar stays the text it was written as (Go's yaml.v2 decodes
        # `value: 10` or `value: true` into a string field as that text; numbers and
        # booleans are parsed here, field by field)
        doc = yaml.load(text, Loader=yaml.BaseLoader)  # noqa: S506 (BaseLoader builds only str/list/dict)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise EnvoyConfigError(file, "", "", f"not valid YAML: {where}"
                               f"{getattr(exc, 'problem', None) or exc}") from None
    if doc is None or doc == "":
        raise EnvoyConfigError(file, "", "domain", "the file is empty: it must have a domain")
    root = _mapping(file, "", doc, _ROOT_KEYS, "the file")
    domain = _text(file, "", "domain", root.get("domain"), required=True)
    if domain in config.domains:
        raise EnvoyConfigError(file, "", "domain", f"duplicate domain {domain!r} (already in "
                               "another file)")
    node = _Node()
    _descriptors(file, domain, node, root.get("descriptors"), "")
    config.domains[domain] = node
    config.files.append(file)


def load_envoy_config(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
                      ) -> EnvoyConfig:
    """Load envoyproxy/ratelimit YAML: a directory (every ``*.yaml``/``*.yml`` in it,
    sorted, as envoyproxy/ratelimit loads its runtime ``config/`` directory), a file, or
    several. Raises :class:`EnvoyConfigError` naming the file, descriptor and field."""
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    files: list[Path] = []
    for p in items:
        path = Path(p)
        if path.is_dir():
            found = sorted(f for f in path.iterdir()
                           if f.suffix in (".yaml", ".yml") and f.is_file())
            if not found:
                raise EnvoyConfigError(str(path), "", "", "no *.yaml or *.yml file in the "
                                       "directory")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise EnvoyConfigError(str(path), "", "", "no such file or directory")
    config = EnvoyConfig()
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EnvoyConfigError(str(f), "", "", f"cannot read: {exc}") from None
        _parse(str(f), text, config)
    return config


def loads_envoy_config(text: str, file: str = "<string>") -> EnvoyConfig:
    """One envoyproxy/ratelimit YAML document from a string."""
    config = EnvoyConfig()
    _parse(file, text, config)
    return config
