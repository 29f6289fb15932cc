# Restated from zenml-io/zenml-projects, art-rl/steps/training/setup_model.py (corpus/README.md).
from typing import Annotated

from zenml import step


@step
def setup_art_model(model_name: str = "art-email-agent", project_name: str = "email-search-agent",
                    base_model: str = "Qwen/Qwen2.5-7B-Instruct") -> Annotated[dict, "model_config"]:
    return {"name": model_name, "project": project_name, "base_model": base_model}
