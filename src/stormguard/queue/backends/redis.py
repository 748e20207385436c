"""``redis://`` and ``redis+cluster://``: a Redis stream and a consumer group.

Keys (one hash tag, so one cluster slot): ``{stream}:jobs`` the stream (entries: ``id``,
``task``, ``payload``, ``attempts``, ``key``, ``error``), ``{stream}:retry`` a sorted set
of failed jobs by the time of their retry, ``{stream}:keys`` idempotency key -> job id,
``{stream}:dead`` job id -> dead letter (JSON), ``{stream}:seq`` the job id counter,
``{stream}:lost`` job id -> how many of its leases ended unanswered.

A worker takes work with one script: due retries go back into the stream, then
``XAUTOCLAIM`` takes the entries whose lease ended (idle longer than the visibility
timeout: their worker died), then ``XREADGROUP`` (no ``BLOCK``: the worker polls) new
ones. Every answer (ack, retry, release, bury) is one script that first checks the
entry is still pending *for this consumer* (``XPENDING``), so a worker whose lease was
lost changes nothing. Durable as the server is: with ``appendonly yes`` and
``appendfsync always`` a deferred job survives a crash of Redis as well.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Sequence
from typing import Any

from stormguard._core import validate
from stormguard._core.errors import ConfigError, StorageError
from stormguard.queue.backends.base import Backend
from stormguard.queue.job import DeadLetter, Job
from stormguard.stores.redis import Command, register, transport_for

__all__ = ["DEFAULT_GROUP", "DEFAULT_STREAM", "RedisBackend"]

DEFAULT_STREAM = "stormguard:deferred"
DEFAULT_GROUP = "stormguard"

_OWNED = """
local function owned(stream, group, consumer, entry)
  local p = redis.call('XPENDING', stream, group, entry, entry, 1)
  return p[1] ~= nil and p[1][2] == consumer
end
local function done(stream, group, entry)
  redis.call('XACK', stream, group, entry)
  redis.call('XDEL', stream, entry)
end
local function forget(keys, key, id)
  if key ~= '' and redis.call('HGET', keys, key) == id then redis.call('HDEL', keys, key) end
end
"""

# KEYS: jobs, keys, seq; ARGV: task, payload, key
PUT = register("stormguard.queue.put", """
local key = ARGV[3]
if key ~= '' then
  local held = redis.call('HGET', KEYS[2], key)
  if held then return held end
end
local id = tostring(redis.call('INCR', KEYS[3]))
redis.call('XADD', KEYS[1], '*', 'id', id, 'task', ARGV[1], 'payload', ARGV[2],
           'attempts', '0', 'key', key, 'error', '')
