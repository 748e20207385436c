"""The simulator drives the real Shedder and deferred-queue Worker through their public
API only: its inbound model reads no private attribute of another object and imports no
private name from outside the simulator."""

from __future__ import annotations

import ast
from pathlib import Path

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
