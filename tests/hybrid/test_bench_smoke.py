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


def fleet(*args: str) -> str:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fleet.py"), "--rate", "5000", "--seconds",
         "0.5", "--users", "100000", *args],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120, check=True).stdout


def test_fleet_simulation_runs() -> None:
    out = fleet()  # cold_allowance 0, the default
    # ops/s, nodes by ops, Redis ms per s, nodes by Redis time, round trips
    assert re.search(r"\| HybridStore \| [\d,]+ \| [\d.]+ \| [\d,]+ \| [\d.]+ \| [\d.,]+ \|",
                     out)
    assert re.search(r"\| GLOBAL-like \(last broadcast, no shares\) \| [\d,]+ \|", out)
    assert "HybridStore's Redis time by kind" in out
    # without the allowance the hybrid store never overshoots a fixed window
    for row in re.findall(r"\| \w+ \| HybridStore \| .*", out):
        cells = [c.strip() for c in row.split("|")]
        assert cells[6] in ("0.00 %", "-"), row
        assert cells[7] in ("0.00 %", "-"), row


def test_fleet_simulation_with_the_allowance_charges_forced_adds() -> None:
    out = fleet("--cold-allowance", "1")
    assert "cold_allowance 1" in out
    # charged in the scripts (forced adds) or as native commands (native adds)
    parts = [re.search(rf"{kind} ([\d,]+)", out) for kind in ("forced adds", "native adds")]
    assert all(p is not None for p in parts)
    assert sum(int(p.group(1).replace(",", "")) for p in parts if p is not None) > 0


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
