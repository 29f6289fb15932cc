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

from groupwise.config import LoraConfig, TrainConfig
from groupwise.errors import ArtCompatWarning, ConfigError, warn_art_difference, warn_ignored
from groupwise.core.validated import SetValues, fields_set

# ArtCompatWarning and warn_ignored live in errors.py, which config.py imports too (no cycle).
__all__ = ["ArtCompatWarning", "IGNORED_TRAIN_OPTIONS", "INTERNAL_TRAIN_FIELDS", "KNOWN_TRAIN_OPTIONS", "internal_config_settings",
           "merge_lora", "resolve_train_config", "is_resolved", "train_config_from_art", "warn_ignored", "ART_BACKEND_TRAIN_LOSS", "ART_LEARNING_RATE",
           "init_signature_from_fields", "with_art_keywords", "ART_LOCAL_TRAIN_KEYWORDS", "ART_SERVERLESS_TRAIN_KEYWORDS",
           "NOT_PROVIDED", "not_provided"]


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
# ART's default rate of a GRPO step (art.TrainConfig, backend.train; 0.3.13 - 0.5.18): named when a step
# runs on groupwise's own default instead.
ART_LEARNING_RATE = 5e-6
# ART 0.5's backend.train(model, groups) loss (its model.train of 0.3 - 0.4 clipped a PPO ratio, as groupwise's default)
ART_BACKEND_TRAIN_LOSS = "cispo"

IGNORED_TRAIN_OPTIONS = frozenset({
    "advantage_balance", "allow_training_without_logprobs", "importance_sampling_level", "kimi_k2_tau",
    "mask_prob_ratio", "max_negative_advantage_importance_sampling_weight", "plot_tensors",
    "precalculate_logprobs", "truncated_importance_sampling", "scale_learning_rate_by_reward_std_dev",
    "num_trajectories_learning_rate_multiplier_power", "kl_ref_adapter_path",
    "kl_penalty_source", "kl_penalty_step_lag", "packed_sequence_length", "save_checkpoint", "loss_fn_config",
    "adam_params", "optimizer_save_interval", "final_training_step", "grad_accumulation_sequences",
    "moe_routing_replay_bundle", "moe_routing_replay_path", "moe_routing_replay_strict", "verbose",
})
KNOWN_TRAIN_OPTIONS = frozenset(_TRAIN_OPTION_FIELDS) | IGNORED_TRAIN_OPTIONS
# ART's defaults of the ignored options. ART 0.5's `backend.train` spells every option out, so ported code
# passes them through; at ART's default (or None: not given) an option changes nothing in ART's run either,
# so it is not named. Only a value that would have changed ART's training is.
_IGNORED_OPTION_DEFAULTS: dict[str, Any] = {
    "advantage_balance": 0.0, "allow_training_without_logprobs": False, "importance_sampling_level": "token",
    "mask_prob_ratio": False, "plot_tensors": False, "precalculate_logprobs": False,
    "scale_learning_rate_by_reward_std_dev": False, "num_trajectories_learning_rate_multiplier_power": 0.0,
    "save_checkpoint": True, "verbose": False,
}
# What to use instead, for the ignored options that have something close here.
_OPTION_INSTEAD: dict[str, str] = {
    "kl_ref_adapter_path": "use kl_reference_step=<a checkpoint step of this run> to anchor the KL term",
    "packed_sequence_length": "TrainConfig(micro_batch_tokens=...) sizes the micro-batches",
    "grad_accumulation_sequences": "a step accumulates over all its micro-batches; TrainConfig(micro_batch_tokens=...) "
                                   "sizes them",
    "save_checkpoint": "every step is checkpointed; LocalBackend(best_checkpoint_metric=...) and "
                       "model.delete_checkpoints() prune",
    "adam_params": "TrainConfig(learning_rate=..., weight_decay=...) set the AdamW step",
    "allow_training_without_logprobs": "groupwise trains on the sampled token ids its server returns",
}


# ART's `_internal_config` settings (``section.key``) that have a groupwise meaning -> `TrainConfig` fields.
# ART's trainer reads them once per model (trainer_args are its TRL trainer's arguments); here they are the
# model's values for those fields, used by every step whose config does not set the field (`resolve_train_config`).
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


