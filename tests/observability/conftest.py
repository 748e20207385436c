"""Components other tests left behind (a breaker and its machine form a reference cycle)
report until the garbage collector frees them: collect first, so each test sees its own
(and OpenTelemetry's per-metric cardinality limit is not spent on leftovers)."""

from __future__ import annotations

import gc

import pytest


@pytest.fixture(autouse=True)
def _collect_leftovers() -> None:
    gc.collect()
