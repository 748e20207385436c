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


USER_DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]


def test_readme_links_every_doc() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [d for d in USER_DOCS[1:] if f"]({d})" not in readme]
    assert not missing, missing


@pytest.mark.parametrize("name", USER_DOCS)
def test_user_docs_speak_to_users(name: str) -> None:
    """No internal planning words, and no install from a package index that has no
    release (install from source)."""
    text = (ROOT / name).read_text(encoding="utf-8")
    internal = re.compile(r"DESIGN\.md|shared/|\bissues? \d+|\bthe issue\b|seed document|"
                          r"\bwave\b|design guide", re.IGNORECASE)
    assert not [m.group(0) for m in internal.finditer(text)], name
    assert not re.search(r"pip install ['\"]?stormguard", text), name
