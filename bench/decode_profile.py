"""The engine's decode pass, by adapter mix: the base alone, every row on one adapter, and rows spread over
S adapters (the stacked path, inference/stacked_lora.py), each profiled.

    python bench/decode_profile.py --device cuda --arch qwen2.5-0.5b --rows 512 --slots 16   # one GPU
    python bench/decode_profile.py --device cpu --arch tiny-qwen --rows 16 --slots 4 --tokens 8   # a smoke test

Why. With several runs on one GPU the rollouts are bound by the device's decode passes (docs/benchmarks.md,
"Several runs on one GPU": the engine core waits for the device's tokens in half of its decode loop's time).
A mixed batch runs every adapted layer's low-rank terms over all S slots' columns in the adapters' dtype
beside the base's matmul; this bench says what that costs against the base alone and against one adapter,
on the same rows, prompts and lengths, in one process. (On CUDA a batch of one slot adapter replays the
stacked graph too, unless a graph of its own was captured before: decode.py says why.)

What runs. One engine over a random-init model of bench/train_step.py's shapes (bf16 on CUDA, fp32 on the
CPU) with `--slots` LoRA adapters of rank `--rank` (random A and B, so the low-rank terms are not zeros). Each
mode generates `--tokens` tokens (EOS ignored, temperature 1, seeded) for `--rows` requests twice: a warm-up
(it captures the CUDA graphs of its buckets) and a timed run. On CUDA a third run is traced by torch.profiler
(`--no-profile` skips it) and the device's kernels, graph replays' included, are summed per decode pass. The
trace is CUDA's only: the passes run on the engine's compute thread, whose CPU ops the profiler of this
thread does not see.

Printed per mode: decode passes, milliseconds per pass (the compute thread's decode seconds / passes), of
which waiting for the device's tokens, tokens/s, and from the trace kernels per pass and device time per
pass, with the top kernels; then each mode against the base.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from train_step import ARCHS, build_model  # noqa: E402

MODES = ("base", "one", "mixed")


def lora_weights(model: Any, rank: int, seed: int) -> tuple[dict[str, torch.Tensor], Any]:
    """peft's state dict of a random LoRA adapter of `rank` on every projection of `model`, and its config;
    the model is left as it was (the adapter is unloaded)."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:  # B is zero at init: a random B makes the low-rank term real work
                p.copy_((torch.randn(p.shape, generator=generator) * 0.01).to(p.dtype))
    weights = {k: v.detach().clone() for k, v in get_peft_model_state_dict(peft_model).items()}
    peft_model.unload()
    return weights, config


def prompts(tok: Any, rows: int) -> list[list[int]]:
    return [tok.apply_chat_template([{"role": "user", "content": f"Tell me about item {i} of the list."}],
                                    add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
            for i in range(rows)]


def generate(engine: Any, batch: list[list[int]], adapters: list[str | None], tokens: int) -> None:
    from groupwise.inference.engine import GenerationRequest
    from groupwise.inference.sampling import SamplingParams

    async def go() -> list[Any]:
        # submitted inside a pause: the engine admits every row at once, as a lockstep step's rollouts arrive
        async with engine.paused():
            futures = [engine.submit(GenerationRequest(p, max_new_tokens=tokens, ignore_eos=True, adapter=a,
                                                       sampling=SamplingParams(temperature=1.0, seed=i)))
                       for i, (p, a) in enumerate(zip(batch, adapters))]
        return await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))

    results = asyncio.run(go())
    assert all(len(r.completions[0].token_ids) == tokens for r in results)


