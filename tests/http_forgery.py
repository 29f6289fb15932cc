"""Forged requests against a groupwise HTTP server on loopback: the Host and Origin headers a web page
sends after pointing its own name at 127.0.0.1 (DNS rebinding), or from another site, and the ones a
legitimate caller sends. `probe` drives every route given with each and returns what it counted, so a
test asserts both that every forgery got 403 naming its header and that every honest request passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx


def forged_hosts(port: int) -> list[str]:
    """Hosts that do not name a server on 127.0.0.1:`port` without an allowed name."""
    return ["evil.example", f"evil.example:{port}", f"127.0.0.1.evil.example:{port}", f"localhost.evil.example:{port}",
            f"LOCALHOST.evil.example:{port}", f"localhost:1", f"localhost:{port + 1}", f"127.0.0.1:{port + 1}",
            f"[::1]:{port + 1}", f"localhost.:{port}", f"0x7f000001:{port}", f"unnamed.lan:{port}", "",
            f"127.0.0.1:{port}@evil.example", f"evil.example:{port}:{port}", f"localhost:99999", "*",
            f"[::ffff:7f00:1].evil.example:{port}", f"xn--lcalhost-0za:{port}"]


def honest_hosts(port: int) -> list[str]:
    return [f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}", f"[::1]:{port}", f"127.0.0.2:{port}"]


def forged_origins(port: int) -> list[str]:
    """Origins that are not a page of the server at 127.0.0.1:`port`, sent with an honest Host."""
    return ["http://evil.example", f"http://evil.example:{port}", "null", f"http://localhost:{port + 1}",
            f"http://127.0.0.1.evil.example:{port}", "http://localhost", "file://", f"http://127.0.0.1:{port}/x",
            f"ftp://127.0.0.1:{port}", f"chrome-extension://abcdef", f"http://[::1]:{port + 1}", "evil"]


@dataclass
class Tally:
    refused: int = 0  # forged requests answered 403 naming the header and the flag
    answered: int = 0  # honest requests answered (any status but 403)
    failures: list[str] = field(default_factory=list)

    def check(self) -> None:
        assert not self.failures, "\n".join(self.failures[:20])


def _refused(r: httpx.Response, header: str) -> bool:
    if r.status_code != 403:
        return False
    error = r.json().get("error", {})
    return error.get("param") == header and "--allowed-host" in error.get("message", "")


def probe(port: int, routes: list[tuple[str, str, dict | None]], *, headers: dict[str, str] | None = None,
          extra_forged_hosts: list[str] = (), extra_honest_hosts: list[str] = ()) -> Tally:
    """Every route with every forged Host, every forged Origin (Host honest), and every honest Host with and
    without its own page as Origin. `routes`: (method, path with query, JSON body or None)."""
    tally = Tally()
    base = dict(headers or {})
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        def send(method: str, path: str, body: dict | None, extra: dict[str, str]) -> httpx.Response:
            return client.request(method, path, json=body, headers={**base, **extra})

        for method, path, body in routes:
            for host in [*forged_hosts(port), *extra_forged_hosts]:
                r = send(method, path, body, {"Host": host})
                if not _refused(r, "host"):
                    tally.failures.append(f"{method} {path} Host {host!r}: {r.status_code} {r.text[:200]}")
                else:
                    tally.refused += 1
                # and with a matching Origin: the page on the forged name cannot vouch for itself
                r = send(method, path, body, {"Host": host, "Origin": f"http://{host}"})
                if not _refused(r, "host"):
                    tally.failures.append(f"{method} {path} Host+Origin {host!r}: {r.status_code} {r.text[:200]}")
                else:
                    tally.refused += 1
            for origin in forged_origins(port):
                r = send(method, path, body, {"Host": f"127.0.0.1:{port}", "Origin": origin})
                if not _refused(r, "origin"):
                    tally.failures.append(f"{method} {path} Origin {origin!r}: {r.status_code} {r.text[:200]}")
                else:
                    tally.refused += 1
            for host in [*honest_hosts(port), *extra_honest_hosts]:
                for extra in ({"Host": host}, {"Host": host, "Origin": f"http://{host}"}):
                    r = send(method, path, body, extra)
                    if r.status_code == 403:
                        tally.failures.append(f"{method} {path} honest {extra}: 403 {r.text[:200]}")
                    else:
                        tally.answered += 1
    return tally


def probe_allowed(port: int, routes: list[tuple[str, str, dict | None]], name: str, *,
                  headers: dict[str, str] | None = None) -> Tally:
    """A server started with ``--allowed-host NAME``: the name (as Host, and as its own page's Origin)
    is answered; another name, and another site's page, are still refused."""
    tally = Tally()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        for method, path, body in routes:
            for extra in ({"Host": f"{name}:{port}"}, {"Host": f"{name}:{port}", "Origin": f"http://{name}:{port}"},
                          {"Host": name.upper()}):
                r = client.request(method, path, json=body, headers={**(headers or {}), **extra})
                if r.status_code == 403:
                    tally.failures.append(f"{method} {path} allowed {extra}: 403 {r.text[:200]}")
                else:
                    tally.answered += 1
            for extra, header in (({"Host": f"other-{name}:{port}"}, "host"),
                                  ({"Host": f"{name}.evil.example:{port}"}, "host"),
                                  ({"Host": f"{name}:{port}", "Origin": "http://evil.example"}, "origin"),
                                  ({"Host": f"{name}:{port}", "Origin": f"http://127.0.0.1:{port}"}, "origin")):
                r = client.request(method, path, json=body, headers={**(headers or {}), **extra})
                if not _refused(r, header):
                    tally.failures.append(f"{method} {path} {extra}: {r.status_code} {r.text[:200]}")
                else:
                    tally.refused += 1
    return tally


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(port: int, proc, timeout_s: float = 120.0) -> None:
    """Until the server at 127.0.0.1:`port` accepts a connection (or `proc` died: its output is shown)."""
    import socket
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}: {proc.stdout.read()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing listens on port {port} after {timeout_s} s")
