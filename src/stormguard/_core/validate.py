"""One way to check an argument: every failure is a :class:`ConfigError` naming the field.

Every constructor and option parser in stormguard validates through these helpers, so
a bad value always gets the same kind of message: ``<field>: <problem> (got <value>)``.
Durations are parsed in one place (:func:`duration`), and the one numeric limit of the
Redis scripts (integers below 2**53) is checked in one place (:func:`exact`).
"""

from __future__ import annotations

import math
import re

from stormguard._core.errors import ConfigError

__all__ = ["EXACT", "UNITS", "boolean", "duration", "exact", "integer", "number", "one_of", "text"]

#: Integers below this survive a round trip through an IEEE double (Lua's numbers).
EXACT = 2**53

#: Duration units, in seconds.
UNITS: dict[str, float] = {}
for _names, _secs in (
    (("ms", "millisecond", "milliseconds", "msec"), 0.001),
    (("s", "sec", "secs", "second", "seconds"), 1.0),
    (("m", "min", "mins", "minute", "minutes"), 60.0),
    (("h", "hr", "hrs", "hour", "hours"), 3600.0),
    (("d", "day", "days"), 86400.0),
    (("w", "week", "weeks"), 604800.0),
    (("mo", "month", "months"), 30 * 86400.0),  # as limits and envoyproxy/ratelimit
    (("y", "yr", "year", "years"), 365 * 86400.0),
):
    for _n in _names:
        UNITS[_n] = _secs

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)?\s*([a-zA-Z]+)\s*$")


def number(field: str, value: object, *, minimum: float | None = 0.0, allow_zero: bool = False,
           maximum: float | None = None) -> float:
    """A finite real number (bools refused). With ``minimum`` (default 0) the value must be
    above it, or equal to it when ``allow_zero``; ``maximum`` is inclusive."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(field, value, "must be a number")
    if not math.isfinite(value):
        raise ConfigError(field, value, "must be finite")
    if minimum is not None:
        if allow_zero and value < minimum:
            raise ConfigError(field, value, f"must be >= {minimum:g}")
        if not allow_zero and value <= minimum:
            raise ConfigError(field, value, f"must be > {minimum:g}")
    if maximum is not None and value > maximum:
        raise ConfigError(field, value, f"must be <= {maximum:g}")
    return float(value)


def integer(field: str, value: object, *, minimum: int | None = 1,
            maximum: int | None = None) -> int:
    """An ``int`` (bools refused) within ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, value, "must be an integer")
    if minimum is not None and value < minimum:
        raise ConfigError(field, value, f"must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(field, value, f"must be <= {maximum}")
    return value


def one_of(field: str, value: object, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (exact string match)."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(field, value, f"must be one of {', '.join(map(repr, choices))}")
    return value


def text(field: str, value: object, *, empty: bool = False, max_length: int | None = None,
         forbid: str = "") -> str:
    """A string that can be encoded as UTF-8 (no lone surrogates), so that it can always be
    written to JSON, YAML, a file or Redis and read back."""
    if not isinstance(value, str):
        raise ConfigError(field, value, "must be a string")
    if not value and not empty:
        raise ConfigError(field, value, "must not be empty")
    if max_length is not None and len(value) > max_length:
        raise ConfigError(field, value, f"must be at most {max_length} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(field, value, "must be valid Unicode (it holds a lone surrogate)"
                          ) from None
    for ch in forbid:
        if ch in value:
            raise ConfigError(field, value, f"must not contain {ch!r}")
    return value


def duration(field: str, value: object, *, minimum: float = 0.0,
             allow_zero: bool = False) -> float:
    """Seconds from a number or a string such as ``"250ms"``, ``"1.5s"``, ``"minute"``,
    ``"10 min"``."""
    if isinstance(value, str):
        m = _DURATION.match(value)
        unit = m[2].lower() if m is not None else ""
        if m is None or unit not in UNITS:
            raise ConfigError(field, value, "must be seconds or a duration such as '250ms', "
                              "'1.5s', '10 min', 'hour'")
        value = float(m[1] or 1) * UNITS[unit]
    return number(field, value, minimum=minimum, allow_zero=allow_zero)


def exact(field: str, value: object, largest: int, what: str) -> None:
    """Refuse ``value`` when ``largest`` (its largest intermediate integer) would not stay
    exact on an IEEE double (the Redis scripts' arithmetic)."""
    if largest >= EXACT:
        raise ConfigError(field, value, f"too large for exact arithmetic on Redis: {what} "
                          f"must stay below 2**53 ({EXACT:.3e})")


def boolean(field: str, value: object) -> bool:
    """``True`` or ``False`` (no other truthy or falsy value)."""
    if value is not True and value is not False:
        raise ConfigError(field, value, "must be true or false")
    return value
