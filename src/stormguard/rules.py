"""Transitional alias of :mod:`stormguard.ratelimit.rule` (old path, until its users move)."""

from __future__ import annotations

from typing import Any

from stormguard.ratelimit import rule as _target
from stormguard.ratelimit.rule import *  # noqa: F403
from stormguard.ratelimit.rule import __all__  # noqa: F401 (re-exported)


def __getattr__(name: str) -> Any:
    return getattr(_target, name)
