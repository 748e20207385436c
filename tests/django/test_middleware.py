"""stormguard.integrations.django.RateLimitMiddleware with Django's test client: anonymous
requests by client IP, logged-in users by id, a store failure following on_error, the
async chain, and bad settings naming the setting."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client
from pytest_django.fixtures import Settings as SettingsWrapper

from stormguard import AsyncRateLimiter, MemoryStore, RateLimiter
from stormguard.integrations.django import RateLimitMiddleware
from stormguard.testing import FakeClock
from tests.redis_servers import free_port

PER_IP = {"name": "per-ip", "scope": "ip", "limit": 2, "window": 60,
          "algorithm": "fixed_window"}
PER_USER = {"name": "per-user", "scope": "user", "limit": 3, "window": 60,
            "algorithm": "fixed_window"}


def _limiter(**options: Any) -> RateLimiter:
    return RateLimiter(MemoryStore(clock=FakeClock()), **options)


def test_anonymous_requests_count_by_client_ip(settings: SettingsWrapper) -> None:
    settings.STORMGUARD = {"limiter": _limiter(), "rules": [PER_IP],
                           "trusted_proxies": ["10.0.0.0/8"]}
    client = Client()
    spoof = {"HTTP_X_FORWARDED_FOR": "1.2.3.4"}  # from an untrusted peer: ignored
    responses = [client.get("/", REMOTE_ADDR="198.51.100.7", **spoof) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[0].content == b"hello"
    assert responses[0]["X-RateLimit-Limit"] == "2"
    assert responses[0]["X-RateLimit-Remaining"] == "1"
    assert responses[0]["RateLimit-Policy"] == '"per-ip";q=2;w=60'
    denied = responses[2]
    assert denied["Retry-After"] == "60"
    assert denied["Content-Type"] == "application/json"
    assert denied.json()["rule"] == "per-ip"
    assert denied.json()["error"] == "rate limit exceeded"
    # another client has its own counter; behind the trusted proxy, X-Forwarded-For counts
    assert client.get("/", REMOTE_ADDR="198.51.100.8").status_code == 200
    via_proxy = {"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "198.51.100.7"}
    assert client.get("/", **via_proxy).status_code == 429
    assert client.get("/", REMOTE_ADDR="10.0.0.1",
                      HTTP_X_FORWARDED_FOR="203.0.113.5").status_code == 200


@pytest.mark.django_db
def test_logged_in_users_count_by_user_id(settings: SettingsWrapper,
                                          django_user_model: Any) -> None:
    settings.STORMGUARD = {"limiter": _limiter(), "rules": [PER_USER, PER_IP]}
    alice = django_user_model.objects.create_user("alice", password="pw")
    bob = django_user_model.objects.create_user("bob", password="pw")
    client = Client(REMOTE_ADDR="198.51.100.7")
    client.force_login(alice)
    codes = [client.get("/").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]  # per-user (3), not the per-IP rule (2)
    denied = client.get("/")
    assert denied.json()["rule"] == "per-user"
    assert denied["X-RateLimit-Limit"] == "3"
    # another user from the same address, and an anonymous one, are counted apart
    other = Client(REMOTE_ADDR="198.51.100.7")
    other.force_login(bob)
    assert other.get("/").status_code == 200
    anonymous = Client(REMOTE_ADDR="198.51.100.7")
    assert [anonymous.get("/").status_code for _ in range(3)] == [200, 200, 429]
    assert alice.pk != bob.pk


def test_ip_scope_all_counts_logged_in_users_by_ip_too(settings: SettingsWrapper) -> None:
    settings.STORMGUARD = {"limiter": _limiter(), "rules": [PER_USER, PER_IP],
                           "ip_scope": "all"}
    client = Client(REMOTE_ADDR="198.51.100.9", HTTP_X_TEST_USER="7")
    assert [client.get("/").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/").json()["rule"] == "per-ip"


def test_store_failure_follows_on_error(settings: SettingsWrapper) -> None:
    down = f"stormguard+http://127.0.0.1:{free_port()}"  # a service that is not running
    settings.STORMGUARD = {"store": down, "on_error": "deny", "rules": [PER_IP]}
    r = Client().get("/")
    assert r.status_code == 429
    assert r.json()["degraded"] is True
    settings.STORMGUARD = {"store": down, "on_error": "allow", "rules": [PER_IP]}
    r = Client().get("/")
    assert r.status_code == 200
    assert r["X-RateLimit-Limit"] == "2"
    settings.STORMGUARD = {"store": down + "?timeout=0.2", "on_error": "local",
                           "rules": [PER_IP]}
    client = Client()
    assert [client.get("/").status_code for _ in range(3)] == [200, 200, 429]


def test_unmatched_requests_pass_without_headers(settings: SettingsWrapper) -> None:
    settings.STORMGUARD = {"limiter": _limiter(), "rules": [
        {**PER_IP, "endpoint": "POST /login"}]}
    r = Client().get("/")
    assert r.status_code == 200
    assert "X-RateLimit-Limit" not in r


def test_an_async_limiter_in_the_sync_chain(settings: SettingsWrapper) -> None:
    limiter = AsyncRateLimiter(MemoryStore(clock=FakeClock()))
    settings.STORMGUARD = {"limiter": limiter, "rules": [PER_IP]}
    client = Client()
    assert [client.get("/").status_code for _ in range(3)] == [200, 200, 429]


@pytest.mark.parametrize("limiter", [
    pytest.param(lambda: AsyncRateLimiter(MemoryStore(clock=FakeClock())), id="async"),
    pytest.param(_limiter, id="blocking-memory"),
    pytest.param(lambda: RateLimiter(f"stormguard+http://127.0.0.1:{free_port()}",
                                     on_error="deny"), id="blocking-in-a-thread"),
])
async def test_async_chain(settings: SettingsWrapper, limiter: Any) -> None:
    lim = limiter()
    settings.STORMGUARD = {"limiter": lim, "rules": [PER_USER, PER_IP]}
    client = AsyncClient(REMOTE_ADDR="198.51.100.7")
    if isinstance(lim, RateLimiter) and not isinstance(lim.store, MemoryStore):
        r = await client.get("/async")
        assert r.status_code == 429
        assert r.json()["degraded"] is True
        return
    anon = [(await client.get("/async")).status_code for _ in range(3)]
    assert anon == [200, 200, 429]
    user = [(await client.get("/async", headers={"X-Test-User": "7"})).status_code
            for _ in range(4)]
    assert user == [200, 200, 200, 429]
    r = await client.get("/async", headers={"X-Test-User": "8"})
    assert r.content == b"hello async"
    assert r["X-RateLimit-Remaining"] == "2"


def _build() -> RateLimitMiddleware:
    return RateLimitMiddleware(lambda request: HttpResponse())


@pytest.mark.parametrize(("conf", "message"), [
    (None, r"settings\.STORMGUARD: must be a dict"),
    ({}, r"settings\.STORMGUARD\['rules'\]: required"),
    ({"rules": [PER_IP], "rulez": 1}, r"settings\.STORMGUARD\['rulez'\]: unknown setting"),
    ({"rules": [{**PER_IP, "scope": "planet"}]},
     r"settings\.STORMGUARD\['rules'\]: .*scope"),
    ({"rules": "/no/such/rules.yaml"}, r"settings\.STORMGUARD\['rules'\]: .*no/such"),
    ({"rules": [PER_IP], "store": "mongodb://x"}, r"settings\.STORMGUARD\['store'\]: "),
    ({"rules": [PER_IP], "on_error": "maybe"}, r"settings\.STORMGUARD\['on_error'\]: "),
    ({"rules": [PER_IP], "limiter": "no.such.limiter"},
     r"settings\.STORMGUARD\['limiter'\]: cannot import"),
    ({"rules": [PER_IP], "limiter": "stormguard.RateLimiter"},
     r"settings\.STORMGUARD\['limiter'\]: must be a RateLimiter"),
    ({"rules": [PER_IP], "limiter": _limiter(), "store": "memory://"},
     r"settings\.STORMGUARD\['limiter'\]: give either"),
    ({"rules": [PER_IP], "trusted_proxies": ["nonsense"]},
     r"settings\.STORMGUARD\['trusted_proxies'\]: "),
    ({"rules": [PER_IP], "tier": 42}, r"settings\.STORMGUARD\['tier'\]: must be a callable"),
    ({"rules": [PER_IP], "ip_scope": "some"}, r"settings\.STORMGUARD\['ip_scope'\]: "),
])
def test_bad_settings_name_the_setting(settings: SettingsWrapper, conf: Any,
                                       message: str) -> None:
    if conf is None:
        del settings.STORMGUARD
    else:
        settings.STORMGUARD = conf
    with pytest.raises(ImproperlyConfigured, match=message):
        _build()


def test_middleware_before_authentication_is_refused(settings: SettingsWrapper) -> None:
    settings.MIDDLEWARE = [
        "stormguard.integrations.django.RateLimitMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
    ]
    with pytest.raises(ImproperlyConfigured, match="must come after"):
        _build()


def test_tier_from_a_dotted_path(settings: SettingsWrapper) -> None:
    settings.STORMGUARD = {"limiter": _limiter(), "tier": "tests.django.test_middleware.tier",
                           "rules": [{**PER_IP, "tier": "free", "limit": 1}]}
    client = Client()
    assert [client.get("/").status_code for _ in range(2)] == [200, 429]
    assert [client.get("/", HTTP_X_TIER="paid").status_code for _ in range(2)] == [200, 200]


def tier(request: HttpRequest) -> str:
    return request.headers.get("X-Tier", "free")


def test_exempt_paths_and_the_epoch_reset_header(settings: SettingsWrapper) -> None:
    clock = FakeClock(start=1_700_000_040.0)
    settings.STORMGUARD = {"limiter": RateLimiter(MemoryStore(clock=clock)),
                           "rules": [PER_IP], "exempt": ["/async*"], "reset_header": "epoch"}
    client = Client()
    for _ in range(3):  # exempt: neither checked nor given headers
        r = client.get("/async")
        assert r.status_code == 200
        assert "X-RateLimit-Limit" not in r
    r = client.get("/")
    assert r["X-RateLimit-Reset"] == "1700000100"  # epoch seconds: the fixed window's end
    assert client.get("/").status_code == 200
    assert client.get("/").status_code == 429


async def test_exempt_paths_in_the_async_chain(settings: SettingsWrapper) -> None:
    settings.STORMGUARD = {"limiter": _limiter(), "rules": [{**PER_IP, "limit": 1}],
                           "exempt": ["/async"]}
    client = AsyncClient()
    assert [(await client.get("/async")).status_code for _ in range(3)] == [200, 200, 200]


@pytest.mark.parametrize(("conf", "message"), [
    ({"rules": [PER_IP], "exempt": [42]}, r"settings\.STORMGUARD\['exempt'\]: "),
    ({"rules": [PER_IP], "reset_header": "unix"}, r"settings\.STORMGUARD\['reset_header'\]: "),
])
def test_bad_exempt_and_reset_header(settings: SettingsWrapper, conf: Any,
                                     message: str) -> None:
    settings.STORMGUARD = conf
    with pytest.raises(ImproperlyConfigured, match=message):
        _build()
