"""Hand-computed advantages, and the GRPO loss and its gradient on a two-sequence toy batch."""

from __future__ import annotations

import math

import pytest
import torch

from groupwise.core.advantages import compute_advantages, group_advantages
from groupwise.training.loss import grpo_loss


def test_group_advantages_scaled_and_unscaled():
    # rewards [0, 1, 2, 3]: mean 1.5; centred [-1.5, -0.5, 0.5, 1.5]
    # population var = (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25, std = sqrt(1.25) = 1.118034
    # scaled: -1.5 / 1.118034 = -1.341641, -0.5 / 1.118034 = -0.447214
    assert group_advantages([0, 1, 2, 3], scale=False) == [-1.5, -0.5, 0.5, 1.5]
    scaled = group_advantages([0, 1, 2, 3], scale=True)
    assert scaled == pytest.approx([-1.341641, -0.447214, 0.447214, 1.341641], abs=1e-5)
    # two rewards {0, 1}: mean 0.5, std 0.5 -> {-1, +1}
    assert group_advantages([0.0, 1.0]) == pytest.approx([-1.0, 1.0], abs=1e-5)


def test_rewards_too_large_to_square_keep_their_signal():
    """n rewards of 1e154 or more overflow a float when squared and summed: the group's advantages came
    out nan ([1e308, 1e308, 0, 0]) or silently zero ([1e308, -1e308], [1e200, 0, 0, 0]). They are the
    same function of rewards scaled by a power of two. By hand: two rewards +-x have mean 0 and std x,
    so +-1; [x, 0, 0, 0] has mean x/4 and std x*sqrt(3)/4, so [sqrt(3), -1/sqrt(3) x 3]."""
    assert group_advantages([1e308, -1e308]) == pytest.approx([1.0, -1.0], rel=1e-12)
    assert group_advantages([1e308, 1e308, 0.0, 0.0]) == pytest.approx([1.0, 1.0, -1.0, -1.0], rel=1e-12)
    r3 = 3 ** 0.5
    assert group_advantages([1e200, 0.0, 0.0, 0.0]) == pytest.approx([r3, -1 / r3, -1 / r3, -1 / r3], rel=1e-12)
    assert group_advantages([-1e300, 0.0], scale=False) == pytest.approx([-5e299, 5e299], rel=1e-12)
    assert group_advantages([1e308, 1e308]) is None  # still a tie


def test_zero_variance_groups_are_skipped_and_counted():
    adv = compute_advantages([[1.0, 1.0, 1.0], [0.0, 1.0], [0.5], [2.0, 2.0]])
    assert adv.advantages[0] is None and adv.advantages[2] is None and adv.advantages[3] is None
    assert adv.advantages[1] == pytest.approx([-1.0, 1.0], abs=1e-5)
    assert adv.zero_variance_groups == 3
    assert adv.zero_variance_fraction == 0.75


def _toy_batch():
    """Two sequences, T=3. Sequence 0 (A=+1) trains all 3 tokens, sequence 1 (A=-1) its first 2.

    ratios rho = exp(logp - old):
      seq 0: logp = log[.5, .5, .5], old = log[.5, .25, .5]  -> rho = [1, 2, 1]
      seq 1: logp = log[.25, .55], old = log[.5, .5]          -> rho = [0.5, 1.1]; position 2 is padding
    """
    logp = torch.tensor(
        [[math.log(0.5), math.log(0.5), math.log(0.5)], [math.log(0.25), math.log(0.55), float("nan")]],
        dtype=torch.float64, requires_grad=True,
    )
    old = torch.tensor(
        [[math.log(0.5), math.log(0.25), math.log(0.5)], [math.log(0.5), math.log(0.5), float("nan")]],
        dtype=torch.float64,
    )
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    return logp, old, adv, mask


def _loss(logp, old, adv, mask, **kw):
    args = dict(epsilon=0.2, epsilon_high=0.28, cispo=False, normalize="token", num_tokens=5, num_sequences=2, max_len=4)
    args.update(kw)
    return grpo_loss(logp, old, adv, mask, **args)


def test_ppo_loss_and_gradient_token_level():
    # PPO per token l = -min(rho A, clip(rho, 0.8, 1.28) A):
    #   seq 0: rho 1 -> -1;  rho 2 -> clip 1.28 < 2 -> -1.28 (clipped, no gradient);  rho 1 -> -1
    #   seq 1: rho 0.5, A=-1: min(-0.5, -0.8) = -0.8 -> +0.8 (clipped);  rho 1.1: -(-1.1) = +1.1
    # token-level: L = (-1 - 1.28 - 1 + 0.8 + 1.1) / 5 = -1.38 / 5 = -0.276
    # dL/dlogp = -A rho / 5 where unclipped: seq 0 [-0.2, 0, -0.2], seq 1 [0, +1.1/5 = 0.22, 0]
    logp, old, adv, mask = _toy_batch()
    terms = _loss(logp, old, adv, mask)
    assert float(terms.loss) == pytest.approx(-0.276, abs=1e-12)
    terms.loss.backward()
    expected = torch.tensor([[-0.2, 0.0, -0.2], [0.0, 0.22, 0.0]], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected, atol=1e-12)
    assert float(terms.clipped_tokens) == 2.0 and float(terms.tokens) == 5.0


