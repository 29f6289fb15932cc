"""The top-k estimate of the reverse KL to a distillation teacher (TrainConfig.distill_estimate='topk') and a
teacher on another base model: K_bt on a hand-made case, 0 when the teacher is the student, the exact KL when
the support is the whole vocabulary, its gradient moves the student toward the teacher, and a tiny student
sampling on its own comes closer to a teacher of another size."""

from __future__ import annotations

import math

import pytest
import torch
from gw_train_helpers import lora_model
from hypothesis import given, settings
from hypothesis import strategies as st

from groupwise.config import TrainConfig
from groupwise.errors import ConfigError
from groupwise.training.logprobs import topk_candidates
from groupwise.training.loss import grpo_loss, topk_reverse_kl
from groupwise.training.tokenize import TokenizedBatch, TokenizedSequence
from groupwise.training.trainer import Trainer


def _kl(p: list[float], q: list[float]) -> float:
    """KL(p || q) of two lists of probabilities, renormalised first, in plain floats."""
    p = [x / sum(p) for x in p]
    q = [x / sum(q) for x in q]
    return sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, q))


def test_the_topk_kl_is_the_kl_of_the_renormalised_distributions_on_the_support():
    logp_BTK = torch.log(torch.tensor([[[0.4, 0.2, 0.1, 0.4], [0.3, 0.3, 0.2, 0.1]],
                                       [[0.5, 0.1, 0.05, 0.05], [0.9, 0.05, 0.01, 0.01]]], dtype=torch.float64))
    teacher_BTK = torch.log(torch.tensor([[[0.1, 0.5, 0.2, 0.1], [0.6, 0.1, 0.1, 0.1]],
                                          [[0.2, 0.2, 0.3, 0.2], [0.7, 0.1, 0.1, 0.05]]], dtype=torch.float64))
    support_BTK = torch.tensor([[[1, 1, 1, 0], [0, 0, 0, 0]],  # a listed-twice candidate; an untrained position
                                [[1, 1, 1, 1], [1, 0, 0, 1]]], dtype=torch.bool)
    K_BT = topk_reverse_kl(logp_BTK, teacher_BTK, support_BTK)
    expected = [[_kl([0.4, 0.2, 0.1], [0.1, 0.5, 0.2]), 0.0],
                [_kl([0.5, 0.1, 0.05, 0.05], [0.2, 0.2, 0.3, 0.2]), _kl([0.9, 0.01], [0.7, 0.05])]]
    assert K_BT.flatten().tolist() == pytest.approx([x for row in expected for x in row], abs=1e-12)
    assert expected[0][0] > 0.1 and expected[1][1] > 0.001  # the case is not trivially near 0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.floats(0.1, 5.0))
def test_the_topk_kl_is_never_negative_and_zero_exactly_when_the_teacher_is_the_student(seed, K, scale):
    gen = torch.Generator().manual_seed(seed)
    logp_BTK = torch.randn(2, 3, K, generator=gen, dtype=torch.float64) * scale
    teacher_BTK = torch.randn(2, 3, K, generator=gen, dtype=torch.float64) * scale
    support_BTK = torch.rand(2, 3, K, generator=gen) < 0.7
    assert (topk_reverse_kl(logp_BTK, teacher_BTK, support_BTK) >= -1e-12).all()
    assert torch.equal(topk_reverse_kl(logp_BTK, logp_BTK.clone(), support_BTK), torch.zeros(2, 3, dtype=torch.float64))
    # shifting either side by a constant per position changes nothing: only the renormalised shape counts
    shifted_BTK = teacher_BTK + torch.randn(2, 3, 1, generator=gen, dtype=torch.float64)
    assert torch.allclose(topk_reverse_kl(logp_BTK, shifted_BTK, support_BTK),
                          topk_reverse_kl(logp_BTK, teacher_BTK, support_BTK), atol=1e-10)


