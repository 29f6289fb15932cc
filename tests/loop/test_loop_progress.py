"""The per-step line a person watching a run reads: reward with its noise, seconds by phase, validation
with its interval, ETA."""

import logging

from loop_helpers import SCENARIOS, ScriptedBackend, make_rollout

import groupwise as gw
from groupwise.loop.progress import duration, eta_seconds, step_line


def test_duration_and_eta():
    assert [duration(s) for s in (0.4, 42, 250, 3725)] == ["0s", "42s", "4m10s", "1h02m"]
    # 3 steps done in 120 s since step 0: 40 s a step, 5 left, plus a 30 s test
    assert eta_seconds(step=3, start_step=0, max_steps=8, elapsed_s=120, test_s=30) == 230
    # a resumed run counts only its own steps: 2 steps (4 -> 6) in 100 s
    assert eta_seconds(step=6, start_step=4, max_steps=8, elapsed_s=100) == 100
    assert eta_seconds(step=3, start_step=0, max_steps=None, elapsed_s=120) is None


def test_step_line_reads_the_history():
    history = [
        {"step": 3, "split": "train", "reward": -0.5, "reward_std": 0.4, "n_trajectories": 24,
         "valid_move_rate": 0.4},
        {"step": 3, "split": "loop", "time/gather_s": 25.2, "time/reward_s": 0.0, "time/train_s": 251.0},
        {"step": 4, "split": "val", "valid_move_rate": 0.469, "valid_move_rate_lo": 0.33,
         "valid_move_rate_hi": 0.608},
    ]
    line = step_line(history, 4, metric="valid_move_rate", max_steps=8, eta_s=185, best=(4, 0.469))
    # the noise of the mean reward: 1.96 * 0.4 / sqrt(24) = 0.160
    assert line == ("step 4/8 · reward -0.500 ± 0.160 · valid_move_rate 0.400 · rollouts 25s, judge 0s, "
                    "update 4m11s · val valid_move_rate 0.469 [0.330, 0.608] (best 0.469 @4) · ETA 3m05s")
    # a step without validation has no val part
    assert "· val " not in step_line(history[:2], 4, metric="valid_move_rate", max_steps=8, eta_s=None)


async def test_fit_logs_one_line_per_step_and_the_stop_once(tmp_path, caplog):
    model = gw.TrainableModel("lines", project="loop", base_model="none", base_path=str(tmp_path))
    await model.register(ScriptedBackend())
    rollout = make_rollout(lambda step, s: (f"answer {s['answer']}", 0.1 * step))
    cfg = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, eval_every=2, max_steps=4, patience=100)
    with caplog.at_level(logging.INFO, logger="groupwise.loop"):
        await gw.fit(model, rollout, SCENARIOS[:8], val_scenarios=SCENARIOS[8:11],
                     validate=lambda t, s: float(t.messages()[-1]["content"] == f"answer {s['answer']}"), config=cfg)
    lines = [r.getMessage() for r in caplog.records if r.name == "groupwise.loop"]
    steps = [m for m in lines if m.startswith("step ") and " · " in m]
    assert [m.split(" · ")[0] for m in steps] == ["step 1/4", "step 2/4", "step 3/4", "step 4/4"]
    assert all("ETA" in m for m in steps)
    # validations at steps 2 and 4 show their interval (3 of 3 right: Wilson [0.439, 1])
    assert "val accuracy 1.000 [0.439, 1.000]" in steps[1] and "val accuracy" not in steps[0]
    assert sum("stopped at step 4" in m for m in lines) == 1
    # every group answers identically at every step: recorded each step, printed once
    h = gw.load_history(model.run_dir)
    assert len([r for r in h if r.get("split") == "alert" and r["name"] == "identical_answers"]) == 4
    assert sum("identical_answers" in m for m in lines) == 1


async def test_a_stop_by_an_alert_prints_the_alert_message_once(tmp_path, caplog):
    # validation falls while the reward rises from step 3: val_drop stops the run; its message is logged
    # when raised, and the stop line names the alert instead of repeating it.
    def gamed(step, scenario):
        if step <= 2:
            return f"answer {scenario['answer']}", 0.1 * step
        return "pad " * (5 * step), 0.1 * step + 0.5

    model = gw.TrainableModel("gamed", project="loop", base_model="none", base_path=str(tmp_path))
    await model.register(ScriptedBackend())
    cfg = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, eval_every=2, max_steps=20, num_epochs=10)
    with caplog.at_level(logging.INFO, logger="groupwise.loop"):
        # eight validation prompts: a fall from all right to all wrong is beyond val_drop's noise band (three
        # were inside it once the band grew by the winner's-curse correction)
        val = [{"id": 100 + i, "q": f"question {100 + i}", "answer": str(100 + i)} for i in range(8)]
        summary = await gw.fit(model, make_rollout(gamed), SCENARIOS[:8], val_scenarios=val,
                               validate=lambda t, s: float(t.messages()[-1]["content"] == f"answer {s['answer']}"),
                               config=cfg)
    assert summary.stop.rule == "alert:val_drop"
    message = summary.stop.reason.split(": ", 1)[1]
    lines = [r.getMessage() for r in caplog.records if r.name == "groupwise.loop"]
    assert sum(message in m for m in lines) == 1
    stop = [m for m in lines if m.startswith("stopped at step")]
    assert len(stop) == 1 and "the val_drop alert above" in stop[0]
