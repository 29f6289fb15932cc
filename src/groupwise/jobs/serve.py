"""`groupwise serve`: a model and LoRA adapters over an OpenAI-compatible HTTP API (groupwise.inference.serve)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from groupwise.config import (DEFAULT_ENGINE_PROCESS, DEFAULT_FRONTENDS, DEFAULT_MAX_BATCH_SIZE, EngineProcess,
                              frontends_problem)
from groupwise.inference.request_limits import DEFAULT_MAX_BODY_BYTES
from groupwise.jobs.common import (Dtype, allowed_host_field, api_key_field, device_field, dtype_field, host_field, local_model_problem,
                                   loopback_problem, port_field, served_name_problem)
from groupwise.jobs.fields import Command, Job, arg


def _adapter_problem(path: str) -> str | None:
    """An adapter is a peft LoRA folder; a run folder (or a store of runs) is refused naming the newest
    checkpoint under it, the folder to pass."""
    from pathlib import Path

    from groupwise.runs.store import CHECKPOINTS_DIR, find_runs

    if os.path.isfile(os.path.join(path, "adapter_config.json")):
        return None
    if not os.path.exists(path):
        return "does not exist (expected a peft LoRA folder, such as a run's checkpoints/NNNN)"
    for run in find_runs(Path(path)):  # the first run with a checkpoint, its latest
        saved = [c for c in (run / CHECKPOINTS_DIR).glob("[0-9]*") if (c / "adapter_config.json").is_file()]
        if saved:
            latest = max(saved, key=lambda c: int(c.name) if c.name.isdigit() else -1)
            return f"no adapter_config.json there; a run's checkpoints are its adapters: pass one, e.g. {latest}"
    return "no adapter_config.json there (expected a peft LoRA folder, such as a run's checkpoints/NNNN)"


@dataclass
class ServeJob(Job):
    model: str = arg(help="base model: short name (smollm2-135m), Hugging Face id or local path",
                     on_machine=local_model_problem)
    adapter: list[str] = arg(default_factory=list, repeat=True, metavar="DIR", on_machine=_adapter_problem,
                             help="a LoRA adapter folder to serve (repeatable); served as <name>@<step> or by "
                                  "folder name")
    host: str = host_field()
    port: int = port_field(8000)
    api_key: str | None = api_key_field()
    allowed_host: list[str] = allowed_host_field()
    name: str | None = arg(None, help="served model name (default: the --model value)", check=served_name_problem)
    device: str | None = device_field()
    dtype: Dtype | None = dtype_field()
    max_batch_size: int = arg(DEFAULT_MAX_BATCH_SIZE, low=1,
                              help="sequences decoded together, and the most choices (n) a request may ask")
    max_body_bytes: int = arg(DEFAULT_MAX_BODY_BYTES, low=1, help="larger request bodies are refused with 413")
    max_kv_gb: float | None = arg(None, low=0, low_open=True,
                                  help="the KV cache's largest size; the context shrinks to what it holds at "
                                       "--max-batch-size (default: a third of the memory free at startup)")

    engine_process: EngineProcess = arg(
        DEFAULT_ENGINE_PROCESS, help="where the engine runs: in this process, or 'separate' (a core process of its "
        "own that the server's frontend processes feed over ZeroMQ, so the HTTP work never holds up the GPU); "
        "'auto': in process on the CPU (measured faster there), separate on CUDA")
    frontends: str = arg(
        DEFAULT_FRONTENDS, check=frontends_problem, metavar="K",
        help="processes that each serve the whole API on --host:--port, feeding one engine core process (the "
             "kernel spreads connections over them); a number, or 'auto': 1 on the CPU, min(4, CPUs - 1) on "
             "CUDA (measured on an H200 at 256 chats: 2 frontends 1.63x, 4 1.98x the in-process server). More "
             "than 1 needs the engine separate; a frontend that dies is replaced")
    lora_routes: bool = arg(False, help="also serve vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter: "
                                         "any client that may use the model may then load a LoRA folder of this "
                                         "machine (every frontend serves what one loads)")

    def rules(self) -> list[str]:
        problems = [p for p in [loopback_problem(self.host, self.api_key, exposes="use the model")] if p]
        if self.engine_process == "in_process" and str(self.frontends) not in ("auto", "1"):
            problems.append(f"--frontends {self.frontends} needs the engine in a core process of its own: drop "
                            "--engine-process in_process (or pass --frontends 1)")
        return problems


def run(job: ServeJob) -> int:
    from groupwise.inference.serve import serve_model

    serve_model(job.model, adapters=job.adapter, host=job.host, port=job.port, api_key=job.api_key, name=job.name,
                allowed_hosts=job.allowed_host,
                device=job.device, dtype=job.dtype, max_batch_size=job.max_batch_size,
                max_body_bytes=job.max_body_bytes, max_kv_gb=job.max_kv_gb, engine_process=job.engine_process,
                frontends=job.frontends, lora_routes=job.lora_routes)
    return 0


COMMAND = Command("serve", ServeJob, run, help="serve a model (and LoRA adapters) over an OpenAI-compatible HTTP API")
