"""Config dataclasses: one per entry point, help text on every field, all problems reported at once.

Each config is a frozen-free dataclass whose fields carry ``metadata={"help": ...}``; `describe()`
prints them (the CLI uses the same text). `__post_init__` runs `problems()` and raises one
`ConfigError` listing every invalid value, so a user fixes a config in one go.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from dataclasses import InitVar, dataclass
from typing import Any, Literal, get_args

from groupwise.errors import ConfigError, warn_ignored
from groupwise.core.validated import (
    SetValues, Validated, check_choice, check_fraction, check_number, check_positive, check_seed, field_default, fields_set,
    is_number, option, records_set_fields, replace_set,
)


DEFAULT_BASE_MODEL = "smollm2-135m"  # what a TrainableModel and the CLI's jobs start from when none is named
DEFAULT_RUN_STORE = ".groupwise"  # the run store folder, relative to the working directory
DEFAULT_PROJECT = "default"  # the project a model belongs to when none is named (ART's)
DEFAULT_MAX_BATCH_SIZE = 32  # sequences an engine decodes together (the engine's, every backend's, `groupwise serve`'s)
# Where an engine runs (inference/engine_core.py): in the process of its frontends, in a core process of its
# own fed over ZeroMQ, or "auto" (in process on the CPU, separate with several frontends on CUDA): `groupwise serve`'s setting.
EngineProcess = Literal["auto", "in_process", "separate"]
ENGINE_PROCESS_CHOICES: tuple[str, ...] = get_args(EngineProcess)
DEFAULT_ENGINE_PROCESS = "auto"
# How many frontend processes (each the whole HTTP app) feed the engine core: a count, or "auto" (engine_core.py's
# `resolve_engine_process` says what it picks and why): `groupwise serve`'s setting.
DEFAULT_FRONTENDS = "auto"


def frontends_problem(value: object) -> str | None:
    """A frontends setting: "auto" or a whole number from 1."""
    text = str(value)
    if text == "auto" or (text.isascii() and text.isdigit() and int(text) >= 1):
        return None
    return f"must be 'auto' or a whole number of processes from 1 (e.g. 4), got {value!r}"


# Padded tokens of one micro-batch, of a GRPO step and of an SFT update, where the config leaves it to the device
# (`micro_batch_tokens=None`): on CUDA a small model's update is bound by launching kernels, so fewer, larger
# micro-batches train faster (an H200, 0.5B: 64 rows of ~160 tokens 2.3x faster at 16,384 than at 4,096 tokens;
# docs/benchmarks.md), and the budget is halved until the step's priced peak fits the free memory
# (training/step_memory.py). Elsewhere 4,096: on the CPU the work per token is the same at any size and memory is
# what is short, and on other devices (MPS) the free memory cannot be read, so nothing would halve a budget too large.
MICRO_BATCH_TOKENS_BY_DEVICE = {"cuda": 16384}
MICRO_BATCH_TOKENS_ELSEWHERE = 4096
CPU_MICRO_BATCH_TOKENS = 512  # the CPU job's micro-batch (jobs/train_setup.py says why), which budget.py counts on
DEFAULT_MAX_GRAD_NORM = 1.0  # the global gradient norm an update is clipped to, GRPO and SFT alike
DISTILL_ESTIMATES = ("sampled", "topk")  # TrainConfig.distill_estimate: how the reverse KL to a teacher is estimated
DEFAULT_LOGPROB_CHUNK_SIZE = 1024  # positions per log-softmax chunk, of a GRPO step and of an SFT update
DEFAULT_ASSISTANT_TURNS = "all"  # the assistant turns SFT trains on: every one ('last': only the last)
DEFAULT_VAL_METRIC = "accuracy"  # the validation metric a loop, its detectors and stopping rules read
DEFAULT_CONFIDENCE = 0.95  # the confidence level of every interval: validations, curves, judge evaluations


def micro_batch_tokens_for(setting: int | None, device_type: str) -> int:
    """The token budget of a micro-batch on a device of `device_type` ("cpu", "cuda", ...): `setting`, or
    where it is None the device's default (`MICRO_BATCH_TOKENS_BY_DEVICE`)."""
    if setting is not None:
        return setting
    return MICRO_BATCH_TOKENS_BY_DEVICE.get(device_type, MICRO_BATCH_TOKENS_ELSEWHERE)


# Judge evaluation (`groupwise judge eval`, `gw.judge.evaluate_judges`, `select_judge`): here, not in
# groupwise.judge, so the CLI shows them without importing the judge (and its clients).
DEFAULT_MARGIN = 0.05  # a judge clears the bar when its pairwise accuracy's lower bound exceeds 0.5 + this
# The margin's range: below 0 the bar is under chance, from 0.5 on no accuracy clears it.
MARGIN_BOUNDS: dict[str, Any] = {"low": 0.0, "high": 0.5, "high_open": True}
DEFAULT_ORDERS = 2  # orders each group is judged in: seeded, reversed, then further seeds
DEFAULT_REPEATS = 2  # identical requests per group, for self-consistency
DEFAULT_MAX_CONCURRENT = 4  # requests in flight per judge
DEFAULT_JUDGE_TIMEOUT_S = 120.0  # seconds one judge request may take before it counts as a timeout


@dataclass
class LoraConfig(Validated):
    """The LoRA adapter a `LocalBackend` trains (`gw.LocalBackend(lora=gw.LoraConfig(rank=16))`)."""

    rank: int = option(8, help="LoRA rank r: the adapter's inner dimension.")
    alpha: float = option(16.0, help="LoRA alpha: the update is scaled by alpha / rank.")
    dropout: float = option(0.0, help="Dropout on the adapter's input (0 keeps a step deterministic).")
    target_modules: tuple[str, ...] = option(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        help="Names of the linear layers that get an adapter (all attention and MLP projections of Llama/Qwen).",
    )
    seed: int = option(0, help="Seed of the adapter's random init (lora_A), so two runs of one config start identical.")

    def problems(self) -> list[str]:
        p: list[str] = []
        check_positive(p, "rank", self.rank, integer=True)
        check_positive(p, "alpha", self.alpha)
        check_number(p, "dropout", self.dropout, low=0, high=1, high_open=True)
        check_seed(p, "seed", self.seed)
        if not self.target_modules:
            p.append("target_modules is empty; name at least one linear layer (e.g. 'q_proj')")
        return p


