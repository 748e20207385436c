"""Lua scripts registered by name: ``name -> (source, SHA1)``.

A command that runs a script is sent as ``EVALSHA <sha> ...`` and names the script
(:attr:`Command.script <stormguard.stores.redis.protocol.Command.script>`). When a
server answers ``NOSCRIPT`` (a fresh or restarted server, ``SCRIPT FLUSH``), the
transport loads the source registered under that name with ``SCRIPT LOAD`` and sends
the command again, once, on the same connection: no user of the transport handles
``NOSCRIPT`` itself, and nothing is loaded before it is needed.

Registering is idempotent: the same source under the same name returns the same
:class:`Script`; another source under a taken name is a :class:`ConfigError` (two
components silently sharing a name would run each other's code)::

    from stormguard.stores.redis.scripts import register

    RESERVE = register("stormguard.reserve", source)   # once, at import time
    cmd = RESERVE.command([key], [cost, now])           # EVALSHA, routed by key
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from stormguard._core.errors import ConfigError
from stormguard.stores.redis.protocol import Command, pack

__all__ = ["Script", "get", "register", "registered"]

Arg = str | bytes | int | float


@dataclass(frozen=True, slots=True)
class Script:
    """One registered Lua script."""

    name: str
    source: str
    sha: str = field(init=False)
    load: bytes = field(init=False, repr=False)
    """``SCRIPT LOAD <source>`` as RESP bytes (what the transport sends on NOSCRIPT)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(
            self.source.encode(), usedforsecurity=False).hexdigest())
        object.__setattr__(self, "load", pack(("SCRIPT", "LOAD", self.source)))

    def command(self, keys: Sequence[str | bytes], args: Sequence[Arg] = ()) -> Command:
        """``EVALSHA`` of this script on ``keys`` (routed by the first key) and ``args``."""
        return Command.of("EVALSHA", self.sha, len(keys), *keys, *args,
                          key=keys[0] if keys else None, script=self.name)


_REGISTRY: dict[str, Script] = {}
_LOCK = threading.Lock()


def register(name: str, source: str) -> Script:
    """Register ``source`` under ``name`` (idempotent for the same source)."""
    if not isinstance(name, str) or not name:
        raise ConfigError("name", name, "must be a non-empty string")
    if not isinstance(source, str) or not source.strip():
        raise ConfigError("source", source, "must be Lua source text")
    with _LOCK:
        old = _REGISTRY.get(name)
        if old is not None:
            if old.source != source:
                raise ConfigError("name", name, "is registered with another script")
            return old
        script = _REGISTRY[name] = Script(name, source)
        return script


def get(name: str) -> Script:
    """The script registered under ``name`` (KeyError if none)."""
    return _REGISTRY[name]


def registered() -> dict[str, Script]:
    """A copy of the registry."""
    return dict(_REGISTRY)
