"""Arguments of ART's API that have no meaning in groupwise: accepted, and named once in a warning.

Ported ART code passes options of ART's own machinery (Unsloth init arguments, vLLM engine
arguments, W&B settings, ...). Rejecting them would stop the port at the first call; ignoring them
silently would hide that they do nothing here. So each is accepted and named in one warning per
(place, argument) per process. Filter `ArtCompatWarning` to silence them, or turn it into an error
(``warnings.simplefilter("error", ArtCompatWarning)``) to find every one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from groupwise.config import TrainConfig
from groupwise.errors import ArtCompatWarning, ConfigError, warn_ignored

# ArtCompatWarning and warn_ignored live in errors.py, which config.py imports too (no cycle).
__all__ = ["ArtCompatWarning", "IGNORED_TRAIN_OPTIONS", "train_config_from_art", "warn_ignored"]


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


def train_config_from_art(config: Any, options: dict[str, Any], *, where: str) -> Any:
    """A groupwise `TrainConfig` from an ART training call: `config` (a groupwise `TrainConfig`, an
    object with ART's `learning_rate`/`beta`/`kl_penalty_coef`, a dict, or None) updated by `options`
    (ART's keyword arguments or ``_config`` dict). Unknown names are an error; ignored ones warn once."""
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
    return TrainConfig(**values)
