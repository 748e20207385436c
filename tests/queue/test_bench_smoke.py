"""bench/deferred_queue.py still runs end to end (tiny sizes; not timed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_queue_benchmark_runs() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "deferred_queue.py"), "--n", "64", "--rounds", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    for row in ("raw INSERT + COMMIT loop, 1 thread (physical limit)", "defer, 16 threads",
                "raw redis-py XADD loop, 1 client (physical limit)",
                "drain (take, handler, ack), concurrency 8"):
        assert re.search(rf"\| {re.escape(row)} \| [\d,]+ \| [\d.]+x \|", out), row
    assert re.search(r"defers per commit", out)