def merge_lora(default: LoraConfig, config: Any, lora_config: Any, peft_args: Mapping[str, Any] | None) -> LoraConfig:
    """A trainable model's adapter settings: `default` (the backend's) overridden by its ``config`` (a
    LoraConfig), ART's ``lora_config`` (a dict or LoraConfig) and ``_internal_config["peft_args"]``, in
    that order. A key of ``lora_config`` with no LoraConfig counterpart is named in a warning
    (``peft_args``' were named by `internal_config_settings`)."""
    lora = config if isinstance(config, LoraConfig) else default
    updates: dict[str, Any] = {}
    for source, names in ((lora_config, LORA_CONFIG_FIELDS), (peft_args, PEFT_ARGS_FIELDS)):
        if isinstance(source, LoraConfig):
            lora = source
            continue
        for key, value in dict(source or {}).items():
            if key in names:
                updates[names[key]] = tuple(value) if key == "target_modules" else value
            elif names is LORA_CONFIG_FIELDS:
                warn_ignored("TrainableModel LoRA settings", [key])
    return dataclasses.replace(lora, **updates) if updates else lora


def resolve_train_config(config: Any, options: Mapping[str, Any], *, where: str,
                         model_settings: Mapping[str, Any] | None = None, arts_loss: str | None = None) -> TrainConfig:
    """The one resolution of a GRPO step's settings, at the API edge the caller used (`model.train`, or
    `backend.train` called directly): every spelling of a setting meets here, once.

    Layers, lowest first: groupwise's defaults; the model's own settings (`model_settings`:
    `TrainableModel.train_defaults()`, from ART's `_internal_config`), which fill only what the step does
    not set; what the step's caller SET: the fields of `config` its caller set (`model_fields_set`: a
    groupwise `TrainConfig`; an ART-style object or dict sets its non-None fields) and `options` (ART's
    keyword arguments or ``_config`` dict, by ART's or groupwise's names). Two of those setting one field
    to different values is a ConfigError naming both, never a silent override. Unknown option names are
    an error; ignored ones warn once. A step on a default ART's differs on (the rate; with `arts_loss`,
    ART's default loss of this call) that nobody chose is named once in an `ArtCompatWarning`.

    The result records what was set (the step's fields and the model's), and is marked resolved: a
    backend handed it does not resolve it again (`is_resolved`)."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    step = SetValues(f"{where} arguments")
    given: list[tuple[str, Any, str]] = []  # (name, value, where it was set), ART's names or groupwise's
    if isinstance(config, TrainConfig):
        for name in sorted(fields_set(config)):
            step.set(name, getattr(config, name), f"config.{name}")
    elif config is not None:  # ART's pydantic TrainConfig or a dict of its fields: set as options are
        raw = config if isinstance(config, Mapping) else getattr(config, "__dict__", {})
        given += [(k, v, f"config.{k}") for k, v in raw.items() if v is not None and not k.startswith("_")]
    given += [(k, v, k) for k, v in options.items()]
    ignored, unknown = [], []
    for name, value, source in given:
        if name in _TRAIN_OPTION_FIELDS:
            target, convert = _TRAIN_OPTION_FIELDS[name]
            if value is None and convert in (float, int, bool, str):
                continue  # ART's None: not given (e.g. backend.train(..., epsilon=None)), the default applies
            step.set(target, convert(value), source)
        elif name in fields:
            step.set(name, value, source)
        elif name in IGNORED_TRAIN_OPTIONS:
            if value is not None and (name not in _IGNORED_OPTION_DEFAULTS or value != _IGNORED_OPTION_DEFAULTS[name]):
                ignored.append(name)
        else:
            unknown.append(name)
    if unknown:
        raise ConfigError([f"unknown training option {n!r}: neither a groupwise TrainConfig field nor an ART option "
                           f"(see docs/porting-from-art.md)" for n in unknown], what=f"{where} arguments")
    by_hint: dict[str, list[str]] = {}
    for name in ignored:
        by_hint.setdefault(_OPTION_INSTEAD.get(name, ""), []).append(name)
    for hint, names in by_hint.items():
        warn_ignored(where, names, hint, stacklevel=4)
    values = {**{k: v for k, v in (model_settings or {}).items() if k not in step}, **step.values}
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    if "learning_rate" not in values:
        warn_art_difference(
            where, "learning_rate",
            f"no learning_rate was given, so groupwise's default {defaults['learning_rate']:g} applies; ART's "
            f"default is {ART_LEARNING_RATE:g}, half of it. Pass learning_rate= (TrainConfig(learning_rate=...), or "
            "backend.train(..., learning_rate=...)) to choose the rate", stacklevel=4)
    if arts_loss is not None and config is None and "loss" not in step and values.get("loss", defaults["loss"]) != arts_loss:
        warn_art_difference(
            where, "loss",
            f"no loss_fn was given, so groupwise's default loss {values.get('loss', defaults['loss'])!r} applies; "
            f"ART's {where} defaults to {arts_loss!r}. Pass loss_fn= to choose it", stacklevel=4)
    resolved = TrainConfig(**values)
    object.__setattr__(resolved, _RESOLVED, _field_values(resolved))
    return resolved


_RESOLVED = "_resolved_as"  # the field values `resolve_train_config` gave a TrainConfig


def _field_values(config: TrainConfig) -> tuple[Any, ...]:
    return tuple(getattr(config, f.name) for f in dataclasses.fields(config))


def is_resolved(config: Any) -> bool:
    """Whether `config` is what `resolve_train_config` returned, unchanged since (a field assigned
    afterwards makes it the caller's config again, resolved at the next edge)."""
    return isinstance(config, TrainConfig) and config.__dict__.get(_RESOLVED) == _field_values(config)


train_config_from_art = resolve_train_config  # the name callers used before the resolution was one function


# -- signatures as ART's ----------------------------------------------------------------------------------
# Programs check the API they run on by introspection (``inspect.signature(art.Model.__init__)``, a test
# that the backend's ``train`` takes ``learning_rate``). Where groupwise accepts ART's arguments through
# ``**kwargs`` (pydantic fields, ART's training options), its signature names them too, so introspection
# sees what a call may pass; the call itself goes through the same code as before.

def init_signature_from_fields(cls: type) -> type:
    """Give a pydantic model's own ``__init__`` (which takes the fields through ``**fields``) the class's
    signature, where pydantic lists every field: ``inspect.signature(cls.__init__)`` names them all."""
    import inspect

    init = cls.__dict__["__init__"]
    sig = inspect.signature(cls)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    init.__signature__ = sig.replace(parameters=[self_param, *sig.parameters.values()])
    return cls


def with_art_keywords(**defaults: Any) -> Any:
    """Decorate a function taking ART's options through ``**options``: its signature lists them as
    keyword-only parameters (with `defaults`: ART's where groupwise's effective default is the same,
    None where None means "not given, groupwise's default applies"), before the ``**options``."""
    import inspect

    def decorate(fn: Any) -> Any:
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        var_kw = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
        head = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
        names = {p.name for p in head}
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=value)
                 for name, value in defaults.items() if name not in names]
        fn.__signature__ = sig.replace(parameters=[*head, *added, *var_kw])
        return fn

    return decorate


