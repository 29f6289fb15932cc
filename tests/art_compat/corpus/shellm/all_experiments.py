# Restated from deathbyknowledge/shellm, rl/all_experiments.py (corpus/README.md): runs as deep copies
# of one TrainableModel[RunConfig], renamed and reconfigured field by field.
import art
from project_types import RunConfig

models: dict[str, art.TrainableModel[RunConfig]] = {}

models["run_1"] = art.TrainableModel[RunConfig](
    base_model="deathbyknowledge/Qwen3-8B-Shell-SFT",
    project="shell-agent-test",
    name="run_1",
    config=RunConfig(),
)

models["run_2"] = models["run_1"].model_copy(deep=True)
models["run_2"].name = "run_2"
models["run_2"].config.rollouts_per_group = 8
