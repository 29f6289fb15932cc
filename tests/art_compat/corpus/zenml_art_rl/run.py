# Restated from zenml-io/zenml-projects, art-rl/run.py and pipelines/training.py (corpus/README.md):
# the training pipeline: build the inbox, set up the model's settings, run the training step.
from zenml import pipeline

from environment.models import Scenario
from environment.tools import create_database
from steps.training.setup_model import setup_art_model
from steps.training.train_agent import train_agent

TRAIN_SCENARIOS = [Scenario(id=i, question=f"When does contract {i} close?", answer="Friday",
                            message_ids=[f"<{i}@enron>"], inbox_address="jeff@enron.com", query_date="2001-05-01")
                   for i in range(4)]


@pipeline
def training_pipeline(groups_per_step: int = 2, rollouts_per_group: int = 4, max_steps: int = 20):
    create_database("./enron_emails.db")
    model_config = setup_art_model()
    return train_agent(model_config, TRAIN_SCENARIOS, "./enron_emails.db", groups_per_step=groups_per_step,
                       rollouts_per_group=rollouts_per_group, max_steps=max_steps)


if __name__ == "__main__":
    training_pipeline()
