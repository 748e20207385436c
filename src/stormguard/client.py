"""A client for the rate-limit service: :class:`ServiceStore`, a :class:`~stormguard.Store`
whose counters live in a central ``stormguard serve``.

::

    limiter = AsyncRateLimiter(ServiceStore("http://limiter:8080"), on_error="local")
    decision = await limiter.hit("user:42", Rule.parse("100/minute"))

Each ``hit`` is one ``POST /v1/check``; the connections are kept (one ``httpx.Client``
for the blocking methods, one ``httpx.AsyncClient`` per event loop for the coroutines).
Concurrent ``ahit`` calls made in the same event-loop iteration (say the requests of one
``asyncio.gather``) go out as one ``POST /v1/check/batch`` (up to ``max_batch`` checks per
request). Every failure (connection refused, ``timeout``, a non-200 answer, a malformed
body) is a :class:`~stormguard.StorageError`, so the limiter's ``on_error`` decides.

**How a rule is sent** (``rules=``):

* ``"inline"`` (default): the rule's parameters, ``{"key", "limit", "window",
  "algorithm", "burst", "cost"}``; the service enforces exactly the rule the app gives.
  A named rule's name is folded into the key (``"<name>|<key>"``) so two rules with the
  same parameters keep separate counters, as they do in every other store.
* ``"named"``: ``{"key", "rule": rule.name}``: the service's rule of that name decides
  (its limit, as the service's rules file or control plane says; the rule given here
  names it). This shares counters with the service's own checks of ``key`` + rule.

What the service API does not offer is refused with a :class:`~stormguard.ConfigError`:
``peek``, ``reset``, and ``hit_all`` over more than one rule (the service checks one
rule per call; all-or-nothing over several could not be kept).
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx

from stormguard._core import validate
from stormguard._core.clock import Clock, system_clock
from stormguard._core.errors import ConfigError, StorageError
from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.rule import Rule
from stormguard.stores.base import Store, check_cost, check_rules, key_error

__all__ = ["ServiceError", "ServiceStore"]

RulesMode = Literal["inline", "named"]
_JSON = {"content-type": "application/json"}
_Answer = dict[str, Any]


class ServiceError(StorageError):
    """The service answered, but not with a decision: ``status`` is its HTTP status (None
    when it could not be reached or its answer was not a decision)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _LoopState:
    """What one event loop's coroutines share: the client and the checks not yet sent."""

    __slots__ = ("client", "pending", "scheduled", "tasks")

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.pending: list[tuple[bytes, asyncio.Future[_Answer]]] = []
        self.scheduled = False
        self.tasks: set[asyncio.Task[None]] = set()


