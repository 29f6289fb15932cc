"""CUDA only: a trainer's update beside the engine's decode-graph replays on the model they share
(`Engine.paused(decoding=True)`, the update on a thread of its own as backend/worker.py runs it). The engine
decodes during the update, its tokens are those of an engine paused whole, and so is the update: the replays
run no module code, so the trainer's flags and forwards do not reach them, nor theirs the trainer."""

from __future__ import annotations

import asyncio

import pytest
import torch
from gw_train_helpers import random_batch

from groupwise.config import LoraConfig, TrainConfig
from groupwise.inference.engine import Engine, GenerationRequest
from groupwise.inference.sampling import SamplingParams
from groupwise.runtime.loading import tiny_random_model
from groupwise.training.adapters import wrap_with_lora
from groupwise.training.trainer import Trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs a CUDA device (the lead runs these on the GPU machine)")]


def _requests(tok, seed: int) -> list[GenerationRequest]:
    prompts = [tok.apply_chat_template([{"role": "user", "content": "hi " * (i + 1)}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"] for i in range(6)]
    # half the rows on the served slot, half on the base: the mixed (stacked-slot) graph
    return [GenerationRequest(p, max_new_tokens=900, ignore_eos=True, adapter="served" if i % 2 else None,
                              sampling=SamplingParams(seed=seed + i)) for i, p in enumerate(prompts)]


async def _one(tokenizer, decoding: bool) -> tuple[list[list[int]], dict[str, torch.Tensor], int]:
    model, tok = tiny_random_model(seed=0, tokenizer=tokenizer, device="cuda", dtype="float32")
    peft_model = wrap_with_lora(model, LoraConfig(rank=4, alpha=8))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device) * 0.05)
    trainer = Trainer(peft_model)
    eng = Engine(peft_model, tok, max_batch_size=8, initial_capacity=1024, decode_during_updates=decoding)  # no growth: it drops graphs
    try:
        from peft import get_peft_model_state_dict

        name = trainer.adapter_name
        weights = {k: v.detach().clone() for k, v in get_peft_model_state_dict(peft_model, adapter_name=name).items()}
        eng.add_adapter("served", weights=weights, config=peft_model.peft_config[name])
        await asyncio.gather(*[eng.generate(r) for r in _requests(tok, 100)])  # every bucket of these shapes captured
        tasks = [asyncio.ensure_future(eng.generate(r)) for r in _requests(tok, 0)]
        while len(eng.state.running) < 6:
            await asyncio.sleep(0.001)
        config = TrainConfig(micro_batch_tokens=24, max_seq_len=64, learning_rate=1e-3)
        async with eng.paused(decoding=decoding):
            passes = eng.stats.forward_passes
            for step in (1, 2, 3):
                await asyncio.to_thread(trainer.train_step, random_batch(vocab=500), config, step=step)
            during = eng.stats.forward_passes - passes
        results = await asyncio.gather(*tasks)
        adapter = {n: p.detach().cpu().clone() for n, p in trainer.trainable_named_parameters()}
        return [c.token_ids for r in results for c in r.completions], adapter, during
    finally:
        eng.close()


async def test_an_update_beside_decoding_changes_neither_the_tokens_nor_the_update(tokenizer):
    paused_tokens, paused_adapter, paused_during = await _one(tokenizer, decoding=False)
    tokens, adapter, during = await _one(tokenizer, decoding=True)
    assert paused_during == 0 and during > 0  # the engine decoded while the trainer updated
    assert tokens == paused_tokens
    assert adapter.keys() == paused_adapter.keys()
    for n in adapter:
        assert torch.equal(adapter[n], paused_adapter[n]), n
