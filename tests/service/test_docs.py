"""Every example in docs/service.md runs: python blocks exec'd, yaml blocks loaded as
rules, console lines run through the CLI (``serve`` lines parsed only)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from stormguard.cli import _parser, main
from stormguard.ratelimit.rules import RuleSet

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "service.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.DOTALL)


@pytest.mark.parametrize("code", _blocks("python"), ids=lambda c: c.splitlines()[0][:40])
def test_python_examples_run(code: str) -> None:
    exec(compile(code, "docs/service.md", "exec"), {"__name__": "docs_example"})


def test_yaml_examples_are_valid_rules() -> None:
    blocks = _blocks("yaml")
    assert blocks
    for block in blocks:
        assert len(RuleSet.loads(block)) > 0


def test_console_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    lines = [line[2:] for block in _blocks("console") for line in block.splitlines()
             if line.startswith("$ ")]
    assert len(lines) == 4
    for line in lines:
        argv = shlex.split(line)
        assert argv[0] == "stormguard"
        if argv[1] == "serve":
            args = _parser().parse_args(argv[1:])
            assert args.port == 8080
        else:
            assert main(argv[1:]) == 0, line


async def test_readme_service_commands() -> None:
    """The README's service block: the serve flags parse, and each curl body is a valid
    check that the service (with those rules) allows."""
    import httpx

    from stormguard import AsyncRateLimiter
    from stormguard.service import create_app

    readme = (ROOT / "README.md").read_text()
    block = readme.split("## The rate-limit service", 1)[1]
    commands = re.findall(r"```bash\n(.*?)```", block, flags=re.DOTALL)[0].splitlines()
    serve = shlex.split(commands[0].split("&")[0])
    args = _parser().parse_args(serve[1:])
    app = create_app(AsyncRateLimiter("memory://"), rules=ROOT / args.rules, admin_token=None)
    bodies = [shlex.split(c)[shlex.split(c).index("-d") + 1] for c in commands[1:]]
    assert len(bodies) == 2
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://localhost:8080") as c:
        for body in bodies:
            r = await c.post("/v1/check", content=body)
            assert r.status_code == 200, r.text
            assert r.json()["allowed"] is True
            assert r.json()["rule"] == "search-per-user"


def test_failure_behaviour_names_tests_that_exist() -> None:
    """Every test the table of docs/failure-behaviour.md cites is a test of the suite."""
    page = (ROOT / "docs" / "failure-behaviour.md").read_text()
    cited = set(re.findall(r"`(?:tests/service/\w+\.py::)?(test_\w+)`", page))
    assert len(cited) >= 15
    defined = set()
    for path in (ROOT / "tests" / "service").glob("test_*.py"):
        defined |= set(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(),
                                  flags=re.MULTILINE))
    assert cited <= defined, cited - defined
    assert "## Redis and Redis Cluster" in page
