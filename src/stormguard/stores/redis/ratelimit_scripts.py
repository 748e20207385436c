"""The rate-limit scripts and their arguments on Redis: which Lua files make each script,
the codes and integer arguments of a rule, and the hash tag of a user key.

* Keys: ``{prefix}:{<tag>}:<rule id>`` where ``<tag>`` is a 128-bit BLAKE2b digest of the
  user key. The digest is the cluster hash tag, so all rules of one key share a slot,
  braces in user keys never act as hash tags, and a user key cannot pick a slot or
  collide with another key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Literal

from stormguard._core import validate
from stormguard.ratelimit.rule import Rule
from stormguard.stores.redis import scripts

__all__ = ["LEASE", "LEASE_SCRIPT", "LEASE_SCRIPT_NAME", "RESERVE_SCRIPT", "RESERVE_SCRIPT_NAME",
           "SCRIPT", "SCRIPT_NAME", "TimeSource",
           "bulk", "load_script", "rule_args", "tag"]

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


def load_script(files: Sequence[str] = _LUA_FILES) -> str:
    """A script from ``lua/`` files, concatenated; by default the rate-limit script: the
    prelude, the six algorithms and the entry point."""
    lua = resources.files("stormguard.stores.redis") / "lua"
    return "\n".join(lua.joinpath(name).read_text(encoding="utf-8") for name in files)


SCRIPT_NAME = "stormguard.ratelimit"
SCRIPT = load_script()
RATELIMIT = scripts.register(SCRIPT_NAME, SCRIPT)

#: The reservation script (``lua/reserve.lua`` over the bucket algorithms' own code and
#: state, so hits and reservations on one key see each other).
RESERVE_SCRIPT_NAME = "stormguard.reserve"
RESERVE_SCRIPT = load_script(("prelude.lua", "token_bucket.lua", "gcra.lua",
                              "leaky_bucket.lua", "reservation.lua", "reserve.lua"))
RESERVE = scripts.register(RESERVE_SCRIPT_NAME, RESERVE_SCRIPT)

#: The hybrid store's leases (``lua/lease.lua`` over the five algorithms it decides
#: locally, on the rate-limit script's own keys and state).
LEASE_SCRIPT_NAME = "stormguard.lease"
LEASE_SCRIPT = load_script(("prelude.lua", "fixed_window.lua", "sliding_window_counter.lua",
                            "token_bucket.lua", "gcra.lua", "leaky_bucket.lua", "lease.lua"))
LEASE = scripts.register(LEASE_SCRIPT_NAME, LEASE_SCRIPT)


def rule_args(rule: Rule) -> tuple[str, int, int, int]:
    """The script arguments of one rule, after checking the Lua arithmetic stays exact."""
    a = rule._algo
    n, w, b = a.N, a.W, a.B
    code = _CODES[a.name]
    # the largest intermediate value of the script is about capacity x window (+ limit)
    if code not in ("fw", "swl"):
        validate.exact("rule", str(rule), b * w + n,
                       "capacity x window in microseconds (use a shorter window or a "
                       "smaller limit)")
    return (code, n, w, b)


_TAGS: dict[str, str] = {}
_TAGS_MAX = 1 << 16


def tag(key: str) -> str:
    """The hash tag of a user key: 128-bit BLAKE2b in hex (memoised for hot keys)."""
    tag = _TAGS.get(key)
    if tag is None:
        tag = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
        if len(_TAGS) >= _TAGS_MAX:
            _TAGS.clear()
        if len(key) <= 256:
            _TAGS[key] = tag
    return tag


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)