# ART 0.5's `LocalBackend.train` / `ServerlessBackend.train` keywords. The defaults are ART's where they are
# groupwise's effective ones too; None for the options whose unset default differs (learning_rate, loss_fn,
# ppo, logprob_calculation_chunk_size: a step that sets none of them is named in a warning).
ART_LOCAL_TRAIN_KEYWORDS: dict[str, Any] = {  # ART 0.5.9 - 0.5.17 had `beta` and `ppo` too
    "learning_rate": None, "beta": 0.0, "ppo": None, "loss_fn": None, "loss_fn_config": None, "normalize_advantages": True,
    "adam_params": None, "kl_penalty_coef": 0.0, "kl_penalty_reference_step": None, "kl_ref_adapter_path": None,
    "epsilon": None, "epsilon_high": None, "advantage_balance": 0.0, "scale_rewards": True,
    "importance_sampling_level": "token", "max_negative_advantage_importance_sampling_weight": None,
    "mask_prob_ratio": False, "kimi_k2_tau": None, "precalculate_logprobs": False,
    "allow_training_without_logprobs": False, "plot_tensors": False, "truncated_importance_sampling": None,
    "scale_learning_rate_by_reward_std_dev": False, "logprob_calculation_chunk_size": None,
    "packed_sequence_length": None, "num_trajectories_learning_rate_multiplier_power": 0.0,
    "save_checkpoint": True, "verbose": False,
}
ART_SERVERLESS_TRAIN_KEYWORDS: dict[str, Any] = {
    "learning_rate": None, "beta": 0.0, "ppo": None, "epsilon": None, "epsilon_high": None, "advantage_balance": 0.0,
    "scale_rewards": True, "importance_sampling_level": "token",
    "max_negative_advantage_importance_sampling_weight": None, "mask_prob_ratio": False, "kimi_k2_tau": None,
    "precalculate_logprobs": False, "verbose": False,
}


