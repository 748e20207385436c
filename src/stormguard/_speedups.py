"""Choose between the compiled hot path and the pure-Python one, once, at import.

The rate-limiting arithmetic (the ``stormguard.ratelimit.algorithms`` package), the
embedded store (``stormguard.stores.memory``) and the simulator's core
(``stormguard.sim.engine``, ``.runtime``, ``.model``) are plain, typed Python. When
stormguard is installed from source with a C compiler present, the build compiles those
modules with mypyc (see ``hatch_build.py``), which makes an in-memory check 1.5x-2x
cheaper and a simulated request a fifth cheaper. The
Python files stay the single source of truth; the compiled modules are used only
when they were built from exactly those files:

* a manifest written by the build (``_speedups.json``) records the SHA-256 of each
  compiled module's source; if any source changed since (an edit in a development
  checkout), or any compiled file is missing, *all* of them fall back to Python
  (they call each other natively, so it is all or nothing);
* ``STORMGUARD_PURE=1`` in the environment forces the pure-Python modules.

:data:`STATUS` says which one runs and why; :func:`compiled` is its boolean.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from importlib.machinery import (
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    FileFinder,
    ModuleSpec,
    SourceFileLoader,
)
from pathlib import Path
from types import ModuleType

__all__ = ["COMPILED_MODULES", "GROUP_LIBRARY", "MANIFEST", "STATUS", "compiled", "source_path"]

#: The modules the build compiles, in dependency order.
COMPILED_MODULES = (
    "stormguard.ratelimit.algorithms.base",
    "stormguard.ratelimit.algorithms.windows",
    "stormguard.ratelimit.algorithms.log",
    "stormguard.ratelimit.algorithms.buckets",
    "stormguard.ratelimit.algorithms",
    "stormguard.stores.memory",
    "stormguard.testing.clock",
    "stormguard.sim.engine",
    "stormguard.sim.runtime",
    "stormguard.sim.model",
)
#: The manifest the build writes next to this file.
MANIFEST = "_speedups.json"
#: mypyc's shared library of the compiled group, a top-level module next to the package.
GROUP_LIBRARY = "stormguard__mypyc"

_PACKAGE_DIR = Path(__file__).resolve().parent


def source_path(module: str, package_dir: Path = _PACKAGE_DIR) -> Path:
    """The ``.py`` file of one of :data:`COMPILED_MODULES`."""
    parts = module.split(".")[1:]
    base = package_dir.joinpath(*parts)
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _extension(stem: Path) -> Path | None:
    """The extension module ``stem`` + this interpreter's suffix, if it exists."""
    for suffix in EXTENSION_SUFFIXES:
        candidate = stem.with_name(stem.name + suffix)
        if candidate.exists():
            return candidate
    return None


def _decide(package_dir: Path = _PACKAGE_DIR) -> tuple[str, bool]:
    """(status, whether compiled files exist that must be bypassed if not used)."""
    found = [_extension(source_path(m, package_dir).with_suffix("")) for m in COMPILED_MODULES]
    if not any(found):
        return "pure Python (not compiled at install)", False
    if os.environ.get("STORMGUARD_PURE", "") not in ("", "0"):
        return "pure Python (STORMGUARD_PURE is set)", True
    if _extension(package_dir.parent / GROUP_LIBRARY) is None:
        return f"pure Python ({GROUP_LIBRARY} is missing)", True
    try:
        manifest = json.loads((package_dir / MANIFEST).read_text("utf-8"))
    except (OSError, ValueError):
        return f"pure Python (compiled modules without a readable {MANIFEST})", True
    if not isinstance(manifest, dict):
        return f"pure Python ({MANIFEST} is not a mapping)", True
    for module, so in zip(COMPILED_MODULES, found, strict=True):
        if so is None:
            return f"pure Python ({module} is not compiled)", True
        try:
            source = source_path(module, package_dir).read_bytes()
        except OSError:  # no .py shipped: the compiled module is all there is
            continue
        digest = hashlib.sha256(source).hexdigest()
        if manifest.get(module) != digest:
            return (f"pure Python ({module} changed since it was compiled; "
                    "reinstall to recompile)"), True
    return "compiled (mypyc)", False


class _SourceOnlyFinder:
    """Imports the listed modules from their ``.py`` files even where a compiled
    extension module sits next to them (the normal finder prefers extensions)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in self.names or path is None:
            return None
        for entry in path:
            spec = FileFinder(entry, (SourceFileLoader, SOURCE_SUFFIXES)).find_spec(fullname)
            if spec is not None:
                return spec
        return None

    def invalidate_caches(self) -> None:
        """Nothing cached."""


STATUS: str
"""Which implementation of the hot path runs, and why."""
try:
    STATUS, _bypass = _decide()
except Exception as exc:  # never let this check break `import stormguard`
    STATUS, _bypass = f"pure Python (could not check the compiled modules: {exc!r})", True
if _bypass:
    sys.meta_path.insert(0, _SourceOnlyFinder(COMPILED_MODULES))


def compiled() -> bool:
    """True when the mypyc-compiled hot path is in use."""
    return STATUS.startswith("compiled")
