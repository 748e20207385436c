"""The client address of a request: the socket peer, or, when the peer is a configured
trusted proxy, the rightmost untrusted ``X-Forwarded-For`` hop.

A client that is not a trusted proxy cannot change its address by sending the header.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable

from stormguard._core.errors import ConfigError

__all__ = ["ClientIP"]

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
log = logging.getLogger("stormguard.middleware")
REWRITTEN_WARNING = (
    "stormguard: the client address {peer} is one of the request's X-Forwarded-For hops: "
    "the server seems to have rewritten it from the header before stormguard ran "
    "(uvicorn does by default for connections from 127.0.0.1: --proxy-headers, "
    "--forwarded-allow-ips), so a client behind that proxy can pick its address. Run "
    "uvicorn with --no-proxy-headers (uvicorn.Config(proxy_headers=False)) and list the "
    "proxies in trusted_proxies")


def _parse_ip(text: str) -> _Address | None:
    text = text.strip()
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if text.startswith("["):  # "[2001:db8::1]:443"
        host = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # "203.0.113.7:5678"
        host = text.partition(":")[0]
    else:
        return None
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class ClientIP:
    """Resolve the client address from the socket peer and ``X-Forwarded-For``."""

    def __init__(self, trusted_proxies: Iterable[str] = ()) -> None:
        if isinstance(trusted_proxies, str):
            trusted_proxies = [trusted_proxies]
        nets: list[_Network] = []
        for p in trusted_proxies:
            try:
                nets.append(ipaddress.ip_network(p, strict=False))
            except (ValueError, TypeError):
                raise ConfigError("trusted_proxies", p,
                                  "must be IP addresses or networks such as '10.0.0.0/8'") \
                    from None
        self.networks = tuple(nets)
        self.rewritten = False
        """Set (and warned once) when a peer address was seen among the request's
        ``X-Forwarded-For`` hops: the server rewrote it (uvicorn's --proxy-headers)."""

    def is_trusted(self, ip: _Address) -> bool:
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in n for n in self.networks)

    def resolve(self, peer: str | None, forwarded_for: str | None) -> str | None:
        """The client address: ``peer`` unless it is a trusted proxy, else the rightmost
        untrusted ``X-Forwarded-For`` hop."""
        if peer is None or not forwarded_for:
            return peer
        if not self.rewritten:
            self._check_rewritten(peer, forwarded_for)
        if not self.networks:
            return peer
        current = _parse_ip(peer)
        if current is None or not self.is_trusted(current):
            return peer
        for hop in reversed(forwarded_for.split(",")):
            ip = _parse_ip(hop)
            if ip is None:  # garbage from beyond the last trusted hop: stop at that hop
                break
            current = ip
            if not self.is_trusted(ip):
                break
        return str(current)

    def _check_rewritten(self, peer: str, forwarded_for: str) -> None:
        # a proxy appends the address it got the request from, never its own: a peer
        # that is one of the hops was taken from the header by the server itself
        ip = _parse_ip(peer)
        if ip is not None and any(_parse_ip(hop) == ip for hop in forwarded_for.split(",")):
            self.rewritten = True
            log.warning(REWRITTEN_WARNING.format(peer=peer))
