"""The rate-limit stores on Redis: keys, script arguments, decisions (the only rate-limit
code of the package; the transport carries the commands).

One Lua script evaluates every algorithm (``lua/*.lua``, one file per algorithm,
concatenated at load time, registered as :data:`SCRIPT_NAME`); every ``hit``, ``peek``
and ``hit_all`` is exactly one ``EVALSHA`` round trip (plus one more the first time a
server lacks the script).

* Keys: ``{prefix}:{<tag>}:<rule id>`` where ``<tag>`` is a 128-bit BLAKE2b digest of the
  user key. The digest is the cluster hash tag, so all rules of one key share a slot,
  braces in user keys never act as hash tags, and a user key cannot pick a slot or
  collide with another key.
* Time: the server's ``TIME`` by default (``time_source="server"``), or the store
  clock's wall time (``time_source="client"``, for deterministic tests).
* Every failure is a :class:`~stormguard.StorageError`. The store's breaker
  (:class:`~stormguard._core.breaker.BreakerMachine`, one per cluster master) opens
  after ``breaker_threshold`` consecutive failures, then refuses calls with
  :class:`~stormguard.StorageCircuitOpen` for ``breaker_cooldown`` seconds before one
  probe; it reports ``StateChanged`` / ``CallRejected`` events to the store's listeners.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from stormguard._core import validate
from stormguard._core.breaker import BreakerMachine
from stormguard._core.clock import Clock, system_clock, wall_us
from stormguard._core.errors import ConfigError, StorageCircuitOpen, StorageError
from stormguard.observability.events import (
    CallRejected,
    Listener,
    StateChanged,
    emit,
    observed,
)
from stormguard.observability.metrics import track
from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.reservation import Reservation
from stormguard.ratelimit.rule import Rule
from stormguard.stores.base import (
    Store,
    binding,
    check_cost,
    check_reservation,
    check_rules,
    key_error,
)
from stormguard.stores.redis.cluster import ClusterTransport
from stormguard.stores.redis.protocol import connection_options
from stormguard.stores.redis.ratelimit_scripts import (
    RATELIMIT,
    RESERVE,
    RESERVE_SCRIPT,
    RESERVE_SCRIPT_NAME,
    SCRIPT,
    SCRIPT_NAME,
    TimeSource,
    bulk,
    load_script,
    rule_args,
    tag,
)
from stormguard.stores.redis.transport import Command, RedisTransport, Transport

__all__ = ["RESERVE_SCRIPT", "RESERVE_SCRIPT_NAME", "SCRIPT", "SCRIPT_NAME", "RedisClusterStore",
           "RedisStore", "load_script"]


def _reject(name: str, reason: str, remaining: float) -> BaseException:
    what = "half-open (probe in flight)" if reason == "half_open_full" else "open"
    return StorageCircuitOpen(f"redis circuit breaker {name!r} is {what}",
                              remaining=remaining, name=name)


_PING = Command.of("PING")

# the store options a URL's query may carry, and their types (clock and listeners are
# objects: keywords only)
_URL_OPTIONS: dict[str, type] = {
    "prefix": str, "time_source": str, "timeout": float, "connect_timeout": float,
    "breaker_threshold": int, "breaker_cooldown": float, "max_connections": int,
    "ttl_slack": float}


def url_options(url: str, options: dict[str, Any], *,
                cluster: bool = False) -> tuple[str, dict[str, Any]]:
    """Split a store URL's query: ``(the URL without the store's options, the options)``.

    The store's options (``prefix``, ``time_source``, ``timeout``, ...) come out of the
    query, typed; a keyword given in ``options`` wins over the same one in the query. The
    rest of the query stays in the URL and must be redis-py connection options (of the
    scheme's connection class); anything else is refused, naming it."""
    if not isinstance(url, str) or "?" not in url:
        return url, options
    base, _, query = url.partition("?")
    query = query.partition("#")[0]
    merged = dict(options)
    rest: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in seen:
            raise ConfigError(name, value, "is given twice in the URL's query")
        seen.add(name)
        conv = _URL_OPTIONS.get(name)
        if conv is None:
            rest.append((name, value))
        elif name not in options:
            try:
                merged[name] = conv(value)
            except ValueError:
                raise ConfigError(name, value, "must be an integer" if conv is int
                                  else "must be a number") from None
    scheme = urlsplit(base).scheme.lower().removesuffix("+cluster")
    accepted = connection_options(scheme)
    unknown = [n for n, _ in rest if n not in accepted or (cluster and n == "db")]
    if unknown:
        what = "query parameter" if len(unknown) == 1 else "query parameters"
        where = "a Redis Cluster has only database 0; " if "db" in unknown and cluster else ""
        raise ConfigError("url", unknown, f"unknown {what} {', '.join(map(repr, unknown))}: "
                          f"{where}a Redis store URL takes the store's options "
                          f"({', '.join(_URL_OPTIONS)}) and redis-py's connection "
                          "options (ssl_cert_reqs, client_name, ...)")
    return (f"{base}?{urlencode(rest)}" if rest else base), merged


class _RedisStore(Store):
    """Shared logic: options, keys, arguments, decisions, breakers and their events."""

    transport: Transport

    def __init__(self, url: str, *, prefix: str = "stormguard",
                 time_source: TimeSource = "server", clock: Clock | None = None,
                 timeout: float = 0.05, connect_timeout: float | None = None,
                 breaker_threshold: int = 5, breaker_cooldown: float = 1.0,
                 max_connections: int = 64, ttl_slack: float | None = None,
                 listeners: Sequence[Listener] = (), **client_options: Any) -> None:
        validate.text("prefix", prefix, forbid="{}")
        validate.one_of("time_source", time_source, ("server", "client"))
        self.timeout = validate.number("timeout", timeout)
        self.connect_timeout = (self.timeout if connect_timeout is None
                                else validate.number("connect_timeout", connect_timeout))
        self.breaker_threshold = validate.integer("breaker_threshold", breaker_threshold,
                                                  maximum=10)
        self.breaker_cooldown = validate.number("breaker_cooldown", breaker_cooldown)
        self.max_connections = validate.integer("max_connections", max_connections)
        if ttl_slack is None:
            ttl_slack = 1.0 if time_source == "client" else 0.0
        self.ttl_slack = validate.number("ttl_slack", ttl_slack, allow_zero=True)
        self._slack_ms = round(self.ttl_slack * 1000)
        self.url = url
        self.prefix = prefix
        self.time_source: TimeSource = time_source
        self.clock = clock if clock is not None else system_clock
        self.client_options = client_options
        self._listeners: list[Listener] = list(listeners)
        self._rule_args: dict[tuple[str, int], tuple[str, int, int, int]] = {}
        self._packs: dict[tuple[Any, int, bool], tuple[bytes, list[bytes], bytes]] = {}
        self._key_head = f"{self.prefix}:{{".encode()

    def _transport_options(self) -> dict[str, Any]:
        return {"timeout": self.timeout, "connect_timeout": self.connect_timeout,
                "max_connections": self.max_connections, "clock": self.clock,
                "breakers": self._breaker_for, **self.client_options}

    # -- breakers and events -------------------------------------------------------------
    def _make_breaker(self, name: str) -> BreakerMachine:
        """N consecutive failures open it for the cool-down; then one probe."""
        n, cooldown = self.breaker_threshold, self.breaker_cooldown
        return BreakerMachine(window=n, failure_rate=1.0, min_calls=n, half_open_calls=1,
                              open_for=cooldown, probe_lease=cooldown, name=name,
                              clock=self.clock, reject=functools.partial(_reject, name),
                              on_change=functools.partial(self._changed, name),
                              on_reject=functools.partial(self._rejected, name))

    def _breaker_for(self, node: str) -> BreakerMachine | None:
        raise NotImplementedError

    def _changed(self, name: str, old: str, new: str, now: float) -> None:
        if observed(self._listeners):
            emit(self._listeners, StateChanged(name, now, old, new))

    def _rejected(self, name: str, reason: str, remaining: float, now: float) -> None:
        if observed(self._listeners):
            emit(self._listeners, CallRejected(name, now, reason, remaining))

    def add_listener(self, listener: Listener) -> None:
        """Receive this store's breaker events (``StateChanged``, ``CallRejected``)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Stop a listener (ValueError if absent)."""
        self._listeners.remove(listener)

    @property
    def round_trips(self) -> int:
        """Network round trips made (a pipelined batch counts once)."""
        return self.transport.round_trips

    # -- building the command --------------------------------------------------------------
    def key(self, key: str, rule: Rule) -> str:
        """The Redis key holding ``key``'s counters under ``rule``."""
        return f"{self.prefix}:{{{tag(key)}}}:{rule._id}"

    def _args(self, rule: Rule) -> tuple[str, int, int, int]:
        # keyed by the id and the limit: a regional share is a copy of its rule with the
        # same id (the same counters) and a smaller limit (stores/regional)
        k = (rule._id, rule._algo.N)
        a = self._rule_args.get(k)
        if a is None:
            a = self._rule_args[k] = rule_args(rule)
        return a

    def _command(self, key: str, rules: Sequence[Rule], cost: int, consume: bool) -> Command:
        """The EVALSHA of the rate-limit script, routed by its first key. Everything but
        the key tag and the time is packed once per (rules, cost, consume) and reused."""
        if type(key) is not str:
            raise key_error(key)
        r0 = rules[0]
        ck = ((r0._id, r0._algo.N) if len(rules) == 1
              else tuple((r._id, r._algo.N) for r in rules), cost, consume)
        parts = self._packs.get(ck)
        if parts is None:
            if len(self._packs) > 4096:
                self._packs.clear()
            parts = self._packs[ck] = self._parts(rules, cost, consume)
        head, suffixes, tail = parts
        kb = self._key_head + tag(key).encode()
        now = (b"$0\r\n\r\n" if self.time_source == "server"
               else bulk(b"%d" % wall_us(self.clock)))
        keys = b"".join([b"$%d\r\n%s%s\r\n" % (len(kb) + len(m), kb, m) for m in suffixes])
        return Command(head + keys + now + tail, kb + suffixes[0], SCRIPT_NAME)

    def _parts(self, rules: Sequence[Rule], cost: int,
               consume: bool) -> tuple[bytes, list[bytes], bytes]:
        n = len(rules)
        head = b"*%d\r\n%s%s%s" % (3 + n + 4 + 4 * n, bulk(b"EVALSHA"),
                                    bulk(RATELIMIT.sha.encode()), bulk(b"%d" % n))
        suffixes = [f"}}:{r._id}".encode() for r in rules]
        tail = [bulk(b"%d" % cost), bulk(b"1" if consume else b"0"),
                bulk(b"%d" % self._slack_ms)]
        for r in rules:
            tail += [bulk(str(a).encode()) for a in self._args(r)]
        return head, suffixes, b"".join(tail)

    def _prepare(self, key: str, rule: Rule, cost: int, consume: bool) -> Command:
        if cost != 1 or type(cost) is not int:  # True and 1.0 equal 1: rejected all the same
            check_cost(rule, cost)
        return self._command(key, (rule,), cost, consume)

    @staticmethod
    def _decision(reply: Any, rules: Sequence[Rule]) -> Decision:
        if len(rules) == 1:
            r = rules[0]
            return Decision(reply[1] == 1, r._algo.B, reply[2], reply[3] / 1e6,
                            reply[4] / 1e6, r)
        decisions = []
        for i, r in enumerate(rules):
            j = 1 + 4 * i
            decisions.append(Decision(reply[j] == 1, r._algo.B, reply[j + 1],
                                      reply[j + 2] / 1e6, reply[j + 3] / 1e6, r))
        return binding(decisions)

    def _reserve_command(self, key: str, rule: Rule, cost: object, max_wait: object,
                         book: object) -> Command:
        if type(key) is not str:
            raise key_error(key)
        cost, wait_us = check_reservation(rule, cost, max_wait, book)
        now: str | int = "" if self.time_source == "server" else wall_us(self.clock)
        return RESERVE.command([self.key(key, rule)],
                                [now, cost, "1" if book else "0", self._slack_ms,
                                 *self._args(rule), wait_us])

    @staticmethod
    def _reservation(reply: Any) -> Reservation:
        ok, at, now = reply
        return Reservation(ok == 1, (at - now) / 1e6, at / 1e6)

    def _reset_command(self, key: str, rule: Rule | Sequence[Rule]) -> Command | None:
        if type(key) is not str:
            raise key_error(key)
        rules = (rule,) if isinstance(rule, Rule) else tuple(rule)
        keys = [self.key(key, r) for r in rules]
        return Command.of("DEL", *keys, key=keys[0]) if keys else None  # one slot

    # -- blocking ----------------------------------------------------------------------
    def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self._decision(self.transport.call(self._prepare(key, rule, cost, True)),
                              (rule,))

    def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self._decision(self.transport.call(self._prepare(key, rule, cost, False)),
                              (rule,))

    def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        rules = check_rules(rules, cost)
        return self._decision(self.transport.call(self._command(key, rules, cost, True)),
                              rules)

    def reserve(self, key: str, rule: Rule, cost: int = 1, *, max_wait: float | None = None,
                book: bool = True) -> Reservation:
        """As :meth:`Store.reserve`, atomically in one script: N processes booking on one
        key get distinct slots, spaced as the rule says."""
        return self._reservation(
            self.transport.call(self._reserve_command(key, rule, cost, max_wait, book)))

    def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        command = self._reset_command(key, rule)
        if command is not None:
            self.transport.call(command)

    def ping(self) -> bool:
        try:
            self.transport.call(_PING)
        except StorageError:
            return False
        return True

    def close(self) -> None:
        self.transport.close()

    # -- asyncio: coalesced pipelines --------------------------------------------------------
    async def ahit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self._decision(await self.transport.acall(self._prepare(key, rule, cost, True)),
                              (rule,))

    async def apeek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self._decision(
            await self.transport.acall(self._prepare(key, rule, cost, False)), (rule,))

    async def ahit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        rules = check_rules(rules, cost)
        return self._decision(
            await self.transport.acall(self._command(key, rules, cost, True)), rules)

    async def areserve(self, key: str, rule: Rule, cost: int = 1, *,
                       max_wait: float | None = None, book: bool = True) -> Reservation:
        return self._reservation(await self.transport.acall(
            self._reserve_command(key, rule, cost, max_wait, book)))

    async def areset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        command = self._reset_command(key, rule)
        if command is not None:
            await self.transport.acall(command)

    async def aping(self) -> bool:
        try:
            await self.transport.acall(_PING)
        except StorageError:
            return False
        return True

    async def aclose(self) -> None:
        await self.transport.aclose()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.url!r}, prefix={self.prefix!r}, "
                f"time_source={self.time_source!r}, timeout={self.timeout})")


