"""Requests arriving while a training step swaps the served adapter, under load (real LocalBackend, real
openai client, tiny model): none fails, a request pinned to a step is answered by that step's adapter
alone, and one that follows the latest policy has each token from one adapter, the versions only moving
forward (a newer adapter takes over mid-sequence, by design: `Engine.retarget`)."""

from __future__ import annotations

import asyncio

import pytest

import groupwise as gw
from groupwise.core.choices import choice_policy_versions

pytest.importorskip("torch")

CLIENTS = 6
STEPS = 3


async def test_requests_during_adapter_swaps_under_load(tiny_model_dir, tmp_path):
    from backend_helpers import sample_groups

    model = gw.TrainableModel(name="swap", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), device="cpu", best_checkpoint_metric=None)
    await model.register(backend)
    client = model.openai_client()
    answers: list[tuple[str, list[int]]] = []
    failures: list[BaseException] = []
    training = True

    async def load(i: int) -> None:
        n = 0
        while training:
            name = f"{model.name}@0" if i % 3 == 0 else model.name  # pinned to the base, or the latest
            try:
                r = await client.chat.completions.create(
                    model=name, messages=[{"role": "user", "content": f"client {i} request {n}"}],
                    max_tokens=12, temperature=1.0, seed=1000 * i + n)
                answers.append((name, choice_policy_versions(r.choices[0])))
            except Exception as exc:  # a 500, a 404, a dropped connection: all count
                failures.append(exc)
            n += 1

    try:
        clients = [asyncio.create_task(load(i)) for i in range(CLIENTS)]
        for _ in range(STEPS):
            groups = await sample_groups(model)
            await model.train(groups, config=gw.TrainConfig(learning_rate=1e-2))
        training = False
        await asyncio.gather(*clients)
    finally:
        await backend.close()
    assert failures == []
    pinned = [v for name, v in answers if "@" in name]
    latest = [v for name, v in answers if "@" not in name]
    assert pinned and all(v and set(v) == {0} for v in pinned)
    assert latest and all(v and v == sorted(v) and set(v) <= set(range(STEPS + 1)) for v in latest)
    # the load did meet the swaps: the latest policy answered from more than one step
    assert len({v[0] for v in latest} | {v[-1] for v in latest}) > 1
