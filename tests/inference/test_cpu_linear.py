"""fp32 CPU linears through oneDNN for the engine's passes (inference/cpu_linear.py)."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")

from groupwise.inference import cpu_linear  # noqa: E402
from groupwise.inference.engine import Engine, GenerationRequest  # noqa: E402
from groupwise.inference.sampling import SamplingParams  # noqa: E402
from groupwise.runtime.loading import tiny_random_model  # noqa: E402

pytestmark = pytest.mark.skipif(not cpu_linear.onednn_linear_available(), reason="this torch build has no oneDNN")


def test_onednn_linear_equals_f_linear_and_is_removed_after():
    torch.manual_seed(0)
    layer = torch.nn.Linear(96, 160)
    half = torch.nn.Linear(96, 160).to(torch.bfloat16)
    x_BTH = torch.randn(3, 40, 96)[:, ::2]  # 3-D and not contiguous, as a sliced hidden state is
    expected = torch.nn.functional.linear(x_BTH, layer.weight, layer.bias)
    with torch.no_grad(), cpu_linear.OneDNNLinears().installed([layer, half, torch.nn.Identity()]):
        assert "forward" in layer.__dict__ and "forward" not in half.__dict__  # fp32 only
        got = layer(x_BTH)
    assert got.shape == (3, 20, 160)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert "forward" not in layer.__dict__


def test_a_call_that_records_gradients_keeps_autograd():
    torch.manual_seed(0)
    layer = torch.nn.Linear(32, 16)
    x = torch.randn(4, 32, requires_grad=True)
    with cpu_linear.OneDNNLinears().installed([layer]):
        y = layer(x)
    assert y.grad_fn is not None  # F.linear, not the oneDNN op (which has no backward)
    y.sum().backward()
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(4, 32))
    assert layer.weight.grad is not None


async def _generate(eng, tok, temperature):
    prompts = [tok.apply_chat_template([{"role": "user", "content": "count " * (i + 2)}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"] for i in range(4)]
    rs = await asyncio.gather(*[eng.generate(GenerationRequest(
        p, max_new_tokens=12, ignore_eos=True, sampling=SamplingParams(temperature=temperature, seed=i)))
        for i, p in enumerate(prompts)])
    return [r.completions[0] for r in rs]


async def test_engine_with_onednn_linears_generates_what_it_does_without(tiny, monkeypatch):
    calls = []
    real = cpu_linear._onednn_forward

    def counted(self, x):
        calls.append(x.shape[0])
        return real(self, x)

    monkeypatch.setattr(cpu_linear, "_onednn_forward", counted)
    outs = {}
    for onednn in (True, False):
        model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
        eng = Engine(model, tok, max_batch_size=8, onednn_linear=onednn)
        try:
            calls.clear()
            outs[onednn] = await _generate(eng, tok, 1.0) + await _generate(eng, tok, 0.0)
            # 7 linears a layer and the LM head, in every pass (prefill and decode) with oneDNN only
            layers = model.config.num_hidden_layers
            assert (len(calls) > 0 and len(calls) % (7 * layers + 1) == 0) if onednn else not calls
        finally:
            eng.close()
    for a, b in zip(outs[True], outs[False]):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
