"""ART's PipelineTrainer (groupwise.pipeline_trainer): ART's constructor, the staleness bound read from
the tokens, late and zero-variance groups logged, resume at the saved scenario offset, and a run on a
real tiny model whose rollouts overlap the updates."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

import groupwise as gw
from groupwise.runs.series import rows

sys.path.insert(0, str(Path(__file__).parents[1] / "loop"))
from loop_helpers import ScriptedBackend as LoopBackend  # noqa: E402

from groupwise.pipeline_trainer import PipelineTrainer, keep_recent_and_top, make_group_rollout_fn  # noqa: E402

# ART 0.5.18's PipelineTrainer.__init__, in order (art/pipeline_trainer/trainer.py)
ART_PARAMS = ["self", "model", "backend", "rollout_fn", "scenarios", "config", "eval_fn", "num_rollout_workers",
              "min_batch_size", "max_batch_size", "max_steps_off_policy", "queue_maxsize", "learning_rate", "loss_fn",
              "loss_fn_config", "normalize_advantages", "adam_params", "packed_sequence_length", "max_steps",
              "discard_queue_multiplier", "log_interval_seconds", "status_ewa_alpha", "total_scenarios",
              "eval_every_n_steps", "eval_at_start", "save_checkpoint", "checkpoint_retention_strategy",
              "checkpoint_retention_interval", "resume"]


class ScriptedBackend(LoopBackend):
    """The loop tests' scripted backend (a step counter, no model), for groups without a scenario index."""

    async def train(self, model, groups, config, *, cursor=None):
        for g in groups:
            g.metadata.setdefault("scenario_index", None)
        return await super().train(model, groups, config, cursor=cursor)


def sampled(text: str, versions: list[int]):
    from openai.types.chat.chat_completion import Choice
    from openai.types.chat.chat_completion_message import ChatCompletionMessage

    return Choice(index=0, finish_reason="stop", message=ChatCompletionMessage(role="assistant", content=text),
                  policy_versions=versions)


def test_arts_constructor_and_its_checks():
    assert list(inspect.signature(PipelineTrainer.__init__).parameters) == ART_PARAMS
    with pytest.raises(gw.ConfigError) as e:
        PipelineTrainer(None, None, lambda *a: None, [], None, num_rollout_workers=0, min_batch_size=4,
                        max_batch_size=2, loss_fn="dpo", max_steps_off_policy=-1)
    assert len(e.value.problems) == 4
    strategy = keep_recent_and_top(recent=1, top=1, metric="val/reward")
    from datetime import datetime, timezone

    from groupwise.pipeline_trainer import CheckpointInfo, CheckpointRetentionContext

    infos = [CheckpointInfo(step=s, path=str(s), created_at=datetime.now(timezone.utc), metrics=m)
             for s, m in ((1, {"val/reward": 0.9}), (2, {"val/reward": 0.1}), (3, {}))]
    assert set(strategy(CheckpointRetentionContext(current_step=4, checkpoints=infos))) == {1, 3}


async def test_stale_groups_are_left_out_by_their_tokens_and_logged(tmp_path):
    # scenario "old" always samples from the base (its tokens say version 0), the others from the policy
    # they were handed: once the trainer is 2 steps on, "old"'s groups are stale for max_steps_off_policy=1
    async def rollout(model, scenario, config):
        step = await model.get_step()
        version = 0 if scenario["name"] == "old" else step
        return gw.TrajectoryGroup([
            gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, sampled(f"a{i}", [version] * 2)],
                          reward=float(i)) for i in range(2)])

    model = gw.TrainableModel("pipe", project="art", base_model="none", base_path=str(tmp_path))
    backend = ScriptedBackend()
    await model.register(backend)
    scenarios = [{"name": "old" if i % 3 == 0 else f"s{i}"} for i in range(30)]
    trainer = PipelineTrainer(model, backend, rollout, scenarios, None, num_rollout_workers=1, min_batch_size=1,
                              max_batch_size=1, max_steps_off_policy=1, max_steps=6, eval_at_start=False)
    await trainer.train(handle_signals=False)
    assert await model.get_step() == 6
    h = gw.load_history(model.store.run_dir)
    assert trainer.discarded_stale_groups >= 1
    assert rows(h, "pipeline")[-1]["discarded_stale_groups"] == trainer.discarded_stale_groups
    discarded = [t for r in rows(h, "discarded") for g in gw.load_trajectories(model.store.run_dir, "discarded", r["step"])
                 for t in g]
    assert len(discarded) == 2 * trainer.discarded_stale_groups
    # every trained token is at most one version behind the step that trained it
    for r in rows(h, "train"):
        for g in gw.load_trajectories(model.store.run_dir, "train", r["step"]):
            assert all(r["step"] - v <= 1 for t in g for v in t.policy_versions())
            assert all(t.initial_policy_version is not None for t in g)


