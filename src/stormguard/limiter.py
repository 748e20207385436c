"""Transitional alias of :mod:`stormguard.ratelimit.limiter` (old path, until its users move)."""

from __future__ import annotations

from typing import Any

from stormguard.ratelimit import limiter as _target
from stormguard.ratelimit.limiter import *  # noqa: F403
from stormguard.ratelimit.limiter import __all__  # noqa: F401 (re-exported)


def __getattr__(name: str) -> Any:
    return getattr(_target, name)
