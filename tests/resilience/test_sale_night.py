"""The sale night (examples/sale_night.py) on a FakeClock, scaled down onto a SQLite queue.

Rates x 0.05 (50 orders/s, a 25/s pace, 1 checkout SMS worker, 5 queue workers), so every
ratio of the full night is kept: orders are twice the pace, the checkout's workers carry a
tenth of the orders at 200 ms. The slowdown lasts 90 s instead of 40 minutes (three
30-second breaker openings). The queue is SQLite with ``synchronous=FULL``, on a RAM disk
when there is one (the same code and fsync calls, made cheap: durability across SIGKILL is
tests/queue's subject).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sale_night", ROOT / "examples" /
                                                  "sale_night.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sale_night"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def queue_dir(tmp_path: Path) -> Path:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        d = shm / f"stormguard-sale-night-{os.getpid()}-{tmp_path.name}"
        d.mkdir()
        yield d
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    else:
        yield tmp_path


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_sale_night_scaled_down_on_sqlite(queue_dir: Path) -> None:
    sale = load_example()
    night = sale.Night().scaled(0.05, normal=10.0, slow_for=90.0, after=10.0,
                                queue=f"sqlite:///{queue_dir / 'sms.db'}")
    assert (night.orders_per_s, night.shaper_rate, night.bulkhead,
            night.worker_concurrency) == (50.0, 25.0, 1, 5)
    r = sale.simulate(night)
    print(sale.describe(night, r))
    assert r.orders == 5500
    # no order fails: every SMS is sent or deferred
    assert r.failed == 0
    assert r.sent_directly + r.deferred == r.orders
    assert r.sent_directly > 0
    assert r.deferred > 0
    # the breaker opens within 3 s of the slowdown (and again after each failed trial)
    assert r.first_open_after_slowdown is not None
    assert r.first_open_after_slowdown <= 3.0
    assert r.breaker_opened >= 3
    # SMS calls never hold more of the checkout's workers than its bulkhead
    assert r.checkout_max_in_flight <= night.bulkhead
    # the customer never waits for an SMS longer than the overall deadline
    assert r.checkout_max <= 3.0 + 1e-6
    # the provider never sees more than the contract in any second, the drain included
    assert r.provider_max_per_second <= night.shaper_rate
    assert r.after_recovery_max_per_second <= night.shaper_rate
    # every SMS delivered exactly once per idempotency key, nothing lost
    assert r.resubmitted > 0
    assert r.resubmitted_same_job == r.resubmitted
    assert r.delivered == r.orders
    assert r.duplicates == 0
    assert r.lost == 0
    assert r.queue_end == {"pending": 0, "in_flight": 0, "dead": 0}


def test_the_example_runs_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    sale = load_example()
    assert sale.main(["--scale", "0.01", "--slow-for", "40"]) == 0
    out = capsys.readouterr().out
    assert "failed orders: 0" in out
    assert "duplicates 0; lost 0" in out
