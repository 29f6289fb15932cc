"""Distillation through LocalBackend: a run's checkpoint teaches another run of the same base, steps whose
rewards all tie still train on the teacher's signal, and a teacher that is not there is named."""

from __future__ import annotations

import pytest

import groupwise as gw
from groupwise.errors import CheckpointError


async def _groups(model, rewards, n_groups=2):
    client = model.openai_client()
    groups = []
    for g in range(n_groups):
        trajs = []
        for i, reward in enumerate(rewards):
            messages = [{"role": "user", "content": f"scenario {g}"}]
            r = await client.chat.completions.create(model=model.inference_name(), messages=messages,
                                                     max_tokens=6, seed=10 * g + i)
            trajs.append(gw.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=reward))
        groups.append(gw.TrajectoryGroup(trajs))
    return groups


async def test_a_checkpoint_of_another_run_teaches_a_student_whose_rewards_tie(tiny_model_dir, tmp_path):
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    teacher = gw.TrainableModel(name="teacher", project="p", base_model=tiny_model_dir)
    student = gw.TrainableModel(name="student", project="p", base_model=tiny_model_dir)
    try:
        await teacher.register(backend)
        await student.register(backend)
        await teacher.train(await _groups(teacher, [0.0, 1.0, 2.0, 3.0]), config=gw.TrainConfig(learning_rate=5e-2))
        folder = tmp_path / "p" / "models" / "teacher" / "checkpoints" / "0001"
        assert (folder / "state.json").is_file()

        tied = await _groups(student, [1.0, 1.0, 1.0, 1.0])  # no group-relative signal at all
        result = await student.train(tied, config=gw.TrainConfig(learning_rate=1e-2, teacher=str(folder)))
        assert result.metrics["skipped"] == 0.0  # trained, on the teacher's advantage alone
        assert result.metrics["teacher_kl"] != 0.0 and result.metrics["grad_norm"] > 0.0
        # the run folder names the same teacher (its latest checkpoint)
        again = await student.train(await _groups(student, [1.0] * 4),
                                    config=gw.TrainConfig(learning_rate=1e-2, teacher=str(tmp_path / "p" / "models" / "teacher")))
        assert again.metrics["skipped"] == 0.0 and "teacher_kl" in again.metrics

        # without a teacher the same tied step is skipped, as before
        plain = await student.train(await _groups(student, [1.0] * 4), config=gw.TrainConfig(learning_rate=1e-2))
        assert plain.metrics["skipped"] == 1.0 and "teacher_kl" not in plain.metrics

        with pytest.raises(CheckpointError, match="no checkpoint there"):
            await student.train(await _groups(student, [0.0, 1.0, 0.0, 1.0]),
                                config=gw.TrainConfig(learning_rate=1e-2, teacher=str(tmp_path / "nowhere")))
    finally:
        await backend.close()
