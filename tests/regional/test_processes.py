"""Three regions as three real processes, each with its RegionalStore syncing in the
background over real Redis servers and 100-150 ms links, in real time.

Real time throughout (real processes, real background threads, real links): the
offered load is paced by the wall clock and the windows are the servers' own. The
limit is 100 per 1 s window (fixed window), the offered load twice that: 80/10/10 for
4 s, then 10/10/80 for 4 s; syncs every 0.5 s.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections import defaultdict
from typing import Any

import pytest

from tests.regional.harness import REGIONS
from tests.regional.test_redis_regions import Net

LIMIT = 100
SYNC = 0.5
PHASE = 5.0


def region_main(region: str, urls: dict[str, str], start: float, out: Any) -> None:
    """One region's process: wait for ``start``, offer its load, report per window."""
    from stormguard import RegionalStore, Rule

    store = RegionalStore(region=region, stores=urls, sync_interval=SYNC, lease=2.0,
                          peer_timeout=1.0,
                          store_options={"time_source": "client", "timeout": 1.0})
    rule = Rule(LIMIT, 1, algorithm="fixed_window")
    admitted: dict[int, int] = defaultdict(int)
    offered: dict[int, int] = defaultdict(int)
    share = {"us": (0.8, 0.1), "eu": (0.1, 0.1), "ap": (0.1, 0.8)}[region]
    try:
        while time.time() < start:
            time.sleep(0.01)  # real time: the processes start together
        n = 0
        for phase, part in enumerate(share):
            rate = 2 * LIMIT * part
            begin = start + phase * PHASE
            for i in range(int(rate * PHASE)):
                due = begin + i / rate
                delay = due - time.time()
                if delay > 0:
                    time.sleep(delay)  # real time: the load is paced by the wall clock
                w = math.floor(time.time())
                offered[w] += 1
                if store.hit("api_key:acme", rule).allowed:
                    admitted[w] += 1
                n += 1
        out.put((region, dict(admitted), dict(offered), store.stats()))
    finally:
        store.close()


@pytest.mark.slow
def test_three_region_processes_follow_a_shift_within_the_limit() -> None:
    net = Net()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    try:
        start = math.ceil(time.time()) + 3.0  # a window boundary, after the spawns
        procs = [ctx.Process(target=region_main, args=(r, net.view(r), start, out))
                 for r in REGIONS]
        for p in procs:
            p.start()
        results = [out.get(timeout=60) for _ in REGIONS]
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
    finally:
        net.close()
    admitted: dict[int, int] = defaultdict(int)
    per = {r: {w - int(start): n for w, n in adm.items()} for r, adm, _, _ in results}
    for _, adm, _, stats in results:
        assert stats["state"] == "connected"
        assert stats["sync_failures"] == 0
        for w, n in adm.items():
            admitted[w] += n
    first = int(start)
    shift = first + int(PHASE)
    windows = range(first, first + 2 * int(PHASE))
    totals = {w: admitted.get(w, 0) for w in windows}
    # never above the limit by more than what a moving share can carry (5 %)
    assert all(t <= LIMIT * 1.05 for t in totals.values()), totals
    # before the shift (after 3 s to start and meet) and from 2.5 s after it: within 5 % of the
    # limit. (Three sync intervals, 1.5 s, is what the virtual-time tests hold to; here
    # the syncs run on a shared, loaded machine and may come late: two intervals slack.)
    settled = [w for w in windows if first + 3 <= w < shift or w >= shift + 3]
    assert all(abs(totals[w] - LIMIT) <= LIMIT * 0.05 for w in settled), (totals, per)
