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
        # the workers' commands overlap (backend/processes.py): one mirror at a time, each of a state read
        # after the command that asked for it
        self._mirroring = asyncio.Lock()

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
        Blocking (a status call per core): run it off the event loop, which reads the maps meanwhile (so
        they are built aside and swapped in whole)."""
        cores, runs = dict(self._cores), dict(self._runs)
        for rank, state in enumerate(states):
            if state is None:
                continue
            for (r, base), frontend in list(cores.items()):
                if r == rank and state["cores"].get(base) != frontend.address:
                    del cores[(r, base)]
                    frontend.close()
            for base, address in state["cores"].items():
                if (rank, base) not in cores:
                    cores[(rank, base)] = self._connect(rank, base, address)
            for (r, base), frontend in cores.items():
                if r != rank:
                    continue
                frontend.client.status()  # the core has told this client of every adapter its engine holds
                served = {name: s for name, (b, s) in state["runs"].items() if b == base}
                for name, model_state in served.items():
                    frontend.registry.mirror_model(name, model_state)
                    runs[name] = base
                for name in [n for n, b in runs.items() if b == base and n not in served]:
                    frontend.registry.mirror_model(name, None)
        live = {name for state in states if state is not None for name in state["runs"]}
        self._cores, self._runs = cores, {n: b for n, b in runs.items() if n in live}

    def of_run(self, name: str) -> list[CoreFrontend]:
        """The frontends serving run `name`, by rank."""
        base = self._runs.get(name)
        return [f for (_, b), f in sorted(self._cores.items(), key=lambda kv: kv[0]) if b == base]

    def dead_ranks(self) -> list[int]:
        """The ranks whose core a client here has seen die."""
        return sorted({f.rank for f in self._cores.values() if f.client.failure is not None})

    def endpoint(self, name: str, *, api_key: str, processes: Any) -> InferenceEndpoint:
        """Where run `name`'s requests go: its apps in this process, spread over the ranks by the router
        (backend/routing.py), which on an error answer asks the workers (`WorkerProcesses.check_alive`) to
        raise the backend's error when one died."""
        from groupwise.backend.routing import in_process_endpoint

        return in_process_endpoint([f.app for f in self.of_run(name)], api_key=api_key,
                                   alive=lambda: processes.check_alive(dying=self.dead_ranks()))

    async def call(self, processes: Any, method: str, kwargs: "list[dict[str, Any] | None]") -> list[Any]:
        """`WorkerProcesses.call`, with these frontends kept in step: the first rank's tokenizer of each base
        loaded, what the workers serve mirrored after a command that may change it, the frontends closed
        before the workers close (and their cores stop)."""
        if method == "close":
            self.close()
        results = await processes.call(method, kwargs)
        if method == "load":
            for kw, info in zip(kwargs, results):
                if kw is not None and info is not None:
                    self.add_tokenizer(kw["spec"].base_model, info.get("tokenizer"))
        if method in SERVING_METHODS:
            async with self._mirroring:
                states = await processes.call("served_state", [{}] * len(kwargs))
                await asyncio.to_thread(self.mirror, states)
        return results

    def close(self) -> None:
        for frontend in self._cores.values():
            frontend.close()
        self._cores.clear()
        self._runs.clear()

