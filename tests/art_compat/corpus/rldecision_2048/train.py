# Third-party ART program, restated for groupwise's tests (corpus/README.md says how and why):
# johnson7788/RLDecisionAgent, backend/ART_2048/train.py. A game (2048): `_internal_config` set after
# construction, steps counted from model.get_step(), RULER through gather_trajectory_groups'
# after_each with a local judge (extra_litellm_params api_base localhost:6688) and
# swallow_exceptions. Every use of ART is kept call for call.
import asyncio
import os
import random

from dotenv import load_dotenv
from rollout import rollout

import art
from art.local import LocalBackend
from art.rewards import ruler_score_group

load_dotenv()
random.seed(42)

model = art.TrainableModel(name="tutorial-001", project="2048", base_model="Qwen/Qwen2.5-0.5B-Instruct")
model._internal_config = art.dev.InternalModelConfig(init_args=art.dev.InitArgs(max_seq_length=8192))

TRAIN_STEPS = 40
SIMULTANEOUS_GAMES = 18
ENABLE_RULER = True


async def train():
    backend = LocalBackend()
    await model.register(backend)
    extra_litellm_params = {"api_base": "http://localhost:6688", "api_key": os.environ["OPENAI_API_KEY"]}
    for i in range(await model.get_step(), TRAIN_STEPS):
        train_groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, i, is_validation=False) for _ in range(SIMULTANEOUS_GAMES))
             for _ in range(1)),
            after_each=lambda group: (
                ruler_score_group(group, "openai/o4-mini", debug=True, extra_litellm_params=extra_litellm_params,
                                  swallow_exceptions=True)
                if ENABLE_RULER else None
            ),
            pbar_desc="gather",
            max_exceptions=10,
        )
        await model.train(train_groups, config=art.TrainConfig(learning_rate=1e-5))


if __name__ == "__main__":
    asyncio.run(train())
