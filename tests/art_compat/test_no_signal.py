"""Steps whose groups all tie: skipped with a warning and a record, as ART does; bounded; strict mode;
and gw.fit's resampling before it skips, with step and data cursor in lockstep."""

from __future__ import annotations

import pytest

import groupwise as gw
from groupwise.runs.series import events, rows


async def _tied_groups(model, n_groups=2, reward=1.0):
    client = model.openai_client()
    groups = []
    for g in range(n_groups):
        trajs = []
        for i in range(3):
            messages = [{"role": "user", "content": f"s{g}"}]
            r = await client.chat.completions.create(model=model.inference_name(), messages=messages, max_tokens=3, seed=i)
            trajs.append(gw.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=reward))
        groups.append(gw.TrajectoryGroup(trajs))
    return groups


async def test_consecutive_skips_are_bounded_and_strict_mode_raises_at_once(tiny_model_dir, tmp_path, caplog):
    model = gw.TrainableModel(name="tie", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        with pytest.raises(gw.NotTrainableError, match="max_skipped_steps=0"):  # strict: at once, no step made
            await model.train(await _tied_groups(model), config=gw.TrainConfig(max_skipped_steps=0))
        assert await model.get_step() == 0
        config = gw.TrainConfig(max_skipped_steps=2)
        for expected in (1, 2):
            result = await model.train(await _tied_groups(model), config=config)
            assert result.step == expected and result.metrics["skipped"] == 1.0
            assert result.metrics["skipped_in_a_row"] == expected
        # the skipped steps serve the unchanged adapter under their new numbers
        answer = await model.openai_client().chat.completions.create(
            model="tie", messages=[{"role": "user", "content": "x"}], max_tokens=1)
        assert answer.model == "tie@2"
        with pytest.raises(gw.NotTrainableError, match="2 step\\(s\\) in a row were already skipped"):
            await model.train(await _tied_groups(model), config=config)
        assert await model.get_step() == 2
        # the counter survives a restart (it is saved with the checkpoint)
        await backend.close()  # one writer per run folder: the restarted backend takes over
        again = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
        clone = gw.TrainableModel(name="tie", project="p", base_model=tiny_model_dir)
        await clone.register(again)
        with pytest.raises(gw.NotTrainableError):
            await clone.train(await _tied_groups(clone), config=config)
        await again.close()
    finally:
        await backend.close()
    h = gw.load_history(tmp_path / "p" / "models" / "tie")
    assert [(a["step"], a["action"]) for a in events(h, "alert")] == [(0, "skip"), (1, "skip")]
    assert "every one of the 2 group(s) all rewards are equal (group 0: [1.0, 1.0, 1.0]" in events(h, "alert")[0]["message"]
    assert [r["skipped"] for r in rows(h, "train")] == [1.0, 1.0]


async def test_fit_resamples_then_skips_keeping_step_and_data_cursor_in_lockstep(tiny_model_dir, tmp_path):
    model = gw.TrainableModel(name="fit", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    seen: list[tuple[int, int]] = []

    async def rollout(m, scenario):
        step = await m.get_step()
        seen.append((step, scenario))
        messages = [{"role": "user", "content": f"scenario {scenario}"}]
        r = await m.openai_client().chat.completions.create(model=m.inference_name(), messages=messages, max_tokens=3)
        content = r.choices[0].message.content or ""
        reward = 0.0 if step == 1 else float(len(content) % 3)  # step 1 never has a signal
        return gw.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=reward)

    config = gw.LoopConfig(rollouts_per_group=3, groups_per_step=1, max_steps=3, eval_every=100,
                           resample_no_signal=1, patience=10)
    try:
        summary = await gw.fit(model, rollout, list(range(6)), config=config)
    finally:
        await backend.close()
    assert summary.final_step == 3
    h = gw.load_history(summary.run_dir)
    assert [(r["step"], r["skipped"]) for r in rows(h, "train")] == [(0, 0.0), (1, 1.0), (2, 0.0)]
    alerts = [(a["step"], a["action"]) for a in events(h, "alert") if a["name"] == "no_signal"]
    assert alerts == [(1, "resample"), (1, "skip")]  # gathered again once, then skipped
    # each step trained on iterate_dataset's batch of that step (the skipped one included)
    batches = [b.items for b in gw.iterate_dataset(list(range(6)), 1, use_tqdm=False)]
    assert [r["scenarios"] for r in rows(h, "loop")] == batches[:3]
    assert {s for step, s in seen if step == 1} == set(batches[1])


async def test_fit_on_a_solved_task_stops_as_converged_with_its_summary_and_test(tiny_model_dir, tmp_path):
    # The README example's end: the model answers every scenario right, every group ties at the top
    # reward. That is a solved task: fit stops (rule "converged"), tests the best checkpoint and returns
    # its summary, where it used to skip steps and raise NotTrainableError out of gw.fit.
    model = gw.TrainableModel(name="solved", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    turn: dict[tuple[str, int], int] = {}

    async def rollout(m, scenario):
        name = m.inference_name()
        step = int(name.rsplit("@", 1)[1]) if "@" in name else await m.get_step()
        messages = [{"role": "user", "content": f"scenario {scenario}"}]
        r = await m.openai_client().chat.completions.create(model=name, messages=messages, max_tokens=2)
        turn[(name, scenario)] = turn.get((name, scenario), 0) + 1
        right = step >= 1 or turn[(name, scenario)] % 2 == 1  # step 0 answers half right, then all
        return gw.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=1.2 if right else 0.0,
                             metrics={"correct": float(right)})

    config = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, max_steps=8, eval_every=4,
                           resample_no_signal=1, patience=10)
    try:
        summary = await gw.fit(model, rollout, list(range(8)), val_scenarios=[8, 9], test_scenarios=[10, 11],
                               validate=lambda t, s: t.metrics["correct"], config=config)
    finally:
        await backend.close()
    assert summary.stop.rule == "converged" and summary.final_step == 1
    assert "stopped (converged)" in str(summary) and summary.test is not None
    h = gw.load_history(summary.run_dir)
    assert [r["step"] for r in rows(h, "train")] == [0]  # step 1 was solved, not skipped
    assert [(a["step"], a["action"]) for a in events(h, "alert") if a["name"] == "no_signal"] == [(1, "resample")]
    assert [s["rule"] for s in events(h, "stop")] == ["converged"]
