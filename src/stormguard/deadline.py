"""Public alias of :mod:`stormguard._core.deadline` (this import path is kept for users)."""

from __future__ import annotations

from typing import Any

from stormguard._core import deadline as _target
from stormguard._core.deadline import *  # noqa: F403
from stormguard._core.deadline import __all__  # noqa: F401 (re-exported)


def __getattr__(name: str) -> Any:
    return getattr(_target, name)