def kernel_table(prof: Any, passes: int, top: int) -> dict[str, Any]:
    """The trace's device kernels summed per decode pass: count, microseconds, the top rows."""
    from torch.autograd import DeviceType

    rows = []
    for e in prof.key_averages():
        if e.device_type != DeviceType.CUDA:
            continue
        us = getattr(e, "self_device_time_total", None)  # torch >= 2.4; self_cuda_time_total before
        rows.append((e.key, e.count / passes, (e.self_cuda_time_total if us is None else us) / passes))
    rows.sort(key=lambda r: -r[2])
    return {"kernels_per_pass": sum(r[1] for r in rows), "us_per_pass": sum(r[2] for r in rows),
            "top": [{"name": n[:90], "per_pass": c, "us_per_pass": u} for n, c, u in rows[:top]]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from groupwise.inference.engine import Engine

    model, tok = build_model(args.arch, args.device, args.dtype)
    device = next(model.parameters()).device
    adapters: list[tuple[dict[str, torch.Tensor], Any]] = [lora_weights(model, args.rank, seed) for seed in range(args.slots)]
    engine = Engine(model, tok, max_batch_size=args.rows, fuse_decode=False if args.no_fuse else None)
    for i, (weights, config) in enumerate(adapters):
        engine.add_adapter(f"a{i}", weights=weights, config=config)
    batch = prompts(tok, args.rows)
    names = {"base": [None] * args.rows, "one": ["a0"] * args.rows,
             "mixed": [f"a{i % args.slots}" for i in range(args.rows)]}
    out: dict[str, Any] = {"args": vars(args), "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                           "modes": {}}
    try:
        for mode in args.modes.split(","):
            t0 = time.perf_counter()
            generate(engine, batch, names[mode], args.tokens)  # warm-up: graphs of its buckets captured
            warm_s = time.perf_counter() - t0  # the first mode's pays the captures (and compiling, fused)
            before = dataclasses.replace(engine.stats)
            t0 = time.perf_counter()
            generate(engine, batch, names[mode], args.tokens)
            wall = time.perf_counter() - t0
            after = engine.stats
            passes = after.decode_passes - before.decode_passes
            row: dict[str, Any] = {
                "decode_passes": passes,
                "ms_per_pass": 1e3 * (after.decode_s - before.decode_s) / max(passes, 1),
                "wait_ms_per_pass": 1e3 * (after.decode_wait_s - before.decode_wait_s) / max(passes, 1),
                "prefill_s": after.prefill_s - before.prefill_s,
                "tok_s": args.rows * args.tokens / wall,
                "graph_captures": after.graph_captures - before.graph_captures,
                "warmup_s": warm_s,
            }
            if args.profile and device.type == "cuda":
                from torch.profiler import ProfilerActivity, profile

                before = dataclasses.replace(engine.stats)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    generate(engine, batch, names[mode], args.tokens)
                    torch.cuda.synchronize()
                traced = max(engine.stats.decode_passes - before.decode_passes, 1)
                row["trace"] = kernel_table(prof, traced, args.top)
            out["modes"][mode] = row
            print(f"{mode:>6}: {passes} decode passes, {row['ms_per_pass']:.2f} ms a pass (waiting for the device "
                  f"{row['wait_ms_per_pass']:.2f}), {row['tok_s']:,.0f} tok/s, {row['graph_captures']} captures, "
                  f"warm-up {row['warmup_s']:.1f} s"
                  + (f"; traced: {row['trace']['kernels_per_pass']:.0f} kernels and "
                     f"{row['trace']['us_per_pass'] / 1e3:.2f} ms of device time a pass" if "trace" in row else ""),
                  flush=True)
            for k in row.get("trace", {}).get("top", []):
                print(f"        {k['us_per_pass']:9.1f} us {k['per_pass']:6.1f}x  {k['name']}")
    finally:
        engine.close()
    base = out["modes"].get("base")
    if base:
        print(f"\nagainst the base ({args.rows} rows, {args.arch}, {out['device']}):")
        for mode, row in out["modes"].items():
            extra = ""
            if "trace" in row and "trace" in base:
                extra = (f", kernels {row['trace']['kernels_per_pass'] / max(base['trace']['kernels_per_pass'], 1):.2f}x"
                         f", traced time {row['trace']['us_per_pass'] / max(base['trace']['us_per_pass'], 1e-9):.2f}x")
            print(f"  {mode:>6}: ms a pass {row['ms_per_pass'] / base['ms_per_pass']:.2f}x, "
                  f"tok/s {row['tok_s'] / base['tok_s']:.2f}x{extra}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--arch", default="qwen2.5-0.5b", choices=sorted(ARCHS))
    p.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--rows", type=int, default=512, help="requests decoded together")
    p.add_argument("--slots", type=int, default=16, help="adapters the engine holds (the stack's slots); "
                   "mixed spreads the rows over all of them")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per request")
    p.add_argument("--modes", default=",".join(MODES), help="a comma list of base, one, mixed")
    p.add_argument("--no-fuse", action="store_true", help="capture the decode graphs unfused (Engine(fuse_decode=False)): the baseline of the fusion")
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip the torch.profiler run")
    p.add_argument("--top", type=int, default=12, help="kernels listed per mode")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args()
    bad = [m for m in args.modes.split(",") if m not in MODES]
    if bad:
        p.error(f"unknown mode(s) {bad}: pick from {', '.join(MODES)}")
    out = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
