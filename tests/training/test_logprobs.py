"""The frozen-head log-prob path (gradient formed in the forward) equals plain autograd."""

import pytest
import torch

from groupwise.training.logprobs import head_logprobs


def _case(dtype, bias: bool):
    g = torch.Generator().manual_seed(0)
    V, H, N = 37, 8, 11
    head = torch.nn.Linear(H, V, bias=bias).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g, dtype=dtype))
        if bias:
            head.bias.copy_(torch.randn(V, generator=g, dtype=dtype))
    head.requires_grad_(False)
    hidden_NH = torch.randn(N, H, generator=g, dtype=dtype, requires_grad=True)
    targets_N = torch.randint(0, V, (N,), generator=g)
    upstream_N = torch.randn(N, generator=g, dtype=dtype)
    return head, hidden_NH, targets_N, upstream_N


@pytest.mark.parametrize("bias", [False, True])
def test_fused_head_matches_autograd_in_fp64(bias):
    head, hidden_NH, targets_N, upstream_N = _case(torch.float64, bias)
    fused_N = head_logprobs(head, hidden_NH, targets_N, chunk_size=4)  # 3 chunks: 4 + 4 + 3
    (fused_N * upstream_N).sum().backward()
    fused_grad = hidden_NH.grad.clone()
    hidden_NH.grad = None
    plain_N = torch.log_softmax(head(hidden_NH), dim=-1).gather(-1, targets_N[:, None]).squeeze(-1)
    (plain_N * upstream_N).sum().backward()
    assert fused_N.dtype == torch.float64
    assert torch.allclose(fused_N, plain_N, atol=1e-12, rtol=0)
    assert torch.allclose(fused_grad, hidden_NH.grad, atol=1e-12, rtol=0)
    assert float(fused_grad.abs().max()) > 1e-3  # a real gradient, not zeros on both sides


def test_hand_computed_gradient_of_one_token():
    # V=2, H=1, W = [[1], [-1]], h = 0: logits (0, 0), softmax (1/2, 1/2), target 0.
    # lp = 0 - log 2; d lp / d h = W[0] - (1/2 W[0] + 1/2 W[1]) = 1 - 0 = 1.
    head = torch.nn.Linear(1, 2, bias=False).double().requires_grad_(False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0], [-1.0]]))
    h = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    lp = head_logprobs(head, h, torch.tensor([0]), chunk_size=8)
    lp.sum().backward()
    assert lp.item() == pytest.approx(-0.6931471805599453, abs=1e-15)
    assert h.grad.item() == pytest.approx(1.0, abs=1e-15)


def test_trainable_head_still_gets_its_gradient():
    head, hidden_NH, targets_N, upstream_N = _case(torch.float64, False)
    head.requires_grad_(True)  # e.g. peft modules_to_save: the checkpointed autograd path
    (head_logprobs(head, hidden_NH, targets_N, chunk_size=4) * upstream_N).sum().backward()
    fused_w = head.weight.grad.clone()
    head.weight.grad = None
    plain_N = torch.log_softmax(head(hidden_NH), dim=-1).gather(-1, targets_N[:, None]).squeeze(-1)
    (plain_N * upstream_N).sum().backward()
    assert torch.allclose(fused_w, head.weight.grad, atol=1e-12, rtol=0)


def test_bf16_head_gives_fp32_logprobs_close_to_fp32_reference():
    head, hidden_NH, targets_N, upstream_N = _case(torch.float32, False)
    ref_N = torch.log_softmax(head(hidden_NH), dim=-1).gather(-1, targets_N[:, None]).squeeze(-1)
    head16 = head.to(torch.bfloat16)
    h16 = hidden_NH.detach().to(torch.bfloat16).requires_grad_(True)
    lp_N = head_logprobs(head16, h16, targets_N, chunk_size=4)
    lp_N.sum().backward()
    assert lp_N.dtype == torch.float32 and h16.grad.dtype == torch.bfloat16
    # bf16 weights and inputs: ~3 significant digits on logits of size ~3
    assert torch.allclose(lp_N, ref_N, atol=0.1)
