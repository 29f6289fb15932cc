"""Retention strategies: keep the newest k and the top k by the validation metric, set in gw.fit's
LoopConfig (and PipelineTrainer's keep_recent_and_top), the latest, the loop's best and pinned steps
protected, each prune a history row naming the deleted steps and why; a run stopped and resumed keeps
retaining by the same rule, on a real tiny model and LocalBackend."""

from __future__ import annotations

import itertools

import pytest

import groupwise as gw
from groupwise.runs.series import rows

# the validation metric each checkpoint scores (the rollout reads the step that answered it)
VAL = {0: 0.5, 1: 0.9, 2: 0.1, 3: 0.8, 4: 0.2, 5: 0.3, 6: 0.05}


def make_rollout():
    rewards = itertools.count()

    async def rollout(model, scenario):
        messages = [{"role": "user", "content": scenario["q"]}]
        r = await model.openai_client().chat.completions.create(model=model.inference_name(), messages=messages,
                                                                max_tokens=2, seed=scenario["i"])
        t = gw.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=float(next(rewards) % 2))
        t.metadata["step"] = int(r.model.rpartition("@")[2])
        return t

    return rollout


def validate(trajectory, scenario) -> float:
    return VAL[trajectory.metadata["step"]]


def checkpoints(model) -> list[int]:
    return sorted(int(p.name) for p in model.store.checkpoints_dir.iterdir() if p.name.isdigit())


async def run(tiny_model_dir, tmp_path, max_steps: int) -> gw.TrainableModel:
    model = gw.TrainableModel("ret", project="retention", base_model=tiny_model_dir, base_path=str(tmp_path))
    backend = gw.LocalBackend(path=str(tmp_path), device="cpu")
    await model.register(backend)
    ignore = {f"on_{d}": "ignore" for d in ("reward_against_task", "val_drop", "val_unstable", "val_plateau",
                                            "reward_jump", "perfect_scores", "degenerate")}
    config = gw.LoopConfig(rollouts_per_group=2, groups_per_step=1, eval_every=1, max_steps=max_steps,
                           num_epochs=100, learning_rate=1e-3, patience=100, score_train=False,
                           retention=gw.CheckpointRetention(keep_recent=2, keep_top=2), **ignore)
    scenarios = [{"i": i, "q": f"topic {i}"} for i in range(4)]
    try:
        await gw.fit(model, make_rollout(), scenarios, val_scenarios=[{"i": 99, "q": "val"}], validate=validate,
                     config=config)
    finally:
        await backend.close()
    return model


async def test_the_newest_and_the_top_by_validation_are_kept_through_a_resume_each_prune_logged(tiny_model_dir,
                                                                                                 tmp_path):
    model = await run(tiny_model_dir, tmp_path, max_steps=3)
    # newest 2: {2, 3}; top 2 by val: the loop's best (1: 0.9) and the next (3: 0.8)
    assert checkpoints(model) == [1, 2, 3]

    model = await run(tiny_model_dir, tmp_path, max_steps=6)  # stopped, then resumed in a new backend
    assert checkpoints(model) == [1, 3, 5, 6]  # newest {5, 6}; top {1, 3}; 2 and 4 pruned
    h = gw.load_history(model.store.run_dir)
    pruned = rows(h, "retention")
    assert [(r["step"], r["deleted"]) for r in pruned] == [(4, [2]), (6, [4])]
    assert all(r["metric"] == "val/accuracy" and (r["keep_recent"], r["keep_top"]) == (2, 2) and r["best"] == [1]
               for r in pruned)
    assert "not the latest, nor among the 2 newest, nor among the 2 best by val/accuracy" in pruned[0]["message"]


def test_a_retention_checks_its_settings_and_is_arts_strategy():
    with pytest.raises(gw.ConfigError) as e:
        gw.CheckpointRetention(keep_recent=-1, keep_top=1.5, metric="reward")
    assert len(e.value.problems) == 3
    from datetime import datetime, timezone

    from groupwise.pipeline_trainer import CheckpointInfo, CheckpointRetentionContext, keep_recent_and_top

    strategy = keep_recent_and_top(recent=3, top=1, metric="val/reward")
    assert strategy == gw.CheckpointRetention(keep_recent=3, keep_top=1, metric="val/reward")
    infos = [CheckpointInfo(step=s, path=str(s), created_at=datetime.now(timezone.utc), metrics=m)
             for s, m in ((1, {"val/reward": 0.9}), (2, {"val/reward": 0.1}))]
    # fewer checkpoints than `recent`: all of them are the newest
    assert strategy(CheckpointRetentionContext(current_step=2, checkpoints=infos)) == {1, 2}
    lower = gw.CheckpointRetention(keep_recent=0, keep_top=1, metric="val/reward", higher_is_better=False)
    assert lower(CheckpointRetentionContext(current_step=2, checkpoints=infos)) == {2}
