"""``stormguard queue stats|dead|retry-dead URL``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stormguard.cli import main
from stormguard.queue import DeferredQueue


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    q = DeferredQueue(url)
    q.defer("send_sms", {"order": 1, "to": "+8801700000000"})
    q.defer("send_fax", {"order": 2})
    q.defer("send_sms", {"order": 3, "to": "bad"})

    def send(order: int, to: str) -> None:
        if to == "bad":
            raise ValueError("invalid number")

    assert q.worker({"send_sms": send}, max_attempts=1).drain(timeout=30)
    q.close()
    return url


def test_stats(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue", "stats", url]) == 0
    assert json.loads(capsys.readouterr().out) == {"pending": 0, "in_flight": 0, "dead": 2}


def test_dead_and_retry_dead(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue", "dead", url, "--json"]) == 0
    letters = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(d["task"], d["payload"], d["attempts"]) for d in letters] == [
        ("send_fax", {"order": 2}, 0), ("send_sms", {"order": 3, "to": "bad"}, 1)]
    assert "unknown task 'send_fax'" in letters[0]["error"]
    assert letters[1]["error"] == "ValueError: invalid number"
    assert main(["queue", "dead", url]) == 0
    captured = capsys.readouterr()
    assert "ValueError: invalid number" in captured.out
    assert "2 dead letters" in captured.err
    assert main(["queue", "retry-dead", url]) == 0
    assert capsys.readouterr().out.strip() == "2 dead letters back to pending"
    assert main(["queue", "stats", url]) == 0
    assert json.loads(capsys.readouterr().out) == {"pending": 2, "in_flight": 0, "dead": 0}


def test_redis_queue_stats(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = DeferredQueue(redis_url, stream="cli")
    q.defer("send_sms", {"order": 1})
    q.close()
    assert main(["queue", "stats", redis_url, "--stream", "cli"]) == 0
    assert json.loads(capsys.readouterr().out) == {"pending": 1, "in_flight": 0, "dead": 0}


def test_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue", "stats", f"sqlite:///{tmp_path}/missing.db"]) == 2
    assert "no such queue file" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()  # inspecting never creates a queue
    assert main(["queue", "stats", "ftp://x"]) == 2
    assert "unknown scheme 'ftp'" in capsys.readouterr().err
    assert main(["queue", "stats", "redis://127.0.0.1:1/0"]) == 3  # nothing listens there
    assert "Connection refused" in capsys.readouterr().err
    assert main(["queue", "bogus", "memory://"]) == 2
    assert main(["queue", "stats", "memory://", "--bogus"]) == 2
    assert "--bogus" in capsys.readouterr().err
