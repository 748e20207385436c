"""The hybrid store's view of its backend: leases, one round trip per node per batch.

A *lease* takes up to ``want`` units of cost from a key's counter on the backend, or as
many as are free when that is at least ``min``; nothing when fewer than ``min`` are free
(the reply then says how long until ``min`` would be). On Redis it is one script,
``lua/lease.lua``, over the rate-limit script's own keys and state, so leases and direct
checks of a key share one counter; every lease of a batch on one server is in one
``EVALSHA``, and a Redis Cluster gets one pipeline per master (one round trip each).
Over any other store (the memory store in tests, a service store) a lease is a ``hit`` of
``want`` and, if denied with fewer free, a second ``hit`` of what is free.

A request with ``min = -1`` is a *forced add*: ``want`` units the process admitted already
(its cold allowance) are added to the counter whatever it holds (on Redis, past the limit
if need be; over another store, as much as the counter can take). A sync round also reads
the *board*: the keys whose counter a lease or a forced add exhausted, appended on the
backend, each process reading the entries added since its last round in the same round
trip (on one Redis server, or a :class:`~stormguard.MemoryStore` shared in one process;
not on a cluster, nor over other stores).

On Redis a forced add on a fixed window that cannot exhaust a new key (``want <
limit``) travels as a *native* command in the round's pipeline instead of a key of the
script: ``SET key "<window> <want>" NX GET PX <ttl>``, the rate-limit script's own state.
A new key (the common case of a cold key) is created with the units, charged exactly; a
key present is left as it is and its reply says what it holds: the grant then has
``granted = 0`` (not charged; the hybrid store charges it in its next round, ``min =
FORCED_PRESENT``, or ``FORCED_SCRIPT`` when they exhaust it: the script posts it in
that round) and the key's remaining after the units owed, so a key those units exhaust
is known at once. A key present whose window is full already (its count at the
limit or past it) answers ``granted = want``, remaining 0: nothing is left to charge
for, since a fixed window's count only grows until the window ends (no lease can take
from it, every check is denied), so the units would change no decision. The window is
the server's (the offset of the last script reply's time); within ``NATIVE_MARGIN_US``
of a window's edge, or before any reply, the add goes in the script.

The next round's charge of a key present is native too: ``APPEND key ";<window>
<want>"``, ``PEXPIRE key <ttl>`` and ``GET key`` in the round's pipeline (about a
quarter of the Redis time of a key of the script). A fixed window's state is thus
``"<window> <used>"`` followed by any number of ``";<window> <units>"``: every script
reads it with ``fwstate`` (lua/prelude.lua, :func:`fw_state` here), the units of the
newest window summed, and writes it back folded. The reply of the GET says where the key
stands; the state up to the APPEND's own reply (its length) says whether these units
exhausted it: such a key is posted on the board by the next round's script (``min =
POST``), one round later than a script's own forced add would post it.

Each adapter also counts what its operations cost Redis, by kind (``scripts`` run,
``lease_keys``, ``owe_keys``, ``native_new``, ``native_present`` and ``native_appends``
forced adds, ``board_reads``, ``posts``, ``direct`` checks), as Redis would run them, whatever the
backend really is: the fleet simulation prices them (a backend made with
``native=True`` answers forced adds as the Redis one does, for the simulation).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from stormguard._core.clock import wall_us
from stormguard._core.errors import StorageError
from stormguard.ratelimit.rule import Rule
from stormguard.stores.base import Store

__all__ = ["FORCED", "FORCED_PRESENT", "FORCED_SCRIPT", "NATIVE_MARGIN_US", "POST", "Backend",
           "BoardRead", "Grant", "LeaseRequest", "backend_for", "fw_state"]

#: (backend key, rule, want, min)
LeaseRequest = tuple[str, Rule, int, int]
#: (granted, remaining after, reset_us, retry_us, backend now_us)
Grant = tuple[int, int, int, int, int]

#: (sequence number, [(until_us, board id)]) or None when the backend has no board
BoardRead = tuple[int, list[tuple[int, str]]] | None

_BATCH = 256  # leases per EVALSHA: a script runs alone on its server, keep each short
FORCED = -1  # the `min` of a forced add
#: a forced add on a key a native add found present: natively an ``APPEND`` to its state
FORCED_PRESENT = -2
POST = -3  # the `min` of a post: no lease, the key onto the board until `want` (µs)
#: a forced add in the script whatever the key (a native add found it present, and these
#: units exhaust it: the script posts it in the same round)
FORCED_SCRIPT = -4
#: keys native appends exhausted waiting for a round to post them, at most (a cluster has
#: no board: none wait there)
_PENDING_MAX = 4096
#: a native forced add only this far (µs) from the edges of the server's window
NATIVE_MARGIN_US = 20_000


def _native(rule: Rule, want: int, least: int) -> bool:
    """A forced add that may travel as native commands: fixed window, fewer units than
    the limit (a ``SET NX`` cannot exhaust a new key: nothing to post on the board; an
    ``APPEND`` that exhausts a key present is posted by the next round's script)."""
    return (least in (FORCED, FORCED_PRESENT) and rule.algorithm == "fixed_window"
            and want < rule._algo.N)


def fw_state(text: str) -> tuple[int, int]:
    """A fixed window's state on Redis, as ``fwstate`` in lua/prelude.lua reads it:
    ``"<window> <used>"`` and any ``";<window> <units>"`` appended by native forced adds;
    the newest window and the units counted in it. (-1, 0) when nothing parses."""
    w, n = -1, 0
    for part in text.split(";"):
        a, _, b = part.partition(" ")
        if not (a.isdigit() and b.isdigit()):
            continue
        x = int(a)
        if x > w:
            w, n = x, int(b)
        elif x == w:
            n += int(b)
    return w, n


class _Board:
    """The board of a backend shared in one process (a MemoryStore): the same contract
    as the Redis one in lua/lease.lua (capped, numbered entries)."""

    def __init__(self) -> None:
        self.seq = 0
        self.entries: deque[tuple[int, str]] = deque(maxlen=1 << 16)

    def post(self, until: int, bid: str) -> None:
        self.entries.append((until, bid))
        self.seq += 1

    def since(self, last: int, cap: int) -> tuple[int, list[tuple[int, str]]]:
        k = self.seq - last
        if last < 0 or k < 0:
            k = self.seq
        k = min(k, cap, len(self.entries))
        if k <= 0:
            return self.seq, []
        return self.seq, list(self.entries)[-k:]


_BOARDS_LOCK = threading.Lock()
_BOARD_ATTR = "_stormguard_hybrid_board"
"""A MemoryStore's board of exhausted keys lives on the store itself (an attribute), not
in a WeakKeyDictionary: the compiled (mypyc) MemoryStore does not clear weak references
when it is freed, so a weak reference to one crashes the interpreter at garbage
collection (docs/architecture.md)."""


def _memory_board(store: Store) -> _Board:
    """The board every hybrid store over this MemoryStore object shares."""
    with _BOARDS_LOCK:
        board = getattr(store, _BOARD_ATTR, None)
        if not isinstance(board, _Board):
            board = _Board()
            setattr(store, _BOARD_ATTR, board)
        return board


class Backend:
    """Leases over any :class:`Store` with its public methods."""

    def __init__(self, store: Store, *, native: bool = False) -> None:
        self.store = store
        self.native = native  # forced adds answered as the Redis backend's native path
        self.native_new = self.native_present = self.native_appends = 0
        # keys native appends exhausted, posted by the next round: (until µs, key, rule)
        self._pending: list[tuple[int, str, Rule]] = []
        self.late_posts = 0  # of those, posted (the round after the APPEND)
        self._trips = 0
        self.ops = 0
        """Counter operations on the backend: a lease or a direct check is one (a script
        run on Redis), however they travel."""
        # what Redis would run: script runs, keys of lease scripts by kind, checks
        self.scripts = self.lease_keys = self.owe_keys = self.board_reads = 0
        self.posts = self.direct = 0
        board = None
        from stormguard.stores.memory import MemoryStore

        if isinstance(store, MemoryStore):
            board = _memory_board(store)
        self._board = board
        self.posting = False  # post exhausted keys (the hybrid store's cold allowance)

    @property
    def has_board(self) -> bool:
        """True when sync rounds read a board of exhausted keys."""
        return self._board is not None

    def board_id(self, key: str, rule: Rule) -> str:
        """The name of ``key`` under ``rule`` on the board."""
        return f"{rule._id}\x00{key}"

    def _count(self, requests: Sequence[LeaseRequest], batched: bool) -> None:
        n = len(requests)
        if n == 0:
            return
        self.scripts += -(-n // _BATCH) if batched else n
        owe = sum(1 for r in requests if r[3] < 0)
        self.owe_keys += owe
        self.lease_keys += n - owe

    def _one_native(self, key: str, rule: Rule, want: int, least: int) -> Grant:
        """A forced add as the Redis backend's native commands answer it: ``SET NX GET``
        (``least`` FORCED), or ``APPEND`` (FORCED_PRESENT: charged, a key it exhausts
        posted by the next round)."""
        store = self.store
        now = wall_us(store.clock)
        self.ops += 1
        w = rule._algo.W
        end = (now // w + 1) * w
        d = store.peek(key, rule, 1)
        if least == FORCED_PRESENT:
            self.native_appends += 1
            was = d[2]
            if was > 0:  # (as much as the counter can take: a memory counter stops there)
                store.hit(key, rule, min(was, want))
            left = was - want
            if (was >= 1 and left < 1 and self._board is not None and self.posting
                    and len(self._pending) < _PENDING_MAX):
                self._pending.append((end, key, rule))
            return (want, max(0, left), end - now, end - now if left < 1 else 0, now)
        if d[2] >= rule._algo.N:  # a new key (nothing used in this window): created
            self.native_new += 1
            d = store.hit(key, rule, want)
            return (want, d[2], end - now, 0, now)
        self.native_present += 1  # present: not charged, what it holds
        if d[2] <= 0:  # full already: the units change nothing in this window (see above)
            return (want, 0, end - now, end - now, now)
        left = d[2] - want
        return (0, max(0, left), end - now, end - now if left < 1 else 0, now)

    def _flush_posts(self) -> None:
        """The keys the last round's native appends exhausted, onto the board (on Redis:
        keys of this round's script)."""
        board = self._board
        now = wall_us(self.store.clock)
        for until, key, rule in self._pending:
            if board is not None and until > now:
                board.post(until, self.board_id(key, rule))
                self.posts += 1
                self.late_posts += 1
                self.owe_keys += 1
        self._pending.clear()

    @property
    def round_trips(self) -> int:
        """Round trips to the backend (a batch counts once per node)."""
        return self._trips

    def nodes(self, requests: Sequence[LeaseRequest]) -> int:
        """How many round trips a batch of ``requests`` costs."""
        return 1 if requests else 0

    def _exhausted(self, key: str, rule: Rule, now: int) -> int:
        """After a grant left fewer than one unit: post the key; the wait for one unit."""
        d = self.store.peek(key, rule, 1)
        retry = round(d[4] * 1e6)
        if not d[0] and self._board is not None and self.posting:
            self._board.post(now + retry, self.board_id(key, rule))
            self.posts += 1
        return retry if not d[0] else 0

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
            if d[2] >= 1 or (least >= 0 and not self.posting):
                return (want, d[2], round(d[3] * 1e6), 0, now)
            retry = self._exhausted(key, rule, now)
            return (want, d[2], round(d[3] * 1e6), retry if least < 0 else 0, now)
        free = min(d[2], want)
        if free > 0 and (free >= least or least < 0):
            self._trips += 1
            d2 = store.hit(key, rule, free)
            if d2[0]:
                if least < 0:  # forced: as much as the counter could take
                    return (want, 0, round(d2[3] * 1e6), self._exhausted(key, rule, now), now)
                if d2[2] < 1 and self.posting:
                    self._exhausted(key, rule, now)
                return (free, d2[2], round(d2[3] * 1e6), 0, now)
            d = d2
        if least < 0:  # forced, and the counter was full already: nothing to post
            return (want, 0, round(d[3] * 1e6), round(d[4] * 1e6), now)
        if least > 0 and least != want:
            self._trips += 1
            d = store.peek(key, rule, least)
        return (0, d[2], round(d[3] * 1e6), round(d[4] * 1e6), now)

    def lease(self, key: str, rule: Rule, want: int, least: int) -> Grant:
        """One lease, one round trip (raises :class:`StorageError`)."""
        self._count(((key, rule, want, least),), False)
        return self._one(key, rule, want, least)

    def lease_many(self, requests: Sequence[LeaseRequest]) -> list[Grant | StorageError]:
        """Every lease of a sync round; a failed one has its error in its place."""
        return self.sync_many(requests, None, 0)[0]

    def sync_many(self, requests: Sequence[LeaseRequest], since: int | None, cap: int
                  ) -> tuple[list[Grant | StorageError], BoardRead]:
        """A sync round: every lease and forced add, and (``since`` not None, the last
        sequence number read, -1 at first) the board's entries added since, at most
        ``cap``."""
        native = self.native
        self._count([r for r in requests if not (native and _native(r[1], r[2], r[3]))],
                    True)
        if self._pending and since is not None and requests:
            self._flush_posts()
        out: list[Grant | StorageError] = []
        trips = self._trips
        for key, rule, want, least in requests:
            try:
                if native and _native(rule, want, least):
                    out.append(self._one_native(key, rule, want, least))
                else:
                    out.append(self._one(key, rule, want, least))
            except StorageError as exc:
                out.append(exc)
        # a batch is one round trip per node, whatever the adapter had to do for it
        self._trips = trips + self.nodes(requests)
        board: BoardRead = None
        if since is not None and self._board is not None:
            board = self._board.since(since, cap)
            self.board_reads += len(board[1])
        return out, board

    async def alease(self, key: str, rule: Rule, want: int, least: int) -> Grant:
        self._count(((key, rule, want, least),), False)
        return await self._aone(key, rule, want, least)

    async def _aone(self, key: str, rule: Rule, want: int, least: int) -> Grant:
        store = self.store
        now = wall_us(store.clock)
        self._trips += 1
        self.ops += 1
        if want == 0:
            d = await store.apeek(key, rule, 1)
            return (0, d[2], round(d[3] * 1e6), 0, now)
        if least < 0:  # a forced add: the blocking flow (an in-process backend)
            return self._one(key, rule, want, least)
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
        return (await self.async_sync_many(requests, None, 0))[0]

    async def async_sync_many(self, requests: Sequence[LeaseRequest], since: int | None,
                              cap: int) -> tuple[list[Grant | StorageError], BoardRead]:
        self._count(requests, True)
        out: list[Grant | StorageError] = []
        trips = self._trips
        for key, rule, want, least in requests:
            try:
                out.append(await self._aone(key, rule, want, least))
            except StorageError as exc:
                out.append(exc)
        self._trips = trips + self.nodes(requests)
        board: BoardRead = None
        if since is not None and self._board is not None:
            board = self._board.since(since, cap)
            self.board_reads += len(board[1])
        return out, board


class RedisBackend(Backend):
    """Leases on Redis or a Redis Cluster: ``lua/lease.lua``."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        from stormguard.stores.redis.cluster import ClusterTransport
        from stormguard.stores.redis.protocol import Command
        from stormguard.stores.redis.ratelimit_scripts import LEASE, rule_args

        self._command = Command.of  # (redis-py is imported with the Redis backend only)

        self.redis: Any = store  # a RedisStore or RedisClusterStore
        self._script = LEASE
        self._rule_args = rule_args
        self._args: dict[str, list[str | int]] = {}
        self.transport = store.transport
        self.cluster = isinstance(self.transport, ClusterTransport)
        self._base: int = self.transport.round_trips
        self.native = True
        # the server's time minus this process's wall time, from the last script reply
        # (None: no reply yet); 0 with client time
        self._offset: int | None = 0 if self.redis.time_source == "client" else None

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

    @property
    def has_board(self) -> bool:
        return not self.cluster  # a cluster's scripts see one slot: no shared board

    def board_id(self, key: str, rule: Rule) -> str:
        return str(self.redis.key(key, rule))

    def _commands(self, requests: Sequence[LeaseRequest], board: str = ""
                  ) -> list[tuple[Any, int]]:
        """(command, how many leases it holds): one per batch on one server, one per lease
        on a cluster (keys of one script must share a slot). ``board``: the last
        command reads the board too ("<since> <cap>")."""
        groups: list[Sequence[LeaseRequest]]
        if self.cluster:
            groups = [[r] for r in requests]
            board = ""
        else:
            groups = [requests[i:i + _BATCH] for i in range(0, len(requests), _BATCH)]
            if not groups and board:  # every add native: a script of no lease reads the board
                groups = [[]]
        out = []
        slack = self.redis._slack_ms
        last = len(groups) - 1
        for g, group in enumerate(groups):
            keys = [self.redis.key(k, r) for k, r, _, _ in group]
            # every batch posts the keys it exhausts; the last one reads the board too
            # (the earlier ones run before it: it reads their posts)
            b = board if g == last or not board else board.partition(" ")[0] + " 0"
            if b:
                prefix = self.redis.prefix
                # (a string of entries and its length ever: not the list of "hybrid.board")
                keys += [f"{prefix}:hybrid.log", f"{prefix}:hybrid.log.seq"]
            args: list[str | int] = [self._now(), len(group), b, slack]
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

    def _board_of(self, reply: Any, n: int, cap: int) -> BoardRead:
        """The board's sequence number and its entries in the reply: one string of
        ``<until_us> <key>`` entries each ended by byte 255 (lease.lua), the last
        ``cap`` of them kept. An entry that does not parse (the start of a board that was
        lost and made anew) is skipped."""
        at = 1 + 4 * n
        entries = []
        if len(reply) > at + 1:
            raw = reply[at + 1]
            blob = raw if isinstance(raw, bytes) else str(raw).encode("utf-8", "surrogateescape")
            for item in blob.split(b"\xff"):
                until, _, bid = item.partition(b" ")
                if not bid or not until.isdigit():
                    continue
                try:
                    entries.append((int(until), bid.decode()))
                except UnicodeDecodeError:
                    continue
            if len(entries) > cap:
                del entries[:len(entries) - cap]
        self.board_reads += len(entries)
        return int(reply[at]), entries

    def lease(self, key: str, rule: Rule, want: int, least: int) -> Grant:
        ((command, n),) = self._commands([(key, rule, want, least)])
        self.ops += 1
        self._count(((key, rule, want, least),), False)
        sent = wall_us(self.store.clock)
        reply = self.transport.call(command)
        self._learn(reply, sent)
        return self._grants(reply, n)[0]

    def _learn(self, reply: Any, sent: int) -> None:
        """The server's clock offset, from a script reply's time."""
        if self.redis.time_source == "server" and not isinstance(reply, BaseException):
            self._offset = int(reply[0]) - sent

    def _split(self, requests: Sequence[LeaseRequest]
               ) -> tuple[list[LeaseRequest], list[tuple[int, list[Any], int]]]:
        """The requests for the script, and the native forced adds: (index in
        ``requests``, its commands, the server's window end in µs). A forced add of a
        key unknown is ``SET key "<window> <units>" NX GET PX <ttl>``; of a key a native
        add found present, ``APPEND key ";<window> <units>"``, ``PEXPIRE key <ttl>`` (an
        APPEND to a key gone since creates it without one) and ``GET key``."""
        if (not self.native or self._offset is None
                or not any(_native(r, w, m) for _, r, w, m in requests)):
            return list(requests), []
        now = wall_us(self.store.clock) + self._offset
        script: list[LeaseRequest] = []
        native: list[tuple[int, list[Any], int]] = []
        slack = self.redis._slack_ms
        command = self._command
        for i, req in enumerate(requests):
            key, rule, want, least = req
            w = rule._algo.W
            into = now % w
            if (not _native(rule, want, least) or into < NATIVE_MARGIN_US
                    or w - into < NATIVE_MARGIN_US):
                script.append(req)
                continue
            end = now - into + w
            # the key lives until its window ends (the margin more: the estimate of the
            # server's time may be early), as the rate-limit script's own TTL
            ttl = -(-(end - now) // 1000) + slack + NATIVE_MARGIN_US // 1000
            k = self.redis.key(key, rule)
            if least == FORCED_PRESENT:
                native.append((i, [command("APPEND", k, f";{now // w} {want}", key=k),
                                   command("PEXPIRE", k, ttl, key=k),
                                   command("GET", k, key=k)], end))
            else:
                native.append((i, [command("SET", k, f"{now // w} {want}", "NX", "GET", "PX",
                                           ttl, key=k)], end))
        return script, native

    def _native_grants(self, requests: Sequence[LeaseRequest],
                       native: list[tuple[int, list[Any], int]], replies: Sequence[Any]
                       ) -> list[tuple[int, Grant | StorageError]]:
        offset = self._offset or 0
        now = wall_us(self.store.clock) + offset
        out: list[tuple[int, Grant | StorageError]] = []
        at = 0
        for i, commands, end in native:
            got = replies[at:at + len(commands)]
            at += len(commands)
            key, rule, want, least = requests[i]
            n = rule._algo.N
            bad = next((r for r in got if isinstance(r, BaseException)), None)
            if bad is not None:
                out.append((i, bad if isinstance(bad, StorageError) else StorageError(str(bad))))
                continue
            reset = max(0, end - now)
            window = (end - 1) // rule._algo.W
            if least == FORCED_PRESENT:  # APPEND, PEXPIRE, GET: charged
                out.append((i, self._appended(key, rule, want, window, end, reset, now, got)))
                continue
            reply = got[0]
            if reply is None:  # a new key, created with the units
                self.native_new += 1
                out.append((i, (want, n - want, reset, 0, now)))
                continue
            self.native_present += 1  # present: not charged; what it holds
            win, used = fw_state(reply.decode() if isinstance(reply, bytes) else str(reply))
            current = win == window
            if current and used >= n:  # full already: nothing left to charge for
                out.append((i, (want, 0, reset, reset, now)))
                continue
            left = n - used - want if current else n - want
            out.append((i, (0, max(0, left), reset, reset if left < 1 else 0, now)))
        return out

    def _appended(self, key: str, rule: Rule, want: int, window: int, end: int, reset: int,
                  now: int, got: Sequence[Any]) -> Grant:
        """The grant of a native APPEND: where the key stands (the GET), and whether these
        units exhausted it (the state up to the APPEND's reply, its length: what other
        processes appended after it does not count), then posted by the next round."""
        self.native_appends += 1
        n = rule._algo.N
        raw = got[2]
        text = raw.decode() if isinstance(raw, bytes) else str(raw or "")
        win, used = fw_state(text)
        left = n - used if win == window else n
        size = int(got[0])
        mine = f";{window} {want}"
        upto = text[:size] if len(text) >= size and text[size - len(mine):size] == mine else text
        w0, through = fw_state(upto)
        if (w0 == window and through >= n > through - want and self.has_board
                and len(self._pending) < _PENDING_MAX):
            self._pending.append((end, key, rule))
        return (want, max(0, left), reset, reset if left < 1 else 0, now)

    def _fold_replies(self, commands: list[tuple[Any, int]], replies: Sequence[Any],
                      board: str) -> tuple[list[Grant | StorageError], BoardRead]:
        out: list[Grant | StorageError] = []
        read: BoardRead = None
        for i, ((_, n), reply) in enumerate(zip(commands, replies, strict=True)):
            if isinstance(reply, BaseException):
                err = reply if isinstance(reply, StorageError) else StorageError(str(reply))
                out += [err] * n
            else:
                out += self._grants(reply, n)
                if board and i == len(commands) - 1:
                    read = self._board_of(reply, n, int(board.rpartition(" ")[2]))
        return out, read

    def lease_many(self, requests: Sequence[LeaseRequest]) -> list[Grant | StorageError]:
        return self.sync_many(requests, None, 0)[0]

    def _round(self, requests: Sequence[LeaseRequest], since: int | None, cap: int
               ) -> tuple[str, list[LeaseRequest], list[tuple[int, list[Any], int]],
                          list[tuple[Any, int]]]:
        """A sync round's parts: the board argument, the requests for the script (the
        posts of the last round's native appends first), the native adds, the scripts."""
        board = f"{since} {cap}" if since is not None and self.has_board and requests else ""
        script, native = self._split(requests)
        posts: list[LeaseRequest] = []
        if board and self._pending:  # (the script writes posts only with a board)
            posts = [(key, rule, until, POST) for until, key, rule in self._pending]
            self._pending.clear()
            self.posts += len(posts)
            self.late_posts += len(posts)
        commands = self._commands(posts + script, board)
        self.ops += len(requests)
        self._count(posts + script, not self.cluster)
        return board, posts + script, native, commands

    def sync_many(self, requests: Sequence[LeaseRequest], since: int | None, cap: int
                  ) -> tuple[list[Grant | StorageError], BoardRead]:
        board, script, native, commands = self._round(requests, since, cap)
        sent = wall_us(self.store.clock)
        # one pipeline: the scripts and the native adds, one round trip per node
        replies = self.transport.call_many([c for c, _ in commands]
                                           + [c for _, cs, _ in native for c in cs])
        k = len(commands)
        if k:
            self._learn(replies[k - 1], sent)
        return self._merge(requests, script, native, commands, replies, board)

    def _merge(self, requests: Sequence[LeaseRequest], script: list[LeaseRequest],
               native: list[tuple[int, list[Any], int]], commands: list[tuple[Any, int]],
               replies: Sequence[Any], board: str
               ) -> tuple[list[Grant | StorageError], BoardRead]:
        k = len(commands)
        out, read = self._fold_replies(commands, replies[:k], board)
        posts = len(script) - (len(requests) - len(native))
        if posts:  # the posts' own replies: none for the caller; a failed one is kept
            for req, g in zip(script[:posts], out[:posts], strict=True):
                if isinstance(g, StorageError):
                    self._pending.append((req[2], req[0], req[1]))
            del out[:posts]
        if not native:
            return out, read
        merged: list[Grant | StorageError | None] = [None] * len(requests)
        for i, g in self._native_grants(requests, native, replies[k:]):
            merged[i] = g
        it = iter(out)
        return [g if g is not None else next(it) for g in merged], read

    async def alease(self, key: str, rule: Rule, want: int, least: int) -> Grant:
        ((command, n),) = self._commands([(key, rule, want, least)])
        self.ops += 1
        self._count(((key, rule, want, least),), False)
        sent = wall_us(self.store.clock)
        reply = await self.transport.acall(command)
        self._learn(reply, sent)
        return self._grants(reply, n)[0]

    async def alease_many(self, requests: Sequence[LeaseRequest]
                          ) -> list[Grant | StorageError]:
        return (await self.async_sync_many(requests, None, 0))[0]

    async def async_sync_many(self, requests: Sequence[LeaseRequest], since: int | None,
                              cap: int) -> tuple[list[Grant | StorageError], BoardRead]:
        board, script, native, commands = self._round(requests, since, cap)

        async def one(command: Any) -> Any:
            try:
                return await self.transport.acall(command)
            except StorageError as exc:
                return exc

        sent = wall_us(self.store.clock)
        # concurrent acalls of one loop iteration leave in one write per server
        replies = list(await asyncio.gather(*(one(c) for c, _ in commands),
                                            *(one(c) for _, cs, _ in native for c in cs)))
        k = len(commands)
        if k:
            self._learn(replies[k - 1], sent)
        return self._merge(requests, script, native, commands, replies, board)


def backend_for(store: Store) -> Backend:
    """The lease adapter of ``store``: Lua leases on Redis, public methods otherwise."""
    if hasattr(store, "transport") and hasattr(store, "time_source"):
        from stormguard.stores.redis.store import _RedisStore

        if isinstance(store, _RedisStore):
            return RedisBackend(store)
    return Backend(store)
