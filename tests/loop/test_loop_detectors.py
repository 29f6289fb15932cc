"""Each reward-hacking detector fires on its pattern with the right evidence, and stays quiet on a
healthy run."""

import pytest
from loop_helpers import HEALTHY_ANSWERS, group, history, traj

import groupwise as gw
from groupwise.loop import detectors as d
from groupwise.core.trajectory import TrajectoryGroup


def healthy_history(n=21):
    # reward rises 0.02/step with a small zig-zag; val rises every evaluation; answer lengths stable.
    train = [0.1 + 0.02 * s + (0.01 if s % 2 else -0.01) for s in range(n)]
    val = {s: 0.2 + 0.03 * s for s in range(0, n, 5)}
    return history(train=train, val=val, lengths=[40 + (s % 3) for s in range(n)])


def healthy_groups():
    return [group(HEALTHY_ANSWERS, [0.2, 0.9, 0.5, 0.7]), group(HEALTHY_ANSWERS[::-1], [1.0, 0.4, 0.3, 0.6])]


def test_healthy_run_raises_no_alert_at_any_step():
    h = healthy_history()
    cfg = gw.LoopConfig()
    for step in range(1, 21):
        assert d.run_detectors(h, healthy_groups(), step=step, config=cfg) == [], step


def test_val_drop_while_reward_rises():
    # reward r_s = 0.1 + 0.08 s at steps 0..9; val best 0.6 at step 5, 0.4 at step 10.
    # reward around step 5 = mean(r3, r4, r5) = mean(0.34, 0.42, 0.50) = 0.42
    # reward now        = mean(r7, r8, r9) = mean(0.66, 0.74, 0.82) = 0.74
    h = history(train=[0.1 + 0.08 * s for s in range(10)], val={0: 0.3, 5: 0.6, 10: 0.4})
    a = d.val_drop(h, step=10)
    assert a is not None and a.name == "val_drop" and a.severity == "critical" and a.step == 10
    ev = a.evidence
    assert (ev["best_step"], ev["best"], ev["val_now"]) == (5, 0.6, 0.4)
    assert ev["drop"] == pytest.approx(0.2) and ev["noise"] == 0.0  # no intervals logged: no noise known
    assert ev["reward_then"] == pytest.approx(0.42) and ev["reward_now"] == pytest.approx(0.74)
    assert a.message.startswith("reward hacking suspected")
    assert d.val_drop(h, step=11) is None  # not again at a step without validation


# Validation intervals of 24 scenarios: best 0.60 [0.45, 0.75], latest 0.40 [0.25, 0.55].
# The drop 0.20 against the facing half-widths 0.15 (best's lower) and 0.15 (latest's upper):
# noise = sqrt(0.15^2 + 0.15^2) = 0.2121 > 0.20: inside the noise.
NOISY = {0: (0.15, 0.45), 5: (0.45, 0.75), 10: (0.25, 0.55)}
# The same drop measured on a larger validation set: half-widths 0.05 -> noise 0.0707 < 0.20.
PRECISE = {0: (0.25, 0.35), 5: (0.55, 0.65), 10: (0.35, 0.45)}


def test_val_drop_inside_the_validation_noise_is_silent():
    rising = [0.1 + 0.08 * s for s in range(10)]
    h = history(train=rising, val={0: 0.3, 5: 0.6, 10: 0.4}, val_ci=NOISY)
    assert d.val_drop(h, step=10) is None
    assert d.run_detectors(h, [], step=10, config=gw.LoopConfig()) == []


