"""Steps whose groups all tie: 'solved' (tie at the top) stops the run as converged, with its summary;
'stuck' (tie below the top) is trained as ART does (the backend skips it). The rule is
groupwise.core.learning_signal's; the ART side (skip, bound, strict mode) is tests/art_compat/test_no_signal.py.
"""

from __future__ import annotations

import asyncio

import pytest
from loop_helpers import SCENARIOS, ScriptedBackend, make_rollout, policy_step, traj

import groupwise as gw
from groupwise.core.learning_signal import assess, loop_action, skip_action
from groupwise.runs.series import events, rows


def test_assess_tells_solved_from_stuck():
    # a group whose rewards differ: trainable, whatever the others do
    assert assess([[1.0, 1.0], [0.0, 1.2]]).kind == "trainable"
    # every group ties at the run's highest reward, and lower ones were seen: solved
    solved = assess([[1.2] * 4, [1.2] * 4], reward_range=(0.0, 1.2))
    assert solved.kind == "solved" and "scored 1.2" in solved.reason and "as low as 0" in solved.reason
    # the same tie with nothing lower ever seen says nothing about the top: stuck
    assert assess([[1.2] * 4, [1.2] * 4], reward_range=(1.2, 1.2)).kind == "stuck"
    assert assess([[1.2] * 4, [1.2] * 4]).kind == "stuck"
    # a tie below the best seen, or groups tied at different values: stuck
    assert assess([[0.2] * 4, [0.2] * 4], reward_range=(0.0, 1.2)).kind == "stuck"
    assert assess([[1.2] * 4, [0.0] * 4], reward_range=(0.0, 1.2)).kind == "stuck"
    # validation at its ceiling makes a one-value tie 'solved' even at the first step
    assert assess([[1.0] * 3], val_at_ceiling=True).kind == "solved"
    assert assess([[1.0] * 3, [0.0] * 3], val_at_ceiling=True).kind == "stuck"
    # rewards closer than the tolerance tie (judge float noise is not a signal)
    assert assess([[0.5, 0.5 + 1e-12]]).kind == "stuck"
    assert assess([]).kind == "empty"


def test_the_actions_of_the_loop_and_of_a_backend():
    trainable, solved, stuck = assess([[0.0, 1.0]]), assess([[1.0]], val_at_ceiling=True), assess([[0.0, 0.0]])
    assert [loop_action(s, 0, 2) for s in (trainable, solved, stuck)] == ["train", "resample", "resample"]
    assert [loop_action(s, 2, 2) for s in (trainable, solved, stuck)] == ["train", "converged", "train"]
    assert [skip_action(s, 1, 3) for s in (trainable, solved, stuck)] == ["train", "skip", "skip"]
    assert [skip_action(s, 3, 3) for s in (trainable, stuck)] == ["train", "raise"]
    assert skip_action(stuck, 0, 0) == "raise"


def learns_by_step(solved_from: int, top: float = 1.2):
    """Every other rollout of a scenario scores 0 before step `solved_from`, the rest `top`; from then
    on every rollout scores `top`."""
    seen: dict[tuple, int] = {}

    async def rollout(model, scenario):
        step = policy_step(model)
        key = (step, model.inference_name(), scenario["id"])
        seen[key] = seen.get(key, 0) + 1
        wrong = step < solved_from and seen[key] % 2 == 0
        await asyncio.sleep(0)
        return traj("wrong" if wrong else f"answer {scenario['answer']}", 0.0 if wrong else top,
                    question=scenario["q"])
    return rollout


async def test_a_solved_task_stops_as_converged_with_its_summary(tmp_path):
    model = gw.TrainableModel("solved", project="loop", base_model="none", base_path=str(tmp_path))
    backend = ScriptedBackend()
    await model.register(backend)
    cfg = gw.LoopConfig(rollouts_per_group=4, groups_per_step=2, max_steps=20, eval_every=5, num_epochs=10,
                        patience=100)
    summary = await gw.fit(model, learns_by_step(3), SCENARIOS[:8], config=cfg)
    # steps 0-2 trained; step 3 tied at 1.2 (the top: 0.0 was seen) in all 3 gatherings -> stop
    assert summary.stop.rule == "converged" and summary.final_step == 3 and len(backend.trained_on) == 3
    assert "every rollout of every group scored 1.2" in summary.stop_reason
    assert "stopped (converged)" in str(summary)
    h = gw.load_history(summary.run_dir)
    assert [(a["step"], a["action"]) for a in events(h, "alert") if a["name"] == "no_signal"] == [(3, "resample")] * 2
    stop = events(h, "stop")
    assert [(s["rule"], s["step"]) for s in stop] == [("converged", 3)]
    assert stop[0]["evidence"]["reward_range"] == [0.0, 1.2]


