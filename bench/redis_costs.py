"""What each operation of the hybrid store costs Redis: the cost model of the fleet simulation.

    PYTHONPATH=src:. STORMGUARD_PURE=1 python bench/redis_costs.py            # ~30 s
    PYTHONPATH=src:. STORMGUARD_PURE=1 python bench/redis_costs.py --n 2000   # quick

On one private redis-server (a free loopback port, no persistence), each operation is run
``--n`` times from one client and measured with ``INFO commandstats``: the ``usec`` Redis
spent in ``EVALSHA`` (the script with every command it calls; the counters are reset
before each measurement), per call and per key; each row is the minimum over
``--repeat`` runs (a descheduled server inflates ``usec`` on a loaded machine). Also
shown: the server process's CPU
time (``used_cpu_user + used_cpu_sys`` of ``INFO cpu``) per key, which adds the network
and parsing work ``commandstats`` leaves out (noisy on a shared machine).

* direct check: ``RedisStore.hit``, one rate-limit script run per check, on a cold key
  (a new key each time) and on a hot key (one key, its counter present);
* lease: the hybrid store's lease script with one key (a standalone lease on the request
  path) and batched (one script over ``b`` keys: a sync round), cold keys;
* forced add: a key of the cold allowance charged in a sync round, batched, cold keys;
  and the same when every add exhausts its key (each is appended to the board);
* board read: a sync round of one key that reads ``b`` entries of the board;
* native forced add: what a forced add on a fixed window would cost as a native command
  in the round's pipeline instead of a key inside the script: ``SET key "<window> <n>"
  NX GET PX <ttl>`` (the rate-limit script's own state format), pipelined 256 at a time,
  on new keys and on keys present (``usec`` of ``SET`` in ``INFO commandstats``). A
  present key's reply only says what it holds: the next round adds to it with ``APPEND
  key ";<window> <n>"``, ``PEXPIRE`` and ``GET`` (the state is one string, not an
  integer ``INCRBY`` could add to; every script folds what was appended), measured
  too (the three commands' ``usec``, per add).

From the batches of 1, 16 and 64 keys a linear fit ``fixed + b x per_key`` gives the
fixed cost of one script run and the cost of one key in it (the 256-key row is shown as
a check: a script that long is the likeliest to be descheduled on a shared machine); the
last lines print them as the figures
``stormguard.sim.fleet.REDIS_COSTS`` holds.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# bench/redis.py would shadow redis-py: keep this directory off the path
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
for p in (ROOT, os.path.join(ROOT, "src")):
    if p not in sys.path:
        sys.path.insert(0, p)

from tests.redis_servers import start_redis  # noqa: E402

BATCHES = (1, 16, 64, 256)
APPEND = "append to a key present (APPEND, PEXPIRE, GET)"


class Meter:
    """``EVALSHA`` usec and calls, and the server's CPU, between two reads."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def reset(self) -> None:
        self.client.config_resetstat()
        cpu = self.client.info("cpu")
        self.cpu0 = cpu["used_cpu_user"] + cpu["used_cpu_sys"]

    def read(self) -> tuple[float, int, float]:
        """(script usec, script calls, server CPU seconds) since :meth:`reset`."""
        stats = self.client.info("commandstats").get("cmdstat_evalsha", {})
        cpu = self.client.info("cpu")
        return (float(stats.get("usec", 0)), int(stats.get("calls", 0)),
                cpu["used_cpu_user"] + cpu["used_cpu_sys"] - self.cpu0)


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``total = fixed + b x per_key`` over (b, total usec per call)."""
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    sxx = sum((b - mx) ** 2 for b, _ in points)
    k = sum((b - mx) * (t - my) for b, t in points) / sxx
    return my - k * mx, k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="keys per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row (the minimum)")
    args = parser.parse_args()
    from stormguard import RedisStore, Rule
    from stormguard.stores.hybrid.backend import FORCED, RedisBackend

    server = start_redis()
    rows: list[tuple[str, int, float, float, float]] = []  # name, batch, us/call, us/key, cpu
    try:
        client = server.client()
        meter = Meter(client)
        store = RedisStore(server.url, timeout=5.0)
        backend = RedisBackend(store)
        backend.native = False  # forced adds in the script here; the native SET: below
        rule = Rule.parse("10/second")  # fixed window, the fleet's rules
        n = args.n

        def record(name: str, batch: int, keys: int) -> None:
            usec, calls, cpu = meter.read()
            row = (name, batch, usec / max(1, calls), usec / max(1, keys),
                   cpu * 1e6 / max(1, keys))
            for i, old in enumerate(rows):  # a repeat: keep the minimum
                if old[:2] == row[:2]:
                    rows[i] = min(old, row, key=lambda r: r[2])
                    return
            rows.append(row)

        reads: dict[int, float] = {}
        native: dict[str, float] = {}  # native SET NX GET PX: µs per command
        for _ in range(args.repeat):
            store.hit("warm", rule)  # load the scripts
            backend.lease("warm", rule, 1, 1)
            client.flushall()
            meter.reset()
            for i in range(n):
                store.hit(f"d:{i}", rule)
            record("direct check, cold key", 1, n)
            hot = Rule(10**9, 60, algorithm="fixed_window")
            store.hit("hot", hot)
            meter.reset()
            for _ in range(n):
                store.hit("hot", hot)
            record("direct check, hot key", 1, n)
            for name, least, limit in (("lease", 1, 10), ("forced add", FORCED, 10),
                                       ("forced add, exhausting (board)", FORCED, 1)):
                r = Rule(limit, 1, algorithm="fixed_window")
                for batch in BATCHES:
                    client.flushall()
                    meter.reset()
                    calls = max(1, n // batch)
                    seq = 0  # the board read from where the last round left it: only new posts
                    for j in range(calls):
                        reqs = [(f"{name[:2]}{batch}:{j}:{i}", r, 1, least) for i in range(batch)]
                        board = backend.sync_many(reqs, seq if least == FORCED else None, 4096)[1]
                        if board is not None:
                            seq = board[0]
                    record(name, batch, calls * batch)
            # board reads: a board of 4096 entries, a round of one key reading b of them
            client.flushall()
            r1 = Rule(1, 60, algorithm="fixed_window")
            for j in range(16):
                backend.sync_many([(f"fill:{j}:{i}", r1, 1, FORCED) for i in range(256)], 0, 4096)
            seq = backend.sync_many([("x", r1, 0, 0)], 0, 4096)[1]
            assert seq is not None
            # the sequence number counts bytes: every entry here is as long (a hashed key)
            entry = seq[0] // (16 * 256)
            for batch in (0, *BATCHES):
                meter.reset()
                calls = max(1, n // max(1, batch) // 4)
                for _ in range(calls):
                    got = backend.sync_many([("x", r1, 0, 0)], seq[0] - batch * entry, 4096)
                    assert got[1] is not None
                    assert len(got[1][1]) == batch, (batch, got[1])
                usec, c, _ = meter.read()
                t = usec / max(1, c)
                reads[batch] = min(reads.get(batch, t), t)
            for kind in ("new keys", "keys present"):
                if kind == "new keys":
                    client.flushall()
                meter.reset()
                pipe = client.pipeline(transaction=False)
                for i in range(n):
                    pipe.execute_command("SET", f"nat:{i}", "1 1", "NX", "GET", "PX", 60_000)
                    if i % 256 == 255:
                        pipe.execute()
                        pipe = client.pipeline(transaction=False)
                pipe.execute()
                stats = client.info("commandstats").get("cmdstat_set", {})
                t = float(stats.get("usec", 0)) / max(1, int(stats.get("calls", 0)))
                native[kind] = min(native.get(kind, t), t)
            # the next round's charge of a key present: APPEND, PEXPIRE, GET (the keys
            # hold "1 1" from the SETs above)
            meter.reset()
            pipe = client.pipeline(transaction=False)
            for i in range(n):
                pipe.execute_command("APPEND", f"nat:{i}", ";1 1")
                pipe.execute_command("PEXPIRE", f"nat:{i}", 60_000)
                pipe.execute_command("GET", f"nat:{i}")
                if i % 256 == 255:
                    pipe.execute()
                    pipe = client.pipeline(transaction=False)
            pipe.execute()
            every = client.info("commandstats")
            t = sum(float(every.get(f"cmdstat_{c}", {}).get("usec", 0))
                    for c in ("append", "pexpire", "get")) / n
            native[APPEND] = min(native.get(APPEND, t), t)
        store.close()
    finally:
        server.stop()

    print(f"one private redis-server, one client, {n:,} keys per row; Redis µs from INFO "
          "commandstats (EVALSHA, the script with the commands it calls)")
    print()
    print("| operation | keys per script | Redis µs per script run | Redis µs per key | "
          "server CPU µs per key |")
    print("|---|---:|---:|---:|---:|")
    for name, batch, per_call, per_key, cpu in rows:
        print(f"| {name} | {batch} | {per_call:.2f} | {per_key:.2f} | {cpu:.2f} |")
    print()
    print("| board entries read in a round | Redis µs per script run |")
    print("|---:|---:|")
    for b, t in reads.items():
        print(f"| {b} | {t:.2f} |")
    print()
    print("| native forced add (pipelined) | Redis µs per add |")
    print("|---|---:|")
    for kind, t in native.items():
        print(f"| {kind} | {t:.2f} |")
    fits = {}
    for name in ("lease", "forced add", "forced add, exhausting (board)"):
        pts = [(b, per_call) for nm, b, per_call, _, _ in rows if nm == name and b <= 64]
        fits[name] = fit(pts)
    board_fixed, board_key = fit([(b, t) for b, t in reads.items() if 0 < b <= 64])
    direct_cold = next(r[2] for r in rows if r[0] == "direct check, cold key")
    direct_hot = next(r[2] for r in rows if r[0] == "direct check, hot key")
    print()
    print("linear fits (fixed µs per script run + µs per key):")
    for name, (f, k) in fits.items():
        print(f"  {name}: {f:.2f} + b x {k:.2f}")
    print(f"  board read: {board_fixed:.2f} + b x {board_key:.3f}")
    script = fits["lease"][0]
    print()
    print("REDIS_COSTS = {  # µs of Redis time (bench/redis_costs.py)")
    print(f'    "direct_cold": {direct_cold:.2f}, "direct_hot": {direct_hot:.2f},')
    print(f'    "script": {script:.2f}, "lease_key": {fits["lease"][1]:.2f},')
    print(f'    "owe_key": {fits["forced add"][1]:.2f}, '
          f'"post": {fits["forced add, exhausting (board)"][1] - fits["forced add"][1]:.2f}, '
          f'"board_read": {board_key:.3f},')
    print(f'    "native_new": {native["new keys"]:.2f}, '
          f'"native_present": {native["keys present"]:.2f}, '
          f'"native_append": {native[APPEND]:.2f},')
    print("}")


if __name__ == "__main__":
    main()
