"""Two seeded runs in one process are one run, however the rollouts' requests reach the engine.

test_loop_e2e.py's setting, small: the tiny peaked model, a batch-invariant LocalBackend, rollouts that
pass an explicit `seed`, validation every 2 steps (so several policy versions, ``name@k``, are served
during the run). The second run delays each request by a random few milliseconds, so requests join
other engine steps and other batches than in the first. Every trained token, its logprob, every
history row and the trained adapter's bytes must be the same: the engine's batch invariance and a
deterministic trainer (same trajectories in, same adapter out) together make a run a function of its
seed. What this cannot show is the same across processes under heavy CPU load (config.py's
seed_rollouts help says what was measured there).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from pathlib import Path

import pytest
from history_rows import stable_rows

import groupwise as gw
from groupwise.core.choices import choice_token_ids
from groupwise.runs.series import rows

pytest.importorskip("torch")
pytest.importorskip("peft")

SCENARIOS = [{"id": i, "q": f"Say something short about topic {i}."} for i in range(12)]


def make_rollout(jitter: random.Random | None):
    seeds = itertools.count()

    async def rollout(model, scenario):
        seed = next(seeds)  # in task-creation order, before any await: the same in both runs
        if jitter is not None:
            await asyncio.sleep(jitter.choice((0.0, 0.002, 0.02 * jitter.random())))
        messages = [{"role": "user", "content": scenario["q"]}]
        r = await model.openai_client().chat.completions.create(
            model=model.inference_name(), messages=messages, max_tokens=6, temperature=1.0, seed=seed, logprobs=True)
        choice = r.choices[0]
        text = choice.message.content or ""
        return gw.Trajectory(messages_and_choices=[*messages, choice],
                             reward=text.count("\n") / 6 + len(text) / 1000)

    return rollout


def logprobs(choice) -> list[float]:
    content = choice["logprobs"]["content"] if isinstance(choice, dict) else choice.logprobs.content
    return [c["logprob"] if isinstance(c, dict) else c.logprob for c in content]


async def run(base: str, path: Path, jitter: random.Random | None) -> dict:
    model = gw.TrainableModel("rep", project="loop", base_model=base, base_path=str(path))
    backend = gw.LocalBackend(path=str(path), device="cpu", engine_kwargs={"batch_invariant": True})
    await model.register(backend)
    try:
        cfg = gw.LoopConfig(rollouts_per_group=8, groups_per_step=2, eval_every=2, max_steps=3, num_epochs=10,
                            learning_rate=1e-2, patience=100, val_rollouts_per_group=2)
        summary = await gw.fit(model, make_rollout(jitter), SCENARIOS[:8], val_scenarios=SCENARIOS[8:], config=cfg)
    finally:
        await backend.close()
    trained = {}
    for step in range(3):
        trained[step] = [[(choice_token_ids(t.messages_and_choices[-1]), logprobs(t.messages_and_choices[-1]), t.reward)
                          for t in g] for g in gw.load_trajectories(summary.run_dir, "train", step)]
    history = {split: stable_rows(rows(gw.load_history(summary.run_dir), split)) for split in ("train", "val")}
    adapters = {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.glob("loop/models/rep/checkpoints/*/adapter_model.safetensors"))}
    return {"trained": trained, "history": history, "adapters": adapters}


async def test_two_seeded_runs_with_different_arrival_times_are_bitwise_one_run(peaked_tiny_model, tmp_path):
    first = await run(peaked_tiny_model, tmp_path / "a", None)
    second = await run(peaked_tiny_model, tmp_path / "b", random.Random(1))
    # validated at steps 0 and 2 (eval_every) and at the stop, step 3
    assert [len(g) for g in first["trained"][2]] == [8, 8] and [r["step"] for r in first["history"]["val"]] == [0, 2, 3]
    assert first["adapters"], "no checkpoint kept"
    for step in range(3):
        assert first["trained"][step] == second["trained"][step], f"train step {step}: tokens, logprobs or rewards differ"
    assert first["history"] == second["history"]
    assert first["adapters"] == second["adapters"]  # same trajectories in, same adapter out
