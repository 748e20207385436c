"""bench/fleet.py and bench/hybrid.py still run end to end (tiny sizes; not timed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}


def test_fleet_simulation_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fleet.py"), "--rate", "5000", "--seconds",
         "0.5", "--users", "100000"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120, check=True).stdout
    assert re.search(r"\| HybridStore \| [\d,]+ \| [\d.]+ \| [\d.,]+ \|", out)
    assert re.search(r"\| GLOBAL-like \(last broadcast, no shares\) \| [\d,]+ \|", out)
    # the hybrid store never overshoots a fixed window while its backend answers
    for row in re.findall(r"\| \w+ \| HybridStore \| .*", out):
        assert "| 0.00 % |" in row or "| - |" in row, row


@pytest.mark.slow
def test_redis_bench_runs() -> None:
    """One contender, one process, one paced run: each run spawns its processes."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "hybrid.py"), "--procs", "1", "--seconds",
         "0.3", "--paced", "200", "--kinds", "HybridStore hot_rate=50"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=180, check=True).stdout
    assert re.search(r"\| HybridStore hot_rate=50 \| [\d,]+ \| [\d.]+ \|", out)
    assert re.search(r"\| RedisStore \| 200 \| [\d.,]+ \| [\d.]+ \|", out)
    assert re.search(r"\| HybridStore \| 200 \| [\d.,]+ \| [\d.]+ \|", out)
