"""A shaper's bookings on Redis: the reservation of ``lua/reserve.lua`` plus a shared pause.

:class:`stormguard.Shaper` with a Redis store books each departure with one script call
(``stormguard.shaper``: ``lua/shaper.lua`` over the bucket algorithms' own code and
state, so its slots are exactly those of ``store.reserve``), and the same script holds a
pause key beside the bucket (same hash tag, so a cluster keeps both on one slot): a
booking is judged at the later of now and the pause's end, so no process is given a
slot inside a pause, whoever asked for it.
"""

from __future__ import annotations

from typing import Any

from stormguard._core.clock import wall_us
from stormguard.ratelimit.rule import Rule
from stormguard.stores.base import check_reservation
from stormguard.stores.redis import scripts
from stormguard.stores.redis.protocol import Command
from stormguard.stores.redis.ratelimit_scripts import load_script
from stormguard.stores.redis.store import _RedisStore

__all__ = ["SHAPER", "Booking", "abook", "apause", "book", "book_command", "booking", "pause",
           "pause_command", "supports"]

SHAPER = scripts.register("stormguard.shaper", load_script(
    ("prelude.lua", "token_bucket.lua", "gcra.lua", "leaky_bucket.lua", "reservation.lua",
     "shaper.lua")))


#: ``(ok, wait, paused_for)``: as :class:`~stormguard.ratelimit.reservation.Reservation`'s
#: ``ok`` and ``wait`` (seconds), and how long the shared pause has left (0.0: none)
Booking = tuple[bool, float, float]


def supports(store: object) -> bool:
    """True when ``store`` is a Redis store (one server or a cluster)."""
    return isinstance(store, _RedisStore)


def _keys(store: _RedisStore, key: str, rule: Rule) -> list[str]:
    bucket = store.key(key, rule)
    return [bucket, bucket + ":pause"]  # the hash tag is the bucket's: one cluster slot


def _now(store: _RedisStore) -> str | int:
    return "" if store.time_source == "server" else wall_us(store.clock)


def book_command(store: _RedisStore, key: str, rule: Rule, max_wait: float | None) -> Command:
    """The booking of one departure (``max_wait`` seconds at most; None: any wait)."""
    cost, wait_us = check_reservation(rule, 1, max_wait, True)
    return SHAPER.command(_keys(store, key, rule),
                          [_now(store), cost, "1", store._slack_ms, *store._args(rule),
                           wait_us, ""])


def pause_command(store: _RedisStore, key: str, rule: Rule, seconds: float) -> Command:
    """Nobody sharing ``key`` is given a slot before ``seconds`` from now (server time)."""
    return SHAPER.command(_keys(store, key, rule),
                          [_now(store), 1, "0", store._slack_ms, *store._args(rule), 0,
                           max(1, round(seconds * 1_000_000))])


def booking(reply: Any) -> Booking:
    """The script's reply as a :data:`Booking`."""
    ok, at, now, paused = reply
    return ok == 1, (at - now) / 1e6, max(0, paused - now) / 1e6


def book(store: _RedisStore, key: str, rule: Rule, max_wait: float | None) -> Booking:
    """Book one departure (blocking): one round trip."""
    return booking(store.transport.call(book_command(store, key, rule, max_wait)))


async def abook(store: _RedisStore, key: str, rule: Rule, max_wait: float | None) -> Booking:
    """Book one departure on the running loop: one round trip."""
    return booking(await store.transport.acall(book_command(store, key, rule, max_wait)))


def pause(store: _RedisStore, key: str, rule: Rule, seconds: float) -> None:
    """Pause every process sharing ``key`` (blocking)."""
    store.transport.call(pause_command(store, key, rule, seconds))


async def apause(store: _RedisStore, key: str, rule: Rule, seconds: float) -> None:
    """Pause every process sharing ``key``, on the running loop."""
    await store.transport.acall(pause_command(store, key, rule, seconds))