def _ignoring_unknown_keywords(cls: type) -> type:
    """ART's TrainConfig and TrainSFTConfig are pydantic models, which drop a keyword they do not know
    (``TrainConfig(batch_size=1)`` runs on ART): here such a keyword is dropped too, named in a warning
    with the setting it may have meant, instead of a TypeError that stopped the ported program."""
    init = cls.__init__
    known = set(cls.__dataclass_fields__)  # the fields and the InitVars (ART's other names)

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        unknown = sorted(k for k in kwargs if k not in known)
        for name in unknown:
            kwargs.pop(name)
        if unknown:
            close = {n: difflib.get_close_matches(n, sorted(known), n=1) for n in unknown}
            hints = "; ".join(f"{n}: did you mean {m[0]}?" for n, m in close.items() if m)
            warn_ignored(cls.__name__, unknown, "not one of its settings; ART's pydantic config drops unknown "
                         "keywords silently" + (f"; {hints}" if hints else ""))
        init(self, *args, **kwargs)  # records what the caller set (`records_set_fields`)

    cls.__init__ = __init__
    return cls


@dataclass
class UpdateSettings(Validated):
    """What every optimizer update reads, a GRPO step's (`TrainConfig`) and each of a supervised step's
    (`TrainSFTConfig`): the learning rate and the settings below, each declared once here. The two
    configs add their own; a supervised step hands each of its updates these settings with the batch's
    rate (`TrainSFTConfig.update_config`), without copying them field by field."""

    learning_rate: float = option(1e-5, help="AdamW learning rate of the LoRA parameters.")
    max_grad_norm: float = option(DEFAULT_MAX_GRAD_NORM, help="Clip the global gradient norm of each update to this value (0 disables clipping).")
    weight_decay: float = option(0.0, help="AdamW weight decay.")
    micro_batch_tokens: int | None = option(None, help="Token budget of one micro-batch (padded tokens); an update accumulates gradients over its micro-batches. None: by the device, 16384 on CUDA (halved until the step fits the free memory) and 4096 elsewhere.")
    max_seq_len: int = option(2048, help="Sequences longer than this many tokens are dropped from the update (counted in the metrics).")
    logprob_chunk_size: int = option(DEFAULT_LOGPROB_CHUNK_SIZE, help="Positions per chunk when computing log-softmax, so a 150k vocabulary does not hold [T, V] at once.")
    gradient_checkpointing: bool = option(False, help="Recompute each decoder layer in the backward instead of storing its activations: about 1/3 more compute, far less memory (long sequences, long tool-using transcripts, big micro-batches).")
    seed: int = option(0, help="Seed of the update's RNG (dropout); micro-batches are not shuffled (sorted by length), so a step is reproducible on resume.")

    def problems(self) -> list[str]:
        """The shared settings' problems (the learning rate is checked by each config: SFT takes a list)."""
        p: list[str] = []
        check_positive(p, "max_grad_norm", self.max_grad_norm, allow_zero=True)
        check_positive(p, "weight_decay", self.weight_decay, allow_zero=True)
        if self.micro_batch_tokens is not None:
            check_positive(p, "micro_batch_tokens", self.micro_batch_tokens, integer=True)
        check_positive(p, "max_seq_len", self.max_seq_len, integer=True)
        check_positive(p, "logprob_chunk_size", self.logprob_chunk_size, integer=True)
        check_seed(p, "seed", self.seed)
        return p


UPDATE_SETTINGS = tuple(f.name for f in dataclasses.fields(UpdateSettings))


