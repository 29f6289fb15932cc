"""Stopping rules on synthetic histories: plateau, target, baseline, max steps (and LoopConfig)."""

import pytest
from loop_helpers import history

import groupwise as gw
from groupwise.loop.stopping import baseline_beaten, check_stopping, max_steps_reached, plateau, target_reached


def test_plateau_on_validation_fires_after_patience_steps_without_improvement():
    # val: 0.2 -> 0.5 at step 5 (+0.3), then 0.5 (+0), 0.51 (+0.01 <= min_delta 0.02): last improvement
    # is step 5, so at step 15 the run has waited 15 - 5 = 10 = patience steps.
    h = history(train=[0.1 * s for s in range(16)], val={0: 0.2, 5: 0.5, 10: 0.5, 15: 0.51})
    d = plateau(h, step=15, patience=10, min_delta=0.02)
    assert d.stop and d.rule == "plateau"
    assert d.evidence == {"curve": "val/accuracy", "best_step": 5, "best": 0.5, "latest": 0.51, "waited": 10}
    assert "val/accuracy plateaued" in d.reason and "best 0.5 at step 5" in d.reason
    assert not plateau(h, step=14, patience=10, min_delta=0.02)  # waited 9
    assert not plateau(h, step=15, patience=10, min_delta=0.005)  # 0.51 counts: waited 0


def test_plateau_without_validation_watches_mean_train_reward():
    # rewards rise to 0.6 at step 3 then stay within 0.01: last improvement at step 3; 13 - 3 = 10.
    rewards = [0.0, 0.2, 0.4, 0.6] + [0.6, 0.61, 0.6, 0.59, 0.6, 0.61, 0.6, 0.6, 0.6, 0.6]
    h = history(train=rewards)
    d = plateau(h, step=13, patience=10, min_delta=0.05)
    assert d.stop and d.evidence["curve"] == "train/reward" and d.evidence["best_step"] == 3
    assert not plateau(history(train=[0.05 * s for s in range(20)]), step=19, patience=10, min_delta=0.01)


def test_plateau_lower_is_better():
    # an error rate falling 0.5 -> 0.3 (step 5), then flat: waited 10 at step 15.
    h = history(train=[0.0] * 16, val={0: 0.5, 5: 0.3, 10: 0.31, 15: 0.3}, metric="error")
    assert plateau(h, step=15, patience=10, metric="error", higher_is_better=False).evidence["best_step"] == 5


def test_target_reached():
    h = history(train=[0.5] * 11, val={0: 0.4, 5: 0.9, 10: 0.96})
    d = target_reached(h, step=10, target=0.95)
    assert d.stop and d.rule == "target" and d.evidence["value"] == 0.96 and d.evidence["at_step"] == 10
    assert not target_reached(h, step=9, target=0.95)  # latest val at step <= 9 is 0.9
    assert not target_reached(h, step=10, target=None)
    # without validation: mean train reward
    assert target_reached(history(train=[0.2, 0.8]), step=1, target=0.8).evidence["curve"] == "train/reward"


def test_baseline_beaten_by_margin():
    # best baseline o3 = 0.90 (the base model 0.41 is lower); 0.96 - 0.90 = 0.06
    h = history(train=[0.5] * 11, val={0: 0.41, 10: 0.96}, baselines={"o3": 0.90, "agent@0": 0.41})
    d = baseline_beaten(h, step=10, margin=0.05)
    assert d.stop and d.rule == "baseline"
    assert d.evidence == {"value": 0.96, "baseline": "o3", "baseline_value": 0.90, "margin": 0.05, "noise": 0.0}
    assert baseline_beaten(h, step=10, margin=0.06).stop  # inclusive: 0.96 >= 0.90 + 0.06
    assert not baseline_beaten(h, step=10, margin=0.07)
    assert not baseline_beaten(h, step=10, margin=None)
    assert not baseline_beaten(history(train=[0.5], val={0: 0.99}), step=0, margin=0.0)  # no baselines


def test_stopping_rules_count_only_changes_larger_than_the_noise():
    # plateau: 0.50 [0.40, 0.60] at step 5, 0.58 [0.48, 0.68] at step 10: +0.08 against the facing
    # half-widths 0.10 and 0.10 (noise 0.141): no improvement, so the run has waited since step 5.
    ci = {0: (0.1, 0.3), 5: (0.4, 0.6), 10: (0.48, 0.68), 15: (0.48, 0.68)}
    h = history(train=[0.0] * 16, val={0: 0.2, 5: 0.5, 10: 0.58, 15: 0.58}, val_ci=ci)
    d = plateau(h, step=15, patience=10)
    assert d.stop and d.evidence["best_step"] == 5 and "than its noise" in d.reason
    # the same values without intervals: 0.58 is an improvement, waited only 5
    assert not plateau(history(train=[0.0] * 16, val={0: 0.2, 5: 0.5, 10: 0.58, 15: 0.58}), step=15, patience=10)
    # baseline: 0.96 [0.90, 1.0] beats 0.90 [0.84, 0.96] by the margin 0.05 but not by the noise (0.085)
    noisy = history(train=[0.5] * 11, val={0: 0.41, 10: 0.96}, baselines={"o3": 0.90}, val_ci={10: (0.90, 1.0)})
    noisy[-1].update(accuracy_lo=0.84, accuracy_hi=0.96)
    assert not baseline_beaten(noisy, step=10, margin=0.05)


