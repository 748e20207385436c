"""Property-based fuzz of the HTTP API: no input makes it answer 500."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stormguard import AsyncRateLimiter, MemoryStore
from stormguard.ratelimit.rules import FIELDS
from stormguard.service import create_app
from stormguard.testing import FakeClock
from tests.service.helpers import AUTH, RULES, TOKEN

json_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
                | st.floats(allow_nan=False) | st.text(max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)
names = st.sampled_from(["search", "per-ip", "dry", "nope", "", "x" * 70, "a b", "é"])
check_fields = st.fixed_dictionaries({}, optional={
    "key": st.text(max_size=30) | json_values, "rule": names | json_values,
    "cost": st.integers(min_value=-5, max_value=10) | json_values,
    "user": st.text(max_size=10) | json_values, "ip": st.text(max_size=10),
    "method": st.sampled_from(["GET", "POST", "get", "", "FOO"]),
    "path": st.text(max_size=20), "tier": st.text(max_size=5), "api_key": st.text(max_size=5),
    "bogus": json_values})
rule_fields = st.fixed_dictionaries({}, optional={
    "name": names, "scope": st.sampled_from(["user", "ip", "api_key", "global", "moon"])
    | json_values,
    "endpoint": st.sampled_from(["GET /x*", "/y", "FOO /z", "*", "nope", ""]) | json_values,
    "tier": json_values, "limit": st.integers(min_value=-3, max_value=1000) | json_values,
    "window": st.sampled_from([1, 0, -1, 60, "1m", "x", 1e308, 0.0001]) | json_values,
    "algorithm": st.sampled_from(["gcra", "token_bucket", "fixed_window", "zzz"]),
    "burst": st.integers(min_value=-1, max_value=50) | json_values,
    "shadow": json_values, "extra": json_values})
bodies = (check_fields.map(lambda d: json.dumps(d).encode())
          | json_values.map(lambda v: json.dumps(v).encode())
          | st.binary(max_size=200))
requests = st.one_of(
    st.tuples(st.just("POST"), st.just("/v1/check"), bodies),
    st.tuples(st.just("POST"), st.just("/v1/check/batch"),
              st.lists(check_fields, max_size=5).map(
                  lambda xs: json.dumps({"checks": xs}).encode()) | bodies),
    st.tuples(st.just("PUT"), st.just("/v1/rules"),
              st.lists(rule_fields, max_size=3).map(lambda xs: json.dumps(xs).encode())
              | bodies),
    st.tuples(st.just("PUT"), names.map(lambda n: f"/v1/rules/{n or 'x'}"),
              rule_fields.map(lambda d: json.dumps(d).encode()) | bodies),
    st.tuples(st.sampled_from(["GET", "DELETE", "PATCH", "POST"]),
              st.sampled_from(["/v1/rules", "/v1/rules/search", "/v1/rules/nope", "/healthz",
                               "/readyz", "/metrics", "/openapi.json", "/v1/check", "/",
                               "/v1/rules/%00"]),
              st.binary(max_size=20)),
)
headers = st.sampled_from([{}, AUTH, {**AUTH, "If-Match": '"0"'}, {**AUTH, "If-Match": "junk"},
                           {"Authorization": "Bearer"}, {**AUTH, "Content-Length": "abc"}])
assert set(FIELDS) <= set(rule_fields.wrapped_strategy.optional)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(st.tuples(requests, headers), min_size=1, max_size=4))
def test_no_input_answers_500(loop: asyncio.AbstractEventLoop,
                              reqs: list[tuple[tuple[str, str, bytes], dict[str, str]]]) -> None:
    app = create_app(AsyncRateLimiter(MemoryStore(clock=FakeClock())), RULES,
                     admin_token=TOKEN)

    async def run() -> list[tuple[int, Any]]:
        out = []
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://sg") as c:
            for (method, path, body), hdrs in reqs:
                r = await c.request(method, path, content=body, headers=hdrs)
                out.append((r.status_code, r))
        return out

    for status, r in loop.run_until_complete(run()):
        assert status < 500, r.text
        if r.request.url.path != "/metrics":
            r.json()  # every answer, errors included, is JSON
