# Restated from deathbyknowledge/shellm, rl/load_scenarios.py (corpus/README.md): shell tasks with
# setup commands and a command whose exit status says whether the task was done.
from project_types import Scenario

_TASKS = [
    Scenario(id=f"t{i}", task=f"Create a file named done{i}.txt in the current directory, then run `exit 0`.",
             setup_commands=[f"rm -f done{i}.txt"], success_condition=f"test -f done{i}.txt")
    for i in range(64)
]


def load_scenarios(split: str = "train", limit: int | None = None) -> list[Scenario]:
    tasks = _TASKS[:32] if split == "train" else _TASKS[32:]
    return tasks[:limit] if limit is not None else tasks
