"""A training run in its own process, for the SIGKILL resume test (tests/training/test_resume.py).

    python resume_worker.py <store> <model_dir> <steps> [--hang-at-step K] [--hang-in-save K]
                                                        [--hang-before-history K]

Runs `steps` GRPO steps through LocalBackend with deterministic rollouts (seeded, one request at a
time). After each step it also dumps the optimizer tensors it holds in memory to
``<store>/ref/<step>.safetensors`` (a side channel the test compares a resumed optimizer against).
With --hang-at-step K it writes ``<store>/in_step`` inside the training of step K -> K+1 and sleeps,
so the test can SIGKILL it in the middle of a step. With --hang-in-save K it hangs (after writing
``<store>/in_save``) while checkpoint K is being written: the adapter and optimizer files are in the
temp folder, state.json is not. With --hang-before-history K it hangs (after ``<store>/before_history``)
once checkpoint K is in place, before the history row of step K-1 is appended. Right after register()
it dumps the optimizer it resumed with to ``<store>/ref/resumed-<step>.safetensors``.
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

    served = backend._worker.replicas[f"{model.project}/{model.storage_name}"]
    trainer = served.trainer
    if trainer.optimizer is None:
        return
    names = [n for n, _ in trainer.trainable_named_parameters()]
    tensors, _ = optimizer_to_tensors(trainer.optimizer, names)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))


def hang(store: str, marker: str, step: int) -> None:
    (Path(store) / marker).write_text(str(step))
    time.sleep(120)  # the test kills us here


def hang_in_checkpoint_write(store: str, at_step: int) -> None:
    """Hang inside the checkpoint write of step `at_step`, after its adapter and optimizer files are
    written (at rng.json, before state.json)."""
    import groupwise.training.checkpoint as ckpt

    real_write, real_json = ckpt.write_checkpoint, ckpt._write_json
    writing: list[int] = []

    def write_checkpoint(checkpoints_dir, snap, **kwargs):
        writing.append(snap.step)
        return real_write(checkpoints_dir, snap, **kwargs)

    def write_json(path, obj):
        if writing and writing[-1] == at_step and Path(path).name == "rng.json":
            hang(store, "in_save", at_step)
        return real_json(path, obj)

    ckpt.write_checkpoint, ckpt._write_json = write_checkpoint, write_json


async def main(store: str, model_dir: str, steps: int, hang_at: int | None, hang_in_save: int | None = None,
               hang_before_history: int | None = None) -> None:
    if hang_in_save is not None:
        hang_in_checkpoint_write(store, hang_in_save)
    model = gw.TrainableModel(name="agent", project="resume", base_model=model_dir)
    backend = gw.LocalBackend(path=store, best_checkpoint_metric=None)
    await model.register(backend)
    start = await model.get_step()
    dump_optimizer(backend, model, Path(store) / "ref" / f"resumed-{start}.safetensors")
    served = backend._worker.replicas[f"{model.project}/{model.storage_name}"]
    real_step = served.trainer.train_step

    def train_step(batch, config, *, step, **kwargs):
        if hang_at is not None and step == hang_at:
            (Path(store) / "in_step").write_text(str(step))
            time.sleep(120)  # the test kills us here, mid-step
        return real_step(batch, config, step=step, **kwargs)

    served.trainer.train_step = train_step
    if hang_before_history is not None:  # patched on the class: the run's one history writer
        from groupwise.runs.history import RunHistory

        real_write = RunHistory.write

        async def write(self, row, **kwargs):
            if row.get("split") == "train" and row.get("step") == hang_before_history - 1:
                hang(store, "before_history", hang_before_history)
            return await real_write(self, row, **kwargs)

        RunHistory.write = write
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

    def option(name: str) -> int | None:
        return int(args[args.index(name) + 1]) if name in args else None

    asyncio.run(main(args[0], args[1], int(args[2]), option("--hang-at-step"), option("--hang-in-save"),
                     option("--hang-before-history")))
