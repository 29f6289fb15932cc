# Third-party ART program, restated for groupwise's tests (corpus/README.md says how and why):
# deathbyknowledge/shellm, rl/train.py. Trains a shell agent: a run chosen by --model from
# all_experiments, LocalBackend as a context manager, validation logged with model.log, groups of
# run_agent_and_score. Every use of ART is kept call for call.
import art
from art.local import LocalBackend
from art.utils import iterate_dataset

from benchmark import benchmark
from load_scenarios import load_scenarios
from project_types import RunConfig
from run_agent import run_agent_and_score


async def train(model: art.TrainableModel[RunConfig]):
    training_data = load_scenarios(split="train", limit=model.config.training_num_scenarios)
    with LocalBackend() as backend:
        await model.register(backend)
        training_iterator = iterate_dataset(training_data, groups_per_step=model.config.groups_per_step,
                                            num_epochs=model.config.num_epochs, initial_step=await model.get_step())
        for dataset_batch in training_iterator:
            batch = dataset_batch.items
            global_step = dataset_batch.step
            if global_step % model.config.validation_frequency == 0:
                results, score = await benchmark(model, model.config.validation_num_scenarios)
                await model.log(results)
            groups = []
            for scenario in batch:
                groups.append(art.TrajectoryGroup(
                    (run_agent_and_score(model, scenario) for _ in range(model.config.rollouts_per_group))))
            finished_groups = await art.gather_trajectory_groups(groups)
            await model.train(finished_groups, config=art.TrainConfig(learning_rate=model.config.learning_rate))


if __name__ == "__main__":
    import argparse
    import asyncio

    from all_experiments import models

    parser = argparse.ArgumentParser(description="Train a model")
    parser.add_argument("--model", required=True, help="The key of the model to train (e.g. 'run_1')")
    args = parser.parse_args()
    model = models[args.model]
    asyncio.run(train(model))
