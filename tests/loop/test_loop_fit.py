"""gw.fit against a scripted backend (a Backend with no model): the loop's logic, fast.

The end-to-end run with a real tiny model and LocalBackend is in test_loop_e2e.py.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from loop_helpers import SCENARIOS, ScriptedBackend, make_rollout, run_scripted, steady_answer

import groupwise as gw
from groupwise.runs.series import events, rows
from groupwise.utils import iterate_dataset

HERE = Path(__file__).parent


async def test_healthy_run_validates_scores_baselines_and_stops_at_max_steps(tmp_path):
    summary, backend = await run_scripted(str(tmp_path))
    assert summary.stop.rule == "max_steps" and summary.final_step == 6 and summary.start_step == 0
    h = gw.load_history(summary.run_dir)
    # validation at step 0 (the base) and every eval_every=2 steps, metric = validate()
    assert [r["step"] for r in rows(h, "val")] == [0, 2, 4, 6]
    assert [r["accuracy"] for r in rows(h, "val")] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert [r["step"] for r in rows(h, "train")] == [0, 1, 2, 3, 4, 5]
    # rewards 0.1 * step (steady_answer)
    assert [r["reward"] for r in rows(h, "train")] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    base = events(h, "baseline")
    assert [(b["name"], b["kind"], b["accuracy"]) for b in base] == [("scripted@0", "base", 0.2)]
    assert summary.baselines == {"scripted@0": 0.2}
    stop = events(h, "stop")
    assert len(stop) == 1 and stop[0]["rule"] == "max_steps" and stop[0]["best_step"] == 6
    loop_rows = rows(h, "loop")
    assert len(loop_rows) == 6 and all("time/train_s" in r and r["judge/cost_usd"] == 0.0 for r in loop_rows)
    assert summary.alerts == [] and summary.best_step == 6 and summary.status == "healthy"
    # the backend hears the best step so far after each validation (0, 2, 4, 6) and at the end
    assert backend.kept_best == [0, 2, 4, 6, 6]
    # groups_per_step=2 scenarios per step, from the first 8 scenarios, each epoch a permutation
    assert all(len(s) == 2 for s in backend.trained_on)
    assert sorted(i for s in backend.trained_on[:4] for i in s) == list(range(8))


async def test_gamed_reward_raises_val_drop_stops_and_keeps_best(tmp_path):
    # The reward pays for length; after step 2 the policy pads its answer and loses the right number,
    # so val accuracy falls from 1.0 to 0.0 while the reward rises: the seed's "val down, reward up".
    def answer(step, scenario):
        if step <= 2:
            return f"answer {scenario['answer']}", 0.1 * step
        return "very long answer " * step, 0.1 * step + 0.5

    model = gw.TrainableModel("gamed", project="loop", base_model="none", base_path=str(tmp_path))
    backend = ScriptedBackend()
    await model.register(backend)
    seen_names = []
    answer_rollout = make_rollout(answer)

    async def rollout(m, scenario):
        seen_names.append(m.inference_name())
        return await answer_rollout(m, scenario)

    cfg = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, eval_every=2, max_steps=20, num_epochs=10)
    # four validation scenarios: on two, a fall from 2/2 to 0/2 is inside the noise of the two readings
    # plus the best-of-3 excess (val_drop's winner's curse); on four it is beyond it
    summary = await gw.fit(model, rollout, SCENARIOS[:6], val_scenarios=SCENARIOS[6:10],
                           test_scenarios=SCENARIOS[10:12],
                           validate=lambda t, s: float(t.messages()[-1]["content"] == f"answer {s['answer']}"),
                           baselines=[gw.Model("prompted", project="loop", inference_model_name="prompted-v1")],
                           config=cfg)
    # val 1.0 at steps 0, 2; 0.0 at step 4 -> the alert at step 4; best is the latest of equal bests,
    # step 2 (the checkpoint LocalBackend's retention keeps too)
    assert summary.stop.rule == "alert:val_drop" and summary.final_step == 4
    # the scripted answers are identical within a group (noted every step); the padding at step 3 is no
    # length or repetition warning: no group holds padded and plain answers both, so nothing shows that the
    # reward paid for the padding (the behaviour detectors' test), and the val drop is the alarm.
    names = [a.name for a in summary.alerts]
    assert names.count("identical_answers") == 4
    assert {a.name for a in summary.alerts if a.step >= 3} == {"val_drop", "identical_answers"}
    drop = [a for a in summary.alerts if a.name == "val_drop"]
    assert len(drop) == 1 and drop[0].step == 4
    ev = drop[0].evidence
    assert (ev["best_step"], ev["best"], ev["val_now"], ev["val_step"]) == (2, 1.0, 0.0, 4)
    # train reward around step 2: mean(0.0, 0.1, 0.2) = 0.1; now: mean(0.1, 0.2, 0.3 + 0.5) = 0.3667
    assert ev["reward_then"] == pytest.approx(0.1) and ev["reward_now"] == pytest.approx(1.1 / 3)
    assert summary.best_step == 2 and summary.best_value == 1.0 and summary.status == "hacking"
    assert backend.kept_best == [0, 2, 2, 2]  # after validations 0, 2, 4 and at the end
    # the test split ran once, against the best checkpoint
    assert seen_names[-2:] == ["gamed@2", "gamed@2"]
    # 2 of 2 right: the Wilson interval of 2/2 at 95% is [0.342, 1]
    assert summary.test == {"reward": pytest.approx(0.2, abs=1e-5), "accuracy": 1.0, "accuracy_lo": pytest.approx(0.3424, abs=1e-4),
                            "accuracy_hi": 1.0}
    h = gw.load_history(summary.run_dir)
    assert [r["step"] for r in rows(h, "test")] == [2]
    alert_rows = [r for r in events(h, "alert") if r["name"] == "val_drop"]
    assert len(alert_rows) == 1 and alert_rows[0]["action"] == "stop" and alert_rows[0]["evidence"]["drop"] == 1.0
    assert {r["action"] for r in events(h, "alert") if r["name"] != "val_drop"} == {"warn"}
    # the prompted baseline was scored once (the script answers it correctly: step -1 <= 2), and its
    # trajectories are stored for `groupwise inspect`
    assert summary.baselines == {"gamed@0": 1.0, "prompted": 1.0}
    assert len(gw.load_trajectories(summary.run_dir, "baseline-prompted", 0)) == 4
    assert "stopped (alert:val_drop)" in str(summary)


async def test_fit_rejects_bad_arguments_all_at_once(tmp_path):
    model = gw.TrainableModel("bad", project="loop", base_model="none", base_path=str(tmp_path))
    await model.register(ScriptedBackend())
    with pytest.raises(gw.ConfigError) as e:
        await gw.fit(model, "not a function", [], validate=lambda t: 1.0, baselines=[object()])
    assert len(e.value.problems) == 4


async def test_fit_takes_score_group_only(tmp_path):
    # reward= (score_group's former name) is gone: passing it is a TypeError, not a silent alias
    model = gw.TrainableModel("renamed", project="loop", base_model="none", base_path=str(tmp_path))
    await model.register(ScriptedBackend())
    with pytest.raises(TypeError, match="reward"):
        await gw.fit(model, make_rollout(steady_answer), SCENARIOS[:4], reward=lambda g: g,
                     config=gw.LoopConfig(max_steps=1))
    assert await model.get_step() == 0


def test_killed_run_resumes_at_the_same_step_and_data_position(tmp_path):
    crashed, clean = tmp_path / "crashed", tmp_path / "clean"
    log_crash, log_clean = tmp_path / "crash.log", tmp_path / "clean.log"
    # 1. a run SIGKILLed in the middle of step 3 (its first train rollout)
    proc = subprocess.run([sys.executable, str(HERE / "loop_helpers.py"), str(crashed), "3", str(log_crash)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert json.loads((crashed / "loop" / "models" / "scripted" / "state.json").read_text())["scripted_step"] == 3
    before = log_crash.read_text().splitlines()
    # 2. resume it here; 3. an uninterrupted run for reference
    import asyncio

    from groupwise.runs.history import RunHistory

    memory = RunHistory.of(crashed / "loop" / "models" / "scripted")  # the resumed run's, held to look at after it
    summary, _ = asyncio.run(run_scripted(str(crashed), log_path=log_crash))
    assert summary.start_step == 3 and summary.final_step == 6
    asyncio.run(run_scripted(str(clean), log_path=log_clean))
    # the crashed run's train rollouts, with the crash, equal the clean run's (step, scenario) sequence
    resumed = log_crash.read_text().splitlines()[len(before):]
    assert resumed[0].startswith("3 ")
    assert before + resumed == log_clean.read_text().splitlines()
    # and the data cursor is the deterministic one: step 3's scenarios are iterate_dataset's batch 3
    batch3 = next(iterate_dataset(list(range(8)), 2, 2, initial_step=3, seed=0, use_tqdm=False)).items
    assert sorted({int(line.split()[1]) for line in resumed if line.startswith("3 ")}) == sorted(batch3)
    h = gw.load_history(summary.run_dir)
    assert [r["step"] for r in rows(h, "train")] == [0, 1, 2, 3, 4, 5]
    assert [r["step"] for r in rows(h, "val")] == [0, 2, 4, 6]
    assert len(events(h, "baseline")) == 1  # the base is not scored twice
    assert memory.snapshot() == h and memory.loads == 1  # read once at the resume, then kept equal to the file


async def test_hybrid_run_judges_val_groups_and_flags_a_judge_that_disagrees_with_ground_truth(tmp_path):
    # Rollouts alternate right and wrong answers; the "judge" (score_group) prefers the wrong ones,
    # and records its cost. Validation groups of 2 are judged too, so the judge is checked against
    # ground truth: every pair (one per group of 2, 3 groups) is reversed -> agreement 0.
    flip = iter(range(10**6))

    def answer(step, scenario):
        right = next(flip) % 2 == 0
        return (f"answer {scenario['answer']}" if right else f"wrong {step} {scenario['id']}"), 0.0

    async def judge(group):
        for t in group.trajectories:
            score = 0.0 if t.messages()[-1]["content"].startswith("answer") else 1.0
            t.metrics["ruler_score"] = score
            t.reward = score
        group.metrics["judge/cost_usd"] = 0.25
        return group

    model = gw.TrainableModel("hybrid", project="loop", base_model="none", base_path=str(tmp_path))
    await model.register(ScriptedBackend())
    cfg = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, eval_every=1, max_steps=1,
                        val_rollouts_per_group=2, on_judge_disagreement="stop")
    summary = await gw.fit(model, make_rollout(answer), SCENARIOS[:4], val_scenarios=SCENARIOS[8:11],
                           score_group=judge,
                           validate=lambda t, s: float(t.messages()[-1]["content"] == f"answer {s['answer']}"),
                           config=cfg)
    assert summary.stop.rule == "alert:judge_disagreement" and summary.final_step == 1
    alert = [a for a in summary.alerts if a.name == "judge_disagreement"][0]
    assert alert.evidence["agreement"] == 0.0 and alert.evidence["pairs"] == 3
    h = gw.load_history(summary.run_dir)
    # judge cost tracked per step: 2 groups x $0.25
    assert [r["judge/cost_usd"] for r in rows(h, "loop")] == [0.5]
    val1 = [r for r in rows(h, "val") if r["step"] == 1][0]
    assert val1["accuracy"] == 0.5 and val1["ruler_score"] == 0.5  # judged val rows keep both


async def test_fit_runs_the_score_groups_before_training_hook_first(tmp_path):
    # A score_group's before_training() runs before the first validation and step (JudgeSelection's hook).
    calls = []

    class Scorer:
        async def before_training(self):
            calls.append("before")

        async def __call__(self, group):
            calls.append("score")
            return group

    model = gw.TrainableModel("hooked", project="loop", base_model="none", base_path=str(tmp_path))
    await model.register(ScriptedBackend())
    rollout = make_rollout(steady_answer)

    async def logged_rollout(m, scenario):
        calls.append("rollout")
        return await rollout(m, scenario)

    await gw.fit(model, logged_rollout, SCENARIOS[:4], score_group=Scorer(),
                 config=gw.LoopConfig(max_steps=1, groups_per_step=1, rollouts_per_group=2))
    assert calls[0] == "before" and calls.count("before") == 1 and {"rollout", "score"} <= set(calls[1:])


async def test_fit_refuses_to_train_when_no_candidate_judge_clears_the_bar(tmp_path):
    # Both candidate judges are unreachable (a closed port): every labelled group is judged as all ties,
    # accuracy 0.5, below the bar; fit raises with the table before training a step.
    labelled = [gw.LabelledGroup([[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": a}]
                                  for a in ("right", "wrong")], [1.0, 0.0]) for i in range(3)]
    dead = {"base_url": "http://127.0.0.1:9/v1", "api_key": "x", "retries": 0, "timeout_s": 5.0}
    selection = gw.JudgeSelection([gw.JudgeSpec("a", options=dead), gw.JudgeSpec("b", options=dead)], labelled,
                                  repeats=1)
    model = gw.TrainableModel("nojudge", project="loop", base_model="none", base_path=str(tmp_path))
    backend = ScriptedBackend()
    await model.register(backend)
    with pytest.raises(gw.JudgeSelectionError) as err:
        await gw.fit(model, make_rollout(steady_answer), SCENARIOS[:4], score_group=selection,
                     config=gw.LoopConfig(max_steps=2))
    assert backend.trained_on == [] and await model.get_step() == 0
    assert [r.accuracy[0] for r in err.value.reports] == [0.5, 0.5]
    assert all(r.failed_calls == r.calls == 6 for r in err.value.reports)
    assert "a " in err.value.table and "b " in err.value.table


def test_a_rollouts_scenario_seed_is_a_function_of_its_place_in_the_run():
    from pydantic import BaseModel

    from groupwise.loop.rollout_inputs import seeded_scenario

    class Question(BaseModel):
        text: str
        sampling_seed: int | None = None

    q = Question(text="2+2")
    seed = seeded_scenario(q, 7, 3, 1, 0).sampling_seed
    assert isinstance(seed, int) and seeded_scenario(q, 7, 3, 1, 0).sampling_seed == seed  # same place, same seed
    others = {seeded_scenario(q, *place).sampling_seed for place in
              [(8, 3, 1, 0), (7, 4, 1, 0), (7, 3, 2, 0), (7, 3, 1, 1), (7, 3, 1, 0, 1)]}
    assert seed not in others and len(others) == 5  # run seed, step, scenario, rollout, attempt each draw anew
    assert q.sampling_seed is None  # a copy: the caller's scenario is untouched
    fixed = Question(text="2+2", sampling_seed=5)
    assert seeded_scenario(fixed, 7, 3, 1, 0) is fixed and seeded_scenario("plain", 7, 3, 1, 0) == "plain"
