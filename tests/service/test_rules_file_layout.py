"""Control-plane writes keep the user's rules file as they wrote it: comments, key order,
quoting and layout; only what changed is rewritten (a YAML round trip)."""

from __future__ import annotations

import difflib
import shutil
import sys
from pathlib import Path

import httpx
import pytest

from stormguard import AsyncRateLimiter, MemoryStore
from stormguard.ruleset import RuleSet
from stormguard.service import create_app
from stormguard.service.rulesfile import render
from stormguard.testing import FakeClock
from tests.service.helpers import AUTH, TOKEN

ROOT = Path(__file__).resolve().parents[2]


def _changes(before: str, after: str) -> list[str]:
    return [line for line in difflib.ndiff(before.splitlines(), after.splitlines())
            if line[:1] in "+-"]  # "?" lines: ndiff's hints


async def test_comments_and_layout_survive_control_plane_writes(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    shutil.copy(ROOT / "examples" / "rules.yaml", path)
    original = path.read_text()
    app = create_app(AsyncRateLimiter(MemoryStore(clock=FakeClock())), rules_path=path,
                     admin_token=TOKEN, poll_interval=0)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://sg") as c:
        r = await c.put("/v1/rules/login", headers=AUTH,
                        json={"scope": "ip", "endpoint": "POST /login", "limit": 3,
                              "window": "5m"})
        assert r.status_code == 201
        after_add = path.read_text()
        assert _changes(original, after_add) == [
            "+ version: 1", "+   - name: login", "+     scope: ip",
            '+     endpoint: POST /login', "+     limit: 3", "+     window: 300"]

        rule = (await c.get("/v1/rules/search-per-user", headers=AUTH)).json()["rule"]
        r = await c.put("/v1/rules/search-per-user", headers=AUTH, json={**rule, "limit": 7})
        assert r.status_code == 200
        after_edit = path.read_text()
        assert _changes(after_add, after_edit) == [
            "- version: 1", "+ version: 2", "-     limit: 5", "+     limit: 7"]
        # the name line's comment is still there, though it now says 5 (the user's words)
        assert "- name: search-per-user        # a signed-in user may search 5" in after_edit

        r = await c.delete("/v1/rules/anonymous-per-ip", headers=AUTH)
        assert r.status_code == 200
        after_delete = path.read_text()
    removed = [c for c in _changes(after_edit, after_delete) if c[0] == "-"]
    assert "-   - name: anonymous-per-ip       # everyone, by client IP" in removed
    assert all(line in after_delete for line in original.splitlines()
               if "anonymous-per-ip" not in line and "limit: 5" not in line
               and line not in ("    scope: ip", "    limit: 60"))
    assert original.splitlines()[:2] == after_delete.splitlines()[:2]  # header comments
    loaded = RuleSet.load(path)
    assert loaded.version == 3
    assert [r.name for r in loaded] == ["search-per-user", "free-api",
                                        "tight-search-dry-run", "login"]


def test_flow_style_list_file_keeps_its_style_and_gets_a_version() -> None:
    text = ("# my limits\n"
            "- {name: a, scope: ip, limit: 5, window: 1m}   # per client\n"
            "- {name: b, scope: user, limit: 9, window: '30s'}\n")
    rules = RuleSet.loads(text)
    new = RuleSet([*rules.rules[:1]], version=4)
    out = render(text, new)
    assert "# my limits" in out
    assert "- {name: a, scope: ip, limit: 5, window: 1m}   # per client" in out
    assert "name: b" not in out
    back = RuleSet.loads(out)
    assert back == new
    assert back.version == 4


def test_changed_field_keeps_the_other_fields_as_written() -> None:
    text = ("rules:\n"
            "  - name: a\n"
            "    limit: 5        # five\n"
            "    scope: ip\n"
            "    window: \"1m\"\n"
            "    shadow: false\n")
    spec = RuleSet.loads(text).rules[0]
    changed = RuleSet.from_data([{**spec.to_dict(), "limit": 6}], version=1)
    out = render(text, changed)
    assert out == text.replace("rules:", "version: 1\nrules:").replace("5  ", "6  ")


def test_without_ruamel_the_file_is_rewritten_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ruamel", None)
    monkeypatch.setitem(sys.modules, "ruamel.yaml", None)
    rules = RuleSet.from_data([{"name": "a", "scope": "ip", "limit": 5, "window": 60}],
                              version=2)
    assert render("# gone\n- {name: a, scope: ip, limit: 1, window: 1}\n", rules) == \
        rules.dumps()


def test_a_generated_rule_set_is_rewritten_whole(caplog: pytest.LogCaptureFixture) -> None:
    """Past MAX_ROUND_TRIP rules the pure-Python round trip would cost seconds of CPU."""
    from stormguard.service.rulesfile import MAX_ROUND_TRIP

    rules = RuleSet.from_data([{"name": f"r{i}", "scope": "ip", "limit": 5, "window": 60}
                               for i in range(MAX_ROUND_TRIP + 1)], version=1)
    assert render("# generated\n", rules) == rules.dumps()
    assert "rewritten whole" in caplog.text
