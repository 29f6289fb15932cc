"""groupwise: train LLM agents with reinforcement learning (GRPO on LoRA, RULER judging).

The public names are ART's, so ART code ports by changing the import. `import groupwise` is light:
names are resolved on first use (PEP 562), and nothing on the client side imports torch.
See `groupwise.types` for the map of the pipeline.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"


def _load_env_file() -> None:
    """Set the variables of the nearest ``.env`` file (the working directory's, else a parent's) that are
    not set already, as ART 0.5's ``import art`` does: ported programs keep finding the keys (a judge's
    ``OPENAI_API_KEY``, ``BACKUP_BUCKET``, ...) they kept there. Variables already set win."""
    from dotenv import find_dotenv, load_dotenv

    load_dotenv(find_dotenv(usecwd=True), override=False)


_load_env_file()


def _install_art_internals() -> None:
    """ART's internal modules (`art.unsloth`, `art.local.service`, ...) raise an error saying what to use
    instead (groupwise.art_internals)."""
    from groupwise.art_internals import install

    install()


_install_art_internals()

# public name -> module that defines it. Resolved lazily so heavy modules load only when used.
_EXPORTS: dict[str, str] = {
    # data model
    "Trajectory": "groupwise.types",
    "TrajectoryGroup": "groupwise.types",
    "History": "groupwise.types",
    "PydanticException": "groupwise.types",
    "Messages": "groupwise.types",
    "MessagesAndChoices": "groupwise.types",
    "Tools": "groupwise.types",
    # errors
    "GroupwiseError": "groupwise.errors",
    "ConfigError": "groupwise.errors",
    "GatherError": "groupwise.errors",
    "StoreError": "groupwise.errors",
    "CorruptRecordError": "groupwise.errors",
    "ModelNotFoundError": "groupwise.errors",
    "NotTrainableError": "groupwise.errors",
    "AdapterMismatchError": "groupwise.errors",
    "JudgeError": "groupwise.errors",
    "JudgeSelectionError": "groupwise.errors",
    "RewardAuditError": "groupwise.errors",
    # configs
    "TrainConfig": "groupwise.config",
    "TrainSFTConfig": "groupwise.config",
    "LoRAConfig": "groupwise.dev",
    "ArtCompatWarning": "groupwise.compat",
    "LoraConfig": "groupwise.config",
    "LoopConfig": "groupwise.config",
    "DetectorConfig": "groupwise.config",
    # gathering
    "gather_trajectory_groups": "groupwise.rollout.gather",
    "gather_trajectories": "groupwise.rollout.gather",
    "trajectory_group": "groupwise.rollout.gather",
    "trajectory_group_batches": "groupwise.batches",
    "auto_trajectory": "groupwise.captures",
    "capture_auto_trajectory": "groupwise.captures",
    "yield_trajectory": "groupwise.captures",
    "capture_yielded_trajectory": "groupwise.captures",
    # store
    "load_trajectories": "groupwise.store",
    "load_history": "groupwise.store",
    # models and backends
    "Model": "groupwise.model",
    "TrainableModel": "groupwise.model",
    "Backend": "groupwise.backend.base",
    "API": "groupwise.backend.base",
    "TrainResult": "groupwise.backend.base",
    "LocalTrainResult": "groupwise.backend.base",
    "BackendOptions": "groupwise.backend.options",
    "LocalBackend": "groupwise.backend.local",
    "LocalAPI": "groupwise.backend.local",
    "ServerlessBackend": "groupwise.serverless",
    "ServerlessTrainResult": "groupwise.backend.base",
    "RayBackend": "groupwise.backend.ray",
    # helpers
    "retry": "groupwise.utils",
    "limit_concurrency": "groupwise.utils",
    "iterate_dataset": "groupwise.utils",
    "split_dataset": "groupwise.utils",
    # judge
    "ruler": "groupwise.judge",
    "ruler_score_group": "groupwise.judge",
    "DEFAULT_RUBRIC": "groupwise.judge",
    "JudgeConfig": "groupwise.judge",
    "JudgeSpec": "groupwise.judge",
    "LabelledGroup": "groupwise.judge",
    "JudgeSelection": "groupwise.judge",
    "evaluate_judges": "groupwise.judge",
    "select_judge": "groupwise.judge",
    # loop
    "audit_reward": "groupwise.loop.audit",
    "AuditReport": "groupwise.loop.audit",
    "fit": "groupwise.loop",
    "fit_runs": "groupwise.loop",
    "FitRun": "groupwise.loop",
    "FitSummary": "groupwise.loop",
}

# ART's subpackages, reachable as attributes (`art.dev.InternalModelConfig`, `art.rewards.ruler`).
_SUBPACKAGES = ("dev", "local", "rewards", "serverless", "utils")

__all__ = sorted([*_EXPORTS, *_SUBPACKAGES]) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"groupwise.{name}")
    module = _EXPORTS.get(name)
    if module is None:  # one of ART's names that is not provided says why (groupwise.compat.NOT_PROVIDED)
        from groupwise.compat import not_provided

        raise not_provided("groupwise", name)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: the next access skips __getattr__
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # static type checkers and IDEs see the real names
    from groupwise.config import DetectorConfig, LoopConfig, TrainConfig, TrainSFTConfig
    from groupwise.errors import *  # noqa: F403
    from groupwise.types import History, PydanticException, Trajectory, TrajectoryGroup