@_ignoring_unknown_keywords
@records_set_fields(aliases={"beta": "kl_coef", "kl_penalty_coef": "kl_coef"})
@dataclass
class TrainConfig(UpdateSettings):
    """Settings of one GRPO step (`await model.train(groups, config=TrainConfig(...))`): the update
    settings every optimizer update shares (`UpdateSettings`), then GRPO's own. It records which
    fields its caller set (`model_fields_set`): a step's settings are resolved by that
    (`groupwise.core.compat.resolve_train_config`), never by comparing a value with its default."""

    loss: str = option("ppo", help="'ppo': clipped importance ratio (GRPO/DAPO); 'cispo': clipped, stop-gradient weight on log-prob (CISPO).")
    epsilon: float = option(0.2, help="Lower clip: the ratio is clipped to [1 - epsilon, 1 + epsilon_high].")
    epsilon_high: float | None = option(0.28, help="Upper clip (DAPO's clip-higher). None means epsilon.")
    kl_coef: float = option(0.0, help="Weight of the k3 KL penalty against the reference policy (kl_reference_step: the base model, or a checkpoint of the run). 0 disables it and skips the reference pass.")
    kl_reference_step: int | None = option(None, help="The checkpoint step whose adapter anchors the KL term (e.g. the last SFT step of a warm start, so GRPO is not pulled back from what SFT taught); retention keeps that checkpoint while the run uses it. None or 0: the base model (adapter disabled), as name@0. Only read when kl_coef > 0.")
    teacher: str | None = option(None, help="On-policy distillation: the teacher that scores every token the student samples (training/loss.py). 'base': the base model (the adapter disabled); a checkpoint folder (or a run folder: its latest checkpoint) of an adapter of the same base model and LoraConfig; or another base model (a short name, a model folder or a Hugging Face id) with the student's tokenizer vocabulary, loaded once beside the student, frozen. None: no teacher.")
    distill_coef: float = option(1.0, help="Weight of the distillation term: with distill_estimate='sampled', of the per-token advantage -(log pi - log pi_teacher) added to the group's advantage A_b; with 'topk', of the top-k reverse KL added to the loss. Only read when teacher is set. With a teacher, groups whose rewards tie are trained on the teacher's signal alone.")
    distill_estimate: str = option("sampled", help="How the per-token reverse KL to the teacher is estimated (training/loss.py). 'sampled': on the sampled token only, log pi(y) - log pi_teacher(y), a per-token advantage through the policy gradient (Tinker's cookbook): one token's logprob per position from the teacher, cheapest. 'topk': over the union of the student's and the teacher's distill_top_k likeliest tokens at each position, both distributions renormalised there, an exact KL on that support added to the loss with its full gradient: lower variance, the cost of a second LM-head pass per position. Only read when teacher is set.")
    distill_top_k: int = option(32, help="k of distill_estimate='topk': the student's and the teacher's k likeliest tokens per position form the support of the KL (their union, 2k at most). Only read with distill_estimate='topk'.")
    scale_rewards: bool = option(True, help="Divide group advantages by the group's reward std (GRPO). False keeps reward - mean (Dr. GRPO).")
    normalize: str = option("token", help="'token': average the loss over all trainable tokens of the batch (DAPO); 'sequence': average per sequence, then over sequences (GRPO); 'constant': sum / (number of sequences x max_seq_len), each sequence divided by the same constant, then averaged (Dr. GRPO).")
    off_policy: str = option("none", help="Correction for rollouts sampled by another policy than the trainer's (an asynchronous run: LoopConfig.max_steps_off_policy > 0, or partial rollouts): 'none' takes the sampler's logprobs as PPO's old policy (right for synchronous runs); 'tis' weighs each token by the importance weight pi/mu between the trainer's policy and the one that sampled it, truncated at importance_cap (TIS); 'mis' drops the tokens whose weight passes importance_cap instead (MIS). Both take the PPO/CISPO ratio against the trainer's own policy (decoupled PPO; training/loss.py).")
    importance_cap: float = option(2.0, help="C of off_policy='tis' / 'mis': the largest importance weight pi/mu a token keeps (TIS caps it there, MIS drops the token). Must be > 1.")
    train_forced_tokens: bool = option(False, help="Train the tokens a grammar forced (tool_choice / response_format allowed only that token; the server reports them). False leaves them out of the loss: tokens a grammar forced carry no decision of the policy (its constrained distribution there is a point mass, with zero gradient), so training them with the trajectory's advantage only adds noise.")
    num_iterations: int = option(1, help="Optimizer steps taken on each step's batch: mu of the GRPO paper's algorithm, TRL's num_iterations. Each one recomputes the policy on the same rollouts; the clipped ratio against the sampler's logprobs keeps the later ones near the policy that sampled them. More than 1 suits a dense signal (a teacher's per-token KL: the 2048 job's distillation preset) more than GRPO's one reward per rollout; a fresh LoRA's first step moves only B, so a second one in the same step is what first moves A. Needs off_policy='none' (the decoupled ratio takes one step per batch).")
    compile: bool = option(False, help="torch.compile the decoder layers and the LM head's log-prob chunks for the update: fewer, fused kernels. Compiling costs seconds at the first step and pays off over runs of tens of steps (docs/benchmarks.md); falls back to eager with a warning if compilation fails.")

    max_skipped_steps: int = option(3, help="A step whose groups all have equal rewards carries no learning signal: it is skipped (no gradient step; the step counter still advances, serving the unchanged adapter under the next step, as ART does), with a warning naming the groups and a record in the history. This many consecutive skipped steps are allowed; one more raises NotTrainableError. 0 is strict: raise at once.")
    beta: InitVar[float | None] = None  # ART 0.3's name for kl_coef
    kl_penalty_coef: InitVar[float | None] = None  # ART 0.5's name for kl_coef
    # ART 0.5.2x's TrainConfig fields of its own machinery: accepted, named once in an ArtCompatWarning.
    kl_penalty_source: InitVar[str | None] = None
    grad_accumulation_sequences: InitVar[int | None] = None
    optimizer_save_interval: InitVar[int | None] = None
    final_training_step: InitVar[int | None] = None

    def __post_init__(self, beta: float | None = None, kl_penalty_coef: float | None = None,
                      kl_penalty_source: str | None = None, grad_accumulation_sequences: int | None = None,
                      optimizer_save_interval: int | None = None, final_training_step: int | None = None) -> None:
        ignored = {"kl_penalty_source": kl_penalty_source, "grad_accumulation_sequences": grad_accumulation_sequences,
                   "optimizer_save_interval": optimizer_save_interval, "final_training_step": final_training_step}
        if any(v is not None for v in ignored.values()):
            warn_ignored("TrainConfig", [k for k, v in ignored.items() if v is not None])
        # ART's KL weights map onto kl_coef (a k3 KL term against the base model; see docs/porting-from-art.md).
        given = {k: v for k, v in (("beta", beta), ("kl_penalty_coef", kl_penalty_coef)) if v is not None}
        if len(set(given.values())) > 1 or (given and self.kl_coef not in (0.0, *given.values())):
            raise ConfigError(f"kl_coef={self.kl_coef!r} and its ART names {given} disagree; pass one of them",
                              what="TrainConfig")
        if given:
            self.kl_coef = float(next(iter(given.values())))
        super().__post_init__()

    def problems(self) -> list[str]:
        p: list[str] = []
        check_positive(p, "learning_rate", self.learning_rate)
        check_choice(p, "loss", self.loss, ("ppo", "cispo"))
        check_choice(p, "normalize", self.normalize, ("token", "sequence", "constant"))
        check_choice(p, "off_policy", self.off_policy, ("none", "tis", "mis"))
        check_number(p, "importance_cap", self.importance_cap, low=1, low_open=True)
        check_positive(p, "epsilon", self.epsilon)
        if self.epsilon_high is not None:
            check_positive(p, "epsilon_high", self.epsilon_high)
        check_positive(p, "kl_coef", self.kl_coef, allow_zero=True)
        check_positive(p, "distill_coef", self.distill_coef, allow_zero=True)
        if self.teacher is not None and (not isinstance(self.teacher, str) or not self.teacher.strip()):
            p.append(f"teacher={self.teacher!r} must be 'base', a checkpoint folder of an adapter of this base model, "
                     "or another base model with the same tokenizer")
        check_choice(p, "distill_estimate", self.distill_estimate, DISTILL_ESTIMATES)
        if isinstance(self.distill_top_k, bool) or not isinstance(self.distill_top_k, int) or self.distill_top_k < 1:
            p.append(f"distill_top_k={self.distill_top_k!r} must be an integer >= 1 (the tokens per position of the "
                     "top-k KL's support)")
        check_positive(p, "num_iterations", self.num_iterations, integer=True)
        if self.off_policy != "none" and self.num_iterations != 1:
            p.append(f"num_iterations={self.num_iterations!r} with off_policy={self.off_policy!r}: the decoupled ratio "
                     "is taken against the policy at the start of the step, which holds for one optimizer step only; "
                     "use num_iterations=1 or off_policy='none'")
        if self.kl_reference_step is not None and (isinstance(self.kl_reference_step, bool)
                                                   or not isinstance(self.kl_reference_step, int)
                                                   or self.kl_reference_step < 0):
            p.append(f"kl_reference_step={self.kl_reference_step!r} must be a checkpoint step (an integer >= 0) "
                     "or None for the base model")
        p += super().problems()  # the update settings every optimizer update shares
        if isinstance(self.max_skipped_steps, bool) or not isinstance(self.max_skipped_steps, int) or self.max_skipped_steps < 0:
            p.append(f"max_skipped_steps={self.max_skipped_steps!r} must be an integer >= 0 (0: raise NotTrainableError at once)")
        return p


