"""Config dataclasses: one per entry point, help text on every field, all problems reported at once.

Each config is a frozen-free dataclass whose fields carry ``metadata={"help": ...}``; `describe()`
prints them (the CLI uses the same text). `__post_init__` runs `problems()` and raises one
`ConfigError` listing every invalid value, so a user fixes a config in one go.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from groupwise.errors import ConfigError


def option(default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with help text (shown by `describe()` and the CLI)."""
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


class Validated:
    """Mixin: subclasses list their problems; construction fails with all of them together."""

    def problems(self) -> list[str]:  # pragma: no cover - overridden
        return []

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError(problems, what=type(self).__name__)

    @classmethod
    def describe(cls) -> str:
        lines = [f"{cls.__name__}:"]
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else "required"  # type: ignore[misc]
            )
            lines.append(f"  {f.name} = {default!r}\n      {f.metadata.get('help', '')}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


def check_positive(problems: list[str], name: str, value: float, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        problems.append(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")


def check_fraction(problems: list[str], name: str, value: float, *, closed: bool = True) -> None:
    if value is None:
        return
    ok = 0.0 <= value <= 1.0 if closed else 0.0 < value < 1.0
    if not ok:
        problems.append(f"{name}={value!r} must be in {'[0, 1]' if closed else '(0, 1)'}")


def check_choice(problems: list[str], name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        problems.append(f"{name}={value!r} must be one of {list(choices)}")


@dataclass
class TrainConfig(Validated):
    """Settings of one GRPO step (`await model.train(groups, config=TrainConfig(...))`)."""

    learning_rate: float = option(1e-5, help="AdamW learning rate of the LoRA parameters.")
    loss: str = option("ppo", help="'ppo': clipped importance ratio (GRPO/DAPO); 'cispo': clipped, stop-gradient weight on log-prob (CISPO).")
    epsilon: float = option(0.2, help="Lower clip: the ratio is clipped to [1 - epsilon, 1 + epsilon_high].")
    epsilon_high: float | None = option(0.28, help="Upper clip (DAPO's clip-higher). None means epsilon.")
    kl_coef: float = option(0.0, help="Weight of the k3 KL penalty against the base model (adapter disabled). 0 disables it and skips the reference pass.")
    scale_rewards: bool = option(True, help="Divide group advantages by the group's reward std (GRPO). False keeps reward - mean (Dr. GRPO).")
    normalize: str = option("token", help="'token': average the loss over all trainable tokens of the batch (DAPO); 'sequence': average per sequence, then over sequences (GRPO); 'constant': sum / max_seq_len (Dr. GRPO).")
    max_grad_norm: float = option(1.0, help="Clip the global gradient norm to this value (0 disables clipping).")
    weight_decay: float = option(0.0, help="AdamW weight decay.")
    micro_batch_tokens: int = option(4096, help="Token budget of one micro-batch (padded tokens); the step accumulates gradients over micro-batches.")
    max_seq_len: int = option(2048, help="Sequences longer than this are dropped from the step (counted in the metrics).")
    logprob_chunk_size: int = option(1024, help="Positions per chunk when computing log-softmax, so a 150k vocabulary does not hold [T, V] at once.")
    seed: int = option(0, help="Seed of the step's RNG (dropout, shuffling of micro-batches).")

    def problems(self) -> list[str]:
        p: list[str] = []
        check_positive(p, "learning_rate", self.learning_rate)
        check_choice(p, "loss", self.loss, ("ppo", "cispo"))
        check_choice(p, "normalize", self.normalize, ("token", "sequence", "constant"))
        check_positive(p, "epsilon", self.epsilon)
        if self.epsilon_high is not None:
            check_positive(p, "epsilon_high", self.epsilon_high)
        check_positive(p, "kl_coef", self.kl_coef, allow_zero=True)
        check_positive(p, "max_grad_norm", self.max_grad_norm, allow_zero=True)
        check_positive(p, "weight_decay", self.weight_decay, allow_zero=True)
        check_positive(p, "micro_batch_tokens", self.micro_batch_tokens)
        check_positive(p, "max_seq_len", self.max_seq_len)
        check_positive(p, "logprob_chunk_size", self.logprob_chunk_size)
        return p
