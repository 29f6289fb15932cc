"""`BackendOptions`: the settings `LocalBackend` and `RayBackend` share, defined once.

Both backends place the same workers (backend/worker.py) and drive them with the same driver
(backend/driver.py), so the settings of those workers (dtype, LoRA, the engine's batch size, how many
steps stay served, retention, the collective timeout) are one dataclass with one default and one check
each. The backends take its fields as keywords (``gw.LocalBackend(max_batch_size=16)``, as ART
programs and the docs spell them) or whole (``gw.LocalBackend(options=gw.BackendOptions(...))``, as a
job that builds the options once does); `backend.options` is what the driver reads.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from groupwise.backend.base import BEST_CHECKPOINT_METRIC
from groupwise.config import DEFAULT_MAX_BATCH_SIZE, LoraConfig
from groupwise.core.validated import Validated, check_positive, option
from groupwise.errors import ConfigError

__all__ = ["BackendOptions", "placement_problems"]


@dataclass
class BackendOptions(Validated):
    """The settings every worker backend shares (`LocalBackend`, `RayBackend`); each backend takes these
    fields as keywords too. None for `lora` or `engine_kwargs` means the default."""

    dtype: str | None = option(None, help='The base weights\' dtype: "bfloat16", "float32", ... (None: bf16 on CUDA, '
                                           "fp32 on CPU). LoRA weights are fp32 whatever this says.")
    lora: LoraConfig | None = option(default_factory=LoraConfig, help="The adapter's rank, alpha, dropout and target "
                                     "modules; a model built with `TrainableModel(..., config=gw.LoraConfig(...))` "
                                     "uses its own instead.")
    max_batch_size: int = option(DEFAULT_MAX_BATCH_SIZE, help="Sequences each engine decodes together.")
    served_steps: int = option(2, help="How many recent steps stay loaded in the engines (name@k); older ones unload.")
    best_checkpoint_metric: str | None = option(
        BEST_CHECKPOINT_METRIC, help="Retention keeps the latest checkpoint and the best: the one named by "
        "`keep_best` (the loop names it), else the best by this metric (read from the step metrics or from "
        "history.jsonl's val rows); None keeps every checkpoint.")
    verify_adapter: bool = option(True, help="After each step, check every engine serves the new adapter (its LoRA "
                                  "tensors equal the trainer's and a request for the model resolves to name@k).")
    engine_kwargs: dict[str, Any] | None = option(default_factory=dict, help="More `Engine` settings (e.g. "
                                                  "prefix_cache_tokens, batch_invariant); counts are integers >= 0.")
    load_model: Callable[..., Any] | None = option(
        None, help="`(base_model, device=, dtype=) -> (model, tokenizer)` in place of "
        "`groupwise.runtime.loading.load_base_model`. Workers in other processes receive it pickled: a module-level "
        "function of a module they can import.")
    memory_budget_gb: float | None = option(
        None, help="The memory each base model and its runs may use on a device (GB). It is checked against the "
        "device's free memory when the base loads (a MemoryBudgetError, not an out-of-memory crash of another "
        "run on the device) and, on CUDA, caps this process's allocations. None: the estimated least a run "
        "needs (backend/budget.py) is checked, nothing is capped.")
    collective_timeout_s: float = option(
        600.0, help="With several workers: how long a rank waits in a collective (the gradient all-reduce) "
        "for a rank that stopped before raising, and how long the driver waits for a silent worker; a "
        "worker that dies is reported at once.")
    joint_updates: bool = option(
        False, help="Runs of one base on one device whose updates wait at the same time train in one forward and "
        "backward: each run's own micro-batches, packed together where they fit one micro_batch_tokens budget, "
        "each row through its own run's adapter, each run's own loss and optimizer step (the update each would "
        "get alone, to float rounding; training/joint.py), where packing at least halves the micro-batches. Off by "
        "default: on an H200 the pass trained 4 runs' updates 1.39-1.58x faster than in turn, but a lockstep "
        "sweep's train phase did not shorten (the runs' publications, which overlap the next run's update when "
        "they take turns, then queue behind the pass) and its peak memory rose 2.3x (one micro-batch holds every "
        "run's rows); on the CPU the pass measured slower (docs/benchmarks.md). Never under the engine's "
        "batch_invariant mode, nor for updates that cannot join (a KL anchor, a teacher, SFT, several "
        "iterations, compiled layers, LoRA dropout).")
    train_workers: int | None = option(
        None, help="Placement over several workers (devices): the first `train_workers` workers only train "
        "(trainer ranks, gradients summed between them) and the others only generate (engine replicas, no "
        "optimizer), each loading the new adapter from the trainers' checkpoint after every step; rollouts go "
        "to the generators alone. None: every worker does both (data-parallel replicas). docs/scaling.md says "
        "when to split.")

    def __post_init__(self) -> None:
        if self.lora is None:
            self.lora = LoraConfig()
        if self.engine_kwargs is None or isinstance(self.engine_kwargs, dict):
            self.engine_kwargs = dict(self.engine_kwargs or {})  # else problems() names it
        super().__post_init__()

    def problems(self) -> list[str]:
        p: list[str] = []
        check_positive(p, "max_batch_size", self.max_batch_size, integer=True)
        check_positive(p, "served_steps", self.served_steps, integer=True)
        check_positive(p, "collective_timeout_s", self.collective_timeout_s)
        if not isinstance(self.joint_updates, bool):
            p.append(f"joint_updates={self.joint_updates!r} must be True or False")
        if self.memory_budget_gb is not None:
            check_positive(p, "memory_budget_gb", self.memory_budget_gb)
        if self.train_workers is not None:
            if isinstance(self.train_workers, int) and not isinstance(self.train_workers, bool) and self.train_workers < 1:
                p.append(f"train_workers={self.train_workers} leaves no trainer: give 1 or more workers that train "
                         "(the rest generate), or None for every worker to do both")
            else:
                check_positive(p, "train_workers", self.train_workers, integer=True)
        # The engine's numeric settings are all counts of tokens, sequences or bytes.
        engine_kwargs = self.engine_kwargs
        if not isinstance(engine_kwargs, dict):
            p.append(f"engine_kwargs={engine_kwargs!r} must be a dict of Engine settings, e.g. "
                     "{'max_seq_len': 2048} (or None for the defaults)")
            engine_kwargs = {}
        for key, value in engine_kwargs.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                check_positive(p, f"engine_kwargs[{key!r}]", value, allow_zero=True, integer=True)
        if not isinstance(self.lora, LoraConfig):
            p.append(f"lora={self.lora!r} must be a gw.LoraConfig (or None for the default)")
        return p

    @classmethod
    def from_arguments(cls, options: "BackendOptions | None", values: dict[str, Any], *, what: str,
                       problems: list[str] | None = None, workers: int | None = None,
                       workers_arg: str = "devices") -> "BackendOptions":
        """The options a backend was given (`options=`, or its fields as keywords), checked together with
        the backend's own `problems` and with its number of `workers` (None: one device in process;
        `workers_arg` is the argument that sets it): one `ConfigError` lists every invalid argument."""
        found = list(problems or [])
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        if "base_url" in unknown:  # ART's SkyPilotBackend / Backend(base_url): its remote server's URL
            unknown.remove("base_url")
            found.append("base_url is the URL of ART's remote ART server (SkyPilotBackend.initialize_cluster sets it); "
                         "this backend trains in this process: drop base_url, and use `groupwise serve` to reach "
                         "a model over HTTP")
        if unknown:
            found.append(f"unknown argument(s) {', '.join(unknown)}; the backend options are {', '.join(names)}")
        if options is not None and values:
            found.append(f"options= and {', '.join(sorted(values))}: give the options one way (options= or keywords)")
        result = options
        if result is None:
            try:
                result = cls(**{k: v for k, v in values.items() if k in names})
            except ConfigError as err:
                found = err.problems + found
        elif not isinstance(result, cls):
            found.append(f"options={result!r} must be a gw.BackendOptions")
        else:
            found = result.problems() + found
        if isinstance(result, cls):
            found += placement_problems(result.train_workers, workers, workers_arg=workers_arg)
        if found:
            raise ConfigError(found, what=what)
        assert result is not None
        return result


def placement_problems(train_workers: int | None, workers: int | None, *, workers_arg: str) -> list[str]:
    """What is wrong with splitting `workers` workers (None: one device, in process) into `train_workers`
    trainers and the rest generators (`BackendOptions.train_workers`); `workers_arg` names the backend's
    argument that sets the number of workers, so the message says what to change."""
    if train_workers is None or isinstance(train_workers, bool) or not isinstance(train_workers, int) or train_workers < 1:
        return []  # no placement, or an invalid count that BackendOptions.problems reports
    if workers is None:
        return [f"train_workers={train_workers} splits several workers into trainers and generators, but this "
                f"backend runs one device in process: pass {workers_arg} with train_workers + 1 or more workers "
                "(e.g. devices=2, train_workers=1), or leave train_workers None"]
    if train_workers >= workers:
        return [f"train_workers={train_workers} with {workers} worker(s) leaves no generator: rollouts need at "
                f"least one worker that only generates, so use train_workers <= {workers - 1} or more workers "
                f"({workers_arg}), or leave train_workers None (every worker trains and generates)"]
    return []


def spell_out_options(init: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a backend's ``__init__(..., options=None, **values)`` so its signature lists every
    `BackendOptions` field as a keyword: help(), IDEs and `inspect.signature` (the ART API comparison
    among them) see the keywords the backend takes, while the fields stay defined once."""
    sig = inspect.signature(init)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    for f in dataclasses.fields(BackendOptions):
        default = None if f.default is dataclasses.MISSING else f.default  # a default_factory's field: None
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=f.type))
    init.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return init