async def test_resume_continues_at_the_scenario_offset_saved_with_the_checkpoint(tmp_path):
    seen: list[int] = []

    async def single(model, scenario, config):
        seen.append(scenario["i"])
        return gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                             reward=float(len(seen) % 2))

    model = gw.TrainableModel("resume", project="art", base_model="none", base_path=str(tmp_path))
    await model.register(ScriptedBackend())
    scenarios = [{"i": i} for i in range(20)]
    first = PipelineTrainer(model, model.backend, make_group_rollout_fn(single, n=2), scenarios, None,
                            num_rollout_workers=1, min_batch_size=2, max_batch_size=2, max_steps_off_policy=0,
                            max_steps=2, eval_at_start=False)
    await first.train(handle_signals=False)
    offset = (await model.backend.checkpoint_cursor(model))["pipeline_trainer"]["scenario_offset"]
    assert offset >= 4 and await model.get_step() == 2
    seen.clear()
    again = PipelineTrainer(model, model.backend, make_group_rollout_fn(single, n=2), scenarios, None,
                            num_rollout_workers=1, min_batch_size=2, max_batch_size=2, max_steps_off_policy=0,
                            max_steps=1, eval_at_start=False)
    await again.train(handle_signals=False)
    assert seen[0] == offset and await model.get_step() == 3


async def test_scenarios_running_out_before_max_steps_are_named(tmp_path, caplog):
    # every other group ties (no learning signal): 10 scenarios give 5 trainable groups, 2 steps of 2,
    # not the 5 steps asked for; the program goes on as if done, so the trainer says why it stopped
    async def rollout(model, scenario, config):
        rewards = [0.0, 1.0] if scenario["i"] % 2 else [1.0, 1.0]
        return gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"},
                                                                       sampled("a", [0])], reward=r) for r in rewards])

    model = gw.TrainableModel("out", project="art", base_model="none", base_path=str(tmp_path))
    await model.register(ScriptedBackend())
    trainer = PipelineTrainer(model, model.backend, rollout, [{"i": i} for i in range(10)], None,
                              num_rollout_workers=1, min_batch_size=2, max_batch_size=2, max_steps_off_policy=9,
                              max_steps=5, eval_at_start=False)
    with caplog.at_level("WARNING", logger="groupwise.pipeline_trainer"):
        await trainer.train(handle_signals=False)
    trained = await model.get_step()
    assert trained == 3  # groups 1+3, 5+7, then 9 alone when the scenarios end
    (warning,) = [r.getMessage() for r in caplog.records if "ran out" in r.getMessage()]
    assert f"after {trained} of max_steps=5" in warning and "5 groups without reward variance" in warning


