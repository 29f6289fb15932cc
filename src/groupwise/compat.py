"""Arguments of ART's API that have no meaning in groupwise: accepted, and named once in a warning.

Ported ART code passes options of ART's own machinery (Unsloth init arguments, vLLM engine
arguments, W&B settings, ...). Rejecting them would stop the port at the first call; ignoring them
silently would hide that they do nothing here. So each is accepted and named in one warning per
(place, argument) per process. Filter `ArtCompatWarning` to silence them, or turn it into an error
(``warnings.simplefilter("error", ArtCompatWarning)``) to find every one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from groupwise.config import TrainConfig
from groupwise.errors import ArtCompatWarning, ConfigError, warn_ignored

# ArtCompatWarning and warn_ignored live in errors.py, which config.py imports too (no cycle).
__all__ = ["ArtCompatWarning", "IGNORED_TRAIN_OPTIONS", "INTERNAL_TRAIN_FIELDS", "internal_config_settings",
           "train_config_from_art", "warn_ignored"]


# ART's training options (`backend.train(model, groups, **options)`, `model.train(..., _config={...})`,
# `art.dev.TrainConfig`) -> groupwise `TrainConfig` fields. A value maps to a field, possibly converted;
# the names in IGNORED_TRAIN_OPTIONS are accepted and named once in a warning.
_TRAIN_OPTION_FIELDS: dict[str, tuple[str, Any]] = {
    "learning_rate": ("learning_rate", float),
    "kl_penalty_coef": ("kl_coef", float),
    "beta": ("kl_coef", float),
    "kl_penalty_reference_step": ("kl_reference_step", lambda v: None if v is None else int(v)),
    "epsilon": ("epsilon", float),
    "epsilon_high": ("epsilon_high", lambda v: None if v is None else float(v)),
    "scale_rewards": ("scale_rewards", bool),
    "normalize_advantages": ("scale_rewards", bool),
    "logprob_calculation_chunk_size": ("logprob_chunk_size", int),
    "loss_fn": ("loss", str),
    "ppo": ("loss", lambda v: "ppo" if v else "cispo"),
    "max_seq_length": ("max_seq_len", int),
}
IGNORED_TRAIN_OPTIONS = frozenset({
    "advantage_balance", "allow_training_without_logprobs", "importance_sampling_level", "kimi_k2_tau",
    "mask_prob_ratio", "max_negative_advantage_importance_sampling_weight", "plot_tensors",
    "precalculate_logprobs", "truncated_importance_sampling", "scale_learning_rate_by_reward_std_dev",
    "num_trajectories_learning_rate_multiplier_power", "kl_ref_adapter_path",
    "kl_penalty_source", "kl_penalty_step_lag", "packed_sequence_length", "save_checkpoint", "loss_fn_config",
    "adam_params", "optimizer_save_interval", "final_training_step", "grad_accumulation_sequences",
    "moe_routing_replay_bundle", "moe_routing_replay_path", "moe_routing_replay_strict", "verbose",
})


# ART's `_internal_config` settings (``section.key``) that have a groupwise meaning -> `TrainConfig` fields.
# ART's trainer reads them once per model (trainer_args are its TRL trainer's arguments); here they are the
# model's values for those fields, used by every step whose config leaves the field at its default.
# ``use_gradient_checkpointing`` is Unsloth's ("unsloth" or a bool): any true value turns it on.
INTERNAL_TRAIN_FIELDS: dict[str, tuple[str, Any]] = {
    "trainer_args.max_grad_norm": ("max_grad_norm", float),
    "trainer_args.weight_decay": ("weight_decay", float),
    "trainer_args.seed": ("seed", int),
    "trainer_args.gradient_checkpointing": ("gradient_checkpointing", bool),
    "init_args.max_seq_length": ("max_seq_len", int),
    "init_args.use_gradient_checkpointing": ("gradient_checkpointing", bool),
    "peft_args.use_gradient_checkpointing": ("gradient_checkpointing", bool),
    "peft_args.max_seq_length": ("max_seq_len", int),
}
# ART's adapter keys: ``peft_args`` (ART <= 0.5.17) and ``lora_config`` (0.5.2x) -> `LoraConfig` fields.
PEFT_ARGS_FIELDS = {"r": "rank", "lora_alpha": "alpha", "lora_dropout": "dropout", "target_modules": "target_modules",
                    "random_state": "seed"}
LORA_CONFIG_FIELDS = {"rank": "rank", "alpha": "alpha", "dropout": "dropout", "target_modules": "target_modules",
                      "random_state": "seed"}
# Ignored `_internal_config` settings for which groupwise has another way: the warning says which.
_INSTEAD: dict[str, str] = {
    "trainer_args.learning_rate": "each step's learning_rate replaces it, in ART too: pass learning_rate to train()",
    "trainer_args.per_device_train_batch_size": "a step trains on all its groups; TrainConfig(micro_batch_tokens=...) "
                                                "sizes its micro-batches",
    "trainer_args.gradient_accumulation_steps": "a step accumulates over all its micro-batches; "
                                                "TrainConfig(micro_batch_tokens=...) sizes them",
    "engine_args.max_num_seqs": "use LocalBackend(max_batch_size=...)",
    "engine_args.dtype": "use LocalBackend(dtype=...)",
    "init_args.dtype": "use LocalBackend(dtype=...)",
    "engine_args.enable_prefix_caching": "use LocalBackend(engine_kwargs={'prefix_cache_tokens': ...})",
    "trainer_gpu_ids": "use LocalBackend(device=...) or LocalBackend(devices=[...])",
    "inference_gpu_ids": "use LocalBackend(device=...) or LocalBackend(devices=[...])",
}
_NO_COUNTERPART = "Unsloth, vLLM, TRL and Tinker settings of ART's backends, which groupwise does not run"


def internal_config_settings(internal: Mapping[str, Any] | None, *, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ART's `_internal_config` means here: (``peft_args`` as given, `TrainConfig` values by field).
    Every other setting is named once in an `ArtCompatWarning`, with what to use instead where there is
    something; ``peft_args`` keys that are not adapter settings are named by `lora_updates`."""
    internal = dict(internal or {})
    peft = dict(internal.get("peft_args") or {})
    train: dict[str, Any] = {}
    ignored: list[str] = []
    for section, value in internal.items():
        if value is None or value == {} or value == []:
            continue
        if not isinstance(value, Mapping):
            ignored.append(section)
            continue
        for key, item in value.items():
            name = f"{section}.{key}"
            if name in INTERNAL_TRAIN_FIELDS:
                field, convert = INTERNAL_TRAIN_FIELDS[name]
                train[field] = convert(item)
            elif not (section == "peft_args" and key in PEFT_ARGS_FIELDS):
                ignored.append(name)
    by_hint: dict[str, list[str]] = {}
    for name in ignored:
        by_hint.setdefault(_INSTEAD.get(name, _NO_COUNTERPART), []).append(name)
    for hint, names in by_hint.items():
        warn_ignored(where, names, hint, stacklevel=4)
    return peft, train


