"""`RegionalStore`: each region enforces its share of a global limit, in its own store.

Checks touch only this region's store, with the limit scaled to the region's share of
the global limit. The shares move with demand: every ``sync_interval`` the region
publishes what it saw per active key (offered, admitted, denied) to the board of every
peer region's store (one batched write per peer, a heartbeat when idle) and recomputes
the shares by water-filling from the latest reports (:mod:`.shares`). A scaled rule is a
copy of the rule with the same storage identity (the same counters), so moving a share
in the middle of a window carries what the region already admitted.

Every report also carries the sender's *claims* (the most it may enforce per key) and
acknowledges the peers' reports it read. A region holds itself to ``1 - its peers'
claims`` and raises only up to the least claim its reports carried since the newest one
every peer has acknowledged, so the shares in force never sum to more than 1. While a
raise is pending, every region takes a half step between its regular syncs
(:meth:`RegionalStore.half_sync`), so a raise lands within three sync intervals of a
demand shift in any alignment of the syncs.

Failure behaviour: a check never waits on a peer; ``sync()`` never raises (failures are
counted in :meth:`RegionalStore.stats` and reported as :class:`.SyncFailed` events);
while a peer is silent nobody raises, and a peer silent for longer than ``lease``
counts at its last claim; a region that hears from nobody enforces the smaller of its
last share and its static weight.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from stormguard._core import validate
from stormguard._core.clock import Clock, system_clock
from stormguard._core.errors import ConfigError
from stormguard.observability.events import Listener, emit, observed
from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.reservation import Reservation
from stormguard.ratelimit.rule import Rule
from stormguard.stores.base import Store, check_cost, check_rules, key_error
from stormguard.stores.regional.board import Board, MemoryBoard, board_for
from stormguard.stores.regional.events import PeerLost, PeerRecovered, ShareChanged, SyncFailed
from stormguard.stores.regional.shares import enforced_share, local_limit, plan_shares

__all__ = ["RegionalStore"]

_log = logging.getLogger("stormguard")

_PUBLISHED = 16  # the claims kept per key for the grant rule (see _plan_key)

# the token bucket keeps what is *left* and GCRA a time scaled by the limit: neither
# carries what was admitted across a change of the limit. The leaky bucket (as a meter)
# admits exactly the same requests and keeps what was *spent*: under demand shares the
# two are enforced as the leaky bucket, under a storage identity of its own.
_AS_LEAKY = ("token_bucket", "gcra")

# a raise pending by more than this (a fraction of the limit) hurries the syncs: the
# claimant and its peers sync again half-way to their next regular sync, so the claim is
# read and acknowledged, and the acknowledgement read, in half the time. Smaller moves
# (the noise of steady demand: a 0.2 share measured over 10 requests moves by 0.02) wait
# for the next regular sync.
HURRY = 0.05
# a region keeps its share when the computed one is less than this (a fraction of the
# limit) below it: the demand of a small region measured over one interval moves by a
# request or two (0.2 of a limit of 100 over half a second is 10 requests), and a cut
# applies at once while the raise back waits for acknowledgements, so without it every
# dip of the measure denies that region's users. A cut of more applies at once (a
# demand shift); the global total stays within the limit either way (the region's claim
# does not move), at most this much per region stays unused.
HOLD = 0.03


@dataclass(slots=True)
class _Entry:
    """One (rule, key): the shares this region last computed and the one it enforces."""

    shares: dict[str, float]
    computed: float
    enforced: float
    rule: Rule | None = None
    local: Rule | None = None
    active: float = 0.0  # monotonic time of the last demand anyone reported
    # the claim of this region's latest report: the most it may enforce (the larger of
    # the enforced share and the one it wants): peers hold themselves to 1 - the others'
    # claims
    claim: float = 0.0
    # the claims this region's reports carried for the key: (seq, claim), each from the
    # report `seq` until the next item's, kept from the newest report every peer has
    # read on. Every peer holds itself to one of them, so this region may enforce up
    # to their minimum at once (see _plan_key). Before the entry existed its reports
    # claimed the static weight (a key left out of a report is claimed at the weight)
    published: list[tuple[int, float]] = field(default_factory=list)


def _check_regions(stores: object) -> dict[str, Any]:
    if not isinstance(stores, Mapping) or not stores:
        raise ConfigError("stores", stores, "must be a non-empty mapping of region name to "
                          "a store URL or a Store")
    for name, target in stores.items():
        validate.text("stores", name)
        if not isinstance(target, str | Store):
            raise ConfigError("stores", target, f"region {name!r}: must be a URL string or a "
                              "stormguard Store")
    return dict(stores)


def _local_store(own: str | Store, options: dict[str, Any], split: str) -> Store:
    if isinstance(own, str):
        from stormguard.stores import from_url

        own = from_url(own, **options)
    if split == "demand" and getattr(own, "shards", 1) != 1:
        # a sharded HybridStore splits each rule into per-shard rules whose counters are
        # named by their own limits: a moving share would restart them
        raise ConfigError("stores", own, "a HybridStore with shards > 1 cannot follow "
                          "demand shares (its shard counters are named by their limits); "
                          "use shards=1 or split='static'")
    return own


class RegionalStore(Store):
    """Per-region shares of a global limit (see the module docstring and docs/regions.md).

    * ``region``: this region's name, a key of ``stores``; ``stores``: every region's
      store, a URL or a :class:`Store` (this region's is the one checks use; the peers'
      are only written to, by ``sync``).
    * ``split``: ``"demand"`` (shares follow demand) or ``"static"`` (each region enforces
      ``limit x weights[region]``, no sync at all).
    * ``weights``: the static shares (equal by default); with ``"demand"`` they are the
      shares of a key nobody has reported yet and the ceiling of an isolated region.
    * ``sync_interval``: seconds between background syncs (``None``: no thread, call
      :meth:`sync`); ``lease``: seconds after which a silent peer is stale;
      ``min_share``: the floor of every region's share; ``peer_timeout``: the timeout
      of the writes to peer regions (sized for cross-region links).
    * ``boards``: where each region's reports are left (default: derived from
      ``stores``: a Redis hash beside the counters, or in memory for a MemoryStore).
    * ``store_options``: options for building this region's store from its URL (with
      ``clock``); ``max_keys``: keys tracked per sync (beyond: the static weight);
      ``group``: separates sets of regions sharing servers; ``listeners``: events.
    """

    def __init__(self, *, region: str, stores: Mapping[str, str | Store],
                 split: str = "demand", weights: Mapping[str, float] | None = None,
                 sync_interval: float | None = 1.0, lease: float = 10.0,
                 min_share: float = 0.05, peer_timeout: float = 0.5,
                 clock: Clock | None = None, group: str = "default",
                 max_keys: int = 10_000, boards: Mapping[str, Board] | None = None,
                 store_options: Mapping[str, Any] | None = None,
                 listeners: Sequence[Listener] = ()) -> None:
        regions = _check_regions(stores)
        validate.text("region", region)
        if region not in regions:
            raise ConfigError("region", region, f"is not a key of stores {sorted(regions)}")
        validate.one_of("split", split, ("demand", "static"))
        self.region = region
        self.regions: tuple[str, ...] = tuple(regions)
        self.peers: tuple[str, ...] = tuple(r for r in self.regions if r != region)
        self.split = split
        self._check_options(weights, min_share, sync_interval, lease)
        self.peer_timeout = validate.number("peer_timeout", peer_timeout)
        self.max_keys = validate.integer("max_keys", max_keys)
        validate.text("group", group)
        self.group = group
        options = dict(store_options or {})
        if clock is not None:
            options.setdefault("clock", clock)
        own = _local_store(regions[region], options, split)
        self.local: Store = own
        self.clock: Clock = clock if clock is not None else getattr(own, "clock", system_clock)
        self._listeners: list[Listener] = list(listeners)
        self._policy = f"regional:{region}"
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._demand: dict[tuple[str, str], list[Any]] = {}
        self._table: dict[tuple[str, str], _Entry] = {}
        self._scaled: dict[tuple[str, int], Rule] = {}
        self._static: dict[str, Rule] = {}
        self._boards: dict[str, Board] = {}
        self._heard: dict[str, float] = {}
        self._peer_seq: dict[str, tuple[str, int]] = {}  # peer -> (its epoch, its seq)
        self._peer_demand: dict[str, dict[tuple[str, str], float]] = {}
        self._acks: dict[str, int] = {}  # peer -> the last seq of ours it had read
        self._peer_claim: dict[str, dict[tuple[str, str], float]] = {}
        self._peer_held: dict[str, dict[tuple[str, str], float]] = {}  # their enforced
        self._rank = {r: i for i, r in enumerate(sorted(self.regions))}
        self._lost: set[str] = set()
        self._peer_hurry: dict[str, bool] = {}  # peer -> its last report had a raise pending
        self._hurry = False  # a raise pending, here or at a fresh peer: sync again sooner
        self._lag = 0.0  # seconds the background syncs started after they were due
        self._seq = 0
        self._last_sync: float | None = None
        self._counts: dict[str, int] = {"syncs": 0, "sync_failures": 0, "read_failures": 0,
                                        "decode_failures": 0, "untracked": 0}
        self._publish_failures = dict.fromkeys(self.peers, 0)
        self._last_duration = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        if split == "demand":
            self._start(regions, own, boards)

    def _start(self, regions: Mapping[str, str | Store], own: Store,
               boards: Mapping[str, Board] | None) -> None:
        # this instance's reports: acknowledgements name it, so a restart that lost its
        # last report never takes the acknowledgements of the reports before it
        self._epoch = secrets.token_hex(8)
        self._open_boards(regions, own, boards)
        if len(self.peers) > 1 and not all(isinstance(self._boards[p], MemoryBoard)
                                           for p in self.peers):
            self._pool = ThreadPoolExecutor(len(self.peers),
                                            thread_name_prefix="stormguard-regional-peer")
        self._restore()
        if self.sync_interval is not None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"stormguard-regional-{self.region}")
            self._thread.start()

    def _open_boards(self, regions: Mapping[str, str | Store], own: Store,
                     boards: Mapping[str, Board] | None) -> None:
        given = dict(boards or {})
        for r in self.regions:
            board = given.get(r)
            if board is None:
                target = own if r == self.region else regions[r]
                board = board_for(target, group=self.group, timeout=self.peer_timeout)
            elif not isinstance(board, Board):
                raise ConfigError("boards", board, f"region {r!r}: must be a "
                                  "stormguard.stores.regional.Board")
            self._boards[r] = board

    def _check_options(self, weights: Mapping[str, float] | None, min_share: float,
                       sync_interval: float | None, lease: float) -> None:
        self.weights = self._check_weights(weights)
        self.min_share = validate.number("min_share", min_share, allow_zero=True,
                                         maximum=1.0 / len(self.regions))
        if self.split == "demand":
            low = [r for r, w in self.weights.items() if w < self.min_share - 1e-12]
            if low:
                raise ConfigError("weights", dict(self.weights), f"regions {low} weigh less "
                                  f"than min_share {self.min_share}")
        if sync_interval is not None:
            sync_interval = validate.number("sync_interval", sync_interval)
        self.sync_interval = sync_interval
        self.lease = validate.number("lease", lease)
        if sync_interval is not None and self.lease <= sync_interval:
            raise ConfigError("lease", lease, f"must be longer than sync_interval "
                              f"{sync_interval} (a peer would go stale between two syncs)")

    def _check_weights(self, weights: Mapping[str, float] | None) -> dict[str, float]:
        n = len(self.regions)
        if weights is None:
            return dict.fromkeys(self.regions, 1.0 / n)
        if not isinstance(weights, Mapping) or set(weights) != set(self.regions):
            raise ConfigError("weights", weights, f"must give a weight to each region "
                              f"{sorted(self.regions)} and no other")
        out = {r: validate.number("weights", weights[r]) for r in self.regions}
        if not math.isclose(sum(out.values()), 1.0, abs_tol=1e-6):
            raise ConfigError("weights", dict(weights), f"must sum to 1, sum to "
                              f"{sum(out.values()):g}")
        return out

    # -- the rules a region enforces --------------------------------------------------
    def _scale(self, rule: Rule, share: float) -> Rule:
        limit = local_limit(rule.limit, share)
        k = (rule._id, limit)
        scaled = self._scaled.get(k)
        if scaled is None:
            base = rule
            if self.split == "demand" and rule.algorithm in _AS_LEAKY:
                base = Rule(rule.limit, rule.window, "leaky_bucket",
                            rule.burst if rule.burst is not None else rule.limit, rule.name)
            scaled = base if limit == base.limit else base.with_limit(limit)
            if scaled is not base:
                # the same storage identity: the same counters under a smaller limit, so
                # a share change carries what was admitted (the stores key by rule._id)
                object.__setattr__(scaled, "_id", base._id)
            if len(self._scaled) > 65_536:
                self._scaled.clear()
            self._scaled[k] = scaled
        return scaled

    def _local_rule(self, key: str, rule: Rule) -> Rule:
        try:
            rid = rule._id
        except AttributeError:
            raise ConfigError("rule", rule, "must be a stormguard.Rule") from None
        entry = self._table.get((rid, key))
        if entry is not None:
            local = entry.local
            if local is None:
                # the first check of a key known only from the peers: build its rule. The
                # sync sets `enforced` before `local`; checking the share again after
                # the write keeps a concurrent sync's new share from being overwritten
                entry.rule = rule
                share = entry.enforced
                local = entry.local = self._scale(rule, share)
                if entry.enforced != share:
                    local = entry.local = self._scale(rule, entry.enforced)
            return local
        static = self._static.get(rid)
        if static is None:
            if not isinstance(rule, Rule):
                raise ConfigError("rule", rule, "must be a stormguard.Rule")
            static = self._static[rid] = self._scale(rule, self.weights[self.region])
        return static

    def local_rule(self, key: str, rule: Rule) -> Rule:
        """The rule this region enforces for ``key`` now: ``rule`` with its share of the
        limit (and of the burst), and the same counters."""
        if type(key) is not str:
            raise key_error(key)
        return self._local_rule(key, rule)

    def _record(self, key: str, rule: Rule, cost: int, allowed: bool) -> None:
        if self.split != "demand":
            return
        k = (rule._id, key)
        with self._lock:
            row = self._demand.get(k)
            if row is None:
                if len(self._demand) >= self.max_keys:
                    self._counts["untracked"] += 1
                    return
                row = self._demand[k] = [rule, 0, 0, 0]
            row[1] += cost
            if allowed:
                row[2] += cost
            else:
                row[3] += cost

    @staticmethod
    def _too_big(local: Rule) -> Decision:
        """A cost the global rule admits but this region's share cannot hold at once."""
        return Decision(False, local.capacity, 0, float(local.window), float(local.window),
                        local)

    # -- the Store contract: only the local store is touched -----------------------------
    def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        # the hot path: local_rule and _record inlined for the common case (a key with
        # its share built, cost 1)
        if type(key) is not str:
            raise key_error(key)
        try:
            k = (rule._id, key)
        except AttributeError:
            raise ConfigError("rule", rule, "must be a stormguard.Rule") from None
        entry = self._table.get(k)
        local = entry.local if entry is not None else None
        if local is None:
            local = self._local_rule(key, rule)
        if cost != 1 or type(cost) is not int:
            cost = check_cost(rule, cost)
            if cost > local.capacity:
                self._record(key, rule, cost, False)
                return self._too_big(local)
        d = self.local.hit(key, local, cost)
        if self.split == "demand":
            with self._lock:
                row = self._demand.get(k)
                if row is not None:
                    row[1] += cost
                    row[2 if d[0] else 3] += cost
                    return d if d[2] >= 0 else d.replace(remaining=0)
            self._record(key, rule, cost, d[0])
        return d if d[2] >= 0 else d.replace(remaining=0)

    async def ahit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        local = self.local_rule(key, rule)
        if cost != 1 or type(cost) is not int:
            cost = check_cost(rule, cost)
            if cost > local.capacity:
                self._record(key, rule, cost, False)
                return self._too_big(local)
        d = await self.local.ahit(key, local, cost)
        self._record(key, rule, cost, d.allowed)
        return d if d[2] >= 0 else d.replace(remaining=0)

    def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        local = self.local_rule(key, rule)
        if cost != 1 or type(cost) is not int:
            cost = check_cost(rule, cost)
            if cost > local.capacity:
                return self._too_big(local)
        d = self.local.peek(key, local, cost)
        return d if d[2] >= 0 else d.replace(remaining=0)

    async def apeek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        local = self.local_rule(key, rule)
        if cost != 1 or type(cost) is not int:
            cost = check_cost(rule, cost)
            if cost > local.capacity:
                return self._too_big(local)
        d = await self.local.apeek(key, local, cost)
        return d if d[2] >= 0 else d.replace(remaining=0)

    def _locals(self, key: str, rules: Sequence[Rule], cost: int) -> list[Rule] | Decision:
        if type(key) is not str:
            raise key_error(key)
        if type(cost) is not int:
            cost = validate.integer("cost", cost)
        rules = check_rules(rules, cost)
        scaled = [self._local_rule(key, r) for r in rules]
        for s in scaled:
            if cost > s.capacity:
                return self._too_big(s)
        return scaled

    def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        scaled = self._locals(key, rules, cost)
        d = scaled if isinstance(scaled, Decision) else self.local.hit_all(key, scaled, cost)
        for r in check_rules(rules, cost):
            self._record(key, r, cost, d.allowed)
        return d if d[2] >= 0 else d.replace(remaining=0)

    async def ahit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        scaled = self._locals(key, rules, cost)
        d = scaled if isinstance(scaled, Decision) else await self.local.ahit_all(
            key, scaled, cost)
        for r in check_rules(rules, cost):
            self._record(key, r, cost, d.allowed)
        return d if d[2] >= 0 else d.replace(remaining=0)

    def reserve(self, key: str, rule: Rule, cost: int = 1, *, max_wait: float | None = None,
                book: bool = True) -> Reservation:
        return self.local.reserve(key, self.local_rule(key, rule), cost, max_wait=max_wait,
                                  book=book)

    async def areserve(self, key: str, rule: Rule, cost: int = 1, *,
                       max_wait: float | None = None, book: bool = True) -> Reservation:
        return await self.local.areserve(key, self.local_rule(key, rule), cost,
                                         max_wait=max_wait, book=book)

    def _stored(self, rule: Rule | Sequence[Rule]) -> list[Rule]:
        """The rules whose counters the shares of ``rule`` use (their storage identity)."""
        rules = [rule] if isinstance(rule, Rule) else list(rule)
        return [self._scale(r, self.weights[self.region]) for r in rules]

    def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        self.local.reset(key, self._stored(rule))

    async def areset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        await self.local.areset(key, self._stored(rule))

    def ping(self) -> bool:
        return self.local.ping()

    async def aping(self) -> bool:
        return await self.local.aping()

    def _stop_sync(self) -> None:
        """Stop the background sync and close the boards (closing is best effort)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.peer_timeout + 1.0)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for board in self._boards.values():
            try:
                board.close()
            except Exception:  # closing is best effort
                _log.debug("closing a regional board failed", exc_info=True)

    def close(self) -> None:
        self._stop_sync()
        self.local.close()

    async def aclose(self) -> None:
        # the thread join waits at most a sync (bounded by the peer timeouts)
        self._stop_sync()
        await self.local.aclose()

    # -- events -----------------------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def _failed(self, peer: str, operation: str, error: BaseException) -> None:
        self._counts["sync_failures"] += 1
        if observed(self._listeners):
            emit(self._listeners, SyncFailed(self._policy, self.clock.monotonic(), peer,
                                             operation, error))

    # -- the sync ---------------------------------------------------------------------
    def _run(self) -> None:
        # a fixed rate: a sync every interval from the start (the next one at once when a
        # sync took longer than the interval), not an interval after each sync; while a
        # raise is pending (pending()), one more sync half-way to the next regular one
        interval = self.sync_interval or 1.0
        due = time.monotonic()
        while not self._stop.is_set():
            self._lag += max(0.0, time.monotonic() - due)
            self.sync()
            due = max(due + interval, time.monotonic())
            half = due - interval / 2
            self._quarter(half - interval / 4)
            self._stop.wait(max(0.0, half - time.monotonic()))  # real time: half the period
            if not self._stop.is_set() and self.half_sync():
                self._lag += max(0.0, time.monotonic() - half)
            self._quarter(due - interval / 4)
            self._stop.wait(max(0.0, due - time.monotonic()))  # real time: the period

    def _quarter(self, at: float) -> None:
        """Poll at ``at`` while a raise of this region is pending."""
        if self._raising():
            self._stop.wait(max(0.0, at - time.monotonic()))  # real time: a quarter period
            if not self._stop.is_set():
                self.poll()

    def half_sync(self) -> bool:
        """The step half-way between two regular syncs: a sync if a raise is pending,
        here (:meth:`pending`) or at a peer (its report in this region's own board says
        so: one in-region read), else nothing. Returns whether it synced. The background
        sync runs it; a driver of :meth:`sync` with ``sync_interval=None`` may too. So a
        claim is read and acknowledged, and the acknowledgement read, within half an
        interval; a hurried sync reports the demand of the last regular one."""
        if self.split != "demand":
            return False
        if not self._hurry:
            try:
                reports = self._boards[self.region].read()
            except Exception:  # the sync that follows counts what fails
                return False
            if not any(sender != self.region and sender in self._publish_failures
                       and raw.find(b'"hurry":true', 0, 200) >= 0
                       for sender, raw in reports.items()):
                return False
        self._sync_now(hurried=True)
        return True

    def poll(self) -> bool:
        """While this region's own raise is pending: read its board (in region, no write)
        and raise where every peer has acknowledged the claim since the last sync, as
        the next sync would. Returns whether a share rose. The background sync polls a
        quarter of an interval after each sync while a raise is pending (an
        acknowledgement written at a peer's half step is then taken a quarter of an
        interval later, not half)."""
        if self.split != "demand" or not self._raising():
            return False
        with self._sync_lock:
            now = self.clock.monotonic()
            self._receive(now)  # counts its own failures, never raises
            if len(self._fresh(now)) < len(self.regions):
                return False  # nobody raises while a peer is stale
            acked = min((self._acks.get(p, 0) for p in self.peers), default=self._seq)
            raised = False
            for k, entry in self._table.items():
                if entry.claim - entry.enforced <= 1e-12:
                    continue
                published = entry.published
                while len(published) > 1 and published[1][0] <= acked:
                    published.pop(0)
                cap = max(0.0, 1.0 - sum(self._claims_for(k).values()))
                new = min(entry.computed, cap, *(c for _, c in published))
                if new > entry.enforced + 1e-12:
                    self._install(k, entry, None, entry.enforced, new, True, now)
                    raised = True
            return raised

    def pending(self) -> bool:
        """Whether a raise is pending: this region, or a fresh peer whose last report it
        read, has claimed more than it enforces (by more than 5 % of the limit) and waits
        for the acknowledgements: :meth:`half_sync` then syncs. False in a partition
        (nobody claims then)."""
        return self._hurry

    def sync(self) -> None:
        """Publish this region's demand to every peer, read the peers' reports, recompute
        the shares. Never raises: failures are counted in :meth:`stats`."""
        if self.split != "demand":
            return
        self._sync_now(hurried=False)

    def _sync_now(self, hurried: bool) -> None:
        with self._sync_lock:
            start = self.clock.monotonic()
            began = time.perf_counter()  # what the sync cost in real time, for stats()
            try:
                self._sync(start, hurried)
            except Exception as exc:  # sync() never raises; the failure is counted
                _log.warning("stormguard regional sync of %r failed", self.region,
                             exc_info=True)
                self._failed("", "sync", exc)
            self._counts["syncs"] += 1
            self._last_duration = time.perf_counter() - began

    def _collect(self, now: float) -> tuple[dict[tuple[str, str], list[int]],
                                            dict[tuple[str, str], float],
                                            dict[str, Rule], float]:
        """This interval's counts and demand per key (demand in units of the key's limit
        per window)."""
        last = self._last_sync
        interval = (now - last) if last is not None else (self.sync_interval or 1.0)
        interval = max(interval, 1e-3)
        self._last_sync = now
        with self._lock:
            demand, self._demand = self._demand, {}
        counts: dict[tuple[str, str], list[int]] = {}
        own: dict[tuple[str, str], float] = {}
        rules: dict[str, Rule] = {}
        for k, (rule, offered, admitted, denied) in demand.items():
            own[k] = offered / interval * rule.window / rule.limit
            counts[k] = [offered, admitted, denied]
            rules[k[0]] = rule
        return counts, own, rules, interval

    def _encode(self, counts: dict[tuple[str, str], list[int]],
                own: dict[tuple[str, str], float], interval: float,
                hurry: bool = False) -> bytes:
        """The report: per key this region's demand, counts and claim (every key of the
        share table: a key left out is claimed at the static weight)."""
        rows = []
        for k, entry in self._table.items():
            rows.append([k[0], k[1], own.get(k, 0.0), *counts.get(k, (0, 0, 0)),
                         entry.claim, entry.enforced])
        w = self.weights[self.region]
        for k, d in own.items():
            if k not in self._table:
                rows.append([k[0], k[1], d, *counts[k], w, w])
        # "hurry" first: half_sync finds it in the first bytes without decoding
        return json.dumps({"hurry": hurry, "v": 1, "region": self.region, "seq": self._seq,
                           "epoch": self._epoch, "interval": interval,
                           "acks": {p: list(es) for p, es in self._peer_seq.items()},
                           "keys": rows}, separators=(",", ":")).encode()

    def _restore(self) -> None:
        """Start from this region's own last report, kept in its own board (an in-region
        read, once, at construction): a region that restarts enforces the claims it had
        published, which its peers still hold themselves to, rather than its weights.
        Nothing found, or the store unreachable: the weights (never raises)."""
        try:
            raw = self._boards[self.region].read().get(self.region)
            if raw is None:
                return
            report = json.loads(raw)
            seq = int(report["seq"])
            now = self.clock.monotonic()
            for row in report["keys"]:
                claim = float(row[6]) if len(row) > 6 else self.weights[self.region]
                shares = dict(self.weights)
                shares[self.region] = claim
                # what the reports before the restored one claimed is unknown: nothing
                # is free until the peers have read the restored claims
                self._table[(str(row[0]), str(row[1]))] = _Entry(
                    shares, claim, claim, active=now, claim=claim,
                    published=[(0, 0.0), (seq, claim)])
            self._seq = seq
            self._epoch = str(report.get("epoch", self._epoch))
        except Exception as exc:  # a restart without its last report starts from weights
            self._table.clear()
            self._failed(self.region, "restore", exc)

    def _publish(self, payload: bytes) -> None:
        ttl = 2 * self.lease
        try:  # this region's own copy, for a restart (in-region)
            self._boards[self.region].write(self.region, payload, ttl)
        except Exception as exc:  # counted, never raised
            self._failed(self.region, "publish", exc)
        if len(self.peers) > 1 and self._pool is not None:
            # the peers at once: a sync costs the slowest link, not the sum of them
            errors = list(self._pool.map(lambda p: self._write(p, payload, ttl), self.peers))
        else:
            errors = [self._write(p, payload, ttl) for p in self.peers]
        for peer, error in zip(self.peers, errors, strict=True):
            if error is not None:  # a peer unreachable is counted, never raised
                self._publish_failures[peer] += 1
                self._failed(peer, "publish", error)

    def _write(self, peer: str, payload: bytes, ttl: float) -> BaseException | None:
        try:
            self._boards[peer].write(self.region, payload, ttl)
        except Exception as exc:  # returned: counted by the caller, on its thread
            return exc
        return None

    def _receive(self, now: float) -> None:
        try:
            reports = self._boards[self.region].read()
        except Exception as exc:  # own board unreachable: the peers look silent
            self._counts["read_failures"] += 1
            self._failed(self.region, "read", exc)
            return
        for sender, raw in reports.items():
            if sender not in self._publish_failures:
                continue  # this region, or a region not configured here
            try:
                report = json.loads(raw)
                seq = int(report["seq"])
                demand: dict[tuple[str, str], float] = {}
                claims: dict[tuple[str, str], float] = {}
                held: dict[tuple[str, str], float] = {}
                for row in report["keys"]:
                    k = (str(row[0]), str(row[1]))
                    demand[k] = float(row[2])
                    if len(row) > 7:
                        claims[k] = float(row[6])
                        held[k] = float(row[7])
            except Exception as exc:  # a malformed report is ignored, the peer looks silent
                self._counts["decode_failures"] += 1
                self._failed(sender, "decode", exc)
                continue
            mark = (str(report.get("epoch", "")), seq)
            if mark != self._peer_seq.get(sender):
                self._peer_seq[sender] = mark
                self._heard[sender] = now
                self._peer_demand[sender] = demand
                self._peer_claim[sender] = claims
                self._peer_held[sender] = held
                self._peer_hurry[sender] = report.get("hurry") is True
                ack = report.get("acks", {}).get(self.region)
                self._acks[sender] = (int(ack[1]) if isinstance(ack, list) and len(ack) == 2
                                      and ack[0] == self._epoch else 0)

    def _fresh(self, now: float) -> set[str]:
        fresh = {self.region}
        for peer in self.peers:
            heard = self._heard.get(peer)
            if heard is not None and now - heard <= self.lease:
                fresh.add(peer)
                if peer in self._lost:
                    self._lost.discard(peer)
                    if observed(self._listeners):
                        emit(self._listeners, PeerRecovered(self._policy, now, peer))
            elif peer not in self._lost:
                self._lost.add(peer)
                if heard is not None and observed(self._listeners):
                    emit(self._listeners, PeerLost(self._policy, now, peer, now - heard))
        return fresh

    def _sync(self, now: float, hurried: bool = False) -> None:
        # read, compute, then publish: the report carries the demand the new shares were
        # computed from, the claims, and the acknowledgements of the peers' reports. A
        # hurried sync measures the demand since the sync before, like any (reporting
        # the last regular sync's instead was measured slower, docs/regions.md)
        counts, own, rules, interval = self._collect(now)
        self._seq += 1
        self._receive(now)
        fresh = self._fresh(now)
        isolated = len(fresh) == 1 and bool(self.peers)
        # the newest report of ours that every peer has read: a raise needs all of them
        # (a stale peer acknowledges nothing, so nobody raises in a partition)
        acked = min((self._acks.get(p, 0) for p in self.peers), default=self._seq)
        keys: dict[tuple[str, str], None] = dict.fromkeys(self._table)
        keys.update(dict.fromkeys(own))
        for peer in fresh:
            if peer != self.region:
                keys.update(dict.fromkeys(self._peer_demand.get(peer, {})))
        for k in keys:
            demand = {self.region: own.get(k, 0.0)}
            for peer in fresh:
                if peer != self.region:
                    demand[peer] = self._peer_demand.get(peer, {}).get(k, 0.0)
            self._plan_key(k, demand, fresh, isolated, acked, rules.get(k[0]), now)
        mine = self._raising()
        self._hurry = mine or any(self._peer_hurry.get(p, False) for p in fresh
                                  if p != self.region)
        self._publish(self._encode(counts, own, interval, mine))

    def _raising(self) -> bool:
        """Whether this region claims more than it enforces, by more than ``HURRY``, for
        some key (a raise waits for the peers' acknowledgements)."""
        return any(e.claim - e.enforced > HURRY for e in self._table.values())

    def _claim_of(self, peer: str, k: tuple[str, str]) -> float:
        """The most ``peer`` may enforce for ``k``: its last claim, else its weight (what
        a region enforces for a key it has no share for)."""
        claims = self._peer_claim.get(peer)
        if claims is not None:
            c = claims.get(k)
            if c is not None:
                return c
        return self.weights[peer]

    def _claims_for(self, k: tuple[str, str]) -> dict[str, float]:
        """Every peer's claim for ``k`` (:meth:`_claim_of` for all of them, in one call:
        this runs once per key and sync)."""
        weights = self.weights
        out = {}
        for p in self.peers:
            pc = self._peer_claim.get(p)
            c = pc.get(k) if pc is not None else None
            out[p] = c if c is not None else weights[p]
        return out

    def _held_of(self, peer: str, k: tuple[str, str], claim: float) -> float:
        """What ``peer`` enforces for ``k`` as it last reported (its claim when unknown)."""
        held = self._peer_held.get(peer)
        if held is not None:
            h = held.get(k)
            if h is not None:
                return min(h, claim)
        return claim

    def _plan_key(self, k: tuple[str, str], demand: dict[str, float], fresh: set[str],
                  isolated: bool, acked: int, rule: Rule | None, now: float) -> None:
        """Recompute one key's shares and set the share this region enforces.

        Invariant: this region enforces at most ``1 - the sum of the peers' claims``
        (their last reported claims, their weights when none). A cut applies at once; a
        raise only up to the claim of a report every peer has acknowledged (read, and so
        held itself to), so the shares in force never sum to more than 1.
        """
        table = self._table
        weight = self.weights[self.region]
        entry = table.get(k)
        if entry is None and len(table) >= self.max_keys:
            self._counts["untracked"] += 1
            return
        wanted = any(demand.values())
        if wanted:
            active = now
        elif entry is not None:
            active = entry.active
        else:
            return  # nobody wants it and nothing is known: the static weights hold
        old = entry.enforced if entry is not None else weight
        claim = None  # what this region wants beyond what it enforces, if anything
        published = entry.published if entry is not None else [(0, weight)]
        while len(published) > 1 and published[1][0] <= acked:
            published.pop(0)  # reports older than any a peer may still hold to
        others = self._claims_for(k)
        cap = max(0.0, 1.0 - sum(others.values()))
        # stale peers keep (at most) what they last claimed; the fresh ones water-fill
        last = entry.shares if entry is not None else self.weights
        if len(fresh) < len(self.regions):
            last = {**last, **others}
        if isolated:
            new = enforced_share(0.0, old, weight, True)
            shares = dict(last)
            shares[self.region] = computed = new
        elif len(fresh) < len(self.regions):
            # a peer is stale: nobody can raise (it acknowledges nothing), so keep the
            # share (within the cap) and claim nothing more, which would only squeeze
            # the peers when the link heals
            shares = plan_shares(self.regions, demand, fresh, last, self.weights,
                                 self.min_share)
            computed = shares[self.region]
            new = min(old, cap)
        else:
            shares = plan_shares(self.regions, demand, fresh, last, self.weights,
                                 self.min_share)
            computed = shares[self.region]
            # cuts at once, but a small one waits (HOLD)
            target = old if old - HOLD <= computed < old else computed
            new = min(enforced_share(target, old, weight, False), cap)
            # every peer has read one of the reports from `acked` on, and so holds
            # itself to the claim it carried: up to the least of those claims is free
            # (a claim every peer acknowledged, or a share squeezed below a claim that
            # never dropped: it comes back at once)
            granted = min(c for _, c in published)
            new = max(new, min(computed, cap, granted))  # the peers held back
            if computed > new + 1e-12:
                claim = self._want(k, computed, new, others, shares)
                # a share squeezed below a claim of its own (by a peer's claim ahead
                # that a third region's cut has not caught up with yet) keeps that
                # claim, up to what it wants: it grows into nothing, and with its claim
                # unchanged it comes back at the first poll whose cap allows it
                kept = min(computed, entry.claim if entry is not None else weight)
                if kept > new + 1e-12 and (claim is None or kept > claim):
                    claim = kept
        if entry is None:
            entry = table[k] = _Entry(shares, computed, new, active=active)
        else:
            entry.shares, entry.computed, entry.active = shares, computed, active
        entry.claim = new if claim is None else max(new, claim)
        entry.published = self._published(published, entry.claim)
        self._install(k, entry, rule, old, new, wanted, now)

    def _published(self, published: list[tuple[int, float]],
                   claim: float) -> list[tuple[int, float]]:
        """``published`` with the claim this sync's report carries."""
        if published[-1][1] != claim:
            published.append((self._seq, claim))
            if len(published) > _PUBLISHED:
                # a peer that reads none of our reports (a link down one way only) holds
                # the acknowledgements back: merge the two oldest into one at the lower
                # claim (what is free can only shrink), so the list stays bounded
                (seq, a), (_, b) = published[0], published[1]
                published[:2] = [(seq, min(a, b))]
        return published

    def _want(self, k: tuple[str, str], computed: float, new: float,
              others: dict[str, float], shares: dict[str, float]) -> float | None:
        """The claim of a region that enforces ``new`` and wants ``computed``: what is
        wanted, within what the peers leave free: their claims, except the growth of the
        peers ranked after this region (when two regions grow into the same room at
        once, the first by name keeps its claim and the other yields, instead of both
        blocking), and the part of their shares they are about to release (what they
        enforce beyond the share computed here for them: they cut it at the sync that
        reads the same reports, so the claim and the cut travel together instead of one
        after the other). None: nothing to claim."""
        mine = self._rank[self.region]
        taken = 0.0
        for p, c in others.items():
            held = self._held_of(p, k, c)
            if self._rank[p] < mine:
                taken += c
            elif k not in self._peer_demand.get(p, {}) or held - shares[p] <= HOLD:
                # a peer that reported no demand for the key yet (its share here is a
                # guess: a key new everywhere would have every region claim nearly all
                # of it), or one that keeps a share within HOLD of its own: what it holds
                taken += held
            else:
                taken += shares[p]  # it releases the rest at its next sync

        want = min(computed, max(new, 1.0 - taken))
        return want if want > new + 1e-12 else None

    def _install(self, k: tuple[str, str], entry: _Entry, rule: Rule | None, old: float,
                 new: float, wanted: bool, now: float) -> None:
        """Put the share ``new`` in force for ``k`` (the rule checks use, the event)."""
        weight = self.weights[self.region]
        entry.enforced = new  # before `local`: see _local_rule
        rule = rule or entry.rule
        if rule is not None:
            entry.rule = rule
            local = self._scale(rule, new)
            if (local is not entry.local and abs(new - old) > 1e-9
                    and observed(self._listeners)):
                emit(self._listeners, ShareChanged(self._policy, now, k[1], k[0], old, new,
                                                   local.limit))
            entry.local = local
        # a key idle for a lease whose share and claim are back at the static weight is
        # the same as a key never seen: forget it
        if not wanted and now - entry.active > self.lease and math.isclose(
                entry.claim, weight, abs_tol=1e-9) and math.isclose(new, weight,
                                                                    abs_tol=1e-9):
            del self._table[k]

    # -- introspection ------------------------------------------------------------------
    def shares(self, key: str, rule: Rule) -> dict[str, float]:
        """The shares of ``key`` under ``rule`` as this region sees them (this region's
        entry is the share it enforces)."""
        if type(key) is not str:
            raise key_error(key)
        if self.split == "static":
            return dict(self.weights)
        entry = self._table.get((rule._id, key))
        if entry is None:
            return dict(self.weights)
        out = dict(entry.shares)
        out[self.region] = entry.enforced
        return out

    def state(self) -> str:
        """``"static"``, ``"connected"`` (every peer fresh), ``"partial"`` (some peers
        stale) or ``"isolated"`` (no fresh peer)."""
        if self.split == "static":
            return "static"
        if not self.peers:
            return "connected"
        now = self.clock.monotonic()
        fresh = [p for p in self.peers
                 if (h := self._heard.get(p)) is not None and now - h <= self.lease]
        if len(fresh) == len(self.peers):
            return "connected"
        return "partial" if fresh else "isolated"

    def stats(self) -> dict[str, Any]:
        """Counters of the sync and the peers' freshness (never raises)."""
        now = self.clock.monotonic()
        peers = {}
        for p in self.peers:
            h = self._heard.get(p)
            peers[p] = {"fresh": h is not None and now - h <= self.lease,
                        "silent": None if h is None else now - h,
                        "publish_failures": self._publish_failures[p]}
        return {"region": self.region, "split": self.split, "state": self.state(),
                **self._counts,
                "publish_failures": sum(self._publish_failures.values()),
                "keys": len(self._table), "peers": peers, "pending": self._hurry,
                "sync_lag": self._lag, "last_sync_duration": self._last_duration}

    def __repr__(self) -> str:
        return (f"RegionalStore(region={self.region!r}, regions={list(self.regions)}, "
                f"split={self.split!r}, local={self.local!r})")
