"""Token usage and cost of judge calls.

`PRICES` is a small table of USD per million tokens (prompt, completion) for common judges, as
published by the providers (checked 2025; prices change: pass `prices=` or call `set_price`).
Unknown models of paid providers (openai/, anthropic/, gemini/, openrouter/, ...) cost 0.0 and are
flagged with ``judge/unpriced = 1`` in the group metrics (and a warning), so a missing price is
visible rather than a silent zero. Judges served by a backend cost nothing; self-hosted ones
(base_url=, hosted_vllm/, ollama/) cost nothing unless `prices=` names them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

# model name (without provider prefix) -> (USD per 1M prompt tokens, USD per 1M completion tokens)
PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "o3": (2.00, 8.00),
    "o4-mini": (1.10, 4.40),
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5-nano": (0.05, 0.40),
}

_warned: set[str] = set()


def set_price(model: str, usd_per_m_prompt: float, usd_per_m_completion: float) -> None:
    """Add or override a model's price for every later judge call in this process."""
    PRICES[model] = (float(usd_per_m_prompt), float(usd_per_m_completion))


def price_of(model: str, overrides: dict[str, Any] | None = None) -> tuple[float, float] | None:
    """Price of `model`; looks the name up with and without its provider prefix ("openai/o3" -> "o3")."""
    table = {**PRICES, **{k: tuple(v) for k, v in (overrides or {}).items()}}
    for name in (model, model.split("/", 1)[-1]):
        if name in table:
            return table[name]  # type: ignore[return-value]
    return None


@dataclass
class Usage:
    """Tokens and cost summed over the requests of one judge call (retries and repairs included)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    requests: int = 0
    cache_hits: int = 0
    retries: int = 0
    unpriced: bool = False
    per_request: list[dict[str, Any]] = field(default_factory=list)

    def add(self, prompt_tokens: int, completion_tokens: int, model: str, *, paid: bool, prices: dict | None) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        cost = 0.0
        price = price_of(model, prices)
        if price is not None:
            cost = (prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6
        elif paid:
            self.unpriced = True
            if model not in _warned:
                _warned.add(model)
                warnings.warn(
                    f"no price known for judge model {model!r}; its cost is counted as 0.0 and the group "
                    "metrics get judge/unpriced=1. Pass prices={model: (usd_per_M_prompt, usd_per_M_completion)} "
                    "or call groupwise.judge.set_price.",
                    stacklevel=3,
                )
        self.cost_usd += cost
        self.per_request.append(
            {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "cost_usd": cost}
        )

    def merge(self, other: "Usage") -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost_usd += other.cost_usd
        self.requests += other.requests
        self.cache_hits += other.cache_hits
        self.retries += other.retries
        self.unpriced = self.unpriced or other.unpriced
        self.per_request.extend(other.per_request)

    def metrics(self) -> dict[str, float | int]:
        """The step metrics a judged group carries (summed by the loop over the step's groups)."""
        out: dict[str, float | int] = {
            "judge/prompt_tokens": self.prompt_tokens,
            "judge/completion_tokens": self.completion_tokens,
            "judge/cost_usd": self.cost_usd,
            "judge/requests": self.requests,
            "judge/retries": self.retries,
            "judge/cache_hits": self.cache_hits,
        }
        if self.unpriced:
            out["judge/unpriced"] = 1
        return out
