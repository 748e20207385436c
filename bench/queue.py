"""DeferredQueue: defers/s and drains/s against the physical limit (bench/deferred_queue.py).

Run from the repository root::

    PYTHONPATH=src:. python bench/queue.py [--n 2000] [--rounds 4]

This file is only a launcher. Scripts in bench/ run with bench/ first on ``sys.path``,
so a sibling's ``import queue`` (redis-py and concurrent.futures use the standard
library's ``queue``) finds this file: imported under that name, it hands the importer the
standard library's module (the import system returns what ``sys.modules`` holds once
the file has run).
"""

from __future__ import annotations

import os
import sys

if __name__ == "queue":
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "queue", os.path.join(os.path.dirname(os.__file__), "queue.py"))
    assert _spec is not None
    assert _spec.loader is not None
    _std = importlib.util.module_from_spec(_spec)
    sys.modules["queue"] = _std
    _spec.loader.exec_module(_std)
elif __name__ == "__main__":
    import runpy

    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "deferred_queue.py"), run_name="__main__")
