"""ART's `art.dev` names, so configs written for ART construct unchanged.

They are plain dicts (as ART's TypedDicts are). What maps is applied where it is read:
``InternalModelConfig(peft_args=PeftArgs(r=..., lora_alpha=...))`` and ``LoRAConfig`` set the model's
adapter (`TrainableModel.lora_for`), ``TrainConfig`` options map onto `groupwise.TrainConfig`
(`groupwise.core.compat.resolve_train_config`). Settings of ART's own machinery (Unsloth init arguments,
vLLM engine and server arguments, Tinker, GPU placement) have no counterpart here; they are accepted
and named once in an `ArtCompatWarning`. docs/porting-from-art.md lists every name.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import TypedDict

__all__ = [
    "BackendModelConfig", "EngineArgs", "InitArgs", "InternalModelConfig", "LoRAConfig", "ModelConfig",
    "OpenAIServerConfig",
    "PeftArgs", "ServerArgs", "TinkerArgs", "TinkerNativeArgs", "TinkerTrainingClientArgs", "TrainConfig",
    "TrainSFTConfig", "TrainerArgs", "VllmRuntimeArgs",
]


class InitArgs(TypedDict, total=False):
    """Unsloth's model loading arguments (ignored: the backend loads with transformers)."""

    model_name: str
    max_seq_length: int
    load_in_4bit: bool


class EngineArgs(TypedDict, total=False):
    """vLLM engine arguments (ignored: groupwise's engine sizes itself; see `LocalBackend(max_batch_size=...)`)."""

    gpu_memory_utilization: float
    enforce_eager: bool


class PeftArgs(TypedDict, total=False):
    """The adapter (ART <= 0.5.17): r, lora_alpha, lora_dropout, target_modules, random_state map onto `gw.LoraConfig`."""

    r: int
    lora_alpha: float
    lora_dropout: float
    target_modules: list[str]
    random_state: int


class LoRAConfig(TypedDict, total=False):
    """The adapter (ART 0.5.2x): rank, alpha, dropout, target_modules, random_state map onto `gw.LoraConfig`."""

    rank: int
    alpha: float
    dropout: float
    target_modules: list[str]
    random_state: int


class TrainerArgs(TypedDict, total=False):
    """TRL/transformers trainer arguments (ignored: pass `gw.TrainConfig` fields instead)."""

    learning_rate: float
    max_grad_norm: float


class TinkerTrainingClientArgs(TypedDict, total=False):
    rank: int


class TinkerArgs(TypedDict, total=False):
    """Tinker's settings (ignored: groupwise trains locally)."""

    renderer_name: str
    training_client_args: TinkerTrainingClientArgs


class TinkerNativeArgs(TypedDict, total=False):
    renderer_name: str


class VllmRuntimeArgs(TypedDict, total=False):
    mode: str


class InternalModelConfig(TypedDict, total=False):
    """ART's `_internal_config`: only ``peft_args`` maps (the adapter); the rest is ignored, named once."""

    init_args: InitArgs
    engine_args: EngineArgs
    peft_args: PeftArgs
    trainer_args: TrainerArgs
    tinker_args: TinkerArgs | None
    tinker_native_args: TinkerNativeArgs | None
    trainer_gpu_ids: list[int]
    inference_gpu_ids: list[int]


BackendModelConfig = InternalModelConfig
ModelConfig = InternalModelConfig  # ART 0.1.1-0.1.22's name (`api.get_or_create_model(_config=...)`)


class TrainConfig(TypedDict, total=False):
    """ART's experimental per-step options (``model.train(..., _config=...)``): epsilon, epsilon_high,
    logprob_calculation_chunk_size, scale_rewards, kl_penalty_coef, ppo map; the rest is named once."""

    epsilon: float
    epsilon_high: float | None
    logprob_calculation_chunk_size: int
    scale_rewards: bool
    kl_penalty_coef: float
    ppo: bool
    allow_training_without_logprobs: bool
    precalculate_logprobs: bool


class TrainSFTConfig(TypedDict, total=False):
    metric_logging: dict[str, Any]


class ServerArgs(TypedDict, total=False):
    """vLLM OpenAI server arguments (ignored: the backend's loopback server picks a free port and key)."""

    port: int
    api_key: str


class OpenAIServerConfig(TypedDict, total=False):
    server_args: ServerArgs
    engine_args: EngineArgs


def __getattr__(name: str) -> Any:
    # ART's names that are not provided say why and what to use instead (groupwise.core.compat.NOT_PROVIDED)
    from groupwise.core.compat import not_provided

    raise not_provided("groupwise.art.dev", name)
