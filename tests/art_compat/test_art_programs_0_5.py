"""ART 0.5.2x programs: the loop of ART's client docs (run_name, `backend.train(model, groups,
learning_rate=...)` returning a TrainResult, `model.log(..., metrics=result.metrics, step=result.step)`),
the RULER docs' training loop (`after_each=ruler_score_group(..., swallow_exceptions=True)`), and an
agent that reaches the model only through `inference_base_url` / `inference_api_key` with a plain
`openai` client over real HTTP. Unchanged but for `import groupwise as art`; tiny random model."""

from __future__ import annotations

from pathlib import Path

import openai

import groupwise as art  # the only change an ART program needs
from groupwise.local import LocalBackend
from groupwise.rewards import ruler_score_group


class Scenario:
    def __init__(self, field_1: str, field_2: float) -> None:
        self.field_1, self.field_2 = field_1, field_2


# ---------------------------------------------------------------- ART's client docs, with an HTTP agent


async def http_rollout(model: art.Model, scenario: Scenario) -> art.Trajectory:
    # An agent framework would be handed these two values; a plain client over HTTP stands for it.
    client = openai.AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key)
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "system", "content": "Summarise."}, {"role": "user", "content": scenario.field_1}]
    )
    async with client:
        chat_completion = await client.chat.completions.create(
            messages=trajectory.messages(), model=model.get_inference_name(await model.get_step()), max_tokens=5,
        )
    choice = chat_completion.choices[0]
    trajectory.messages_and_choices.append(choice)
    content = choice.message.content or ""
    trajectory.reward = 1.0 if scenario.field_2 == 1 else float(len(content) % 4)  # scenario 1 always ties
    return trajectory


async def client_docs_main(path: str, base_model: str, scenarios_per_step: list[list[Scenario]]):
    model = art.TrainableModel(name="agent-001", run_name="agent-001-run", project="my-agentic-task",
                               base_model=base_model,
                               _internal_config=art.dev.InternalModelConfig(trainer_args=art.dev.TrainerArgs(max_grad_norm=0.1)))
    backend = LocalBackend(path=path)
    await model.register(backend)
    results = []
    for scenarios in scenarios_per_step[await model.get_step():]:
        train_groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(http_rollout(model, scenario) for _ in range(4)) for scenario in scenarios),
            pbar_desc="gather",
        )
        result = await backend.train(model, train_groups, learning_rate=1e-5)
        await model.log(train_groups, metrics=result.metrics, step=result.step, split="train")
        results.append(result)
    await backend.close()
    return model, results


async def test_client_docs_loop_with_an_agent_over_http(tiny_model_dir, tmp_path, monkeypatch):
    from groupwise.training.trainer import Trainer

    used = []  # the TrainConfig each update ran with
    real_train_step = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", lambda self, batch, config, **kw: (
        used.append(config), real_train_step(self, batch, config, **kw))[1])
    steps = [[Scenario("hello", 0), Scenario("world!", 0)], [Scenario("tie", 1)], [Scenario("again", 0)]]
    model, results = await client_docs_main(str(tmp_path), tiny_model_dir, steps)
    # _internal_config's trainer_args.max_grad_norm reaches the trainer, beside backend.train's learning_rate
    assert [(c.max_grad_norm, c.learning_rate) for c in used] == [(0.1, 1e-5), (0.1, 1e-5)]
    assert model.inference_base_url.startswith("http://127.0.0.1:") and model.inference_api_key
    assert [(r.step, r.metrics["skipped"]) for r in results] == [(1, 0.0), (2, 1.0), (3, 0.0)]
    assert isinstance(results[0], art.TrainResult) and "loss" in results[0].metrics
    # run_name names the run's folder; name stays the served name
    run = tmp_path / "my-agentic-task" / "models" / "agent-001-run"
    train = [r for r in art.load_history(run) if r["split"] == "train"]
    # backend.train writes each step's row at the step that sampled it (0, 1, 2); ART's model.log at
    # result.step writes one at the new step, which the next step's own row replaces (same key)
    assert [(r["step"], r.get("skipped")) for r in train] == [(0, 0.0), (1, 1.0), (2, 0.0), (3, 0.0)]
    assert (run / "checkpoints" / "0003" / "state.json").is_file()


