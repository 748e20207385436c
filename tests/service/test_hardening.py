"""Regression tests for the hostile-input defects of issue 11 (in-process, over
ASGITransport): lone surrogates, non-UTF-8 bodies, the work of one request, the admin
token's bytes, the rules file's mode and temporary files."""

from __future__ import annotations

import httpx
import pytest

from stormguard import AsyncRateLimiter, MemoryStore
from stormguard.service import create_app
from stormguard.testing import FakeClock
from tests.service.helpers import RULES


def _client(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                             base_url="http://sg")


# -- defect 7: a non-ASCII admin token ---------------------------------------------------

@pytest.mark.parametrize("token", ["pässwörd", "Ключ-доступа", "\U0001f511-key"])
async def test_non_ascii_admin_token_authenticates(clock: FakeClock, token: str) -> None:
    app = create_app(AsyncRateLimiter(MemoryStore(clock=clock)), RULES, admin_token=token)
    async with _client(app) as c:
        # the header as a client sends it: the token's UTF-8 bytes
        ok = {"Authorization": b"Bearer " + token.encode()}
        assert (await c.get("/v1/rules", headers=ok)).status_code == 200
        # the same characters in another encoding, or one character off, are refused
        latin1 = token.encode("utf-8").decode("latin-1").encode("utf-8")
        for wrong in (b"Bearer " + latin1, b"Bearer " + token.encode()[:-1],
                      b"Bearer " + token.upper().encode()):
            r = await c.get("/v1/rules", headers={"Authorization": wrong})
            assert r.status_code == 401, wrong


async def test_token_from_environment_with_non_ascii(clock: FakeClock,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORMGUARD_ADMIN_TOKEN", "pässwörd")
    app = create_app(AsyncRateLimiter(MemoryStore(clock=clock)), RULES)
    async with _client(app) as c:
        r = await c.get("/v1/rules", headers={"Authorization": "Bearer pässwörd".encode()})
        assert r.status_code == 200
