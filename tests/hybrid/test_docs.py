"""Every ```python block of docs/hybrid.md runs (against the session's private Redis)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "hybrid.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


def test_the_doc_has_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index: int, redis_url: str) -> None:
    exec(compile(BLOCKS[index], f"docs/hybrid.md[{index}]", "exec"),
         {"REDIS_URL": redis_url, "__name__": "__doc__"})


def test_cited_tests_exist() -> None:
    text = DOC.read_text(encoding="utf-8")
    for file in set(re.findall(r"tests/hybrid/(test_\w+\.py)", text)):
        assert (DOC.parents[1] / "tests" / "hybrid" / file).exists(), file
