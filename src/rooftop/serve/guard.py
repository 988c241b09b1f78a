"""LocalGuard: what keeps web pages from driving a server on this machine. A browser sends a page's requests to any
address, 127.0.0.1 included, and DNS rebinding can point the page's own name at this machine. So the Host header
must name this server (see Hosts), and a request that carries a browser's Origin must come from this server's own
pages or from an origin in --allowed-origins (clients that are not browsers, curl and the SDKs, send no Origin)."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from starlette.datastructures import Headers

from rooftop.serve.errors import error_response

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
EVERY_INTERFACE = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class Hosts:
    """The names a Host header may carry (port or not): the bound address and --allowed-hosts; localhost too for a
    loopback address; and for 0.0.0.0 or ::, this machine: localhost, its host name and the addresses that name
    resolves to, and whichever address a connection arrived at (the standard library lists no interfaces, but the
    connection's own local address is one). A name behind a proxy or in DNS needs --allowed-hosts; '*' accepts any."""

    names: frozenset[str]
    any_name: bool = False
    local_addresses: bool = False  # the connection's local address counts as this server's name

    @classmethod
    def of(cls, bind: str, allowed: list[str]) -> Hosts:
        names = {_normal(bind), *(_normal(name) for name in allowed)}
        everywhere = bind in EVERY_INTERFACE
        if everywhere or _normal(bind) in LOOPBACK_NAMES or _is_loopback(bind):
            names |= LOOPBACK_NAMES
        if everywhere:
            names |= _this_machine()
        return cls(frozenset(names), "*" in allowed, everywhere)

    def allow(self, host: str, local_address: str | None) -> bool:
        name = _normal(_without_port(host))
        if self.any_name or name in self.names:
            return True
        return self.local_addresses and local_address is not None and name == _normal(local_address)


class LocalGuard:
    """ASGI middleware: 400 for a Host that names another server, 403 for a browser request from another origin."""

    def __init__(self, app, hosts: Hosts, origins: list[str]):
        self.app, self.hosts, self.origins = app, hosts, frozenset(origins)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope):
        headers = Headers(scope=scope)
        host, origin = headers.get("host"), headers.get("origin")
        if host is not None and not self.hosts.allow(host, (scope.get("server") or (None,))[0]):
            return error_response(
                400,
                f"the Host header {host[:80]!r} does not name this server; start it with --allowed-hosts "
                f"{_without_port(host)[:80]} to serve under that name (the check keeps web pages from reaching it "
                "through DNS rebinding)",
            )
        if origin is not None and not self._allowed_origin(origin, f"{scope['scheme']}://{host}"):
            return error_response(
                403,
                f"requests from web pages at {origin[:80]!r} are not allowed; start the server with "
                f"--allowed-origins {origin[:80]} to let that origin call it",
            )
        return None

    def _allowed_origin(self, origin: str, own: str) -> bool:
        origin = origin.lower()
        return origin == own.lower() or origin in self.origins or "*" in self.origins


def _this_machine() -> set[str]:
    host = socket.gethostname()
    names = {_normal(host)}
    try:
        names |= {_normal(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:  # a name that does not resolve: the host name and the connection's address still count
        pass
    return names


def _without_port(host: str) -> str:
    """'[::1]:8000' -> '::1', 'example.com:8000' -> 'example.com'."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _normal(name: str) -> str:
    """Lower case without a trailing dot; an IP address in its one spelling (an IPv4-mapped IPv6 one as IPv4)."""
    name = name.strip().strip("[]").rstrip(".").lower()
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return name
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.compressed


def _is_loopback(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