async def test_http_endpoint_needs_its_key_and_closes_with_the_backend(tiny_model_dir, tmp_path):
    model = art.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = LocalBackend(path=str(tmp_path))
    await model.register(backend)
    url = model.inference_base_url
    async with openai.AsyncOpenAI(base_url=url, api_key="wrong", max_retries=0) as client:
        try:
            await client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "hi"}])
            raise AssertionError("a request without the key was served")
        except openai.AuthenticationError:
            pass
    params = model.litellm_completion_params()
    assert params["model"] == "hosted_vllm/agent" and params["base_url"] == url
    async with openai.AsyncOpenAI(base_url=url, api_key=model.inference_api_key, max_retries=0) as client:
        # vLLM's sampling extras through extra_body, as ART users send them: top_k=1 is greedy
        answers = [await client.chat.completions.create(
            model="agent", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=1.0,
            extra_body={"top_k": 1, "repetition_penalty": 1.0}) for _ in range(2)]
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
    await backend.close()
    async with openai.AsyncOpenAI(base_url=url, api_key=model.inference_api_key, max_retries=0, timeout=5) as client:
        try:
            await client.models.list()
            raise AssertionError("the server outlived the backend")
        except openai.APIConnectionError:
            pass


# ---------------------------------------------------------------- the RULER docs' training loop


async def ruler_rollout(model: art.Model, scenario: str) -> art.Trajectory:
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": f"Tell me a joke about {scenario}"}])
    chat_completion = await model.openai_client().chat.completions.create(
        messages=trajectory.messages(), model=model.get_inference_name(), max_tokens=6,
    )
    trajectory.messages_and_choices.append(chat_completion.choices[0])
    return trajectory


async def test_ruler_docs_training_loop(tiny_model_dir, tmp_path, stub_judge):
    model = art.TrainableModel(name="joker", project="jokes", base_model=tiny_model_dir)
    backend = LocalBackend(path=str(tmp_path))
    await model.register(backend)
    steps = []
    for step in range(3):
        stub_judge.tie = step == 1  # the judge finds every joke equally good: no signal
        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(ruler_rollout(model, scenario) for _ in range(4)) for scenario in ["cats", "dogs"]),
            after_each=lambda group: ruler_score_group(
                group, "openai/o3", swallow_exceptions=True,
                extra_litellm_params={"api_base": stub_judge.base_url, "api_key": "sk-test"},
            ),
        )
        result = await backend.train(model, groups, learning_rate=1e-5)
        await model.log(groups, metrics=result.metrics, step=result.step, split="train")
        steps.append((result.step, result.metrics["skipped"], [t.metrics["ruler_score"] for t in groups[0]]))
    await backend.close()
    assert [(s, skipped) for s, skipped, _ in steps] == [(1, 0.0), (2, 1.0), (3, 0.0)]
    assert steps[1][2] == [0.5] * 4
    assert {r["model"] for r in stub_judge.requests} == {"o3"}  # the provider prefix is not sent
    assert {r["auth"] for r in stub_judge.requests} == {"Bearer sk-test"}


# ---------------------------------------------------------------- ART's checkpoint-forking docs