if key ~= '' then redis.call('HSET', KEYS[2], key, id) end
return id
""")

# KEYS: jobs, retry, lost; ARGV: group, consumer, count, min idle ms, now ms
# returns {entry id, fields, lost}: lost counts the leases of the job that ended unanswered
_TAKE = """
local function field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return ''
end
local function take()
  local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[5], 'LIMIT', 0, 1000)
  for _, m in ipairs(due) do
    local j = cjson.decode(m)
    redis.call('XADD', KEYS[1], '*', 'id', j[1], 'task', j[2], 'payload', j[3],
               'attempts', j[4], 'key', j[5], 'error', j[6])
    redis.call('ZREM', KEYS[2], m)
  end
  local n = tonumber(ARGV[3])
  local out = {}
  local claimed = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[4], '0-0',
                             'COUNT', n)
  for _, e in ipairs(claimed[2]) do
    if e and e ~= false and e[2] then
      local lost = redis.call('HINCRBY', KEYS[3], field(e[2], 'id'), 1)
      out[#out + 1] = {e[1], e[2], lost}
    end
  end
  if #out < n then
    local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', n - #out,
                         'STREAMS', KEYS[1], '>')
    if r then
      for _, e in ipairs(r[1][2]) do
        local lost = redis.call('HGET', KEYS[3], field(e[2], 'id')) or '0'
        out[#out + 1] = {e[1], e[2], tonumber(lost)}
      end
    end
  end
  return out
end
"""
TAKE = register("stormguard.queue.take", _TAKE + "return take()\n")

# KEYS: jobs, retry, lost, keys; ARGV: group, consumer, count, min idle ms, now ms, then
# (entry, key, id) per job done. Returns {acked flags, taken (as TAKE)}
FINISH = register("stormguard.queue.finish", _OWNED + _TAKE + """
local acked = {}
for i = 6, #ARGV, 3 do
  local entry, key, id = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if owned(KEYS[1], ARGV[1], ARGV[2], entry) then
    done(KEYS[1], ARGV[1], entry)
    forget(KEYS[4], key, id)
    redis.call('HDEL', KEYS[3], id)
    acked[#acked + 1] = 1
  else
    acked[#acked + 1] = 0
  end
end
local out = {}
if tonumber(ARGV[3]) > 0 then out = take() end
return {acked, out}
""")

# KEYS: jobs, keys, lost; ARGV: group, consumer, entry, key, id
ACK = register("stormguard.queue.ack", _OWNED + """
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
done(KEYS[1], ARGV[1], ARGV[3])
forget(KEYS[2], ARGV[4], ARGV[5])
redis.call('HDEL', KEYS[3], ARGV[5])
return 1
""")

# KEYS: jobs, retry; ARGV: group, consumer, entry, due ms, member (JSON)
RETRY = register("stormguard.queue.retry", _OWNED + """
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
done(KEYS[1], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
return 1
""")

# KEYS: jobs; ARGV: group, consumer, entry, id, task, payload, attempts, key, error
RELEASE = register("stormguard.queue.release", _OWNED + """
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
done(KEYS[1], ARGV[1], ARGV[3])
redis.call('XADD', KEYS[1], '*', 'id', ARGV[4], 'task', ARGV[5], 'payload', ARGV[6],
           'attempts', ARGV[7], 'key', ARGV[8], 'error', ARGV[9])
return 1
""")

# KEYS: jobs, keys, dead, lost; ARGV: group, consumer, entry, key, id, dead letter (JSON)
BURY = register("stormguard.queue.bury", _OWNED + """
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
done(KEYS[1], ARGV[1], ARGV[3])
forget(KEYS[2], ARGV[4], ARGV[5])
redis.call('HDEL', KEYS[4], ARGV[5])
redis.call('HSET', KEYS[3], ARGV[5], ARGV[6])
return 1
""")

# KEYS: jobs; ARGV: group, consumer, entry...
EXTEND = register("stormguard.queue.extend", _OWNED + """
for i = 3, #ARGV do
  if owned(KEYS[1], ARGV[1], ARGV[2], ARGV[i]) then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  end
end
return 1
""")

# KEYS: jobs, retry, dead; ARGV: group
STATS = register("stormguard.queue.stats", """
local len = redis.call('XLEN', KEYS[1])
local flying = 0
if len > 0 or redis.call('EXISTS', KEYS[1]) == 1 then
  flying = redis.call('XPENDING', KEYS[1], ARGV[1])[1]
end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {len, flying, redis.call('ZCARD', KEYS[2]), redis.call('HLEN', KEYS[3]),
        first[2] or false}
""")

# KEYS: dead, jobs, keys
RETRY_DEAD = register("stormguard.queue.retry_dead", """
local ids = redis.call('HKEYS', KEYS[1])
table.sort(ids, function(a, b) return tonumber(a) < tonumber(b) end)
local n = 0
for _, id in ipairs(ids) do
  local d = cjson.decode(redis.call('HGET', KEYS[1], id))
  local key = d['key'] or ''
  if key == '' or not redis.call('HGET', KEYS[3], key) then
    redis.call('XADD', KEYS[2], '*', 'id', id, 'task', d['task'],
               'payload', d['payload'], 'attempts', '0', 'key', key, 'error', '')
    if key ~= '' then redis.call('HSET', KEYS[3], key, id) end
    n = n + 1
  end
end
redis.call('DEL', KEYS[1])
return n
""")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisBackend(Backend):
    """Jobs in a Redis stream read by a consumer group."""

    durable = True

    def __init__(self, url: str, *, stream: str | None = None, group: str | None = None,
                 consumer: str | None = None, **options: Any) -> None:
        self.stream = validate.text("stream", DEFAULT_STREAM if stream is None else stream,
                                    max_length=200, forbid="{}")
        self.group = validate.text("group", DEFAULT_GROUP if group is None else group,
                                   max_length=200)
        self.consumer = validate.text(
            "consumer", consumer if consumer is not None else
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}", max_length=200)
        tag = "{" + self.stream + "}"
        self.jobs, self.retry = f"{tag}:jobs", f"{tag}:retry"
        self.keys, self.dead_key, self.seq = f"{tag}:keys", f"{tag}:dead", f"{tag}:seq"
        self.lost = f"{tag}:lost"
        options["timeout"] = validate.duration("timeout", options.get("timeout", 2.0))
        if "connect_timeout" in options:
            options["connect_timeout"] = validate.duration("connect_timeout",
                                                           options["connect_timeout"])
        try:
            self.transport = transport_for(url, **options)
        except TypeError as exc:
            raise ConfigError("options", options, f"not options of a Redis queue ({exc})"
                              ) from None
        self._group_made = False

    def __repr__(self) -> str:
        return f"RedisBackend(stream={self.stream!r}, group={self.group!r})"

    def _call(self, command: Command) -> Any:
        return self.transport.call(command)

    def _ensure_group(self) -> None:
        if self._group_made:
            return
        try:
            self._call(Command.of("XGROUP", "CREATE", self.jobs, self.group, "0", "MKSTREAM",
                                  key=self.jobs))
        except StorageError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_made = True

    def _script(self, command: Command) -> Any:
        self._ensure_group()
        try:
            return self._call(command)
        except StorageError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._group_made = False  # the stream was deleted: make the group again
            self._ensure_group()
            return self._call(command)

    def put(self, task: str, payload: str, key: str | None, now: float) -> str:
        self._ensure_group()
        reply = self._call(PUT.command((self.jobs, self.keys, self.seq),
                                       (task, payload, key or "")))
        return _text(reply)

    async def aput(self, task: str, payload: str, key: str | None, now: float) -> str:
        if not self._group_made:
            self._ensure_group()
        reply = await self.transport.acall(PUT.command((self.jobs, self.keys, self.seq),
                                                       (task, payload, key or "")))
        return _text(reply)

    def take(self, n: int, now: float, lease: float, owner: str) -> list[Job]:
        return self._jobs(self._script(TAKE.command(
            (self.jobs, self.retry, self.lost),
            (self.group, self.consumer, n, max(int(lease * 1000), 1), int(now * 1000)))))

    def finish(self, done: Sequence[Job], n: int, now: float, lease: float,
               owner: str) -> tuple[list[bool], list[Job]]:
        args: list[str | int] = [self.group, self.consumer, n, max(int(lease * 1000), 1),
                                 int(now * 1000)]
        for job in done:
            args += [job.token, job.key or "", job.id]
        acked, entries = self._script(FINISH.command(
            (self.jobs, self.retry, self.lost, self.keys), args))
        return [bool(a) for a in acked], self._jobs(entries)

    @staticmethod
    def _jobs(entries: Any) -> list[Job]:
        out: list[Job] = []
        for entry_id, fields, lost in entries:
            f = {_text(fields[i]): _text(fields[i + 1]) for i in range(0, len(fields), 2)}
            out.append(Job(f["id"], f["task"], f["payload"], int(f["attempts"]),
                           f["key"] or None, _text(entry_id), f.get("error") or None,
                           int(lost)))
        out.sort(key=lambda j: int(j.id))  # as the other backends: one batch in id order
        return out

    def ack(self, job: Job) -> bool:
        return bool(self._script(ACK.command(
            (self.jobs, self.keys, self.lost), (self.group, self.consumer, job.token, job.key or "",
                                     job.id))))

    def retry_later(self, job: Job, at: float, attempts: int, error: str) -> bool:
        member = json.dumps([job.id, job.task, job.payload, str(attempts), job.key or "",
                             error], ensure_ascii=False)
        return bool(self._script(RETRY.command(
            (self.jobs, self.retry), (self.group, self.consumer, job.token, int(at * 1000),
                                      member))))

    def release(self, job: Job, now: float) -> bool:
        return bool(self._script(RELEASE.command(
            (self.jobs,), (self.group, self.consumer, job.token, job.id, job.task,
                           job.payload, str(job.attempts), job.key or "", job.error or ""))))

    def bury(self, job: Job, attempts: int, error: str, now: float) -> bool:
        letter = json.dumps({"task": job.task, "payload": job.payload, "attempts": attempts,
                             "error": error, "key": job.key or "", "died": now},
                            ensure_ascii=False)
        return bool(self._script(BURY.command(
            (self.jobs, self.keys, self.dead_key, self.lost),
            (self.group, self.consumer, job.token, job.key or "", job.id, letter))))

    def extend(self, jobs: Sequence[Job], now: float, lease: float) -> None:
        if jobs:
            self._script(EXTEND.command((self.jobs,), (self.group, self.consumer,
                                                       *(j.token for j in jobs))))

    def _stats(self) -> tuple[int, int, int, int, float | None]:
        length, flying, retry, dead, first = self._script(STATS.command(
            (self.jobs, self.retry, self.dead_key), (self.group,)))
        return (int(length), int(flying), int(retry), int(dead),
                None if first is None else float(first) / 1000)

    def stats(self, now: float) -> dict[str, int]:
        length, flying, retry, dead, _ = self._stats()
        return {"pending": length - flying + retry, "in_flight": flying, "dead": dead}

    def next_due(self, now: float) -> float | None:
        length, _, retry, _, first = self._stats()
        if length > 0:
            # new entries, or entries leased (whose lease may have ended: XAUTOCLAIM)
            return now
        if retry:
            return first
        return None

    def dead(self, limit: int) -> list[DeadLetter]:
        self._ensure_group()
        reply = self._call(Command.of("HGETALL", self.dead_key, key=self.dead_key))
        pairs = list(reply.items()) if isinstance(reply, dict) else [
            (reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]
        letters = []
        for job_id, text in pairs:
            d = json.loads(_text(text))
            letters.append(DeadLetter(_text(job_id), d["task"], json.loads(d["payload"]),
                                      int(d["attempts"]), d["error"], d["key"] or None,
                                      float(d["died"])))
        letters.sort(key=lambda d: int(d.id))
        return letters[:limit]

    def retry_dead(self, now: float) -> int:
        return int(self._script(RETRY_DEAD.command((self.dead_key, self.jobs, self.keys))))

    def close(self) -> None:
        self.transport.close()

    async def aclose(self) -> None:
        await self.transport.aclose()
