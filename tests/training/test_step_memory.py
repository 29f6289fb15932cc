"""Memory admission of an update (training/step_memory.py): a step whose priced peak does not fit the
device's free memory is split into smaller micro-batches, or refused before it allocates, naming what to
change; the price counts the tensors a step holds (as CUDA's allocator measures them), and is close to a
measured CPU peak (the process's resident memory)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gw_train_helpers import lora_model
from hypothesis import given, settings
from hypothesis import strategies as st
from live_bytes import LiveTensorBytes

from groupwise.config import TrainConfig, micro_batch_tokens_for
from groupwise.errors import GroupwiseError, MemoryBudgetError
from groupwise.training import step_memory
from groupwise.training.tokenize import TokenizedBatch, TokenizedSequence
from groupwise.training.micro_batches import plan_micro_batches
from groupwise.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


def _batch(lengths=(40, 36, 32, 28), vocab=1000):
    gen = torch.Generator().manual_seed(3)
    seqs = []
    for b, n in enumerate(lengths):
        ids = torch.randint(3, vocab, (n,), generator=gen).tolist()
        mask = [t >= n // 2 for t in range(n)]
        old = [-3.0 if m else math.nan for m in mask]
        seqs.append(TokenizedSequence(ids, mask, old, advantage=1.0 if b % 2 else -1.0, trajectory_index=b))
    return TokenizedBatch(sequences=seqs, num_groups=1)


def _shape(**overrides) -> step_memory.ModelShape:
    base = dict(layers=4, hidden=64, intermediate=128, q_dim=64, kv_dim=32, vocab=1000, act_bytes=4, lora_rank=4,
                lora_targets=7, lora_in_dims=7 * 64, lora_dropout=False, weight_bytes=10_000_000,
                adapter_param_bytes=40_000, adapter_params=10_000)
    return step_memory.ModelShape(**{**base, **overrides})


def _need(trainer: Trainer, batch: TokenizedBatch, budget: int, device: str = "cpu") -> int:
    """What admission compares with the free memory for `batch` planned at `budget` tokens."""
    shape = step_memory.ModelShape.of(trainer.model, trainer.adapter_name)
    lengths = [len(s) for s in batch.sequences]
    trained = [sum(s.mask[1:]) for s in batch.sequences]
    plan, peak, _ = step_memory.admit_micro_batches(
        shape, lengths, trained, token_budget=budget, chunk_size=1024, checkpointing=False, kl=False,
        free_bytes=None, optimizer_state_held=False, plan_fn=plan_micro_batches, device=device)
    return peak.step_bytes - shape.adapter_param_bytes


def test_a_step_that_does_not_fit_is_split_until_it_does(tokenizer, monkeypatch):
    trainer = Trainer(lora_model(tokenizer))
    batch = _batch()
    whole, single = _need(trainer, batch, 10_000), _need(trainer, batch, 1)
    assert single < whole / 2  # one sequence per micro-batch needs far less than the whole batch
    free = (single + whole) // 2
    monkeypatch.setattr(step_memory, "device_free_bytes", lambda device: free)
    before = {n: p.detach().clone() for n, p in trainer.trainable_named_parameters()}
    metrics = trainer.train_step(batch, TrainConfig(micro_batch_tokens=10_000, max_seq_len=64, learning_rate=1e-3))
    assert metrics["micro_batches"] > 1  # split: one micro-batch of 4 x 40 tokens did not fit
    assert metrics["memory/micro_batch_tokens"] < 10_000
    assert trainer.last_memory is not None and trainer.last_memory.step_bytes - 40_000 <= free + whole
    assert 0 < metrics["memory/estimated_peak_gb"] and metrics["memory/measured_peak_gb"] > 0
    assert any(not torch.equal(p, before[n]) for n, p in trainer.trainable_named_parameters())  # it trained

    # with room for the whole batch, it runs as planned
    monkeypatch.setattr(step_memory, "device_free_bytes", lambda device: whole * 4)
    metrics = trainer.train_step(batch, TrainConfig(micro_batch_tokens=10_000, max_seq_len=64), step=1)
    assert metrics["micro_batches"] == 1 and metrics["memory/micro_batch_tokens"] == 10_000


def test_the_default_budget_is_the_devices(tokenizer, monkeypatch):
    """`micro_batch_tokens=None` (the default) plans at the device's budget: 16384 tokens on CUDA, where fewer
    launches make a small model's update faster, 4096 on the CPU and on devices whose free memory cannot be read
    (nothing would halve a budget too large there); a budget the caller set is kept as set."""
    assert TrainConfig().micro_batch_tokens is None
    assert micro_batch_tokens_for(None, "cpu") == 4096 and micro_batch_tokens_for(None, "cuda") == 16384
    assert micro_batch_tokens_for(None, "mps") == 4096 and micro_batch_tokens_for(777, "cuda") == 777
    trainer = Trainer(lora_model(tokenizer))
    monkeypatch.setattr(step_memory, "device_free_bytes", lambda device: None)
    wide = _batch(lengths=(60,) * 200)  # 12,000 padded tokens: 3 micro-batches of 4096, one of 16384
    assert len(trainer.admit(wide.sequences, TrainConfig())) == 3 and trainer.last_token_budget == 4096
    trainer.device = torch.device("cuda")  # priced as a GPU's step; nothing is allocated by admit
    assert len(trainer.admit(wide.sequences, TrainConfig())) == 1 and trainer.last_token_budget == 16384
    assert len(trainer.admit(wide.sequences, TrainConfig(micro_batch_tokens=6000))) == 2
    # the GPU's budget is halved like any other when the step does not fit the free memory
    free = _need(trainer, wide, 8192, "cuda") + 1
    monkeypatch.setattr(step_memory, "device_free_bytes", lambda device: free)
    assert len(trainer.admit(wide.sequences, TrainConfig())) == 2 and trainer.last_token_budget == 8192


def test_a_step_that_fits_at_no_split_is_refused_before_it_runs(tokenizer, monkeypatch):
    trainer = Trainer(lora_model(tokenizer))
    batch = _batch()
    monkeypatch.setattr(step_memory, "device_free_bytes", lambda device: 1000)
    before = {n: p.detach().clone() for n, p in trainer.trainable_named_parameters()}
    with pytest.raises(MemoryBudgetError) as info:
        trainer.train_step(batch, TrainConfig(micro_batch_tokens=10_000, max_seq_len=64))
    message = str(info.value)
    assert isinstance(info.value, GroupwiseError)
    for named in ("gradient_checkpointing=True", "micro_batch_tokens", "max_tokens", "40 tokens", "GB free"):
        assert named in message, named
    for n, p in trainer.trainable_named_parameters():
        assert torch.equal(p, before[n]) and p.grad is None  # nothing ran
    # with checkpointing on, it no longer offers checkpointing
    with pytest.raises(MemoryBudgetError) as info:
        trainer.train_step(batch, TrainConfig(micro_batch_tokens=10_000, max_seq_len=64, gradient_checkpointing=True))
    assert "gradient_checkpointing=True" not in str(info.value)


@settings(max_examples=50, deadline=None)
@given(lengths=st.lists(st.integers(2, 300), min_size=1, max_size=12), budget=st.integers(1, 4096),
       free_mb=st.integers(0, 200))
def test_admission_returns_a_plan_that_fits_or_refuses(lengths, budget, free_mb):
    shape = _shape()
    trained = [n // 2 for n in lengths]
    free = free_mb * 2**20
    kwargs = dict(chunk_size=64, checkpointing=False, kl=False, optimizer_state_held=True, plan_fn=plan_micro_batches,
                  device="cpu")
    try:
        plan, peak, used = step_memory.admit_micro_batches(shape, lengths, trained, token_budget=budget,
                                                           free_bytes=free, **kwargs)
    except MemoryBudgetError:
        # refused only when one sequence per micro-batch does not fit either
        _, single, _ = step_memory.admit_micro_batches(shape, lengths, trained, token_budget=1, free_bytes=None,
                                                       **kwargs)
        assert single.step_bytes - shape.adapter_param_bytes - 8 * shape.adapter_params > free
        return
    assert sorted(i for p in plan for i in p) == list(range(len(lengths)))
    assert peak.step_bytes - shape.adapter_param_bytes - 8 * shape.adapter_params <= free
    assert used <= budget
    if used < budget:  # split only when the configured plan did not fit
        _, full, _ = step_memory.admit_micro_batches(shape, lengths, trained, token_budget=budget, free_bytes=None,
                                                     **kwargs)
        assert full.step_bytes - shape.adapter_param_bytes - 8 * shape.adapter_params > free


def test_checkpointing_and_kl_change_the_price_as_they_change_the_memory():
    shape = _shape()
    args = dict(rows=4, width=512, trained=1024, chunk_size=256, device="cpu")
    plain = step_memory.estimate_micro_batch(shape, checkpointing=False, kl=False, **args)
    ckpt = step_memory.estimate_micro_batch(shape, checkpointing=True, kl=False, **args)
    assert ckpt.activations < plain.activations / 2  # 4 layers: one layer's activations + inputs
    assert ckpt.weights == plain.weights and ckpt.logits == plain.logits
    assert step_memory.estimate_micro_batch(shape, checkpointing=False, kl=True, **args).peak >= plain.peak
    wider = step_memory.estimate_micro_batch(_shape(vocab=100_000), checkpointing=False, kl=False, **args)
    assert wider.logits - plain.logits == 256 * 99_000 * 8  # one [C, V] chunk: logits + fp32 log-softmax


@pytest.mark.parametrize("shape", ["tiny-llama 4x512", "tiny-llama 4x512 ckpt"])
def test_the_estimate_is_close_to_the_measured_cpu_peak(shape):
    # A fresh process per shape: the resident high-water mark is the process's (bench/memory_estimate.py).
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "memory_estimate.py"), "--device", "cpu",
                           "--one", shape], capture_output=True, text=True, timeout=600, cwd=ROOT)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, proc.stderr[-2000:]
    r = json.loads(line[len("RESULT "):])
    assert r["measured_step"] > 100 * 2**20  # the step's activations dominate what is measured
    assert abs(r["estimated_step"] / r["measured_step"] - 1) < 0.25, r


def test_data_parallel_ranks_report_their_fullest_device():
    from groupwise.backend.ranks import merge_ranks

    ranks = [{"update_time": 1.0, "micro_batches": 2.0, "memory/estimated_peak_gb": 3.0, "memory/measured_peak_gb": 2.5},
             {"update_time": 2.0, "micro_batches": 1.0, "memory/estimated_peak_gb": 4.0, "memory/measured_peak_gb": 2.0}]
    merged = merge_ranks(ranks)
    assert merged["memory/estimated_peak_gb"] == 4.0 and merged["memory/measured_peak_gb"] == 2.5
    assert merged["micro_batches"] == 3.0


def _tiny_qwen2(dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from groupwise.config import LoraConfig
    from groupwise.training.adapters import wrap_with_lora

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=4096, tie_word_embeddings=True, max_position_embeddings=1024)
    return wrap_with_lora(Qwen2ForCausalLM(config).to(dtype), LoraConfig(rank=8))


@pytest.mark.parametrize("dtype,rows,width,checkpointing", [
    (torch.bfloat16, 4, 256, False), (torch.bfloat16, 4, 256, True), (torch.float32, 4, 256, False),
])
def test_the_price_counts_the_tensors_a_step_holds(dtype, rows, width, checkpointing):
    """The estimate as CUDA measures it (allocated bytes at the fullest moment: no allocator term) against
    the live tensors of a real step on the CPU's kernels, bf16 autocast as on a GPU: the saved activations
    of each layer, the logits chunk with its fp32 copy, the backward's gradients are counted, not fitted."""
    model = _tiny_qwen2(dtype)
    trainer = Trainer(model)
    config = TrainConfig(micro_batch_tokens=rows * width, gradient_checkpointing=checkpointing, max_seq_len=width,
                         learning_rate=1e-5, logprob_chunk_size=256)
    trainer.train_step(_batch(lengths=(16, 16), vocab=4096), config, step=1)  # AdamW's moments exist, as in a run
    batch = _batch(lengths=(width,) * rows, vocab=4096)
    with LiveTensorBytes() as live:
        metrics = trainer.train_step(batch, config, step=2)
    assert metrics["micro_batches"] == 1.0
    shape = step_memory.ModelShape.of(model, trainer.adapter_name)
    trained = sum(sum(s.mask[1:]) for s in batch.sequences)
    kwargs = dict(rows=rows, width=width, trained=trained, chunk_size=256, checkpointing=checkpointing, kl=False)
    held = shape.adapter_param_bytes + 8 * shape.adapter_params  # allocated before the step
    on_cuda = step_memory.estimate_micro_batch(shape, device="cuda", **kwargs)
    assert live.peak > 5 * 2**20
    assert abs((on_cuda.step_bytes - held) / live.peak - 1) < 0.05, (on_cuda, live.peak)
    # the CPU's resident memory keeps more than the live tensors: its estimate is the larger
    on_cpu = step_memory.estimate_micro_batch(shape, device="cpu", **kwargs)
    assert on_cpu.peak > on_cuda.peak


