"""Numbers that cannot overflow: the off-policy ratio, the importance weights, the KL term and the
advantages are formed in log space with explicit bounds (training/loss.py, deviation 8;
training/advantages.py, ADVANTAGE_LIMIT), so a sampler logprob any distance below (or above) the
trainer's gives a finite loss in every `off_policy` mode, and nothing non-finite reaches history.jsonl
(the writer refuses it, naming the field)."""

from __future__ import annotations

import dataclasses as dc
import json
import math

import pytest
import torch
from gw_train_helpers import lora_model

from groupwise.config import TrainConfig
from groupwise.errors import GroupwiseWarning, InvalidDataError, StoreError
from groupwise.runs.history import RunHistory
from groupwise.core.readers import parse_json
from groupwise.runs.store import history_row, train_metrics
from groupwise.core.advantages import ADVANTAGE_LIMIT, compute_advantages
from groupwise.training.loss import LOG_RATIO_LIMIT, grpo_loss
from groupwise.training.tokenize import TokenizedBatch, TokenizedSequence
from groupwise.training.trainer import Trainer
from groupwise.core.trajectory import Trajectory, TrajectoryGroup

F32_MAX = float(torch.finfo(torch.float32).max)  # 3.4028e38
BF16_MAX = float(torch.finfo(torch.bfloat16).max)  # 3.3895e38
# How far the sampler's logprob is from the trainer's: 1e300 is a finite Python float that is inf in float32.
GAPS = [0.0, 50.0, 100.0, 1e30, BF16_MAX, F32_MAX, 1e300, math.inf]
MODES = ["none", "tis", "mis"]


def _loss(gap: float, mode: str, *, cispo: bool, sign: float, dtype: torch.dtype, kl: bool):
    """A micro-batch of two sequences whose sampled tokens have the sampler's logprob `gap` below the
    trainer's (sequence 0) and `gap` above it (sequence 1), advantages +-1 (`sign` flips them)."""
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.7, -1.2, -0.1]], dtype=torch.float32)
    logp = logp.to(dtype).requires_grad_(True)
    old = torch.stack([logp.detach().double()[0] - gap, logp.detach().double()[1] + gap])
    ref = torch.stack([logp.detach().double()[0] + gap, logp.detach().double()[1] - gap]) if kl else None
    mask = torch.tensor([[0, 1, 1], [0, 1, 1]], dtype=torch.bool)
    terms = grpo_loss(logp, old.to(dtype), torch.tensor([sign, -sign], dtype=dtype), mask, epsilon=0.2,
                      epsilon_high=0.28, cispo=cispo, normalize="token", num_tokens=4, num_sequences=2,
                      max_len=3, ref_logprobs_BT=None if ref is None else ref.to(dtype), kl_coef=0.1 if kl else 0.0,
                      off_policy=mode, importance_cap=2.0)
    terms.loss.backward()
    return terms, logp.grad


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cispo", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_gap_gives_a_finite_loss_gradient_and_ratio_in_every_mode(mode, cispo, dtype):
    for gap in GAPS:
        for sign in (1.0, -1.0):
            for kl in (False, True):
                terms, grad = _loss(gap, mode, cispo=cispo, sign=sign, dtype=dtype, kl=kl)
                where = f"gap {gap}, A {sign}, kl {kl}"
                for name in ("loss", "policy_loss_sum", "kl_sum", "ratio_sum", "clipped_tokens", "capped_tokens"):
                    assert math.isfinite(float(getattr(terms, name))), (name, where)
                assert torch.isfinite(grad).all(), where
                # the ratio to the sampler never passes its bound: e^20 per token
                assert float(terms.ratio_sum) <= 4 * math.exp(LOG_RATIO_LIMIT) * 1.01, where
                if gap == 0.0:
                    assert float(terms.ratio_sum) == pytest.approx(4.0), where  # on policy: every ratio is 1


def test_inside_the_bound_the_loss_is_the_equation():
    # gap 5 (ratio e^5 ~ 148, weight capped at C = 2 by TIS): the bound changes nothing here
    terms, _ = _loss(5.0, "tis", cispo=False, sign=1.0, dtype=torch.float64, kl=False)
    w = [2.0, 2.0, math.exp(-5.0), math.exp(-5.0)]  # min(pi/mu, C): seq 0 sampled 5 nats lower, seq 1 higher
    A = [1.0, 1.0, -1.0, -1.0]
    expected = sum(-wi * min(1.0 * a, max(min(1.0, 1.28), 0.8) * a) for wi, a in zip(w, A)) / 4
    assert float(terms.loss) == pytest.approx(expected, rel=1e-12)
    assert float(terms.ratio_sum) == pytest.approx(2 * math.exp(5) + 2 * math.exp(-5), rel=1e-12)