async def test_a_pipelined_run_on_a_tiny_model(tiny_model_dir, tmp_path):
    # ART's yes/no/maybe example's shape: one request of n completions per group, an eval every step
    async def rollout_fn(model, scenario, config):
        messages = [{"role": "user", "content": scenario["prompt"]}]
        r = await model.openai_client().chat.completions.create(
            messages=messages, model=model.get_inference_name(), max_tokens=4, n=4)
        return gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[*messages, c], reward=len(c.message.content or "") % 5)
                                   for c in r.choices])

    async def eval_fn(model, step, config):
        messages = [{"role": "user", "content": "respond with yes or no"}]
        r = await model.openai_client().chat.completions.create(messages=messages, model=model.get_inference_name(step),
                                                                max_tokens=4)
        return [gw.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=1.0)]

    model = gw.TrainableModel("yes-no", project="art", base_model=tiny_model_dir, base_path=str(tmp_path))
    backend = gw.LocalBackend(path=str(tmp_path), device="cpu")
    await model.register(backend)
    try:
        trainer = PipelineTrainer(model, backend, rollout_fn, [{"prompt": f"respond with yes or no ({i})"} for i in range(40)],
                                  None, eval_fn, num_rollout_workers=4, min_batch_size=2, max_batch_size=4,
                                  max_steps_off_policy=1, learning_rate=1e-3, max_steps=3, eval_every_n_steps=1)
        await trainer.train(handle_signals=False)
        assert await model.get_step() == 3
    finally:
        await backend.close()
    h = gw.load_history(model.store.run_dir)
    assert [r["step"] for r in rows(h, "train")] == [0, 1, 2]
    assert sorted(r["step"] for r in rows(h, "val")) == [0, 1, 2, 3]
    for r in rows(h, "train"):  # provenance: every trained token is at most one version old
        versions = [v for g in gw.load_trajectories(model.store.run_dir, "train", r["step"]) for t in g
                    for v in t.policy_versions()]
        assert versions and all(r["step"] - 1 <= v <= r["step"] for v in versions)


async def test_policy_version_0_is_a_version(tmp_path):
    """A trajectory without token provenance counts at its initial_policy_version; version 0 (the base) was
    read as "none" (``0 or step``), so the base's tokens trained at step k were logged 0 steps off-policy."""
    async def from_the_base(model, scenario, config):
        group = gw.TrajectoryGroup([
            gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, {"role": "assistant", "content": f"a{i}"}],
                          reward=float(i)) for i in range(2)])
        for t in group.trajectories:
            t.initial_policy_version = 0  # the rollout says which policy sampled it: the base
        return group

    model = gw.TrainableModel("zero", project="art", base_model="none", base_path=str(tmp_path))
    await model.register(ScriptedBackend())
    trainer = PipelineTrainer(model, model.backend, from_the_base, [{"i": i} for i in range(4)], None,
                              num_rollout_workers=1, min_batch_size=1, max_batch_size=1, max_steps_off_policy=3,
                              max_steps=4, eval_at_start=False)
    await trainer.train(handle_signals=False)
    h = gw.load_history(model.store.run_dir)
    assert [r["steps_off_policy"] for r in rows(h, "pipeline")] == [0, 1, 2, 3]
    assert trainer.discarded_stale_groups == 0


class CheckpointingBackend(ScriptedBackend):
    """The scripted backend, leaving a checkpoint folder (its state.json) per step as a real one does."""

    async def train(self, model, groups, config, *, cursor=None):
        import json

        from groupwise.runs.store import step_dir_name
        from groupwise.training.checkpoint import STATE_FILE

        result = await super().train(model, groups, config, cursor=cursor)
        folder = model.store.checkpoints_dir / step_dir_name(result.step)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / STATE_FILE).write_text(json.dumps({"step": result.step}))
        return result


