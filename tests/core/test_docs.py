"""Every ```python block of the README and docs/concepts.md runs (in order, per file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks(name: str) -> list[str]:
    return BLOCK.findall((ROOT / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["README.md", "docs/concepts.md"])
def test_python_blocks_run(name: str) -> None:
    found = blocks(name)
    assert found, f"no python block in {name}"
    namespace: dict[str, object] = {"__name__": f"doc:{name}"}
    for i, code in enumerate(found):
        exec(compile(code, f"{name}[block {i}]", "exec"), namespace)


def test_concepts_blocks_assert_something() -> None:
    assert sum(code.count("assert ") for code in blocks("docs/concepts.md")) >= 10
