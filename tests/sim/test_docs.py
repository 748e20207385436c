"""Every ```python block of docs/simulation.md runs, in order, as written."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "simulation.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)


def test_the_doc_has_examples_that_assert() -> None:
    assert len(BLOCKS) >= 3
    assert sum(code.count("assert ") for code in BLOCKS) >= 8


def test_examples_run(capsys: object) -> None:
    from stormguard.sim.policies import POLICIES

    before = dict(POLICIES)
    namespace: dict[str, object] = {"__name__": "docs_example"}
    try:
        for i, code in enumerate(BLOCKS):
            exec(compile(code, f"{DOC}[block {i}]", "exec"), namespace)
    finally:  # the example registers a policy: leave the registry as it was
        POLICIES.clear()
        POLICIES.update(before)


def test_the_yaml_example_is_a_valid_scenario() -> None:
    from stormguard.sim.scenario import load

    block = re.search(r"^```yaml\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)
    assert block is not None
    scenario = load(block.group(1))
    assert scenario.name == "checkout-night"
    assert scenario.traffic[0]["clients"][0]["retry"]["attempts"] == 4
