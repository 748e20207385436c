"""Where the service's rules live: in memory, in a rules file, or in Redis.

Every source holds the current :class:`~stormguard.ratelimit.rules.RuleSet` (with its version)
and applies edits with optimistic concurrency: an edit names the version it was based
on (``If-Match``) and fails with :class:`VersionConflict` when another admin changed the
rules in between. A new rule set is validated as a whole before anything is stored.

* :class:`MemoryRules`: version counter in memory (tests, throwaway instances).
* :class:`FileRules`: a PUT rewrites the rules file atomically (temporary file in the same
  directory, fsync, ``os.replace``), keeping its mode and owner, and its comments, key
  order and layout (a YAML round trip: :mod:`.rulesfile`); the version is stored in
  the file; temporary files that a killed writer left are removed at start-up. The file is also
  polled (mtime/size), so an edit on disk is picked up; an invalid file is refused as a
  whole and the previous rules stay in force.
* :class:`RedisRules`: the rule set lives in one Redis hash (``<prefix>:rules``: fields
  ``version`` and ``doc``), written by a compare-and-set Lua script; every instance polls
  the version (one ``HGET`` per ``poll_interval``, 0.25 s by default) and reloads when it
  changed, so all instances agree within a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from typing import Any

from stormguard._core.errors import StorageError
from stormguard.ratelimit.rules import RuleProblem, RulesError, RuleSet
from stormguard.service.rulesfile import remove_stale_temp_files, render, write_atomic

__all__ = ["FileRules", "MemoryRules", "RedisRules", "RulesSource", "VersionConflict",
           "remove_stale_temp_files", "write_atomic"]

log = logging.getLogger("stormguard.service")

Edit = Callable[[RuleSet, int], RuleSet]
"""Build the new rule set from the current one and the new version number."""


class VersionConflict(Exception):
    """The rules changed since the version the edit was based on."""

    def __init__(self, current: int) -> None:
        super().__init__(f"rules are at version {current}")
        self.current = current


class RulesSource:
    """Holds the current rules; subclasses persist edits and pick up outside changes."""

    poll_interval: float = 0.25

    def __init__(self, rules: RuleSet | None = None) -> None:
        self.current = rules if rules is not None else RuleSet()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.reload_errors = 0
        """How many outside changes were refused (invalid rules, unreachable backend)."""
        self._failing = False
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        """Load, then keep polling for outside changes in a background task."""
        await self._refresh_logged()
        if self.poll_interval > 0:
            self._stopping.clear()
            self._task = asyncio.create_task(self._poll_loop(), name="stormguard-rules-poll")

    async def stop(self) -> None:
        """Stop polling: the loop finishes its current refresh (never cancelled in the
        middle of a backend call, which could leave a connection half-used)."""
        task, self._task = self._task, None
        if task is not None:
            self._stopping.set()
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=5.0)
            except TimeoutError:
                task.cancel()

    async def _poll_loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.poll_interval)
                return
            await self._refresh_logged()

    async def _refresh_logged(self) -> None:
        """Refresh; on failure keep the previous rules and log once per outage."""
        try:
            await self.refresh()
        except Exception as exc:  # keep polling whatever happens; the previous rules stay
            self.reload_errors += 1
            if not self._failing:
                log.warning("stormguard: reloading rules failed, previous rules stay: %s", exc)
            self._failing = True
        else:
            if self._failing:
                log.warning("stormguard: reloading rules works again")
            self._failing = False

    async def refresh(self) -> bool:
        """Pick up an outside change now; True if the rules changed."""
        return False

    async def edit(self, edit: Edit, if_match: frozenset[int] | None) -> RuleSet:
        """Apply ``edit`` atomically; raise VersionConflict when the current version is not
        in ``if_match`` (None: no precondition)."""
        async with self._lock:
            await self.refresh()
            cur = self.current
            if if_match is not None and cur.version not in if_match:
                raise VersionConflict(cur.version)
            new = edit(cur, cur.version + 1)
            await self._persist(new)
            self.current = new
            return new

    async def _persist(self, rules: RuleSet) -> None:
        """Store ``rules`` (already validated)."""


class MemoryRules(RulesSource):
    """Rules in memory only."""

    poll_interval = 0.0


class FileRules(RulesSource):
    """Rules in a YAML file, rewritten atomically on every edit."""

    def __init__(self, path: str | os.PathLike[str], *, poll_interval: float = 1.0) -> None:
        self.path = os.fspath(path)
        for tmp in remove_stale_temp_files(os.path.dirname(os.path.abspath(self.path))):
            log.warning("stormguard: removed %s, left by a write that did not finish", tmp)
        super().__init__(RuleSet.load(self.path))  # an invalid file at start is an error
        self.poll_interval = poll_interval
        self._stat = self._file_stat()

    def _file_stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    async def refresh(self) -> bool:
        st = self._file_stat()
        if st is None or st == self._stat:
            return False
        self._stat = st
        try:
            new = await asyncio.to_thread(RuleSet.load, self.path)
        except RulesError as exc:
            self.reload_errors += 1
            log.error("stormguard: rules file refused, previous rules stay: %s", exc)
            return False
        if new.version <= self.current.version:  # hand edit without a version bump
            new = RuleSet(new.rules, version=self.current.version + 1)
        changed = new != self.current
        self.current = new
        return changed

    async def _persist(self, rules: RuleSet) -> None:
        # YAML for 10,000 rules takes seconds of CPU: in the thread, with the write
        await asyncio.to_thread(self._write, rules)
        self._stat = self._file_stat()

    def _write(self, rules: RuleSet) -> None:
        """Write ``rules`` into the file, keeping its comments and layout (:mod:`.rulesfile`)."""
        try:
            with open(self.path, encoding="utf-8") as f:
                old: str | None = f.read()
        except (OSError, UnicodeDecodeError):
            old = None
        write_atomic(self.path, render(old, rules))


# KEYS[1] = the rules hash; ARGV[1] = expected version (-1: any), ARGV[2] = the new doc.
# Returns {1, new_version} or {0, current_version}.
_CAS = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if tonumber(ARGV[1]) >= 0 and cur ~= tonumber(ARGV[1]) then return {0, cur} end
local new = cur + 1
redis.call('HSET', KEYS[1], 'version', new, 'doc', ARGV[2])
return {1, new}
"""

