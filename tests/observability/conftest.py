"""Components other tests left behind (a breaker and its machine form a reference cycle)
report until the garbage collector frees them: collect first, so each test sees its own
(and OpenTelemetry's per-metric cardinality limit is not spent on leftovers).

A full collection walks every object the process holds (a second and more late in the
suite's run, before each test): what was alive when a module starts is collected once
then frozen out of the collector's sight (``gc.freeze``) until the module ends, so the
collection before each test, and the ones tests make themselves, walk only what the
module's tests made since."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def _freeze_what_came_before() -> Iterator[None]:
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _collect_leftovers(_freeze_what_came_before: None) -> None:
    gc.collect()