# ART's names of kl_coef read back as ART's do (`config.beta` is the KL weight, 0.0 by default). Set after
# the class is made: as dataclass defaults these names are the InitVars of its constructor.
TrainConfig.beta = property(lambda self: self.kl_coef, doc="ART 0.3's name of kl_coef")  # type: ignore[assignment]
TrainConfig.kl_penalty_coef = property(lambda self: self.kl_coef, doc="ART 0.5's name of kl_coef")  # type: ignore[assignment]


@_ignoring_unknown_keywords
@records_set_fields
@dataclass
class TrainSFTConfig(UpdateSettings):
    """Settings of one supervised step (`await model.train_sft(trajectories, config=TrainSFTConfig(...))`).

    ``learning_rate``, ``batch_size`` and ``assistant_turns`` are ART's `TrainSFTConfig`; the other
    update settings are every optimizer update's (`UpdateSettings`). One `train_sft` call is one step of
    the run (a checkpoint, a history row, a served adapter), made of one optimizer update per batch of
    `batch_size` trajectories.
    """

    learning_rate: float | list[float] = option(5e-5, help="AdamW learning rate; a list gives one rate per batch (its length must be the number of batches), as ART's schedules produce.")  # type: ignore[assignment]
    max_seq_len: int = option(4096, help="Conversations longer than this many tokens are dropped (counted in the metrics).")
    batch_size: int | str = option("auto", help="Trajectories per optimizer update; 'auto' is 2 (ART's LocalBackend default).")
    assistant_turns: str = option(DEFAULT_ASSISTANT_TURNS, help="'all': every assistant turn is a target; 'last': only the last one (earlier turns are context).")

    DEFAULT_BATCH_SIZE = 2

    def update_config(self, rate: float) -> TrainConfig:
        """The settings of one of the step's updates: this config's update settings at `rate` (an SFT
        update reads nothing of GRPO's own settings)."""
        return TrainConfig(**{name: getattr(self, name) for name in UPDATE_SETTINGS if name != "learning_rate"},
                           learning_rate=rate)

    def problems(self) -> list[str]:
        p: list[str] = []
        rates = self.learning_rate if isinstance(self.learning_rate, list) else [self.learning_rate]
        if not rates:
            p.append("learning_rate=[] must hold one rate per batch")
        schedule = isinstance(self.learning_rate, list)
        for i, r in enumerate(rates):
            rate_problems: list[str] = []
            # a schedule's batch may be 0: ART's linear and cosine decays end at min_lr, 0 by default, and
            # ART's chunked SFT gives the last chunk that batch alone
            check_positive(rate_problems, "learning_rate", r, allow_zero=schedule)
            if rate_problems:
                p.append(f"learning_rate[{i}]={r!r} must be a finite rate >= 0" if schedule
                         else f"learning_rate={r!r} must be a finite rate > 0 or a list of them")
        if self.batch_size != "auto" and (isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int)
                                          or self.batch_size < 1):
            p.append(f"batch_size={self.batch_size!r} must be 'auto' or an integer >= 1")
        check_choice(p, "assistant_turns", self.assistant_turns, ("all", "last"))
        return p + super().problems()

    def resolved_batch_size(self) -> int:
        return self.DEFAULT_BATCH_SIZE if self.batch_size == "auto" else int(self.batch_size)

    def rates(self, num_batches: int) -> list[float]:
        """The learning rate of each of `num_batches` updates (a list must have exactly that many)."""
        if isinstance(self.learning_rate, list):
            if len(self.learning_rate) != num_batches:
                raise ConfigError([f"learning_rate has {len(self.learning_rate)} rates but the trajectories make "
                                   f"{num_batches} batches of {self.resolved_batch_size()}; give one rate per batch"],
                                  what=type(self).__name__)
            return [float(r) for r in self.learning_rate]
        return [float(self.learning_rate)] * num_batches