def test_ppo_loss_sequence_and_constant_normalisation():
    # sequence: seq 0 mean (-1 - 1.28 - 1) / 3 = -1.093333, seq 1 mean (0.8 + 1.1) / 2 = 0.95
    #   L = (-1.093333 + 0.95) / 2 = -0.0716667; grads: seq 0 [-1/6, 0, -1/6], seq 1 [0, 1.1/4 = 0.275, 0]
    logp, old, adv, mask = _toy_batch()
    terms = _loss(logp, old, adv, mask, normalize="sequence")
    assert float(terms.loss) == pytest.approx((-3.28 / 3 + 1.9 / 2) / 2, abs=1e-12)
    terms.loss.backward()
    expected = torch.tensor([[-1 / 6, 0.0, -1 / 6], [0.0, 0.275, 0.0]], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected, atol=1e-12)
    # constant (Dr. GRPO): sum / (num_sequences * max_len) = -1.38 / (2 * 4) = -0.1725
    logp, old, adv, mask = _toy_batch()
    assert float(_loss(logp, old, adv, mask, normalize="constant").loss) == pytest.approx(-0.1725, abs=1e-12)


def test_cispo_loss_and_gradient():
    # CISPO l = -sg[clip(rho, 0.8, 1.28)] A logp; clipped weights: seq 0 [1, 1.28, 1], seq 1 [0.8, 1.1]
    #   sum = -(1 + 1.28 + 1) log .5 + (0.8 log .25 + 1.1 log .55)
    #       = 3.28 * 0.693147 + (0.8 * -1.386294 + 1.1 * -0.597837) = 2.273523 - 1.766656 = 0.506867
    #   L = 0.506867 / 5 = 0.101373; grads -w A / 5: seq 0 [-0.2, -0.256, -0.2], seq 1 [0.16, 0.22, 0]
    logp, old, adv, mask = _toy_batch()
    terms = _loss(logp, old, adv, mask, cispo=True)
    expected_sum = -3.28 * math.log(0.5) + 0.8 * math.log(0.25) + 1.1 * math.log(0.55)
    assert float(terms.loss) == pytest.approx(expected_sum / 5, abs=1e-12)
    assert float(terms.loss) == pytest.approx(0.101373, abs=1e-6)
    terms.loss.backward()
    expected = torch.tensor([[-0.2, -0.256, -0.2], [0.16, 0.22, 0.0]], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected, atol=1e-12)


def test_k3_kl_term():
    # One token, A = 0 (no policy term): logp = log .5, ref = log .25 -> q = ref - logp = log .5
    # k3 = exp(q) - q - 1 = 0.5 + 0.693147 - 1 = 0.193147; L = 0.1 * k3 / 1 = 0.0193147
    # dk3/dlogp = -exp(q) + 1 = 0.5 -> dL/dlogp = 0.05
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    terms = grpo_loss(
        logp, logp.detach().clone(), torch.zeros(1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.bool),
        epsilon=0.2, epsilon_high=None, cispo=False, normalize="token", num_tokens=1, num_sequences=1, max_len=1,
        ref_logprobs_BT=ref, kl_coef=0.1,
    )
    assert float(terms.kl_sum) == pytest.approx(0.5 + math.log(2) - 1, abs=1e-12)
    assert float(terms.loss) == pytest.approx(0.1 * (0.5 + math.log(2) - 1), abs=1e-12)
    terms.loss.backward()
    assert float(logp.grad) == pytest.approx(0.05, abs=1e-12)


def test_masked_positions_change_nothing():
    # Context (mask 0) positions may hold anything: changing their logprob or old logprob moves no number.
    logp, old, adv, mask = _toy_batch()
    base = _loss(logp, old, adv, mask)
    base.loss.backward()
    grad = logp.grad.clone()
    logp2 = logp.detach().clone()
    logp2[1, 2] = -7.0
    logp2.requires_grad_(True)
    old2 = old.clone()
    old2[1, 2] = -0.1
    changed = _loss(logp2, old2, adv, mask)
    changed.loss.backward()
    assert float(changed.loss) == float(base.loss)
    assert torch.equal(logp2.grad, grad)


