"""`JudgeConfig`: every knob of one RULER call, with help text; all invalid values reported together.

`ruler(...)` and `ruler_score_group(...)` take these as keyword arguments (or `config=JudgeConfig(...)`);
the keywords override the config's fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import math

from groupwise.config import DEFAULT_JUDGE_TIMEOUT_S
from groupwise.core.validated import Validated, check_choice, check_positive, check_seed, option

RESPONSE_FORMATS = ("auto", "json_schema", "json_object", "none")


@dataclass
class JudgeConfig(Validated):
    """Settings of the RULER judge (`gw.ruler`, `gw.ruler_score_group`)."""

    passes: int = option(1, help="How many shuffled orders of the group the judge scores; the scores are averaged. passes>1 also reports judge/pass_spearman (rank consistency between passes).")
    seed: int = option(0, help="Seed of the shuffled order in which trajectories are shown (pass p uses a rotation of the seeded order).")
    max_group_size: int = option(12, help="Largest number of distinct trajectories shown in one judge request; bigger groups are judged in overlapping chunks that share anchor trajectories.")
    anchors: int = option(3, help="Anchor trajectories shared by every chunk of a large group (the best, worst and middle of the first chunk), used to align chunk scales. Must be < max_group_size - 1.")
    retries: int = option(3, help="Retries after a bad answer, timeout, connection error, 429 or 5xx (so retries+1 attempts); then JudgeError.")
    backoff_s: float = option(1.0, help="Wait before retry i is backoff_s * 2**i seconds.")
    timeout_s: float = option(DEFAULT_JUDGE_TIMEOUT_S, help="Seconds one judge request may take before it counts as a timeout (and is retried).")
    temperature: float | None = option(None, help="Sampling temperature sent to the judge; None sends none (o-series models reject it), except to judges served in process (a backend's judge_client), which then decode greedily (0.0).")
    max_tokens: int | None = option(None, help="max_tokens of the judge's answer; None lets the endpoint decide (judges served in process default to 96 tokens per trajectory + 32, with explanations capped at 80 characters).")
    share_continuations: bool = option(False, help="Also send shared continuations once: a trajectory whose first turns after the common context equal an earlier-shown one's says so in one line instead of repeating them. With share_outputs on, this saves only the short call lines of those turns; off by default (the judge must rebuild a trajectory from another's).")
    share_outputs: bool = option(True, help="Write each long content that occurs more than once in the shown trajectories (the same search result, the same email read by several rollouts) once, in a <shared_outputs> section as [T1], [T2], ..., and reference it as '-> T1' where it occurred. Lossless; what each trajectory saw stays exact.")
    share_min_chars: int = option(200, help="Contents shorter than this many characters stay inline even when repeated (a reference would save nothing and costs the judge a look-up).")
    response_format: str = option("auto", help="'json_schema': constrained JSON output; 'json_object': JSON mode; 'none': plain text, parsed strictly with one repair request. 'auto': the provider's (json_schema; json_object for groq/ and deepseek/; none for anthropic/, whose OpenAI compatibility ignores it).")
    max_concurrent_requests: int = option(4, help="Requests in flight at once for one call (passes x chunks).")
    base_url: str | None = option(None, help="OpenAI-compatible endpoint of the judge (vLLM, Ollama, a proxy). With it, judge_model is the model name the endpoint serves.")
    api_key: str | None = option(None, help="API key for base_url (or to override the provider's environment variable).")
    cache: str | None = option(None, help="Folder of the disk cache of judge answers keyed by the exact request; None disables it (default).")
    prices: dict[str, Any] | None = option(None, help="Extra prices, {model: (usd_per_M_prompt_tokens, usd_per_M_completion_tokens)}, overriding cost.PRICES.")
    extra_body: dict[str, Any] | None = option(None, help="Extra JSON fields added to each chat.completions request (provider-specific options).")
    debug: bool = option(False, help="Print the judge's score and explanation per trajectory, with a preview of its last assistant message.")

    def problems(self) -> list[str]:
        p: list[str] = []
        check_positive(p, "passes", self.passes, integer=True)
        check_seed(p, "seed", self.seed)
        check_positive(p, "retries", self.retries, allow_zero=True, integer=True)
        check_positive(p, "backoff_s", self.backoff_s, allow_zero=True)
        check_positive(p, "timeout_s", self.timeout_s)
        check_positive(p, "max_concurrent_requests", self.max_concurrent_requests, integer=True)
        check_positive(p, "share_min_chars", self.share_min_chars, integer=True)
        check_choice(p, "response_format", self.response_format, RESPONSE_FORMATS)
        sizes_ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (self.max_group_size, self.anchors))
        if not sizes_ok:
            p.append(f"max_group_size={self.max_group_size!r} and anchors={self.anchors!r} must be integers "
                     "(max_group_size >= 2, 1 <= anchors < max_group_size - 1)")
        elif self.max_group_size < 2:
            p.append(f"max_group_size={self.max_group_size!r} must be >= 2 (a relative judge compares at least two)")
        elif self.anchors < 1:
            p.append(f"anchors={self.anchors!r} must be >= 1 (chunks of a large group are aligned on shared anchors)")
        elif self.anchors >= self.max_group_size - 1:
            p.append(
                f"anchors={self.anchors!r} must be < max_group_size - 1 = {self.max_group_size - 1} "
                "(each chunk needs room for new trajectories besides the anchors)"
            )
        if self.temperature is not None:
            check_positive(p, "temperature", self.temperature, allow_zero=True)
        if self.max_tokens is not None:
            check_positive(p, "max_tokens", self.max_tokens, integer=True)
        prices = {} if self.prices is None else self.prices
        if not isinstance(prices, dict):
            p.append(f"prices={prices!r} must be a dict {{model: (usd_per_M_prompt, usd_per_M_completion)}}")
            prices = {}
        for model, price in prices.items():
            ok = isinstance(price, (tuple, list)) and len(price) == 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in price
            )
            if not ok:
                p.append(f"prices[{model!r}]={price!r} must be (usd_per_M_prompt, usd_per_M_completion), both finite and >= 0")
        return p


# ART's `extra_litellm_params` keys -> JudgeConfig fields; other keys go to the request's extra body.
_LITELLM_KEYS = {"api_base": "base_url", "base_url": "base_url", "api_key": "api_key", "temperature": "temperature",
                 "max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "timeout": "timeout_s",
                 "request_timeout": "timeout_s", "num_retries": "retries", "max_retries": "retries"}
# LiteLLM's own call settings (litellm.completion's, not the provider's): sending them in the request body
# would make a strict server refuse the request, so they are named once in a warning instead.
_LITELLM_ONLY = frozenset({"drop_params", "caching", "cache", "metadata", "mock_response", "custom_llm_provider",
                           "api_version", "organization", "input_cost_per_token", "output_cost_per_token",
                           "fallbacks", "context_window_fallback_dict", "model_list", "litellm_logging_obj",
                           "logger_fn", "verbose", "retry_policy", "headers"})


def make_config(config: JudgeConfig | None, overrides: dict[str, Any]) -> JudgeConfig:
    """`config` (or the defaults) with keyword overrides; unknown keywords are a ConfigError.

    ``extra_litellm_params={...}`` (ART's argument) is accepted so ported code runs: its endpoint
    and sampling keys map to the fields above, anything else is sent in the request body.
    """
    import dataclasses

    from groupwise.errors import ConfigError

    overrides = dict(overrides)
    for alias, name in (("timeout", "timeout_s"), ("backoff", "backoff_s")):  # short spellings
        if alias in overrides:
            overrides.setdefault(name, overrides.pop(alias))
    litellm = overrides.pop("extra_litellm_params", None) or {}
    extra_body = dict(overrides.get("extra_body") or {})
    ignored = []
    for k, v in litellm.items():
        if k in _LITELLM_KEYS:
            overrides.setdefault(_LITELLM_KEYS[k], v)
        elif k == "extra_body" and isinstance(v, dict):
            extra_body.update(v)
        elif k in _LITELLM_ONLY:
            ignored.append(k)
        else:
            extra_body[k] = v
    if ignored:
        from groupwise.errors import warn_ignored

        warn_ignored("extra_litellm_params", ignored, "LiteLLM's own call settings; groupwise's judge calls the "
                     "endpoint with the openai SDK (retries: num_retries=, timeout: timeout=)", stacklevel=4)
    if extra_body:
        overrides["extra_body"] = extra_body

    names = {f.name for f in dataclasses.fields(JudgeConfig)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(
            [f"unknown judge option {k!r}; valid options: {sorted(names)}" for k in unknown], what="JudgeConfig"
        )
    base = dataclasses.asdict(config) if config is not None else {}
    base.update(overrides)
    return JudgeConfig(**base)
