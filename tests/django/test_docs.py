"""The Django section of docs/service.md runs: its settings block is exec'd into the
settings of a test, its usage block runs against the test URLconf."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.test import override_settings

from stormguard.integrations.django import RateLimitMiddleware

DOC = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()


def _block(tag: str) -> str:
    blocks = re.findall(rf"```python {tag}\n(.*?)```", DOC, flags=re.DOTALL)
    assert len(blocks) == 1, tag
    return blocks[0]


@pytest.mark.django_db
def test_django_example_runs() -> None:
    conf: dict[str, Any] = {}
    exec(compile(_block("django-settings"), "docs/service.md", "exec"), conf)
    with override_settings(MIDDLEWARE=conf["MIDDLEWARE"], STORMGUARD=conf["STORMGUARD"]):
        exec(compile(_block("django"), "docs/service.md", "exec"), {"__name__": "docs"})


def test_the_documented_message() -> None:
    quoted = re.search(r"`(settings\.STORMGUARD\['on_error'\]: .*?)`", DOC, flags=re.DOTALL)
    assert quoted is not None
    with override_settings(STORMGUARD={"rules": [], "on_error": "maybe"}), \
            pytest.raises(ImproperlyConfigured) as info:
        RateLimitMiddleware(lambda request: HttpResponse())
    assert str(info.value) == " ".join(quoted[1].split())
