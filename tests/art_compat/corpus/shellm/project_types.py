# Restated from deathbyknowledge/shellm, rl/project_types.py (corpus/README.md): the run's settings
# as the config of a TrainableModel[RunConfig], and the shell task scenario.
from typing import List

from pydantic import BaseModel
from typing_extensions import TypedDict


class RunConfig(BaseModel):
    learning_rate: float = 1.2e-5
    groups_per_step: int = 8
    num_epochs: int = 3
    rollouts_per_group: int = 6
    training_num_scenarios: int = 1000
    validation_frequency: int = 10
    validation_num_scenarios: int = 32


class Scenario(BaseModel):
    id: str
    task: str
    setup_commands: List[str]
    success_condition: str


class Message(TypedDict):
    role: str
    content: str
