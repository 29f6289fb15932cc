"""`groupwise serve`: load the base model and its adapters, serve the app of server.py with uvicorn.

The connection limits (a deadline on each request's head, a cap on open connections, raised
open-file limit) are connections.py's; docs/security.md lists them.
"""

from __future__ import annotations

from typing import Any

from groupwise.compute import compute_thread

__all__ = ["check_serve_args", "free_memory_bytes", "run_serve"]


def run_serve(args) -> int:
    """`groupwise serve`: load the base model and adapters, serve over HTTP with uvicorn."""
    import gc
    import os

    import uvicorn

    from groupwise.inference.connections import raise_fd_limit, serve_options
    from groupwise.inference.engine import Engine
    from groupwise.inference.registry import ModelRegistry
    from groupwise.inference.server import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, create_app
    from groupwise.loading import load_base_model

    check_serve_args(args)
    # loaded on the thread that will run the engine (groupwise/compute.py: one OpenMP team)
    model, tokenizer = compute_thread().call(load_base_model, args.model, device=args.device, dtype=args.dtype)
    gb = getattr(args, "max_kv_gb", None)
    # a third of what is free: growing the cache holds the old buffers beside the new ones for a moment
    budget = int(gb * 2**30) if gb else free_memory_bytes(next(model.parameters()).device) // 3
    engine = Engine(model, tokenizer, max_batch_size=getattr(args, "max_batch_size", 32), max_kv_bytes=budget)
    print(f"KV cache: at most {budget / 2**30:.1f} GiB, {engine.context_length} tokens per sequence x "
          f"{engine.max_batch_size} sequences (--max-kv-gb, --max-batch-size)")
    name = args.name or args.model
    registry = ModelRegistry(engine, base_name=args.model)
    if name != args.model:
        registry.register_model(name)  # served as name (latest step), name@0 (base), name@<step>
    for path in args.adapter:
        folder = os.path.basename(os.path.normpath(path))
        if folder.isdigit() and name != args.model:
            served = registry.add_step(name, int(folder), path)
        else:
            registry.add_alias(folder, path)
            served = folder
        print(f"serving adapter {path} as {served!r}")
    print(f"serving {registry.served_ids()} on http://{args.host}:{args.port}/v1")
    app = create_app(registry, api_key=args.api_key,
                     max_body_bytes=getattr(args, "max_body_bytes", DEFAULT_MAX_BODY_BYTES))
    # Everything loaded so far (torch, the model, transformers: millions of objects) lives as long
    # as the server: out of the collector's sight, a request that allocates many objects no longer
    # triggers full collections that walk all of it (each a pause of every caller).
    gc.freeze()
    options = serve_options(fd_limit=raise_fd_limit())
    print(f"connections: at most {options['limit_concurrency'] - 1} open, a request's head within "
          f"{options['http'].head_timeout_s:g} s, its body within {DEFAULT_BODY_TIMEOUT_S:g} s")
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info", **options)
    finally:
        engine.close()
    return 0


def free_memory_bytes(device: Any) -> int:
    """Memory free for the KV cache: the GPU's free memory, or the host's MemAvailable (Linux)."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return 8 * 2**30  # not Linux: assume a modest machine


def check_serve_args(args) -> None:
    """Refuse `groupwise serve` arguments before any model is loaded (a ConfigError, one line per problem)."""
    import ipaddress
    import os

    from groupwise.errors import ConfigError

    problems = []
    loopback = args.host == "localhost"
    try:
        loopback = loopback or ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        pass
    if not loopback and not args.api_key:
        problems.append(f"--host {args.host} is not a loopback address: anyone on the network could use the "
                        "model, so --api-key KEY is required")
    for path in args.adapter:
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            problems.append(f"--adapter {path}: no adapter_config.json there (expected a peft LoRA folder)")
    if problems:
        raise ConfigError(problems, what="serve arguments")
