"""The asynchronous loop on a real tiny model (LocalBackend, batch-invariant engine, seeded rollouts):
every trained token carries the policy that sampled it, the loss corrects for it (TIS), and a run that
crashed while batches were gathered ahead resumes to the history and the batches of an uninterrupted one."""

from __future__ import annotations

import pytest
from history_rows import stable_rows
from pydantic import BaseModel

import groupwise as gw
from groupwise.core.choices import choice_policy_versions, choice_token_ids
from groupwise.runs.series import rows

pytest.importorskip("torch")
pytest.importorskip("peft")



class Question(BaseModel):
    id: int
    sampling_seed: int | None = None  # the loop seeds each training rollout (LoopConfig.seed_rollouts)


class Crash(RuntimeError):
    """Stands for kill -9 (LoopConfig.max_exceptions=0: the gathering fails, and the run with it)."""


TRAIN = [Question(id=i) for i in range(8)]
VAL = [Question(id=100 + i, sampling_seed=i) for i in range(2)]


def make_rollout(crash_at: str | None = None):
    async def rollout(model, q: Question):
        if crash_at is not None and model.inference_name() == crash_at:
            raise Crash()
        messages = [{"role": "user", "content": f"Count to {q.id}."}]
        r = await model.openai_client().chat.completions.create(
            model=model.inference_name(), messages=messages, max_tokens=4, temperature=1.0, seed=q.sampling_seed)
        choice = r.choices[0]
        return gw.Trajectory(messages_and_choices=[*messages, choice], reward=sum(choice_token_ids(choice)) % 11 / 10)

    return rollout


async def fit(tiny_model_dir: str, path: str, crash_at: str | None = None):
    model = gw.TrainableModel("piped", project="tiny", base_model=tiny_model_dir, base_path=path)
    backend = gw.LocalBackend(path=path, device="cpu", engine_kwargs={"batch_invariant": True})
    await model.register(backend)
    config = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, max_steps=3, eval_every=2, patience=100,
                           num_epochs=2, max_steps_off_policy=1, metric="score",
                           train_config=gw.TrainConfig(off_policy="tis", learning_rate=5e-2, max_seq_len=256))
    try:
        return await gw.fit(model, make_rollout(crash_at), TRAIN, val_scenarios=VAL, config=config)
    finally:
        await backend.close()


def trained(run_dir: str) -> list[tuple[int, list[list[int]], list[list[int]]]]:
    """(step, token ids, policy versions) of every trained trajectory, step by step."""
    out = []
    for step in range(3):
        trajs = [t for g in gw.load_trajectories(run_dir, "train", step) for t in g]
        out.append((step, [choice_token_ids(t.choices()[0]) for t in trajs],
                    [choice_policy_versions(t.choices()[0]) for t in trajs]))
    return out


async def test_a_pipelined_run_resumed_after_a_crash_equals_an_uninterrupted_one(tiny_model_dir, tmp_path):
    clean = await fit(tiny_model_dir, str(tmp_path / "clean"))
    assert clean.final_step == 3
    h = gw.load_history(clean.run_dir)
    # provenance: step k trained on tokens sampled by policy max(0, k - 1), as each token says
    for step, _, versions in trained(clean.run_dir):
        assert {v for vs in versions for v in vs} == {max(0, step - 1)}
    assert [r["pipeline/staleness_mean"] for r in rows(h, "loop")] == [0, 1, 1]
    # correction: from step 1 on the trainer's policy is a step ahead of the sampler's, and TIS weighs that
    train = rows(h, "train")
    assert all("importance_capped_fraction" in r for r in train)
    assert abs(train[0]["ratio_mean"] - 1) < 1e-4 < max(abs(r["ratio_mean"] - 1) for r in train[1:])

    # crashed in step 2's validation (steps 0 and 1 trained, the batch of step 2 gathered ahead)
    with pytest.raises(gw.GatherError, match="Crash"):
        await fit(tiny_model_dir, str(tmp_path / "crashed"), crash_at="piped@2")
    resumed = await fit(tiny_model_dir, str(tmp_path / "crashed"))
    assert resumed.start_step == 2 and resumed.final_step == 3
    assert stable_rows(gw.load_history(resumed.run_dir)) == stable_rows(h)
    assert trained(resumed.run_dir) == trained(clean.run_dir)
