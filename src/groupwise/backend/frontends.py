"""The driver's process as the frontend of its workers' engine cores (`LocalBackend(engine_process="separate")`).

Why. A worker that serves its replica's app runs every rollout request's Python (HTTP, chat template,
tokenising, building the response) in the process and under the GIL of the loop that steps its engine;
on a GPU that per-request Python, not the forward passes, bounds tokens/s. With
``WorkerOptions.engine_core`` a worker serves each base's engine as an engine core
(inference/engine_core.py) instead, beside its trainer (they share the base weights), and this process
builds each core's app: the same app `groupwise serve --engine-process separate` builds, `create_app` over
a `ModelRegistry` over an `EngineCoreClient` (engine_client.py). Rollouts reach those apps in process
(an httpx ASGI transport, through backend/routing.py's router when there are several workers), and only
token ids, sampling settings and adapter names cross to the workers (inference/wire.py).

What stays with the worker: the model, the engine, the trainer, and the registry that loads and drops its
steps' adapters (the update, publish and retention commands of the pipe, unchanged: the engine is paused
for the update as in process). What this process keeps is a mirror of that registry
(`ModelRegistry.mirror_model`): after every command that can change what is served, the driver asks each
worker what its registry serves (`DeviceWorker.served_state`), waits until its client has heard from the
core of every adapter the engine holds (a status call answered after the core's announcement), and
mirrors it, so a request here resolves to an adapter the core has.

A worker that dies fails its requests at once: the client watches the core's pid (engine_client.py), the
app answers with an error, and the router asks the backend, which raises `WorkerError` naming the exit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from groupwise.backend.base import InferenceEndpoint

__all__ = ["CoreFrontend", "CoreFrontends"]

# DeviceWorker methods after which what a worker serves may have changed: its frontends mirror it again
SERVING_METHODS = frozenset({"load", "unload", "publish", "retain", "serve_step"})


@dataclass
class CoreFrontend:
    """One worker's core of one base, as this process sees it: its client, the mirrored registry, the app."""

    rank: int
    base_model: str
    address: str
    client: Any  # EngineCoreClient
    registry: Any  # ModelRegistry over the client
    app: Any  # create_app(registry): the app rollouts reach in process

    def close(self) -> None:
        self.client.close()


class CoreFrontends:
    """The frontends of every worker's cores (module doc), kept in step with the workers by `mirror`."""

    def __init__(self) -> None:
        self._cores: dict[tuple[int, str], CoreFrontend] = {}  # (rank, base model) -> its frontend
        self._runs: dict[str, str] = {}  # run name -> its base model
        self._tokenizers: dict[str, Any] = {}  # base model -> the tokenizer its frontends render with

    def add_tokenizer(self, base_model: str, tokenizer: Any) -> None:
        if tokenizer is not None:
            self._tokenizers.setdefault(base_model, tokenizer)

    def _connect(self, rank: int, base_model: str, address: str) -> CoreFrontend:
        from groupwise.inference.engine_client import connect_engine_core
        from groupwise.inference.registry import ModelRegistry
        from groupwise.inference.server import create_app

        client = connect_engine_core(address, self._tokenizers[base_model])
        registry = ModelRegistry(client, base_name=base_model)
        return CoreFrontend(rank, base_model, address, client, registry, create_app(registry))

    def mirror(self, states: list[dict[str, Any] | None]) -> None:
        """Apply each rank's `DeviceWorker.served_state` (None: a rank not asked): connect to new cores,
        close those of bases the worker closed, and mirror each run's served steps (module doc).
        Blocking (a status call per core): run it off the event loop."""
        for rank, state in enumerate(states):
            if state is None:
                continue
            cores = state["cores"]
            for (r, base), frontend in list(self._cores.items()):
                if r == rank and cores.get(base) != frontend.address:
                    del self._cores[(r, base)]
                    frontend.close()
            for base, address in cores.items():
                if (rank, base) not in self._cores:
                    self._cores[(rank, base)] = self._connect(rank, base, address)
            for (r, base), frontend in self._cores.items():
                if r != rank:
                    continue
                frontend.client.status()  # the core has told this client of every adapter its engine holds
                runs = {name: s for name, (b, s) in state["runs"].items() if b == base}
                for name, served in runs.items():
                    frontend.registry.mirror_model(name, served)
                    self._runs[name] = base
                for name in [n for n, b in self._runs.items() if b == base and n not in runs]:
                    frontend.registry.mirror_model(name, None)
        live = {name for state in states if state is not None for name in state["runs"]}
        for name in [n for n in self._runs if n not in live]:
            del self._runs[name]

    def of_run(self, name: str) -> list[CoreFrontend]:
        """The frontends serving run `name`, by rank."""
        base = self._runs.get(name)
        return [f for (_, b), f in sorted(self._cores.items()) if b == base]

    def endpoint(self, name: str, *, api_key: str, alive: Callable[[], None]) -> InferenceEndpoint:
        """Where run `name`'s requests go: its apps in this process, spread over the ranks by the router
        (backend/routing.py); `alive` raises the backend's error when a worker died."""
        from groupwise.backend.routing import in_process_endpoint

        return in_process_endpoint([f.app for f in self.of_run(name)], api_key=api_key, alive=alive)

    def close(self) -> None:
        for frontend in self._cores.values():
            frontend.close()
        self._cores.clear()
        self._runs.clear()


async def mirror_workers(frontends: CoreFrontends, call: Callable[..., Any], world_size: int) -> None:
    """Ask every worker what it serves and mirror it here (`CoreFrontends.mirror`)."""
    states = await call("served_state", [{}] * world_size)
    await asyncio.to_thread(frontends.mirror, states)