class RedisStore(_RedisStore):
    """Counters on one Redis server (``redis://``, ``rediss://``, ``unix://``).

    ``store.breaker`` is the store's breaker (``.state``: ``"closed"``, ``"open"``,
    ``"half_open"``; ``.opened``: how many times it opened).

    >>> store = RedisStore.from_url("redis://127.0.0.1:6379/0")  # doctest: +SKIP
    """

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", **options: Any) -> None:
        url, options = url_options(url, options)
        super().__init__(url, **options)
        self.transport: RedisTransport = RedisTransport.from_url(
            url, **self._transport_options())
        self.breaker = self._make_breaker(f"redis:{self.transport.endpoint.name}")
        self.transport.breaker = self.breaker
        self.name = self.breaker.name
        """The store's name in metrics: ``redis:host:port``."""
        track(self, "store")

    def breaker_machines(self) -> list[BreakerMachine]:
        """The store's breakers (metrics read their states)."""
        return [self.breaker]

    def _breaker_for(self, node: str) -> BreakerMachine | None:
        return getattr(self, "breaker", None)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisStore:
        """``redis://[[user]:password@]host:port/db``, ``rediss://...``,
        ``unix:///path?db=0``; options as for the constructor (``prefix``,
        ``time_source``, ``clock``, ``timeout``, ``connect_timeout``,
        ``breaker_threshold``, ``breaker_cooldown``, ``max_connections``, ``ttl_slack``,
        ``listeners``, plus redis-py connection options). The URL's query takes the
        same options but the objects (``redis://h:6379/0?prefix=app&timeout=0.1``); a
        keyword wins over the query; an unknown parameter is refused."""
        return cls(url, **options)


