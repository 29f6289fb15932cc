"""Attention at shapes that change from call to call: torch's default SDPA kernel choice against the
same choice without cuDNN's kernel (what the engine and trainer use: groupwise/runtime/attention_backends.py).

    python bench/attention_shapes.py            # CUDA; Qwen2.5-0.5B's heads (14 query, head dim 64)

Two workloads, each a few shapes in a row as a step meets them, the first repeated at the end:
- ``prefill``: q [rows, heads, queries, dim] against K/V [rows, heads, keys, dim] (repeated to every
  head, as transformers does for masked grouped-query attention), a bool causal mask [rows, 1, queries,
  keys] (the last query sees every key);
- ``train``: the same with gradients, forward and backward, a micro-batch [rows, heads, tokens, dim].

Printed per shape and setting: the kernel torch picks (`torch._fused_sdp_choice`: 0 math, 1 flash,
2 memory-efficient, 3 cuDNN), the first call's time (a new shape: cuDNN builds its graph here) and a
second call's, synchronised; then the total over the shapes and the ratio default / without cuDNN.
"""

from __future__ import annotations

import argparse
import sys
import time

KERNELS = {0: "math", 1: "flash", 2: "mem-efficient", 3: "cudnn", 4: "overrideable"}


def timed(fn, device) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


def inputs(kind: str, rows: int, queries: int, keys: int, heads: int, dim: int, device, dtype):
    import torch

    grad = kind == "train"
    q = torch.randn(rows, heads, queries, dim, device=device, dtype=dtype, requires_grad=grad)
    k, v = (torch.randn(rows, heads, keys, dim, device=device, dtype=dtype, requires_grad=grad) for _ in range(2))
    mask = torch.ones(rows, 1, queries, keys, device=device, dtype=torch.bool).tril(keys - queries)
    return q, k, v, mask


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--prefill", default="64x30x31,64x33x34,48x29x30,64x30x31",
                   help="rows x queries x keys, in call order")
    p.add_argument("--train", default="4x300x300,4x310x310,3x290x290,4x300x300", help="rows x tokens x tokens, in call order")
    args = p.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    cudnn = torch.backends.cudnn.version() if device.type == "cuda" else None
    print(f"torch {torch.__version__}, {card}, cuDNN {cudnn}; heads {args.heads}, head dim {args.dim}, {args.dtype}")
    others = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    settings = {"default": others + [SDPBackend.CUDNN_ATTENTION], "without cuDNN": others}
    totals: dict[tuple[str, str], float] = {}
    print("| workload | rows x queries x keys | setting | kernel | first call ms | again ms |")
    print("|---|---|---|---|---|---|")
    for backends in settings.values():  # CUDA's and each kernel's own start-up, at a shape not timed below
        with sdpa_kernel(backends):
            for kind in ("prefill", "train"):
                q, k, v, mask = inputs(kind, 1, 8, 8, args.heads, args.dim, device, dtype)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                if kind == "train":
                    out.sum().backward()
    for name, backends in settings.items():
        with sdpa_kernel(backends):
            for kind, spec in (("prefill", args.prefill), ("train", args.train)):
                for shape in spec.split(","):
                    rows, queries, keys = (int(x) for x in shape.split("x"))
                    q, k, v, mask = inputs(kind, rows, queries, keys, args.heads, args.dim, device, dtype)
                    kernel = KERNELS.get(int(torch._fused_sdp_choice(q, k, v, mask)), "?")

                    def run():
                        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                        if kind == "train":
                            out.sum().backward()

                    first, again = timed(run, device), timed(run, device)
                    totals[(kind, name)] = totals.get((kind, name), 0.0) + first
                    print(f"| {kind} | {rows} x {queries} x {keys} | {name} | {kernel} | {first:.2f} | {again:.2f} |", flush=True)
    for kind in ("prefill", "train"):
        a, b = totals[(kind, "default")], totals[(kind, "without cuDNN")]
        print(f"{kind}: first calls {a:.1f} ms (default) against {b:.1f} ms (without cuDNN): {a / max(b, 1e-9):.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
