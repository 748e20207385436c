"""Distributed counters on Redis and Redis Cluster.

One Lua script evaluates every algorithm (``lua/*.lua``, one file per algorithm,
concatenated at load time); every ``hit``, ``peek`` and ``hit_all`` is exactly one
``EVALSHA`` round trip (plus one more the first time a server lacks the script).

* Keys: ``{prefix}:{<tag>}:<rule id>`` where ``<tag>`` is a 128-bit BLAKE2b digest of the
  user key. The digest is the cluster hash tag, so all rules of one key share a slot,
  braces in user keys never act as hash tags, and a user key cannot pick a slot or
  collide with another key.
* Time: the server's ``TIME`` by default (``time_source="server"``), or the store
  clock's wall time (``time_source="client"``, for deterministic tests).
* Every failure (connection refused, timeout, script error, breaker open) is a
  :class:`~stormguard.StorageError`. A built-in circuit breaker stops calling a sick
  server after ``breaker_threshold`` consecutive failures and probes it again after
  ``breaker_cooldown`` seconds.
* Async calls on one event loop are coalesced: on one node, everything submitted
  during one loop iteration is written as one pipeline on the loop's connection
  (in slices of ``EAGER_BATCH`` when many callers are queued; writes do not wait for
  earlier replies); on a cluster, the same connection per master, each call routed
  by its key's slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import select
import ssl
import threading
from collections import deque
from collections.abc import Awaitable, Sequence
from importlib import resources
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

import hiredis
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.cluster
import redis.retry
from redis.asyncio.connection import parse_url
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from stormguard._core import deadline
from stormguard._core.clock import Clock, system_clock
from stormguard._core.errors import ConfigError, StorageError
from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.rule import Rule
from stormguard.stores.base import Store, binding, check_cost, check_rules, key_error

__all__ = ["SCRIPT", "RedisClusterStore", "RedisStore", "load_script"]

TimeSource = Literal["server", "client"]

_LUA_FILES = (
    "prelude.lua",
    "fixed_window.lua",
    "sliding_window_counter.lua",
    "sliding_window_log.lua",
    "token_bucket.lua",
    "gcra.lua",
    "leaky_bucket.lua",
    "main.lua",
)
_CODES = {
    "fixed_window": "fw",
    "sliding_window_counter": "swc",
    "sliding_window_log": "swl",
    "token_bucket": "tb",
    "gcra": "gcra",
    "leaky_bucket": "lb",
}
_EXACT = 2**53
#: Errors that mean "the backend failed" (everything redis-py and the OS raise).
_BACKEND_ERRORS = (RedisError, RedisClusterException, OSError, asyncio.TimeoutError)


def load_script() -> str:
    """The rate-limit script: the prelude, the six algorithms and the entry point."""
    lua = resources.files("stormguard.stores.redis") / "lua"
    return "\n".join(lua.joinpath(name).read_text(encoding="utf-8") for name in _LUA_FILES)


SCRIPT = load_script()
_SHA = hashlib.sha1(SCRIPT.encode(), usedforsecurity=False).hexdigest()


def _rule_args(rule: Rule) -> tuple[str, int, int, int]:
    """The script arguments of one rule, after checking the Lua arithmetic stays exact."""
    a = rule._algo
    n, w, b = a.N, a.W, a.B
    code = _CODES[a.name]
    # the largest intermediate value of the script is about capacity x window (+ limit)
    if code not in ("fw", "swl") and b * w + n >= _EXACT:
        raise ConfigError("rule", str(rule),
                          "too large for the Redis store's exact arithmetic: capacity x "
                          f"window in microseconds must stay below 2**53 ({_EXACT:.3e}); "
                          "use a shorter window or a smaller limit")
    return (code, n, w, b)


class _Breaker:
    """Consecutive-failure circuit breaker: closed -> open (fail fast, no network) ->
    half-open (one probe at a time) -> closed.

    The probe holds a lease of ``cooldown`` seconds: if its outcome never arrives (the
    caller was cancelled, say), another probe may go after the lease ends.
    """

    __slots__ = ("clock", "cooldown", "failures", "lock", "open", "open_until", "probe_until",
                 "threshold", "trips")

    def __init__(self, threshold: int, cooldown: float, clock: Clock) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.clock = clock
        self.failures = 0
        self.open = False
        self.open_until = 0.0
        self.probe_until = 0.0
        self.trips = 0
        """How many times the breaker opened."""
        self.lock = threading.Lock()

    def before(self) -> None:
        """Raise StorageError when the call must not touch the network."""
        if not self.open:
            return
        now = self.clock.monotonic()
        if now < self.open_until:
            raise StorageError("redis circuit breaker is open")
        with self.lock:
            if now < self.probe_until:
                raise StorageError("redis circuit breaker is half-open (probe in flight)")
            self.probe_until = now + self.cooldown

    def success(self) -> None:
        if self.failures or self.open:
            with self.lock:
                self.failures = 0
                self.open = False
                self.probe_until = 0.0

    def failure(self) -> None:
        with self.lock:
            self.failures += 1
            if self.open or self.failures >= self.threshold:
                if not self.open:
                    self.trips += 1
                self.open = True
                self.probe_until = 0.0
                self.open_until = self.clock.monotonic() + self.cooldown

    @property
    def state(self) -> str:
        """``"closed"``, ``"open"`` or ``"half_open"``."""
        if not self.open:
            return "closed"
        return "open" if self.clock.monotonic() < self.open_until else "half_open"


_TAGS: dict[str, str] = {}
_TAGS_MAX = 1 << 16


def _tag(key: str) -> str:
    """The hash tag of a user key: 128-bit BLAKE2b in hex (memoised for hot keys)."""
    tag = _TAGS.get(key)
    if tag is None:
        tag = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
        if len(_TAGS) >= _TAGS_MAX:
            _TAGS.clear()
        if len(key) <= 256:
            _TAGS[key] = tag
    return tag


class _RedisBase(Store):
    """Shared logic: keys, arguments, decisions, failure handling."""

    def __init__(self, url: str, *, prefix: str = "stormguard",
                 time_source: TimeSource = "server", clock: Clock | None = None,
                 timeout: float = 0.05, connect_timeout: float | None = None,
                 breaker_threshold: int = 5, breaker_cooldown: float = 1.0,
                 max_connections: int = 64, ttl_slack: float | None = None,
                 **client_options: Any) -> None:
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ConfigError("prefix", prefix, "must be a non-empty string without braces")
        if time_source not in ("server", "client"):
            raise ConfigError("time_source", time_source, "must be 'server' or 'client'")
        for name, value in (("timeout", timeout), ("breaker_cooldown", breaker_cooldown)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(name, value, "must be a positive number of seconds")
        if connect_timeout is None:
            connect_timeout = timeout
        elif isinstance(connect_timeout, bool) or not isinstance(connect_timeout, int | float) \
                or connect_timeout <= 0:
            raise ConfigError("connect_timeout", connect_timeout,
                              "must be a positive number of seconds")
        if isinstance(breaker_threshold, bool) or not isinstance(breaker_threshold, int) \
                or not 1 <= breaker_threshold <= 10:
            raise ConfigError("breaker_threshold", breaker_threshold,
                              "must be an integer from 1 to 10")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) \
                or max_connections < 1:
            raise ConfigError("max_connections", max_connections, "must be a positive integer")
        if ttl_slack is None:
            ttl_slack = 1.0 if time_source == "client" else 0.0
        if isinstance(ttl_slack, bool) or not isinstance(ttl_slack, int | float) \
                or ttl_slack < 0:
            raise ConfigError("ttl_slack", ttl_slack, "must be a number of seconds >= 0")
        self.ttl_slack = float(ttl_slack)
        self._slack_ms = round(ttl_slack * 1000)
        self.url = url
        self.prefix = prefix
        self.time_source: TimeSource = time_source
        self.clock = clock if clock is not None else system_clock
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.max_connections = max_connections
        self.client_options = client_options
        self.breaker = _Breaker(breaker_threshold, float(breaker_cooldown), self.clock)
        self.round_trips = 0
        """Network round trips made (a pipelined batch counts once)."""
        self._rule_args: dict[str, tuple[str, int, int, int]] = {}
        self._loops: dict[int, tuple[asyncio.AbstractEventLoop, _Runner]] = {}
        self._loops_lock = threading.Lock()

    # -- building the command ------------------------------------------------------
    def key(self, key: str, rule: Rule) -> str:
        """The Redis key holding ``key``'s counters under ``rule``."""
        return f"{self.prefix}:{{{_tag(key)}}}:{rule._id}"

    def _args(self, rule: Rule) -> tuple[str, int, int, int]:
        a = self._rule_args.get(rule._id)
        if a is None:
            a = self._rule_args[rule._id] = _rule_args(rule)
        return a

    def _now_arg(self) -> str | int:
        if self.time_source == "server":
            return ""
        return int(self.clock.wall() * 1_000_000 + 0.5)

    def _command(self, key: str, rules: Sequence[Rule], cost: int,
                 consume: bool) -> tuple[Any, ...]:
        if type(key) is not str:
            raise key_error(key)
        tag = _tag(key)
        prefix = self.prefix
        keys = [f"{prefix}:{{{tag}}}:{r._id}" for r in rules]
        args: list[Any] = [self._now_arg(), cost, 1 if consume else 0, self._slack_ms]
        for r in rules:
            args.extend(self._args(r))
        return ("EVALSHA", _SHA, len(keys), *keys, *args)

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

    def _prepare(self, key: str, rule: Rule, cost: int, consume: bool) -> tuple[Any, ...]:
        if cost != 1 or type(cost) is not int:  # True and 1.0 equal 1: rejected all the same
            check_cost(rule, cost)
        return self._command(key, (rule,), cost, consume)

    # -- the blocking calls ----------------------------------------------------------
    def _call(self, command: Any) -> Any:
        raise NotImplementedError

    def _run(self, command: Any) -> Any:
        """One round trip with the breaker around it; every failure is a StorageError."""
        left = deadline.remaining()
        if left is not None and left <= 0:
            raise StorageError("redis: the deadline in force has passed")
        breaker = self._breaker_for(command)
        breaker.before()
        try:
            reply = self._call(command)
        except StorageError:
            breaker.failure()
            raise
        except ResponseError as exc:  # Redis answered (e.g. WRONGTYPE): not an outage
            raise StorageError(f"redis: {type(exc).__name__}: {exc}") from exc
        except _BACKEND_ERRORS as exc:
            breaker.failure()
            raise StorageError(f"redis: {type(exc).__name__}: {exc}") from exc
        breaker.success()
        return reply

    def _breaker_for(self, command: Any) -> _Breaker:
        """The breaker guarding ``command`` (one per store; one per node on a cluster)."""
        return self.breaker

    def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self._decision(self._run(self._prepare(key, rule, cost, True)), (rule,))

    def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self._decision(self._run(self._prepare(key, rule, cost, False)), (rule,))

    def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        rules = check_rules(rules, cost)
        return self._decision(self._run(self._command(key, rules, cost, True)), rules)

    def _pack(self, command: Any) -> Any:
        """The form :meth:`_call` takes: the argument tuple here, RESP bytes on one node."""
        return command

    def _reset_keys(self, key: str, rule: Rule | Sequence[Rule]) -> list[str]:
        if type(key) is not str:
            raise key_error(key)
        rules = (rule,) if isinstance(rule, Rule) else tuple(rule)
        return [self.key(key, r) for r in rules]

    def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        keys = self._reset_keys(key, rule)
        if keys:
            self._run(self._pack(("DEL", *keys)))

    def ping(self) -> bool:
        try:
            self._run(self._pack(("PING",)))
        except StorageError:
            return False
        return True

    # -- asyncio: coalesced pipelines ------------------------------------------------
    def _runner(self) -> _Runner:
        loop = asyncio.get_running_loop()
        entry = self._loops.get(id(loop))
        if entry is not None and entry[0] is loop:
            return entry[1]
        with self._loops_lock:
            for lid, (old, _) in list(self._loops.items()):
                if old.is_closed():
                    del self._loops[lid]
            runner = self._new_runner(loop)
            self._loops[id(loop)] = (loop, runner)
            return runner

    def _new_runner(self, loop: asyncio.AbstractEventLoop) -> _Runner:
        raise NotImplementedError

    def _arun(self, command: Any) -> Awaitable[Any]:
        """Queue ``command`` on this loop's runner; await the result for the reply."""
        left = deadline.remaining()
        if left is not None and left < self.timeout:
            return self._arun_deadline(command, left)
        self._async_gate()
        return self._runner().submit(command)

    def _async_gate(self) -> None:
        """Fail fast (StorageError) when the breaker forbids sending."""
        self.breaker.before()

    async def _arun_deadline(self, command: Any, left: float) -> Any:
        if left <= 0:
            raise StorageError("redis: the deadline in force has passed")
        self._async_gate()
        fut = self._runner().submit(command)
        try:
            async with asyncio.timeout(left):
                return await fut
        except TimeoutError:
            raise StorageError("redis: no reply before the deadline in force") from None

    async def ahit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self._decision(await self._arun(self._prepare(key, rule, cost, True)), (rule,))

    async def apeek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self._decision(await self._arun(self._prepare(key, rule, cost, False)), (rule,))

    async def ahit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        rules = check_rules(rules, cost)
        return self._decision(await self._arun(self._command(key, rules, cost, True)), rules)

    async def areset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        keys = self._reset_keys(key, rule)
        if keys:
            await self._arun(self._pack(("DEL", *keys)))

    async def aping(self) -> bool:
        try:
            await self._arun(self._pack(("PING",)))
        except StorageError:
            return False
        return True

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        entry = self._loops.pop(id(loop), None)
        if entry is not None:
            await entry[1].aclose()
        self.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.url!r}, prefix={self.prefix!r}, "
                f"time_source={self.time_source!r}, timeout={self.timeout})")


