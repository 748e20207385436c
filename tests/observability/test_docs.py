"""Every ```python block of docs/observability.md runs, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_observability_doc_blocks_run() -> None:
    name = "docs/observability.md"
    found = BLOCK.findall((ROOT / name).read_text(encoding="utf-8"))
    assert len(found) >= 4
    namespace: dict[str, object] = {"__name__": f"doc:{name}"}
    for i, code in enumerate(found):
        exec(compile(code, f"{name}[block {i}]", "exec"), namespace)


def test_the_doc_shows_a_screenshot_of_the_dashboard() -> None:
    assert (ROOT / "docs" / "images" / "dashboard.png").stat().st_size > 10_000
    assert "](images/dashboard.png)" in (ROOT / "docs" / "observability.md").read_text(
        encoding="utf-8")
