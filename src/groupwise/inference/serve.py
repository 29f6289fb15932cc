"""`groupwise serve`'s process side: the model loaded, the KV budget sized, the app of server.py served.

`serve_model` takes its settings as arguments (the serve job, groupwise/jobs/serve.py, owns their
defaults and checks them); `serve_app` serves under the connection limits of connections.py (a deadline
on each request's head, a cap on open connections, the open-file limit raised); docs/security.md lists
them. With the engine in a core process of its own, frontends.py serves the same app from several
processes on one port, each under the same limits.
"""

from __future__ import annotations

import os
from typing import Any

from groupwise.runtime.memory import free_memory_bytes

__all__ = ["app_routers", "free_memory_bytes", "serve_app", "serve_model"]


def serve_app(app: Any, host: str, port: int) -> None:
    """Serve `app` over HTTP with uvicorn until stopped, under the connection limits."""
    import uvicorn

    from groupwise.inference.connections import uvicorn_config

    config = uvicorn_config(app, host, port)
    print(f"connections: at most {config.limit_concurrency - 1} open, a request's head within "
          f"{config.http.head_timeout_s:g} s")
    try:
        uvicorn.Server(config).run()
    except KeyboardInterrupt:  # as uvicorn.run: a second Ctrl-C during the shutdown
        pass


def serve_model(model: str, *, adapters: list[str], host: str, port: int, api_key: str | None, name: str | None,
                device: str | None, dtype: str | None, max_batch_size: int, max_body_bytes: int,
                max_kv_gb: float | None, allowed_hosts: list[str] | tuple[str, ...] = (),
                engine_process: str | None = None, frontends: str | int | None = None,
                lora_routes: bool = False) -> None:
    """Load the base model `model` and the LoRA `adapters`, and serve them over HTTP until stopped.

    Served as `name` (default: `model`): ``name`` (latest step), ``name@0`` (the base), ``name@<step>``
    for an adapter folder named by its step, else by its folder name. The KV cache holds at most
    `max_kv_gb` (default: a third of the memory free after loading: growing the cache holds the old
    buffers beside the new ones for a moment). `allowed_hosts`: names besides localhost and `host` that
    requests may call the server by (groupwise.core.http_guard). `engine_process` and `frontends`: the
    engine in this process, or in a core process of its own fed over ZeroMQ by `frontends` processes that
    each serve the app on host:port (frontends.py; `engine_core.resolve_engine_process` says what "auto"
    picks and what was measured). `lora_routes`: vLLM's routes that load and unload adapters."""
    from groupwise.runtime.compute import compute_thread
    from groupwise.inference.engine import Engine
    from groupwise.inference.registry import ModelRegistry
    from groupwise.inference.server import create_app
    from groupwise.inference.engine_core import resolve_engine_process
    from groupwise.runtime.loading import load_base_model, resolve_device

    placement = resolve_engine_process(engine_process, resolve_device(device).type, frontends)
    if placement.mode == "separate":
        from groupwise.inference.engine_client import start_engine_core

        # The core loads the model and sizes its KV cache; the frontends keep the HTTP work, the
        # tokenizer and the responses.
        engine = start_engine_core(model, device=device, dtype=dtype, max_kv_gb=max_kv_gb,
                                   engine_kwargs={"max_batch_size": max_batch_size})
        print(f"engine core: pid {engine.core_pid} at {engine.address}", flush=True)
    else:
        # loaded on the thread that will run the engine (groupwise/runtime/compute.py: one OpenMP team)
        weights, tokenizer = compute_thread().call(load_base_model, model, device=device, dtype=dtype)
        budget = int(max_kv_gb * 2**30) if max_kv_gb else free_memory_bytes(next(weights.parameters()).device) // 3
        engine = Engine(weights, tokenizer, max_batch_size=max_batch_size, max_kv_bytes=budget)
        print(f"KV cache: at most {budget / 2**30:.1f} GiB, {engine.context_length} tokens per sequence x "
              f"{engine.max_batch_size} sequences (--max-kv-gb, --max-batch-size)")
    try:
        registry = ModelRegistry(engine, base_name=model)
        _load_adapters(registry, model, name or model, adapters)
        print(f"serving {registry.served_ids()} on http://{host}:{port}/v1", flush=True)
        if placement.mode == "separate":
            from groupwise.inference.frontends import FrontendSpec, serve_frontends

            spec = FrontendSpec(core=engine.address, tokenizer=model, base_name=model, name=name, host=host, port=port,
                                api_key=api_key, allowed_hosts=list(allowed_hosts), max_body_bytes=max_body_bytes,
                                lora_routes=lora_routes, supervisor_pid=os.getpid(), ready_fd=-1)
            serve_frontends(engine, spec, placement.frontends)
        else:
            serve_app(create_app(registry, api_key=api_key, max_body_bytes=max_body_bytes, allowed_hosts=allowed_hosts,
                                 bound_host=host, routers=app_routers(lora_routes)), host, port)
    finally:
        engine.close()


def app_routers(lora_routes: bool) -> list[Any]:
    """The routes `groupwise serve` adds to server.py's: vLLM's adapter routes when asked for."""
    if not lora_routes:
        return []
    from groupwise.inference.adapter_routes import lora_routes as routes

    return [routes]


def _load_adapters(registry: Any, model: str, name: str, adapters: list[str]) -> None:
    """The ``--adapter`` folders: a folder named by a step serves that step of `name`, any other its name."""
    if name != model:
        registry.register_model(name)  # served as name (latest step), name@0 (base), name@<step>
    for path in adapters:
        folder = os.path.basename(os.path.normpath(path))
        if folder.isascii() and folder.isdigit() and name != model:  # int() refuses "²"
            served = registry.add_step(name, int(folder), path)
        else:
            registry.add_alias(folder, path)
            served = folder
        print(f"serving adapter {path} as {served!r}")
