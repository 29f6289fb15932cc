# Restated from johnson7788/RLDecisionAgent, backend/ART_mcp-rl/all_experiments.py (corpus/README.md):
# runs as deep copies of one TrainableModel with a pydantic config, renamed and reconfigured.
from pydantic import BaseModel

import art


class McpPolicyConfig(BaseModel):
    max_turns: int = 5
    max_tokens: int = 2048
    base_model: str = "Qwen/Qwen2.5-0.5B-Instruct"
    mcp_server_name: str = "mcp_caculator"
    trajectories_per_group: int = 7
    groups_per_step: int = 4
    learning_rate: float = 1e-6
    eval_steps: int = 1
    val_set_size: int = 8
    training_dataset_size: int = 16
    num_epochs: int = 80
    ruler_judge_model: str = "deepseek/deepseek-chat"
    minimum_reward_std_dev: float = 0.0
    training_dataset_seed: int | None = None
    fork_from_model: str | None = None
    fork_from_project: str | None = None
    fork_not_after_step: int | None = None
    scale_rewards: bool = True


models: dict = {
    "mcp-7b-001": art.TrainableModel(
        name="mcp-7b-001", project="mcp-agent-training", base_model="Qwen/Qwen2.5-0.5B-Instruct",
        config=McpPolicyConfig(num_epochs=20),
    )
}
models["mcp-14b-001"] = models["mcp-7b-001"].model_copy(deep=True)
models["mcp-14b-001"].name = "mcp-14b-001"
models["mcp-14b-001"].base_model = "Qwen/Qwen2.5-14B-Instruct"
models["mcp-14b-001"].config.num_epochs = 6
