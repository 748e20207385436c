"""Every ```python block of docs/regions.md runs, against three private redis-server
processes (one per region, direct: the examples show the API, the latency tests are in
test_redis_regions.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer, start_redis

DOC = Path(__file__).resolve().parents[2] / "docs" / "regions.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, RedisServer]]:
    started = {r: start_redis() for r in ("us", "eu", "ap")}
    yield started
    for s in started.values():
        s.stop()


def test_the_doc_has_examples() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index: int, servers: dict[str, RedisServer]) -> None:
    for s in servers.values():
        s.client().flushall()
    exec(compile(BLOCKS[index], f"docs/regions.md[{index}]", "exec"),
         {"US_URL": servers["us"].url, "EU_URL": servers["eu"].url,
          "AP_URL": servers["ap"].url, "__name__": "__doc__"})


def test_cited_tests_exist() -> None:
    """Every ``tests/regional/<file>.py::<test>`` the docs cite is a test of that file."""
    docs = DOC.parent
    cited = set()
    for page in ("regions.md", "architecture.md"):
        cited |= set(re.findall(r"tests/regional/(test_\w+\.py)::(test_\w+)",
                                (docs / page).read_text(encoding="utf-8")))
    assert len(cited) >= 5
    for file, name in cited:
        text = (DOC.parents[1] / "tests" / "regional" / file).read_text(encoding="utf-8")
        assert re.search(rf"^(?:async )?def {name}\(", text, re.MULTILINE), (file, name)
