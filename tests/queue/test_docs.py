"""Every ```python block of docs/queue.md runs, as written (in order, one namespace)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "queue.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_the_doc_examples_run() -> None:
    blocks = BLOCK.findall(DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 4
    assert sum(code.count("assert ") for code in blocks) >= 10
    for i, code in enumerate(blocks):
        exec(compile(code, f"{DOC}[block {i}]", "exec"), {"__name__": "docs_example"})


def test_readme_links_the_doc() -> None:
    assert "](docs/queue.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
