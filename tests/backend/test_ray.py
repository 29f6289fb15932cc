"""`gw.fit` on a `RayBackend`: two CPU workers on a two-node local Ray cluster (one per node, gloo),
the driver (this process) on no GPU, rollouts through the workers' OpenAI servers, two GRPO steps; and
the same with a placement (`train_workers=1`): one node trains, the other generates."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

import groupwise as gw

SCENARIOS = [{"id": i, "q": f"Say something about topic {i}."} for i in range(8)]


async def rollout(model, scenario):
    messages = [{"role": "user", "content": scenario["q"]}]
    r = await model.openai_client().chat.completions.create(
        model=model.inference_name(), messages=messages, max_tokens=6, temperature=1.0)
    choice = r.choices[0]
    reward = len(choice.message.content or "") / 10 + len(set(choice.token_ids or [])) / 100
    return gw.Trajectory(messages_and_choices=[*messages, choice], reward=reward, metadata={"served_as": r.model})


@pytest.mark.slow
@pytest.mark.parametrize("train_workers", [None, 1], ids=["data_parallel", "1_trainer_1_generator"])
async def test_fit_runs_two_steps_on_a_two_node_ray_cluster(ray_cluster, tiny_model_dir, tmp_path, train_workers):
    from groupwise.backend.ray import RayBackend

    backend = RayBackend(path=str(tmp_path), num_workers=2, use_gpu=False, cpus_per_worker=1,
                         placement_strategy="STRICT_SPREAD", collective_timeout_s=60, train_workers=train_workers)
    model = gw.TrainableModel("ray-agent", project="ray", base_model=tiny_model_dir)
    await model.register(backend)
    try:
        # one worker per node of the cluster
        nodes = set(await asyncio.gather(*(actor.node_id.remote() for actor in backend.actors)))
        assert len(nodes) == 2 == len(ray_cluster.list_all_nodes())
        config = gw.LoopConfig(rollouts_per_group=4, groups_per_step=2, max_steps=2, eval_every=100, patience=100,
                               learning_rate=1e-2)
        summary = await gw.fit(model, rollout, SCENARIOS, config=config)
        assert (summary.start_step, summary.final_step, summary.stop.rule) == (0, 2, "max_steps")
        history = gw.load_history(summary.run_dir)
        assert [r["step"] for r in history if r["split"] == "train"] == [0, 1]
        # each step's policy served the next step's rollouts
        assert {t.metadata["served_as"] for g in gw.load_trajectories(summary.run_dir, "train", 1) for t in g} == {
            "ray-agent@1"}
        state = json.loads((model.store.checkpoints_dir / "0002" / "state.json").read_text())
        assert state["step"] == 2 and state["cursor"] == {"epoch": 0, "offset": 4, "seed": 0, "num_scenarios": 8}
        ranks = await backend.rank_states(model)
        assert len(ranks) == (train_workers or 2)  # the trainer ranks
        assert all(r["adapter"].keys() == ranks[0]["adapter"].keys() for r in ranks)
        # rollouts reach the generators only; each serves the trained adapter (checked in every step)
        assert len(model.openai_client()._client._transport.urls) == (1 if train_workers else 2)
        served = await backend.served_adapters(model, 2)
        assert all(torch.equal(s[k], ranks[0]["adapter"][k]) for s in served for k in ranks[0]["adapter"])
    finally:
        await backend.close()
