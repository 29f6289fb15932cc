"""What one rollout of the loop is handed: the model as seen at a fixed step (`AtStep`) and its
scenario, seeded (`seeded_scenario`).

Apart from the loop (fit.py) because these are what user code meets: a rollout function receives them,
a job names a baseline with `AtStep` (``groupwise train``'s SFT warm start), and a bench gathers with
`seeded_scenario` to sample what `gw.fit` would. Neither knows anything of the loop's steps.

Reproducible rollouts: a training scenario with a free ``sampling_seed`` (the built-in envs') is handed
to each rollout as a copy seeded from (seed, step, scenario, rollout), so which requests the engine
batched together, which depends on timing, does not decide what is sampled. Their logits still change
by ulps with the batch (so do the logprobs the update uses, and after a few steps a sample): two runs
match exactly only with the engine's ``batch_invariant`` mode (inference/batch_invariance.py), checked
bitwise for two runs in one process with different arrival times (tests/loop/test_loop_reproducible.py).
Separate processes under heavy CPU load (20 runs at once on 16 cores) were measured to part after two
steps, for a cause not yet found: treat bitwise equality across processes on a loaded machine as not
promised.
"""

from __future__ import annotations

import hashlib
from typing import Any


class AtStep:
    """A view of a trainable model whose requests go to ``name@step`` (a fixed checkpoint).

    Rollouts should ask for ``model.inference_name()`` (or ``model.name``); both answer ``name@step``.
    Everything else is the wrapped model's.
    """

    def __init__(self, model: Any, step: int) -> None:
        self._model, self._step = model, step

    def __getattr__(self, item: str) -> Any:
        return getattr(self._model, item)

    @property
    def name(self) -> str:
        return self._model.inference_name(self._step)

    def inference_name(self, step: int | None = None) -> str:
        return self._model.inference_name(self._step if step is None else step)

    def __repr__(self) -> str:
        return f"AtStep({self._model!r}, step={self._step})"


def seeded_scenario(scenario: Any, run_seed: int, step: int, index: int, rollout: int, attempt: int = 0) -> Any:
    """The scenario rollout `rollout` of group `index` sees at `step`: a copy whose free `sampling_seed`
    is a pure function of (run seed, step, scenario, rollout, attempt: a resampled batch draws anew),
    for scenarios that have such a field
    (pydantic models with ``sampling_seed=None``, as the built-in envs' `Sampling`); others unchanged.

    Why: unseeded rows draw from the engine's one generator in the order the engine happens to batch
    requests, which follows their arrival times, so the same seed gave different rollouts (and a
    different run) on a busy and on a quiet machine. A seeded row's sample depends only on its own
    logits (`inference/sampling.py`)."""
    if getattr(scenario, "sampling_seed", 0) is not None or not hasattr(scenario, "model_copy"):
        return scenario
    key = f"rollout:{run_seed}:{step}:{index}:{rollout}:{attempt}"
    digest = hashlib.blake2b(key.encode(), digest_size=4).digest()
    return scenario.model_copy(update={"sampling_seed": int.from_bytes(digest, "little")})