def _heads(V=12, H=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    student, teacher = torch.nn.Linear(H, V, bias=False).double(), torch.nn.Linear(H + 2, V, bias=False).double()
    with torch.no_grad():
        student.weight.copy_(torch.randn(V, H, generator=gen, dtype=torch.float64))
        teacher.weight.copy_(torch.randn(V, H + 2, generator=gen, dtype=torch.float64))
    student.requires_grad_(False)
    teacher.requires_grad_(False)
    hidden_NH = torch.randn(7, H, generator=gen, dtype=torch.float64)
    teacher_hidden_NH = torch.randn(7, H + 2, generator=gen, dtype=torch.float64)
    return student, teacher, hidden_NH, teacher_hidden_NH


@pytest.mark.parametrize("chunk_size", [3, 100])
def test_with_k_the_whole_vocabulary_the_candidates_give_the_exact_reverse_kl(chunk_size):
    student, teacher, hidden_NH, teacher_hidden_NH = _heads()
    logp_NK, teacher_NK, support_NK = topk_candidates(student, hidden_NH, teacher, teacher_hidden_NH, k=50, vocab=12,
                                                      chunk_size=chunk_size)
    assert logp_NK.shape == (7, 24) and support_NK.sum(-1).tolist() == [12] * 7  # every id once in the support
    exact_N = [_kl(p, q) for p, q in zip(student(hidden_NH).softmax(-1).tolist(),
                                        teacher(teacher_hidden_NH).softmax(-1).tolist())]
    got_N = topk_reverse_kl(logp_NK[:, None], teacher_NK[:, None], support_NK[:, None])[:, 0]
    assert got_N.tolist() == pytest.approx(exact_N, abs=1e-10)


def test_the_support_is_the_union_of_both_top_k_over_the_shared_ids():
    student, teacher, hidden_NH, teacher_hidden_NH = _heads()
    vocab, k = 10, 3  # ids 10 and 11 exist in neither's shared range
    logp_NK, teacher_NK, support_NK = topk_candidates(student, hidden_NH, teacher, teacher_hidden_NH, k=k,
                                                      vocab=vocab, chunk_size=4)
    s_NV = torch.log_softmax(student(hidden_NH)[:, :vocab], -1)
    t_NV = torch.log_softmax(teacher(teacher_hidden_NH)[:, :vocab], -1)
    for n in range(7):
        union = set(t_NV[n].topk(k).indices.tolist()) | set(s_NV[n].topk(k).indices.tolist())
        ids = torch.tensor(sorted(union))
        assert int(support_NK[n].sum()) == len(union)
        # the candidates in the support are the union's ids, once each: both sides' log-probs there
        assert sorted(logp_NK[n][support_NK[n]].tolist()) == pytest.approx(sorted(s_NV[n, ids].tolist()), abs=1e-12)
        assert sorted(teacher_NK[n][support_NK[n]].tolist()) == pytest.approx(sorted(t_NV[n, ids].tolist()), abs=1e-12)


def test_a_gradient_step_on_the_topk_kl_moves_the_student_toward_the_teacher():
    student_V = torch.tensor([2.0, 0.0, -1.0, 0.5, -2.0], dtype=torch.float64)
    teacher_V = torch.tensor([-1.0, 2.0, 0.0, 0.5, -2.0], dtype=torch.float64)
    logits = student_V.clone().requires_grad_(True)
    support = torch.ones(1, 1, 5, dtype=torch.bool)

    def K(z):
        return topk_reverse_kl(torch.log_softmax(z, -1)[None, None], torch.log_softmax(teacher_V, -1)[None, None],
                               support)[0, 0]
    before = K(logits)
    before.backward()
    # the student over-weights token 0 and under-weights token 1, which the teacher prefers
    assert logits.grad[0] > 0 and logits.grad[1] < 0
    with torch.no_grad():
        after = K(logits - 0.1 * logits.grad)
    assert after < before


def test_in_the_loss_the_topk_kl_is_added_per_token_and_normalised_like_the_policy_loss():
    logp_BT = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, -1.5]], dtype=torch.float64, requires_grad=True)
    mask_BT = torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.bool)
    K_BT = torch.tensor([[9.0, 0.3, 0.1], [9.0, 0.2, 7.0]], dtype=torch.float64, requires_grad=True)
    common = dict(epsilon=0.2, epsilon_high=0.28, cispo=False, max_len=4, normalize="token", num_tokens=3,
                  num_sequences=2)
    A_B = torch.zeros(2, dtype=torch.float64)
    old_BT = torch.full_like(logp_BT, math.nan)
    terms = grpo_loss(logp_BT, old_BT, A_B, mask_BT, distill_kl_BT=K_BT, distill_coef=0.5, **common)
    assert terms.loss.item() == pytest.approx(0.5 * (0.3 + 0.1 + 0.2) / 3, abs=1e-12)  # off the mask: nothing
    assert terms.teacher_kl_sum.item() == pytest.approx(0.6, abs=1e-12)
    terms.loss.backward()
    assert K_BT.grad.flatten().tolist() == pytest.approx([0.0, 0.5 / 3, 0.5 / 3, 0.0, 0.5 / 3, 0.0], abs=1e-12)
    with pytest.raises(ConfigError, match="not both"):
        grpo_loss(logp_BT, old_BT, A_B, mask_BT, distill_kl_BT=K_BT, teacher_logprobs_BT=logp_BT.detach(),
                  distill_coef=0.5, **common)


