"""The optional vLLM engine: same interface; runs only where vLLM and a GPU exist."""

from __future__ import annotations

import pytest

from groupwise.inference.vllm_engine import vllm_available


def test_vllm_engine_generates_with_logprobs(tmp_path):
    if not vllm_available():
        pytest.skip("vLLM not installed (optional extra 'vllm', GPU machines only)")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a CUDA device")
    from groupwise.inference.engine import GenerationRequest
    from groupwise.inference.vllm_engine import VLLMEngine
    from groupwise.runtime.loading import load_base_model

    model, tok = load_base_model("smollm2-135m", device="cpu")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    engine = VLLMEngine(str(tmp_path), max_batch_size=8, gpu_memory_utilization=0.3)
    try:
        ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                      tokenize=True, return_dict=True)["input_ids"]
        result = engine.submit(GenerationRequest(ids, max_new_tokens=8, n=2)).result(timeout=300)
        assert [len(c.token_ids) == len(c.logprobs) for c in result.completions] == [True, True]
    finally:
        engine.close()