def test_nan_old_logprob_means_on_policy():
    # old = NaN: rho = 1, so PPO gives l = -A and gradient -A / N (as if sampled by the current policy)
    logp = torch.tensor([[math.log(0.3)]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[float("nan")]], dtype=torch.float64)
    terms = grpo_loss(
        logp, old, torch.tensor([2.0], dtype=torch.float64), torch.ones(1, 1, dtype=torch.bool),
        epsilon=0.2, epsilon_high=0.28, cispo=False, normalize="token", num_tokens=1, num_sequences=1, max_len=1,
    )
    terms.loss.backward()
    assert float(terms.loss) == pytest.approx(-2.0) and float(logp.grad) == pytest.approx(-2.0)


def test_kl_needs_reference():
    logp, old, adv, mask = _toy_batch()
    with pytest.raises(ValueError, match="ref_logprobs_BT"):
        _loss(logp, old, adv, mask, kl_coef=0.1)


def test_tis_weights_tokens_by_the_truncated_behaviour_ratio():
    # Decoupled PPO: rho = pi / sg[pi] = 1 (no PPO clip), each token weighted by w~ = min(pi / mu, C), C = 1.5.
    #   behaviour ratios w: seq 0 [1, 2, 1], seq 1 [0.5, 1.1] -> truncated: seq 0 [1, 1.5, 1] (one capped), seq 1 same
    #   l = -w~ A: seq 0 [-1, -1.5, -1], seq 1 (A = -1) [+0.5, +1.1] -> L = (-3.5 + 1.6) / 5 = -0.38
    #   dL/dlogp = -w~ A / 5: seq 0 [-0.2, -0.3, -0.2], seq 1 [0.1, 0.22, 0]
    logp, old, adv, mask = _toy_batch()
    terms = _loss(logp, old, adv, mask, off_policy="tis", importance_cap=1.5)
    assert float(terms.loss) == pytest.approx(-0.38, abs=1e-12)
    terms.loss.backward()
    expected = torch.tensor([[-0.2, -0.3, -0.2], [0.1, 0.22, 0.0]], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected, atol=1e-12)
    assert float(terms.capped_tokens) == 1.0 and float(terms.clipped_tokens) == 0.0
    assert float(terms.ratio_sum) / float(terms.tokens) == pytest.approx((1 + 2 + 1 + 0.5 + 1.1) / 5, abs=1e-12)


def test_mis_masks_the_tokens_past_the_cap():
    # MIS, C = 1.5: the w = 2 token is dropped (weight 0), the others keep w: seq 0 [1, 0, 1], seq 1 [0.5, 1.1]
    #   L = (-1 - 0 - 1 + 0.5 + 1.1) / 5 = -0.08; grads seq 0 [-0.2, 0, -0.2], seq 1 [0.1, 0.22, 0]
    logp, old, adv, mask = _toy_batch()
    terms = _loss(logp, old, adv, mask, off_policy="mis", importance_cap=1.5)
    assert float(terms.loss) == pytest.approx(-0.08, abs=1e-12)
    terms.loss.backward()
    expected = torch.tensor([[-0.2, 0.0, -0.2], [0.1, 0.22, 0.0]], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected, atol=1e-12)
    assert float(terms.capped_tokens) == 1.0


def test_cispo_with_tis():
    # CISPO under correction: l = -w~ sg[clip(rho = 1)] A log pi; w~ as in the TIS test
    #   sum = -(1 + 1.5 + 1) log .5 + (0.5 log .25 + 1.1 log .55); the gradient is TIS's (-w~ A / 5)
    logp, old, adv, mask = _toy_batch()
    terms = _loss(logp, old, adv, mask, cispo=True, off_policy="tis", importance_cap=1.5)
    expected_sum = -3.5 * math.log(0.5) + 0.5 * math.log(0.25) + 1.1 * math.log(0.55)
    assert float(terms.loss) == pytest.approx(expected_sum / 5, abs=1e-12)
    terms.loss.backward()
    expected = torch.tensor([[-0.2, -0.3, -0.2], [0.1, 0.22, 0.0]], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected, atol=1e-12)


def test_off_policy_settings_are_checked():
    from groupwise.config import TrainConfig
    from groupwise.errors import ConfigError

    assert TrainConfig().off_policy == "none" and TrainConfig().importance_cap == 2.0
    with pytest.raises(ConfigError, match="importance_cap"):
        TrainConfig(off_policy="tis", importance_cap=1.0)
    with pytest.raises(ConfigError, match="off_policy"):
        TrainConfig(off_policy="is")
    logp, old, adv, mask = _toy_batch()
    with pytest.raises(ValueError, match="importance_cap"):
        _loss(logp, old, adv, mask, off_policy="tis")
