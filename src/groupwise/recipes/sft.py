"""Supervised warm starts: `groupwise sft` and the `--sft N` of `groupwise train`.

Demonstrations come from a JSONL file in ART's SFT format (one ``{"messages": [...], "tools": [...]}`` per
line) or from an env's scripted demonstrator (`EnvSpec.demonstrate`, e.g. the email agent that knows the
ground truth). Each epoch is one `model.train_sft` call, so one step of the run: a checkpoint, an
``sft`` history row and a served adapter. GRPO (`groupwise train` with the same ``--name``) continues
from the last of them; a run that already has its SFT steps skips them (resume).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from groupwise.envs import EnvSpec, get_env


def read_jsonl(path: str | Path) -> list[Any]:
    """Trajectories of an ART-style SFT file: each line ``{"messages": [...], "tools": [...] (optional)}``."""
    import groupwise as gw

    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append(gw.Trajectory(messages_and_choices=row["messages"], tools=row.get("tools")))
        except (json.JSONDecodeError, KeyError, ValueError) as exc:
            raise ValueError(f"{path}:{n}: not an SFT row {{\"messages\": [...], \"tools\": [...]}} ({exc})") from None
    if not out:
        raise ValueError(f"{path} holds no demonstrations")
    return out


def env_demonstrations(spec: EnvSpec, n: int, *, seed: int, max_tokens: int | None = None, **overrides: Any) -> list[Any]:
    """`n` demonstrations of the env's scripted demonstrator on its training scenarios (the first `n` of the
    seed's training order); `overrides` go to the scenarios (e.g. the email env's tool_mode)."""
    if spec.demonstrate is None:
        have = sorted(name for name, s in _envs().items() if s.demonstrate is not None)
        raise ValueError(f"env {spec.name!r} has no scripted demonstrator; these have one: {have}. "
                         "Or pass a JSONL file of demonstrations.")
    train = spec.scenarios(seed, **{"max_tokens": max_tokens or spec.max_tokens, **overrides})[0]
    if n > len(train):
        raise ValueError(f"--sft {n}: env {spec.name!r} has {len(train)} training scenarios")
    return [spec.demonstrate(s) for s in train[:n]]


def _envs() -> dict[str, EnvSpec]:
    from groupwise.envs import ENVS

    return ENVS


async def warm_start(model: Any, trajectories: list[Any], *, epochs: int, learning_rate: float, batch_size: int = 4,
                     seed: int = 0, gradient_checkpointing: bool = True) -> int:
    """SFT epochs (one step each, trajectories shuffled per epoch); returns how many SFT steps the run has.

    Only while every step of the run so far is an SFT step: a run that has moved on to GRPO keeps its steps.
    """
    import groupwise as gw

    done = sum(1 for r in model.store.history(skip_corrupt=True) if r.get("split") == "sft")
    step = await model.get_step()
    if step != done:
        return done  # GRPO already continued from the warm start
    config = gw.TrainSFTConfig(learning_rate=learning_rate, batch_size=batch_size, max_seq_len=8192,
                               micro_batch_tokens=2048, gradient_checkpointing=gradient_checkpointing, seed=seed)
    for epoch in range(done, epochs):
        order = list(trajectories)
        random.Random(f"sft:{seed}:{epoch}").shuffle(order)
        t0 = time.monotonic()
        result = await model.train_sft(order, config)
        m = result.metrics
        print(f"[groupwise sft] epoch {epoch + 1}/{epochs} -> step {result.step}: loss {m['loss']:.4f} "
              f"(first batch {m['first_loss']:.4f}, last {m['last_loss']:.4f}), {int(m['trainable_tokens'])} target "
              f"tokens, {int(m['updates'])} updates, {time.monotonic() - t0:.0f}s", flush=True)
    return epochs


async def sft(data: str, *, model_name: str, n: int | None, epochs: int, learning_rate: float, batch_size: int,
              seed: int, path: str, project: str | None, name: str | None, device: str | None) -> dict[str, Any]:
    """`groupwise sft`: warm-start a run from demonstrations; GRPO can continue it under the same name."""
    import groupwise as gw

    if Path(data).suffix == ".jsonl" or Path(data).is_file():
        trajectories = read_jsonl(data)[: n or None]
        project = project or "sft"
        name = name or f"{Path(data).stem}-s{seed}"
    else:
        spec = get_env(data)
        trajectories = env_demonstrations(spec, n or 64, seed=seed)
        project = project or spec.name
        name = name or f"{spec.name}-s{seed}"
    t0 = time.monotonic()
    model = gw.TrainableModel(name=name, project=project, base_model=model_name, base_path=path)
    backend = gw.LocalBackend(path, device=device, best_checkpoint_metric=None)
    await model.register(backend)
    print(f"[groupwise sft] {len(trajectories)} demonstrations, {epochs} epoch(s), lr {learning_rate}, "
          f"batch {batch_size}; run folder {model.run_dir}", flush=True)
    try:
        steps = await warm_start(model, trajectories, epochs=epochs, learning_rate=learning_rate,
                                 batch_size=batch_size, seed=seed)
        step = await model.get_step()
    finally:
        await backend.close()
    print(f"[groupwise sft] done: step {step} ({steps} SFT step(s)) in {(time.monotonic() - t0) / 60:.1f} min; "
          f"continue with GRPO: groupwise train <env> --name {name} --path {path}")
    return {"run_dir": str(model.run_dir), "step": step, "sft_steps": steps}


def run_sft(args: Any) -> int:
    """Entry point of `groupwise sft` (arguments declared in cli.py)."""
    try:
        asyncio.run(sft(args.data, model_name=args.model, n=args.n, epochs=args.epochs, learning_rate=args.lr,
                        batch_size=args.batch_size, seed=args.seed, path=args.path, project=args.project,
                        name=args.name, device=args.device))
    except (KeyError, ValueError) as exc:
        print(f"groupwise sft: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    return 0