def test_the_estimate_and_k_are_checked():
    assert TrainConfig(teacher="base").distill_estimate == "sampled"
    with pytest.raises(ConfigError, match="distill_estimate"):
        TrainConfig(distill_estimate="full")
    with pytest.raises(ConfigError, match="distill_top_k"):
        TrainConfig(distill_estimate="topk", distill_top_k=0)


def _batch() -> TokenizedBatch:
    gen = torch.Generator().manual_seed(2)
    seqs = []
    for b, n in enumerate((20, 18, 16, 14)):
        ids = torch.randint(3, 1000, (n,), generator=gen).tolist()
        mask = [t >= n // 2 for t in range(n)]
        seqs.append(TokenizedSequence(ids, mask, [math.nan] * n, advantage=(1.0, -1.0, 0.5, -0.5)[b], trajectory_index=b))
    return TokenizedBatch(sequences=seqs, num_groups=1)


def _grads(trainer: Trainer, config: TrainConfig):
    trainer._activate()
    trainer._set_mode(True)
    for _, p in trainer.trainable_named_parameters():
        p.grad = None
    stats, _ = trainer.forward_backward(_batch(), config)
    trainer._set_mode(False)
    return stats, {n: p.grad.clone() for n, p in trainer.trainable_named_parameters()}


def test_a_teacher_equal_to_the_student_adds_no_topk_kl_and_no_gradient(tokenizer):
    trainer = Trainer(lora_model(tokenizer))
    own = {n: p.detach().clone() for n, p in trainer.trainable_named_parameters()}
    trainer.set_teacher(own, source="itself")
    common = dict(micro_batch_tokens=40, max_seq_len=64, logprob_chunk_size=16)  # two micro-batches, several chunks
    stats, grads = _grads(trainer, TrainConfig(teacher="itself", distill_estimate="topk", distill_top_k=5, **common))
    assert abs(stats.teacher_kl_sum) < 1e-12
    _, plain = _grads(trainer, TrainConfig(**common))
    assert all(torch.allclose(grads[n], plain[n], atol=1e-12, rtol=0) for n in grads)


def _kls(student, teacher, ids_BT, k: int) -> tuple[float, float]:
    """(the exact KL(pi || pi_T) over the whole vocabulary, the top-k one), averaged over every position."""
    with torch.no_grad():
        s_BTV = student(input_ids=ids_BT).logits.log_softmax(-1)
        t_BTV = teacher(input_ids=ids_BT).logits.log_softmax(-1)
    teacher_BTk, student_BTk = t_BTV.topk(k, -1).indices, s_BTV.topk(k, -1).indices
    index_BTK = torch.cat([teacher_BTk, student_BTk], -1)
    support_BTK = torch.cat([torch.ones_like(teacher_BTk, dtype=torch.bool),
                             ~(student_BTk[..., None] == teacher_BTk[..., None, :]).any(-1)], -1)
    topk = topk_reverse_kl(s_BTV.gather(-1, index_BTK), t_BTV.gather(-1, index_BTK), support_BTK)
    return float((s_BTV.exp() * (s_BTV - t_BTV)).sum(-1).mean()), float(topk.mean())


def _tiny_teacher(tokenizer):
    """Another base than the student's (wider, deeper, its own weights; the student's tokenizer) whose LM head
    favours ids 100-115 in every context: a tiny task a student can learn from it in a few steps (a random
    model's own preferences are context noise no student fits from 64 tokens)."""
    from groupwise.runtime.loading import tiny_random_model

    teacher, _ = tiny_random_model(seed=7, tokenizer=tokenizer, dtype=torch.float64, hidden_size=96, num_hidden_layers=3)
    head = torch.nn.Linear(96, len(tokenizer), bias=True, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(teacher.lm_head.weight)
        head.bias.zero_()
        head.bias[100:116] = 8.0
    teacher.lm_head = head
    return teacher.requires_grad_(False)


def _sampled(model, prompts_BT, step):
    torch.manual_seed(100 + step)
    with torch.no_grad():  # the student samples (on policy: no old logprobs, rho = 1)
        out = model.generate(input_ids=prompts_BT.repeat(2, 1), attention_mask=torch.ones_like(prompts_BT.repeat(2, 1)),
                             do_sample=True, top_k=None, top_p=1.0, max_new_tokens=10, min_new_tokens=10, pad_token_id=0)
    n = prompts_BT.shape[1]
    return TokenizedBatch(sequences=[TokenizedSequence(row.tolist(), [t >= n for t in range(len(row))], [math.nan] * len(row),
                                                       advantage=0.0, trajectory_index=i) for i, row in enumerate(out)],
                          num_groups=1)


def test_a_student_distilled_with_topk_from_a_teacher_of_another_base_comes_closer_to_it(tokenizer):
    model = lora_model(tokenizer)
    trainer = Trainer(model)
    teacher = _tiny_teacher(tokenizer)
    trainer.set_teacher(None, source="tiny-teacher", model=teacher)
    config = TrainConfig(teacher="tiny-teacher", distill_estimate="topk", distill_top_k=16, learning_rate=0.2,
                         max_seq_len=64, micro_batch_tokens=512)
    gen = torch.Generator().manual_seed(5)
    prompts_BT = torch.randint(3, 1000, (4, 6), generator=gen)
    held_out_BT = torch.randint(3, 1000, (4, 16), generator=gen)  # contexts the student never trains on
    kls = [_kls(model, teacher, held_out_BT, 16)]
    for step in range(2):
        metrics = trainer.train_step(_sampled(model, prompts_BT, step), config, step=step)
        assert math.isfinite(metrics["teacher_kl"]) and metrics["teacher_kl"] > 1.0  # K_bt of the step's own tokens
        kls.append(_kls(model, teacher, held_out_BT, 16))
    (full_0, topk_0), (full_2, topk_2) = kls[0], kls[-1]
    # on contexts it never saw, the top-k KL falls by over 5% in two steps, and the exact KL over the whole
    # vocabulary falls too (slowly: most of the 49k tokens' mass is in the tail the top-k leaves out)
    assert topk_2 < 0.95 * topk_0 and full_2 < full_0, kls


def test_a_teacher_of_another_base_scores_the_sampled_tokens_with_its_own_model(tokenizer):
    model = lora_model(tokenizer)
    trainer = Trainer(model)
    teacher = _tiny_teacher(tokenizer)
    trainer.set_teacher(None, source="tiny-teacher", model=teacher)
    batch = _sampled(model, torch.randint(3, 1000, (2, 6), generator=torch.Generator().manual_seed(5)), 0)
    ids_BT = torch.tensor([s.input_ids for s in batch.sequences])
    with torch.no_grad():  # log pi - log pi_T at the sampled tokens, from both models' own forwards
        s_BT = model(input_ids=ids_BT).logits.log_softmax(-1)[:, :-1].gather(-1, ids_BT[:, 1:, None])[..., 0]
        t_BT = teacher(input_ids=ids_BT).logits.log_softmax(-1)[:, :-1].gather(-1, ids_BT[:, 1:, None])[..., 0]
    expected = float((s_BT - t_BT)[:, 5:].mean())  # the generated tokens: positions 6.. predicted from 5..
    metrics = trainer.train_step(batch, TrainConfig(teacher="tiny-teacher", learning_rate=1e-3, max_seq_len=64), step=0)
    assert metrics["teacher_kl"] == pytest.approx(expected, rel=1e-9)
    assert metrics["grad_norm"] > 0