# -- ART's names that groupwise does not provide ------------------------------------------------------------
# An ART program that reaches one gets an `ArtNameNotProvided` (an AttributeError, so ``hasattr`` and
# ``getattr(x, name, default)`` feature probes still work) that says why and what to use instead, not a
# bare "has no attribute". Keys: ``<groupwise module or class>.<name>`` as `not_provided` is asked.
_COSTS = ("GPU and API cost accounting of ART's backends; groupwise reports judge cost in `judge/*` metrics and a "
          "program's own costs through `model.metrics_builder().add_cost(...)`")
_ADAPTERS = ("internals of ART's vLLM adapter management; groupwise's engine loads and unloads adapters itself: "
             "`backend.hold_steps(model, steps)` keeps steps served, `backend.serve_step(model, step)` serves one")
NOT_PROVIDED: dict[str, str] = {
    "groupwise.TinkerBackend": "ART 0.5.6-0.5.7's backend for Thinking Machines' hosted Tinker training; groupwise "
                               "trains on this machine: use `LocalBackend()` (or `RayBackend` for several GPUs)",
    "groupwise.art.dev.TorchtuneArgs": "torchtune is not used; `_internal_config` keys without a counterpart are named "
                                   "in an ArtCompatWarning",
    "groupwise.art.dev.get_model_config": "ART's builder of Unsloth/vLLM settings; pass `_internal_config` to "
                                      "TrainableModel, groupwise reads it (`groupwise.core.compat.internal_config_settings`)",
    "groupwise.art.dev.get_openai_server_config": "ART's builder of its vLLM server settings; the backend's server picks "
                                              "its port and key (`model.inference_base_url`)",
    "groupwise.art.dev.is_dedicated_mode": "ART's split of GPUs between vLLM and the trainer; use LocalBackend(devices=...)",
    "groupwise.art.dev.validate_dedicated_config": "ART's split of GPUs between vLLM and the trainer; use "
                                               "LocalBackend(devices=...)",
    "groupwise.art.utils.record_provenance": "ART's W&B artifact provenance; groupwise's W&B run is the model's "
                                         "(`groupwise.runs.wandb_log`), its checkpoints are PEFT folders of the run",
    "groupwise.art.utils.benchmarking.load_trajectories.cache_path": "the path of ART's DuckDB cache of Parquet reads; "
                                                                "groupwise reads its JSON-lines store directly and "
                                                                "keeps no cache (pass a fresh `load_trajectories` call)",
    "LocalBackend.adapter_lease": _ADAPTERS,
    "LocalBackend.prune_model_adapters": _ADAPTERS,
    "LocalBackend.automatic_gpu_cost_per_hour_usd": _COSTS,
    "LocalBackend.supports_automatic_train_step_metrics": "ART's hook for its own step metrics; groupwise's `train` "
                                                          "returns them in `TrainResult.metrics`",
}


def not_provided(owner: str, name: str) -> AttributeError:
    """The error for `owner`.`name`: an `ArtNameNotProvided` saying why when it is one of ART's names
    (NOT_PROVIDED), else Python's own AttributeError."""
    from groupwise.errors import ArtNameNotProvided

    reason = NOT_PROVIDED.get(f"{owner}.{name}")
    module = owner.startswith("groupwise")
    if reason is None:
        return AttributeError(f"module {owner!r} has no attribute {name!r}" if module
                              else f"{owner!r} object has no attribute {name!r}")
    # ART's path: `groupwise` is what ART programs import as `art`, and `groupwise.art.dev` is `art.dev`
    shim = owner == "groupwise.art" or owner.startswith("groupwise.art.")
    art = "art" + owner.removeprefix("groupwise.art" if shim else "groupwise") if module else f"ART's {owner}"
    return ArtNameNotProvided(f"{art}.{name} is not provided by groupwise: {reason} (docs/porting-from-art.md, "
                              "Checked differences)")
