"""Build hook: compile the rate-limiting hot path with mypyc when a C compiler is present.

The ``stormguard.ratelimit.algorithms`` package (every module of it),
``stormguard.stores.memory`` and the simulator's core (``stormguard.sim.engine``,
``.runtime`` and ``.model``) are compiled into one mypyc group (they call each other
natively). Wheels get the extension modules and a manifest of the sources' SHA-256
(``stormguard/_speedups.json``); editable installs get them next to the sources in
``src/`` (ignored by git). At import,
``stormguard._speedups`` uses them only if the sources are unchanged, so editing a
``.py`` file in a checkout can never run stale compiled code.

Compilation is an optimisation, never a requirement: without a compiler (or with
``STORMGUARD_NO_COMPILE=1``) the build warns and ships pure Python.
``STORMGUARD_MYPYC_OPT_LEVEL`` (0-3, default 3) is the C compiler's optimisation level:
the test that only checks what a built wheel holds builds it at 0 (about a fifth less
CPU for the build); releases and installs keep 3.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

MODULES = {
    "stormguard.ratelimit.algorithms.base": "src/stormguard/ratelimit/algorithms/base.py",
    "stormguard.ratelimit.algorithms.windows": "src/stormguard/ratelimit/algorithms/windows.py",
    "stormguard.ratelimit.algorithms.log": "src/stormguard/ratelimit/algorithms/log.py",
    "stormguard.ratelimit.algorithms.buckets": "src/stormguard/ratelimit/algorithms/buckets.py",
    "stormguard.ratelimit.algorithms": "src/stormguard/ratelimit/algorithms/__init__.py",
    "stormguard.stores.memory": "src/stormguard/stores/memory.py",
    # FakeClock: the simulator's clock (SimClock) is a compiled subclass, so the engine and
    # the simulated threads read and move its time without a dictionary lookup
    "stormguard.testing.clock": "src/stormguard/testing/clock.py",
    # the simulator's engine, simulated threads and model (`stormguard simulate`): a
    # fifth fewer instructions per simulated request (docs/performance.md)
    "stormguard.sim.engine": "src/stormguard/sim/engine.py",
    "stormguard.sim.runtime": "src/stormguard/sim/runtime.py",
    "stormguard.sim.model": "src/stormguard/sim/model.py",
}
GROUP = "stormguard"  # mypyc names the shared library stormguard__mypyc
MANIFEST = "src/stormguard/_speedups.json"


def _opt_level() -> str:
    level = os.environ.get("STORMGUARD_MYPYC_OPT_LEVEL", "") or "3"
    if level not in ("0", "1", "2", "3"):
        raise ValueError(f"STORMGUARD_MYPYC_OPT_LEVEL: must be 0, 1, 2 or 3 (got {level!r})")
    return level


class MypycBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        self._temporary: list[Path] = []  # removed in finalize(), after the wheel is written
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        if version == "editable":
            self._clean(root)
        if os.environ.get("STORMGUARD_NO_COMPILE", "") not in ("", "0"):
            self.app.display_info("stormguard: STORMGUARD_NO_COMPILE set, pure Python build")
            return
        try:
            built = self._compile(root)
        except (Exception, SystemExit) as exc:  # any failure (mypyc exits on type errors)
            # means: ship pure Python
            self.app.display_warning(
                f"stormguard: mypyc compilation failed, installing pure Python ({exc!r:.300})")
            return
        manifest = {module: hashlib.sha256((root / src).read_bytes()).hexdigest()
                    for module, src in MODULES.items()}
        if version == "editable":
            # the editable install imports from src/: put the modules next to their sources
            for rel, path in built.items():
                shutil.copy2(path, root / "src" / rel)
            (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", "utf-8")
        else:
            self._staging = Path(tempfile.mkdtemp(prefix="stormguard-wheel-"))
            self._temporary.append(self._staging)
            for rel, path in built.items():
                build_data["force_include"][str(path)] = rel
            manifest_file = self._staging / "_speedups.json"
            manifest_file.write_text(json.dumps(manifest, indent=1) + "\n", "utf-8")
            build_data["force_include"][str(manifest_file)] = "stormguard/_speedups.json"
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
        self.app.display_info(f"stormguard: compiled {', '.join(MODULES)} with mypyc")

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        for path in getattr(self, "_temporary", []):
            shutil.rmtree(path, ignore_errors=True)

    def _clean(self, root: Path) -> None:
        """Drop compiled files of an earlier editable build (they may be stale)."""
        (root / MANIFEST).unlink(missing_ok=True)
        for pattern in ("src/stormguard/**/*.so", "src/stormguard/**/*.pyd",
                        f"src/{GROUP}__mypyc*"):
            for path in root.glob(pattern):
                path.unlink()

    def _compile(self, root: Path) -> dict[str, Path]:
        """Compile into a temporary directory; returns {path inside the wheel: file}."""
        from mypyc.build import mypycify
        from setuptools import Distribution

        work = Path(tempfile.mkdtemp(prefix="stormguard-mypyc-"))
        self._temporary.append(work)
        cwd = Path.cwd()
        os.chdir(root)  # mypy resolves the module names from the src/ layout
        try:
            # The build environment has only the build requirements: imports of optional
            # extras (redis, starlette, ...) elsewhere in the package are unresolved
            # there. Type-check the compiled modules as strictly as the project does
            # (pyproject's [tool.mypy]), but not the modules they merely import.
            extensions = mypycify(
                ["--follow-imports=silent", "--ignore-missing-imports",
                 *MODULES.values()],
                opt_level=_opt_level(), group_name=GROUP, target_dir=str(work / "c"))
            dist = Distribution({"name": "stormguard", "ext_modules": extensions})
            cmd = dist.get_command_obj("build_ext")
            cmd.build_lib = str(work / "lib")  # type: ignore[attr-defined]
            cmd.build_temp = str(work / "tmp")  # type: ignore[attr-defined]
            cmd.ensure_finalized()
            cmd.run()
        finally:
            os.chdir(cwd)
        lib = work / "lib"
        built = {str(p.relative_to(lib)): p for p in lib.rglob("*")
                 if p.is_file() and p.suffix in (".so", ".pyd")}
        expected = {f"{GROUP}__mypyc", *(m.replace(".", "/") for m in MODULES)}
        names = {rel.split(".")[0].removesuffix("/__init__") for rel in built}
        if not expected <= names:
            raise RuntimeError(f"mypyc built {sorted(built)}, expected {sorted(expected)}")
        return built
