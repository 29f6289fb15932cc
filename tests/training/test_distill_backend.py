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


@pytest.fixture(scope="module")
def other_base_dirs(tmp_path_factory, tokenizer):
    """Two teachers on other bases than the tiny student's: one wider and deeper with the student's tokenizer,
    one whose tokenizer has a token more (a vocabulary the student's ids do not index the same way)."""
    from groupwise.runtime.loading import tiny_random_model

    good = tmp_path_factory.mktemp("teacher-wide")
    model, _ = tiny_random_model(seed=3, tokenizer=tokenizer, hidden_size=96, num_hidden_layers=3)
    model.save_pretrained(good)
    tokenizer.save_pretrained(good)
    bad = tmp_path_factory.mktemp("teacher-other-vocab")
    from groupwise.runtime.loading import load_tokenizer

    other = load_tokenizer(str(good))
    other.add_tokens(["<not-in-the-student>"])
    model, _ = tiny_random_model(seed=3, tokenizer=other)
    model.save_pretrained(bad)
    other.save_pretrained(bad)
    return str(good), str(bad)


async def test_a_teacher_on_another_base_teaches_and_one_of_another_vocabulary_is_refused(tiny_model_dir, tmp_path,
                                                                                          other_base_dirs):
    from groupwise.errors import TeacherMismatchError

    good, bad = other_base_dirs
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    student = gw.TrainableModel(name="student", project="p", base_model=tiny_model_dir)
    try:
        await student.register(backend)
        for estimate in ("sampled", "topk"):  # rewards tie: the teacher's signal is all there is to train on
            result = await student.train(await _groups(student, [1.0] * 4, n_groups=1), config=gw.TrainConfig(
                learning_rate=1e-2, teacher=good, distill_estimate=estimate, distill_top_k=8))
            assert result.metrics["skipped"] == 0.0 and result.metrics["grad_norm"] > 0.0, estimate
            assert result.metrics["teacher_kl"] > 0.0, estimate  # two random models: far apart either way
        with pytest.raises(TeacherMismatchError, match=r"tokenizer vocabulary differs: 49152 tokens for the student, "
                                                       r"49153 for the teacher.*needs the student's tokenizer vocabulary"):
            await student.train(await _groups(student, [0.0, 1.0, 0.0, 1.0], n_groups=1),
                                config=gw.TrainConfig(learning_rate=1e-2, teacher=bad))
    finally:
        await backend.close()


def test_the_vocabulary_check_names_what_differs(tokenizer, other_base_dirs):
    from groupwise.runtime.loading import load_tokenizer
    from groupwise.training.teacher import vocabulary_problems

    same = load_tokenizer(other_base_dirs[0])
    assert vocabulary_problems(tokenizer, same, student_head_rows=49152, teacher_head_rows=50000) == []
    other = load_tokenizer(other_base_dirs[1])
    [problem] = vocabulary_problems(tokenizer, other, student_head_rows=49152, teacher_head_rows=49153)
    assert "1 id(s) read differently (id 49152: None vs '<not-in-the-student>')" in problem
    [problem] = vocabulary_problems(tokenizer, same, student_head_rows=49152, teacher_head_rows=49000)
    assert problem == "the teacher's LM head scores 49000 ids, fewer than the 49152 of the tokenizer"


def test_a_teacher_that_is_no_checkpoint_is_loaded_as_a_model_only_where_it_names_one(tmp_path, monkeypatch, other_base_dirs):
    from groupwise.backend.replica import _names_a_model

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert _names_a_model("smollm2-135m") and _names_a_model(other_base_dirs[0])  # a short name, a model folder
    assert _names_a_model("HuggingFaceTB/SmolLM2-360M-Instruct")  # a hub id
    # paths: absolute, relative to '.', under a local folder, deeper than org/name: a checkpoint was meant
    for path in ("/nowhere/teacher", "./teacher", ".groupwise/2048/models/a", "runs/teacher", "a/b/c"):
        assert not _names_a_model(path), path
