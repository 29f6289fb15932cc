"""Each reward-hacking detector fires on its pattern with the right evidence, and stays quiet on a
healthy run."""

import pytest
from loop_helpers import HEALTHY_ANSWERS, group, history, traj

import groupwise as gw
from groupwise.loop import detectors as d
from groupwise.types import TrajectoryGroup


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
    a = d.val_drop_reward_rise(h, step=10)
    assert a is not None and a.name == "val_drop" and a.severity == "critical" and a.step == 10
    ev = a.evidence
    assert (ev["best_step"], ev["best"], ev["val_now"]) == (5, 0.6, 0.4)
    assert ev["drop"] == pytest.approx(0.2)
    assert ev["reward_then"] == pytest.approx(0.42) and ev["reward_now"] == pytest.approx(0.74)
    assert "reward hacking" in a.message
    # quiet: same val drop but flat reward (not hacking), and not again at a step without validation
    assert d.val_drop_reward_rise(history(train=[0.5] * 10, val={0: 0.3, 5: 0.6, 10: 0.4}), step=10) is None
    assert d.val_drop_reward_rise(h, step=11) is None


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
    assert a.evidence["perfect_groups"] == [0, 1, 2]
    assert d.perfect_scores(healthy_groups(), step=7) is None


def test_ngram_repetition():
    # 10 words -> 8 trigrams, 2 distinct ("buy now buy", "now buy now"): repetition 1 - 2/8 = 0.75
    spam = "buy now buy now buy now buy now buy now"
    a = d.ngram_repetition([group([spam, spam])], step=3)
    assert a is not None and a.name == "repetition" and a.evidence["mean_repetition"] == pytest.approx(0.75)
    assert a.evidence["example"] == spam
    assert d.ngram_repetition(healthy_groups(), step=3) is None


def test_identical_answers_across_a_group():
    a = d.identical_answers([group(["42", "42 ", "42"]), group(["42", "42", "42"]), group(["1", "2", "3"])], step=4)
    assert a is not None and a.evidence["n_identical"] == 2 and a.evidence["n_groups"] == 3
    assert a.evidence["example"] == "42"
    assert d.identical_answers(healthy_groups(), step=4) is None


def test_length_drift():
    # first 3 steps 20, 22, 21 chars (mean 21); last 3: 60, 62, 64 (mean 62) -> 62 / 21 = 2.952
    h = history(train=[0.5] * 8, lengths=[20, 22, 21, 30, 45, 60, 62, 64])
    a = d.length_drift(h, step=7)
    assert a is not None and a.evidence["factor"] == pytest.approx(62 / 21)
    assert a.evidence["reference"] == pytest.approx(21) and a.evidence["now"] == pytest.approx(62)
    assert d.length_drift(history(train=[0.5] * 8, lengths=[20, 22, 21, 25, 24, 26, 23, 22]), step=7) is None


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
    assert row["split"] == "alert" and row["action"] == "warn" and row["step"] == 5
    assert d.Alert.from_row(row) == a
