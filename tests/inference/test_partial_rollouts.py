"""Policy provenance and partial rollouts: every token records the step that sampled it, and a request
for a model's latest step moves to a newer adapter mid-sequence when one is served."""

from __future__ import annotations

import openai

from groupwise.core.choices import choice_policy_versions
from groupwise.inference.engine import Engine, GenerationRequest
from groupwise.inference.registry import ModelRegistry
from groupwise.inference.sampling import SamplingParams
from groupwise.runtime.loading import tiny_random_model
from groupwise.core.trajectory import Trajectory, TrajectoryGroup

PROMPT = [1, 5, 9, 13, 17]
SWAP_AFTER = 4  # tokens sampled before the newer step arrives


def _greedy(adapter: str, follow: str | None = None, on_token=None) -> GenerationRequest:
    return GenerationRequest(PROMPT, max_new_tokens=12, ignore_eos=True, adapter=adapter, follow=follow,
                             sampling=SamplingParams(temperature=0), on_token=on_token)


async def test_a_following_request_continues_under_the_new_step(tiny, adapter_dirs, tmp_path):
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    engine = Engine(model, tok, max_batch_size=4)
    registry = ModelRegistry(engine)
    try:
        registry.add_step("agent", 1, adapter_dirs[1])
        pinned = (await engine.generate(_greedy("agent@1"))).completions[0]
        assert pinned.adapters == ["agent@1"] * 12

        def swap(index, token, logprob, finish):
            if len(seen) == SWAP_AFTER - 1:  # the 4th token: step 2 is served before the 5th is sampled
                registry.add_step("agent", 2, adapter_dirs[2])  # the registry retargets the followers
            seen.append(token)
        seen: list[int] = []
        follower = _greedy("agent@1", follow="agent", on_token=swap)
        stay = _greedy("agent@1")  # asked for agent@1 itself: never moved
        futures = [engine.submit(follower), engine.submit(stay)]
        moved, kept = (f.result(timeout=120).completions[0] for f in futures)

        assert moved.adapters == ["agent@1"] * SWAP_AFTER + ["agent@2"] * (12 - SWAP_AFTER)
        assert kept.adapters == ["agent@1"] * 12 and kept.token_ids == pinned.token_ids
        # Before the swap the follower sampled what agent@1 samples; after it, agent@2's weights decide.
        assert moved.token_ids[:SWAP_AFTER] == pinned.token_ids[:SWAP_AFTER]
        assert moved.token_ids[SWAP_AFTER:] != pinned.token_ids[SWAP_AFTER:]
        assert max(abs(a - b) for a, b in zip(moved.logprobs[:SWAP_AFTER], pinned.logprobs)) < 1e-5
        assert engine.retarget("agent", "agent@2") == 0  # nothing left that follows an older step
    finally:
        engine.close()


async def test_the_server_returns_each_tokens_policy_version_and_the_store_keeps_it(client, tmp_path):
    from groupwise.runs.store import RunStore

    async def ask(model: str):
        r = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=6, temperature=0)
        return r.choices[0]

    old, latest, base = await ask("agent@1"), await ask("agent"), await ask("agent@0")
    assert choice_policy_versions(old) == [1] * len(old.token_ids)
    assert choice_policy_versions(latest) == [2] * len(latest.token_ids)  # the latest step of the fixture
    assert choice_policy_versions(base) == [0] * len(base.token_ids)
    stream = await client.chat.completions.create(model="agent@1", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=4, temperature=0, stream=True)
    finals = [c.choices[0] for c in [chunk async for chunk in stream] if c.choices and c.choices[0].finish_reason]
    assert finals[0].model_extra["policy_versions"] == [1] * 4

    traj = Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}, old, latest], reward=1.0)
    assert traj.policy_versions() == [1] * len(old.token_ids) + [2] * len(latest.token_ids)
    store = RunStore(tmp_path, "p", "m")
    store.write_trajectories("train", 0, [TrajectoryGroup([traj])])
    back = store.load_trajectories("train", 0)[0].trajectories[0]
    assert back.policy_versions() == traj.policy_versions()
