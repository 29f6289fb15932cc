"""`groupwise serve`'s process side: its arguments checked, the KV budget sized, uvicorn run.

server.py's `run_serve` loads the model and builds the app; `serve_app` serves it under the
connection limits of connections.py (a deadline on each request's head, a cap on open connections,
the open-file limit raised); docs/security.md lists them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_serve_args", "free_memory_bytes", "serve_app"]


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
    import os

    from groupwise.config import is_loopback
    from groupwise.errors import ConfigError

    problems = []
    if not is_loopback(args.host) and not args.api_key:
        problems.append(f"--host {args.host} is not a loopback address: anyone on the network could use the "
                        "model, so --api-key KEY is required")
    for path in args.adapter:
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            problems.append(f"--adapter {path}: no adapter_config.json there (expected a peft LoRA folder)")
    if problems:
        raise ConfigError(problems, what="serve arguments")
