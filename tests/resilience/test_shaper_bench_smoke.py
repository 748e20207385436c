"""bench/shaper.py still runs end to end (tiny sizes; figures not checked, only shape)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_shaper_benchmark_runs() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "shaper.py"), "--quick"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert re.search(r"\| stormguard Shaper\.call \| [\d.]+ \| [\d.]+ \|", out)
    assert re.search(r"\| aiolimiter `async with AsyncLimiter` \| [\d.]+ \| 1\.00 \|", out)
    # aiolimiter's documented form lets the whole bucket through at once; the shaper never
    burst = re.search(r"\| aiolimiter AsyncLimiter\(500, 1\) \|(?: [-\d.]+ \|){3} (\d+) \|", out)
    paced = re.search(r"\| stormguard Shaper\(500/s\), asyncio \|(?: [-\d.]+ \|){3} (\d+) \|",
                      out)
    assert burst is not None
    assert paced is not None
    assert int(burst[1]) > 100
    assert int(paced[1]) < int(burst[1]) // 4  # 6 at 2 ms apart, plus a loaded OS's lateness
