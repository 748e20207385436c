"""Public alias of :mod:`stormguard.ratelimit.rules` (the import path of earlier releases)."""

from __future__ import annotations

from typing import Any

from stormguard.ratelimit import rules as _target
from stormguard.ratelimit.rules import *  # noqa: F403
from stormguard.ratelimit.rules import __all__  # noqa: F401 (re-exported)


def __getattr__(name: str) -> Any:
    return getattr(_target, name)