class ServiceStore(Store):
    """A :class:`~stormguard.Store` backed by a ``stormguard serve`` at ``url``."""

    def __init__(self, url: str = "http://127.0.0.1:8080", *, timeout: float = 0.5,
                 rules: RulesMode = "inline", max_batch: int = 1000,
                 headers: Mapping[str, str] | None = None, clock: Clock | None = None,
                 transport: httpx.BaseTransport | None = None,
                 async_transport: httpx.AsyncBaseTransport | None = None) -> None:
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
            raise ConfigError("url", url, "must be an http:// or https:// URL of a "
                              "stormguard service, such as 'http://limiter:8080'")
        self.url = url.rstrip("/")
        self.timeout = validate.number("timeout", timeout)
        validate.one_of("rules", rules, ("inline", "named"))
        self.rules: RulesMode = rules
        self.max_batch = validate.integer("max_batch", max_batch)
        if self.max_batch > 1000:
            raise ConfigError("max_batch", max_batch, "the service takes at most 1000 "
                              "checks per batch")
        self.clock = clock or system_clock
        self._headers = dict(headers or {})
        self._async_transport = async_transport
        self._client = httpx.Client(base_url=self.url, timeout=self.timeout,
                                    headers=self._headers, transport=transport)
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary())
        self.requests_sent = 0
        """HTTP requests sent for checks (a batch counts once)."""
        self.checks_sent = 0
        """Checks sent (every check of a batch counts)."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> ServiceStore:
        """``stormguard+http://limiter:8080?timeout=0.2&rules=named`` (or
        ``stormguard+https://``): the service at ``http://limiter:8080``."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower().removeprefix("stormguard+")
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name == "timeout":
                options.setdefault("timeout", validate.number("timeout", _float(name, value)))
            elif name == "max_batch":
                options.setdefault("max_batch", _int(name, value))
            elif name == "rules":
                options.setdefault("rules", value)
            else:
                raise ConfigError("store", url, f"unknown option {name!r}; expected "
                                  "timeout, max_batch or rules")
        return cls(urlunsplit((scheme, parts.netloc, parts.path, "", "")), **options)

    def __repr__(self) -> str:
        return f"ServiceStore({self.url!r}, rules={self.rules!r})"

    # -- the wire format ---------------------------------------------------------------
    def _body(self, key: str, rule: Rule, cost: int) -> bytes:
        if type(key) is not str:
            raise key_error(key)
        if not isinstance(rule, Rule):
            raise ConfigError("rule", rule, "must be a stormguard.Rule")
        if type(cost) is not int or cost != 1:
            cost = check_cost(rule, cost)
        body: dict[str, Any]
        if self.rules == "named":
            if not rule.name:
                raise ConfigError("rule", rule, "ServiceStore(rules='named') sends the rule's "
                                  "name: give the Rule the name of a rule of the service")
            body = {"key": key, "rule": rule.name}
        else:
            body = {"key": f"{rule.name}|{key}" if rule.name else key, "limit": rule.limit,
                    "window": rule.window, "algorithm": rule.algorithm}
            if rule.burst is not None:
                body["burst"] = rule.burst
        if cost != 1:
            body["cost"] = cost
        return json.dumps(body, separators=(",", ":")).encode()

    def _decision(self, answer: _Answer, rule: Rule) -> Decision:
        try:
            allowed, limit, remaining = answer["allowed"], answer["limit"], answer["remaining"]
            reset_after, retry_after = answer["reset_after"], answer["retry_after"]
            if not (isinstance(allowed, bool) and type(limit) is int
                    and type(remaining) is int):
                raise TypeError(answer)
            return Decision(allowed, limit, remaining, float(reset_after), float(retry_after),
                            rule, answer.get("degraded") is True)
        except (KeyError, TypeError, ValueError):
            raise ServiceError(f"stormguard service {self.url}: not a decision: "
                               f"{answer!r:.200}") from None

    def _error(self, path: str, exc: Exception) -> ServiceError:
        return ServiceError(f"stormguard service {self.url}{path}: {type(exc).__name__}: "
                            f"{exc}"[:500])

    def _answer(self, path: str, r: httpx.Response) -> Any:
        if r.status_code != 200:
            try:
                msg = r.json().get("error", r.text)
            except ValueError:
                msg = r.text
            raise ServiceError(f"stormguard service {self.url}{path}: {r.status_code} "
                               f"{msg!s:.300}", r.status_code)
        try:
            return r.json()
        except ValueError as exc:
            raise self._error(path, exc) from None

    # -- blocking ----------------------------------------------------------------------
    def _post(self, path: str, content: bytes) -> Any:
        self.requests_sent += 1
        try:
            r = self._client.post(path, content=content, headers=_JSON)
        except httpx.HTTPError as exc:
            raise self._error(path, exc) from None
        return self._answer(path, r)

    def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        body = self._body(key, rule, cost)
        self.checks_sent += 1
        answer = self._post("/v1/check", body)
        return self._decision(answer if isinstance(answer, dict) else {}, rule)

    def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        return self.hit(key, self._one_rule(rules, cost), cost)

    def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        raise ConfigError("peek", rule, "the stormguard service API has no peek (a check "
                          "always consumes); ServiceStore cannot answer one")

    def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        raise ConfigError("reset", rule, "the stormguard service API cannot reset counters")

    @staticmethod
    def _one_rule(rules: Sequence[Rule], cost: int) -> Rule:
        checked = check_rules(rules, cost)
        if len(checked) > 1:
            raise ConfigError("rules", [str(r) for r in checked],
                              "ServiceStore checks one rule per call: the service API has "
                              "no all-or-nothing check over several rules")
        return checked[0]

    def ping(self) -> bool:
        try:
            return self._client.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        self._client.close()

    # -- asyncio: concurrent checks of one loop iteration are one batch ---------------------
    def _state(self) -> tuple[asyncio.AbstractEventLoop, _LoopState]:
        loop = asyncio.get_running_loop()
        st = self._loops.get(loop)
        if st is None:
            st = _LoopState(httpx.AsyncClient(base_url=self.url, timeout=self.timeout,
                                              headers=self._headers,
                                              transport=self._async_transport))
            self._loops[loop] = st
        return loop, st

    async def ahit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        body = self._body(key, rule, cost)
        loop, st = self._state()
        fut: asyncio.Future[_Answer] = loop.create_future()
        st.pending.append((body, fut))
        if not st.scheduled:
            st.scheduled = True
            loop.call_soon(self._flush, loop, st)
        return self._decision(await fut, rule)

    async def ahit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        return await self.ahit(key, self._one_rule(rules, cost), cost)

    async def apeek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self.peek(key, rule, cost)

    async def areset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        self.reset(key, rule)

    def _flush(self, loop: asyncio.AbstractEventLoop, st: _LoopState) -> None:
        pending, st.pending, st.scheduled = st.pending, [], False
        for i in range(0, len(pending), self.max_batch):
            task = loop.create_task(self._send(st, pending[i:i + self.max_batch]))
            st.tasks.add(task)
            task.add_done_callback(st.tasks.discard)

    async def _apost(self, st: _LoopState, path: str, content: bytes) -> Any:
        self.requests_sent += 1
        try:
            r = await st.client.post(path, content=content, headers=_JSON)
        except httpx.HTTPError as exc:
            raise self._error(path, exc) from None
        return self._answer(path, r)

    async def _one(self, st: _LoopState, body: bytes, fut: asyncio.Future[_Answer]) -> None:
        try:
            answer = await self._apost(st, "/v1/check", body)
        except StorageError as exc:
            _fail(fut, exc)
        except Exception as exc:  # any bug below: a waiting caller must never hang
            _fail(fut, self._error("/v1/check", exc))
        else:
            _set(fut, answer)

    async def _send(self, st: _LoopState, batch: list[tuple[bytes, asyncio.Future[_Answer]]]
                    ) -> None:
        try:
            await self._send_batch(st, batch)
        except Exception as exc:  # any bug below: a waiting caller must never hang
            for _, fut in batch:
                _fail(fut, self._error("/v1/check/batch", exc))
        finally:  # cancelled (the loop shutting down): no caller is left waiting
            for _, fut in batch:
                _fail(fut, ServiceError(f"stormguard service {self.url}: check cancelled"))

    async def _send_batch(self, st: _LoopState,
                          batch: list[tuple[bytes, asyncio.Future[_Answer]]]) -> None:
        self.checks_sent += len(batch)
        if len(batch) == 1:
            await self._one(st, *batch[0])
            return
        content = b'{"checks":[' + b",".join(body for body, _ in batch) + b"]}"
        try:
            answer = await self._apost(st, "/v1/check/batch", content)
            results = answer.get("results") if isinstance(answer, dict) else None
            if not isinstance(results, list) or len(results) != len(batch):
                raise ServiceError(f"stormguard service {self.url}/v1/check/batch: "
                                   f"not a batch answer: {answer!r:.200}")
        except ServiceError as exc:
            if exc.status is not None and 400 <= exc.status < 500:
                # the service refuses a batch whole, before consuming anything: send the
                # checks one by one so only the check at fault fails
                await asyncio.gather(*(self._one(st, body, fut) for body, fut in batch))
                return
            for _, fut in batch:
                _fail(fut, exc)
            return
        for (_, fut), result in zip(batch, results, strict=True):
            _set(fut, result if isinstance(result, dict) else {})

    async def aping(self) -> bool:
        _, st = self._state()
        try:
            return (await st.client.get("/readyz")).status_code == 200
        except httpx.HTTPError:
            return False

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        st = self._loops.pop(loop, None)
        if st is not None:
            await st.client.aclose()
        self._client.close()


def _set(fut: asyncio.Future[_Answer], answer: _Answer) -> None:
    if not fut.done():  # the caller may have been cancelled meanwhile
        fut.set_result(answer)


def _fail(fut: asyncio.Future[_Answer], exc: StorageError) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _float(name: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ConfigError(name, value, "must be a number") from None


def _int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(name, value, "must be an integer") from None
