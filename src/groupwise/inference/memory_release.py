"""Return the memory a large request body cost once its request is answered.

Parsing a body of several MB (64,000 tools is 8 MB of JSON, some hundred MB of Python objects) raises
the server's heap, and glibc keeps the freed pages: after a soak of hostile bodies the process stayed
at its peak. This middleware counts each request's body bytes and, once a request of at least
`threshold_bytes` has been answered, asks glibc to give the free pages back (`groupwise.runtime.memory`), on a
worker thread so the event loop never waits, at most once per `min_interval_s` so a stream of large
bodies costs one trim a second and not one per request. What stays is the high-water mark of
interpreter and library caches, which does not grow with the length of an attack (docs/security.md).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from groupwise.runtime.memory import release_freed_memory

__all__ = ["ReleaseAfterLargeBodies"]


class ReleaseAfterLargeBodies:
    """ASGI middleware: a trim of the freed heap after any request whose body was large."""

    def __init__(self, app: Any, threshold_bytes: int = 1 << 20, min_interval_s: float = 1.0):
        self.app = app
        self.threshold_bytes = threshold_bytes
        self.min_interval_s = min_interval_s
        self._running = False
        self._last = float("-inf")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        size = 0

        async def counted() -> dict:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
            return message

        try:
            await self.app(scope, counted, send)
        finally:
            if size >= self.threshold_bytes:
                self._schedule()

    def _schedule(self) -> None:
        now = time.monotonic()
        if self._running or now - self._last < self.min_interval_s:
            return
        self._running, self._last = True, now
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(release_freed_memory))
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._running = False
