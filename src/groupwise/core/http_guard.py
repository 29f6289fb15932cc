"""Who may ask a local HTTP server: the `Host` and `Origin` check every groupwise server runs.

Why. A server on loopback is not reachable from the network, but it is reachable from every web page
the user opens: a page on ``evil.example`` can have its own name resolve to 127.0.0.1 (DNS rebinding),
and its scripts then talk to ``http://evil.example:8100/`` -- the dashboard, or ``groupwise serve`` --
as to their own site, reading every run or making the model generate. The browser still names the
page's site in the ``Host`` header (and, for a request from a script, in ``Origin``), so a server that
answers only the names it is reached by defeats it, as Jupyter and Vite do.

The rule (`HostGuard`, ASGI middleware; docs/security.md states it for users):

* ``Host`` must name this server: ``localhost`` or a loopback address, the address the server is bound
  to, or the address the request's connection arrived at (a server bound to 0.0.0.0 answers at each of
  the machine's addresses, by that address) -- each with the port the request arrived at; or a name the
  user allowed (``--allowed-host NAME`` any port, ``NAME:PORT`` that port only, ``*`` any name). An
  address written as digits cannot be rebound, a name can: a name is answered only when allowed.
* ``Origin``, when sent, must be the page itself: its host and port those of ``Host`` (the default
  port of its scheme where it gives none). A browser sends it with every cross-site request and with a
  same-site one that changes state; ``null`` (a sandboxed frame, a file) is refused. A request without
  one (curl, the openai SDK, a script) is judged by ``Host`` alone.
* A refusal is a 403 JSON body in OpenAI's error shape naming the header and the flag that allows it.

In-process use (`groupwise.inference.client`: an httpx ASGI transport, no socket) passes: httpx names
the URL's host (``groupwise.local``) both in ``Host`` and as the connection's address, so the request
is at the address it arrived at. Nothing outside the process can send through that transport.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable
from typing import Any

from groupwise.errors import ConfigError

__all__ = ["ALLOW_ANY", "HostGuard", "allowed_host_problem", "host_refusal"]

ALLOW_ANY = "*"  # an allowed-host entry that lets any Host through (behind a proxy that checks it)
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
# A host name as URLs write it (RFC 3986 reg-name, the letters DNS uses), or a bracketed IPv6 address.
_NAME = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?|\[[0-9a-f:.]+\]")
_HOST_PORT = re.compile(rf"(?P<name>{_NAME.pattern})(?::(?P<port>[0-9]{{1,5}}))?")


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return None


def _split(value: str) -> tuple[str, int | None] | None:
    """``name[:port]`` -> (name in lower case, port or None); None when it is not one."""
    m = _HOST_PORT.fullmatch(value.lower()) if value.isascii() else None
    if m is None:
        return None
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 0 < port < 65536:
        return None
    name = m["name"]
    if name.startswith("[") and _ip(name) is None:
        return None
    return name, port


def _same_address(a: str, b: str) -> bool:
    ia, ib = _ip(a), _ip(b)
    if ia is not None and ib is not None:
        if getattr(ia, "ipv4_mapped", None):
            ia = ia.ipv4_mapped
        if getattr(ib, "ipv4_mapped", None):
            ib = ib.ipv4_mapped
        return ia == ib
    return a.strip("[]").lower() == b.strip("[]").lower()


def allowed_host_problem(value: Any) -> str | None:
    """An ``--allowed-host`` entry: a host name or address, with ``:PORT`` to allow that port only, or ``*``."""
    if value == ALLOW_ANY:
        return None
    if isinstance(value, str) and _split(value) is not None:
        return None
    return (f"must be a host name or address as a browser's address bar writes it (my-box.lan, my-box.lan:8100, "
            f"[::1]:8000), or * for any, got {value!r}")


def host_refusal(header: str, value: str, why: str, fix: str) -> dict[str, Any]:
    """The 403 body: OpenAI's error shape (the openai SDK shows its message), naming the header."""
    return {"error": {"message": f"this server does not answer a request with {header}: {value!r}: {why}. {fix}",
                      "type": "forbidden", "param": header.lower(), "code": f"{header.lower()}_not_allowed"}}


