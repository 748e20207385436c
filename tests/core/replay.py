"""Replay rate-limit traces through MemoryStore and print every Decision as JSON.

``python tests/core/replay.py < cases.json``: test_speedups.py runs it in a child
process with ``STORMGUARD_PURE=1`` and compares the output with the same traces
replayed in-process, so the pure-Python and the compiled hot path must agree.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from stormguard import MemoryStore, Rule
from stormguard.testing import FakeClock


def replay(case: dict[str, Any]) -> list[Any]:
    clock = FakeClock()  # set_wall() may step back; integer microseconds survive it exactly
    store = MemoryStore(clock=clock, max_keys=case["max_keys"])
    rules = [Rule(limit, window, algorithm=algo, burst=burst)
             for limit, window, algo, burst in case["rules"]]
    out: list[Any] = []
    for op, key, cost, now_us, which in case["ops"]:
        clock.set_wall(now_us / 1e6)
        rule = rules[which % len(rules)]
        if op == "reset":
            store.reset(key, rule)
            out.append(None)
            continue
        if op == "hit_all":
            d = store.hit_all(key, rules, min(cost, *(r.capacity for r in rules)))
        else:
            d = getattr(store, op)(key, rule, min(cost, rule.capacity))
        out.append([*d[:5], rules.index(d.rule), d.degraded, len(store), store.evictions])
    return out


def main() -> None:
    print(json.dumps([replay(case) for case in json.load(sys.stdin)]))


if __name__ == "__main__":
    main()
