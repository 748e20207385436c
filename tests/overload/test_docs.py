"""Every ```python block of docs/overload.md runs, as written; the doc is linked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "overload.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_the_doc_has_examples_and_is_linked() -> None:
    assert len(BLOCKS) >= 4
    assert "docs/overload.md" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_example_runs(code: str) -> None:
    exec(compile(code, str(DOC), "exec"), {"__name__": "docs_example"})
