"""The hybrid store's view of its backend: leases, one round trip per node per batch.

A *lease* takes up to ``want`` units of cost from a key's counter on the backend, or as
many as are free when that is at least ``min``; nothing when fewer than ``min`` are free
(the reply then says how long until ``min`` would be). On Redis it is one script,
``lua/lease.lua``, over the rate-limit script's own keys and state, so leases and direct
checks of a key share one counter; every lease of a batch on one server is in one
``EVALSHA``, and a Redis Cluster gets one pipeline per master (one round trip each).
Over any other store (the memory store in tests, a service store) a lease is a ``hit`` of
``want`` and, if denied with fewer free, a second ``hit`` of what is free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from stormguard._core.clock import wall_us
from stormguard._core.errors import StorageError
from stormguard.ratelimit.rule import Rule
from stormguard.stores.base import Store

__all__ = ["Backend", "Grant", "LeaseRequest", "backend_for"]

#: (backend key, rule, want, min)
LeaseRequest = tuple[str, Rule, int, int]
#: (granted, remaining after, reset_us, retry_us, backend now_us)
Grant = tuple[int, int, int, int, int]

_BATCH = 256  # leases per EVALSHA: a script runs alone on its server, keep each short


class Backend:
    """Leases over any :class:`Store` with its public methods."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._trips = 0
        self.ops = 0
        """Counter operations on the backend: a lease or a direct check is one (a script
        run on Redis), however they travel."""

    @property
    def round_trips(self) -> int:
        """Round trips to the backend (a batch counts once per node)."""
        return self._trips

    def nodes(self, requests: Sequence[LeaseRequest]) -> int:
        """How many round trips a batch of ``requests`` costs."""
        return 1 if requests else 0

    def _one(self, key: str, rule: Rule, want: int, least: int) -> Grant:
        store = self.store
        now = wall_us(store.clock)
        self._trips += 1
        self.ops += 1
        if want == 0:  # a read
            d = store.peek(key, rule, 1)
            return (0, d[2], round(d[3] * 1e6), 0, now)
        d = store.hit(key, rule, want)
        if d[0]:
            return (want, d[2], round(d[3] * 1e6), 0, now)
        free = min(d[2], want)
        if free > 0 and free >= least:
            self._trips += 1
            d2 = store.hit(key, rule, free)
            if d2[0]:
                return (free, d2[2], round(d2[3] * 1e6), 0, now)
            d = d2
        if least > 0 and least != want:
            self._trips += 1
            d = store.peek(key, rule, least)
        return (0, d[2], round(d[3] * 1e6), round(d[4] * 1e6), now)

    def lease(self, key: str, rule: Rule, want: int, least: int) -> Grant:
        """One lease, one round trip (raises :class:`StorageError`)."""
        return self._one(key, rule, want, least)

    def lease_many(self, requests: Sequence[LeaseRequest]) -> list[Grant | StorageError]:
        """Every lease of a sync round; a failed one has its error in its place."""
        out: list[Grant | StorageError] = []
        trips = self._trips
        for key, rule, want, least in requests:
            try:
                out.append(self._one(key, rule, want, least))
            except StorageError as exc:
                out.append(exc)
        # a batch is one round trip per node, whatever the adapter had to do for it
        self._trips = trips + self.nodes(requests)
        return out

    async def alease(self, key: str, rule: Rule, want: int, least: int) -> Grant:
        store = self.store
        now = wall_us(store.clock)
        self._trips += 1
        self.ops += 1
        if want == 0:
            d = await store.apeek(key, rule, 1)
            return (0, d[2], round(d[3] * 1e6), 0, now)
        d = await store.ahit(key, rule, want)
        if d[0]:
            return (want, d[2], round(d[3] * 1e6), 0, now)
        free = min(d[2], want)
        if free > 0 and free >= least:
            self._trips += 1
            d2 = await store.ahit(key, rule, free)
            if d2[0]:
                return (free, d2[2], round(d2[3] * 1e6), 0, now)
            d = d2
        if least > 0 and least != want:
            self._trips += 1
            d = await store.apeek(key, rule, least)
        return (0, d[2], round(d[3] * 1e6), round(d[4] * 1e6), now)

    async def alease_many(self, requests: Sequence[LeaseRequest]
                          ) -> list[Grant | StorageError]:
        out: list[Grant | StorageError] = []
        trips = self._trips
        for key, rule, want, least in requests:
            try:
                out.append(await self.alease(key, rule, want, least))
            except StorageError as exc:
                out.append(exc)
        self._trips = trips + self.nodes(requests)
        return out


