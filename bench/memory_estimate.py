"""The update's priced peak (training/step_memory.py) against the measured one, for a few shapes.

Each shape runs in a fresh process: a LoRA'd model (a random one of a Qwen2 or Llama config, or SmolLM2),
one warm-up step on a short batch (AdamW's moments exist after it, as in a run), then one measured step.

    python bench/memory_estimate.py --device cpu          # the CPU rows of docs/benchmarks.md
    python bench/memory_estimate.py --device cuda         # the GPU rows (torch.cuda.max_memory_allocated)
    python bench/memory_estimate.py --device cuda --json rows.json   # the rows also as JSON (bytes)

On CUDA the measured figure is torch's allocated high-water mark of the step (weights included) and the
estimate is `StepMemory.peak`. On the CPU only the process's resident high-water mark can be read: the
step's part of it is that mark minus the resident memory before the step, compared with what the
estimate says the step adds to what it holds already (`step_bytes` less the held adapter and moments).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

# name: (model, rows, width, gradient checkpointing, dtype)
CPU_SHAPES = {
    "tiny-llama 4x512": ("llama-tiny", 4, 512, False, "float32"),
    "tiny-llama 4x512 ckpt": ("llama-tiny", 4, 512, True, "float32"),
    "tiny-qwen2 2x1024": ("qwen2-tiny", 2, 1024, False, "float32"),
    "smollm2-135m 1x512": ("smollm2-135m", 1, 512, False, "float32"),
    "smollm2-135m 2x512": ("smollm2-135m", 2, 512, False, "float32"),
}
GPU_SHAPES = {
    "qwen2-0.5b 8x1024 bf16": ("qwen2-0.5b", 8, 1024, False, "bfloat16"),
    "qwen2-0.5b 8x1024 bf16 ckpt": ("qwen2-0.5b", 8, 1024, True, "bfloat16"),
    "qwen2-0.5b 4x4096 bf16 ckpt": ("qwen2-0.5b", 4, 4096, True, "bfloat16"),
    "llama-1b 4x2048 bf16": ("llama-1b", 4, 2048, False, "bfloat16"),
    # not seen by the calibration of training/step_memory.py: a smaller batch, and a long checkpointed
    # one whose peak is the backward's (the recomputed layer and its gradients), not the logits chunk's
    "qwen2-0.5b 2x2048 bf16": ("qwen2-0.5b", 2, 2048, False, "bfloat16"),
    "qwen2-0.5b 4x8192 bf16 ckpt": ("qwen2-0.5b", 4, 8192, True, "bfloat16"),
}


def _model(name: str, dtype, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if name == "smollm2-135m":
        from groupwise.runtime.loading import load_base_model

        model, _ = load_base_model(name, device=device, dtype=dtype)
        return model
    configs = {
        "llama-tiny": (LlamaConfig, LlamaForCausalLM, dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                                                           num_attention_heads=8, num_key_value_heads=2, vocab_size=8192)),
        "qwen2-tiny": (Qwen2Config, Qwen2ForCausalLM, dict(hidden_size=192, intermediate_size=512, num_hidden_layers=3,
                                                           num_attention_heads=6, num_key_value_heads=2, vocab_size=16384)),
        # Qwen2.5-0.5B's shape, random weights (the GPU machine has no model hub)
        "qwen2-0.5b": (Qwen2Config, Qwen2ForCausalLM, dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                                           num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                                           tie_word_embeddings=True)),
        # Llama-3.2-1B's shape
        "llama-1b": (LlamaConfig, LlamaForCausalLM, dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                                         tie_word_embeddings=True)),
    }
    config_cls, model_cls, kw = configs[name]
    torch.manual_seed(0)
    with torch.device(device):
        model = model_cls(config_cls(max_position_embeddings=8192, **kw)).to(dtype)
    model.eval()
    return model


def _batch(rows: int, width: int, vocab: int):
    import torch

    from groupwise.training.tokenize import TokenizedBatch, TokenizedSequence

    gen = torch.Generator().manual_seed(0)
    seqs = []
    for b in range(rows):
        ids = torch.randint(3, vocab, (width,), generator=gen).tolist()
        mask = [t >= width // 4 for t in range(width)]  # a prompt, then sampled tokens
        old = [-2.0 if m else math.nan for m in mask]
        seqs.append(TokenizedSequence(ids, mask, old, advantage=1.0 if b % 2 else -1.0, trajectory_index=b))
    return TokenizedBatch(sequences=seqs, num_groups=1)


def one(name: str, device: str) -> dict:
    import gc

    import torch

    from groupwise.config import LoraConfig, TrainConfig
    from groupwise.runtime.memory import release_freed_memory
    from groupwise.training import step_memory
    from groupwise.training.adapters import wrap_with_lora
    from groupwise.training.trainer import Trainer

    model_name, rows, width, ckpt, dtype_name = {**CPU_SHAPES, **GPU_SHAPES}[name]
    dev = torch.device(device)
    model = wrap_with_lora(_model(model_name, getattr(torch, dtype_name), dev), LoraConfig(rank=8))
    trainer = Trainer(model)
    vocab = model.config.vocab_size
    config = TrainConfig(micro_batch_tokens=rows * width, gradient_checkpointing=ckpt, max_seq_len=width,
                         learning_rate=1e-5)
    trainer.train_step(_batch(2, 16, vocab), config, step=1)  # warm-up: code paths, AdamW's moments
    gc.collect()
    release_freed_memory()
    before = step_memory.resident_bytes() if dev.type == "cpu" else torch.cuda.memory_allocated(dev)
    metrics = trainer.train_step(_batch(rows, width, vocab), config, step=2)
    est = trainer.last_memory
    assert est is not None and metrics["micro_batches"] == 1.0
    shape = step_memory.ModelShape.of(model, trainer.adapter_name)
    held = shape.adapter_param_bytes + 8 * shape.adapter_params
    measured = step_memory.measured_peak_bytes(dev)
    return {
        "shape": name, "device": device, "estimated_peak": est.peak, "measured_peak": measured,
        "estimated_step": est.step_bytes - held, "measured_step": measured - before,
        "weights": est.weights, "activations": est.activations, "backward": est.backward, "logits": est.logits,
        "torch": torch.__version__, "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shapes", nargs="*", help="shape names (default: the device's)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows (bytes) to this JSON file")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a shape may take before it is given up")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.device)))
        return
    names = args.shapes or list(CPU_SHAPES if args.device == "cpu" else GPU_SHAPES)
    gb = 2**30
    rows = []
    print(f"{'shape':32} {'est. peak GB':>12} {'meas. peak GB':>13} {'est. step GB':>12} {'meas. step GB':>13} {'step error':>10}")
    for name in names:
        try:
            proc = subprocess.run([sys.executable, __file__, "--device", args.device, "--one", name],
                                  capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"{name:32} failed: over {args.timeout:.0f} s", flush=True)
            rows.append({"shape": name, "device": args.device, "error": f"over {args.timeout:.0f} s"})
            continue
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            tail = proc.stderr.strip().splitlines()[-1:]
            print(f"{name:32} failed: {tail}", flush=True)
            rows.append({"shape": name, "device": args.device, "error": " ".join(tail)})
            continue
        r = json.loads(line[7:])
        r["step_error"] = r["estimated_step"] / r["measured_step"] - 1
        rows.append(r)
        print(f"{name:32} {r['estimated_peak'] / gb:12.3f} {r['measured_peak'] / gb:13.3f} "
              f"{r['estimated_step'] / gb:12.3f} {r['measured_step'] / gb:13.3f} {r['step_error']:+10.1%}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
