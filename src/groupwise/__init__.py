"""groupwise: train LLM agents with reinforcement learning (GRPO on LoRA, RULER judging).

The public names are ART's, so ART code ports by changing the import. `import groupwise` is light:
names are resolved on first use (PEP 562), and nothing on the client side imports torch.
See `groupwise.core.trajectory` for the map of the pipeline.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"


def _install_aliases() -> None:
    """Old module paths (ART's, and groupwise's before its folders were the layer map) load the module at
    its new path (groupwise.art.aliases)."""
    from groupwise.art.aliases import install

    install()


_install_aliases()


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
    from groupwise.art.internals import install

    install()


_install_art_internals()

# public name -> module that defines it. Resolved lazily so heavy modules load only when used.
_EXPORTS: dict[str, str] = {
    # data model
    "Trajectory": "groupwise.core.trajectory",
    "TrajectoryGroup": "groupwise.core.trajectory",
    "History": "groupwise.core.trajectory",
    "PydanticException": "groupwise.core.trajectory",
    "Messages": "groupwise.core.trajectory",
    "MessagesAndChoices": "groupwise.core.trajectory",
    "Tools": "groupwise.core.trajectory",
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
    "LoRAConfig": "groupwise.art.dev",
    "ArtCompatWarning": "groupwise.core.compat",
    "LoraConfig": "groupwise.config",
    "LoopConfig": "groupwise.config",
    "DetectorConfig": "groupwise.config",
    "CheckpointRetention": "groupwise.config",
    # gathering
    "gather_trajectory_groups": "groupwise.rollout.gather",
    "gather_trajectories": "groupwise.rollout.gather",
    "trajectory_group": "groupwise.rollout.gather",
    "trajectory_group_batches": "groupwise.art.batches",
    "auto_trajectory": "groupwise.core.captures",
    "capture_auto_trajectory": "groupwise.core.captures",
    "yield_trajectory": "groupwise.core.captures",
    "capture_yielded_trajectory": "groupwise.core.captures",
    # store
    "load_trajectories": "groupwise.runs.store",
    "load_history": "groupwise.runs.store",
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
    "ServerlessBackend": "groupwise.art.serverless",
    "ServerlessTrainResult": "groupwise.backend.base",
    "RayBackend": "groupwise.backend.ray",
    # helpers
    "retry": "groupwise.art.utils",
    "limit_concurrency": "groupwise.art.utils",
    "iterate_dataset": "groupwise.art.utils",
    "split_dataset": "groupwise.art.utils",
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
# groupwise's own subpackages reachable as attributes: `gw.envs.from_verifiers(env)`, `gw.envs.get_env("2048")`.
_OWN_SUBPACKAGES = ("envs",)

__all__ = sorted([*_EXPORTS, *_SUBPACKAGES, *_OWN_SUBPACKAGES]) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"groupwise.art.{name}")
    if name in _OWN_SUBPACKAGES:
        return importlib.import_module(f"groupwise.{name}")
    module = _EXPORTS.get(name)
    if module is None and name in _moved_modules():  # `gw.types`, `gw.store`: a module at its old path
        return importlib.import_module(f"groupwise.{name}")
    if module is None:  # one of ART's names that is not provided says why (groupwise.core.compat.NOT_PROVIDED)
        from groupwise.core.compat import not_provided

        raise not_provided("groupwise", name)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: the next access skips __getattr__
    return value


class _Package(ModuleType):
    """The package's module type: a submodule named like a public name (``groupwise.auto_trajectory``,
    ART's path of the function ``auto_trajectory``) does not replace that name when it is imported.

    The import system binds each newly loaded submodule as an attribute of its package; ART's package
    imports those submodules when it loads, so later imports find them loaded and its attributes stay the
    functions. groupwise resolves its names lazily, so the first ``from groupwise.auto_trajectory import
    ...`` would rebind ``gw.auto_trajectory`` to the module: the name keeps what ``_EXPORTS`` says."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def _moved_modules() -> set[str]:
    from groupwise.art.aliases import ALIASES

    return {old for old in ALIASES if "." not in old}


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # static type checkers and IDEs see the real names (generated from _EXPORTS)
    from groupwise.art.batches import trajectory_group_batches
    from groupwise.art.dev import LoRAConfig
    from groupwise.art.serverless import ServerlessBackend
    from groupwise.art.utils import iterate_dataset, limit_concurrency, retry, split_dataset
    from groupwise.backend.base import API, Backend, LocalTrainResult, ServerlessTrainResult, TrainResult
    from groupwise.backend.local import LocalAPI, LocalBackend
    from groupwise.backend.options import BackendOptions
    from groupwise.backend.ray import RayBackend
    from groupwise.config import CheckpointRetention, DetectorConfig, LoopConfig, LoraConfig, TrainConfig, TrainSFTConfig
    from groupwise.core.captures import (
        auto_trajectory,
        capture_auto_trajectory,
        capture_yielded_trajectory,
        yield_trajectory,
    )
    from groupwise.core.compat import ArtCompatWarning
    from groupwise.core.trajectory import (
        History,
        Messages,
        MessagesAndChoices,
        PydanticException,
        Tools,
        Trajectory,
        TrajectoryGroup,
    )
    from groupwise.errors import (
        AdapterMismatchError,
        ConfigError,
        CorruptRecordError,
        GatherError,
        GroupwiseError,
        JudgeError,
        JudgeSelectionError,
        ModelNotFoundError,
        NotTrainableError,
        RewardAuditError,
        StoreError,
    )
    from groupwise.judge import (
        DEFAULT_RUBRIC,
        JudgeConfig,
        JudgeSelection,
        JudgeSpec,
        LabelledGroup,
        evaluate_judges,
        ruler,
        ruler_score_group,
        select_judge,
    )
    from groupwise.loop import FitRun, FitSummary, fit, fit_runs
    from groupwise.loop.audit import AuditReport, audit_reward
    from groupwise.model import Model, TrainableModel
    from groupwise.rollout.gather import gather_trajectories, gather_trajectory_groups, trajectory_group
    from groupwise.runs.store import load_history, load_trajectories
    from groupwise.art import dev, local, rewards, serverless, utils
