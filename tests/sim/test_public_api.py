"""The simulator drives the real Shedder and deferred-queue Worker through their public
API only: its inbound model reads no private attribute of another object and imports no
private name from outside the simulator."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import stormguard.sim.inbound as inbound


def test_the_inbound_model_uses_no_private_attribute_of_another_object() -> None:
    tree = ast.parse(Path(inbound.__file__).read_text("utf-8"))
    private = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            base = node.value
            if isinstance(base, ast.Name) and base.id == "self":
                continue  # its own classes' state
            private.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.module is not None \
                and node.module.startswith("stormguard.") \
                and not node.module.startswith("stormguard.sim."):
            private += [(node.lineno, f"from {node.module} import {a.name}")
                        for a in node.names if a.name.startswith("_")]
    assert private == []


def test_a_waiter_gives_up_after_its_own_tiers_queue_timeout() -> None:
    """Per-tier timeouts: in virtual time a sheddable request waits its tier's 0.05 s
    and a critical one its 0.25 s, as ``acquire_blocking`` waits on a thread (the
    longest of the tiers' timeouts for every tier was the old, wrong wait)."""
    from stormguard.overload.shedder import CRITICAL, SHEDDABLE, Shed, Shedder, Ticket
    from stormguard.sim.runtime import new_engine, spawn

    eng, clock = new_engine()
    shedder = Shedder(1, queue_timeout={"critical": 0.25, "sheddable": 0.05},
                      codel_target=10.0, clock=clock)
    held = shedder.acquire_blocking(CRITICAL)
    assert isinstance(held, Ticket)
    gave_up: dict[str, float] = {}
    event = inbound.waking(eng, clock)

    def wait(name: str, tier: int) -> None:
        got = inbound.acquire(shedder, tier, name, event)
        assert isinstance(got, Shed)
        gave_up[name] = clock.monotonic()

    spawn(eng, clock, wait, "sheddable", SHEDDABLE)
    spawn(eng, clock, wait, "critical", CRITICAL)
    eng.run(until=1.0)
    assert gave_up["sheddable"] == pytest.approx(0.05)
    assert gave_up["critical"] == pytest.approx(0.25)
