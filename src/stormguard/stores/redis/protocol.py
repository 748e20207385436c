"""What the transport carries and where to: commands, endpoints, the errors they raise.

* :class:`Command` — one Redis command as RESP bytes, with the key that routes it on a
  cluster and the name of the registered script it runs (:mod:`.scripts`).
* :class:`Endpoint` — how to reach one server, parsed once from a URL and redis-py's
  connection options, for the blocking pool and for the asyncio connections.
* Every failure leaves the transport as a :class:`~stormguard.StorageError`
  (:func:`storage_error`); :data:`BACKEND_ERRORS` are the ones that say the server or
  the network failed (they count towards a breaker), :class:`PoolFull` says only that
  the blocking pool stayed busy.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import ssl
from collections.abc import Sequence
from typing import Any, NamedTuple

import hiredis
import redis
from redis.exceptions import NoScriptError, RedisError, ResponseError

from stormguard._core.errors import ConfigError, StorageError

__all__ = ["ASKING", "BACKEND_ERRORS", "CLUSTER_SLOTS", "Command", "Endpoint", "PoolFull",
           "connection_options", "is_noscript", "pack", "storage_error", "tls_context"]

#: Errors that mean "the server or the network failed" (they count towards the breaker).
BACKEND_ERRORS = (RedisError, OSError, asyncio.TimeoutError, hiredis.ProtocolError)

Arg = str | bytes | int | float


def pack(args: Sequence[Arg]) -> bytes:
    """One command as RESP bytes."""
    packed: bytes = hiredis.pack_command(tuple(args))  # type: ignore[arg-type]
    return packed


class Command(NamedTuple):
    """One Redis command for the transport.

    ``packed`` is the command as RESP bytes; ``key`` routes it on a cluster (``None``:
    any master; give the key the command touches, every key of one command must share a
    slot); ``script`` names the registered script an ``EVALSHA`` runs, so that the
    transport can answer ``NOSCRIPT``.
    """

    packed: bytes
    key: bytes | None = None
    script: str | None = None

    @classmethod
    def of(cls, *args: Arg, key: str | bytes | None = None,
           script: str | None = None) -> Command:
        """Build a command from its arguments: ``Command.of("GET", k, key=k)``."""
        return cls(pack(args), key.encode() if isinstance(key, str) else key, script)


def storage_error(exc: BaseException, what: str = "redis") -> StorageError:
    """``exc`` as a StorageError (its cause)."""
    if isinstance(exc, StorageError):
        return exc
    err = StorageError(f"{what}: {type(exc).__name__}: {exc}" if not isinstance(
        exc, ResponseError) else f"{what}: {exc}")
    err.__cause__ = exc
    return err


def is_noscript(reply: object) -> bool:
    """A NOSCRIPT error reply (redis-py's NoScriptError, or hiredis's ResponseError)."""
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT"))


class PoolFull(StorageError):
    """No connection of the blocking pool came free in time (back-pressure, not an outage)."""


class Endpoint(NamedTuple):
    """How to reach one server: for the blocking pool (a redis-py connection class and its
    keyword arguments) and for the asyncio connection (``params``: ``host``/``port`` or
    ``path``, ``username``, ``password``, ``db``; ``tls``: an SSL context or None)."""

    name: str
    connection_class: type
    connection_kwargs: dict[str, Any]
    params: dict[str, Any]
    tls: ssl.SSLContext | None

    @classmethod
    def from_url(cls, url: str, *, timeout: float, connect_timeout: float,
                 options: dict[str, Any]) -> Endpoint:
        """``redis://``, ``rediss://`` or ``unix://`` plus redis-py connection options."""
        from redis.connection import parse_url

        try:
            pool = redis.ConnectionPool.from_url(url, socket_timeout=timeout,
                                                 socket_connect_timeout=connect_timeout,
                                                 **options)
            params: dict[str, Any] = {**parse_url(url), **options}  # type: ignore[no-untyped-call]
        except (ValueError, TypeError) as exc:
            raise ConfigError("url", url, f"not a usable Redis URL: {exc}") from None
        try:  # no I/O: a connection connects on first use; a bad option fails here
            pool.connection_class(**pool.connection_kwargs)
        except TypeError as exc:
            raise ConfigError("options", options, f"not redis-py connection options: {exc}"
                              ) from None
        params.pop("connection_class", None)
        tls = tls_context(params) if url.startswith("rediss") else None
        name = params.get("path") or f"{params.get('host', 'localhost')}:{params.get('port', 6379)}"
        return cls(name, pool.connection_class, dict(pool.connection_kwargs), params, tls)

    def node(self, host: str, port: int) -> Endpoint:
        """The same settings (credentials, TLS, timeouts) for another ``host:port``."""
        kwargs = {**self.connection_kwargs, "host": host, "port": port}
        params = {**self.params, "host": host, "port": port}
        return Endpoint(f"{host}:{port}", self.connection_class, kwargs, params, self.tls)


@functools.cache
def connection_options(scheme: str) -> frozenset[str]:
    """The keyword options redis-py's connection class for ``scheme`` (``redis``,
    ``rediss`` or ``unix``) accepts: what a URL's query may carry besides the store's."""
    from redis.connection import Connection, SSLConnection, UnixDomainSocketConnection

    cls = {"rediss": SSLConnection, "unix": UnixDomainSocketConnection}.get(scheme, Connection)
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        names.update(p.name for p in inspect.signature(init).parameters.values()
                     if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                         p.KEYWORD_ONLY))
    return frozenset(names)


def tls_context(params: dict[str, Any]) -> ssl.SSLContext:
    """TLS for the asyncio connections from redis-py's options: ``ssl_ca_certs``,
    ``ssl_ca_path``, ``ssl_certfile``/``ssl_keyfile`` (client certificate),
    ``ssl_cert_reqs="none"`` (no verification), ``ssl_check_hostname``."""
    ctx = ssl.create_default_context(cafile=params.get("ssl_ca_certs"),
                                     capath=params.get("ssl_ca_path"))
    if params.get("ssl_certfile"):
        ctx.load_cert_chain(params["ssl_certfile"], params.get("ssl_keyfile"),
                            params.get("ssl_password"))
    reqs = params.get("ssl_cert_reqs", "required")
    if reqs == ssl.CERT_NONE or str(reqs).lower() == "none":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif params.get("ssl_check_hostname") is False:
        ctx.check_hostname = False
    return ctx


ASKING = Command.of("ASKING")
CLUSTER_SLOTS = Command.of("CLUSTER", "SLOTS")
