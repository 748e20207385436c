"""Every ```python block of docs/redis.md runs against the private servers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "redis.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


def test_the_doc_has_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index: int, redis_url: str, cluster_url: str) -> None:
    exec(compile(BLOCKS[index], f"docs/redis.md[{index}]", "exec"),
         {"REDIS_URL": redis_url, "CLUSTER_URL": cluster_url, "__name__": "__doc__"})


def test_cited_redis_tests_exist() -> None:
    """Every ``tests/redis/<file>.py::<test>`` the docs cite is a test of that file."""
    docs = DOC.parent
    cited = set()
    for page in ("redis.md", "failure-behaviour.md", "architecture.md"):
        cited |= set(re.findall(r"tests/redis/(test_\w+\.py)::(test_\w+)",
                                (docs / page).read_text(encoding="utf-8")))
    assert len(cited) >= 6
    for file, name in cited:
        text = (DOC.parents[1] / "tests" / "redis" / file).read_text(encoding="utf-8")
        assert re.search(rf"^(?:async )?def {name}\(", text, re.MULTILINE), (file, name)