@dataclass
class CheckpointRetention(Validated):
    """Which checkpoints of a run stay on disk: the `keep_recent` newest and the `keep_top` best by a
    validation metric (`gw.LoopConfig(retention=gw.CheckpointRetention(keep_recent=3, keep_top=2))`,
    `PipelineTrainer(checkpoint_retention_strategy=keep_recent_and_top(recent=3, top=2))`).

    Whatever it says, the latest checkpoint (a resume starts from it), the best the loop named
    (`Backend.keep_best`: it counts as one of the top) and those in use (pinned with `model.pinned`, held by
    an asynchronous loop or an evaluation, the KL anchor) are kept. `BackendOptions.best_checkpoint_metric`
    = None keeps every checkpoint whatever this says. Each prune is a history row of split ``retention``
    naming the deleted steps and why. Called with ART's `CheckpointRetentionContext`, it is ART's strategy:
    the steps of those checkpoints it keeps."""

    keep_recent: int = option(1, help="The newest checkpoints kept (the latest is kept even at 0).")
    keep_top: int = option(1, help="The best checkpoints by `metric` kept (the loop's named best counts as one).")
    metric: str | None = option(None, help="``split/key`` of the history that ranks checkpoints (e.g. 'val/accuracy'; "
                                           "a val row at step k scores checkpoint k). None: gw.fit's validation "
                                           "metric, else BackendOptions.best_checkpoint_metric.")
    higher_is_better: bool = option(True, help="Whether a larger `metric` is better (None metric: gw.fit's "
                                               "LoopConfig.higher_is_better).")

    def problems(self) -> list[str]:
        p: list[str] = []
        check_positive(p, "keep_recent", self.keep_recent, allow_zero=True, integer=True)
        check_positive(p, "keep_top", self.keep_top, allow_zero=True, integer=True)
        if self.metric is not None and (not isinstance(self.metric, str) or "/" not in self.metric):
            p.append(f"metric={self.metric!r} must be None or a history metric 'split/key', e.g. 'val/reward'")
        if not isinstance(self.higher_is_better, bool):
            p.append(f"higher_is_better={self.higher_is_better!r} must be True or False")
        return p

    def __call__(self, context: Any) -> set[int]:
        """ART's strategy form: the steps among `context.checkpoints` (each with `.step` and `.metrics`) to keep."""
        by_step = sorted(context.checkpoints, key=lambda c: c.step)
        keep = {c.step for c in by_step[max(0, len(by_step) - self.keep_recent):]} if self.keep_recent else set()
        metric = self.metric or "val/reward"
        sign = 1.0 if self.higher_is_better else -1.0
        ranked = sorted((c for c in by_step if metric in c.metrics), key=lambda c: (sign * c.metrics[metric], c.step),
                        reverse=True)
        keep.update(c.step for c in ranked[:self.keep_top])
        return keep


LOOP_ACTIONS = ("ignore", "warn", "stop_soon", "stop")
AUDIT_MODES = ("off", "warn", "refuse")  # LoopConfig.audit
TRAIN_LEARNING_RATE_DEFAULT = field_default(TrainConfig, "learning_rate")


