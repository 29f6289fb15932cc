# Third-party ART program, restated for groupwise's tests (corpus/README.md says how and why):
# zenml-io/zenml-projects, art-rl/steps/training/train_agent.py. A ZenML step running ART's loop: the
# model's _internal_config set after construction, LocalBackend(in_process=True, path=art_path),
# wrap_rollout with keyword arguments, RULER with a hosted judge, delete_checkpoints before each
# step, train's `_config`. Every use of ART is kept call for call.
import asyncio
from typing import Annotated, List, Tuple

from zenml import log_model_metadata, step
from zenml.logger import get_logger

from environment.models import Scenario

logger = get_logger(__name__)


def _run_training_loop(model_config, train_scenarios, db_path, groups_per_step, num_epochs, rollouts_per_group,
                       learning_rate, max_steps, ruler_model, art_path):
    import art
    from art.langgraph import wrap_rollout
    from art.local import LocalBackend
    from art.rewards import ruler_score_group
    from art.utils import iterate_dataset

    from agent.rollout import rollout
    from environment.models import EmailScenario

    async def _async_train():
        model = art.TrainableModel(name=model_config["name"], project=model_config["project"],
                                   base_model=model_config["base_model"])
        model._internal_config = art.dev.InternalModelConfig(
            init_args=art.dev.InitArgs(max_seq_length=8192),
            engine_args=art.dev.EngineArgs(enforce_eager=True, gpu_memory_utilization=0.8),
        )
        backend = LocalBackend(in_process=True, path=art_path)
        await model.register(backend)
        training_iterator = iterate_dataset(train_scenarios, groups_per_step=groups_per_step, num_epochs=num_epochs,
                                            initial_step=await model.get_step())
        all_metrics = []
        for batch in training_iterator:
            groups = []
            for scenario in batch.items:
                email_scenario = EmailScenario(step=batch.step, scenario=scenario)
                groups.append(art.TrajectoryGroup(
                    (wrap_rollout(model, rollout)(model, email_scenario, db_path=db_path)
                     for _ in range(rollouts_per_group))))
            finished_groups = await art.gather_trajectory_groups(groups, pbar_desc="rollouts",
                                                                 max_exceptions=rollouts_per_group * len(batch.items))
            judged_groups = []
            for group in finished_groups:
                judged_group = await ruler_score_group(group, ruler_model)
                if judged_group:
                    judged_groups.append(judged_group)
            if not judged_groups:
                logger.warning("No valid trajectory groups after RULER scoring")
                continue
            total = sum(len(g.trajectories) for g in judged_groups)
            step_metrics = {"step": batch.step, "epoch": batch.epoch,
                            "avg_reward": sum(t.reward for g in judged_groups for t in g.trajectories) / total,
                            "accuracy": sum(t.metrics.get("correct", 0) for g in judged_groups for t in g.trajectories) / total,
                            "num_trajectories": total}
            all_metrics.append(step_metrics)
            log_model_metadata(metadata=step_metrics)
            await model.delete_checkpoints()
            await model.train(judged_groups, config=art.TrainConfig(learning_rate=learning_rate),
                              _config={"logprob_calculation_chunk_size": 8})
            if batch.step >= max_steps:
                break
        return f"{art_path}/checkpoints/latest", {"history": all_metrics}

    return asyncio.run(_async_train())


@step(enable_cache=False)
def train_agent(model_config: dict, train_scenarios: List[Scenario], db_path: str, groups_per_step: int = 2,
                num_epochs: int = 20, rollouts_per_group: int = 4, learning_rate: float = 1e-5, max_steps: int = 20,
                ruler_model: str = "openai/o4-mini", art_path: str = "./.art",
                ) -> Tuple[Annotated[str, "checkpoint_path"], Annotated[dict, "training_metrics"]]:
    return _run_training_loop(model_config=model_config, train_scenarios=train_scenarios, db_path=db_path,
                              groups_per_step=groups_per_step, num_epochs=num_epochs,
                              rollouts_per_group=rollouts_per_group, learning_rate=learning_rate,
                              max_steps=max_steps, ruler_model=ruler_model, art_path=art_path)
