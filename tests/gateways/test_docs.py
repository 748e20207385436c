"""docs/deployment.md: the python examples run, the envoyproxy/ratelimit YAML loads and
matches as the page says, the console lines parse, and the error it shows is the error
stormguard gives. (Its nginx blocks run in test_nginx.py.)"""

from __future__ import annotations

import re
import shlex

import pytest

from stormguard.cli import _parser
from stormguard.gateways import EnvoyConfigError, loads_envoy_config
from tests.gateways.conftest import ROOT

DOC = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.DOTALL)


@pytest.mark.parametrize("code", blocks("python"), ids=lambda c: c.splitlines()[0][:40])
def test_python_examples_run(code: str) -> None:
    exec(compile(code, "docs/deployment.md", "exec"), {"__name__": "docs_example"})


def _envoy_yaml() -> str:
    (text,) = [b for b in blocks("yaml") if b.startswith("domain:")]
    return text


def test_the_envoy_example_matches_as_described() -> None:
    config = loads_envoy_config(_envoy_yaml())
    look = config.lookup
    marketing = look("messaging", [("message_type", "marketing"), ("to_number", "1")])
    assert marketing is not None
    assert marketing.requests_per_unit == 5
    number = look("messaging", [("to_number", "1")])
    assert number is not None
    assert number.requests_per_unit == 100
    export = look("messaging", [("path", "/api/v2/export")])
    assert export is not None
    assert export.requests_per_unit == 2  # the first wildcard in file order
    api = look("messaging", [("path", "/api/users")])
    assert api is not None
    assert api.rule is not None
    assert api.rule.algorithm == "sliding_window_counter"
    tenant = look("messaging", [("tenant", "t1")])
    assert tenant is not None
    assert tenant.rule is not None
    assert (tenant.rule.algorithm, tenant.rule.capacity) == ("token_bucket", 500)


def test_the_error_shown_is_the_error_given() -> None:
    (shown,) = blocks("text")
    prefix = "stormguard: error: --envoy-config: "
    assert shown.startswith(prefix)
    bad = _envoy_yaml().replace("unit: day\n", "unit: days\n", 1)
    with pytest.raises(EnvoyConfigError) as info:
        loads_envoy_config(bad, "/etc/ratelimit/config/messaging.yaml")
    assert shown.strip() == prefix + str(info.value)


def test_console_lines_parse() -> None:
    lines = [ln[2:] for b in blocks("console") for ln in b.splitlines() if ln.startswith("$ ")]
    assert len(lines) == 2
    for line in lines:
        argv = shlex.split(line)
        assert argv[:2] == ["stormguard", "serve"]
        _parser().parse_args(argv[1:])
