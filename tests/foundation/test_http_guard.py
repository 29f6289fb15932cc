"""The Host/Origin rule of groupwise.core.http_guard on its own: the cases a loopback test cannot reach (a
server bound to 0.0.0.0 reached by a LAN address, a proxy's name and port, headers sent twice, a
WebSocket). The servers themselves are driven over HTTP in test_host_guard.py and its siblings."""

from __future__ import annotations

import asyncio
import json

import pytest

from groupwise.errors import ConfigError
from groupwise.core.http_guard import HostGuard


async def _inner(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _ask(guard: HostGuard, headers: list[tuple[str, str]], server=("192.0.2.7", 8100), kind="http") -> tuple[int, dict]:
    sent: list[dict] = []

    async def receive():
        return {"type": "websocket.connect"} if kind == "websocket" else {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    scope = {"type": kind, "scheme": "http", "method": "GET", "path": "/", "server": server,
             "headers": [(k.encode(), v.encode()) for k, v in headers]}
    asyncio.run(guard(scope, receive, send))
    if sent[0]["type"] == "websocket.close":
        return 1008, {}
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], (json.loads(body) if sent[0]["status"] == 403 else {})


def test_a_server_on_all_addresses_answers_each_by_its_own_address_and_no_name():
    guard = HostGuard(_inner, bound="0.0.0.0")
    assert _ask(guard, [("host", "192.0.2.7:8100")])[0] == 200  # the address the connection arrived at
    assert _ask(guard, [("host", "0.0.0.0:8100")])[0] == 200  # the bound address
    assert _ask(guard, [("host", "localhost:8100")])[0] == 200
    status, body = _ask(guard, [("host", "my-box.lan:8100")])
    assert status == 403 and "--allowed-host my-box.lan" in body["error"]["message"]
    assert _ask(guard, [("host", "192.0.2.8:8100")])[0] == 403  # another machine's address
    assert _ask(guard, [("host", "192.0.2.7:8101")])[0] == 403  # another port
    assert _ask(guard, [("host", "[::ffff:192.0.2.7]:8100")])[0] == 200  # the same address, IPv6-mapped
    v6 = HostGuard(_inner)
    assert _ask(v6, [("host", "[2001:db8::1]:8100")], server=("2001:db8::1", 8100))[0] == 200
    assert _ask(v6, [("host", "[2001:db8::2]:8100")], server=("2001:db8::1", 8100))[0] == 403


def test_allowed_names_by_name_by_port_and_any():
    guard = HostGuard(_inner, allowed=["My-Box.lan", "proxy.example:443"])
    assert _ask(guard, [("host", "my-box.lan:9999")])[0] == 200  # a name: any port (a proxy in front)
    assert _ask(guard, [("host", "proxy.example:443")])[0] == 200
    assert _ask(guard, [("host", "proxy.example:8100")])[0] == 403  # NAME:PORT: that port only
    assert _ask(guard, [("host", "proxy.example")])[0] == 200  # a proxy that forwards the name alone
    # a TLS proxy: the page is https://proxy.example (port 443 implied), Host names the port
    assert _ask(guard, [("host", "proxy.example:443"), ("origin", "https://proxy.example")])[0] == 200
    assert _ask(guard, [("host", "proxy.example:443"), ("origin", "http://proxy.example")])[0] == 403
    anyone = HostGuard(_inner, allowed=["*"])
    assert _ask(anyone, [("host", "whatever.example")])[0] == 200
    assert _ask(anyone, [("host", "whatever.example"), ("origin", "http://evil.example")])[0] == 403
    with pytest.raises(ConfigError, match="allowed_host"):
        HostGuard(_inner, allowed=["http://my-box.lan"])


def test_no_host_two_hosts_two_origins_and_a_websocket_are_refused():
    guard = HostGuard(_inner)
    assert _ask(guard, [])[1]["error"]["param"] == "host"
    assert _ask(guard, [("host", "127.0.0.1:8100"), ("host", "evil.example")])[0] == 403
    assert _ask(guard, [("host", "127.0.0.1:8100"), ("origin", "http://127.0.0.1:8100"),
                        ("origin", "http://evil.example")])[0] == 403
    assert _ask(guard, [("host", "evil.example:8100"), ("origin", "http://evil.example:8100")], kind="websocket")[0] == 1008
    assert _ask(guard, [("host", "127.0.0.1:8100")], server=None)[0] == 200  # no address known: the port is not checked


def test_every_web_app_the_package_builds_runs_the_guard():
    """A server added later gets the check too: each module of src/groupwise that builds an ASGI app
    (FastAPI or Starlette) adds `HostGuard` to it."""
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "groupwise"
    builders = [p for p in src.rglob("*.py") if re.search(r"\b(FastAPI|Starlette)\(", p.read_text(encoding="utf-8"))]
    assert {p.relative_to(src).as_posix() for p in builders} >= {"inference/server.py", "dashboard/app.py"}
    assert [p for p in builders if "add_middleware(HostGuard" not in p.read_text(encoding="utf-8")] == []
