"""Adapter slots: a removed adapter's slot takes the next adapter of its shape in place."""

from __future__ import annotations

import pytest
import torch

from groupwise.inference.engine import Engine, EngineError, GenerationRequest
from groupwise.inference.sampling import SamplingParams
from groupwise.runtime.loading import tiny_random_model


def _rank8_adapter(path) -> str:
    from peft import LoraConfig, get_peft_model

    base, _ = tiny_random_model(seed=0)
    get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"])).save_pretrained(str(path))
    return str(path)


def _engine(tiny) -> Engine:
    """A fresh engine on the tiny model with tiny's tokenizer."""
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    return Engine(model, tok, max_batch_size=4)


def greedy(p, adapter):
    return GenerationRequest(p, max_new_tokens=8, ignore_eos=True, adapter=adapter, sampling=SamplingParams(temperature=0))


async def test_a_freed_slot_is_refilled_in_place_and_serves_the_new_weights(tiny, adapter_dirs, tmp_path):
    p = [1, 5, 9, 13, 17]
    # Reference: a fresh engine that only ever saw adapter 2.
    ref = _engine(tiny)
    try:
        ref.add_adapter("two", adapter_dirs[2])
        expected = (await ref.generate(greedy(p, "two"))).completions[0]
    finally:
        ref.close()

    eng = _engine(tiny)
    try:
        eng.add_adapter("one", adapter_dirs[1])
        first = (await eng.generate(greedy(p, "one"))).completions[0]
        slot = eng.peft_adapter_name("one")
        tensor = next(t for n, t in eng.model.named_parameters() if f".{slot}." in n and "lora_B" in n)
        address, adapters_before = tensor.data_ptr(), sorted(eng.model.peft_config)
        eng.remove_adapter("one")
        with pytest.raises(EngineError, match="not loaded"):
            eng.submit(greedy(p, "one"))
        eng.add_adapter("two", adapter_dirs[2])
        assert eng.peft_adapter_name("two") == slot  # the same slot ...
        assert sorted(eng.model.peft_config) == adapters_before  # ... so the layers' adapter set is unchanged
        assert tensor.data_ptr() == address  # copied in place: graphs captured for the slot stay valid
        got = (await eng.generate(greedy(p, "two"))).completions[0]
        assert got.token_ids == expected.token_ids != first.token_ids  # adapter 2's answer, not adapter 1's
        assert max(abs(a - b) for a, b in zip(got.logprobs, expected.logprobs)) < 1e-5
        # A free slot of another LoRA shape is not reused: rank 8 gets its own slot.
        eng.remove_adapter("two")
        eng.add_adapter("eight", _rank8_adapter(tmp_path / "r8"))
        assert eng.peft_adapter_name("eight") != slot
        other = adapter_dirs[1]
        with pytest.raises(EngineError, match="reserved"):
            eng.add_adapter("gw-slot-9", other)
        with pytest.raises(EngineError, match="not loaded"):
            eng.submit(greedy(p, slot))  # slots are not served under their own names
    finally:
        eng.close()


async def test_an_adapter_handed_over_in_memory_serves_as_its_folder_does(tiny, adapter_dirs):
    # What a trainer in the same process does after each step (backend/worker.py's publish): its
    # tensors and config, no files read back; into a new slot and into a freed one.
    from peft import PeftConfig
    from peft.utils import load_peft_weights

    p = [1, 5, 9, 13, 17]
    eng = _engine(tiny)
    try:
        eng.add_adapter("folder", adapter_dirs[2])
        expected = (await eng.generate(greedy(p, "folder"))).completions[0]
        weights = load_peft_weights(adapter_dirs[2], device="cpu")
        config = PeftConfig.from_pretrained(adapter_dirs[2])
        eng.add_adapter("new-slot", weights=weights, config=config)
        assert eng.peft_adapter_name("new-slot") != eng.peft_adapter_name("folder")
        eng.add_adapter("one", adapter_dirs[1])
        slot = eng.peft_adapter_name("one")
        eng.remove_adapter("one")
        eng.add_adapter("refilled", weights=weights, config=config)
        assert eng.peft_adapter_name("refilled") == slot
        for name in ("new-slot", "refilled"):
            got = (await eng.generate(greedy(p, name))).completions[0]
            assert got.token_ids == expected.token_ids
            assert max(abs(a - b) for a, b in zip(got.logprobs, expected.logprobs)) < 1e-5
        with pytest.raises(EngineError, match="a folder path, or weights with their config"):
            eng.add_adapter("both", adapter_dirs[1], weights=weights, config=config)
        with pytest.raises(EngineError, match="a folder path, or weights with their config"):
            eng.add_adapter("no-config", weights=weights)
    finally:
        eng.close()


def test_a_refilled_slot_holds_the_weights_by_peft_keys_and_refuses_other_keys(tiny, adapter_dirs):
    # The refill copies into the slot's tensors by peft's state-dict keys without peft's walk over the
    # model; weights of other keys (another shape that the config hides) go through peft and are refused.
    from peft import PeftConfig
    from peft.utils import load_peft_weights

    eng = _engine(tiny)
    try:
        eng.add_adapter("one", adapter_dirs[1])
        slot_tensors = eng.adapter_parameters("one")
        eng.remove_adapter("one")
        weights = load_peft_weights(adapter_dirs[2], device="cpu")
        config = PeftConfig.from_pretrained(adapter_dirs[2])
        eng.add_adapter("two", weights=weights, config=config)
        served = eng.adapter_parameters("two")
        assert served.keys() == weights.keys() and len(served) > 0
        assert all(served[k] is slot_tensors[k] for k in served)  # the same tensors, refilled in place
        assert all(torch.equal(served[k].cpu(), weights[k]) for k in weights)
        eng.remove_adapter("two")
        renamed = {k.replace("lora_A", "lora_X"): v for k, v in weights.items()}
        with pytest.raises(EngineError, match="does not have the LoRA shape its config says"):
            eng.add_adapter("bad", weights=renamed, config=config)
    finally:
        eng.close()