@dataclass
class DetectorConfig(Validated):
    """Thresholds of the loop's detectors (`gw.LoopConfig(detectors=gw.DetectorConfig(val_drop=0.1))`).

    Each field's help says which detector it sets and what it bounds; what they share is said here once.
    The validation detectors compare changes against the validation's confidence interval
    (`LoopConfig.confidence`) as well: a threshold here is a floor under the noise, not a substitute for it.
    What the loop does on an alert is `LoopConfig`'s (its ``on_*`` fields). Each default's false-alarm rate (clean
    runs, nothing to game) and detection rate and lead time (planted, gameable rewards) are measured by
    bench/detectors.py, which writes them below (by detector, with the fields that set it) and tables them
    in docs/benchmarks.md and the README.

    Measured by bench/detectors.py with the defaults:
    - reward_against_task (against_task_z, against_task_window): false alarms on 0/63 clean runs, fired on 40/56 planted hacks (27 before the validation drop, median lead +1 steps).
    - reward_off_task (off_task_r, against_task_window): false alarms on 0/63 clean runs, fired on 56/56 planted hacks (46 before the validation drop, median lead +4.5 steps).
    - val_drop (val_drop, reward_rise): false alarms on 0/63 clean runs, fired on 56/56 planted hacks (10 before the validation drop, median lead +0 steps).
    - answer_collapse (collapse_share, shift_excess, shift_z, signal_window): false alarms on 0/63 clean runs, fired on 34/56 planted hacks (16 before the validation drop, median lead +0 steps).
    - length_drift (shift_excess, shift_z, signal_window): false alarms on 3/63 clean runs, fired on 43/56 planted hacks (36 before the validation drop, median lead +2 steps).
    - repetition (repetition_ngram, shift_excess, shift_z, signal_window): false alarms on 0/63 clean runs, fired on 21/56 planted hacks (18 before the validation drop, median lead +2 steps).
    - perfect_scores (perfect_share): false alarms on 0/63 clean runs, fired on 33/56 planted hacks (2 before the validation drop, median lead -2 steps).
    - reward_jump (jump_min, jump_sigmas, plateau_range, jump_window): false alarms on 0/63 clean runs, fired on 0/56 planted hacks.
    - val_plateau (reward_rise): false alarms on 31/63 clean runs, fired on 36/56 planted hacks (27 before the validation drop, median lead +1 steps).
    - val_unstable (val_drop): false alarms on 1/63 clean runs, fired on 13/56 planted hacks (5 before the validation drop, median lead +0 steps).
    - identical_answers (identical_share): false alarms on 0/63 clean runs, fired on 0/56 planted hacks.
    """

    val_drop: float = option(0.05, help="Val-drop detectors: the smallest fall of the validation metric below its best that can fire; the fall must also exceed the noise of the two validations (their intervals).")
    reward_rise: float = option(0.05, help="Val-drop and val-plateau detectors: the smallest rise of the mean train reward since the best validation step that counts as 'reward rose'; the rise must also exceed the noise of the train reward means.")
    reward_window: int = option(3, help="Val-drop and val-plateau detectors: steps of train reward averaged on each side of a reward comparison (around the best validation step, and the latest steps).")
    jump_window: int = option(5, help="Reward-jump detector: steps of plateau looked at before the jump.")
    jump_min: float = option(0.3, help="Reward-jump detector: the smallest jump (reward units) that can fire.")
    jump_sigmas: float = option(4.0, help="Reward-jump detector: the jump must also exceed this many standard deviations of the plateau.")
    plateau_range: float = option(0.1, help="Reward-jump detector: the plateau's max - min must be at most this (reward units).")
    perfect_reward: float = option(1.0, help="Perfect-scores detector: the maximum reward; a group is perfect when every rollout reaches it.")
    perfect_share: float = option(0.5, help="Perfect-scores detector: fire when at least this share of a step's groups are perfect.")
    repetition_ngram: int = option(3, help="Repetition detector: n of the word n-grams whose repetition within an answer is measured.")
    identical_share: float = option(0.5, help="Identical-answers note: fire when this share of groups (of 2+ rollouts) answer identically.")
    signal_window: int = option(1, help="Behaviour detectors (answer_collapse, length_drift, repetition): training steps pooled for each test (1: each step's answers alone, the earliest warning).")
    shift_excess: float = option(0.05, help="Behaviour detectors (answer_collapse, length_drift, repetition): the smallest excess of the share of answers beyond the base's 95th percentile (or shared across prompts) over the base's own share that can fire.")
    shift_z: float = option(2.5, help="Behaviour detectors: the excess must also reach this z (two-sample binomial test against the base's answers). 2.5: no more false alarms than 3.0 on the real and the simulated clean runs (docs/benchmarks.md), and the real drift of a reward indifferent to the task flagged a step before validation falls.")
    collapse_share: float = option(0.5, help="Answer-collapse detector: an answer counts as shared when at least this share of a step's prompts (and 3) were given it or a near-copy of it.")
    against_task_window: int = option(3, help="Reward-against-task and reward-off-task detectors: training steps whose groups are pooled for their tests.")
    off_task_r: float = option(0.5, help="Reward-off-task detector: warn when, within the groups (of the last against_task_window steps) whose task metric varies, the pooled correlation of reward and task is below this (0.5: the task explains under a quarter of the reward's spread there) while the task is not improving.")
    against_task_z: float = option(3.0, help="Reward-against-task detector: fire when the within-group covariance of reward and task metric is negative with a t-statistic at most minus this.")
    min_judge_agreement: float = option(0.6, help="Judge detector: fire when the judge orders fewer than this share of pairs like ground truth.")

    def problems(self) -> list[str]:
        p: list[str] = []
        for name in ("reward_window", "jump_window", "repetition_ngram", "signal_window", "against_task_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                p.append(f"{name}={value!r} must be an integer >= 1")
        for name in ("val_drop", "reward_rise", "jump_min", "jump_sigmas", "plateau_range", "shift_z", "against_task_z"):
            check_positive(p, name, getattr(self, name), allow_zero=True)
        check_number(p, "perfect_reward", self.perfect_reward)
        for name in ("perfect_share", "identical_share", "min_judge_agreement", "shift_excess", "collapse_share", "off_task_r"):
            check_fraction(p, name, getattr(self, name))
        return p


# A rollout that runs longer is cancelled and counted as a failed rollout. Generous on purpose: it is
# there to end a hung rollout (a request that never returns), never to cut a slow legitimate one. A
# rollout's clock runs while the engine batches every rollout of the step, so on a small CPU one
# rollout takes about as long as the whole gather (the built-in jobs: well under a minute), and an
# agent that calls a hosted API or tools for many turns can take several minutes.
ROLLOUT_TIMEOUT_S = 600.0
# A rollout (or judge call) without progress (no model request sent or answered) for this long is named
# in a warning and a ``hang`` alert (groupwise.rollout.hangs), well before its timeout ends it. It cuts
# nothing: a long answer on a slow CPU only costs a warning.
HANG_AFTER_S = 120.0


@dataclass
class LoopConfig(Validated):
    """Settings of `gw.fit` (the training loop): batch shape, validation, stopping, hacking policy.

    Defaults: 18 rollouts per group, validation every 5 steps, stop when the validation metric (or,
    without validation, the mean train reward) has not improved for 10 steps.
    Every validation carries a confidence interval (`confidence`); an improvement or a fall counts only
    when it is larger than that noise. Each detector's finding maps to an action: 'ignore', 'warn'
    (recorded, shown in reports), 'stop_soon' (stop after `stop_soon_steps` more steps unless
    validation improves), 'stop' (stop now and keep the best checkpoint). The detectors' thresholds
    live in `detectors` (a `DetectorConfig`).
    """

    rollouts_per_group: int = option(18, help="Rollouts of each training scenario per group (GRPO compares within a group).")
    groups_per_step: int = option(4, help="Scenarios (groups) gathered per training step.")
    num_epochs: int = option(1, help="Passes over the training scenarios; the loop also ends when they run out.")
    max_steps: int | None = option(None, help="Stop after this many completed training steps (None: only the other rules and the data end the run).")
    learning_rate: float | None = option(None, help=f"Shorthand for train_config.learning_rate, which owns the rate (None: the TrainConfig's, {TRAIN_LEARNING_RATE_DEFAULT:g} by default). Setting both to different values is a ConfigError, never a silent override.")
    train_config: TrainConfig | None = option(None, help="Full GRPO step settings, the learning rate included (None: TrainConfig defaults, with learning_rate above when set).")
    eval_every: int = option(5, help="Validate every this many steps (and at step 0, the untrained base, and at "
                                     "the step the run stops on).")
    val_rollouts_per_group: int = option(1, help="Rollouts per validation scenario; the validation metric is their mean.")
    metric: str = option(DEFAULT_VAL_METRIC, help="Name of the validation metric that validate(trajectory, scenario) returns; logged as val/<metric>.")
    higher_is_better: bool = option(True, help="Whether a larger validation metric is better (False for e.g. an error rate).")
    confidence: float = option(DEFAULT_CONFIDENCE, help="Confidence level of each validation's interval (Wilson for 0/1 metrics, else a bootstrap over scenarios), logged as <metric>_lo / <metric>_hi; detectors and stopping rules count a change only when it is larger than this noise.")
    judge_val: bool = option(True, help="Also apply fit's score_group (e.g. RULER) to validation groups of 2+ rollouts, so the judge is checked against ground truth (hybrid runs).")
    patience: int = option(10, help="Plateau stop: steps without an improvement larger than min_delta and than the validation noise (on the validation metric where there is one, else on the mean train reward).")
    min_delta: float = option(0.0, help="Smallest change that counts as an improvement for the plateau rule (the noise of the validation counts too).")
    target: float | None = option(None, help="Stop once the validation metric (or mean train reward without validation) reaches this value (None disables).")
    baseline_margin: float | None = option(None, help="Stop once the validation metric beats the best baseline by this margin and by more than the noise of both (None disables).")
    score_train: bool = option(True, help="Also score every training rollout with fit's `validate` (its metric next to the reward in the train rows): the reward_against_task detector reads it every step, and the behaviour detectors ask it whether the task improved. False when validate is too costly to run on the training rollouts too.")
    on_reward_against_task: str = option("stop", help="Action when, within groups, the rollouts the reward preferred score lower on the task metric (the steps train against the task: reward hacking).")
    on_reward_off_task: str = option("warn", help="Action when, within groups, the reward barely follows the task metric while the task does not improve (each step trains toward what else the reward pays for: the room a hack grows in).")
    on_val_drop: str = option("stop", help="Action when validation falls beyond its noise while the train reward rises beyond its own (reward hacking).")
    on_val_unstable: str = option("stop_soon", help="Action when validation falls beyond its noise and the train reward does not rise (training became unstable: the policy got worse, the reward was not gamed).")
    on_val_plateau: str = option("stop_soon", help="Action when validation plateaus while reward still rises (converged).")
    on_reward_jump: str = option("warn", help="Action on a sudden train-reward jump after a plateau.")
    on_perfect_scores: str = option("warn", help="Action when a large share of groups score the maximum on every rollout.")
    on_degenerate: str = option("warn", help="Action on behaviour that moved away from the base model's while the task did not improve: one answer across prompts, length drift, n-gram repetition (and identical answers within a group).")
    on_judge_disagreement: str = option("warn", help="Action when the judge's ranking disagrees with ground truth (hybrid runs).")
    audit: str = option("off", help="Before the first step of a fresh run, audit the reward (`gw.audit_reward`: answers without content such as empty, echoed, keyword-stuffed, empty-tag, one-for-all or judge-flattering ones, through the rollout and score_group, against the base model's samples on 16 training scenarios): 'warn' warns for each probe that scores at or above the honest answers while validation says it is worse, 'refuse' raises RewardAuditError naming them, 'off' skips it. Off by default: its honest answers are base-model rollouts (2 per scenario, plus a judge call per scenario for a judged reward), minutes on a busy CPU; `groupwise audit <env>` runs it alone.")
    stop_soon_steps: int = option(5, help="Steps a 'stop_soon' action waits; an improvement of the validation metric beyond its noise cancels it.")
    detectors: DetectorConfig = option(default_factory=DetectorConfig, help="Thresholds of the detectors (`gw.DetectorConfig`).")
    max_exceptions: int | float = option(0, help="Rollouts allowed to raise (or time out) per gather: a count, or a fraction in (0, 1).")
    rollout_timeout_s: float | None = option(ROLLOUT_TIMEOUT_S, help="Seconds a rollout may run before it is cancelled and counted against max_exceptions like one that raised (None: no limit). Generous by default (10 minutes): it ends hung rollouts, not slow ones, and does not count the time an engine of this process could not serve (paused for an update, or full: rollout/stalls.py).")
    hang_after_s: float | None = option(HANG_AFTER_S, help="Seconds a rollout or score_group call may make no progress (no model request sent or answered through model.openai_client(), no gw.note_progress()) before it is named: a warning and a 'hang' alert in the history (the dashboard lists it) with its scenario, group, last request and that request's age, and its task's stack. It only names: rollout_timeout_s still decides when a rollout is cancelled. None: no watch.")
    resample_no_signal: int = option(2, help="Times a step's batch is gathered again when nothing in it is trainable (e.g. every group has equal rewards). After the last, a batch without signal is skipped as ART does (train_config.max_skipped_steps bounds how many in a row; 0 raises NotTrainableError instead).")
    max_steps_off_policy: int = option(0, help="0: synchronous (every step's rollouts wait for the previous update). d > 0: the asynchronous pipeline (loop/pipeline.py): the batch of step k is gathered from the policy of step k - d while the steps before it train, and a group is admitted only if its tokens (their recorded policy versions) are at most d versions old; late groups are counted and recorded, never silently dropped. Pair it with TrainConfig(off_policy='tis') to correct the loss for the staleness.")
    partial_rollouts: bool = option(False, help="With max_steps_off_policy > 0: rollouts ask for the latest policy instead of the one their step was scheduled from, and a sequence being sampled continues under each newer adapter as it is served (fresher tokens; which version sampled which token then depends on timing, so two runs are no longer the same run). False keeps every batch on its scheduled policy: reproducible, and resumable to the same history.")
    lockstep: bool = option(True, help="With other synchronous runs of the same gw.fit([...]) call (a sweep): start each step's rollouts when every such run has trained its last step, so the engine they share samples them in one batch (four runs on one H100: 1.64x the tokens/s of four runs alone, against 1.37x free-running; docs/benchmarks.md). False lets this run's steps go at their own pace. A run alone, or with max_steps_off_policy > 0, never waits.")
    retention: CheckpointRetention = option(default_factory=CheckpointRetention, help="Which checkpoints stay on disk (`gw.CheckpointRetention`): the newest keep_recent and the best keep_top by the validation metric (`metric`, `higher_is_better`, unless it names its own); the latest, the loop's best and those in use are always kept, and each prune is logged in the history (split 'retention').")
    seed: int = option(0, help="Seed of the per-epoch shuffle of the training scenarios (resume sees the same batches), and of the rollouts' sampling seeds (seed_rollouts).")
    seed_rollouts: bool = option(True, help="Give each training rollout of a scenario with a free `sampling_seed` field its own seed, a function of (seed, step, scenario, rollout): its sampling no longer depends on which requests the engine happened to batch together. Its logits still may, in the last bits (CPU kernels sum in a batch-dependent order), and a flipped token makes two runs part; `LocalBackend(engine_kwargs={'batch_invariant': True})` (`groupwise train --batch-invariant`) makes two runs in one process bitwise the same whatever the requests' arrival times (tests/loop/test_loop_reproducible.py), and separate processes on a quiet machine matched too; but 20 runs started at once on a 16-core machine parted from their third step (a sampled token flipped), for a cause not yet found, so do not rely on bitwise equality across processes under heavy CPU load.")

    def problems(self) -> list[str]:
        p: list[str] = []
        for name in ("rollouts_per_group", "groups_per_step", "num_epochs", "eval_every",
                     "val_rollouts_per_group", "patience", "stop_soon_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                p.append(f"{name}={value!r} must be an integer >= 1")
        check_positive(p, "max_steps", self.max_steps, allow_zero=True, integer=True)  # None: no limit
        check_positive(p, "learning_rate", self.learning_rate)
        check_seed(p, "seed", self.seed)
        check_number(p, "target", self.target)
        if self.train_config is not None and not isinstance(self.train_config, TrainConfig):
            p.append(f"train_config={self.train_config!r} must be a TrainConfig or None")
        elif (conflict := self._learning_rate_conflict()) is not None:
            p.append(conflict)
        if not isinstance(self.retention, CheckpointRetention):
            p.append(f"retention={self.retention!r} must be a gw.CheckpointRetention")
        if not isinstance(self.detectors, DetectorConfig):
            p.append(f"detectors={self.detectors!r} must be a DetectorConfig")
        if not isinstance(self.metric, str) or not self.metric or "/" in self.metric:
            p.append(f"metric={self.metric!r} must be a non-empty name without '/' (it is logged as val/<metric>)")
        elif self.metric in ("reward", "reward_std", "step", "split", "answer_chars"):
            p.append(f"metric={self.metric!r} clashes with a field of the history row; name it e.g. 'accuracy'")
        check_fraction(p, "confidence", self.confidence, closed=False)
        check_positive(p, "min_delta", self.min_delta, allow_zero=True)
        check_positive(p, "baseline_margin", self.baseline_margin, allow_zero=True)  # None disables it
        check_positive(p, "resample_no_signal", self.resample_no_signal, allow_zero=True, integer=True)
        check_positive(p, "max_steps_off_policy", self.max_steps_off_policy, allow_zero=True, integer=True)
        if not isinstance(self.score_train, bool):
            p.append(f"score_train={self.score_train!r} must be True or False")
        if not isinstance(self.lockstep, bool):
            p.append(f"lockstep={self.lockstep!r} must be True or False")
        if not isinstance(self.partial_rollouts, bool):
            p.append(f"partial_rollouts={self.partial_rollouts!r} must be True or False")
        elif self.partial_rollouts and not self.max_steps_off_policy:
            p.append("partial_rollouts=True needs max_steps_off_policy >= 1 (a synchronous loop has no newer policy "
                     "to continue under)")
        for name in ("on_reward_against_task", "on_reward_off_task", "on_val_drop", "on_val_unstable", "on_val_plateau", "on_reward_jump", "on_perfect_scores",
                     "on_degenerate", "on_judge_disagreement"):
            check_choice(p, name, getattr(self, name), LOOP_ACTIONS)
        check_choice(p, "audit", self.audit, AUDIT_MODES)
        check_positive(p, "rollout_timeout_s", self.rollout_timeout_s)  # None: no limit
        check_positive(p, "hang_after_s", self.hang_after_s)  # None: no watch
        m = self.max_exceptions
        if not (is_number(m) and math.isfinite(m) and m >= 0 and (m < 1 or m == int(m))):
            p.append(f"max_exceptions={m!r} must be a count (an integer >= 0) or a fraction in (0, 1)")
        return p

    def _learning_rate_conflict(self) -> str | None:
        """The problem when learning_rate and train_config.learning_rate are both set and differ.

        TrainConfig owns the rate; learning_rate is a shorthand for it (ART programs and the README set
        it here). A TrainConfig whose caller set its rate (`model_fields_set`, even to the default's
        value) is the user's intent too, so neither may silently win."""
        try:
            self._set_values()
        except ConfigError as exc:
            return "; ".join(exc.problems)
        return None

    def _set_values(self) -> SetValues:
        """What the caller set for each step's TrainConfig, through either spelling (one owner per setting)."""
        values = SetValues(type(self).__name__)
        if self.learning_rate is not None:
            values.set("learning_rate", self.learning_rate, "learning_rate")
        if isinstance(self.train_config, TrainConfig):
            for name in sorted(fields_set(self.train_config)):
                values.set(name, getattr(self.train_config, name), f"train_config.{name}")
        return values

    def step_config(self) -> TrainConfig:
        """The TrainConfig of each step: train_config (or defaults), with learning_rate where it is set.
        It records what was set, so a model's own settings fill only the rest (compat.resolve_train_config);
        the rate counts as chosen (the loop's, from either spelling or TrainConfig's default: `gw.fit` is
        groupwise's API, with no ART default to differ from)."""
        values = self._set_values()  # the fields may have been reassigned since construction
        base = self.train_config if self.train_config is not None else TrainConfig()
        return replace_set(base, learning_rate=values.values.get("learning_rate", base.learning_rate))
