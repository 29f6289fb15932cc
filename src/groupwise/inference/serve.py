"""`groupwise serve`'s process side: the model loaded, the KV budget sized, the app of server.py served.

`serve_model` takes its settings as arguments (the serve job, groupwise/jobs/serve.py, owns their
defaults and checks them); `serve_app` serves under the connection limits of connections.py (a deadline
on each request's head, a cap on open connections, the open-file limit raised); docs/security.md lists
them.
"""

from __future__ import annotations

from typing import Any

from groupwise.runtime.memory import free_memory_bytes

__all__ = ["free_memory_bytes", "serve_app", "serve_model"]


def serve_app(app: Any, host: str, port: int) -> None:
    """Serve `app` over HTTP with uvicorn until stopped, under the connection limits."""
    import gc

    import uvicorn

    from groupwise.inference.connections import raise_fd_limit, serve_options

    # Everything loaded so far (torch, the model, transformers: millions of objects) lives as long
    # as the server: out of the collector's sight, a request that allocates many objects no longer
    # sets off full collections that walk all of it (each a pause of every caller).
    gc.freeze()
    options = serve_options(fd_limit=raise_fd_limit())
    print(f"connections: at most {options['limit_concurrency'] - 1} open, a request's head within "
          f"{options['http'].head_timeout_s:g} s")
    uvicorn.run(app, host=host, port=port, log_level="info", **options)


def serve_model(model: str, *, adapters: list[str], host: str, port: int, api_key: str | None, name: str | None,
                device: str | None, dtype: str | None, max_batch_size: int, max_body_bytes: int,
                max_kv_gb: float | None, allowed_hosts: list[str] | tuple[str, ...] = (),
                engine_process: str | None = None) -> None:
    """Load the base model `model` and the LoRA `adapters`, and serve them over HTTP until stopped.

    Served as `name` (default: `model`): ``name`` (latest step), ``name@0`` (the base), ``name@<step>``
    for an adapter folder named by its step, else by its folder name. The KV cache holds at most
    `max_kv_gb` (default: a third of the memory free after loading: growing the cache holds the old
    buffers beside the new ones for a moment). `allowed_hosts`: names besides localhost and `host` that
    requests may call the server by (groupwise.core.http_guard). `engine_process`: the engine in this
    process, or in a core process of its own that this one feeds over ZeroMQ (engine_core.py; "auto": in
    process, since this server is one frontend: `resolve_engine_process` says what was measured)."""
    import os

    from groupwise.runtime.compute import compute_thread
    from groupwise.inference.engine import Engine
    from groupwise.inference.registry import ModelRegistry
    from groupwise.inference.server import create_app
    from groupwise.inference.engine_core import resolve_engine_process
    from groupwise.runtime.loading import load_base_model, resolve_device

    if resolve_engine_process(engine_process, resolve_device(device).type) == "separate":
        from groupwise.inference.engine_client import start_engine_core

        # The core loads the model and sizes its KV cache; this process keeps the HTTP work, the
        # tokenizer and the responses.
        engine = start_engine_core(model, device=device, dtype=dtype, max_kv_gb=max_kv_gb,
                                   engine_kwargs={"max_batch_size": max_batch_size})
        print(f"engine core: pid {engine.core_pid} at {engine.address}")
    else:
        # loaded on the thread that will run the engine (groupwise/runtime/compute.py: one OpenMP team)
        weights, tokenizer = compute_thread().call(load_base_model, model, device=device, dtype=dtype)
        budget = int(max_kv_gb * 2**30) if max_kv_gb else free_memory_bytes(next(weights.parameters()).device) // 3
        engine = Engine(weights, tokenizer, max_batch_size=max_batch_size, max_kv_bytes=budget)
        print(f"KV cache: at most {budget / 2**30:.1f} GiB, {engine.context_length} tokens per sequence x "
              f"{engine.max_batch_size} sequences (--max-kv-gb, --max-batch-size)")
    name = name or model
    registry = ModelRegistry(engine, base_name=model)
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
    print(f"serving {registry.served_ids()} on http://{host}:{port}/v1")
    app = create_app(registry, api_key=api_key, max_body_bytes=max_body_bytes, allowed_hosts=allowed_hosts,
                     bound_host=host)
    try:
        serve_app(app, host, port)
    finally:
        engine.close()