async def test_a_run_that_stops_between_validations_validates_its_last_checkpoint(tmp_path):
    # solved at step 3 while validation comes every 5 steps: the stop scores step 3, which is then the best
    # (the base, scored at step 0, answers wrong half the time); the test runs on it, not on the base
    model = gw.TrainableModel("solved-early", project="loop", base_model="none", base_path=str(tmp_path))
    await model.register(ScriptedBackend())
    cfg = gw.LoopConfig(rollouts_per_group=4, groups_per_step=2, max_steps=20, eval_every=5, num_epochs=10,
                        patience=100)
    right = lambda t, s: float(s["answer"] in (t.messages_and_choices[-1]["content"] or ""))  # noqa: E731
    summary = await gw.fit(model, learns_by_step(3), SCENARIOS[:8], val_scenarios=SCENARIOS[8:11],
                           test_scenarios=SCENARIOS[11:13], validate=right, config=cfg)
    assert summary.stop.rule == "converged" and summary.final_step == 3
    h = gw.load_history(summary.run_dir)
    assert [r["step"] for r in h if r["split"] == "val"] == [0, 3]
    assert summary.best_step == 3 and summary.best_value == 1.0 and summary.test is not None
    stop = events(h, "stop")
    assert stop[0]["best_step"] == 3


async def test_a_task_solved_at_the_base_stops_when_validation_is_at_its_ceiling(tmp_path):
    model = gw.TrainableModel("easy", project="loop", base_model="none", base_path=str(tmp_path))
    backend = ScriptedBackend()
    await model.register(backend)
    cfg = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, max_steps=5, eval_every=5, resample_no_signal=1)
    summary = await gw.fit(model, learns_by_step(0, top=1.0), SCENARIOS[:8], val_scenarios=SCENARIOS[8:11],
                           validate=lambda t, s: 1.0, config=cfg)
    assert summary.stop.rule == "converged" and summary.final_step == 0 and backend.trained_on == []
    assert summary.best_step == 0 and summary.best_value == 1.0
    assert "validation is at its ceiling" in summary.stop_reason
    # validated by the reward itself (no validate): a reward of 1.0 need not be its maximum, so no stop
    model = gw.TrainableModel("easy-reward", project="loop", base_model="none", base_path=str(tmp_path))
    backend = ScriptedBackend()
    await model.register(backend)
    summary = await gw.fit(model, learns_by_step(0, top=1.0), SCENARIOS[:8], val_scenarios=SCENARIOS[8:11],
                           config=cfg)
    assert summary.stop.rule == "data_exhausted" and len(backend.trained_on) == 4  # every step trained


async def test_a_tie_below_the_top_is_trained_not_stopped_on(tmp_path):
    # step 0 ties at 1.2 with nothing lower seen yet, step 1 at 0.0 below the 1.2 of step 0: both stuck,
    # so after its resample each goes to the backend (a real one skips it as ART does; this one counts it)
    def answer(step, scenario):
        return f"answer {scenario['answer']}", 1.2 if step == 0 else 0.0

    model = gw.TrainableModel("stuck", project="loop", base_model="none", base_path=str(tmp_path))
    backend = ScriptedBackend()
    await model.register(backend)
    cfg = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, max_steps=2, resample_no_signal=1)
    summary = await gw.fit(model, make_rollout(answer, spread=0.0), SCENARIOS[:8], config=cfg)
    assert summary.stop.rule == "max_steps" and len(backend.trained_on) == 2
    h = gw.load_history(summary.run_dir)
    resampled = [a for a in events(h, "alert") if a["name"] == "no_signal"]
    assert [(a["step"], a["evidence"]["kind"]) for a in resampled] == [(0, "stuck"), (1, "stuck")]
    assert [r["step"] for r in rows(h, "train")] == [0, 1]


@pytest.mark.parametrize("resamples", [0, 2])
async def test_no_probe_config_reaches_the_backend(tmp_path, resamples):
    # the loop decides no-signal itself: every train call carries the run's own TrainConfig
    configs = []

    class Recording(ScriptedBackend):
        async def train(self, model, groups, config, *, cursor=None):
            configs.append(config)
            return await super().train(model, groups, config, cursor=cursor)

    def answer(step, scenario):
        return f"answer {scenario['answer']}", 0.0

    model = gw.TrainableModel("probe", project="loop", base_model="none", base_path=str(tmp_path))
    await model.register(Recording())
    cfg = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, max_steps=2, resample_no_signal=resamples,
                        train_config=gw.TrainConfig(max_skipped_steps=5))
    await gw.fit(model, make_rollout(answer, spread=0.0), SCENARIOS[:8], config=cfg)
    assert [c.max_skipped_steps for c in configs] == [5, 5]


def test_the_backend_decision_is_a_value_with_its_words():
    # the backend acts on step_verdict: it holds no rule or wording of its own
    from groupwise.core.learning_signal import step_verdict

    assert step_verdict([[0.0, 1.0]], step=4, skipped_in_a_row=2, max_skipped_steps=3).action == "train"
    skip = step_verdict([[1.0, 1.0], [0.5, 0.5]], step=4, skipped_in_a_row=1, max_skipped_steps=3)
    assert (skip.action, skip.skipped_in_a_row) == ("skip", 2)
    assert skip.message.startswith("step 4 skipped: no learning signal: in every one of the 2 group(s)")
    assert "2 of at most 3 consecutive skipped step(s)" in skip.message
    row = skip.alert_row(4)
    assert (row["split"], row["name"], row["action"], row["evidence"]) == (
        "alert", "no_signal", "skip", {"rewards": [[1.0, 1.0], [0.5, 0.5]], "skipped_in_a_row": 2})
    stop = step_verdict([[1.0, 1.0]], step=9, skipped_in_a_row=3, max_skipped_steps=3)
    assert stop.action == "raise" and "3 step(s) in a row were already skipped" in stop.message
    assert "TrainConfig.max_skipped_steps=3 allows no more" in stop.message
