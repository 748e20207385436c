"""Public alias of :mod:`stormguard.observability.events` (the import path of earlier
releases)."""

from __future__ import annotations

from typing import Any

from stormguard.observability import events as _target
from stormguard.observability.events import *  # noqa: F403
from stormguard.observability.events import __all__  # noqa: F401 (re-exported)


def __getattr__(name: str) -> Any:
    return getattr(_target, name)
