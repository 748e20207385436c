"""Instructions per memory-store check, counted by valgrind (callgrind): a figure that a
busy machine does not move, for comparing two builds of the hot path.

    python bench/instructions.py                          # this interpreter's stormguard
    python bench/instructions.py --python /other/venv/bin/python --python .venv/bin/python

For every algorithm, on the allowed path (a limit never reached) and the denied path
(limit 1 per day, spent first), one key: each interpreter runs N and 3N checks under
callgrind, and the difference divided by 2N is the cost of one check (start-up and
imports cancel out). Needs ``valgrind`` on the PATH; run it without ``STORMGUARD_PURE``
to count the compiled build (the first line of each column says which one ran).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

ALGORITHMS = ("fixed_window", "sliding_window_log", "sliding_window_counter",
              "token_bucket", "gcra", "leaky_bucket")


def child(algorithm: str, path: str, n: int) -> None:
    """Run ``n`` checks (the process valgrind measures)."""
    from stormguard import MemoryStore, Rule, _speedups

    store = MemoryStore(max_keys=1_000_000)
    if path == "allowed":
        rule = Rule(limit=10**9, window=86_400, algorithm=algorithm)
    else:
        rule = Rule(limit=1, window=86_400, algorithm=algorithm)
        store.hit("k", rule)
    hit = store.hit
    for _ in range(n):
        hit("k", rule)
    print(_speedups.STATUS)


def count(python: str, algorithm: str, path: str, n: int) -> int:
    """Instructions of a whole child process running ``n`` checks."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python, __file__,
         "--child", algorithm, path, str(n)],
        capture_output=True, text=True, check=True, timeout=600).stderr
    m = re.search(r"Collected : (\d+)", out)
    if m is None:
        raise RuntimeError(f"no instruction count in valgrind's output: {out[-500:]}")
    return int(m[1])


def status(python: str) -> str:
    return subprocess.run([python, "-c", "import stormguard._speedups as s; print(s.STATUS)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", help="interpreter(s) to compare")
    parser.add_argument("-n", type=int, default=10_000, help="checks of the smaller run")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    if shutil.which("valgrind") is None:
        sys.exit("bench/instructions.py needs valgrind on the PATH")
    pythons = args.python or [sys.executable]
    for py in pythons:
        print(f"{py}: {status(py)}")
    print(f"instructions per check (callgrind; ({args.n * 3} - {args.n} checks) / "
          f"{args.n * 2}); PYTHONPATH={os.environ.get('PYTHONPATH', '')!r}\n")
    print(f"{'algorithm':24}{'path':9}" + "".join(f"{'#' + str(i + 1):>10}"
                                                  for i in range(len(pythons))))
    for algorithm in args.algorithms.split(","):
        for path in ("allowed", "denied"):
            cells = [(count(py, algorithm, path, 3 * args.n) - count(py, algorithm, path, args.n))
                     // (2 * args.n) for py in pythons]
            print(f"{algorithm:24}{path:9}" + "".join(f"{c:>10,}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