async def test_arts_checkpoint_metrics_are_written_and_reach_the_retention_strategy(tmp_path):
    """groupwise.pipeline_trainer exports ART's checkpoint metric names (CHECKPOINT_SAVED_METRIC, ...), which
    ART writes into the history of each checkpoint's step; nothing wrote them, so a strategy keyed on them
    (keep the evaluated checkpoints) never saw one."""
    from groupwise.pipeline_trainer import (CHECKPOINT_CREATED_AT_METRIC, CHECKPOINT_EVAL_COMPLETED_METRIC,
                                            CHECKPOINT_SAVED_METRIC)

    async def rollout(model, scenario, config):
        version = await model.get_step()
        return gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"},
                                                                       sampled(f"a{i}", [version])], reward=float(i))
                                   for i in range(2)])

    async def evaluate(model, step, config):
        return [gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, sampled("a", [step])], reward=1.0)]

    seen: list[dict[int, dict[str, float]]] = []

    def strategy(context):
        seen.append({c.step: c.metrics for c in context.checkpoints})
        return {c.step for c in context.checkpoints}

    model = gw.TrainableModel("ckpt", project="art", base_model="none", base_path=str(tmp_path))
    await model.register(CheckpointingBackend())
    trainer = PipelineTrainer(model, model.backend, rollout, [{"i": i} for i in range(40)], None, eval_fn=evaluate,
                              num_rollout_workers=1, min_batch_size=1, max_batch_size=1, max_steps_off_policy=0,
                              max_steps=4, eval_every_n_steps=2, eval_at_start=False,
                              checkpoint_retention_strategy=strategy, checkpoint_retention_interval=1)
    await trainer.train(handle_signals=False)
    by_step = {r["step"]: r for r in rows(gw.load_history(model.store.run_dir), "checkpoint")}
    assert sorted(by_step) == [1, 2, 3, 4]
    assert all(r["saved"] == 1.0 and r["created_at_unix"] > 0 for r in by_step.values())
    assert [s for s, r in by_step.items() if r.get("eval_completed") == 1.0] == [2, 4]
    # a strategy sees them under ART's names (the checkpoints it may delete: all but the latest)
    last = seen[-1]
    assert sorted(last) == [1, 2, 3]
    assert last and all(m[CHECKPOINT_SAVED_METRIC] == 1.0 and CHECKPOINT_CREATED_AT_METRIC in m for m in last.values())
    assert CHECKPOINT_EVAL_COMPLETED_METRIC in last.get(2, {})


async def test_keep_recent_and_top_is_handed_to_the_backend_on_every_start(tmp_path):
    # the backend applies it after each step (and logs each prune: tests/loop/test_retention.py); the trainer
    # holds only what its rollouts and evaluations sample from, so the kept checkpoints are not kept loaded
    class Recording(ScriptedBackend):
        def __init__(self):
            super().__init__()
            self.retention, self.held = [], []

        async def set_retention(self, model, retention):
            self.retention.append(retention)

        async def hold_steps(self, model, steps):
            self.held.append(sorted(steps))

    calls = iter(range(1000))

    async def single(model, scenario, config):
        return gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                             reward=float(next(calls) % 2))

    model = gw.TrainableModel("kept", project="art", base_model="none", base_path=str(tmp_path))
    backend = Recording()
    await model.register(backend)
    strategy = keep_recent_and_top(recent=2, top=1, metric="val/reward")
    for max_steps in (2, 1):  # a run, then its resume
        trainer = PipelineTrainer(model, backend, make_group_rollout_fn(single, n=2), [{"i": i} for i in range(20)],
                                  None, num_rollout_workers=1, min_batch_size=1, max_batch_size=1,
                                  max_steps_off_policy=0, max_steps=max_steps, eval_at_start=False,
                                  checkpoint_retention_strategy=strategy)
        await trainer.train(handle_signals=False)
    assert backend.retention == [gw.CheckpointRetention(keep_recent=2, keep_top=1, metric="val/reward")] * 2
    assert await model.get_step() == 3
    assert backend.held and all(len(held) == 1 for held in backend.held)  # the current policy alone


def test_arguments_that_set_a_config_field_take_its_default_and_help():
    """ART's arguments that set a groupwise config field (`CONFIG_ARGUMENTS`): the signature's default is the
    field's unless ART's is kept for a stated reason, and the constructor's doc carries the field's help."""
    from groupwise.art.pipeline_trainer.trainer import CONFIG_ARGUMENTS
    from groupwise.core.validated import field_default, field_help

    params = inspect.signature(PipelineTrainer.__init__).parameters
    assert set(CONFIG_ARGUMENTS) == {"learning_rate", "loss_fn", "normalize_advantages", "max_steps_off_policy"}
    for name, (config, field, why) in CONFIG_ARGUMENTS.items():
        assert (params[name].default == field_default(config, field)) == (why is None), name
        assert f"{name}: {config.__name__}.{field}. {field_help(config, field)}" in PipelineTrainer.__init__.__doc__
    trainer = PipelineTrainer(None, None, lambda *a: None, [], None)
    assert trainer.train_config.learning_rate == field_default(gw.TrainConfig, "learning_rate")
    assert trainer.train_config.scale_rewards is field_default(gw.TrainConfig, "scale_rewards")