async def test_checkpoint_forking_docs_fork_then_register(tiny_model_dir, tmp_path, backup_bucket):
    """docs/features/checkpoint-forking.mdx: `backend._experimental_fork_checkpoint(model, from_model=,
    not_after_step=, verbose=True)` before or after `register` copies the source run's checkpoint at or
    before the step; the new model resumes there. `from_s3_bucket=` reads the bucket's copy (a folder here)."""
    import pytest

    async def rollout(model, prompt: str) -> art.Trajectory:
        completion = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(), messages=[{"role": "user", "content": prompt}], max_tokens=6)
        choice = completion.choices[0]
        return art.Trajectory(messages_and_choices=[{"role": "user", "content": prompt}, choice],
                              reward=float(len(choice.message.content or "") % 3))

    async with LocalBackend(path=str(tmp_path / "art")) as backend:
        v1 = art.TrainableModel(name="my-model-v1", project="my-project", base_model=tiny_model_dir)
        await v1.register(backend)
        groups = await art.gather_trajectory_groups([art.TrajectoryGroup(rollout(v1, "hi") for _ in range(4))])
        result = await backend.train(v1, groups, learning_rate=1e-4)
        await backend._experimental_push_to_s3(v1)

        v2 = art.TrainableModel(name="my-model-v2", project="my-project", base_model=tiny_model_dir)
        with pytest.raises(art.GroupwiseError, match=r"at or before step 0; its checkpoints are steps \[1\]"):
            await backend._experimental_fork_checkpoint(v2, from_model="my-model-v1", not_after_step=0)
        with pytest.raises(art.GroupwiseError, match="no checkpoints of model 'nope'"):
            await backend._experimental_fork_checkpoint(v2, from_model="nope")
        await backend._experimental_fork_checkpoint(v2, from_model="my-model-v1", not_after_step=500, verbose=True)
        await v2.register(backend)
        assert await v2.get_step() == result.step == 1
        # ART's documented order, register then fork, works too: the model is loaded again at the fork
        v4 = art.TrainableModel(name="my-model-v4", project="my-project", base_model=tiny_model_dir)
        await v4.register(backend)
        assert await v4.get_step() == 0
        await backend._experimental_fork_checkpoint(v4, from_model="my-model-v1")
        assert await v4.get_step() == 1
        import re

        def by_layer(tensors):  # the trainer's adapter name (each run its own) left out of the key
            return {re.sub(r"\.(lora_[AB])\.[^.]+\.", r".\1.", k): v for k, v in tensors.items()}

        forked = by_layer((await backend.served_adapters(v4, 1))[0])
        source = by_layer((await backend.served_adapters(v1, 1))[0])
        assert forked.keys() == source.keys() and all(forked[k].equal(source[k]) for k in source)
        groups = await art.gather_trajectory_groups([art.TrajectoryGroup(rollout(v4, "hi") for _ in range(4))])
        assert (await backend.train(v4, groups, learning_rate=1e-4)).step == 2

        v3 = art.TrainableModel(name="my-model-v3", project="other", base_model=tiny_model_dir)
        await backend._experimental_fork_checkpoint(v3, from_model="my-model-v1", from_project="my-project",
                                                    from_s3_bucket=str(backup_bucket))
        await v3.register(backend)
        assert await v3.get_step() == 1
        groups = await art.gather_trajectory_groups([art.TrajectoryGroup(rollout(v3, "hi") for _ in range(4))])
        assert (await backend.train(v3, groups, learning_rate=1e-4)).step == 2

        # ART 0.5's _experimental_pull_model_checkpoint: the latest checkpoint's folder (here, or in the
        # bucket folder when only it has the step), copied to local_path when given
        latest = await backend._experimental_pull_model_checkpoint(v3, step="latest")
        assert latest.endswith("checkpoints/0002") and (Path(latest) / "adapter_model.safetensors").is_file()
        copied = await backend._experimental_pull_model_checkpoint(v1, step=1, local_path=str(tmp_path / "ckpt"),
                                                                   verbose=True)
        assert copied == str(tmp_path / "ckpt") and (tmp_path / "ckpt" / "adapter_config.json").is_file()
        gone = art.TrainableModel(name="my-model-v1", project="my-project", base_model=tiny_model_dir,
                                  base_path=str(tmp_path / "elsewhere"))  # the run exists only in the bucket folder
        pulled = await backend._experimental_pull_model_checkpoint(gone, s3_bucket=str(backup_bucket))
        assert pulled.endswith("checkpoints/0001") and (Path(pulled) / "adapter_model.safetensors").is_file()
        with pytest.raises(art.GroupwiseError, match=r"no checkpoint of step 7 .*here: \[2\]"):
            await backend._experimental_pull_model_checkpoint(v3, step=7)

        from groupwise.utils.s3_checkpoint_utils import (get_checkpoint_step_not_after_from_s3,
                                                         get_latest_checkpoint_step_from_s3)

        bucket = str(backup_bucket)
        assert await get_latest_checkpoint_step_from_s3("my-model-v1", "my-project", s3_bucket=bucket) == 1
        assert await get_checkpoint_step_not_after_from_s3("my-model-v1", "my-project", 0, s3_bucket=bucket) is None
        assert await get_latest_checkpoint_step_from_s3("never-pushed", "my-project", s3_bucket=bucket) is None
