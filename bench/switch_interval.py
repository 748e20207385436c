"""What a short GIL switch interval costs CPU-bound threads: a fixed pure-Python workload
split over k threads, run at CPython's 5 ms interval and at a short one back to back, the
order alternating, many pairs; the median of the CPU-time ratios (process CPU, user +
system: the extra hand-offs' futex calls and context switches) and the voluntary context
switches per run. Paired because the machine is shared: a drift in its load hits both
halves of a pair alike.

    python bench/switch_interval.py                     # 0.1 ms vs 5 ms, 1 and 2 threads
    python bench/switch_interval.py --short 0.001 --threads 2 --pairs 50
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import threading
import time


def work(n: int) -> None:
    x = 0
    for _ in range(n):
        for i in range(200):
            x += i * i


def run(interval: float, threads: int, n: int) -> tuple[float, int]:
    """CPU seconds and voluntary context switches of ``n`` units over ``threads``."""
    sys.setswitchinterval(interval)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    c0 = time.process_time()
    ts = [threading.Thread(target=work, args=(n // threads,)) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return time.process_time() - c0, r1.ru_nvcsw - r0.ru_nvcsw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", type=float, default=0.0001, help="the short interval (s)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--units", type=int, default=30000, help="work units per run")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for k in (int(x) for x in args.threads.split(",")):
        ratios, switches, secs = [], [], []
        for p in range(args.pairs):
            order = [0.005, args.short] if p % 2 == 0 else [args.short, 0.005]
            got = {s: run(s, k, args.units) for s in order}
            ratios.append(got[args.short][0] / got[0.005][0])
            switches.append((got[0.005][1], got[args.short][1]))
            secs.append(got[0.005][0])
        ratios.sort()
        q = len(ratios) // 4
        print(f"{k} thread(s), {args.short * 1e3:g} ms against 5 ms: CPU ratio median "
              f"{statistics.median(ratios):.3f} (quartiles {ratios[q]:.3f}-{ratios[-1 - q]:.3f}); "
              f"voluntary context switches per run {statistics.median(a for a, _ in switches):.0f}"
              f" against {statistics.median(b for _, b in switches):.0f}; {args.pairs} pairs of "
              f"about {statistics.median(secs):.2f} s")
    sys.setswitchinterval(0.005)


if __name__ == "__main__":
    main()