class RedisClusterStore(_RedisStore):
    """Counters on a Redis Cluster (``redis+cluster://h1:p1,h2:p2``). All rules of one
    user key live in one slot, so ``hit_all`` is still one script on one node.

    ``store.breakers["host:port"]`` is each master's breaker (a sick node fails fast
    while the others keep answering); ``store.breaker`` guards reaching the cluster at
    all (loading its slot map)."""

    def __init__(self, url: str, **options: Any) -> None:
        url, options = url_options(url, options, cluster=True)
        super().__init__(url, **options)
        self.breaker = self._make_breaker("redis-cluster")
        self.breakers: dict[str, BreakerMachine] = {}
        try:
            self.transport: ClusterTransport = ClusterTransport.from_url(
                url, **self._transport_options())
        except (ValueError, TypeError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError("url", url, f"not a usable Redis Cluster URL: {exc}") from None
        self.name = "redis-cluster"
        """The store's name in metrics."""
        track(self, "store")

    def breaker_machines(self) -> list[BreakerMachine]:
        """The store's breakers: reaching the cluster, then each master's (by node)."""
        nodes = self.breakers.copy()  # one C-level copy: safe while a thread adds a node
        return [self.breaker, *(nodes[n] for n in sorted(nodes))]

    def _breaker_for(self, node: str) -> BreakerMachine | None:
        if not node:
            return self.breaker
        b = self.breakers.get(node)
        if b is None:
            b = self.breakers.setdefault(node, self._make_breaker(f"redis-cluster:{node}"))
        return b

    def node_for(self, key: str, rule: Rule) -> str:
        """The master (``host:port``) holding ``key``'s counters under ``rule``."""
        return self.transport.node_for(self.key(key, rule))

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisClusterStore:
        """``redis+cluster://[user:password@]h1:p1,h2:p2`` (``rediss+cluster://`` for TLS);
        options as for :class:`RedisStore`, in the query too
        (``redis+cluster://h1:p1,h2:p2?prefix=app``)."""
        return cls(url, **options)