def _batch(gap: float, lengths=(12, 10, 9, 8), vocab=1000) -> TokenizedBatch:
    gen = torch.Generator().manual_seed(3)
    seqs = []
    for b, n in enumerate(lengths):
        ids = torch.randint(3, vocab, (n,), generator=gen).tolist()
        mask = [t >= n // 2 for t in range(n)]
        # the sampler's logprob `gap` nats below any the trainer can give (its own are about -7 here)
        old = [-(7.0 + gap) if m else math.nan for m in mask]
        seqs.append(TokenizedSequence(ids, mask, old, advantage=[1.0, -1.0, 0.5, -0.5][b], trajectory_index=b))
    return TokenizedBatch(sequences=seqs, num_groups=1)


@pytest.mark.parametrize("mode", MODES)
def test_a_sampler_far_below_the_trainer_trains_a_finite_step_and_writes_a_finite_row(tokenizer, tmp_path, mode):
    """The issue's failure: a sampler logprob far below the trainer's made `ratio_mean: Infinity` in
    history.jsonl, and with off_policy="none" a step refused as if the learning rate were too high."""
    model = lora_model(tokenizer, dtype=torch.float32)
    trainer = Trainer(model)
    history = RunHistory(tmp_path / mode)
    for step, gap in enumerate([0.0, 100.0, 1e30, F32_MAX, 1e300]):
        batch = _batch(gap)
        metrics = trainer.train_step(batch, TrainConfig(off_policy=mode, max_seq_len=64, learning_rate=1e-5),
                                     step=step)
        assert all(math.isfinite(v) for v in metrics.values() if isinstance(v, float)), (gap, metrics)
        assert metrics["ratio_mean"] <= math.exp(LOG_RATIO_LIMIT) * 1.01
        history.append(history_row([], step=step, split="train", metrics=train_metrics(metrics)))
    for line in (tmp_path / mode / "history.jsonl").read_text().splitlines():
        row = parse_json(line)  # strict: refuses NaN and Infinity
        assert math.isfinite(row["ratio_mean"]) and math.isfinite(row["loss"])


def test_an_advantage_the_loss_cannot_multiply_is_refused_naming_the_group_and_trajectory():
    with pytest.raises(InvalidDataError, match=r"^group 1, trajectory 0: its advantage is -1e\+300 .*scale_rewards"):
        compute_advantages([[0.0, 1.0], [-1e300, 1e300]], scale=False)
    with pytest.raises(InvalidDataError, match=r"^group 0, trajectory 0: its advantage is -1.35e\+308"):
        compute_advantages([[-1e308, 1.7e308]], scale=False)
    # scaled, the same rewards are +-1; unscaled rewards inside the bound are kept as they are
    assert compute_advantages([[-1e300, 1e300]]).advantages[0] == pytest.approx([-1.0, 1.0])
    assert compute_advantages([[0.0, ADVANTAGE_LIMIT]], scale=False).advantages[0] == [-ADVANTAGE_LIMIT / 2,
                                                                                      ADVANTAGE_LIMIT / 2]


# ------------------------------------------------------------------------ nothing non-finite is written

@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_the_history_writer_refuses_a_non_finite_number_naming_the_field(tmp_path, value):
    history = RunHistory(tmp_path)
    history.append({"step": 0, "split": "train", "loss": 0.5})
    before = (tmp_path / "history.jsonl").read_bytes()
    with pytest.raises(StoreError, match=r"history row of step 1, split 'train': field 'ratio_mean' is "):
        history.append({"step": 1, "split": "train", "loss": 0.5, "ratio_mean": value})
    with pytest.raises(StoreError, match=r"field 'evidence'\.values\.1 is "):
        history.append({"step": 1, "split": "alert", "evidence": {"values": [1.0, value]}})
    assert (tmp_path / "history.jsonl").read_bytes() == before and len(history) == 1


def test_history_rows_write_null_for_no_value_and_refuse_our_own_non_finite_metrics(tmp_path):
    empty = history_row([], step=0, split="val")
    assert empty["reward"] is None and empty["reward_std"] is None and empty["reward_std_within_group"] is None
    with pytest.raises(StoreError, match=r"metric 'ratio_mean' is inf"):
        history_row([], step=0, split="train", metrics={"ratio_mean": math.inf})
    # a rollout's own nan metric: the mean is null, with a warning naming it; the row is written
    group = TrajectoryGroup([Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=r,
                                        metrics={"score": s}) for r, s in ((0.0, math.nan), (1.0, 1.0))])
    with pytest.warns(GroupwiseWarning, match=r"metric 'score' is nan or inf on 1 of 2"):
        row = history_row([group], step=0, split="val")
    assert row["score"] is None and row["reward"] == 0.5
    RunHistory(tmp_path).append(row)
    assert parse_json((tmp_path / "history.jsonl").read_text())["score"] is None


def test_the_trainer_refuses_impossible_sampler_logprobs_before_the_loss(tokenizer):
    """-inf, +inf and positive sampler logprobs never reach the loss: tokenising refuses them naming the
    group and trajectory (tests/training/test_tokenize.py checks each); NaN means "unknown": on policy."""
    model = lora_model(tokenizer, dtype=torch.float32)
    batch = _batch(0.0)
    batch.sequences = [dc.replace(s, old_logprobs=[math.nan] * len(s)) for s in batch.sequences]
    metrics = Trainer(model).train_step(batch, TrainConfig(off_policy="tis", max_seq_len=64, learning_rate=1e-5),
                                        step=0)
    assert metrics["ratio_mean"] == pytest.approx(1.0) and metrics["importance_capped_fraction"] == 0.0
    assert json.dumps(metrics, allow_nan=False)
