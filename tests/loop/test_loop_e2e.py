"""End to end on a real (tiny, random) model with LocalBackend: a gameable reward is caught.

The task wants a one-line answer (validation: no newline in the answer). The reward pays for newlines
(the share of sampled tokens that are line breaks: padding, gameable). GRPO learns the reward, the
answers break into lines, validation falls: a critical validation alert fires (val_drop when the reward
had risen by the validation that shows the fall, val_unstable when not yet), the loop stops, and the
best checkpoint (by validation) is kept, served, and evaluated on the test split.

The tiny Llama's final norm is scaled x10 (tests/conftest.py's `peaked_tiny_model`) so its next-token distribution is peaked (entropy ~7 nats
instead of ~10.8, i.e. near uniform over 49k tokens): a random model's logits are so flat that GRPO
has no competing alternatives to learn from in a few steps (measured: no learning at lr 1e-2..2e-1).
Requests carry seeds and the engine is batch-invariant (inference/batch_invariance.py): which rollouts the engine happened
to batch together changes no logprob, hence no update, so two runs in one process are one run
(test_loop_reproducible.py). Not promised across processes on a loaded machine: 20 runs of this test
started at once on 16 cores agreed for two steps, then their train rewards parted (cause not found).

Measured on CPU (lr 1e-2, 4 groups x 16 rollouts): train reward 0.10 -> 0.30 by step 2, validation
(one-line answers) 0.72 (base) -> 0.44-0.50 (step 2). Before the engine was batch-invariant, runs
differed slightly: most saw the reward rise before validation fell (val_drop at step 4), one saw
validation fall first (val_unstable at step 2); with it, every run on one 2-core machine is the run
that stops on val_unstable (measured 2026-11-27). Either way the best checkpoint is the base (step 0)
and the test split runs against e2e@0. With 8 rollouts per group the exploit was learned later and
less reliably. Each run takes ~20 s on 2 quiet CPU cores.
"""

from __future__ import annotations

import itertools

import pytest

import groupwise as gw
from groupwise.runs.series import events, rows

pytest.importorskip("torch")
pytest.importorskip("peft")

SCENARIOS = [{"id": i, "q": f"Say something short about topic {i}."} for i in range(40)]


def make_rollout():
    seeds = itertools.count()

    async def rollout(model, scenario):
        messages = [{"role": "user", "content": scenario["q"]}]
        r = await model.openai_client().chat.completions.create(
            model=model.inference_name(), messages=messages, max_tokens=8, temperature=1.0, seed=next(seeds))
        choice = r.choices[0]
        text = choice.message.content or ""
        # newline share (the exploit) + a small length term (< 0.1): every group keeps some reward spread,
        # so a step where no rollout wrote a newline still trains instead of stalling the run
        reward = text.count("\n") / max(1, len(gw.choices.choice_token_ids(choice) or [1])) + len(text) / 1000
        traj = gw.Trajectory(messages_and_choices=[*messages, choice], reward=reward)
        traj.metadata["served_as"] = r.model
        return traj

    return rollout


def one_line(trajectory, scenario) -> float:
    return float("\n" not in (trajectory.messages()[-1]["content"] or ""))


