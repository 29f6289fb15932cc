"""Spreading one client's rollout requests over several engine replicas.

The user keeps one `openai.AsyncOpenAI` client; its httpx transport (`ReplicaRouter`) sends each request
to one replica's server. A request whose prompt starts like an earlier one goes where that one went (a
group's rollouts share their prompt, and turn 2 of a conversation extends turn 1), so the shared prefix
is prefilled once and found in that replica's prefix cache; a prompt not seen before goes to the
replica with the fewest requests in flight. This is httpx's transport API, not a proxy: no extra hop.

Connections: httpcore's pool matches every waiting request against every connection each time one
changes state, so one pool with n requests in flight costs O(n) per request, and with a hundred
concurrent rollouts the one client process becomes the bottleneck of several GPUs
(bench/scaling.py). So each replica gets
lanes: small pools of at most `LANE_REQUESTS` requests in flight, a new lane opened when all are busy.

In process: with its workers as engine cores (backend/frontends.py) each replica is an app in the user's
process, reached through its httpx ASGI transport (no socket, no pool). A worker that died makes its
app answer with an error (its core client fails the requests): on an error status the router asks
`alive`, which raises the backend's error naming the exit.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import httpx

from groupwise.backend.base import InferenceEndpoint
from groupwise.errors import ConfigError
from groupwise.inference.client import REQUEST_TIMEOUT_S

ROUTED_BASE_URL = "http://groupwise-replicas/v1"
LANE_REQUESTS = 8  # requests in flight per connection pool (module doc)
REPLICA_HEADER = "x-groupwise-replica"
_STICKY_KEYS = 8192


def prefix_key(request: httpx.Request) -> str | None:
    """What makes two requests share a prompt prefix: the model and the conversation up to and
    including its first user message (chat), or the start of the prompt (completions)."""
    if request.method != "POST":
        return None
    try:
        body = json.loads(request.content or b"{}")
    except (ValueError, httpx.RequestNotRead):
        return None
    if not isinstance(body, dict):
        return None
    messages = body.get("messages")
    if isinstance(messages, list):
        head = []
        for message in messages:
            head.append(message)
            if isinstance(message, dict) and message.get("role") == "user":
                break
        return json.dumps([body.get("model"), head], sort_keys=True, default=str)
    prompt = body.get("prompt")
    if prompt is not None:
        return json.dumps([body.get("model"), str(prompt)[:512]])
    return None


class _CountedStream(httpx.AsyncByteStream):
    """A response body that tells the router when the request is over (streamed or not)."""

    def __init__(self, stream: Any, done: Callable[[], None]) -> None:
        self._stream, self._done = stream, done

    async def __aiter__(self):
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            self._done()


class ReplicaRouter(httpx.AsyncBaseTransport):
    """An httpx transport over several servers of the same API (module doc).

    `alive` is called when a replica cannot be reached: it raises the backend's clear error when a
    worker died (else the connection error stands)."""

    def __init__(self, urls: list[str], *, alive: Callable[[], None] | None = None,
                 transports: list[httpx.AsyncBaseTransport] | None = None) -> None:
        if not urls and not transports:
            raise ConfigError("ReplicaRouter needs at least one replica URL", what="ReplicaRouter arguments")
        self._fixed = transports  # in process: one transport per replica, sent to as it is (module doc)
        if transports is not None:
            urls = [ROUTED_BASE_URL] * len(transports)
        self.urls = [httpx.URL(u) for u in urls]
        self._alive = alive
        self._lanes: list[list[list]] = [[] for _ in urls]  # per replica: [transport, requests in flight]
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self.in_flight = [0] * len(urls)
        self.sent = [0] * len(urls)  # requests sent to each replica (for tests and benchmarks)

    def pick(self, request: httpx.Request) -> int:
        key = prefix_key(request)
        if key is not None and key in self._sticky:
            self._sticky.move_to_end(key)
            return self._sticky[key]
        replica = min(range(len(self.urls)), key=lambda i: (self.in_flight[i], self.sent[i], i))
        if key is not None:
            self._sticky[key] = replica
            if len(self._sticky) > _STICKY_KEYS:
                self._sticky.popitem(last=False)
        return replica

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        replica = self.pick(request)
        if self._fixed is None:
            target = self.urls[replica]
            request.url = request.url.copy_with(scheme=target.scheme, host=target.host, port=target.port)
            request.headers["host"] = f"{target.host}:{target.port}"
        lane = self._lane(replica)
        lane[1] += 1
        self.in_flight[replica] += 1
        self.sent[replica] += 1
        finished = False

        def done() -> None:
            nonlocal finished
            if not finished:
                finished = True
                lane[1] -= 1
                self.in_flight[replica] -= 1

        try:
            response = await lane[0].handle_async_request(request)
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
            done()
            if self._alive is not None:
                self._alive()  # raises the backend's error naming the dead worker
            raise
        except BaseException:
            done()
            raise
        if response.status_code >= 400 and self._fixed is not None and self._alive is not None:
            try:
                self._alive()  # a dead worker's app answers 503 (400 once it is known dead): raise the backend's error
            except BaseException:
                await response.aclose()
                done()
                raise
        headers = httpx.Headers(response.headers)
        headers[REPLICA_HEADER] = str(replica)  # which replica answered (benchmarks, debugging)
        return httpx.Response(response.status_code, headers=headers,
                              stream=_CountedStream(response.stream, done), extensions=response.extensions)

    def _lane(self, replica: int) -> list:
        """The replica's least busy connection pool, or a new one when every pool is full."""
        lanes = self._lanes[replica]
        if self._fixed is not None:
            if not lanes:
                lanes.append([self._fixed[replica], 0])
            return lanes[0]
        lane = min(lanes, key=lambda x: x[1], default=None)
        if lane is None or lane[1] >= LANE_REQUESTS:
            lane = [httpx.AsyncHTTPTransport(retries=0, limits=httpx.Limits(max_connections=None)), 0]
            lanes.append(lane)
        return lane

    async def aclose(self) -> None:
        for lanes in self._lanes:
            for transport, _ in lanes:
                await transport.aclose()


def routed_endpoint(urls: list[str], *, api_key: str, alive: Callable[[], None] | None = None,
                    timeout: float = REQUEST_TIMEOUT_S) -> InferenceEndpoint:
    """An endpoint whose client spreads requests over the replica servers at `urls`."""
    client = httpx.AsyncClient(transport=ReplicaRouter(urls, alive=alive), base_url=ROUTED_BASE_URL, timeout=timeout)
    return InferenceEndpoint(base_url=ROUTED_BASE_URL, api_key=api_key, http_client=client)


def in_process_endpoint(apps: list[Any], *, api_key: str, alive: Callable[[], None] | None = None,
                        timeout: float = REQUEST_TIMEOUT_S) -> InferenceEndpoint:
    """An endpoint whose client spreads requests over `apps` in this process (module doc)."""
    transports = [httpx.ASGITransport(app=app, raise_app_exceptions=False) for app in apps]
    client = httpx.AsyncClient(transport=ReplicaRouter([], alive=alive, transports=transports),
                               base_url=ROUTED_BASE_URL, timeout=timeout)
    return InferenceEndpoint(base_url=ROUTED_BASE_URL, api_key=api_key, http_client=client)
