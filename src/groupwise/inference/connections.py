"""Connection limits of `groupwise serve`: a deadline on every request head, a cap on open connections.

Why. uvicorn times out an idle keep-alive connection (``timeout_keep_alive``) but not one that sends
its request head slowly or never finishes it: 1500 such half-open connections stayed open for as
long as their client liked, and under a lower file-descriptor limit an honest client could no
longer connect. uvicorn has no option for a head deadline (``h11_max_incomplete_event_size`` bounds
the head's bytes, not its time; ``limit_concurrency`` answers 503 to requests beyond a count, but
only once their head arrives, so it never sees a half-open connection). So the server speaks h11
through `guarded_protocol`, uvicorn's own h11 protocol with:

- a head deadline: from the moment a connection waits for a request (just opened, or its last
  response sent) its next request's head must arrive whole within ``head_timeout_s``, or the
  connection is closed;
- a cap on open connections: past ``max_connections``, the connection that has waited longest for
  a head is closed to make room (a slow-headers client loses its oldest socket, an honest one gets
  in); when every connection is busy with a request, uvicorn's ``limit_concurrency`` answers 503.

The body's deadline is the app's (server.py reads bodies under ``body_timeout_s``: 408 past it).
"""

from __future__ import annotations

import logging
import resource
from typing import Any

__all__ = ["DEFAULT_HEAD_TIMEOUT_S", "DEFAULT_KEEP_ALIVE_S", "DEFAULT_MAX_CONNECTIONS", "guarded_protocol",
           "raise_fd_limit", "serve_options", "uvicorn_config"]

log = logging.getLogger("groupwise.serve")

DEFAULT_HEAD_TIMEOUT_S = 10.0  # a request's method, path and headers: one packet for any honest client
DEFAULT_KEEP_ALIVE_S = 5  # uvicorn's default idle time between requests on one connection
DEFAULT_MAX_CONNECTIONS = 1024
FD_RESERVE = 64  # descriptors kept for the model's files, logs, the engine's own


def guarded_protocol(head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S,
                     max_connections: int = DEFAULT_MAX_CONNECTIONS) -> type:
    """uvicorn's h11 protocol with a head deadline and a connection cap (module doc); pass it as
    ``uvicorn.Config(http=...)``. Each call makes a class with its own record of waiting connections."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    waiting: dict[Any, None] = {}  # connections waiting for a request head, oldest first
    head_timeout = head_timeout_s

    class GuardedH11Protocol(H11Protocol):
        _head_timer: Any = None
        head_timeout_s = head_timeout
        max_open = max_connections

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self._evict_oldest_waiting()
            self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_arrived()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request's head arrived (uvicorn starts a new cycle)
                self._head_arrived()

        def on_response_complete(self) -> None:
            self._await_head()  # armed first: a pipelined request handled inside disarms it
            super().on_response_complete()
            if self.transport.is_closing():
                self._head_arrived()

        def _await_head(self) -> None:
            self._head_arrived()
            self._head_timer = self.loop.call_later(head_timeout_s, self._head_late)
            waiting[self] = None

        def _head_arrived(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            waiting.pop(self, None)

        def _head_late(self) -> None:
            self._head_timer = None
            waiting.pop(self, None)
            self._close()

        def _evict_oldest_waiting(self) -> None:
            oldest = next(iter(waiting), None)
            if oldest is not None:
                oldest._head_arrived()
                oldest._close()

        def _close(self) -> None:
            # Counted as gone now, not when asyncio reports the close on a later turn of the loop:
            # uvicorn's limit_concurrency counts open connections, and a request arriving meanwhile
            # would get 503 for room this close has already made.
            self.connections.discard(self)
            if self.transport.is_closing():
                return
            try:
                self.conn.send(h11.ConnectionClosed())
            except h11.LocalProtocolError:  # mid-request: h11 has nothing to close cleanly
                pass
            self.transport.close()

    return GuardedH11Protocol


def raise_fd_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def serve_options(*, head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S, keep_alive_s: int = DEFAULT_KEEP_ALIVE_S,
                  max_connections: int = DEFAULT_MAX_CONNECTIONS, fd_limit: int | None = None) -> dict[str, Any]:
    """uvicorn.Config keyword arguments for these limits. With `fd_limit` (the process's open-file
    limit), the connection cap stays below it, so accepting a connection never fails for want of a
    descriptor."""
    if fd_limit is not None:
        max_connections = max(1, min(max_connections, fd_limit - FD_RESERVE))
    return {"http": guarded_protocol(head_timeout_s, max_connections), "timeout_keep_alive": keep_alive_s,
            # only reached when every connection is busy with a request (none to evict): 503
            "limit_concurrency": max_connections + 1}


def uvicorn_config(app: Any, host: str, port: int, **extra: Any) -> Any:
    """uvicorn's Config for `app` on host:port under these limits (the open-file limit raised first);
    `extra`: more of its options."""
    import gc

    import uvicorn

    # Everything loaded so far (torch, the model, transformers: millions of objects) lives as long
    # as the server: out of the collector's sight, a request that allocates many objects no longer
    # sets off full collections that walk all of it (each a pause of every caller).
    gc.freeze()
    return uvicorn.Config(app, host=host, port=port, log_level="info", **serve_options(fd_limit=raise_fd_limit()),
                          **extra)