def train_config_from_art(config: Any, options: dict[str, Any], *, where: str,
                          model_settings: Mapping[str, Any] | None = None) -> Any:
    """A groupwise `TrainConfig` from an ART training call: `config` (a groupwise `TrainConfig`, an
    object with ART's `learning_rate`/`beta`/`kl_penalty_coef`, a dict, or None) updated by `options`
    (ART's keyword arguments or ``_config`` dict). Unknown names are an error; ignored ones warn once.
    `model_settings` (`TrainableModel.train_defaults()`: TrainConfig values from ART's
    `_internal_config`) fill the fields that neither `options` nor `config` set away from the default."""
    if isinstance(config, TrainConfig):
        values = dataclasses.asdict(config)
    elif config is None:
        values = {}
    else:  # ART's pydantic TrainConfig or a dict of its fields
        raw = config if isinstance(config, dict) else getattr(config, "__dict__", {})
        values, options = {}, {**{k: v for k, v in raw.items() if v is not None}, **options}
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    ignored, unknown = [], []
    for name, value in options.items():
        if name in _TRAIN_OPTION_FIELDS:
            target, convert = _TRAIN_OPTION_FIELDS[name]
            values[target] = convert(value)
        elif name in fields:
            values[name] = value
        elif name in IGNORED_TRAIN_OPTIONS:
            if name != "verbose" or value:
                ignored.append(name)
        else:
            unknown.append(name)
    if unknown:
        raise ConfigError([f"unknown training option {n!r}: neither a groupwise TrainConfig field nor an ART option "
                           f"(see docs/porting-from-art.md)" for n in unknown], what=f"{where} arguments")
    if ignored:
        warn_ignored(where, ignored, stacklevel=4)
    given = {_TRAIN_OPTION_FIELDS[n][0] if n in _TRAIN_OPTION_FIELDS else n for n in options}
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for field, value in (model_settings or {}).items():
        if field not in given and values.get(field, defaults[field]) == defaults[field]:
            values[field] = value
    return TrainConfig(**values)
