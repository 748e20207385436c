"""bench/redis.py still runs end to end (tiny sizes; not timed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from stormguard.ratelimit.algorithms import ALGORITHMS

ROOT = Path(__file__).resolve().parents[2]


def test_redis_benchmark_runs() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "redis.py"), "--n", "50", "--async-n", "640",
         "--cluster"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True).stdout
    assert "| raw redis-py EVALSHA loop (same script) |" in out
    for algo in ALGORITHMS:
        assert re.search(rf"\| stormguard {algo} \| [\d,]+ \|", out), algo
        assert re.search(rf"\| stormguard {algo} \(batched\) \| [\d,]+ \| [\d.]+x \|", out), algo
    cluster = out.split("3-master Redis Cluster")[1]
    rates = re.findall(r"\(batched, per-master connections\) \| ([\d,]+) \|", cluster)
    assert len(rates) == 3
    assert all(int(r.replace(",", "")) > 0 for r in rates)


def test_check_batch_benchmark_runs() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "check_batch.py"), "--size", "20",
         "--rounds", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    assert re.search(r"\| POST /v1/check/batch \| [\d.]+ \| [\d.]+ \|", out)