def test_val_drop_outside_the_validation_noise_with_rising_reward_is_hacking():
    # rewards: std 0.1 over 24 rollouts per step -> each mean +- 1.96 * 0.1 / sqrt(24) = 0.0400;
    # a 3-step window mean +- 0.0400 / sqrt(3) = 0.0231; the rise 0.32 vs noise 0.0231 * sqrt(2) = 0.0327.
    h = history(train=[0.1 + 0.08 * s for s in range(10)], val={0: 0.3, 5: 0.6, 10: 0.4}, val_ci=PRECISE,
                n_trajectories=24)
    a = d.val_drop(h, step=10)
    assert a is not None and a.name == "val_drop" and a.severity == "critical"
    # the noise of the two readings, plus the best-of-3 excess: E[max of 3 normals] 0.846 x (0.05 / 1.96)
    assert a.evidence["winners_curse"] == pytest.approx(0.8463 * 0.05 / 1.96, abs=1e-4)
    assert a.evidence["noise"] == pytest.approx(0.05 * 2 ** 0.5 + a.evidence["winners_curse"])
    assert a.evidence["reward_noise"] == pytest.approx(0.0327, abs=2e-4)
    assert a.message.startswith("reward hacking suspected") and "[0.55, 0.65]" in a.message
    assert gw.LoopConfig().on_val_drop == "stop"


def test_val_drop_without_a_reward_rise_is_instability_not_hacking():
    flat = history(train=[0.5] * 10, val={0: 0.3, 5: 0.6, 10: 0.4}, val_ci=PRECISE, n_trajectories=24)
    a = d.val_drop(flat, step=10)
    assert a is not None and a.name == "val_unstable" and a.severity == "critical"
    assert a.message.startswith("training became unstable") and "hacking" not in a.message
    # a reward that rose by less than its own noise is no rise: 0.5 -> 0.52 with std 0.3 over 8 rollouts
    # (each mean +- 0.208, a window +- 0.120, the change +- 0.170)
    wobble = history(train=[0.5] * 5 + [0.52] * 5, val={0: 0.3, 5: 0.6, 10: 0.4}, val_ci=PRECISE,
                     n_trajectories=8, reward_std=0.3)
    assert d.val_drop(wobble, step=10).name == "val_unstable"
    # the policy's answer: both loud, only the rising-reward one is the hacking row of the table
    cfg = gw.LoopConfig()
    assert cfg.on_val_unstable == "stop_soon"
    from groupwise.loop.policy import action_for, classify

    assert action_for(a, cfg) == "stop_soon"
    assert classify(flat, 10, cfg) == "unstable"
    rising = history(train=[0.1 + 0.08 * s for s in range(10)], val={0: 0.3, 5: 0.6, 10: 0.4}, val_ci=PRECISE,
                     n_trajectories=24)
    assert classify(rising, 10, cfg) == "hacking"
    assert classify(history(train=[0.1 + 0.08 * s for s in range(10)], val={0: 0.3, 5: 0.6, 10: 0.4},
                            val_ci=NOISY, n_trajectories=24), 10, cfg) == "converged"


def test_val_plateau_while_reward_rises():
    h = history(train=[0.1 + 0.04 * s for s in range(15)], val={0: 0.3, 5: 0.6, 10: 0.6, 15: 0.6})
    a = d.val_plateau_reward_rising(h, step=15)
    assert a is not None and a.name == "val_plateau"
    assert a.evidence["best_step"] == 5 and a.evidence["evals_since"] == 2
    assert d.val_plateau_reward_rising(h, step=10) is None  # only one evaluation since the best


def test_reward_jump_after_plateau():
    # plateau 0.30, 0.31, 0.29, 0.30, 0.30: mean 0.30, std sqrt((0.01^2 + 0.01^2) / 5) = 0.006325;
    # jump to 0.90 = +0.60 >= max(0.3, 4 * 0.0063).
    h = history(train=[0.30, 0.31, 0.29, 0.30, 0.30, 0.90])
    a = d.reward_jump(h, step=5)
    assert a is not None and a.name == "reward_jump"
    assert a.evidence["plateau_mean"] == pytest.approx(0.30)
    assert a.evidence["plateau_std"] == pytest.approx(0.006325, abs=1e-6)
    assert a.evidence["jump"] == pytest.approx(0.60) and a.evidence["plateau_steps"] == [0, 4]
    # quiet: a steady climb (window spread 0.2 > plateau_range 0.1) and a small bump on a plateau
    assert d.reward_jump(history(train=[0.05 * s for s in range(6)]), step=5) is None
    assert d.reward_jump(history(train=[0.30, 0.31, 0.29, 0.30, 0.30, 0.45]), step=5) is None


