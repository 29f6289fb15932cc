"""One GRPO step, groupwise vs TRL's GRPOTrainer, side by side on the same model and workload.

    python bench/train_step.py                                   # SmolLM2-135M on CPU
    python bench/train_step.py --device cuda --arch qwen2.5-0.5b # random-init Qwen2.5 in bf16 (GPU)
    python bench/train_step.py --device cuda --arch qwen2.5-1.5b

Both sides get the same model weights, prompts, group size, completion length (EOS ignored, so every
completion has exactly --completion-len tokens), LoRA config (rank, alpha, target modules), learning
rate, clip epsilons and no KL (beta=0, so neither computes a reference pass). Each side runs
--warmup steps, then --steps timed steps; medians are printed.

Measured per step:
- step: end to end = generation + reward + update (+ for groupwise the adapter swap: checkpoint
  snapshot, written, and served to the engine from memory, as LocalBackend publishes a step; TRL's
  in-process step does neither);
- gen: the generation part; update: the optimizer step incl. forward/backward (TRL: step - gen);
- tok/s: trainable (completion) tokens per second of the update alone;
- MFU (CUDA only): update FLOPs / (update time * peak). FLOPs = 4 * N_body * tokens (forward and
  activation backward of the frozen body; LoRA weight grads are negligible) + 6 * V * H * trainable
  tokens (LM head forward, backward, and our checkpointed recompute counted for both). Peak: 989 TFLOP/s
  dense bf16 for H100/H200 SXM, else --peak-tflops.

Memory: TRL runs the whole batch (prompts x group size) in one forward/backward; for Qwen2.5-1.5B x 64
sequences x ~300 tokens that needs --layer-checkpointing (applied to both sides) on an 80 GB card.

TRL is a bench-only dependency (not in any groupwise extra): `pip install trl` (1.16 checked with
`--dry-run` not to touch torch). --skip-trl runs our side alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

QUESTIONS = [
    "Write a short poem about the sea.", "Explain photosynthesis to a child.", "List three uses of copper.",
    "Describe your ideal weekend.", "What makes a good teacher?", "Give advice to a new programmer.",
    "Summarise the plot of a heist movie.", "Why do leaves change colour?", "Plan a picnic for four people.",
    "Describe a city in the year 2100.", "How do vaccines work?", "What is the water cycle?",
    "Invent a new board game.", "Describe the taste of an orange.", "Why is sleep important?",
    "Explain gravity without equations.",
]

ARCHS = {
    # Qwen2.5 shapes (config.json of the released models); weights are random: only speed is measured.
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    # a smoke-test size (seconds on CPU): checks the bench runs, numbers mean nothing
    "tiny-qwen": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=49152, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}


def reward_fn(text: str) -> float:
    # Any graded function of the text; the bench measures speed, not learning.
    return text.count("e") / max(len(text), 1)


def build_model(arch: str, device: str, dtype_name: str | None, seed: int = 0) -> tuple[Any, Any]:
    import torch

    from groupwise.runtime.loading import load_base_model, load_tokenizer, resolve_device, resolve_dtype
    from groupwise.runtime.special_tokens import apply_special_tokens, special_tokens, unused_token_id

    if arch == "smollm2":
        return load_base_model("smollm2-135m", device=device, dtype=dtype_name)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = load_tokenizer("smollm2-135m")  # ids < 49152 fit Qwen's 151936-row embedding
    # The random model's pad row is zeroed at init: pad with a token no prompt contains (with a pad
    # that starts every chat, the first update's gradient was NaN). Trainer, engine and TRL pad with it.
    tokens = special_tokens(tok)
    pad = unused_token_id(tok)
    apply_special_tokens(tok, dataclasses.replace(tokens, pad=tok.convert_ids_to_tokens(pad), pad_id=pad))
    dev = resolve_device(device)
    dtype = resolve_dtype(dtype_name, dev)
    config = Qwen2Config(**ARCHS[arch], max_position_embeddings=4096, bos_token_id=tokens.bos_id,
                         eos_token_id=tokens.eos_id, pad_token_id=pad)
    # Built on the device in its dtype: a 7B model initialised in fp32 on the CPU takes minutes and 30 GB.
    default = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []), torch.device(dev):
        torch.manual_seed(seed)
        torch.set_default_dtype(dtype)
        try:
            model = Qwen2ForCausalLM(config)
        finally:
            torch.set_default_dtype(default)
    model.eval()
    return model, tok


def prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(n)]


def update_flops(model: Any, tokens: int, trainable: int) -> float:
    emb = model.get_input_embeddings().weight
    V, H = emb.shape
    n_all = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    n_body = n_all - V * H  # tied head: the embedding matrix is counted once, as the head
    return 4.0 * n_body * tokens + 6.0 * V * H * trainable


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- groupwise


def run_groupwise(args, model, tok) -> dict[str, Any]:
    from openai.types.chat.chat_completion import ChatCompletionMessage, Choice, ChoiceLogprobs
    from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

    from groupwise.config import LoraConfig, TrainConfig
    from groupwise.inference.engine import Engine, GenerationRequest
    from groupwise.inference.sampling import SamplingParams
    from groupwise.training.checkpoint import snapshot_checkpoint, write_checkpoint
    from groupwise.training.tokenize import tokenize_groups
    from groupwise.training.adapters import wrap_with_lora
    from groupwise.training.trainer import Trainer
    from groupwise.core.trajectory import Trajectory, TrajectoryGroup

    from groupwise.runtime.compute import compute_thread
    from groupwise.runtime.memory import freeze_loaded

    C = compute_thread()  # all torch work on one thread, as LocalBackend does (groupwise/runtime/compute.py)
    peft_model = C.call(wrap_with_lora, model, LoraConfig(rank=args.rank, alpha=2 * args.rank,
                                                          target_modules=tuple(args.targets)))
    peft_model.eval()
    engine = Engine(peft_model, tok, max_batch_size=args.prompts * args.group_size, release_when_idle=KV_CHOICES[args.kv],
                    fuse_decode=False if args.no_fuse else None)
    trainer = C.call(Trainer, peft_model, pad_token_id=tok.pad_token_id)
    C.call(freeze_loaded)  # what is loaded out of the collector's sight, as the backend's worker does
    # TRL runs the step's batch as one micro-batch (per_device_train_batch_size = the batch): by default so
    # do we. Measured on an H100 (Qwen2.5-0.5B, 64 x 295 tokens, compiled): two micro-batches of 16384
    # tokens made the update 0.32 s, one 0.23 s; the update is bound by launches, which halve.
    whole_batch = args.prompts * args.group_size * (args.completion_len + 64)
    config = TrainConfig(learning_rate=args.lr, max_seq_len=4096,
                         micro_batch_tokens=args.micro_batch_tokens or whole_batch,
                         logprob_chunk_size=args.chunk, gradient_checkpointing=args.layer_checkpointing,
                         compile=args.compile)
    names = None
    adapter = None
    rows = []
    tmp = tempfile.mkdtemp(prefix="gw-bench-")
    convs = prompts(args.prompts)
    profiled = 1 if args.profile else 0  # one extra, untimed step under the profiler
    for step in range(args.warmup + args.steps + profiled):
        _sync(args.device)
        t0 = time.perf_counter()
        futures = [
            engine.submit(GenerationRequest(
                tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"],
                max_new_tokens=args.completion_len, n=args.group_size, ignore_eos=True, adapter=adapter,
                sampling=SamplingParams(temperature=1.0, seed=1000 * step + i),
            ))
            for i, m in enumerate(convs)
        ]
        groups = []
        for m, f in zip(convs, futures):
            trajs = []
            for c in f.result().completions:
                choice = Choice(
                    index=c.index, finish_reason=c.finish_reason,
                    message=ChatCompletionMessage(role="assistant", content=c.text),
                    logprobs=ChoiceLogprobs(content=[
                        ChatCompletionTokenLogprob(token=str(t), logprob=l, bytes=None, top_logprobs=[])
                        for t, l in zip(c.token_ids, c.logprobs)
                    ]),
                    token_ids=c.token_ids,
                )
                trajs.append(Trajectory(messages_and_choices=[*m, choice], reward=reward_fn(c.text)))
            groups.append(TrajectoryGroup(trajs))
        t_gen = time.perf_counter() - t0
        gen_peak, kv_gb = _phase_peak_gb(args.device), engine.state.buffers.nbytes() / 2**30
        batch = C.call(tokenize_groups, groups, tok, max_seq_len=config.max_seq_len)
        _sync(args.device)
        t1 = time.perf_counter()

        def update(batch=batch, step=step):
            with _maybe_profile(args, last=step == args.warmup + args.steps):
                out = trainer.train_step(batch, config, step=step)
                _sync(args.device)
            return out

        with engine.paused():
            metrics = C.call(update)
        t_update = time.perf_counter() - t1
        update_peak = _phase_peak_gb(args.device)
        # The publication a real step does (LocalBackend's, backend/worker.py): the checkpoint's CPU
        # snapshot on the compute thread, its files written off it (here on the bench's thread), then the
        # engine serves the new adapter from the snapshot's tensors (no files read back).
        names = names or [n for n, _ in trainer.trainable_named_parameters()]
        snap = C.call(snapshot_checkpoint, step + 1, model=peft_model, optimizer=trainer.optimizer, param_names=names,
                      state=trainer.adapter_state())
        write_checkpoint(tmp, snap)
        new_adapter = f"bench-{step + 1}"
        engine.add_adapter(new_adapter, weights=snap.adapter, config=snap.adapter_config)
        if adapter is not None:
            engine.remove_adapter(adapter)
        adapter = new_adapter
        _sync(args.device)
        t_step = time.perf_counter() - t0
        tokens = sum(len(s) for s in batch.sequences)
        rows.append(dict(step=t_step, gen=t_gen, update=t_update, trainable=batch.trainable_tokens, tokens=tokens,
                         padded=metrics["padded_tokens"]))
        memory = "" if gen_peak is None else (f" · peak GB: generation {gen_peak:.2f} (KV buffers {kv_gb:.2f}), "
                                              f"update {update_peak:.2f}")
        print(f"  groupwise step {step}: step {t_step:.2f}s gen {t_gen:.2f}s update {t_update:.2f}s "
              f"trainable {batch.trainable_tokens} tokens {tokens}{memory}", flush=True)
    engine.close()
    return summarise(args, model, rows[args.warmup:args.warmup + args.steps])


KV_CHOICES = {"auto": None, "release": True, "keep": False}  # --kv: Engine(release_when_idle=...)


def _phase_peak_gb(device: str) -> float | None:
    """CUDA: the allocated high-water mark since the last call, then reset, so each phase of a step
    (generation with its KV buffers, the update) is read alone; `summarise` reports the largest."""
    if not device.startswith("cuda"):
        return None
    import torch

    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    _PHASE_PEAKS.append(peak)
    return peak


_PHASE_PEAKS: list[float] = []


def _maybe_profile(args, last: bool):
    """--profile: torch.profiler around the last timed update; prints the ops that take the time."""
    import contextlib

    if not (args.profile and last):
        return contextlib.nullcontext()
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])

    @contextlib.contextmanager
    def run():
        with profile(activities=activities) as prof:
            yield
        key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=args.profile), flush=True)
        if args.trace:
            prof.export_chrome_trace(args.trace)
            print(device_gaps(args.trace), flush=True)

    return run()


def device_gaps(trace_path: str, top: int = 12, min_gap_ms: float = 0.2) -> str:
    """Where the device waited for the host in a profiled update (--trace): the kernels' busy time against
    the span from the first kernel to the last, and the longest gaps with the CPU ops running when each
    began (the innermost ones of the thread that launched most kernels)."""
    import bisect
    import json

    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                     if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e)
    if not kernels:
        return "device gaps: no kernels in the trace"
    busy, gaps, end = 0.0, [], kernels[0][0]
    for start, stop in kernels:
        if start > end:
            gaps.append((start - end, end))
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    span = end - kernels[0][0]
    ops = [e for e in events if e.get("cat") == "cpu_op" and "dur" in e]
    launches = [e for e in events if e.get("cat") == "cuda_runtime"]
    tid = max({e["tid"] for e in launches}, key=lambda t: sum(1 for e in launches if e["tid"] == t)) if launches else None
    ops = sorted((e for e in ops if e["tid"] == tid), key=lambda e: e["ts"])
    starts = [e["ts"] for e in ops]

    def running(t: float) -> str:
        i = bisect.bisect_right(starts, t)
        inner = [e["name"] for e in ops[max(0, i - 400):i] if e["ts"] + e["dur"] >= t]
        return " > ".join(inner[-3:]) or "(no op)"

    gaps.sort(reverse=True)
    long = [g for g, _ in gaps if g >= min_gap_ms * 1e3]
    lines = [f"device gaps: kernels busy {busy / 1e3:.1f} ms of {span / 1e3:.1f} ms from first to last kernel; "
             f"{len(long)} gaps >= {min_gap_ms} ms sum {sum(long) / 1e3:.1f} ms"]
    lines += [f"  {g / 1e3:7.2f} ms at +{(t - kernels[0][0]) / 1e3:8.2f} ms: {running(t)}" for g, t in gaps[:top]]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- TRL


def run_trl(args, model, tok) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig as PeftLoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    n_steps = args.warmup + args.steps
    convs = prompts(args.prompts)
    data = Dataset.from_list([{"prompt": m} for _ in range(n_steps + 1) for m in convs])

    def reward(completions, **kwargs):
        return [reward_fn(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    cuda = args.device.startswith("cuda")
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), per_device_train_batch_size=args.prompts * args.group_size,
        num_generations=args.group_size, steps_per_generation=1, gradient_accumulation_steps=1, num_iterations=1,
        max_completion_length=args.completion_len, generation_kwargs={"min_new_tokens": args.completion_len},
        temperature=1.0, learning_rate=args.lr, beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo",
        max_steps=n_steps, logging_steps=1, save_strategy="no", report_to=[], bf16=cuda, use_cpu=not cuda,
        shuffle_dataset=False, seed=0, disable_tqdm=True, dataloader_num_workers=0, log_completions=False,
        # TRL defaults to checkpointing every layer; here both sides do the same (--layer-checkpointing).
        gradient_checkpointing=args.layer_checkpointing, lr_scheduler_type="constant",
    )
    peft_config = PeftLoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=list(args.targets),
                                 task_type="CAUSAL_LM")
    rows: list[dict] = []
    timing: dict[str, float] = {}

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            _sync(args.device)
            timing["t0"] = time.perf_counter()
            timing["gen"] = 0.0

        def on_step_end(self, *a, **k):
            _sync(args.device)
            t = time.perf_counter() - timing["t0"]
            tokens = timing.get("tokens", 0)
            rows.append(dict(step=t, gen=timing["gen"], update=t - timing["gen"], trainable=timing.get("trainable", 0),
                             tokens=tokens, padded=tokens))
            print(f"  trl step {len(rows) - 1}: step {t:.2f}s gen {timing['gen']:.2f}s update {t - timing['gen']:.2f}s "
                  f"trainable {timing.get('trainable', 0)}", flush=True)

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tok,
                          peft_config=peft_config, callbacks=[Timer()])
    inner = trainer._generate_and_score_completions

    def timed(*a, **k):
        _sync(args.device)
        t = time.perf_counter()
        out = inner(*a, **k)
        _sync(args.device)
        timing["gen"] += time.perf_counter() - t
        mask = out["completion_mask"]
        timing["trainable"] = int(mask.sum())
        timing["tokens"] = int(out["prompt_mask"].sum() + mask.sum())
        return out

    trainer._generate_and_score_completions = timed
    trainer.train()
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return summarise(args, model, rows[args.warmup:])


# ----------------------------------------------------------------------------- report


def summarise(args, model, rows: list[dict]) -> dict[str, Any]:
    med = {k: statistics.median(r[k] for r in rows) for k in ("step", "gen", "update", "trainable", "tokens")}
    out = dict(med, tok_per_s=med["trainable"] / med["update"])
    if args.device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name()
        peak = args.peak_tflops or (989.0 if ("H100" in name or "H200" in name) else None)
        if peak:
            out["mfu"] = update_flops(model, int(med["tokens"]), int(med["trainable"])) / med["update"] / (peak * 1e12)
            out["peak_tflops"] = peak
        out["device_name"] = name
        out["max_mem_gb"] = max([torch.cuda.max_memory_allocated() / 2**30, *_PHASE_PEAKS])
        _PHASE_PEAKS.clear()
    return out


def _run_side(args) -> None:
    """One side (--side), in this process; its summary goes to --side-json."""
    import torch

    from groupwise.runtime.compute import compute_thread

    C = compute_thread()  # all torch work on one thread (groupwise/runtime/compute.py: OpenMP teams)
    torch.manual_seed(0)
    model, tok = C.call(build_model, args.arch, args.device, args.dtype)  # the same seed: the same weights
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    if args.side == "trl":
        print(f"trl: {args.arch} on {args.device}", flush=True)
        result = C.call(run_trl, args, model, tok)
    else:
        print(f"groupwise: {args.arch} on {args.device}, {args.prompts} x {args.group_size} x "
              f"{args.completion_len} tokens", flush=True)
        result = run_groupwise(args, model, tok)
    Path(args.side_json).write_text(json.dumps(result))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="smollm2", choices=["smollm2", *ARCHS])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--prompts", type=int, default=2, help="groups per step")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--completion-len", type=int, default=64)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--targets", nargs="+", default=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--micro-batch-tokens", type=int, default=0,
                   help="groupwise's micro-batch (padded tokens); default: the whole batch, as TRL runs it")
    p.add_argument("--chunk", type=int, default=1024, help="logprob chunk size (positions)")
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument("--layer-checkpointing", action="store_true",
                   help="recompute decoder layers in the backward, on BOTH sides (TRL's default; needed for big batches)")
    p.add_argument("--no-fuse", action="store_true", help="capture the decode graphs unfused (Engine(fuse_decode=False)): the baseline of the fusion")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--compile", action="store_true",
                   help="groupwise: TrainConfig(compile=True); compiles at the first warm-up step (and once more when a new length appears): use --warmup 2")
    p.add_argument("--profile", type=int, default=0, metavar="ROWS",
                   help="profile one more groupwise update after the timed ones (not timed) and print the top ROWS ops")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="with --profile: also write the profiled update's Chrome trace here and print where the "
                        "device waited for the host (the longest gaps between kernels, with the ops running then)")
    p.add_argument("--kv", choices=list(KV_CHOICES), default="auto",
                   help="groupwise: the engine's KV, prefixes and CUDA graphs in the update's pause: freed "
                        "(release), kept (keep), or the engine's default, freed under memory pressure (auto)")
    p.add_argument("--side", choices=["trl", "groupwise"], help=argparse.SUPPRESS)
    p.add_argument("--side-json", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.side:
        _run_side(args)
        return
    # Each side in a process of its own: a peak read in one process would count what the other side
    # left behind (TRL's model, freed only when a later garbage collection finds its reference cycles,
    # was read as part of groupwise's first step), and TRL's sampling trips PyTorch's graph-safe RNG
    # check after our engine has captured CUDA graphs in the same process.
    results = {}
    for side in (["trl"] if not args.skip_trl else []) + ["groupwise"]:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            argv = [a for a in sys.argv[1:]]
            subprocess.run([sys.executable, __file__, *argv, "--side", side, "--side-json", out.name], check=True)
            results[side] = json.loads(Path(out.name).read_text())
    results = {"groupwise": results.pop("groupwise"), **results}
    cols = ["step", "gen", "update", "tok_per_s", "mfu", "max_mem_gb"]
    print(f"\n{args.arch} on {args.device} ({results['groupwise'].get('device_name', 'cpu')}), "
          f"{args.prompts} prompts x {args.group_size} rollouts x {args.completion_len} tokens, LoRA r={args.rank}")
    print(f"| {'':10} | " + " | ".join(f"{c:>10}" for c in cols) + " |")
    for name, r in results.items():
        cells = [f"{r[c]:10.3f}" if isinstance(r.get(c), float) else f"{'-':>10}" for c in cols]
        print(f"| {name:10} | " + " | ".join(cells) + " |")
    if results["groupwise"].get("peak_tflops"):
        print(f"MFU: the update's FLOPs per second over the card's dense bf16 peak, "
              f"{results['groupwise']['peak_tflops']:.0f} TFLOPS (--peak-tflops)")
    if "trl" in results:
        g, t = results["groupwise"], results["trl"]
        print(f"speed-up vs TRL: end-to-end step {t['step'] / g['step']:.2f}x, update tokens/s {g['tok_per_s'] / t['tok_per_s']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