def test_the_logits_chunk_counts_the_upcast_copy_the_device_makes():
    args = dict(rows=1, width=512, trained=256, chunk_size=256, checkpointing=False, kl=False)
    head = {}
    for act, fp16 in ((2, False), (2, True), (4, False)):
        shape = _shape(act_bytes=act, float16=fp16)
        for device in ("cuda", "cpu", "mps"):
            head[act, fp16, device] = (step_memory.estimate_micro_batch(shape, device=device, **args).logits
                                       - 2 * 256 * 64 * act)
    v = 256 * 1000
    assert head[2, False, "cuda"] == head[2, False, "cpu"] == v * (2 + 4 + 4)  # bf16: an fp32 copy, then fp32
    assert head[2, True, "cuda"] == v * (2 + 4) and head[2, True, "cpu"] == v * (2 + 4 + 4)  # fp16 read in place on CUDA
    assert head[4, False, "cuda"] == v * (4 + 4)
    assert step_memory.device_memory("mps") == step_memory.DEVICE_MEMORY["cpu"]  # not measured: the larger


def test_on_cuda_the_fuller_moment_is_the_peak_and_on_the_cpu_they_add():
    shape = _shape(act_bytes=2)
    args = dict(rows=2, width=1024, trained=1536, chunk_size=1024, checkpointing=True, kl=False)
    cuda = step_memory.estimate_micro_batch(shape, device="cuda", **args)
    cpu = step_memory.estimate_micro_batch(shape, device="cpu", **args)
    assert cuda.peak - cuda.weights - cuda.adapter - cuda.activations == max(cuda.logits, cuda.backward)
    assert cpu.peak - cpu.weights - cpu.adapter - cpu.activations == cpu.logits + cpu.backward
