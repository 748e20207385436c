"""The URLconf of the Django tests: a sync and an async view, and a test-only middleware
that logs a fake user in from a header (async tests: no database thread to share)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.urls import path


class FakeUser:
    is_authenticated = True

    def __init__(self, pk: str) -> None:
        self.pk = pk


class FakeUserMiddleware:
    """``X-Test-User: 7`` makes the request's user an authenticated user with pk 7."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def _login(self, request: HttpRequest) -> None:
        pk = request.headers.get("X-Test-User")
        if pk:
            user = FakeUser(pk)
            request.user = user  # type: ignore[assignment]

            async def auser() -> FakeUser:
                return user

            request.auser = auser  # type: ignore[attr-defined]

    def __call__(self, request: HttpRequest) -> Any:
        self._login(request)
        return self.get_response(request)


def hello(request: HttpRequest) -> HttpResponse:
    return HttpResponse("hello")


async def ahello(request: HttpRequest) -> HttpResponse:
    return HttpResponse("hello async")


urlpatterns = [path("", hello), path("async", ahello)]
