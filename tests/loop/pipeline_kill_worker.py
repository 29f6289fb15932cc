"""A pipelined run on a tiny model (LocalBackend, `max_steps_off_policy=1`) in its own process, for the
kill -9 tests (test_loop_pipeline_kill.py).

    python pipeline_kill_worker.py <store> <model_dir> [--hang-in-update K | --hang-in-save K] [--name NAME]

With --hang-in-update K it writes ``<store>/hanging`` inside the GRPO update of step K (the batch of
step K+1 being gathered meanwhile) and sleeps; with --hang-in-save K it does so inside the write of
checkpoint K (adapter and optimizer files written, state.json not yet). The test SIGKILLs it there,
then runs this script again without a hang: the run resumes and ends. --name trains another run than
"piped" (two processes training two runs of one store at once).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import groupwise as gw

STEPS = 3


def hang(store: str, where: str) -> None:
    (Path(store) / "hanging").write_text(where)
    time.sleep(300)  # the test kills us here


async def rollout(model, scenario):
    messages = [{"role": "user", "content": f"Count to {scenario['id']}."}]
    r = await model.openai_client().chat.completions.create(
        model=model.inference_name(), messages=messages, max_tokens=4, temperature=1.0,
        seed=scenario.get("sampling_seed"))
    choice = r.choices[0]
    return gw.Trajectory(messages_and_choices=[*messages, choice], reward=len(choice.message.content or "") % 7 / 6)


async def main(store: str, model_dir: str, hang_in_update: int | None, hang_in_save: int | None,
               name: str = "piped") -> None:
    if hang_in_save is not None:
        import groupwise.training.checkpoint as ckpt

        real_write, real_json = ckpt.write_checkpoint, ckpt._write_json
        writing: list[int] = []

        def write_checkpoint(checkpoints_dir, snap, **kwargs):
            writing.append(snap.step)
            return real_write(checkpoints_dir, snap, **kwargs)

        def write_json(path, obj):
            if writing and writing[-1] == hang_in_save and Path(path).name == "rng.json":
                hang(store, f"save {hang_in_save}")
            return real_json(path, obj)

        ckpt.write_checkpoint, ckpt._write_json = write_checkpoint, write_json
    model = gw.TrainableModel(name, project="kill", base_model=model_dir, base_path=store)
    backend = gw.LocalBackend(path=store, device="cpu", best_checkpoint_metric=None)
    await model.register(backend)
    if hang_in_update is not None:
        trainer = backend._worker.replicas[f"{model.project}/{model.name}"].trainer
        real_step = trainer.train_step

        def train_step(batch, config, *, step, **kwargs):
            if step == hang_in_update:
                hang(store, f"update {step}")
            return real_step(batch, config, step=step, **kwargs)

        trainer.train_step = train_step
    config = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, max_steps=STEPS, eval_every=100, patience=100,
                           num_epochs=3, max_steps_off_policy=1,
                           train_config=gw.TrainConfig(off_policy="tis", learning_rate=1e-2, max_seq_len=128))
    try:
        summary = await gw.fit(model, rollout, [{"id": i} for i in range(6)], config=config)
    finally:
        await backend.close()
    print(json.dumps({"final_step": summary.final_step, "start_step": summary.start_step}))


if __name__ == "__main__":
    args = sys.argv[1:]

    def option(name: str) -> int | None:
        return int(args[args.index(name) + 1]) if name in args else None

    asyncio.run(main(args[0], args[1], option("--hang-in-update"), option("--hang-in-save"),
                     args[args.index("--name") + 1] if "--name" in args else "piped"))