# KEYS[1] = the rules hash; ARGV[1] = the version, ARGV[2] = the doc. Writes them only
# when the hash is missing or holds an older version (Redis lost the rules: FLUSHALL, a
# restart without persistence or from an older snapshot; versions never go back
# otherwise), so the instances converge on the newest rules any of them holds.
_RESEED = """
local cur = redis.call('HGET', KEYS[1], 'version')
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'doc', ARGV[2])
return 1
"""


def redis_transport(url: str, **options: Any) -> Any:
    """The Redis transport for a store URL (``redis://``, ``rediss://``, ``unix://``,
    ``redis+cluster://h1:p1,h2:p2``), built by the same code as the stores' from the same
    URL and options: credentials, TLS, db and cluster routing are the store's."""
    from stormguard.stores.redis import transport_for

    return transport_for(url, **options)


class RedisRules(RulesSource):
    """Rules shared by every instance through one Redis hash."""

    def __init__(self, url: str, *, prefix: str = "stormguard", seed: RuleSet | None = None,
                 poll_interval: float = 0.25, timeout: float = 1.0, **options: Any) -> None:
        """``options``: redis-py connection options, as for the stores (``ssl_ca_certs``...)."""
        from stormguard.stores.redis import Command, register

        super().__init__(RuleSet())
        self.url = url
        self.key = f"{prefix}:rules"
        self.seed = seed
        self.poll_interval = poll_interval
        self._transport = redis_transport(url, timeout=timeout, **options)
        self._script = register("stormguard.rules.cas", _CAS)
        self._reseed = register("stormguard.rules.reseed", _RESEED)
        self._hget_version = Command.of("HGET", self.key, "version", key=self.key)
        self._hmget = Command.of("HMGET", self.key, "version", "doc", key=self.key)

    async def start(self) -> None:
        if self.seed is not None:
            try:
                await self._cas(0, self.seed)  # only when Redis holds no rules yet
            except _Conflict:
                pass
            except StorageError as exc:
                self.current = self.seed  # serve the seed until Redis answers
                log.warning("stormguard: cannot reach Redis for rules, serving the initial "
                            "rules until it answers: %s", exc)
        await super().start()
        if self.seed is None and self.current.version == 0 and not self._failing:
            log.warning("stormguard: no rules in Redis (%s) and none to seed it with: every "
                        "check is allowed until rules are written (PUT /v1/rules, or "
                        "stormguard serve --rules FILE)", self.key)

    async def stop(self) -> None:
        await super().stop()
        with contextlib.suppress(Exception):
            await self._transport.aclose()

    async def _cas(self, expected: int, rules: RuleSet) -> int:
        doc = _doc(rules)
        try:
            ok, version = await self._transport.acall(
                self._script.command([self.key], [expected, doc]))
        except StorageError as exc:  # every transport failure is a StorageError
            raise StorageError(f"rules in Redis: {exc}") from exc
        if not ok:
            raise _Conflict(int(version))
        return int(version)

    async def refresh(self) -> bool:
        try:
            raw = await self._transport.acall(self._hget_version)
            if raw is None or int(raw) < self.current.version:
                if self.current.version > 0:
                    await self._restore(raw)
                    return False
                if raw is None:
                    return False
            if int(raw) == self.current.version:
                return False
            version, doc = await self._transport.acall(self._hmget)
        except StorageError as exc:
            raise StorageError(f"rules in Redis: {exc}") from exc
        try:  # in a thread: validating 10,000 rules takes a second of CPU
            new = await asyncio.to_thread(
                lambda: RuleSet.from_data(json.loads(doc), version=int(version),
                                          source=self.key))
        except (ValueError, TypeError) as exc:
            problems = exc.problems if isinstance(exc, RulesError) else \
                [RuleProblem("-", "doc", str(exc))]
            self.reload_errors += 1
            log.error("stormguard: rules in Redis refused, previous rules stay: %s",
                      RulesError(problems, self.key))
            return False
        self.current = new
        return True

    async def _restore(self, found: bytes | str | int | None) -> None:
        """Redis lost the rules (FLUSHALL, a restart without persistence or from an older
        snapshot): write this instance's current rules back, version kept, unless another
        instance wrote the same or a newer version first (the next poll loads it);
        without it every compare-and-set would conflict until a restart."""
        cur = self.current
        written = await self._transport.acall(
            self._reseed.command([self.key], [cur.version, _doc(cur)]))
        if written:
            what = "missing" if found is None else f"at an older version ({int(found)})"
            log.warning("stormguard: the rules in Redis (%s) were %s: flushed, or restarted "
                        "without persistence; restored this instance's %d rules, version "
                        "%d", self.key, what, len(cur), cur.version)

    async def edit(self, edit: Edit, if_match: frozenset[int] | None) -> RuleSet:
        async with self._lock:
            for _ in range(16):
                await self.refresh()
                cur = self.current
                if if_match is not None and cur.version not in if_match:
                    raise VersionConflict(cur.version)
                new = edit(cur, cur.version + 1)
                try:
                    version = await self._cas(cur.version, new)
                except _Conflict:
                    continue  # another instance won the race: re-read and retry (or 412)
                self.current = RuleSet(new.rules, version=version)
                return self.current
            raise StorageError("rules in Redis: too many concurrent edits")


def _doc(rules: RuleSet) -> str:
    return json.dumps([r.to_dict(full=False) for r in rules.rules])


class _Conflict(Exception):
    def __init__(self, current: int) -> None:
        super().__init__(current)
        self.current = current
