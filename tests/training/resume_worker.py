"""A training run in its own process, for the SIGKILL resume test (tests/training/test_resume.py).

    python resume_worker.py <store> <model_dir> <steps> [--hang-at-step K]

Runs `steps` GRPO steps through LocalBackend with deterministic rollouts (seeded, one request at a
time). After each step it also dumps the optimizer tensors it holds in memory to
``<store>/ref/<step>.safetensors`` (a side channel the test compares a resumed optimizer against).
With --hang-at-step K it writes ``<store>/in_step`` inside the training of step K -> K+1 and sleeps,
so the test can SIGKILL it in the middle of a step. Right after register() it dumps the optimizer it
resumed with to ``<store>/ref/resumed-<step>.safetensors``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import groupwise as gw


def dump_optimizer(backend, model, path: Path) -> None:
    from safetensors.torch import save_file

    from groupwise.training.checkpoint import optimizer_to_tensors

    served = backend._models[model.name]
    trainer = served.trainer
    if trainer.optimizer is None:
        return
    names = [n for n, _ in trainer.trainable_named_parameters()]
    tensors, _ = optimizer_to_tensors(trainer.optimizer, names)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))


async def main(store: str, model_dir: str, steps: int, hang_at: int | None) -> None:
    model = gw.TrainableModel(name="agent", project="resume", base_model=model_dir)
    backend = gw.LocalBackend(path=store, best_checkpoint_metric=None)
    await model.register(backend)
    start = await model.get_step()
    dump_optimizer(backend, model, Path(store) / "ref" / f"resumed-{start}.safetensors")
    served = backend._models[model.name]
    real_step = served.trainer.train_step

    def train_step(batch, config, *, step):
        if hang_at is not None and step == hang_at:
            (Path(store) / "in_step").write_text(str(step))
            time.sleep(120)  # the test kills us here, mid-step
        return real_step(batch, config, step=step)

    served.trainer.train_step = train_step
    client = model.openai_client()
    for step in range(start, steps):
        groups = []
        for g in range(2):
            trajs = []
            for i in range(4):
                messages = [{"role": "user", "content": f"scenario {g}"}]
                r = await client.chat.completions.create(
                    model=model.inference_name(), messages=messages, max_tokens=6, seed=1000 * step + 10 * g + i
                )
                c = r.choices[0]
                trajs.append(gw.Trajectory(messages_and_choices=[*messages, c], reward=float(c.message.content.count("e"))
                                           + 0.1 * i))
            groups.append(gw.TrajectoryGroup(trajs))
        await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
        dump_optimizer(backend, model, Path(store) / "ref" / f"{step + 1}.safetensors")
    await backend.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    hang = int(args[args.index("--hang-at-step") + 1]) if "--hang-at-step" in args else None
    asyncio.run(main(args[0], args[1], int(args[2]), hang))
