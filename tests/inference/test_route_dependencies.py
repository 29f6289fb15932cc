"""Every route's dependencies run on the event loop. FastAPI runs a plain-function dependency (and a plain
endpoint) in anyio's worker threads: a thread hop per request and dependency, at most 40 at once, which a
step's hundreds of concurrent rollouts queued for on the process that also steps the engine."""

from __future__ import annotations

import inspect

from fastapi.routing import APIRoute

from groupwise.inference.adapter_routes import lora_routes
from groupwise.inference.server import api, docs


def _calls(dependant):
    for dep in dependant.dependencies:
        yield dep.call
        yield from _calls(dep)


def test_no_route_runs_its_dependencies_or_endpoint_in_a_worker_thread():
    routes = [r for router in (api, docs, lora_routes) for r in router.routes if isinstance(r, APIRoute)]
    assert len(routes) >= 8  # the OpenAI, Anthropic, docs and LoRA routes
    sync = sorted({f"{r.path}: {getattr(call, '__qualname__', call)}" for r in routes
                   for call in [r.endpoint, *_calls(r.dependant)] if not inspect.iscoroutinefunction(call)})
    assert sync == []