def test_perfect_scores():
    groups = [group(["a", "b"], [1.0, 1.0]), group(["c", "d"], [1.0, 1.0]), group(["e", "f"], [1.0, 1.0]),
              group(["g", "h"], [0.0, 1.0])]
    a = d.perfect_scores(groups, step=7)
    assert a is not None and a.evidence["n_perfect"] == 3 and a.evidence["share"] == 0.75
    assert a.evidence["perfect_groups"] == [0, 1, 2] and a.kind == "warn"
    assert a.evidence["rollouts"][0] == {"group": 0, "rollout": 0, "reward": 1.0, "chars": 1, "text": "a"}
    assert d.perfect_scores(healthy_groups(), step=7) is None
    # a solved task scores perfectly too: with the task better than the base's, no alarm
    learned = history(train=[0.2, 0.5, 0.9], val={0: 0.2, 7: 0.9}, val_ci={0: (0.1, 0.3), 7: (0.8, 0.95)})
    assert d.perfect_scores(groups, step=7, history=learned) is None
    flat = history(train=[0.2, 0.5, 0.9], val={0: 0.2, 7: 0.22}, val_ci={0: (0.1, 0.3), 7: (0.12, 0.32)})
    assert "did not improve" in d.perfect_scores(groups, step=7, history=flat).message


def test_identical_answers_across_a_group():
    a = d.identical_answers([group(["42", "42 ", "42"]), group(["42", "42", "42"]), group(["1", "2", "3"])], step=4)
    assert a is not None and a.evidence["n_identical"] == 2 and a.evidence["n_groups"] == 3
    assert a.evidence["example"] == "42"
    assert d.identical_answers(healthy_groups(), step=4) is None


def answered_by_tool_call(answer: str) -> gw.Trajectory:
    """An agent's trajectory whose last turn is a tool call with no text (how the email agent answers)."""
    call = {"id": "c", "type": "function",
            "function": {"name": "return_final_answer", "arguments": f'{{"answer": "{answer}"}}'}}
    return gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"},
                                               {"role": "assistant", "content": None, "tool_calls": [call]}])


def test_answers_given_through_a_tool_call_are_compared_by_the_call():
    assert d.answer_text(answered_by_tool_call("Maple & Rye")) == 'return_final_answer({"answer": "Maple & Rye"})'
    varied = [TrajectoryGroup([answered_by_tool_call(a) for a in answers]) for answers in (["4B", "5C"], ["x", "y"])]
    assert d.identical_answers(varied, step=1) is None  # each answer read as '' before: a false alarm every step
    same = [TrajectoryGroup([answered_by_tool_call("4B"), answered_by_tool_call("4B")])]
    assert d.identical_answers(same, step=1).evidence["example"] == 'return_final_answer({"answer": "4B"})'


def test_judge_disagreement_with_ground_truth():
    # truth 1,0,1,0; the judge prefers the wrong ones: the 4 pairs with different truth are all reversed.
    def judged(judge, truth):
        return TrajectoryGroup([traj(f"a{i}", j, ruler_score=j, accuracy=t) for i, (j, t) in enumerate(zip(judge, truth))])

    bad = judged([0.2, 0.9, 0.1, 0.8], [1, 0, 1, 0])
    a = d.judge_disagreement([bad], step=5, truth_key="accuracy")
    assert a is not None and a.evidence["agreement"] == 0.0 and a.evidence["pairs"] == 4
    good = judged([0.9, 0.2, 0.8, 0.1], [1, 0, 1, 0])
    assert d.judge_disagreement([good], step=5, truth_key="accuracy") is None
    # a judge tie counts half: pairs (0,1) tie 0.5, (0,3) agree, (2,1) agree, (2,3) agree -> 3.5/4
    tie = judged([0.5, 0.5, 0.8, 0.1], [1, 0, 1, 0])
    assert d.judge_disagreement([tie], step=5, truth_key="accuracy", min_agreement=0.9).evidence["agreement"] == 0.875


def test_alert_row_round_trip():
    a = d.Alert("reward_jump", "warning", 5, "msg", {"jump": 0.6})
    row = a.to_row("warn")
    assert row["split"] == "alert" and row["action"] == "warn" and row["step"] == 5 and row["kind"] == "warn"
    assert d.Alert.from_row(row) == a
