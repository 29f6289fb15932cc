# Third-party ART program, restated for groupwise's tests (corpus/README.md says how and why):
# johnson7788/RLDecisionAgent, backend/ART_mcp-rl/mcp_rl/train.py, run as `python -m mcp_rl.train
# --models mcp-7b-001`. An MCP agent: a prompted control model (a hosted DeepSeek model as art.Model),
# RULER with a DeepSeek judge applied by gather_trajectory_groups(after_each=...), validation groups
# logged with model.log(split="val"). Every use of ART is kept call for call.
import argparse
import asyncio
import fnmatch
import json
import os

import weave
from dotenv import load_dotenv

import art
from art.rewards import ruler_score_group
from art.utils import iterate_dataset

from .benchmarks.generate_benchmarks import calculate_beat_comp, generate_val_groups
from .rollout import McpScenario, rollout

load_dotenv()

try:
    from all_experiments import models
except ImportError:
    models = {}

if os.getenv("WANDB_API_KEY"):
    weave.init("mcp-agent-training")


async def train_mcp_agent(model: art.TrainableModel, use_skypilot: bool = False):
    gpt_4o = art.Model(
        name="gpt-4o", project=model.project, inference_model_name="deepseek-chat",
        inference_api_key=os.getenv("DEEPSEEK_API_KEY"), inference_base_url="https://api.deepseek.com/v1",
    )
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError("Model config is required")
    server_params = __import__(f"servers.python.{config.mcp_server_name}.server_params",
                               fromlist=["server_params"]).server_params
    scenarios_dir = f"servers/python/{config.mcp_server_name}/scenarios"
    with open(f"{scenarios_dir}/train.jsonl") as f:
        raw_train_scenarios = [json.loads(line) for line in f if line.strip()]
    with open(f"{scenarios_dir}/val.jsonl") as f:
        raw_val_scenarios = [json.loads(line) for line in f if line.strip()]
    if config.training_dataset_size and config.training_dataset_size < len(raw_train_scenarios):
        raw_train_scenarios = raw_train_scenarios[: config.training_dataset_size]

    from art.local.backend import LocalBackend

    backend = LocalBackend()
    await model.register(backend)
    train_scenarios = [McpScenario(task_description=s["task"], server_params=server_params, max_turns=config.max_turns)
                       for s in raw_train_scenarios]
    val_scenarios = [McpScenario(task_description=s["task"], server_params=server_params, max_turns=config.max_turns)
                     for s in raw_val_scenarios]
    train_iterator = iterate_dataset(train_scenarios, groups_per_step=config.groups_per_step,
                                     num_epochs=config.num_epochs, initial_step=await model.get_step())
    control_groups = await generate_val_groups(gpt_4o, val_scenarios)
    for batch in train_iterator:
        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, scenario, False) for _ in range(config.trajectories_per_group))
             for scenario in batch.items),
            pbar_desc=f"train gather step {batch.step}",
            after_each=lambda group: ruler_score_group(group, judge_model=config.ruler_judge_model, debug=True,
                                                       swallow_exceptions=True),
        )
        if batch.step % config.eval_steps == 0:
            val_groups = await generate_val_groups(model, val_scenarios)
            await calculate_beat_comp(val_groups, control_groups, control_first=True)
            await calculate_beat_comp(val_groups, control_groups, control_first=False)
            await model.log(val_groups, split="val")
        await model.train(groups, config=art.TrainConfig(learning_rate=config.learning_rate))


def main():
    parser = argparse.ArgumentParser(description="Train MCP agent models.")
    parser.add_argument("--models", type=str, required=True)
    parser.add_argument("--use-skypilot", action="store_true")
    args = parser.parse_args()
    if args.models not in models:
        matching = [k for k in models if fnmatch.fnmatch(k, args.models.replace("%", "*"))]
        if len(matching) != 1:
            print(f"Unknown model key: {args.models}")
            return
        model_key = matching[0]
    else:
        model_key = args.models
    model = models[model_key].model_copy(deep=True)
    asyncio.run(train_mcp_agent(model, use_skypilot=args.use_skypilot))


if __name__ == "__main__":
    main()
