"""Supervised warm starts: `groupwise sft` and the `--sft N` of `groupwise train`.

Demonstrations come from a JSONL file in ART's SFT format (one ``{"messages": [...], "tools": [...]}`` per
line) or from an env's scripted demonstrator (`EnvSpec.demonstrate`, e.g. the email agent that knows the
ground truth). Each epoch is one `model.train_sft` call, so one step of the run: a checkpoint, an
``sft`` history row and a served adapter. GRPO (the `groupwise train` command it prints: the same
project, name, base model and run store) continues from the last of them; a run that already has its SFT steps skips them (resume).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from groupwise.config import TrainSFTConfig
from groupwise.errors import ConfigError, InvalidDataError
from groupwise.jobs.common import device_field, folder_name_problem, model_field, run_name_problem, store_field
from groupwise.jobs.fields import Command, Job, arg

if TYPE_CHECKING:
    from groupwise.envs import EnvSpec

# The warm start's settings, shared by `groupwise sft` and `groupwise train --sft N`.
SFT_EPOCHS = 2
SFT_LEARNING_RATE = 2e-4
SFT_BATCH_SIZE = 4
# Why the warm start's flags do not take TrainSFTConfig's defaults (jobs/fields.py: `own_default`).
SFT_RATE_WHY = ("a warm start is a few epochs over tens of demonstrations, at the peak rate of ART's SFT from a "
                "file (2e-4); TrainSFTConfig's default is one train_sft call's")
SFT_BATCH_WHY = "a warm start's updates average 4 demonstrations; TrainSFTConfig's 'auto' is ART's 2"
ENV_DEMONSTRATIONS = 64  # `groupwise sft <env>` without -n


def _data_problem(data: str) -> str | None:
    """A file of demonstrations, or the name of an env that has a scripted demonstrator."""
    if Path(data).is_file():
        return None
    if Path(data).suffix == ".jsonl" or Path(data).exists():
        return "no such file (a JSONL file of demonstrations, one {\"messages\": [...]} per line)"
    from groupwise.envs import ENVS

    have = ", ".join(sorted(name for name, spec in ENVS.items() if spec.demonstrate is not None))
    if data not in ENVS:
        return f"neither a JSONL file nor an env with a scripted demonstrator ({have})"
    if ENVS[data].demonstrate is None:
        return f"env {data!r} has no scripted demonstrator; these have one: {have}. Or pass a JSONL file"
    return None


@dataclass
class SFTJob(Job):
    data: str = arg(positional=True, on_machine=_data_problem, help="a JSONL file in ART's SFT format ({\"messages\": [...], \"tools\": [...]} "
                                          "per line), or an env with a scripted demonstrator (email, tictactoe, "
                                          "tictactoe-minimax)")
    n: int | None = arg(None, low=1, help=f"how many demonstrations (default: the file's all; env: {ENV_DEMONSTRATIONS})")
    epochs: int = arg(SFT_EPOCHS, low=1, help="passes over the demonstrations, one step each")
    lr: float = arg(SFT_LEARNING_RATE, feeds=(TrainSFTConfig, "learning_rate"), own_default=SFT_RATE_WHY)
    batch_size: int = arg(SFT_BATCH_SIZE, feeds=(TrainSFTConfig, "batch_size"), own_default=SFT_BATCH_WHY)
    model: str = model_field()
    seed: int = arg(feeds=(TrainSFTConfig, "seed"), help="Here also which demonstrations, and their order.")
    path: str = store_field()
    project: str | None = arg(None, check=folder_name_problem, help="project (default: the env's name, or 'sft' for "
                                                                     "a file)")
    name: str | None = arg(None, check=run_name_problem,
                           help="model name (default: <env>-s<seed>, as groupwise train names it)")
    device: str | None = device_field()


def read_jsonl(path: str | Path) -> list[Any]:
    """Trajectories of an ART-style SFT file: each line ``{"messages": [...], "tools": [...] (optional)}``
    (`groupwise.core.readers.read_sft_file`: a bad line is one error naming it, before a model loads)."""
    from groupwise.core.readers import read_sft_file

    out = [t for _, t in read_sft_file(path)]
    if not out:
        raise InvalidDataError(f"{path} holds no demonstrations")
    return out


def env_demonstrations(spec: EnvSpec, n: int, *, seed: int, **overrides: Any) -> list[Any]:
    """`n` demonstrations of the env's scripted demonstrator on its training scenarios (the first `n` of the
    seed's training order); `overrides` go to the scenarios (e.g. the email env's tool_mode, max_tokens)."""
    if spec.demonstrate is None:
        have = sorted(name for name, s in _envs().items() if s.demonstrate is not None)
        raise ConfigError(f"env {spec.name!r} has no scripted demonstrator; these have one: {have}. "
                          "Or pass a JSONL file of demonstrations.", what="SFT demonstrations")
    train = spec.scenarios(seed, **overrides)[0]
    if n > len(train):
        raise ConfigError(f"--sft {n}: env {spec.name!r} has {len(train)} training scenarios",
                          what="SFT demonstrations")
    return [spec.demonstrate(s) for s in train[:n]]


def _envs() -> dict[str, EnvSpec]:
    from groupwise.envs import ENVS

    return ENVS


async def warm_start(model: Any, trajectories: list[Any], *, epochs: int, learning_rate: float,
                     batch_size: int = SFT_BATCH_SIZE, seed: int, gradient_checkpointing: bool = True) -> int:
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
    return max(done, epochs)  # a resume asking fewer epochs than were done keeps (and counts) them all


async def warm_started(spec: EnvSpec, n: int, model: Any, *, seed: int, epochs: int,
                       learning_rate: float) -> tuple[int, list[Any]]:
    """`groupwise train`'s warm start of `n` demonstrations (the preset's or ``--sft``), if any: (the run's SFT
    steps, the baselines for `fit`: its last SFT step, scored as a baseline GRPO has to beat)."""
    if not n:
        return 0, []
    from groupwise.loop.rollout_inputs import AtStep

    sft_steps = await warm_start(model, env_demonstrations(spec, n, seed=seed), epochs=epochs,
                                 learning_rate=learning_rate, seed=seed)
    # 0 for a run that had trained GRPO steps before it was asked for a warm start: it has none to score
    return sft_steps, [AtStep(model, sft_steps)] if sft_steps else []


def warm_start_fields(model: Any, sft_steps: int, baselines: dict[str, float]) -> dict[str, Any]:
    """What a run's summary.json says of its warm start: its SFT steps and the validation score of the
    last one (from `fit`'s baselines; None without a warm start)."""
    return {"sft_steps": sft_steps, "sft": baselines.get(model.inference_name(sft_steps)) if sft_steps else None}


async def sft(job: SFTJob) -> dict[str, Any]:
    """`groupwise sft`: warm-start a run from demonstrations; GRPO can continue it under the same name."""
    import groupwise as gw
    from groupwise.envs import get_env

    env = None
    if Path(job.data).suffix == ".jsonl" or Path(job.data).is_file():
        trajectories = read_jsonl(job.data)[: job.n or None]
        project = job.project or "sft"
        name = job.name or f"{Path(job.data).stem}-s{job.seed}"
    else:
        spec = env = get_env(job.data)
        trajectories = env_demonstrations(spec, job.n or ENV_DEMONSTRATIONS, seed=job.seed)
        project = job.project or spec.name
        name = job.name or f"{spec.name}-s{job.seed}"
    t0 = time.monotonic()
    model = gw.TrainableModel(name=name, project=project, base_model=job.model, base_path=job.path)
    backend = gw.LocalBackend(job.path, device=job.device, best_checkpoint_metric=None)
    await model.register(backend)
    print(f"[groupwise sft] {len(trajectories)} demonstrations, {job.epochs} epoch(s), lr {job.lr}, "
          f"batch {job.batch_size}; run folder {model.run_dir}", flush=True)
    try:
        steps = await warm_start(model, trajectories, epochs=job.epochs, learning_rate=job.lr,
                                 batch_size=job.batch_size, seed=job.seed)
        step = await model.get_step()
    finally:
        await backend.close()
    print(f"[groupwise sft] done: step {step} ({steps} SFT step(s)) in {(time.monotonic() - t0) / 60:.1f} min; "
          f"continue with GRPO: {continuation(job, env.name if env is not None else None, project, name)}")
    return {"run_dir": str(model.run_dir), "step": step, "sft_steps": steps}


def continuation(job: SFTJob, env: str | None, project: str, name: str) -> str:
    """The `groupwise train` command that continues the run `job` warm-started: its project, name, base
    model and run store (absolute: the command may be run from another folder), and for an env's
    demonstrations that env and seed (a file's env is the user's to name: ``<env>``)."""
    import shlex

    words = ["groupwise", "train", env or "<env>", "--project", project, "--name", name, "--model", job.model,
             "--path", str(Path(job.path).resolve())]
    if env is not None:
        words += ["--seed", str(job.seed)]
    if job.device is not None:
        words += ["--device", job.device]
    return " ".join(w if w == "<env>" else shlex.quote(w) for w in words)


def run(job: SFTJob) -> int:
    import asyncio

    asyncio.run(sft(job))  # groupwise's own errors are one line (cli.main); anything else is a bug: its traceback
    return 0


COMMAND = Command("sft", SFTJob, run, help="supervised warm start of a run from demonstrations (GRPO continues it)")
