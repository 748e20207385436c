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

* ``"inline"`` (default): the rules' parameters, ``{"key", "limits": [{"limit", "window",
  "algorithm", "burst", "name"}, ...]}``; the service enforces exactly the rules the app
  gives (the name is part of a rule's counters, as in every other store).
* ``"named"``: ``{"key", "rule": name}`` (or a list of names): the service's rules of
  those names decide (their limits, as the service's rules file or control plane says;
  the rules given here name them). This shares counters with the service's own checks
  of ``key`` + rule.

Every store operation is supported: ``hit``, ``hit_all`` (several rules, all or nothing,
one call), ``peek`` (``"peek": true``: nothing consumed), ``reset`` (``POST /v1/reset``,
a control-plane call: give the service's admin token as ``token=``), and ``ping``.

**A sick service fails fast.** ``breaker_threshold`` consecutive failures (connection
errors, timeouts, 5xx answers) open the client's breaker for ``breaker_cooldown``
seconds: calls are refused at once with :class:`~stormguard.StorageCircuitOpen` (the
limiter's ``on_error`` decides) instead of each waiting for the ``timeout``; then one
probe call decides whether it closes again. ``store.breaker.state`` tells.
"""

from __future__ import annotations

import asyncio
import functools
import json
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx

from stormguard._core import validate
from stormguard._core.breaker import BreakerMachine
from stormguard._core.clock import Clock, system_clock
from stormguard._core.errors import ConfigError, StorageCircuitOpen, StorageError
from stormguard.observability.events import StateChanged, emit, observed
from stormguard.observability.metrics import track
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
                 headers: Mapping[str, str] | None = None, token: str | None = None,
                 breaker_threshold: int = 5, breaker_cooldown: float = 1.0,
                 clock: Clock | None = None,
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
        if token is not None:
            validate.text("token", token)
            self._headers["authorization"] = f"Bearer {token}"
        threshold = validate.integer("breaker_threshold", breaker_threshold)
        cooldown = validate.number("breaker_cooldown", breaker_cooldown)
        name = f"service:{urlsplit(self.url).netloc}"
        self.breaker = BreakerMachine(
            window=threshold, failure_rate=1.0, min_calls=threshold, half_open_calls=1,
            open_for=cooldown, probe_lease=max(cooldown, self.timeout), name=name,
            clock=self.clock, reject=lambda reason, remaining: StorageCircuitOpen(
                f"stormguard service {self.url}: client circuit breaker is "
                f"{'half-open (probe in flight)' if reason == 'half_open_full' else 'open'}",
                remaining=remaining, name=name), on_change=functools.partial(_changed, name))
        """Opens after ``breaker_threshold`` consecutive failures (see the module doc)."""
        self.name = name
        """The store's name in metrics: ``service:host:port``."""
        track(self, "store")
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
            elif name == "breaker_threshold":
                options.setdefault("breaker_threshold", _int(name, value))
            elif name == "breaker_cooldown":
                options.setdefault("breaker_cooldown", _float(name, value))
            else:
                raise ConfigError("store", url, f"unknown option {name!r}; expected "
                                  "timeout, max_batch, rules, breaker_threshold or "
                                  "breaker_cooldown")
        return cls(urlunsplit((scheme, parts.netloc, parts.path, "", "")), **options)

    def __repr__(self) -> str:
        return f"ServiceStore({self.url!r}, rules={self.rules!r})"

    def breaker_machines(self) -> list[BreakerMachine]:
        """The client's breaker (metrics read its state)."""
        return [self.breaker]

    # -- the wire format ---------------------------------------------------------------
    def _body(self, key: str, rules: Sequence[Rule], cost: int, peek: bool = False) -> bytes:
        if type(key) is not str:
            raise key_error(key)
        for rule in rules:
            if not isinstance(rule, Rule):
                raise ConfigError("rule", rule, "must be a stormguard.Rule")
            if type(cost) is not int or cost != 1:
                cost = check_cost(rule, cost)
        body: dict[str, Any]
        if self.rules == "named":
            names = []
            for rule in rules:
                if not rule.name:
                    raise ConfigError("rule", rule, "ServiceStore(rules='named') sends the "
                                      "rule's name: give the Rule the name of a rule of the "
                                      "service")
                names.append(rule.name)
            body = {"key": key, "rule": names[0] if len(names) == 1 else names}
        else:
            limits = []
            for rule in rules:
                limit: dict[str, Any] = {"limit": rule.limit, "window": rule.window,
                                         "algorithm": rule.algorithm}
                if rule.burst is not None:
                    limit["burst"] = rule.burst
                if rule.name:
                    limit["name"] = rule.name
                limits.append(limit)
            body = {"key": key, "limits": limits}
        if cost != 1:
            body["cost"] = cost
        if peek:
            body["peek"] = True
        return json.dumps(body, separators=(",", ":")).encode()

    def _decision(self, answer: _Answer, rules: Sequence[Rule]) -> Decision:
        try:
            allowed, limit, remaining = answer["allowed"], answer["limit"], answer["remaining"]
            reset_after, retry_after = answer["reset_after"], answer["retry_after"]
            if not (isinstance(allowed, bool) and type(limit) is int
                    and type(remaining) is int):
                raise TypeError(answer)
            rule = rules[0]
            if len(rules) > 1:  # the binding rule: by the name the answer gives, or limit
                name = answer.get("rule")
                rule = next((r for r in rules if r.name and r.name == name),
                            next((r for r in rules if r.limit == limit and not r.name),
                                 rules[0]))
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

    # -- the breaker --------------------------------------------------------------------
    def _verdict(self, epoch: int, exc: BaseException | None) -> None:
        if exc is None or (isinstance(exc, ServiceError) and exc.status is not None
                           and exc.status < 500):
            self.breaker.on_success(epoch)  # it answered: the service is up
        elif isinstance(exc, StorageError):
            self.breaker.on_failure(epoch)
        else:  # cancelled, or a bug: no verdict on the service
            self.breaker.release(epoch)

    # -- blocking ----------------------------------------------------------------------
    def _post(self, path: str, content: bytes) -> Any:
        epoch = self.breaker.acquire()  # raises StorageCircuitOpen while open: no network
        self.requests_sent += 1
        try:
            try:
                r = self._client.post(path, content=content, headers=_JSON)
            except httpx.HTTPError as exc:
                raise self._error(path, exc) from None
            answer = self._answer(path, r)
        except BaseException as exc:
            self._verdict(epoch, exc)
            raise
        self._verdict(epoch, None)
        return answer

    def _check(self, key: str, rules: Sequence[Rule], cost: int, peek: bool) -> Decision:
        body = self._body(key, rules, cost, peek)
        self.checks_sent += 1
        answer = self._post("/v1/check", body)
        return self._decision(answer if isinstance(answer, dict) else {}, rules)

    def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self._check(key, (rule,), cost, False)

    def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        return self._check(key, check_rules(rules, cost), cost, False)

    def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self._check(key, (rule,), cost, True)

    def _reset_body(self, key: str, rule: Rule | Sequence[Rule]) -> bytes:
        rules = (rule,) if isinstance(rule, Rule) else check_rules(rule, 1)
        return self._body(key, rules, 1)

    def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        self._post("/v1/reset", self._reset_body(key, rule))

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

    async def _acheck(self, key: str, rules: Sequence[Rule], cost: int, peek: bool
                      ) -> Decision:
        body = self._body(key, rules, cost, peek)
        loop, st = self._state()
        fut: asyncio.Future[_Answer] = loop.create_future()
        st.pending.append((body, fut))
        if not st.scheduled:
            st.scheduled = True
            loop.call_soon(self._flush, loop, st)
        return self._decision(await fut, rules)

    async def ahit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return await self._acheck(key, (rule,), cost, False)

    async def ahit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        return await self._acheck(key, check_rules(rules, cost), cost, False)

    async def apeek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return await self._acheck(key, (rule,), cost, True)

    async def areset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        _, st = self._state()
        await self._apost(st, "/v1/reset", self._reset_body(key, rule))

    def _flush(self, loop: asyncio.AbstractEventLoop, st: _LoopState) -> None:
        pending, st.pending, st.scheduled = st.pending, [], False
        for i in range(0, len(pending), self.max_batch):
            task = loop.create_task(self._send(st, pending[i:i + self.max_batch]))
            st.tasks.add(task)
            task.add_done_callback(st.tasks.discard)

    async def _apost(self, st: _LoopState, path: str, content: bytes) -> Any:
        epoch = self.breaker.acquire()  # raises StorageCircuitOpen while open: no network
        self.requests_sent += 1
        try:
            try:
                r = await st.client.post(path, content=content, headers=_JSON)
            except httpx.HTTPError as exc:
                raise self._error(path, exc) from None
            answer = self._answer(path, r)
        except BaseException as exc:
            self._verdict(epoch, exc)
            raise
        self._verdict(epoch, None)
        return answer

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
        except StorageError as exc:
            if isinstance(exc, ServiceError) and exc.status is not None and 400 <= exc.status < 500:
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


def _changed(name: str, old: str, new: str, now: float) -> None:
    # the client's breaker reports its transitions to the global listeners (metrics)
    if observed([]):
        emit([], StateChanged(name, now, old, new))


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