@pytest.mark.slow
async def test_gamed_reward_on_a_tiny_model_raises_a_val_alert_stops_and_keeps_the_best_checkpoint(peaked_tiny_model, tmp_path, capsys):
    model = gw.TrainableModel("e2e", project="loop", base_model=peaked_tiny_model, base_path=str(tmp_path))
    backend = gw.LocalBackend(path=str(tmp_path), device="cpu", engine_kwargs={"batch_invariant": True})
    await model.register(backend)
    try:
        cfg = gw.LoopConfig(rollouts_per_group=16, groups_per_step=4, eval_every=2, max_steps=24, num_epochs=10,
                            learning_rate=1e-2, patience=100, val_rollouts_per_group=2, metric="one_line",
                            detectors=gw.DetectorConfig(val_drop=0.15, reward_rise=0.05),
                            score_train=False)  # the validation alerts alone (the rollout ones: test_loop_hack_slice.py)
        summary = await gw.fit(model, make_rollout(), SCENARIOS[:24], val_scenarios=SCENARIOS[24:40],
                               test_scenarios=SCENARIOS[24:32], validate=one_line, config=cfg)
    finally:
        await backend.close()
    h = gw.load_history(summary.run_dir)
    train = [r["reward"] for r in rows(h, "train")]
    val = {r["step"]: r["one_line"] for r in rows(h, "val")}
    with capsys.disabled():
        print(f"\n{summary}\ntrain reward: {[round(x, 3) for x in train]}\nval: {val}")

    # A critical validation alert stopped the run: validation fell beyond its noise. Which one depends on
    # whether the train reward had risen by the validation that showed the fall (val_drop: gaming) or
    # not yet (val_unstable, which asks to stop soon: a later val_drop may then stop the run first), a
    # race between two learning curves that the float sums decide; what holds on every machine is that
    # the run stopped on the last of these alerts, each critical and beyond its noise.
    assert summary.stop.rule in ("alert:val_drop", "alert:val_unstable"), summary
    fired = [a for a in summary.alerts if a.name in ("val_drop", "val_unstable")]
    assert fired and all(a.severity == "critical" for a in fired), fired
    assert summary.stop.rule == f"alert:{fired[-1].name}" and len({a.name for a in fired}) == len(fired), fired
    assert all(a.name == "val_unstable" for a in fired[:-1]), fired  # only a stop-soon alert comes before the stop
    ev = fired[-1].evidence
    # beyond the noise: 2 x 16 validation answers (Wilson intervals), 64 rollouts per train step
    assert ev["drop"] >= 0.15 and ev["drop"] > ev["noise"] > 0
    if fired[-1].name == "val_drop":
        assert ev["reward_now"] - ev["reward_then"] >= 0.05 and ev["reward_rise"] > ev["reward_noise"] > 0
    # each trained step's train time is split into its parts (the LocalBackend reports them), within it
    trained = [r for r in rows(h, "loop") if "time/update_s" in r]  # a step skipped for no signal has no update
    assert len(trained) >= len(rows(h, "loop")) - 1 > 0
    for r in trained:
        parts = [r["time/tokenize_s"], r["time/update_s"], r["time/publish_s"]]
        assert all(p > 0 for p in parts) and sum(parts) <= r["time/train_s"], r
        # and the publication in its parts: the checkpoint's copy, taken at the end of the update, then its
        # files written while the new adapter is served and checked
        snapshot, write, serve, check = (r[f"time/publish_{part}_s"] for part in ("snapshot", "write", "serve", "check"))
        assert min(snapshot, write, serve, check) > 0, r
        assert snapshot < r["time/update_s"] and max(write, serve + check) <= r["time/publish_s"], r
    # the gameable reward was learned, and validation really fell
    assert max(train) > train[0] + 0.05
    best_step = summary.best_step
    last_val = val[max(val)]  # the run may stop a step after its last validation
    assert val[best_step] == max(val.values()) and last_val <= val[best_step] - 0.15
    # the best checkpoint was kept (retention by val/one_line) and the test split ran against it
    if best_step > 0:
        assert (tmp_path / "loop" / "models" / "e2e" / "checkpoints" / f"{best_step:04d}" / "state.json").is_file()
    test_groups = gw.load_trajectories(summary.run_dir, "test", best_step)
    assert {t.metadata["served_as"] for g in test_groups for t in g} == {f"e2e@{best_step}"}
    assert summary.test is not None and "one_line" in summary.test
    assert [s["rule"] for s in events(h, "stop")] == [summary.stop.rule]

    # report and compare work on the real run
    from groupwise.cli import main

    assert main(["report", summary.run_dir]) == 0
    assert (tmp_path / "loop" / "models" / "e2e" / "report" / "curves.png").stat().st_size > 10_000
    assert main(["compare", summary.run_dir, "--steps", "0,latest", "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert f"val answers of step 0 (left) and step {max(val)} (right)" in out  # "latest": the last validated
