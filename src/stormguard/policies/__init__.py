"""Public alias of :mod:`stormguard.resilience` (the import path of earlier releases)."""

from __future__ import annotations

from typing import Any

from stormguard import resilience as _target
from stormguard.resilience import *  # noqa: F403
from stormguard.resilience import __all__  # noqa: F401 (re-exported)


def __getattr__(name: str) -> Any:
    return getattr(_target, name)
