"""The stormguard command, in-process, plus one end-to-end run of ``stormguard serve``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stormguard import MemoryStore
from stormguard.cli import main
from stormguard.ratelimit.rules import RuleSet
from stormguard.stores import _REGISTRY, register
from tests.redis_servers import free_port
from tests.service.helpers import DownStore, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_RULES = ROOT / "examples" / "rules.yaml"


@pytest.fixture
def schemes() -> Iterator[None]:
    """A shared in-process store under test:// and a broken one under down://."""
    shared = MemoryStore()
    register("test", lambda url, **kw: shared)
    register("down", lambda url, **kw: DownStore())
    yield
    _REGISTRY.pop("test")
    _REGISTRY.pop("down")


def test_rules_validate(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["rules", "validate", str(EXAMPLE_RULES)]) == 0
    assert "4 rules OK" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {name: a, scope: ip, limit: 0, window: 1}\n- {name: b, scope: x}\n")
    assert main(["rules", "validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "nothing would be applied" in err
    assert "rule 'a': field 'limit'" in err
    assert "rule 'b': field 'limit': is required" in err
    assert main(["rules", "validate", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_check_human_and_json(capsys: pytest.CaptureFixture[str], schemes: None) -> None:
    args = ["check", "user:1", "search-per-user", "--rules", str(EXAMPLE_RULES),
            "--store", "test://"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("allowed: user:1 under search-per-user")
    assert "4 of 5 left" in out
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["allowed"] is True
    assert d["remaining"] == 3
    assert d["rule"] == "search-per-user"
    for _ in range(3):
        main(args)
    capsys.readouterr()
    assert main(args) == 1
    assert capsys.readouterr().out.startswith("denied: user:1 under search-per-user")
    assert main(["check", "k", "1/minute", "--store", "test://", "--json"]) == 0
    assert main(["check", "k", "1/minute", "--store", "test://", "--json"]) == 1
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["allowed"] is False


def test_check_errors(capsys: pytest.CaptureFixture[str], schemes: None) -> None:
    assert main(["check", "k", "1/minute", "--store", "down://"]) == 3
    assert "backend down" in capsys.readouterr().err
    assert main(["check", "k", "no-such-rule"]) == 2
    assert "unknown rule 'no-such-rule'" in capsys.readouterr().err
    assert main(["check", "k", "1/minute", "--store", "nope://x"]) == 2
    assert "unknown scheme" in capsys.readouterr().err
    assert main(["check", "k", "1/minute", "--cost", "5"]) == 2
    assert "cost" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["bogus"], ["serve", "--port", "x"],
                                  ["serve", "--port", "70000"], ["check", "onlykey"],
                                  ["serve", "--on-error", "maybe"], ["rules"]])
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_serve_refuses_bad_configuration(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    assert main(["serve", "--rules", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["serve", "--store", "gopher://x"]) == 2
    assert "unknown scheme" in capsys.readouterr().err


def test_env_vars_are_defaults(monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STORMGUARD_PORT", "not-a-port")
    assert main(["serve"]) == 2
    assert "STORMGUARD_PORT" in capsys.readouterr().err
    monkeypatch.setenv("STORMGUARD_STORE", "gopher://x")
    assert main(["check", "k", "1/minute"]) == 2


def test_python_dash_m_help() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, "-m", "stormguard", "--help"], env=env,
                       capture_output=True, text=True, timeout=30, check=False)
    assert p.returncode == 0
    assert "serve" in p.stdout
    assert "check" in p.stdout


def test_end_to_end_serve_process(tmp_path: Path) -> None:
    """``python -m stormguard serve`` as a real process on a free port: checks, the
    control plane persisting to the rules file, then SIGTERM and a clean exit."""
    rules = tmp_path / "rules.yaml"
    shutil.copy(EXAMPLE_RULES, rules)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "STORMGUARD_RULES": str(rules),
           "STORMGUARD_ADMIN_TOKEN": "e2e-token", "STORMGUARD_HOST": "127.0.0.1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stormguard", "serve", "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        with httpx.Client(base_url=base, timeout=5) as c:
            body = {"user": "42", "method": "GET", "path": "/search"}
            answers = [c.post("/v1/check", json=body) for _ in range(6)]
            assert [a.json()["allowed"] for a in answers] == [True] * 5 + [False]
            assert 1 <= int(answers[5].headers["retry-after"]) <= 120  # real clock, 2 windows
            assert c.get("/readyz").json()["status"] == "ready"
            auth = {"Authorization": "Bearer e2e-token"}
            etag = c.get("/v1/rules", headers=auth).headers["etag"]
            r = c.put("/v1/rules/login", headers={**auth, "If-Match": etag},
                      json={"scope": "ip", "endpoint": "POST /login", "limit": 3,
                            "window": "5m"})
            assert r.status_code == 201
            assert "login" in RuleSet.load(rules)  # persisted atomically to the file
            assert c.post("/v1/check", content=b"{oops").status_code == 400
            assert "stormguard_checks_total" in c.get("/metrics").text
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Shutting down" in err
    assert "Finished server process" in err
