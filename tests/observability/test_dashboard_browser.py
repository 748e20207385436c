"""The dashboard in a real headless browser (Debian's chromium + chromium-driver, driven
by selenium) against a real ``stormguard serve`` process: the page loads with no console
error, its numbers move once checks are sent, and a screenshot is saved (set
``STORMGUARD_DASHBOARD_SCREENSHOT`` to a path to keep one, as docs/images/ does)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.redis_servers import free_port, start_redis

ROOT = Path(__file__).resolve().parents[2]
RULES = """\
rules:
  - name: login
    scope: user
    limit: 5
    window: 60
  - name: search
    scope: ip
    limit: 1000
    window: 60
"""
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def serve(tmp_path: Path, *extra: str, log: Path | None = None) -> Iterator[str]:
    """A real ``stormguard serve`` process on a free loopback port, stopped by PID
    (its stderr into ``log`` when given)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES, encoding="utf-8")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with contextlib.ExitStack() as files:
        err = files.enter_context(log.open("wb")) if log else subprocess.DEVNULL
        proc = subprocess.Popen([sys.executable, "-m", "stormguard", "serve", "--port",
                                 str(port), "--rules", str(rules), "--log-level", "warning",
                                 *extra], env=env, cwd=tmp_path, stderr=err)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "serve exited"
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.1)  # real time: a real server process starting
        yield url
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)  # real time: the real server process exits


@pytest.fixture
def service(tmp_path: Path) -> Iterator[str]:
    with serve(tmp_path) as url:
        yield url


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def number(driver: webdriver.Chrome, element_id: str) -> float:
    text = driver.find_element(By.ID, element_id).text.replace(",", "")
    return float(text or "nan")


def test_dashboard_is_live_in_a_real_browser(service: str, browser: webdriver.Chrome,
                                             tmp_path: Path) -> None:
    browser.get(f"{service}/dashboard")
    wait = WebDriverWait(browser, 15, poll_frequency=0.1)  # real time: the page polls 1/s
    wait.until(lambda d: d.find_element(By.ID, "updated").text.startswith("updated"))
    assert number(browser, "total-checks") == 0
    assert "memory" in browser.find_element(By.ID, "store").text.lower()

    stop = threading.Event()

    def traffic() -> None:  # a steady stream: allowed searches, a user hammering login
        with httpx.Client(base_url=service, timeout=5) as c:
            while not stop.is_set():
                c.post("/v1/check", json={"key": "ip:10.0.0.7", "rule": "search"})
                c.post("/v1/check", json={"key": "user:mallory", "rule": "login"})
                time.sleep(0.01)  # real time: paced traffic against the real server

    sender = threading.Thread(target=traffic)
    sender.start()
    try:
        wait.until(lambda d: number(d, "total-checks") > 0)
        wait.until(lambda d: number(d, "rate-denied") > 0 and number(d, "rate-allowed") > 0)
        wait.until(lambda d: "user:mallory" in d.find_element(By.ID, "top-keys").text)
    finally:
        stop.set()
        sender.join(10)
    rules_table = browser.find_element(By.ID, "rules").text
    assert "login" in rules_table
    assert "search" in rules_table
    first = number(browser, "total-checks")
    with httpx.Client(base_url=service, timeout=5) as c:
        for _ in range(20):
            c.post("/v1/check", json={"key": "user:eve", "rule": "login"})
    wait.until(lambda d: number(d, "total-checks") >= first + 20)
    wait.until(lambda d: "user:eve" in d.find_element(By.ID, "top-keys").text)

    shot = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("STORMGUARD_DASHBOARD_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, errors


def test_dashboard_shows_a_store_outage(tmp_path: Path, browser: webdriver.Chrome) -> None:
    """``serve`` over a real Redis, SIGKILLed while the page is open: the page says the
    store fails, counts the degraded decisions and shows the store's breaker open; the
    service's JSON log has one line for the start of it."""
    server = start_redis()
    log = tmp_path / "serve.log"
    try:
        with serve(tmp_path, "--store", server.url, "--log-format", "json", log=log) as url:
            browser.get(f"{url}/dashboard")
            wait = WebDriverWait(browser, 15, poll_frequency=0.1)  # real time: 1 poll/s
            wait.until(lambda d: "store answering" in d.find_element(By.ID, "health").text)
            assert "closed" in browser.find_element(By.ID, "breakers").text
            server.stop()
            with httpx.Client(base_url=url, timeout=5) as c:
                for _ in range(10):
                    r = c.post("/v1/check", json={"key": "user:1", "rule": "login"})
                    assert r.status_code == 200  # never a 500
                    assert r.json()["degraded"] is True
            wait.until(lambda d: "DEGRADED" in d.find_element(By.ID, "health").text)
            wait.until(lambda d: number(d, "degraded") == 10)
            wait.until(lambda d: "open" in d.find_element(By.ID, "breakers").text)
            errors = [e for e in browser.get_log("browser")
                      if e["level"] in ("SEVERE", "ERROR")]
            assert not errors, errors
    finally:
        server.stop()
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    started = [r for r in records if r.get("event") == "degraded_start"]
    assert len(started) == 1, records
    assert started[0]["level"] == "warning"
    assert started[0]["logger"] == "stormguard.service"