class _Runner(Protocol):
    """Carries one event loop's commands to Redis."""

    def submit(self, command: Any) -> asyncio.Future[Any]: ...

    async def aclose(self) -> None: ...


class _ClusterRouter:
    """Per event loop on a cluster: one :class:`_Mux` per master (so the same
    pipelining and eager slices as on one node), each command sent to the master that
    owns its key's slot. The slot map comes from redis-py's cluster client, loaded on
    first use; a ``MOVED``/``ASK`` reply sends the command on to the node it names and
    refreshes the map in the background, and so does a node failure (a failover moves
    slots), at most once a second. Each master has its own breaker."""

    def __init__(self, store: RedisClusterStore, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop
        self.muxes: dict[str, tuple[_Mux, _Breaker]] = {}  # "host:port" -> its connection
        self.client: Any = None
        self.loading: asyncio.Task[None] | None = None
        self.waiting: list[tuple[Any, asyncio.Future[Any]]] = []
        self.refreshing: asyncio.Task[None] | None = None
        self.refreshed_at = -1e9

    def submit(self, command: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.loop.create_future()
        if self.client is None:
            self.waiting.append((command, fut))
            if self.loading is None:
                self.loading = self.loop.create_task(self._load())
        else:
            self._route(command, fut, 0)
        return fut

    async def _load(self) -> None:
        """Build the cluster client (the slot map), then route what waited for it."""
        store = self.store
        try:
            store.breaker.before()  # the cluster as a whole: fail fast while unreachable
            nodes = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in store._nodes]
            client = redis.asyncio.cluster.RedisCluster(
                startup_nodes=nodes, **store._options(redis.asyncio.retry.Retry))
            try:
                async with asyncio.timeout(store.connect_timeout + 2 * store.timeout):
                    await client.initialize()
            except BaseException:
                await client.aclose()
                raise
        except BaseException as exc:
            self.loading = None
            if not isinstance(exc, StorageError | asyncio.CancelledError):
                store.breaker.failure()
            waiting, self.waiting = self.waiting, []
            err = exc if isinstance(exc, StorageError) else StorageError(
                f"redis: {type(exc).__name__}: {exc}")
            if err is not exc:
                err.__cause__ = exc
            for _, fut in waiting:
                if not fut.done():
                    fut.set_exception(err)
            if not isinstance(exc, Exception):
                raise
            return
        store.breaker.success()
        self.client = client
        self.refreshed_at = self.loop.time()
        self.loading = None
        waiting, self.waiting = self.waiting, []
        for command, fut in waiting:
            if not fut.done():
                self._route(command, fut, 0)

    def _mux(self, name: str) -> tuple[_Mux, _Breaker]:
        """The connection and breaker of the master ``host:port``."""
        pair = self.muxes.get(name)
        if pair is None:
            host, _, port = name.rpartition(":")
            breaker = self.store._node_breaker(name)
            params = {"host": host, "port": int(port), **self.store._auth}
            pair = self.muxes[name] = (
                _Mux(self.store, self.loop, params, self.store._node_ssl_context(), breaker),
                breaker)
        return pair

    def _route(self, command: Any, fut: asyncio.Future[Any], hops: int,
               to: str | None = None, asking: bool = False) -> None:
        if to is None:
            node = _node_of(self.client.nodes_manager, command)
            if node is None:
                fut.set_exception(StorageError("redis: no cluster node serves this key"))
                self._refresh(force=True)
                return
            to = node.name  # "host:port"
        mux, breaker = self._mux(to)
        try:
            breaker.before()
        except StorageError as exc:  # this master's breaker is open: no network
            fut.set_exception(exc)
            return
        if asking:
            mux.submit(_ASKING)
        inner = mux.submit(hiredis.pack_command(command))
        inner.add_done_callback(lambda f: self._done(f, command, fut, hops))

    def _done(self, inner: asyncio.Future[Any], command: Any, fut: asyncio.Future[Any],
              hops: int) -> None:
        if fut.done():
            return
        if inner.cancelled():
            fut.cancel()
            return
        exc = inner.exception()
        if exc is None:
            fut.set_result(inner.result())
            return
        cause = exc.__cause__
        if isinstance(cause, ResponseError):
            moved = str(cause).split()  # "MOVED <slot> <host:port>" or "ASK ..."
            if len(moved) == 3 and moved[0] in ("MOVED", "ASK") and hops < 3:
                if moved[0] == "MOVED":
                    self._refresh(force=True)
                self._route(command, fut, hops + 1, moved[2], moved[0] == "ASK")
                return
        else:
            self._refresh(force=False)  # a node failed: perhaps a failover moved its slots
        fut.set_exception(exc)

    def _refresh(self, *, force: bool) -> None:
        """Reload the slot map in the background (at most once a second unless forced)."""
        if self.client is None or self.refreshing is not None:
            return
        if not force and self.loop.time() - self.refreshed_at < 1.0:
            return
        self.refreshed_at = self.loop.time()
        self.refreshing = self.loop.create_task(self._reload())

    async def _reload(self) -> None:
        try:
            async with asyncio.timeout(self.store.connect_timeout + 2 * self.store.timeout):
                await self.client.nodes_manager.initialize()
        except Exception:  # noqa: S110 - the old map stays; the next failure tries again
            pass
        finally:
            self.refreshing = None

    async def aclose(self) -> None:
        for task in (self.loading, self.refreshing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        for mux, _ in list(self.muxes.values()):
            await mux.aclose()
        self.muxes.clear()
        for _, fut in self.waiting:
            if not fut.done():
                fut.set_exception(StorageError("redis: store closed"))
        self.waiting = []
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(*_BACKEND_ERRORS):
                await client.aclose()


def _node_of(nodes_manager: Any, command: Any) -> Any:
    """The master serving ``command``'s first key (any master for a keyless command)."""
    if command[0] in ("EVALSHA", "EVAL") and command[2]:
        key = command[3]
        return nodes_manager.get_node_from_slot(
            key_slot(key if isinstance(key, bytes) else str(key).encode()))
    masters = [n for n in nodes_manager.nodes_cache.values() if n.server_type == "primary"]
    return masters[0] if masters else None


def _is_noscript(reply: object) -> bool:
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT"))


def _as_eval(command: tuple[Any, ...]) -> tuple[Any, ...]:
    return ("EVAL", SCRIPT, *command[2:])


_ROUTED_ELSEWHERE = object()
_ASKING: bytes = hiredis.pack_command(("ASKING",))
_SCRIPT_LOAD: bytes = hiredis.pack_command(("SCRIPT", "LOAD", SCRIPT))  # type: ignore[arg-type]


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)



#: On a busy connection, a queue this long is written at once instead of at the end of
#: the event loop iteration (client and server then work in parallel: see _Mux.submit).
EAGER_BATCH = 16


class _Mux:
    """One event loop's pipelined connection to one Redis server (hiredis on asyncio
    streams). Commands submitted during one loop iteration are written together (one
    round trip; a queue of ``EAGER_BATCH`` leaves at once); writes never wait for
    earlier replies, and a reader task resolves the callers' futures in order. One
    connection per loop serves any number of concurrent callers."""

    def __init__(self, store: _RedisBase, loop: asyncio.AbstractEventLoop,
                 params: dict[str, Any], ssl_context: ssl.SSLContext | None,
                 breaker: _Breaker) -> None:
        self.store = store
        self.loop = loop
        self.params = params  # host/port or path, username, password, db
        self.ssl_context = ssl_context
        self.breaker = breaker
        self.queue: list[tuple[Any, asyncio.Future[Any]]] = []
        self.inflight: deque[tuple[Any, asyncio.Future[Any]]] = deque()
        self.scheduled = False
        self.writer: asyncio.StreamWriter | None = None
        self.reader: asyncio.StreamReader | None = None
        self.parser: Any = None
        self.connecting: asyncio.Task[None] | None = None
        self.reading: asyncio.Task[None] | None = None

    def submit(self, command: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.loop.create_future()
        queue = self.queue
        queue.append((command, fut))
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._flush)
        elif len(queue) >= EAGER_BATCH:
            # Many callers: send this slice now instead of at the end of the loop
            # iteration, so Redis works on it while the rest of the iteration builds the
            # next one (otherwise client and server take turns, each idle half the time).
            self._send()
        return fut

    def _flush(self) -> None:
        self.scheduled = False
        if self.queue:
            self._send()

    def _send(self) -> None:
        if self.writer is not None and not self.inflight and self._stale():
            self._drop()  # the server went away while we were idle: reconnect first
        if self.writer is None:
            if self.connecting is None:
                self.connecting = self.loop.create_task(self._connect())
            return
        self._write()

    def _write(self) -> None:
        assert self.writer is not None
        batch = self.queue
        self.queue = []
        self.writer.write(b"".join([c for c, _ in batch]))
        self.store.round_trips += 1
        self.inflight.extend(batch)
        if self.reading is None:
            self.reading = self.loop.create_task(self._read())

    def _stale(self) -> bool:
        """An idle connection with something to read (EOF, an error) is dead: Redis sends
        nothing unasked. One zero-timeout poll, only when no reply is pending."""
        assert self.reader is not None
        assert self.writer is not None
        if self.reader.at_eof() or self.writer.is_closing():
            return True
        sock = self.writer.get_extra_info("socket")
        if sock is None:
            return False
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    async def _connect(self) -> None:
        store = self.store
        params = self.params
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(store.connect_timeout):
                if "path" in params:
                    reader, writer = await asyncio.open_unix_connection(params["path"])
                else:
                    reader, writer = await asyncio.open_connection(
                        params["host"], params.get("port", 6379), ssl=self.ssl_context)
            parser = hiredis.Reader(replyError=ResponseError)
            hello: list[tuple[Any, ...]] = []
            if params.get("password"):
                auth = (params["username"], params["password"]) if params.get("username") \
                    else (params["password"],)
                hello.append(("AUTH", *auth))
            if params.get("db"):
                hello.append(("SELECT", params["db"]))
            hello.append(("SCRIPT", "LOAD", SCRIPT))
            writer.write(b"".join([hiredis.pack_command(c) for c in hello]))
            store.round_trips += 1
            replies: list[Any] = []
            async with asyncio.timeout(store.timeout):
                while len(replies) < len(hello):
                    reply = parser.gets()
                    if reply is False:
                        data = await reader.read(65536)
                        if not data:
                            raise ConnectionError("redis closed the connection")
                        parser.feed(data)
                    else:
                        replies.append(reply)
            for r in replies:
                if isinstance(r, ResponseError):
                    raise r
        except (*_BACKEND_ERRORS, ssl.SSLError) as exc:
            self.connecting = None
            if writer is not None:
                writer.close()
            self.breaker.failure()
            self._fail_all(exc, queued=True)
            return
        except BaseException as exc:
            self.connecting = None
            if writer is not None:
                writer.close()
            self._fail_all(exc, queued=True)
            raise
        self.reader, self.writer, self.parser = reader, writer, parser
        self.connecting = None
        self._flush()

    async def _read(self) -> None:
        store = self.store
        breaker = self.breaker
        reader, parser, inflight = self.reader, self.parser, self.inflight
        assert reader is not None
        try:
            while inflight:
                async with asyncio.timeout(store.timeout):
                    data = await reader.read(1 << 16)
                if not data:
                    raise ConnectionError("redis closed the connection")
                parser.feed(data)
                reply = parser.gets()
                while reply is not False:
                    command, fut = inflight.popleft()
                    if isinstance(reply, ResponseError):
                        if _is_noscript(reply):
                            # the script cache was flushed: load it, then send the command again
                            if self.queue and self.queue[-1][0] is _SCRIPT_LOAD:
                                self.queue.append((command, fut))
                            else:
                                self.queue += [(_SCRIPT_LOAD, self.loop.create_future()),
                                               (command, fut)]
                            if not self.scheduled:
                                self.scheduled = True
                                self.loop.call_soon(self._flush)
                        elif not fut.done():
                            e = StorageError(f"redis: {reply}")
                            e.__cause__ = reply
                            fut.set_exception(e)
                    elif not fut.done():
                        fut.set_result(reply)
                    reply = parser.gets()
                breaker.success()
        except (*_BACKEND_ERRORS, hiredis.ProtocolError) as exc:
            breaker.failure()
            self._drop()
            self._fail_all(exc, queued=False)
        except BaseException as exc:
            self._drop()
            self._fail_all(exc, queued=False)
            raise
        finally:
            self.reading = None

    def _drop(self) -> None:
        writer, self.writer, self.reader = self.writer, None, None
        if writer is not None:
            writer.close()

    def _fail_all(self, exc: BaseException, *, queued: bool) -> None:
        err = StorageError(f"redis: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        items = list(self.inflight)
        self.inflight.clear()
        if queued:
            items += self.queue
            self.queue = []
        for _, fut in items:
            if not fut.done():
                fut.set_exception(err)

    async def aclose(self) -> None:
        for task in (self.connecting, self.reading):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        writer = self.writer
        self._drop()
        self._fail_all(ConnectionError("store closed"), queued=True)
        if writer is not None:
            with contextlib.suppress(*_BACKEND_ERRORS, ssl.SSLError):
                await writer.wait_closed()


class RedisStore(_RedisBase):
    """Counters on one Redis server (``redis://``, ``rediss://``, ``unix://``).

    >>> store = RedisStore.from_url("redis://127.0.0.1:6379/0")  # doctest: +SKIP
    """

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", **options: Any) -> None:
        super().__init__(url, **options)
        try:
            self._pool = redis.ConnectionPool.from_url(
                url, socket_timeout=self.timeout, socket_connect_timeout=self.connect_timeout,
                max_connections=self.max_connections, **self.client_options)
            self._params: dict[str, Any] = {**parse_url(url), **self.client_options}
        except (ValueError, TypeError) as exc:
            raise ConfigError("url", url, f"not a usable Redis URL: {exc}") from None
        self._packs: dict[tuple[Any, int, bool], tuple[bytes, list[bytes], bytes]] = {}
        self._key_head = f"{self.prefix}:{{".encode()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisStore:
        """``redis://[:password@]host:port/db``, ``rediss://...``, ``unix:///path?db=0``;
        options as for the constructor (``prefix``, ``time_source``, ``clock``,
        ``timeout``, ``connect_timeout``, ``breaker_threshold``, ``breaker_cooldown``,
        ``max_connections``, plus redis-py connection options)."""
        return cls(url, **options)

    def _call(self, command: Any) -> Any:
        timeout: Any = None
        left = deadline.remaining()
        if left is not None and left < self.timeout:
            timeout = max(left, 0.0001)
        pool = self._pool
        conn: Any = pool.get_connection()
        try:
            self.round_trips += 1
            conn.send_packed_command([command], check_health=False)
            try:
                if timeout is None:
                    return conn.read_response()
                return conn.read_response(timeout=timeout)
            except ResponseError as exc:
                if not _is_noscript(exc):
                    raise
            # the server lacks the script (restarted, or SCRIPT FLUSH): load it, send again
            self.round_trips += 1
            conn.send_packed_command([_SCRIPT_LOAD, command], check_health=False)
            if timeout is None:
                conn.read_response()
                return conn.read_response()
            conn.read_response(timeout=timeout)
            return conn.read_response(timeout=timeout)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    def close(self) -> None:
        self._pool.disconnect()

    def _new_runner(self, loop: asyncio.AbstractEventLoop) -> _Runner:
        return _Mux(self, loop, self._params, self._ssl_context(), self.breaker)

    def _pack(self, command: Any) -> Any:
        return hiredis.pack_command(command)

    def _command(self, key: str, rules: Sequence[Rule], cost: int, consume: bool) -> Any:
        """The EVALSHA command as RESP bytes; everything but the key tag and the time is
        packed once per (rules, cost, consume) and reused."""
        if type(key) is not str:
            raise key_error(key)
        ck = (rules[0]._id if len(rules) == 1 else tuple(r._id for r in rules), cost, consume)
        parts = self._packs.get(ck)
        if parts is None:
            if len(self._packs) > 4096:
                self._packs.clear()
            parts = self._packs[ck] = self._parts(rules, cost, consume)
        head, suffixes, tail = parts
        kb = self._key_head + _tag(key).encode()
        if self.time_source == "server":
            now = b"$0\r\n\r\n"
        else:
            now = _bulk(b"%d" % int(self.clock.wall() * 1_000_000 + 0.5))
        keys = b"".join([b"$%d\r\n%s%s\r\n" % (len(kb) + len(m), kb, m) for m in suffixes])
        return head + keys + now + tail

    def _parts(self, rules: Sequence[Rule], cost: int,
               consume: bool) -> tuple[bytes, list[bytes], bytes]:
        n = len(rules)
        head = b"*%d\r\n%s%s%s" % (3 + n + 4 + 4 * n, _bulk(b"EVALSHA"), _bulk(_SHA.encode()),
                                    _bulk(b"%d" % n))
        suffixes = [f"}}:{r._id}".encode() for r in rules]
        tail = [_bulk(b"%d" % cost), _bulk(b"1" if consume else b"0"),
                _bulk(b"%d" % self._slack_ms)]
        for r in rules:
            tail += [_bulk(str(a).encode()) for a in self._args(r)]
        return head, suffixes, b"".join(tail)

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("rediss"):
            return None
        return _tls_context(self._params.get("ssl_cert_reqs"))


def _tls_context(cert_reqs: object) -> ssl.SSLContext:
    """TLS for the async connections; ``ssl_cert_reqs="none"`` skips verification."""
    ctx = ssl.create_default_context()
    if str(cert_reqs or "required").lower() == "none":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _cluster_nodes(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    options: dict[str, Any] = {}
    hosts = netloc[-1]
    if len(netloc) == 2:
        user, _, password = netloc[0].partition(":")
        if user:
            options["username"] = user
        if password:
            options["password"] = password
    if parts.scheme.startswith("rediss"):
        options["ssl"] = True
    nodes = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError("url", url, f"cluster node {item!r} must be host:port")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise ConfigError("url", url, "must name at least one cluster node")
    return nodes, options


class RedisClusterStore(_RedisBase):
    """Counters on a Redis Cluster (``redis+cluster://h1:p1,h2:p2``). All rules of one
    user key live in one slot, so ``hit_all`` is still one script on one node."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._nodes, self._auth = _cluster_nodes(url)
        self._client: Any = None
        self._client_lock = threading.Lock()
        self.breakers: dict[str, _Breaker] = {}
        """One breaker per master (``host:port``), so a sick node fails fast while the
        others keep answering. ``breaker`` guards reaching the cluster at all."""

    def _node_breaker(self, name: str) -> _Breaker:
        if not name:
            return self.breaker
        b = self.breakers.get(name)
        if b is None:
            b = self.breakers.setdefault(
                name, _Breaker(self.breaker.threshold, self.breaker.cooldown, self.clock))
        return b

    @staticmethod
    def _node_name(nodes_manager: Any, command: Any) -> str:
        """The master serving ``command``'s first key ("" when unknown or keyless)."""
        if command[0] not in ("EVALSHA", "EVAL") or not command[2]:
            return ""
        try:
            node = _node_of(nodes_manager, command)
        except (*_BACKEND_ERRORS, KeyError, IndexError):
            return ""
        return str(node.name) if node is not None else ""

    def _breaker_for(self, command: Any) -> _Breaker:
        if self._client is None:
            self.breaker.before()
            try:
                self._sync_client()
            except _BACKEND_ERRORS as exc:
                self.breaker.failure()
                raise StorageError(f"redis: {type(exc).__name__}: {exc}") from exc
        return self._node_breaker(self._node_name(self._client.nodes_manager, command))

    def _async_gate(self) -> None:
        """Async checks are gated per master when routed (see :class:`_ClusterRouter`)."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisClusterStore:
        """``redis+cluster://[user:password@]h1:p1,h2:p2`` (``rediss+cluster://`` for TLS);
        options as for :class:`RedisStore`."""
        return cls(url, **options)

    def _options(self, retry: Any) -> dict[str, Any]:
        # no retries: a failed check is answered by on_error now, not after several timeouts
        return {"socket_timeout": self.timeout, "socket_connect_timeout": self.connect_timeout,
                "max_connections": self.max_connections, "retry": retry(NoBackoff(), 0),
                **self._auth, **self.client_options}

    def _sync_client(self) -> Any:
        client = self._client
        if client is None:
            with self._client_lock:
                client = self._client
                if client is None:
                    node: Any = redis.cluster.ClusterNode
                    nodes = [node(h, p) for h, p in self._nodes]
                    client = self._client = redis.cluster.RedisCluster(
                        startup_nodes=nodes, **self._options(redis.retry.Retry))
        return client

    def _call(self, command: Any) -> Any:
        client = self._sync_client()
        left = deadline.remaining()
        if left is not None and left < self.timeout:
            reply = self._call_within(client, command, max(left, 0.0001))
            if reply is not _ROUTED_ELSEWHERE:
                return reply
        self.round_trips += 1
        try:
            return client.execute_command(*command)
        except ResponseError as exc:
            if not _is_noscript(exc):
                raise
        self.round_trips += 1
        return client.execute_command(*_as_eval(command))

    def _call_within(self, client: Any, command: Any, timeout: float) -> Any:
        """``command`` on the master owning its key, waiting at most ``timeout`` (the
        deadline in force) instead of the socket timeout: redis-py's cluster client has
        no per-call timeout. Returns ``_ROUTED_ELSEWHERE`` when the key's node is not
        known or the slot moved (MOVED/ASK): the cluster client then routes it."""
        node = _node_of(client.nodes_manager, command)  # (a DEL was packed as an EVAL)
        if node is None:
            return _ROUTED_ELSEWHERE
        pool = client.get_redis_connection(node).connection_pool
        conn = pool.get_connection()
        try:
            for attempt in (command, _as_eval(command)):
                self.round_trips += 1
                conn.send_command(*attempt)
                try:
                    # a timeout disconnects the connection: no reply is left to misread
                    return conn.read_response(timeout=timeout)
                except (MovedError, AskError):
                    return _ROUTED_ELSEWHERE
                except ResponseError as exc:
                    if attempt[0] == "EVAL" or not _is_noscript(exc):
                        raise
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            pool.release(conn)

    def _pack(self, command: Any) -> Any:
        if command[0] == "DEL":
            # one slot: a multi-key DEL is one command (redis-py would split it per key)
            return ("EVAL", "return redis.call('DEL', unpack(KEYS))", len(command) - 1,
                    *command[1:])
        return command

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def _new_runner(self, loop: asyncio.AbstractEventLoop) -> _Runner:
        return _ClusterRouter(self, loop)

    def _node_ssl_context(self) -> ssl.SSLContext | None:
        """TLS for the async connections to the masters (``rediss+cluster://``)."""
        if not self._auth.get("ssl"):
            return None
        return _tls_context(self.client_options.get("ssl_cert_reqs"))