class RedisBackend(Backend):
    """Leases on Redis or a Redis Cluster: ``lua/lease.lua``."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        from stormguard.stores.redis.cluster import ClusterTransport
        from stormguard.stores.redis.ratelimit_scripts import LEASE, rule_args

        self.redis: Any = store  # a RedisStore or RedisClusterStore
        self._script = LEASE
        self._rule_args = rule_args
        self._args: dict[str, list[str | int]] = {}
        self.transport = store.transport
        self.cluster = isinstance(self.transport, ClusterTransport)
        self._base: int = self.transport.round_trips

    @property
    def round_trips(self) -> int:
        # every round trip of the backend's transport: leases, syncs and direct checks
        trips: int = self.transport.round_trips
        return int(trips - self._base)

    def nodes(self, requests: Sequence[LeaseRequest]) -> int:
        if not requests:
            return 0
        if not self.cluster:
            return 1
        return len({self.transport.node_for(self.redis.key(k, r)) for k, r, _, _ in requests})

    def _rule(self, rule: Rule) -> list[str | int]:
        a = self._args.get(rule._id)
        if a is None:
            a = self._args[rule._id] = list(self._rule_args(rule))
        return a

    def _now(self) -> str | int:
        return "" if self.redis.time_source == "server" else wall_us(self.store.clock)

    def _commands(self, requests: Sequence[LeaseRequest]) -> list[tuple[Any, int]]:
        """(command, how many leases it holds): one per batch on one server, one per lease
        on a cluster (keys of one script must share a slot)."""
        groups: list[Sequence[LeaseRequest]]
        if self.cluster:
            groups = [[r] for r in requests]
        else:
            groups = [requests[i:i + _BATCH] for i in range(0, len(requests), _BATCH)]
        out = []
        slack = self.redis._slack_ms
        for group in groups:
            keys = [self.redis.key(k, r) for k, r, _, _ in group]
            args: list[str | int] = [self._now(), len(group), "", slack]
            for _, rule, want, least in group:
                args += self._rule(rule)
                args += [want, least, 0, 0]
            out.append((self._script.command(keys, args), len(group)))
        return out

    @staticmethod
    def _grants(reply: Any, n: int) -> list[Grant]:
        now = int(reply[0])
        return [(int(reply[1 + 4 * i]), int(reply[2 + 4 * i]), int(reply[3 + 4 * i]),
                 int(reply[4 + 4 * i]), now) for i in range(n)]

    def lease(self, key: str, rule: Rule, want: int, least: int) -> Grant:
        ((command, n),) = self._commands([(key, rule, want, least)])
        self.ops += 1
        return self._grants(self.transport.call(command), n)[0]

    def lease_many(self, requests: Sequence[LeaseRequest]) -> list[Grant | StorageError]:
        commands = self._commands(requests)
        self.ops += len(requests)
        replies = self.transport.call_many([c for c, _ in commands])
        out: list[Grant | StorageError] = []
        for (_, n), reply in zip(commands, replies, strict=True):
            if isinstance(reply, BaseException):
                err = reply if isinstance(reply, StorageError) else StorageError(str(reply))
                out += [err] * n
            else:
                out += self._grants(reply, n)
        return out

    async def alease(self, key: str, rule: Rule, want: int, least: int) -> Grant:
        ((command, n),) = self._commands([(key, rule, want, least)])
        self.ops += 1
        return self._grants(await self.transport.acall(command), n)[0]

    async def alease_many(self, requests: Sequence[LeaseRequest]
                          ) -> list[Grant | StorageError]:
        commands = self._commands(requests)
        self.ops += len(requests)

        async def one(command: Any) -> Any:
            try:
                return await self.transport.acall(command)
            except StorageError as exc:
                return exc

        # concurrent acalls of one loop iteration leave in one write per server
        replies = await asyncio.gather(*(one(c) for c, _ in commands))
        out: list[Grant | StorageError] = []
        for (_, n), reply in zip(commands, replies, strict=True):
            if isinstance(reply, BaseException):
                err = reply if isinstance(reply, StorageError) else StorageError(str(reply))
                out += [err] * n
            else:
                out += self._grants(reply, n)
        return out


def backend_for(store: Store) -> Backend:
    """The lease adapter of ``store``: Lua leases on Redis, public methods otherwise."""
    if hasattr(store, "transport") and hasattr(store, "time_source"):
        from stormguard.stores.redis.store import _RedisStore

        if isinstance(store, _RedisStore):
            return RedisBackend(store)
    return Backend(store)