class HostGuard:
    """ASGI middleware: refuse a request whose ``Host`` or ``Origin`` does not name this server (module doc).

    `bound`: the address the server listens on, when known (a server bound to a name it is reached
    by); `allowed`: the user's ``--allowed-host`` entries."""

    def __init__(self, app: Any, *, allowed: Iterable[str] = (), bound: str | None = None,
                 flag: str = "--allowed-host") -> None:
        self.app, self.bound, self.flag = app, bound, flag
        self.any_host = False
        self.names: dict[str, int | None] = {}  # allowed name -> its only port, or None for any
        self.name_ports: set[tuple[str, int]] = set()
        for entry in allowed:
            problem = allowed_host_problem(entry)
            if problem:
                raise ConfigError([f"allowed_host {problem}"], what="allowed hosts")
            if entry == ALLOW_ANY:
                self.any_host = True
                continue
            name, port = _split(entry)  # type: ignore[misc]
            if port is None:
                self.names[name] = None
            else:
                self.name_ports.add((name, port))

    # ------------------------------------------------------------------------------------ the rule

    def host_problem(self, host: str | None, scheme: str, server: Any) -> str | None:
        """Why `host` does not name this server (None: it does). `server`: the ASGI scope's
        (address, port) the request arrived at, or None."""
        if host is None:
            return "the request has no Host header (HTTP/1.1 requires one)"
        parsed = _split(host)
        if parsed is None:
            return "it is not a host name or address"
        name, port = parsed
        if self.any_host:
            return None
        # a Host without a port is at its scheme's default one: a TLS proxy may send either
        ports = (port,) if port is not None else (80, 443)
        if name in self.names or any((name, p) in self.name_ports for p in ports):
            return None
        here_addr, here_port = (server[0], server[1]) if isinstance(server, (tuple, list)) and len(server) == 2 else (None, None)
        ip = _ip(name)
        ours = (name == "localhost" or (ip is not None and ip.is_loopback)
                or (here_addr is not None and _same_address(name, str(here_addr)))
                or (self.bound is not None and _same_address(name, self.bound)))
        if not ours:
            return ("it is not this server's address nor localhost (a web page whose name was pointed at this "
                    "machine sends its own name)")
        if here_port is not None:
            given = port if port is not None else _DEFAULT_PORTS.get(scheme, 80)
            if given != here_port:
                return f"this server is on port {here_port}, not {given}"
        return None

    @staticmethod
    def origin_problem(origin: str, host: str, scheme: str) -> str | None:
        """Why `origin` is not the page at `host` (None: it is)."""
        scheme_of, sep, rest = origin.partition("://")
        scheme_of = scheme_of.lower()
        if not sep or scheme_of not in ("http", "https") or "/" in rest:
            return "it is not the address of a page of this server"
        page, at = _split(rest), _split(host)
        if page is None or at is None:
            return "it is not the address of a page of this server"
        default = _DEFAULT_PORTS[scheme_of]
        # Host's port is the one the page's scheme implies when Host gives none (a TLS proxy in front)
        if page[0] != at[0] or (page[1] or default) != (at[1] or default):
            return "a page of another site may not read or drive this server"
        return None

    # ------------------------------------------------------------------------------------ ASGI

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for key, value in scope.get("headers") or []:
            k = key.decode("latin-1").lower()
            if k in ("host", "origin"):
                if k in headers:  # two Host headers: which one a proxy read is unknown
                    await self._refuse(scope, receive, send, k.capitalize(), value.decode("latin-1"),
                                       "the header is sent twice", "Send it once.")
                    return
                headers[k] = value.decode("latin-1")
        scheme = scope.get("scheme", "http")
        host = headers.get("host")
        problem = self.host_problem(host, scheme, scope.get("server"))
        if problem:
            shown = host if host is not None else ""
            name = _split(shown)
            server = scope.get("server")
            port = server[1] if isinstance(server, (tuple, list)) and len(server) == 2 and server[1] else "PORT"
            fix = (f"If you open this server by that name, start it with {self.flag} "
                   f"{name[0] if name else 'NAME'} (repeatable), or open it as http://127.0.0.1:{port}/.")
            await self._refuse(scope, receive, send, "Host", shown, problem, fix)
            return
        origin = headers.get("origin")
        if origin is not None:
            problem = self.origin_problem(origin, host, scheme)  # type: ignore[arg-type]
            if problem:
                await self._refuse(scope, receive, send, "Origin", origin, problem,
                                   f"Open the page from this server itself; a name it is reached by must be the "
                                   f"page's too ({self.flag} NAME allows a name).")
                return
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(scope: dict, receive: Any, send: Any, header: str, value: str, why: str, fix: str) -> None:
        if scope["type"] == "websocket":  # no route of ours speaks it; refuse before accepting
            await receive()
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(host_refusal(header, value, why, fix)).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": body})
