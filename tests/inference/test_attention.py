"""The engine's decode attention (inference/attention.py): grouped-query attention without repeat_kv."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from groupwise.inference.attention import ENGINE_ATTENTION, decode_gqa_sdpa, engine_attention  # noqa: E402


def _reference(q_BHQD, k_BKLD, v_BKLD, mask_B11L, scale):
    """Attention written out: each query head h reads K/V head h // G (what repeat_kv builds)."""
    G = q_BHQD.shape[1] // k_BKLD.shape[1]
    k = k_BKLD.repeat_interleave(G, dim=1)
    v = v_BKLD.repeat_interleave(G, dim=1)
    scores = (q_BHQD @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask_B11L, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)  # [B, Q, H, D]


def test_decode_matches_attention_written_out_with_per_row_lengths():
    g = torch.Generator().manual_seed(0)
    B, H, Hkv, L, D = 3, 6, 2, 7, 8
    q = torch.randn(B, H, 1, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, L, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, L, D, generator=g, dtype=torch.float64)
    lengths = torch.tensor([2, 7, 4])  # each row attends to its own prefix
    mask = (torch.arange(L)[None, :] < lengths[:, None])[:, None, None, :]
    module = types.SimpleNamespace(num_key_value_groups=H // Hkv)
    out, weights = decode_gqa_sdpa(module, q, k, v, mask, scaling=0.125)
    assert weights is None and out.shape == (B, 1, H, D)
    torch.testing.assert_close(out, _reference(q, k, v, mask, 0.125), atol=1e-12, rtol=1e-12)
    # a key past a row's length cannot change that row
    k2 = k.clone()
    k2[:, :, 5] += 100.0  # column 5: past row 0's length, inside row 1's
    out2, _ = decode_gqa_sdpa(module, q, k2, v, mask, scaling=0.125)
    assert torch.equal(out2[0], out[0]) and not torch.equal(out2[1], out[1])


def test_prefill_goes_to_transformers_sdpa_unchanged():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 3, 8, generator=g)
    k = torch.randn(2, 2, 3, 8, generator=g)
    v = torch.randn(2, 2, 3, 8, generator=g)
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool).tril()
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True)
    ours, _ = decode_gqa_sdpa(module, q, k, v, mask, scaling=0.3)
    theirs, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    assert torch.equal(ours, theirs)


def test_engine_attention_switches_sdpa_configs_only_and_restores():
    from transformers import Qwen2Config

    config = Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=50)
    config._attn_implementation = "sdpa"
    with engine_attention(config):
        assert config._attn_implementation == ENGINE_ATTENTION
    assert config._attn_implementation == "sdpa"
    config._attn_implementation = "eager"
    with engine_attention(config):
        assert config._attn_implementation == "eager"
    assert config._attn_implementation == "eager"


async def test_engine_passes_run_without_cudnn_attention(tiny, cudnn_attention_at_each_call):
    """cuDNN's SDPA builds a graph per new shape, and prefill shapes change every pass
    (groupwise/runtime/attention_backends.py): every attention call of an engine pass sees it off, and the
    process's switch is back on afterwards."""
    from groupwise.inference.engine import Engine
    from groupwise.inference.requests import GenerationRequest

    seen = cudnn_attention_at_each_call
    model, tok = tiny
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with Engine(model, tok, max_batch_size=4) as engine:
        ids = tok("hello there", add_special_tokens=False)["input_ids"]
        result = await engine.generate(GenerationRequest(ids, max_new_tokens=3, ignore_eos=True))
    assert len(result.completions[0].token_ids) == 3
    layers = model.config.num_hidden_layers
    assert len(seen) >= 3 * layers and not any(seen)  # the prefill pass and two decode passes, every layer
    assert torch.backends.cuda.cudnn_sdp_enabled()
