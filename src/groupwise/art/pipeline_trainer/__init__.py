"""ART's `art.pipeline_trainer`: `PipelineTrainer` (rollout workers, a trainer and an evaluator that
overlap), `make_group_rollout_fn`, and the checkpoint retention strategies, with ART's names and
constructor arguments. How it maps onto groupwise: trainer.py's docstring. `gw.fit` with
`LoopConfig.max_steps_off_policy` is groupwise's own asynchronous loop (reproducible, resumable to the
same history); this class is for ART programs that use ART's."""

from groupwise.art.pipeline_trainer.retention import (
    CHECKPOINT_CREATED_AT_METRIC,
    CHECKPOINT_EVAL_COMPLETED_METRIC,
    CHECKPOINT_SAVED_METRIC,
    CheckpointInfo,
    CheckpointRetentionContext,
    CheckpointRetentionStrategy,
    keep_recent_and_top,
)
from groupwise.art.pipeline_trainer.trainer import EvalFn, PipelineTrainer, RolloutFn, ScenarioT, SingleRolloutFn, make_group_rollout_fn

__all__ = [
    "CHECKPOINT_CREATED_AT_METRIC",
    "CHECKPOINT_EVAL_COMPLETED_METRIC",
    "CHECKPOINT_SAVED_METRIC",
    "CheckpointInfo",
    "CheckpointRetentionContext",
    "CheckpointRetentionStrategy",
    "EvalFn",
    "PipelineTrainer",
    "RolloutFn",
    "ScenarioT",
    "SingleRolloutFn",
    "keep_recent_and_top",
    "make_group_rollout_fn",
]
