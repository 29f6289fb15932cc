"""Checkpoints by name: ``async with model.pinned(k)`` pins a block of code to ``name@k`` (ART's
``pin_inference_step``), which stays served and kept while training goes on, over the real loopback HTTP
server and the real openai client; ``get_inference_name(step)`` names any step; a step no checkpoint
holds any more, or never trained, is refused before the block, and an unpinned old step is 404, never
silently answered by another adapter."""

from __future__ import annotations

import asyncio

import openai
import pytest
from backend_helpers import ask, checkpoint_steps, make_backend, sample_groups

import groupwise as gw


@pytest.mark.slow
async def test_a_block_pinned_to_a_checkpoint_keeps_it_served_and_kept_while_training_goes_on(tiny_model_dir, tmp_path, request):
    backend = make_backend("local", tmp_path, request, served_steps=1)
    model = gw.TrainableModel("agent", project="pins", base_model=tiny_model_dir)
    await model.register(backend)
    http = openai.AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key, max_retries=0)
    config = gw.TrainConfig(learning_rate=1e-2)
    try:
        await model.train(await sample_groups(model, step=0), config=config)
        assert model.get_inference_name() == "agent" and model.get_inference_name(1) == "agent@1"

        async with model.pinned(1) as name:
            assert name == "agent@1" == model.get_inference_name() == model.inference_name()
            assert model.get_inference_name(0) == "agent@0"  # an explicit step wins
            for step in (1, 2):  # training goes on inside the block
                await model.train(await sample_groups(model, step=step), config=config)
                if step == 1:
                    await backend.keep_best(model, 2)  # as the loop does: the latest (3) and the best (2) ...
            assert checkpoint_steps(model) == [1, 2, 3]  # ... and the pinned 1
            assert await ask(http, model.get_inference_name()) == "agent@1"  # served besides the latest
            assert await ask(http, "agent") == "agent@3"
            # a task started in the block samples from the pinned step too
            assert await asyncio.create_task(ask(http, model.get_inference_name())) == "agent@1"

        assert model.get_inference_name() == "agent"
        assert checkpoint_steps(model) == [2, 3]  # unpinned: retention removed it
        with pytest.raises(openai.NotFoundError, match="step '1' of 'agent' is not served"):
            await ask(http, "agent@1")  # refused loudly, never answered by another adapter
        with pytest.raises(gw.GroupwiseError, match="checkpoint of step 1"):
            async with model.pinned(1):
                raise AssertionError("a pruned checkpoint must be refused before the block")
        with pytest.raises(gw.GroupwiseError, match=r"pinned\(7\).*trained 3 step"):
            async with model.pinned(7):
                raise AssertionError("a step never trained must be refused before the block")
        async with model.pinned(0) as base:  # the base model, always served
            assert await ask(http, base) == "agent@0"
    finally:
        await http.close()
        await backend.close()
