"""Fields several jobs share (the base model, the run store, the device, a served name, a bind address),
declared once with their help and checks, so the commands spell and check them alike."""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from groupwise.config import DEFAULT_BASE_MODEL, DEFAULT_RUN_STORE
from groupwise.jobs.fields import arg

__all__ = ["Dtype", "allowed_host_field", "api_key_field", "device_field", "dtype_field",
           "folder_name_problem", "host_field", "loopback_problem", "model_field", "port_field", "run_dir_field",
           "served_name_problem", "store_field"]

# What `groupwise.runtime.loading.resolve_dtype` accepts, as the command line spells it.
Dtype = Literal["float32", "bfloat16", "float16", "fp32", "bf16", "fp16"]
_DEVICE = re.compile(r"cpu|mps|cuda(:[0-9]+)?")  # fullmatch: `$` would let "cpu\n" through


def device_problem(value: Any) -> str | None:
    if isinstance(value, str) and _DEVICE.fullmatch(value):
        return None
    return f"must be cpu, cuda, cuda:N or mps, got {value!r}"


def device_here_problem(device: str) -> str | None:
    """Whether this machine has the device (torch is imported only for a device other than the CPU)."""
    if device == "cpu":
        return None
    import torch

    if device == "mps":
        return None if torch.backends.mps.is_available() else "no MPS device here; use --device cpu"
    if not torch.cuda.is_available():
        return "no CUDA device here (torch.cuda.is_available() is False); use --device cpu"
    count = torch.cuda.device_count()
    if ":" in device and int(device.split(":")[1]) >= count:
        return f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
    return None


def local_model_problem(model: str) -> str | None:
    """A model given as a path (not a short name or hub id) must be a folder that save_pretrained wrote."""
    if not model.startswith(("/", "./", "../", "~", ".\\")):
        return None  # a short name or a Hugging Face id: only loading can check it
    path = os.path.expanduser(model)
    if not os.path.isdir(path):
        what = "is a file" if os.path.exists(path) else "does not exist"
        return (f"{what}; a local model is a folder with config.json and weights (or pass a short name such "
                "as smollm2-135m, or a Hugging Face id)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        return "no config.json in that folder (a local model is a folder that save_pretrained wrote)"
    return None


def store_problem(store: str) -> str | None:
    """The run store must be a folder, or creatable as one (the nearest part of it that exists is a folder
    this user may write in); what only writing finds out (a full disk, /proc) the run's lock refuses."""
    at = os.path.abspath(os.path.expanduser(store))
    while not os.path.exists(at) and os.path.dirname(at) != at:
        at = os.path.dirname(at)
    if not os.path.isdir(at):
        return f"{at} is a file, not a folder; the run store is a folder of runs"
    if not os.access(at, os.W_OK):
        return f"{at} cannot be written here (read-only, or not yours); pass a writable folder"
    return None


def served_name_problem(value: Any) -> str | None:
    """A model name requests use: ``name@3`` asks for step 3 of ``name``, so a name has no '@'."""
    if isinstance(value, str) and value and "@" not in value:
        return None
    return f"must be a non-empty name without '@' (it separates the step, as in name@3), got {value!r}"


def folder_name_problem(value: Any) -> str | None:
    """A project or model name names a folder of the run store."""
    from groupwise.runs.store import folder_name_problem as problem

    found = problem(value)
    return f"{value!r} {found}" if found else None


def run_name_problem(value: Any) -> str | None:
    """A trained model's name: a folder of the run store and a served name."""
    return served_name_problem(value) or folder_name_problem(value)


def loopback_problem(host: str, api_key: str | None, *, exposes: str) -> str | None:
    """The rule `serve` and `dashboard` share: off loopback, anyone on the network could reach `exposes`."""
    from groupwise.core.validated import is_loopback

    if is_loopback(host) or api_key:
        return None
    return (f"--host {host} is not a loopback address: anyone on the network could {exposes}, so --api-key KEY "
            "is required")


def model_field(help: str = "base model: short name (smollm2-135m), Hugging Face id or local path") -> Any:
    return arg(DEFAULT_BASE_MODEL, help=help, on_machine=local_model_problem)


def store_field() -> Any:
    return arg(DEFAULT_RUN_STORE, help="run store folder", on_machine=store_problem)


def device_field() -> Any:
    return arg(None, help="cpu, cuda, cuda:N or mps (default: cuda when available)", check=device_problem,
               on_machine=device_here_problem)


def dtype_field() -> Any:
    return arg(None, help="weights' dtype (default: bf16 on CUDA, fp32 on CPU)")


def host_field() -> Any:
    return arg("127.0.0.1", help="bind address (any other than loopback needs --api-key)")


def allowed_host_field() -> Any:
    from groupwise.core.http_guard import allowed_host_problem

    return arg(default_factory=list, repeat=True, metavar="NAME", check=allowed_host_problem,
               help="also answer requests that name this server NAME (NAME:PORT for that port only; * for any "
                    "name): a name other than localhost or its address is refused, against web pages that point "
                    "their own name at it (repeatable)")


def port_field(default: int) -> Any:
    return arg(default, help="port", low=0, high=65535)


def api_key_field() -> Any:
    return arg(None, help="require this bearer token (required off loopback)")


def run_dir_problem(value: str) -> str | None:
    """A run folder to read; a base path or a project is refused with the runs it holds."""
    from groupwise.runs.store import run_dir_problem as problem

    return problem(value)


def run_dir_field() -> Any:
    return arg(help="a run folder: <base_path>/<project>/models/<model>", positional=True, on_machine=run_dir_problem)
