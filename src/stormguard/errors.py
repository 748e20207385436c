"""Public alias of :mod:`stormguard._core.errors` (this import path is kept for users)."""

from __future__ import annotations

from typing import Any

from stormguard._core import errors as _target
from stormguard._core.errors import *  # noqa: F403
from stormguard._core.errors import __all__  # noqa: F401 (re-exported)


def __getattr__(name: str) -> Any:
    return getattr(_target, name)
