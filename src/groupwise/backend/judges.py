"""Local judges: a base model served in process by groupwise's engine, as an OpenAI client.

The judge layer never imports the engine (it receives a client). It reaches these clients by name:
``ruler_score_group(group, "local/smollm2-135m")`` looks the ``local`` prefix up in the judge's
registry of client factories (`groupwise.judge.providers.CLIENT_FACTORIES`), whose entry names
`local_judge_client` here; the judge imports this module only when such a name is used, and a
missing backend extra is reported as the install to run.

`build_local_judge` is also what `LocalBackend.judge_client` uses, so both load a judge the same way.
"""

from __future__ import annotations

import threading
from typing import Any

from groupwise.backend.replica import API_KEY
from groupwise.config import DEFAULT_MAX_BATCH_SIZE
from groupwise.runtime.compute import compute_thread

__all__ = ["build_local_judge", "local_judge_client"]

_judges: dict[str, tuple[Any, Any]] = {}  # base model -> (engine, client): one engine per model per process
_judges_lock = threading.Lock()


def build_local_judge(base_model: str, *, device: str | None = None, dtype: str | None = None,
                      max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                      engine_kwargs: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """(engine, `openai.AsyncOpenAI` client) of `base_model` served in process: no key, no network.
    The caller closes the engine (`engine.close()`)."""
    from groupwise.inference.client import in_process_client
    from groupwise.inference.engine import Engine
    from groupwise.inference.registry import ModelRegistry
    from groupwise.inference.server import create_app
    from groupwise.runtime.loading import load_base_model

    lm, tokenizer = compute_thread().call(load_base_model, base_model, device=device, dtype=dtype)
    engine = Engine(lm, tokenizer, max_batch_size=max_batch_size, **(engine_kwargs or {}))
    return engine, in_process_client(create_app(ModelRegistry(engine, base_name=base_model)), api_key=API_KEY)


def local_judge_client(base_model: str) -> Any:
    """The process's client of `base_model` as a local judge, loaded on first use (default device and
    dtype) and kept for the process: judging every group of a run must not reload the weights. Its
    engine lives as long as the process (the compute thread that steps it is a daemon)."""
    with _judges_lock:
        if base_model not in _judges:
            _judges[base_model] = build_local_judge(base_model)
        return _judges[base_model][1]
