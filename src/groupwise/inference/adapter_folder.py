"""A LoRA folder named by an HTTP client (`groupwise serve --lora-routes`, inference/adapter_routes.py), checked
and copied before the engine sees it.

peft reads whatever the path holds, on the engine's one compute thread: a FIFO or ``/dev/zero`` named
``adapter_model.safetensors`` blocks that thread for good (every client of every frontend then waits), a
missing safetensors file makes peft unpickle ``adapter_model.bin``, a path that is no folder makes it ask the
Hugging Face Hub, a huge ``r`` allocates that many rows per module, and a string ``target_modules`` is a
regex peft matches against every module name (one that backtracks stalls the thread). So the two files are
opened without blocking, must be regular files under a size limit, are copied into a private folder (what
the engine loads: the client's files may change after the check, the copy does not), and the config and
the tensors are checked first: a LoRA of bounded rank, listed target modules, finite weights. Pickles are
never read from a client's path.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterator
from typing import Any

from groupwise.errors import GroupwiseError

__all__ = ["MAX_ADAPTER_BYTES", "MAX_CONFIG_BYTES", "MAX_LORA_RANK", "AdapterFolderError", "checked_copy"]

MAX_LORA_RANK = 1024  # vLLM's largest --max-lora-rank; a rank past it is a memory attack, not an adapter
MAX_CONFIG_BYTES = 1 << 20
MAX_ADAPTER_BYTES = 8 << 30  # a rank-128 LoRA of every linear of a 70B model in fp32 is ~3.3 GB
CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
# Options that copy whole modules or layers per adapter (memory a client picks) or that the slots do not serve.
REFUSED_OPTIONS = ("modules_to_save", "layer_replication", "trainable_token_indices", "use_dora", "megatron_config")


class AdapterFolderError(GroupwiseError, ValueError):
    """A client's LoRA folder that the server will not load: the message says what to change."""


def _copy_regular(folder: str, name: str, limit: int, target: str) -> None:
    """Copy `folder`/`name` to `target`: opened without blocking (a FIFO opens at once, and is refused), a
    regular file of at most `limit` bytes, copied up to the size it had when checked (a file that grows is cut)."""
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        extra = (" (a pickled adapter_model.bin is never loaded from a client's path: save the adapter with "
                 "safetensors)") if name == WEIGHTS else ""
        raise AdapterFolderError(f"the LoRA folder has no {name}{extra}") from None
    except OSError as exc:
        raise AdapterFolderError(f"{name} cannot be opened: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as src:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise AdapterFolderError(f"{name} is not a regular file")
        if info.st_size > limit:
            raise AdapterFolderError(f"{name} is {info.st_size} bytes, over this server's limit of {limit}")
        os.set_blocking(fd, True)
        with open(target, "wb") as dst:
            left = info.st_size
            while left:
                chunk = src.read(min(left, 1 << 20))
                if not chunk:
                    break
                dst.write(chunk)
                left -= len(chunk)


def _rank(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LORA_RANK:
        raise AdapterFolderError(f"{what} must be an integer from 1 to {MAX_LORA_RANK}; got {str(value)[:40]}")


def check_config(raw: bytes) -> dict[str, Any]:
    """The parsed adapter_config.json of a LoRA this server will build modules for (the module doc)."""
    try:
        config = json.loads(raw)
    except (ValueError, RecursionError):
        raise AdapterFolderError(f"{CONFIG} is not valid JSON") from None
    if not isinstance(config, dict):
        raise AdapterFolderError(f"{CONFIG} must hold a JSON object")
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise AdapterFolderError(f"{CONFIG}: peft_type must be 'LORA'; got {str(config.get('peft_type'))[:40]!r}")
    _rank(config.get("r", 8), "r")
    for key in ("rank_pattern", "alpha_pattern"):
        pattern = config.get(key) or {}
        if not isinstance(pattern, dict) or len(pattern) > 4096:
            raise AdapterFolderError(f"{CONFIG}: {key} must be an object of at most 4096 entries")
        if key == "rank_pattern":
            for name, rank in pattern.items():
                _rank(rank, f"rank_pattern[{name[:40]!r}]")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise AdapterFolderError(f"{CONFIG}: lora_alpha must be a finite number")
    for key in ("target_modules", "exclude_modules"):
        value = config.get(key)
        if isinstance(value, str) and not (key == "target_modules" and value == "all-linear"):
            raise AdapterFolderError(f"{CONFIG}: {key} is a regular expression; this server takes a list of module "
                                     "names (or 'all-linear') from a client's folder")
        if value is not None and not isinstance(value, (str, list)):
            raise AdapterFolderError(f"{CONFIG}: {key} must be a list of module names")
        if isinstance(value, list) and not all(isinstance(v, str) and len(v) <= 256 for v in value[:4096]):
            raise AdapterFolderError(f"{CONFIG}: {key} must be a list of module names")
    if config.get("target_modules") is None:
        raise AdapterFolderError(f"{CONFIG}: target_modules is missing; list the module names the LoRA adapts")
    for key in REFUSED_OPTIONS:
        if config.get(key):
            raise AdapterFolderError(f"{CONFIG}: {key} is not served from a client's folder; save the adapter "
                                     "without it")
    return config


def check_weights(path: str) -> None:
    """A safetensors file whose floating-point tensors are all finite (NaN weights would answer every request
    with a server error)."""
    import torch
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                tensor = f.get_tensor(key)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    raise AdapterFolderError(f"{WEIGHTS}: tensor {key[:120]!r} holds NaN or infinite values")
    except AdapterFolderError:
        raise
    except Exception as exc:  # safetensors' own refusal of a malformed file
        raise AdapterFolderError(f"{WEIGHTS} is not a valid safetensors file: {str(exc)[:200]}") from None


@contextlib.contextmanager
def checked_copy(lora_path: str) -> Iterator[str]:
    """A private copy of the client's LoRA folder `lora_path` that passed the checks (the module doc), removed
    on exit (the engine holds the weights once loaded). AdapterFolderError says what is wrong."""
    if "\x00" in lora_path:
        raise AdapterFolderError("lora_path contains a NUL character")
    if not os.path.isabs(lora_path):
        raise AdapterFolderError(f"lora_path must be an absolute path on the server; got {lora_path[:200]!r} "
                                 "(no relative path, no '~', no Hugging Face Hub id)")
    try:
        if not stat.S_ISDIR(os.stat(lora_path).st_mode):
            raise AdapterFolderError(f"lora_path {lora_path[:200]!r} is not a folder")
    except OSError as exc:
        raise AdapterFolderError(f"lora_path {lora_path[:200]!r} cannot be read: {exc.strerror or exc}") from None
    with tempfile.TemporaryDirectory(prefix="gw-client-lora-") as private:
        config_path, weights_path = os.path.join(private, CONFIG), os.path.join(private, WEIGHTS)
        _copy_regular(lora_path, CONFIG, MAX_CONFIG_BYTES, config_path)
        with open(config_path, "rb") as f:
            check_config(f.read())
        _copy_regular(lora_path, WEIGHTS, MAX_ADAPTER_BYTES, weights_path)
        check_weights(weights_path)
        yield private