def test_max_steps():
    assert max_steps_reached(step=20, max_steps=20).reason == "reached max_steps=20 (step 20)"
    assert not max_steps_reached(step=19, max_steps=20)
    assert not max_steps_reached(step=10**6, max_steps=None)


def test_check_stopping_order_and_continue():
    h = history(train=[0.1 * s for s in range(11)], val={0: 0.2, 5: 0.5, 10: 0.97}, baselines={"o3": 0.9})
    cfg = gw.LoopConfig(max_steps=10, target=0.95, baseline_margin=0.05)
    assert check_stopping(h, 10, cfg).rule == "max_steps"
    assert check_stopping(h, 10, gw.LoopConfig(target=0.95, baseline_margin=0.05)).rule == "target"
    assert check_stopping(h, 10, gw.LoopConfig(baseline_margin=0.05)).rule == "baseline"
    assert not check_stopping(h, 10, gw.LoopConfig())


def test_loop_config_reports_every_problem_at_once():
    with pytest.raises(gw.ConfigError) as e:
        gw.LoopConfig(rollouts_per_group=0, eval_every=0, patience=0, on_val_drop="explode",
                      on_val_unstable="panic", confidence=1.0, metric="reward", max_exceptions=-1)
    assert len(e.value.problems) == 8
    text = str(e.value)
    for needle in ("rollouts_per_group=0", "eval_every=0", "patience=0", "on_val_drop='explode'",
                   "on_val_unstable='panic'", "confidence=1.0", "metric='reward'", "max_exceptions=-1"):
        assert needle in text
    with pytest.raises(gw.ConfigError) as e:
        gw.DetectorConfig(perfect_share=1.5, shift_excess=1.5, reward_window=0)
    assert len(e.value.problems) == 3 and "perfect_share=1.5" in str(e.value)


def test_loop_config_seed_defaults_and_help():
    c = gw.LoopConfig()
    assert (c.rollouts_per_group, c.eval_every, c.patience) == (18, 5, 10)
    assert c.on_val_drop == "stop" and c.on_reward_jump == "warn"
    assert c.learning_rate is None and c.step_config() == gw.TrainConfig()  # the TrainConfig owns the rate
    import dataclasses
    assert all(f.metadata.get("help") for f in dataclasses.fields(gw.LoopConfig))
    assert all(f.metadata.get("help") for f in dataclasses.fields(gw.DetectorConfig))
    assert c.detectors == gw.DetectorConfig() and c.detectors is not gw.LoopConfig().detectors


def test_the_train_config_owns_the_learning_rate():
    # a TrainConfig's own rate is used, not replaced by a LoopConfig default
    assert gw.LoopConfig(train_config=gw.TrainConfig(learning_rate=1e-3)).step_config().learning_rate == 1e-3
    # LoopConfig.learning_rate is a shorthand where the TrainConfig's is left at its default
    assert gw.LoopConfig(learning_rate=5e-4).step_config() == gw.TrainConfig(learning_rate=5e-4)
    short = gw.LoopConfig(learning_rate=5e-4, train_config=gw.TrainConfig(micro_batch_tokens=512))
    assert short.step_config() == gw.TrainConfig(learning_rate=5e-4, micro_batch_tokens=512)
    assert gw.LoopConfig(learning_rate=1e-3, train_config=gw.TrainConfig(learning_rate=1e-3)).step_config().learning_rate == 1e-3
    # both set, to different values: an error naming both, never a silent override
    with pytest.raises(gw.GroupwiseError, match=r"learning_rate=0.0005 and train_config.learning_rate=0.001 disagree"):
        gw.LoopConfig(learning_rate=5e-4, train_config=gw.TrainConfig(learning_rate=1e-3))
    later = gw.LoopConfig(train_config=gw.TrainConfig(learning_rate=1e-3))
    later.learning_rate = 5e-4  # set after construction: step_config still refuses
    with pytest.raises(gw.ConfigError, match="disagree"):
        later.step_config()


def test_loop_package_imports_no_torch_and_no_matplotlib():
    import subprocess
    import sys

    code = ("import sys, groupwise as gw, groupwise.loop; gw.fit; gw.FitSummary; "
            "print('torch' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
