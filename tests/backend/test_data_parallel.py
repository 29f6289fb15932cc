"""Data-parallel on two gloo ranks (CPU): a step equals one process's step on the union of the batches,
and leaves the ranks' adapters bitwise identical; rollout requests spread over the replicas, a group's
prompt on one replica."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from backend_helpers import make_backend, sample_groups

import groupwise as gw
from groupwise.backend.ranks import merge_ranks, sft_step_metrics, shard_batch
from groupwise.backend.routing import ReplicaRouter
from groupwise.training.tokenize import TokenizedBatch, TokenizedSequence


@pytest.mark.slow
async def test_two_gloo_ranks_take_the_one_process_step_of_the_union(tiny_model_dir, tmp_path, request):
    config = gw.TrainConfig(learning_rate=5e-2)
    # The batch: 3 groups of 4 rollouts sampled once (by the one-process backend), trained by both.
    single = make_backend("local", tmp_path / "single", request, best_checkpoint_metric=None)
    one = gw.TrainableModel("dp", project="eq", base_model=tiny_model_dir)
    await one.register(single)
    try:
        groups = await sample_groups(one, n_groups=3, max_tokens=6)
        single_metrics = (await one.train(groups, config=config)).metrics
        [reference] = await single.rank_states(one)
    finally:
        await single.close()

    parallel = make_backend("data_parallel", tmp_path / "parallel", request, best_checkpoint_metric=None)
    two = gw.TrainableModel("dp", project="eq", base_model=tiny_model_dir)
    await two.register(parallel)
    try:
        assert parallel.world_size == 2
        dp_metrics = (await two.train(groups, config=config)).metrics
        ranks = await parallel.rank_states(two)
        await two.train(groups, config=config)  # a second step: the ranks stay identical
        ranks_after_two = await parallel.rank_states(two)
    finally:
        await parallel.close()

    # each rank trained a share; the step's counts and loss are the union's
    assert dp_metrics["sequences"] == single_metrics["sequences"] == 12
    assert dp_metrics["trainable_tokens"] == single_metrics["trainable_tokens"]
    assert dp_metrics["loss"] == pytest.approx(single_metrics["loss"], rel=1e-4, abs=1e-6)
    assert dp_metrics["grad_norm"] == pytest.approx(single_metrics["grad_norm"], rel=1e-4)
    # the ranks hold the same adapter and optimizer state, bit for bit, after each step
    for a, b in (ranks, ranks_after_two):
        assert a["adapter"].keys() == b["adapter"].keys() and len(a["adapter"]) > 0
        assert all(torch.equal(a["adapter"][k], b["adapter"][k]) for k in a["adapter"])
        assert all(torch.equal(a["optimizer"][k], b["optimizer"][k]) for k in a["optimizer"])
    # ... equal to the one-process step on the union up to float summation order. AdamW's first step
    # moves each weight by about +-lr (g / |g|), so the tolerance is a small fraction of lr.
    a = ranks[0]
    for key, value in reference["adapter"].items():
        assert torch.allclose(a["adapter"][key], value, rtol=0, atol=2e-4 * config.learning_rate), key
    for key, value in reference["optimizer"].items():  # exp_avg = 0.1 x the gradient, exp_avg_sq its square
        scale = float(value.abs().max())
        assert torch.allclose(a["optimizer"][key], value, rtol=1e-3, atol=1e-4 * scale), key
    # and the step did move the adapter (lora_B starts at zero), so the comparison is not vacuous
    assert max(float(v.abs().max()) for k, v in reference["adapter"].items() if "lora_B" in k) > 0.9 * config.learning_rate


def _seq(n: int) -> TokenizedSequence:
    return TokenizedSequence(list(range(n)), [True] * n, [0.0] * n, 1.0)


def test_shards_balance_tokens_and_keep_the_steps_counts():
    batch = TokenizedBatch([_seq(n) for n in (10, 9, 8, 2, 2, 1)], num_groups=2, zero_variance_groups=1)
    shards = shard_batch(batch, 2)
    assert sorted(len(s) for shard in shards for s in shard.sequences) == [1, 2, 2, 8, 9, 10]
    # longest first, each to the rank with fewer tokens: 10 | 9, 8 | then 2, 2, 1 to the first
    assert [sum(len(s) for s in shard.sequences) for shard in shards] == [15, 17]
    assert all(shard.num_groups == 2 and shard.zero_variance_fraction == 0.5 for shard in shards)
    assert [len(s.sequences) for s in shard_batch(TokenizedBatch([_seq(3)]), 2)] == [1, 0]  # a rank may idle


def test_rank_metrics_merge_per_rank_counts_and_keep_the_summed_loss():
    a = {"loss": 0.5, "trainable_tokens": 30.0, "micro_batches": 2.0, "padded_tokens": 40.0, "update_time": 2.0,
         "trainable_tokens_per_s": 15.0}
    b = {**a, "micro_batches": 3.0, "padded_tokens": 10.0, "update_time": 3.0}
    merged = merge_ranks([a, b])
    # the loss and token count are already sums over the ranks; micro-batches and padding are each rank's
    assert merged == {**a, "micro_batches": 5.0, "padded_tokens": 50.0, "update_time": 3.0, "trainable_tokens_per_s": 10.0}
    assert merge_ranks([a]) == a


def test_a_supervised_steps_loss_weights_each_update_by_its_tokens():
    one = {"loss": 1.0, "trainable_tokens": 10.0, "grad_norm": 2.0, "sequences": 1.0, "dropped_too_long": 0.0,
           "update_time": 1.0}
    two = {**one, "loss": 4.0, "trainable_tokens": 30.0, "grad_norm": 4.0, "dropped_too_long": 1.0}
    m = sft_step_metrics([one, two], 1e-4)
    assert m["loss"] == (1.0 * 10 + 4.0 * 30) / 40 and (m["first_loss"], m["last_loss"]) == (1.0, 4.0)
    assert (m["grad_norm"], m["trainable_tokens"], m["updates"], m["dropped_too_long"]) == (3.0, 40.0, 2.0, 1.0)
    assert sft_step_metrics([], 0.0) == {"updates": 0.0, "trainable_tokens": 0.0, "learning_rate": 0.0}


def _chat(model: str, user: str, *, system: str = "be brief", turns: int = 0) -> httpx.Request:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}] * turns
    return httpx.Request("POST", "http://x/v1/chat/completions", json={"model": model, "messages": messages})


def test_router_keeps_a_prompt_on_one_replica_and_spreads_new_prompts():
    router = ReplicaRouter(["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1", "http://127.0.0.1:3/v1"])
    picks = {}
    for group in range(6):
        for _ in range(4):  # a group's rollouts share the prompt
            replica = router.pick(_chat("agent", f"scenario {group}"))
            router.sent[replica] += 1
            picks.setdefault(group, set()).add(replica)
    assert all(len(p) == 1 for p in picks.values())
    assert router.sent == [8, 8, 8]  # new prompts go to the least used replica
    # a later turn of a conversation follows its first turn (its prefix is cached there)
    assert router.pick(_chat("agent", "scenario 4", turns=2)) == next(iter(picks[4]))
    assert json.loads(_chat("agent", "x").content)["model"] == "agent"


def test_ranks_holding_different_adapters_is_a_loud_error():
    from groupwise.backend.driver import ReplicaDivergenceError
    from groupwise.backend.protocol import Published
    from groupwise.backend.ranks import check_identical

    same = [Published(0, fingerprint=[7, 11]), Published(1, fingerprint=[7, 11])]
    check_identical("m", 3, same)
    with pytest.raises(ReplicaDivergenceError, match=r"after step 3 of 'm' the adapters of rank\(s\) \[1\]"):
        check_identical("m", 3, [same[0], Published(1, fingerprint=[7, 12])])


def test_a_flipped_bit_changes_the_adapter_fingerprint():
    from groupwise.backend.replica import fingerprint

    tensors = [torch.randn(8, 16), torch.randn(16, 4)]
    flipped = [t.clone() for t in tensors]
    flipped[1].view(-1).view(torch.int32)[37] ^= 1  # the lowest mantissa bit of one element
    assert fingerprint(tensors) == fingerprint([t.clone() for t in tensors])
    assert fingerprint(tensors) != fingerprint(flipped)
    swapped = [t.clone() for t in tensors]
    swapped[0].view(-1)[[0, 1]] = swapped[0].view(-1)[[1, 0]]  # same values, other places
    assert fingerprint(tensors) != fingerprint(swapped)


def test_the_fingerprint_is_the_sum_of_each_tensors_bit_sums():
    # Computed here tensor by tensor; the function sums tensors of one shape together (fewer launches):
    # the two must agree, whatever the order and the mix of shapes and dtypes.
    from groupwise.backend.replica import fingerprint

    tensors = [torch.randn(8, 16), torch.randn(16, 4), torch.randn(8, 16), torch.randn(3).bfloat16()]
    plain = weighted = 0
    for t in tensors:
        bits = t.view(-1).view(torch.int32 if t.element_size() == 4 else torch.int16).to(torch.int64)
        plain += int(bits.sum())
        weighted += int((bits * torch.arange(1, bits.numel() + 1) % 1_000_003).sum())
    assert fingerprint(tensors) == [plain, weighted]
    assert fingerprint(tensors[::-1]) == [plain, weighted]
    assert fingerprint([]) == [0, 0]
