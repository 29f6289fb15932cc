"""The default policy is the seed's "when metrics diverge" table; every action is configurable."""

from loop_helpers import history

import groupwise as gw
from groupwise.loop.detectors import Alert
from groupwise.loop.policy import classify, decide, pending_stop

DROP = Alert("val_drop", "critical", 10, "val fell")
PLATEAU = Alert("val_plateau", "warning", 10, "val flat")
JUMP = Alert("reward_jump", "warning", 10, "jump")


def test_default_actions_follow_the_table():
    cfg = gw.LoopConfig()
    assert decide([], cfg).action == "continue"
    assert decide([JUMP], cfg).action == "warn"
    assert decide([PLATEAU, JUMP], cfg).action == "stop_soon"
    d = decide([JUMP, DROP], cfg)
    assert d.action == "stop" and d.reason.startswith("val_drop:") and len(d.alerts) == 2


def test_actions_are_configurable():
    assert decide([DROP], gw.LoopConfig(on_val_drop="warn")).action == "warn"
    assert decide([JUMP], gw.LoopConfig(on_reward_jump="stop")).action == "stop"
    d = decide([JUMP], gw.LoopConfig(on_reward_jump="ignore"))
    assert d.action == "continue" and d.alerts == ()


def test_stop_soon_waits_and_an_improvement_cancels_it():
    cfg = gw.LoopConfig(stop_soon_steps=5)
    h = history(train=[0.1 * s for s in range(16)], val={0: 0.3, 5: 0.6, 10: 0.6})
    h.append(PLATEAU.to_row("stop_soon"))
    assert not pending_stop(h, 14, cfg)  # 14 - 10 = 4 < 5
    d = pending_stop(h, 15, cfg)
    assert d.stop and d.rule == "alert:val_plateau" and d.evidence == {"alert": "val_plateau", "raised_at": 10}
    improved = h + [{"step": 15, "split": "val", "accuracy": 0.7}]
    assert not pending_stop(improved, 15, cfg)


def test_classify_rows_of_the_table():
    cfg = gw.LoopConfig()
    rising = [0.1 * s for s in range(11)]
    assert classify(history(train=rising, val={5: 0.5, 10: 0.7}), 10, cfg) == "healthy"
    assert classify(history(train=rising, val={5: 0.5, 10: 0.5}), 10, cfg) == "converged"
    assert classify(history(train=rising, val={5: 0.5, 10: 0.3}), 10, cfg) == "hacking"
    assert classify(history(train=rising), 10, cfg) == "unknown"
