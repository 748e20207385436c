"""HybridStore: rate-limit decisions in process memory, shared through a backend store.

Each process holds, per key and rule, a **lease**: units of cost it has already taken
from the key's counter on the backend (the same counter, in the same format, as a
:class:`~stormguard.stores.redis.RedisStore` check). A check spends the lease in
memory; when the lease cannot cover it, the process asks the backend at once (one round
trip) for more. Every ``sync_interval`` seconds one sync round tops up the lease of each
key in use to what the key's recent demand needs until the next round, for every key in
one round trip per backend node. Since every admitted unit was taken from the backend
counter before it was spent, the fleet never admits more than the backend's algorithm
would (see docs/hybrid.md for the bound and its conditions).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit

from stormguard._core import validate
from stormguard._core.clock import Clock, system_clock
from stormguard._core.errors import ConfigError, StorageError
from stormguard.observability.events import Event, Listener, emit, observed
from stormguard.observability.metrics import track
from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.reservation import Reservation
from stormguard.ratelimit.rule import Rule
from stormguard.stores.base import Store, binding, check_cost, check_rules, key_error
from stormguard.stores.hybrid.backend import (
    FORCED,
    FORCED_PRESENT,
    FORCED_SCRIPT,
    Backend,
    BoardRead,
    Grant,
    LeaseRequest,
    backend_for,
)
from stormguard.stores.hybrid.sketch import HotKeys

__all__ = ["HybridDegraded", "HybridStore", "HybridSynced"]

_new = tuple.__new__
_WINDOWS = frozenset({"fixed_window", "sliding_window_counter"})
_LOCAL = frozenset({"fixed_window", "sliding_window_counter", "token_bucket", "gcra",
                    "leaky_bucket"})
_SWEEP_ROUNDS = 16  # every 16 rounds, entries idle for as long are dropped
# a key on the board is checked exactly (no allowance) for 2 windows after it frees
_CONTENDED_WINDOWS = 2
# a process none of whose checks found its key on the board since it last read it (a key
# its own last reply had not said was exhausted), and that has read _BOARD_IDLE entries
# since one of its checks last did, reads the board every 4th round only (it still posts
# every round)
_BOARD_EVERY = 4
_BOARD_IDLE = 256
# the options of a hybrid+ URL's query, and their types
_URL_OPTIONS: dict[str, type] = {
    "sync_interval": float, "hot_rate": float, "shards": int, "max_keys": int,
    "hot_period": float, "sketch_size": int, "outage_share": float, "deny_hold": float,
    "cold_allowance": int, "board_size": int, "name": str, "native_adds": bool}
_BOOLS = {"1": True, "true": True, "yes": True, "on": True,
          "0": False, "false": False, "no": False, "off": False}


@dataclass(frozen=True, slots=True)
class HybridSynced(Event):
    """One sync round: ``keys`` leases asked, ``granted`` units received, ``round_trips``
    made, ``failed`` leases whose node did not answer, in ``duration`` seconds."""

    log_level: ClassVar[int] = logging.DEBUG

    keys: int
    granted: int
    round_trips: int
    failed: int
    duration: float


@dataclass(frozen=True, slots=True)
class HybridDegraded(Event):
    """The backend became unreachable (``degraded=True``: checks are answered from the
    shares held) or reachable again (``False``: counts reconciled)."""

    log_level: ClassVar[int] = logging.WARNING

    degraded: bool
    error: str


class _Entry:
    """One key under one rule in this process."""

    __slots__ = (
        "aused",
        "awin",
        "demand",
        "denied_cost",
        "denied_until",
        "dentry",
        "dirty",
        "dshare",
        "dused",
        "dwindow",
        "expires",
        "granted",
        "key",
        "last_granted",
        "lease",
        "omode",
        "owed",
        "owin",
        "rate",
        "remaining",
        "reset_at",
        "rule",
        "share",
        "sole",
        "synced_at",
        "used",
        "window",
    )

    def __init__(self, key: str, rule: Rule, now: int) -> None:
        self.key = key
        self.rule = rule
        self.lease = 0          # units taken from the backend, not spent yet
        self.expires = 0        # windows: the lease is void from this time (us); 0: never
        self.window = -1        # windows: the backend window the lease was taken in
        self.used = 0           # units spent since the last sync round
        self.demand = 0         # units asked for since the last sync round
        self.rate = 0.0         # demand, units per microsecond (smoothed over rounds)
        self.granted = 0        # units taken in the backend's current window (for share)
        self.remaining = rule._algo.B  # the backend's remaining at the last reply
        self.reset_at = 0
        self.denied_until = 0   # a denial remembered until its retry_after
        self.denied_cost = 0
        self.synced_at = now
        self.dirty = False      # in the store's list of entries checked since the round
        self.dentry: list[Any] | None = None  # the local state while degraded
        self.dshare = 1.0       # the share of the limit it enforces meanwhile
        self.dused = 0          # admitted while degraded, to charge on reconnection
        self.dwindow = 0
        self.aused = 0          # admitted on the cold allowance in window `awin`
        self.awin = -1
        self.owed = 0           # admitted on the cold allowance, not charged yet (window owin)
        # how to charge what is owed: FORCED, or after a native add found the key present
        # FORCED_PRESENT (an APPEND) or, when those units exhaust it, FORCED_SCRIPT
        self.omode = FORCED
        self.owin = -1
        self.last_granted = 0   # windows: what it took in the last whole window it leased in
        self.sole = False       # windows: and it alone took from the counter then (>= 2)
        self.share = -1.0       # windows: this process's part of what the fleet took in
                                # the last window it leased in (-1: unknown)


def _window_of(rule: Rule, now: int) -> int:
    a = rule._algo
    return now // a.W if rule.algorithm in _WINDOWS else 0


def _resolve(backend: Store | str, clock: Clock | None,
             backend_options: dict[str, Any]) -> Store:
    """The backend store: built from its URL, or checked."""
    if isinstance(backend, str):
        from stormguard.stores import from_url

        if backend.lower().startswith("hybrid+"):
            raise ConfigError("backend", backend, "is itself a hybrid store URL")
        if clock is not None:
            backend_options.setdefault("clock", clock)
        backend = from_url(backend, **backend_options)
    elif backend_options:
        raise ConfigError("backend_options", sorted(backend_options),
                          "only apply when the backend is given as a URL")
    if not isinstance(backend, Store):
        raise ConfigError("backend", backend, "must be a stormguard Store or a store URL")
    if isinstance(backend, HybridStore):
        raise ConfigError("backend", backend, "must not be another HybridStore")
    return backend


class HybridStore(Store):
    """Local decisions, shared through ``backend`` (a store URL or a :class:`Store`).

    * ``sync_interval``: seconds between sync rounds (``None``: no background sync; call
      :meth:`sync`). The blocking API syncs from a daemon thread, the asyncio API from a
      task on the loop of the first ``a*`` call.
    * ``hot_rate``: 0.0 counts every key locally; ``R > 0`` counts locally only the keys
      this process checks more than ``R`` times per second (a bounded heavy-hitter
      sketch of ``sketch_size`` counters over ``hot_period`` seconds, with hysteresis);
      every other key is checked on the backend, exactly, on every request.
    * ``shards``: the backend counter of a key is split into ``shards`` counters (on
      different cluster slots), each with its part of the capacity; a process takes its
      leases from its own shard first and from the others when its own is spent.
    * ``max_keys``: local entries held at most (and denials remembered at most).
    * ``deny_hold``: a locally decided key the backend denied stays denied in this
      process for ``max(retry_after, deny_hold)`` (default: ``sync_interval``), so a key
      over its limit costs about one round trip per ``deny_hold`` per process; the
      capacity freed meanwhile is not lost, another process or the next lease takes it.
    * ``outage_share``: the share of a key's limit this process enforces while the
      backend is unreachable (default: for the window algorithms, its part of the
      fleet's demand at the last successful sync, with a floor; otherwise ``1 / peers``,
      the processes counted on the backend at the last sync rounds; what it took in the
      current window counts).
    * ``cold_allowance``: ``a > 0`` admits, for a key this process holds no lease for
      and has not seen busy, up to ``a`` units per window of the rule in memory, charged
      to the key's backend counter at the next sync round (a forced add in the round's
      round trip); the round reads the board of exhausted keys, which are then denied
      locally until they free, and checked exactly (leases) for two windows more. Per
      window the fleet admits at most ``limit + a x processes`` (docs/hybrid.md).
      ``0`` (default): every unit is taken from the backend before it is spent.
    * ``board_size``: the board entries one round reads at most.
    * ``native_adds`` (default True): on Redis, a forced add on a fixed window travels as
      a native ``SET NX GET`` in the round's pipeline (a key present is charged one
      round later, by a native ``APPEND`` to its state); False: every forced add in the
      script, charged in its round (less overshoot, more Redis time).

    ``sliding_window_log`` is exact by definition: its checks always go to the backend.
    """

    def __init__(  # noqa: PLR0915
            self, backend: Store | str = "memory://", *, sync_interval: float | None = 0.1,
                 hot_rate: float = 0.0, shards: int = 1, max_keys: int = 100_000,
                 hot_period: float = 1.0, sketch_size: int = 1024,
                 outage_share: float | None = None, deny_hold: float | None = None,
                 cold_allowance: int = 0, board_size: int = 4096,
                 native_adds: bool = True, name: str = "hybrid",
                 clock: Clock | None = None, listeners: Sequence[Listener] = (),
                 **backend_options: Any) -> None:
        if sync_interval is not None:
            sync_interval = validate.number("sync_interval", sync_interval, minimum=0.001)
        self.sync_interval: float | None = sync_interval
        self.hot_rate = validate.number("hot_rate", hot_rate, allow_zero=True)
        self.shards = validate.integer("shards", shards, maximum=1024)
        self.max_keys = validate.integer("max_keys", max_keys)
        self.hot_period = validate.number("hot_period", hot_period, minimum=0.001)
        self.sketch_size = validate.integer("sketch_size", sketch_size)
        if outage_share is not None:
            outage_share = validate.number("outage_share", outage_share, maximum=1.0)
        self.outage_share = outage_share
        if deny_hold is None:
            deny_hold = sync_interval if sync_interval is not None else 0.0
        self.deny_hold = validate.number("deny_hold", deny_hold, allow_zero=True)
        self._hold_us = round(self.deny_hold * 1e6)
        self.cold_allowance = validate.integer("cold_allowance", cold_allowance,
                                               minimum=0)
        self.board_size = validate.integer("board_size", board_size, maximum=1 << 16)
        self._max_age_us = round(2 * (sync_interval or 0.1) * 1e6)
        self.name = validate.text("name", name)
        self._owns = isinstance(backend, str)
        self.backend = backend = _resolve(backend, clock, backend_options)
        self.clock = clock if clock is not None else getattr(backend, "clock", system_clock)
        wall_ns = getattr(self.clock, "wall_ns", None)
        if wall_ns is None:
            raise ConfigError("clock", self.clock, "must have the methods of stormguard.Clock "
                              "(wall_ns() is missing)")
        self._wall_ns = wall_ns
        self._b: Backend = backend_for(backend)
        # the cold allowance: on one shard only (shards split the counter)
        self._allow = self.cold_allowance if self.shards == 1 else 0
        self._b.posting = self._allow > 0
        if not isinstance(native_adds, bool):
            raise ConfigError("native_adds", native_adds, "must be True or False")
        self.native_adds = native_adds
        if not native_adds:
            self._b.native = False
        self._board: OrderedDict[str, int] = OrderedDict()  # board id -> until (us)
        # (rule id, key) -> [window, units] the direct path admitted in that window
        self._direct_used: OrderedDict[tuple[str, str], list[int]] = OrderedDict()
        self._board_seq = -1  # the last board sequence number read
        # checks that found their key on the board since it was last read; rounds since
        self._board_hits, self._board_unread, self._board_reading = 0, 0, True
        self._board_misses = 0  # entries read since a check last found its key on it
        self._cold_admitted = self._board_entries = 0
        self._listeners: list[Listener] = list(listeners)
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._denied: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
        self._lock, self._sync_lock = threading.Lock(), threading.Lock()
        self._hot = HotKeys(self.hot_rate, self.hot_period, self.sketch_size) \
            if self.hot_rate > 0 else None
        self._shard_rules: dict[tuple[str, int], Rule] = {}
        self._outage_rules: dict[tuple[str, int], Rule] = {}  # (rule id, limit) -> rule
        self._home = (id(self) ^ (time.perf_counter_ns() >> 10)) % self.shards
        self._degraded, self._recovered_at = False, 0  # (when the backend came back, us)
        # the processes sharing the backend, counted on it: each adds 1 per peer window
        peer_window = max(1.0, 4 * sync_interval) if sync_interval is not None else 1.0
        self._peer_rule = Rule(2**40, peer_window, "fixed_window", name="hybrid-peers")
        self._peer_key = "\x00stormguard.hybrid.peers"
        # until the first count arrives, as if the fleet were huge: exact checks, no leases
        # beyond their cost (a process that just started cannot know its share)
        self._peer_win, self._peers, self._peers_last = -1, 1 << 30, 0
        self._peer_count = 0  # counted in the current peer window so far
        self._last_sync = self._now()
        self._local_decisions = self._direct_checks = self._keys_synced = self._syncs = 0
        self._rounds = 0
        self._denials_cached = self._degraded_decisions = self._voided = 0
        self._acquire, self._release, self._get = (self._lock.acquire, self._lock.release,
                                                   self._entries.get)
        self._dirty: list[_Entry] = []  # entries checked since the last round
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        # True until the blocking API has started its sync thread (one flag on the hot path)
        self._no_sync_yet = sync_interval is not None
        self._stop, self._closed = threading.Event(), False
        track(self, "hybrid")  # metrics: syncs, keys synced, local decisions, degraded

    # -- construction from a URL ---------------------------------------------------------
    @classmethod
    def from_url(cls, url: str, **options: Any) -> HybridStore:
        """``hybrid+<backend URL>``: ``hybrid+redis://h:6379/0?sync_interval=0.1&hot_rate=100``,
        ``hybrid+redis+cluster://h1:p1,h2:p2``, ``hybrid+memory://``. Every HybridStore
        option works as a query parameter (``sync_interval=none``: no background sync);
        the other parameters go to the backend's URL."""
        if not isinstance(url, str) or not url.lower().startswith("hybrid+"):
            raise ConfigError("store", url, "a hybrid store URL starts with 'hybrid+'")
        parts = urlsplit(url[len("hybrid+"):])
        rest = []
        for k, v in parse_qsl(parts.query, keep_blank_values=True):
            conv = _URL_OPTIONS.get(k)
            if conv is None:
                rest.append((k, v))
                continue
            if k in options:
                continue
            if k == "sync_interval" and v.lower() in ("none", "off", ""):
                options[k] = None
                continue
            if conv is bool:
                if v.lower() not in _BOOLS:
                    raise ConfigError(k, v, "must be true or false")
                options[k] = _BOOLS[v.lower()]
                continue
            try:
                options[k] = conv(v)
            except ValueError:
                raise ConfigError(k, v, f"must be {'an integer' if conv is int else 'a number'}"
                                  ) from None
        query = urlencode(rest)
        backend = f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{query}" if query else "")
        return cls(backend, **options)

    # -- events --------------------------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        """Receive this store's events (:class:`HybridSynced`, :class:`HybridDegraded`)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def _set_degraded(self, degraded: bool, error: str) -> None:
        if degraded == self._degraded:
            return
        self._degraded = degraded
        if observed(self._listeners):
            emit(self._listeners, HybridDegraded(self.name, self.clock.monotonic(),
                                                 degraded, error))

    # -- helpers -------------------------------------------------------------------------
    def _now(self) -> int:
        return int(self._wall_ns()) // 1000

    def _check(self, key: object, rule: object, cost: object) -> int:
        if type(key) is not str:
            raise key_error(key)
        if not isinstance(rule, Rule):
            raise ConfigError("rule", rule, "must be a stormguard.Rule")
        if type(cost) is not int or cost != 1:
            return check_cost(rule, cost)
        return 1

    def _shard_rule(self, rule: Rule, i: int) -> Rule:
        """Shard ``i``'s part of ``rule``: the limit (and burst) split, remainders first."""
        r = self._shard_rules.get((rule._id, i))
        if r is None:
            n = self.shards

            def part(total: int) -> int:
                return max(1, total // n + (1 if i < total % n else 0))

            burst = part(rule.capacity) if rule.burst is not None else None
            r = Rule(part(rule.limit), rule.window, rule.algorithm, burst, rule.name)
            self._shard_rules[(rule._id, i)] = r
        return r

    def _local_kind(self, key: str, rule: Rule, now: int) -> bool:
        """True when this check is decided locally (else: on the backend, exactly)."""
        if rule.algorithm not in _LOCAL:
            return False
        hot = self._hot
        return hot is None or hot.check(key, now)

    def _want(self, e: _Entry, now: int, cost: int) -> int:
        """How much to ask for now: the cost, plus the larger of the demand since the last
        round (so a key that gets busy doubles its lease per round trip) and the demand
        expected until the next round."""
        cap = e.rule._algo.B
        if self.shards > 1:
            cap = self._shard_rule(e.rule, self._home)._algo.B
        horizon = self._interval_us(now)
        # evidence first: a key seen once is asked for exactly its cost (a cold key's
        # lease would mostly be left unspent, capacity no other process could use)
        more = max(e.demand if e.demand >= 2 else 0, int(e.rate * horizon))
        rule = e.rule
        if rule.algorithm in _WINDOWS and e.rate > 0:
            # a window's lease is void at its end: ask for no more than the demand until then
            w = rule._algo.W
            more = min(more, int(e.rate * (w - now % w)))
        # and never more than this process's share of what the backend had left; a key
        # this process alone took from in its last whole window (a balancer that sends it
        # here only) may take what it took then, for the rest of this window, of all
        # that is left: no other process asks for it
        share = self._share(e, now, horizon)
        if rule.algorithm in _WINDOWS and e.sole:
            w = rule._algo.W
            more = max(more, e.last_granted * (w - now % w) // w)
            share = e.remaining
        more = min(more, share)
        return max(cost, min(cap, cost + more))

    def _share(self, e: _Entry, now: int, interval_us: int) -> int:
        """What this process may take of what the backend had left at its last reply:
        ``remaining / processes``, but at least its own demand until the next round (as
        much as is left), so that a key near its limit is not leased in ever smaller
        parts (each a round trip), for a limit of two units per process or more; and all
        of it for a window in which this process took half the limit or more and no other
        process has taken from the counter yet (the units taken are all its own: with
        less, a key spread over the processes, seen early in a window by this one, would
        be leased here a busy round's demand that others then lack). Before
        the first round has counted the processes: nothing beyond each check's cost.
        (A fixed window's remaining from a window that has ended is the whole limit.)"""
        rem = e.remaining
        rule = e.rule
        if rule.algorithm == "fixed_window" and e.expires and now >= e.expires:
            rem = rule._algo.B  # the last reply was of a window that has ended: a new quota
        if self._peers >= 1 << 30 or rem <= 0:
            return 0
        if (rule.algorithm in _WINDOWS and e.expires and now < e.expires
                and 2 * e.granted >= rule._algo.B and rule._algo.B - rem <= e.granted):
            return rem
        if rule.algorithm != "fixed_window" or 2 * self._peers > rule._algo.B:
            # (no floor for a limit under two units per process: a key spread thin, whose
            # demand in one round says little of the next; a unit it took and does not
            # spend is one another process is denied. Fixed windows only: on a sliding
            # window counter the busy processes would empty the window early, and the
            # outage parts the others measure at their last reply of it would overstate
            # theirs; the buckets' leases are void after two rounds, and a larger one
            # strands more when the demand moves)
            return rem // self._peers
        return max(rem // self._peers, min(rem, int(e.rate * interval_us)))

    def _interval_us(self, now: int) -> int:
        if self.sync_interval is not None:
            return round(self.sync_interval * 1e6)
        return max(1, now - self._last_sync)

    def _lease(self, key: str, rule: Rule, want: int, least: int) -> Grant:
        """One lease on the backend (one round trip; with shards, more when the home
        shard is spent). Raises StorageError."""
        if self.shards == 1:
            return self._b.lease(key, rule, min(want, rule._algo.B), least)
        g: Grant | None = None
        for j in range(self.shards):
            i = (self._home + j) % self.shards
            sr = self._shard_rule(rule, i)
            if least > sr._algo.B:
                continue
            g = self._b.lease(f"{key}\x00{i}", sr, min(want, sr._algo.B), least)
            if g[0] > 0:
                return g
        if g is None:  # the cost exceeds every shard's capacity
            raise ConfigError("cost", least, f"exceeds the capacity of each of the "
                              f"{self.shards} shards of rule {rule}")
        return g

    async def _alease(self, key: str, rule: Rule, want: int, least: int) -> Grant:
        if self.shards == 1:
            return await self._b.alease(key, rule, min(want, rule._algo.B), least)
        g: Grant | None = None
        for j in range(self.shards):
            i = (self._home + j) % self.shards
            sr = self._shard_rule(rule, i)
            if least > sr._algo.B:
                continue
            g = await self._b.alease(f"{key}\x00{i}", sr, min(want, sr._algo.B), least)
            if g[0] > 0:
                return g
        if g is None:
            raise ConfigError("cost", least, f"exceeds the capacity of each of the "
                              f"{self.shards} shards of rule {rule}")
        return g

    def _backend_key(self, key: str, rule: Rule) -> tuple[str, Rule]:
        if self.shards == 1:
            return key, rule
        return f"{key}\x00{self._home}", self._shard_rule(rule, self._home)

    # -- the local decision --------------------------------------------------------------
    @staticmethod
    def _rule_changed(e: _Entry, rule: Rule) -> None:
        """The same counters under another limit (a regional share moved): the lease
        taken under the old limit is given up (those units stay spent on the backend,
        so the change can only under-admit), and the next check asks the backend."""
        e.rule = rule
        e.lease = 0

    def _fast(self, key: str, rule: Rule, cost: int, now: int) -> Decision | None:
        """The decision from memory, or None when the backend must be asked.
        Called with the lock held."""
        e = self._entries.get((rule._id, key))
        if e is None:
            return None
        if e.rule is not rule and e.rule != rule:
            self._rule_changed(e, rule)
        e.demand += cost
        if not e.dirty:
            e.dirty = True
            self._dirty.append(e)
        if e.denied_until > now and cost >= e.denied_cost:
            self._denials_cached += 1
            return _new(Decision, (False, rule._algo.B, 0, max(0, e.reset_at - now) / 1e6,
                                   (e.denied_until - now) / 1e6, rule, False))
        if e.lease >= cost and (e.expires == 0 or now < e.expires):
            e.lease -= cost
            e.used += cost
            self._local_decisions += 1
            rem = e.lease + e.remaining
            reset = e.reset_at - now
            return _new(Decision, (True, rule._algo.B, rem, reset / 1e6 if reset > 0 else 0.0,
                                   0.0, rule, False))
        e.demand -= cost  # counted again when the reply is folded in
        return None

    def _apply(self, key: str, rule: Rule, cost: int, sent: int, g: Grant) -> Decision:
        """Fold the reply of an on-demand lease into the entry; the decision it gives."""
        granted, remaining, reset_us, retry_us, _bnow = g
        now = self._now()
        with self._lock:
            e = self._entry(key, rule, now)
            e.demand += cost
            self._mark(e)
            self._credit(e, g, sent)
            if granted >= cost:
                e.lease -= cost
                e.used += cost
                rem = e.lease + e.remaining
                return _new(Decision, (True, rule._algo.B, rem, reset_us / 1e6, 0.0, rule,
                                       False))
            if e.lease >= cost and (e.expires == 0 or now < e.expires):
                # another thread's lease arrived meanwhile
                e.lease -= cost
                e.used += cost
                return _new(Decision, (True, rule._algo.B, e.lease + e.remaining,
                                       reset_us / 1e6, 0.0, rule, False))
            retry_us = self._hold(rule, sent, retry_us)
            e.denied_until = sent + retry_us
            e.denied_cost = cost
        return _new(Decision, (False, rule._algo.B, remaining, reset_us / 1e6, retry_us / 1e6,
                               rule, False))

    def _credit(self, e: _Entry, g: Grant, sent: int) -> None:
        """Add a grant to the entry's lease (lock held). A window algorithm's lease is
        void at the end of the backend window it was taken in, measured from ``sent``
        (when the request left: the earliest the backend could have answered)."""
        granted, remaining, reset_us, _retry, bnow = g
        rule = e.rule
        last = e.remaining
        e.remaining = remaining
        e.reset_at = sent + reset_us
        if rule.algorithm in _WINDOWS:
            w = rule._algo.W
            window = bnow // w
            expires = sent + ((window + 1) * w - bnow)
            if window != e.window:
                if e.window >= 0:  # the old window closes: the part of it this process took
                    s = self._part(e.granted, rule._algo.B - last, rule._algo.B)
                    if s is not None:
                        e.share = s
                    e.last_granted = e.granted
                    e.sole = e.granted >= 2 and e.granted >= rule._algo.B - last
                # a lease of another window: what is left of the old one is void
                self._voided += e.lease
                e.lease = 0
                e.granted = 0
                e.window = window
                e.expires = expires
            elif expires < e.expires:
                e.expires = expires
        elif granted > 0:
            # a bucket's lease is void after two rounds: tokens a process stopped needing
            # go back to no one, but they no longer add to a later burst either
            if e.expires and self._now() >= e.expires:
                self._voided += e.lease
                e.lease = 0
            e.expires = sent + self._max_age_us
        if granted > 0:
            e.lease += granted
            e.granted += granted
            e.denied_until = 0
        if remaining <= 0 and rule.algorithm == "fixed_window" and self._allow \
                and self._b.has_board:
            # its own reply says the window is exhausted: noted as the board's entry would
            # be (the key is contended here for two windows after it frees), also when
            # this process skips the board's entries, as behind a sticky balancer
            bid = self._b.board_id(e.key, rule)
            b = self._board
            if b.get(bid, 0) < e.reset_at:
                b[bid] = e.reset_at
                b.move_to_end(bid)
                if len(b) > self.max_keys:
                    b.popitem(last=False)

    def _hold(self, rule: Rule, now: int, retry_us: int) -> int:
        """How long this process keeps a denial: ``max(retry_after, deny_hold)``, but for
        the sliding window counter, whose capacity frees continuously, no more than half
        the time left in the window (what frees late in a window is taken in it)."""
        hold = self._hold_us
        if rule.algorithm == "sliding_window_counter":
            w = rule._algo.W
            hold = min(hold, (w - now % w) // 2)
        elif rule.algorithm == "fixed_window":  # a new window is a new quota
            w = rule._algo.W
            hold = min(hold, w - now % w)
        return max(retry_us, hold)

    def _recovering(self, rule: Rule, now: int) -> bool:
        """True in the window of the backend's return, for a window algorithm: checks stay
        on the outage share (see _fold)."""
        if not self._recovered_at or rule.algorithm not in _WINDOWS:
            return False
        w = rule._algo.W
        return now // w == self._recovered_at // w

    def _mark(self, e: _Entry) -> None:
        """Put ``e`` in the list of entries the next round looks at (lock held)."""
        if not e.dirty:
            e.dirty = True
            self._dirty.append(e)

    def _entry(self, key: str, rule: Rule, now: int) -> _Entry:
        k = (rule._id, key)
        e = self._entries.get(k)
        if e is None:
            if len(self._entries) >= self.max_keys:
                self._entries.popitem(last=False)
            e = self._entries[k] = _Entry(key, rule, now)
        return e

    # -- the cold allowance ----------------------------------------------------------------
    def _cold(self, key: str, rule: Rule, cost: int, now: int,
              e: _Entry | None) -> Decision | None:
        """A check of a key this process holds no lease for: denied when the board says
        the key is exhausted, admitted on the allowance (charged at the next round), or
        None: ask the backend (lock held)."""
        board = self._board
        if board:
            bid = self._b.board_id(key, rule)
            until = board.get(bid)
            if until is not None:
                if now < until:
                    if e is None or e.remaining > 0 or (e.expires and now >= e.expires):
                        # news: not a key whose exhaustion its own last reply said
                        self._board_hits += 1
                        self._board_misses = 0
                    # exhausted on the backend: denied here until it frees, also when this
                    # process leases the key (its lease cannot cover the check: the backend
                    # would deny the lease it would ask for)
                    e = self._entry(key, rule, now)
                    held = e.lease if (e.expires == 0 or now < e.expires) else 0
                    e.denied_until = until
                    e.denied_cost = held + 1
                    e.demand += cost
                    self._mark(e)
                    self._denials_cached += 1
                    return _new(Decision, (False, rule._algo.B, 0, (until - now) / 1e6,
                                           (until - now) / 1e6, rule, False))
                if now < until + _CONTENDED_WINDOWS * rule._algo.W:
                    return None  # contended: exact, no allowance
                del board[bid]
        if e is not None and ((e.lease > 0 and (e.expires == 0 or now < e.expires))
                              or (e.rate > 0 and now - e.synced_at
                                  <= 2 * self._interval_us(now))):
            return None  # a key this process leases (busy in its last rounds): exact
        win = now // rule._algo.W
        if e is None:
            e = self._entry(key, rule, now)
        if e.awin != win:
            e.awin = win
            e.aused = 0
        if e.aused + cost > self._allow:
            return None
        e.aused += cost
        if e.owin != win and rule.algorithm in _WINDOWS:
            e.owed = 0  # (a window that ended without a round: nothing left to charge)
        e.owed += cost
        e.owin = win
        e.demand += cost
        self._mark(e)
        self._local_decisions += 1
        self._cold_admitted += 1
        w = rule._algo.W
        reset = w - now % w if rule.algorithm == "fixed_window" else 0
        return _new(Decision, (True, rule._algo.B, max(0, e.remaining - e.owed), reset / 1e6,
                               0.0, rule, False))

    # -- degraded: the shares held -------------------------------------------------------
    @staticmethod
    def _part(mine: int, taken: int, capacity: int) -> float | None:
        """This process's part of what the fleet took from a window's counter, when the
        fleet took enough of it (a quarter of the capacity) to say."""
        if taken <= 0 or 4 * taken < capacity:
            return None
        return min(1.0, mine / taken)

    def _share_of(self, e: _Entry | None) -> float:
        """This process's share of a key's limit while the backend is unreachable: for
        the window algorithms, its part of the fleet's demand at the last successful
        sync (what it took of what the fleet took from the key's counter in the last
        whole window it leased in),
        with a floor of a twentieth of an equal share (the parts sum to the limit);
        otherwise, and with no history of the key, an equal share of the processes seen
        at the last sync rounds."""
        if self.outage_share is not None:
            return self.outage_share
        peers = max(1, self._peers if self._peers < 1 << 30 else 1)
        # the last whole window's part only: within a window, each process measures at
        # its own last reply, and early ones see a larger part than they hold
        if e is not None and e.rule.algorithm in _WINDOWS and e.share >= 0:
            floor = 1.0 / (20 * peers)
            return floor + (1.0 - peers * floor) * e.share
        return 1.0 / peers

    def _outage_rule(self, rule: Rule, share: float) -> Rule:
        """``rule`` with its limit (and burst) cut to ``share`` of it, rounded down."""
        limit = max(1, math.floor(rule.limit * share))
        r = self._outage_rules.get((rule._id, limit))
        if r is None:
            burst = (max(1, math.floor(rule.capacity * share)) if rule.burst is not None
                     else None)
            r = Rule(limit, rule.window, rule.algorithm, burst, rule.name)
            if len(self._outage_rules) > 4096:
                self._outage_rules.clear()
            self._outage_rules[(rule._id, limit)] = r
        return r

    def _degraded_hit(self, key: str, rule: Rule, cost: int, consume: bool = True) -> Decision:
        now = self._now()
        with self._lock:
            e = self._entry(key, rule, now)
            if consume:
                e.demand += cost
                self._mark(e)
            if e.lease >= cost and (e.expires == 0 or now < e.expires):
                if consume:
                    e.lease -= cost
                    e.used += cost
                return _new(Decision, (True, rule._algo.B, e.lease, 0.0, 0.0, rule, True))
            if e.dentry is None:
                # the share is fixed for as long as the local state lives: the process
                # count read from a backend just back (and empty) may be low for a while
                e.dshare = self._share_of(e)
            local = self._outage_rule(rule, e.dshare)
            algo = local._algo
            if e.dentry is None:
                e.dentry = algo.fresh()
                taken = 0
                if rule.algorithm in _WINDOWS and e.granted and e.expires and now < e.expires:
                    taken = e.granted  # what it took in this window counts against its share
                direct = self._direct_used.get((rule._id, key))
                if direct is not None and direct[0] == now // rule._algo.W:
                    taken += direct[1]  # and what its direct checks admitted in it (hot_rate)
                if taken:
                    # one charge, capped at the share: two that together exceed it would
                    # each be checked against it, and the second refused, not counted
                    algo.apply(e.dentry, now, min(taken, algo.B), True)
            c = min(cost, algo.B)
            v = algo.apply(e.dentry, now, c, consume)
            if v[0] and consume:
                win = _window_of(rule, now)
                if win != e.dwindow:
                    e.dused = 0
                    e.dwindow = win
                e.dused += cost
            self._degraded_decisions += 1
        return _new(Decision, (v[0], rule._algo.B, v[1], v[2] / 1e6, v[3] / 1e6, rule, True))

    # -- the direct path: cold keys, sliding_window_log -----------------------------------
    def _denied_cached(self, k: tuple[str, str], rule: Rule, cost: int,
                       now: int) -> Decision | None:
        hit = self._denied.get(k)
        if hit is not None:
            until, c = hit
            if until > now and cost >= c:
                self._denials_cached += 1
                return _new(Decision, (False, rule._algo.B, 0, (until - now) / 1e6,
                                       (until - now) / 1e6, rule, False))
            del self._denied[k]
        return None

    def _count_direct(self, k: tuple[str, str], rule: Rule, cost: int, now: int) -> None:
        """What the direct path admitted in the current window of a window algorithm:
        it counts against this process's share if the backend goes down (bounded)."""
        win = now // rule._algo.W
        with self._lock:
            used = self._direct_used.get(k)
            if used is None or used[0] != win:
                if len(self._direct_used) >= self.max_keys:
                    self._direct_used.popitem(last=False)
                used = self._direct_used[k] = [win, 0]
            used[1] += cost

    def _remember(self, k: tuple[str, str], d: Decision, cost: int, sent: int) -> None:
        if not d[0] and d[4] > 0:
            with self._lock:
                if len(self._denied) >= self.max_keys:
                    self._denied.popitem(last=False)
                self._denied[k] = (sent + round(d[4] * 1e6), cost)

    def _direct(self, key: str, rule: Rule, cost: int, now: int) -> Decision:
        k = (rule._id, key)
        with self._lock:
            d = self._denied_cached(k, rule, cost, now)
        if d is not None:
            return d
        if self._degraded:
            return self._degraded_hit(key, rule, cost)
        self._direct_checks += 1
        try:
            if self.shards > 1 and rule.algorithm in _LOCAL:
                g = self._lease(key, rule, cost, cost)
                d = _new(Decision, (g[0] > 0, rule._algo.B, g[1], g[2] / 1e6, g[3] / 1e6,
                                    rule, False))
            else:
                self._b._trips += 1
                self._b.direct += 1  # one standalone script run
                self._b.ops += 1
                d = self.backend.hit(key, rule, cost)
        except StorageError as exc:
            self._set_degraded(True, str(exc))
            return self._degraded_hit(key, rule, cost)
        self._remember(k, d, cost, now)
        if d[0] and rule.algorithm in _WINDOWS:
            self._count_direct(k, rule, cost, now)
        return d

    async def _adirect(self, key: str, rule: Rule, cost: int, now: int) -> Decision:
        k = (rule._id, key)
        with self._lock:
            d = self._denied_cached(k, rule, cost, now)
        if d is not None:
            return d
        if self._degraded:
            return self._degraded_hit(key, rule, cost)
        self._direct_checks += 1
        try:
            if self.shards > 1 and rule.algorithm in _LOCAL:
                g = await self._alease(key, rule, cost, cost)
                d = _new(Decision, (g[0] > 0, rule._algo.B, g[1], g[2] / 1e6, g[3] / 1e6,
                                    rule, False))
            else:
                self._b._trips += 1
                self._b.direct += 1  # one standalone script run
                self._b.ops += 1
                d = await self.backend.ahit(key, rule, cost)
        except StorageError as exc:
            self._set_degraded(True, str(exc))
            return self._degraded_hit(key, rule, cost)
        self._remember(k, d, cost, now)
        if d[0] and rule.algorithm in _WINDOWS:
            self._count_direct(k, rule, cost, now)
        return d

    # -- the Store API -------------------------------------------------------------------
    def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        # the hot path: _check, _local_kind and _fast inlined (each call costs ~0.1 us)
        if type(key) is not str:
            raise key_error(key)
        if type(rule) is not Rule and not isinstance(rule, Rule):
            raise ConfigError("rule", rule, "must be a stormguard.Rule")
        if type(cost) is not int or cost != 1:
            cost = check_cost(rule, cost)
        now = self._wall_ns() // 1000
        if self._no_sync_yet:
            self._start_thread()
        if rule.algorithm not in _LOCAL or (self._hot is not None
                                             and not self._hot.check(key, now)):
            return self._direct(key, rule, cost, now)
        local = False
        self._acquire()
        try:
            e = self._get((rule._id, key))
            if e is not None:
                if e.rule is not rule and e.rule != rule:
                    self._rule_changed(e, rule)
                e.demand += cost
                if not e.dirty:
                    e.dirty = True
                    self._dirty.append(e)
                if e.denied_until > now and cost >= e.denied_cost:
                    self._denials_cached += 1
                    reset = e.reset_at - now
                    return _new(Decision, (False, rule._algo.B, 0,
                                           reset / 1e6 if reset > 0 else 0.0,
                                           (e.denied_until - now) / 1e6, rule, False))
                if e.lease >= cost and (e.expires == 0 or now < e.expires):
                    e.lease -= cost
                    e.used += cost
                    self._local_decisions += 1
                    reset = e.reset_at - now
                    return _new(Decision, (True, rule._algo.B, e.lease + e.remaining,
                                           reset / 1e6 if reset > 0 else 0.0, 0.0, rule,
                                           False))
                e.demand -= cost  # counted again when the reply is folded in
            local = self._recovered_at != 0 and self._recovering(rule, now)
            if self._allow and not local and not self._degraded:
                d = self._cold(key, rule, cost, now, e)
                if d is not None:
                    return d
                e = self._get((rule._id, key))
            want = self._want(e, now, cost) if e is not None else cost
        finally:
            self._release()
        if self._degraded or local:
            return self._degraded_hit(key, rule, cost)
        try:
            g = self._lease(key, rule, want, cost)
        except StorageError as exc:
            self._set_degraded(True, str(exc))
            return self._degraded_hit(key, rule, cost)
        return self._apply(key, rule, cost, now, g)

    async def ahit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        cost = self._check(key, rule, cost)
        now = self._wall_ns() // 1000
        if self._task is None and self.sync_interval is not None and self._thread is None:
            self._start_task()
        if not self._local_kind(key, rule, now):
            return await self._adirect(key, rule, cost, now)
        with self._lock:
            d = self._fast(key, rule, cost, now)
            if d is not None:
                return d
            local = self._recovered_at != 0 and self._recovering(rule, now)
            if self._allow and not local and not self._degraded:
                d = self._cold(key, rule, cost, now, self._entries.get((rule._id, key)))
                if d is not None:
                    return d
            e = self._entries.get((rule._id, key))
            want = self._want(e, now, cost) if e is not None else cost
        if self._degraded or local:
            return self._degraded_hit(key, rule, cost)
        try:
            g = await self._alease(key, rule, want, cost)
        except StorageError as exc:
            self._set_degraded(True, str(exc))
            return self._degraded_hit(key, rule, cost)
        return self._apply(key, rule, cost, now, g)

    def _peek_here(self, key: str, rule: Rule, cost: int) -> Decision | None:
        """A peek answered without the backend: a remembered denial, a lease that covers
        ``cost``, or the degraded view; None when the backend must be read."""
        now = self._now()
        with self._lock:
            e = self._entries.get((rule._id, key))
            if e is not None:
                if e.denied_until > now and cost >= e.denied_cost:
                    return _new(Decision, (False, rule._algo.B, 0, 0.0,
                                           (e.denied_until - now) / 1e6, rule, False))
                if e.lease >= cost and (e.expires == 0 or now < e.expires):
                    return _new(Decision, (True, rule._algo.B, e.lease + e.remaining, 0.0, 0.0,
                                           rule, False))
        if self._degraded:
            return self._degraded_hit(key, rule, cost, consume=False)
        return None

    def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        cost = self._check(key, rule, cost)
        d = self._peek_here(key, rule, cost)
        if d is not None:
            return d
        if self.shards > 1 and rule.algorithm in _LOCAL:
            return self._shards_view(key, rule, cost,
                                     self._b.lease_many(self._shard_reads(key, rule)))
        bkey, brule = self._backend_key(key, rule)
        try:
            self._b._trips += 1
            self._b.direct += 1  # one standalone script run
            self._b.ops += 1
            return self.backend.peek(bkey, brule, cost).replace(rule=rule)
        except StorageError as exc:
            self._set_degraded(True, str(exc))
            return self._degraded_hit(key, rule, cost, consume=False)

    def _shard_reads(self, key: str, rule: Rule) -> list[LeaseRequest]:
        """A read of every shard of ``key`` (one batch: one round trip per node)."""
        return [(f"{key}\x00{i}", self._shard_rule(rule, i), 0, 0) for i in range(self.shards)]

    def _shards_view(self, key: str, rule: Rule, cost: int,
                     grants: list[Grant | StorageError]) -> Decision:
        """A sharded key's view from the reads of its shards: the sum of what they have
        left; allowed when one shard can take ``cost``."""
        errors = [g for g in grants if isinstance(g, StorageError)]
        if errors:
            self._set_degraded(True, str(errors[0]))
            return self._degraded_hit(key, rule, cost, consume=False)
        left = sum(g[1] for g in grants if not isinstance(g, StorageError))
        fits = any(g[1] >= cost for g in grants if not isinstance(g, StorageError))
        return _new(Decision, (fits, rule._algo.B, left, 0.0, 0.0, rule, False))

    def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        if type(key) is not str:
            raise key_error(key)
        if type(cost) is not int:
            cost = validate.integer("cost", cost)
        rules = check_rules(rules, cost)
        if len(rules) == 1:
            return self.hit(key, rules[0], cost)
        now = self._now()
        if self.shards > 1 or not all(self._local_kind(key, r, now) for r in rules):
            if self._degraded:
                return self._degraded_all(key, rules, cost)
            try:
                self._b._trips += 1
                self._b.direct += 1  # one standalone script run
                self._b.ops += 1
                self._direct_checks += 1
                return self.backend.hit_all(key, rules, cost)
            except StorageError as exc:
                self._set_degraded(True, str(exc))
                return self._degraded_all(key, rules, cost)
        # every rule must hold a lease covering the cost; ask for the ones that do not
        for _ in range(2):
            with self._lock:
                short = []
                for r in rules:
                    e = self._entries.get((r._id, key))
                    if e is not None and e.denied_until > now and cost >= e.denied_cost:
                        return _new(Decision, (False, r._algo.B, 0, 0.0,
                                               (e.denied_until - now) / 1e6, r, False))
                    if e is None or e.lease < cost or (e.expires and now >= e.expires):
                        short.append((r, self._want(e, now, cost) if e else cost))
                if not short:
                    decisions = []
                    for r in rules:
                        e = self._entries[(r._id, key)]
                        e.lease -= cost
                        e.used += cost
                        e.demand += cost
                        self._mark(e)
                        decisions.append(_new(Decision, (True, r._algo.B, e.lease + e.remaining,
                                                         0.0, 0.0, r, False)))
                    self._local_decisions += 1
                    return binding(decisions)
            if self._degraded:
                return self._degraded_all(key, rules, cost)
            for r, want in short:
                try:
                    g = self._lease(key, r, want, cost)
                except StorageError as exc:
                    self._set_degraded(True, str(exc))
                    return self._degraded_all(key, rules, cost)
                with self._lock:
                    e = self._entry(key, r, now)
                    self._credit(e, g, now)
                    if g[0] < cost and e.lease < cost:
                        e.denied_until = now + self._hold(e.rule, now, g[3])
                        e.denied_cost = cost
                        return _new(Decision, (False, r._algo.B, g[1], g[2] / 1e6,
                                               g[3] / 1e6, r, False))
            now = self._now()
        return _new(Decision, (False, rules[0]._algo.B, 0, 0.0, 0.0, rules[0], False))

    def _degraded_all(self, key: str, rules: Sequence[Rule], cost: int) -> Decision:
        peeks = [self._degraded_hit(key, r, cost, consume=False) for r in rules]
        if not all(d[0] for d in peeks):
            return binding([d if not d[0] else d.replace(allowed=False) for d in peeks])
        return binding([self._degraded_hit(key, r, cost) for r in rules])

    def reserve(self, key: str, rule: Rule, cost: int = 1, *, max_wait: float | None = None,
                book: bool = True) -> Reservation:
        """Passed to the backend (reservations are exact there; the leases held by the
        processes are already taken from the same counter)."""
        bkey, brule = self._backend_key(key, rule)
        self._b._trips += 1
        self._b.direct += 1  # one standalone script run
        self._b.ops += 1
        return self.backend.reserve(bkey, brule, cost, max_wait=max_wait, book=book)

    def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        """Reset the backend counters and this process's entries (other processes keep
        the leases they hold until they spend them or their window ends)."""
        if type(key) is not str:
            raise key_error(key)
        rules = (rule,) if isinstance(rule, Rule) else tuple(rule)
        with self._lock:
            for r in rules:
                self._entries.pop((r._id, key), None)
                self._denied.pop((r._id, key), None)
        for r in rules:
            self._b._trips += 1
            self._b.direct += 1  # one standalone script run
            self._b.ops += 1
            if self.shards == 1 or r.algorithm not in _LOCAL:
                self.backend.reset(key, r)
            else:
                for i in range(self.shards):
                    self.backend.reset(f"{key}\x00{i}", self._shard_rule(r, i))

    def ping(self) -> bool:
        return self.backend.ping()

    # -- asyncio twins of the slow paths (ahit is above) ---------------------------------
    async def apeek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        cost = self._check(key, rule, cost)
        d = self._peek_here(key, rule, cost)
        if d is not None:
            return d
        if self.shards > 1 and rule.algorithm in _LOCAL:
            return self._shards_view(key, rule, cost,
                                     await self._b.alease_many(self._shard_reads(key, rule)))
        bkey, brule = self._backend_key(key, rule)
        try:
            self._b._trips += 1
            self._b.direct += 1  # one standalone script run
            self._b.ops += 1
            return (await self.backend.apeek(bkey, brule, cost)).replace(rule=rule)
        except StorageError as exc:
            self._set_degraded(True, str(exc))
            return self._degraded_hit(key, rule, cost, consume=False)

    async def ahit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        # the blocking flow in a worker thread (the store is thread-safe): its leases may
        # wait for the backend, which must not block the event loop
        return await asyncio.to_thread(self.hit_all, key, rules, cost)

    async def areserve(self, key: str, rule: Rule, cost: int = 1, *,
                       max_wait: float | None = None, book: bool = True) -> Reservation:
        bkey, brule = self._backend_key(key, rule)
        self._b._trips += 1
        self._b.direct += 1  # one standalone script run
        self._b.ops += 1
        return await self.backend.areserve(bkey, brule, cost, max_wait=max_wait, book=book)

    async def areset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        await asyncio.to_thread(self.reset, key, rule)

    async def aping(self) -> bool:
        return await self.backend.aping()

    # -- sync rounds ---------------------------------------------------------------------
    def _plan(self, now: int) -> tuple[list[_Entry | None], list[LeaseRequest]]:
        """The leases of one round (lock held): for every key in use, what its demand
        needs until the next round; while degraded, the admissions to charge."""
        interval_us = self._interval_us(now)
        entries: list[_Entry | None] = []
        requests: list[LeaseRequest] = []
        if not self._degraded:
            # count this process in once per peer window; read the count every round
            win = now // self._peer_rule._algo.W
            entries.append(None)
            requests.append((self._peer_key, self._peer_rule,
                             1 if win != self._peer_win else 0, 0))
            if win != self._peer_win:
                # the count of the last whole window; after a gap (an outage) the last one
                # seen: the count of a window just begun is only those counted so far
                if self._peer_win == win - 1 or self._peers_last == 0:
                    self._peers_last = self._peer_count
                self._peer_win = win
                self._peer_count = 0
        # only the entries checked since the last round (the dirty list), not every entry
        dirty, self._dirty = self._dirty, []
        live = self._entries
        for e in dirty:
            rule = e.rule
            if live.get((rule._id, e.key)) is not e:
                e.dirty = False  # evicted meanwhile
                continue
            if self._degraded:
                if e.dused > 0 and _window_of(rule, now) == e.dwindow:
                    bkey, brule = self._backend_key(e.key, rule)
                    entries.append(e)
                    requests.append((bkey, brule, min(e.dused, brule._algo.B), 0))
                self._dirty.append(e)  # still dirty: charged when the backend is back
                continue
            e.dirty = False
            if e.dused > 0:  # admitted on the outage share: charge it (a lease with min 0)
                if _window_of(rule, now) == e.dwindow:
                    bkey, brule = self._backend_key(e.key, rule)
                    entries.append(e)
                    requests.append((bkey, brule, min(e.dused, brule._algo.B), 0))
                else:
                    e.dused = 0  # that window is over
            if e.owed > 0:  # admitted on the cold allowance: charged in this round
                self._owe(e, now, entries, requests)
            if self._recovering(rule, now):
                continue  # still on its outage share: no lease this window
            e.dentry = None
            need = self._topup(e, now, interval_us)
            if need <= 0:
                continue
            bkey, brule = self._backend_key(e.key, rule)
            entries.append(e)
            requests.append((bkey, brule, min(need, brule._algo.B), 1))
        self._rounds += 1
        if self._rounds % _SWEEP_ROUNDS == 0:  # now and then, forget the idle entries
            self._sweep(now, _SWEEP_ROUNDS * interval_us)
        return entries, requests

    def _sweep(self, now: int, idle: int) -> None:
        live = self._entries
        drop = [k for k, e in live.items()
                if not e.dirty and e.dused == 0 and e.denied_until <= now
                and e.dentry is None and now - e.synced_at > idle]
        for k in drop:
            self._voided += live.pop(k).lease

    def _owe(self, e: _Entry, now: int, entries: list[_Entry | None],
             requests: list[LeaseRequest]) -> None:
        """Charge what ``e`` admitted on the cold allowance: a forced add in the round."""
        rule = e.rule
        if rule.algorithm not in _WINDOWS or _window_of(rule, now) == e.owin:
            bkey, brule = self._backend_key(e.key, rule)
            entries.append(e)
            requests.append((bkey, brule, min(e.owed, brule._algo.B),
                             e.omode))
        e.owed = 0
        e.omode = FORCED

    def _topup(self, e: _Entry, now: int, interval_us: int) -> int:
        """Close the entry's round (its demand becomes its rate); the units its lease
        lacks for the next round (lock held)."""
        elapsed = max(1, now - e.synced_at)
        busy = e.demand >= 2  # one check in a round says nothing of the next round
        rate = e.demand / elapsed if busy else 0.0  # units per microsecond
        if not busy and elapsed > interval_us * 3 // 2:
            # unchecked for a whole round or more, and not busy now: cold again (a rate
            # halved at each rare check would never reach 0, and keep the key off the
            # allowance: a lease on the request path for each of its checks)
            e.rate = 0.0
        else:
            e.rate = rate if e.rate == 0 else 0.5 * (e.rate + rate)
        e.used = 0
        e.demand = 0
        e.synced_at = now
        if not busy or e.denied_until > now:
            return 0
        lease = e.lease if (e.expires == 0 or now < e.expires) else 0
        # until the next round, and half a round more: a steady key's lease outlasts
        # the round's jitter instead of running out just before it (rounds that come
        # late, on a loaded machine, count as long as they took)
        horizon = max(interval_us, elapsed) * 3 // 2
        rule = e.rule
        if rule.algorithm in _WINDOWS:
            # a window's lease is void at its end: no more than the demand until then
            w = rule._algo.W
            horizon = min(horizon, w - now % w)
        return min(int(e.rate * horizon), self._share(e, now, interval_us)) - lease

    def sync(self) -> dict[str, Any]:
        """One sync round now (one round trip per backend node); the stats of the round."""
        with self._sync_lock:
            start = self.clock.monotonic()
            now = self._now()
            with self._lock:
                was_degraded = self._degraded
                entries, requests = self._plan(now)
                self._last_sync = now
            trips = self._b.round_trips
            board: BoardRead = None
            if requests and not (was_degraded and len(requests) == 0):
                grants, board = self._b.sync_many(requests, self._since(), self._board_cap())
            elif was_degraded:
                grants = []
                if not self._probe():
                    return self._round(0, 0, 0, 0, start)
            else:
                return self._round(0, 0, 0, 0, start)
            return self._fold(entries, requests, grants, now, was_degraded, trips, start,
                              board)

    def _board_cap(self) -> int:
        """The board entries this round reads at most: ``board_size``, or 0 (posts only)
        when none of this process's checks found its key on the board since its last
        read, it has read ``_BOARD_IDLE`` entries since one did, and its last read is
        less than ``_BOARD_EVERY`` rounds old (a process whose keys no other process
        exhausts, as behind a sticky balancer, reads a fourth as much)."""
        read = (self._board_hits > 0 or self._board_misses < _BOARD_IDLE
                or self._board_unread >= _BOARD_EVERY - 1)
        self._board_reading = read
        if read:
            self._board_hits = self._board_unread = 0
            return self.board_size
        self._board_unread += 1
        return 0

    def _since(self) -> int | None:
        """The board's last sequence number read, when rounds read the board."""
        return self._board_seq if self._allow and self._b.has_board else None

    async def async_sync(self) -> dict[str, Any]:
        """:meth:`sync` on the running event loop."""
        start = self.clock.monotonic()
        now = self._now()
        with self._lock:
            was_degraded = self._degraded
            entries, requests = self._plan(now)
            self._last_sync = now
        trips = self._b.round_trips
        board: BoardRead = None
        if requests:
            grants, board = await self._b.async_sync_many(requests, self._since(),
                                                          self._board_cap())
        elif was_degraded:
            grants = []
            if not await self.backend.aping():
                return self._round(0, 0, 0, 0, start)
        else:
            return self._round(0, 0, 0, 0, start)
        return self._fold(entries, requests, grants, now, was_degraded, trips, start, board)

    def _probe(self) -> bool:
        try:
            return self.backend.ping()
        except StorageError:
            return False

    def _fold(self, entries: list[_Entry | None], requests: list[LeaseRequest],
              grants: list[Grant | StorageError], now: int, was_degraded: bool, trips: int,
              start: float, board: BoardRead = None) -> dict[str, Any]:
        failed = 0
        granted = 0
        error = ""
        with self._lock:
            if board is not None:
                self._read_board(board, now)
            for e, req, g in zip(entries, requests, grants, strict=True):
                if isinstance(g, StorageError):
                    failed += 1
                    error = str(g)
                    if e is not None and req[3] < 0:
                        e.owed += req[2]  # charged in a later round of the same window
                    continue
                if e is None:  # the peer count: this window's, or the last whole one's
                    self._peer_count = max(self._peer_count, self._peer_rule._algo.B - g[1])
                    self._peers = max(1, self._peer_count, self._peers_last)
                    continue
                if req[3] < 0:  # a charge of the cold allowance: where the key stands
                    knew = e.remaining <= 0 and e.expires != 0 and now < e.expires
                    self._credit(e, (0, g[1], g[2], 0, g[4]), now)
                    if g[3] > 0 and not knew:  # exhausted, news to it: read the board
                        self._board_hits += 1
                        self._board_misses = 0
                    if g[0] == 0:  # a native add found the key present: not charged yet,
                        e.owed += req[2]  # charged in the next round (see _charge_mode)
                        e.omode = self._charge_mode(req, g)
                        self._mark(e)
                    elif e.rule.algorithm in _WINDOWS:
                        e.granted += req[2]  # taken from the counter by this process
                    if g[3] > 0 and e.lease == 0:  # exhausted: denied here until it frees
                        # (a lease this process holds was taken already: spent first)
                        e.denied_until = max(e.denied_until, now + self._hold(e.rule, now,
                                                                              g[3]))
                        e.denied_cost = 1
                    continue
                if req[3] == 0:  # a charge of what was admitted on the outage share
                    e.dused = 0  # charged (as much as the counter could take)
                    e.remaining = g[1]
                    continue
                self._credit(e, g, now)
                granted += g[0]
                # (with shards, a spent home shard says nothing of the others)
                if g[0] == 0 and g[3] > 0 and e.lease == 0 and self.shards == 1:
                    e.denied_until = now + self._hold(e.rule, now, g[3])
                    e.denied_cost = 1
        if failed and failed == len(grants):
            self._set_degraded(True, error)
        elif was_degraded:
            # the others may still be on their shares, their admissions not charged yet:
            # the window algorithms stay on this process's share until their window ends,
            # so the fleet keeps within the limit in the window of the reconnection too
            self._recovered_at = now
            self._set_degraded(False, "")
        keys = sum(1 for e in entries if e is not None)
        self._keys_synced += keys
        return self._round(keys, granted, self._b.round_trips - trips, failed, start)

    def _charge_mode(self, req: LeaseRequest, g: Grant) -> int:
        """How to charge units a native add found present: natively (an APPEND) while
        the key keeps at least half its limit after them, else in the script. The script
        posts a key the units exhaust in that same round; an APPEND that exhausts it
        (the others' units landed first) is posted one round later, and the board
        reaching the others a round later is overshoot on a key over its limit
        (measured in the fleet simulation: docs/performance.md)."""
        if g[3] > 0 or 2 * g[1] < req[1]._algo.N:
            return FORCED_SCRIPT
        return FORCED_PRESENT

    def _read_board(self, board: tuple[int, list[tuple[int, str]]], now: int) -> None:
        """The board's entries since the last round: keys exhausted on the backend."""
        seq, items = board
        self._board_seq = seq
        if not self._board_reading:
            # a round that only posted: the entries posted since the last read are skipped
            # (none of this process's checks found news on the board for a while)
            return
        b = self._board
        for until, bid in items:
            if until > now:
                b[bid] = until
                b.move_to_end(bid)
        self._board_entries += len(items)
        self._board_misses += len(items)
        while len(b) > self.max_keys:
            b.popitem(last=False)

    def _round(self, keys: int, granted: int, trips: int, failed: int,
               start: float) -> dict[str, Any]:
        self._syncs += 1
        duration = self.clock.monotonic() - start
        if observed(self._listeners):
            emit(self._listeners, HybridSynced(self.name, self.clock.monotonic(), keys, granted,
                                               trips, failed, duration))
        return {"keys": keys, "granted": granted, "round_trips": trips, "failed": failed,
                "degraded": self._degraded, "duration": duration}

    # -- background sync -----------------------------------------------------------------
    def _start_thread(self) -> None:
        with self._sync_lock:
            self._no_sync_yet = False
            if self._thread is not None or self._task is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name=f"{self.name}-sync",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        interval = self.sync_interval or 0.1
        wait = 0.0  # a first round at once: it counts the processes, leases follow
        while not self._stop.wait(wait):  # real time: the sync thread's period
            wait = interval
            try:
                self.sync()
            except Exception:  # the sync thread must outlive any bug
                import logging

                logging.getLogger("stormguard").exception("hybrid sync round failed")

    def _start_task(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._closed:
            return
        self._no_sync_yet = False
        self._task = loop.create_task(self._arun())

    async def _arun(self) -> None:
        interval = self.sync_interval or 0.1
        wait = 0.0  # a first round at once: it counts the processes, leases follow
        while True:
            await asyncio.sleep(wait)
            wait = interval
            try:
                await self.async_sync()
            except Exception:  # the sync task must outlive any bug
                import logging

                logging.getLogger("stormguard").exception("hybrid sync round failed")

    # -- stats and lifecycle -------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters since the store was built."""
        with self._lock:
            local_keys = len(self._entries)
            held = sum(e.lease for e in self._entries.values())
        return {
            "local_decisions": self._local_decisions,
            "backend_round_trips": self._b.round_trips,
            "backend_ops": self._b.ops,
            "keys_synced": self._keys_synced,
            "syncs": self._syncs,
            "degraded": self._degraded,
            "direct_checks": self._direct_checks,
            "denials_cached": self._denials_cached,
            "degraded_decisions": self._degraded_decisions,
            "lease_voided": self._voided,
            "lease_held": held,
            "local_keys": local_keys,
            "peers": self._peers if self._peers < 1 << 30 else None,
            "hot_keys": len(self._hot.hot) if self._hot is not None else None,
            "cold_admitted": self._cold_admitted,
            "board_entries": self._board_entries,
            "board_keys": len(self._board),
        }

    def close(self) -> None:
        self._closed = True
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)
        if self._task is not None:
            self._task.cancel()
        if self._owns:
            self.backend.close()

    async def aclose(self) -> None:
        self._closed = True
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        t = self._thread
        if t is not None:
            t.join(timeout=5)
        if self._owns:
            await self.backend.aclose()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return (f"HybridStore({self.backend!r}, sync_interval={self.sync_interval}, "
                f"hot_rate={self.hot_rate}, shards={self.shards})")
