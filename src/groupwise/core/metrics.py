"""ART 0.5's metrics taxonomy (`art.metrics`): step metrics a program adds between two `model.log` calls,
and the cost of API calls (`track_api_cost`), written into the next history row of their split.

A `MetricsBuilder` buffers leaves under a section (``costs/...``, ``time/step_...``, ``data/step_...``,
``throughput/step_...``, or any ``section/name``) per scope: the model's ``train`` builder buffers for
the ``train`` split, ``eval`` for ``val`` and ``test``, any other name for its split. `model.log` flushes
its split's buffer into the row it writes, with what ART adds at a flush:
- cost rollups: each parent of a ``costs/`` leaf (``costs/train``, ``costs/train/llm_judge``) and
  ``costs/all``;
- running totals across flushes, ``<section>/cum/<name>`` for each ``costs``, ``time`` and ``data`` key
  (``time/step_actor_s`` -> ``time/cum/actor_s``), and ``data/cum/num_unique_scenarios``;
- ``throughput/avg_actor_tok_per_s`` (and ``_trainer_``) once tokens and seconds have totals.
The totals are kept in the run's state (`Model.read_state`), so a resumed run counts on.

`track_api_cost` prices a response from its ``usage`` (OpenAI's prompt/completion tokens with cached
prompt tokens, Anthropic's input/output tokens with cache writes and reads), at the prices given, or
registered on the builder (`register_model_pricing`), or of groupwise's judge price table
(`groupwise.judge.PRICES`); a response that carries its cost (``usage.cost``) is taken as is. A call made
outside an active builder (`MetricsBuilder.activate_context`, `Model.activate_metrics_context`) is not
counted, as in ART; a response whose price is unknown is not counted either, with a warning naming the
model (ART raises there, after the call).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from groupwise.errors import ConfigError, GroupwiseWarning

__all__ = ["MetricsBuilder", "TokenPricing", "is_builder_managed_metric", "is_cumulative_metric_key",
           "to_cumulative_metric_key", "track_api_cost"]

_active: ContextVar["MetricsBuilder"] = ContextVar("groupwise_active_metrics_builder")
_TOTALLED_SECTIONS = ("costs", "time", "data")
_THROUGHPUT = (("actor", "data/cum/actor_tokens", "time/cum/actor_s"),
               ("trainer", "data/cum/trainer_tokens", "time/cum/trainer_s"))


def is_builder_managed_metric(key: str) -> bool:
    """A `model.log` metric that goes through the builder (summed into the step's buffer) rather than
    straight into the row: ART's rule."""
    return key.startswith(("costs/", "time/step_", "data/step_", "throughput/step_"))


def is_cumulative_metric_key(key: str) -> bool:
    """A running total's key: ``<section>/cum/...``."""
    parts = key.split("/", 2)
    return len(parts) >= 2 and parts[1] == "cum"


def to_cumulative_metric_key(key: str) -> str:
    """The running total of a step key: ``time/step_actor_s`` -> ``time/cum/actor_s``."""
    if is_cumulative_metric_key(key):
        raise ConfigError([f"metric key {key!r} is a running total already"], what="to_cumulative_metric_key")
    section, rest = key.split("/", 1)
    return f"{section}/cum/{rest.removeprefix('step_')}"


@dataclass(frozen=True)
class TokenPricing:
    """USD per million tokens."""

    prompt_per_million: float
    completion_per_million: float
    cached_prompt_per_million: float | None = None
    cache_creation_per_million: float | None = None
    cache_read_per_million: float | None = None


@dataclass
class _Shared:
    """What every builder of one model shares: the buffers by scope, the running totals, the pricing."""

    buffers: dict[str, dict[str, float]] = field(default_factory=dict)
    scenario_ids: dict[str, set[str]] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)
    unique_scenarios: set[str] = field(default_factory=set)
    extractors: dict[str, Callable[[Any], float | None]] = field(default_factory=dict)
    pricing: dict[str, TokenPricing] = field(default_factory=dict)


class MetricsBuilder:
    """Step metrics of one cost context (``train``, ``eval``, ...); see the module doc."""

    def __init__(self, cost_context: str, *, _shared_state: _Shared | None = None, _buffer_scope: str | None = None) -> None:
        if not cost_context or not cost_context.strip():
            raise ConfigError(["cost_context must be a non-empty name (e.g. 'train' or 'eval')"], what="MetricsBuilder")
        self.cost_context = cost_context.strip()
        self._scope = _buffer_scope or self.cost_context
        self._shared = _shared_state or _Shared()

    # ------------------------------------------------------------------ adding
    def add_metric(self, key: str, value: float) -> None:
        """Add `value` to the leaf `key` (``section/name``) of this step."""
        if not isinstance(key, str) or "/" not in key:
            raise ConfigError([f"metric key {key!r} needs a section: 'costs/...', 'time/...', 'data/...'"],
                              what="MetricsBuilder.add_metric")
        if is_cumulative_metric_key(key):
            raise ConfigError([f"metric key {key!r} is in the running totals' namespace ('<section>/cum/...'), "
                               "which the builder writes"], what="MetricsBuilder.add_metric")
        buffer = self._shared.buffers.setdefault(self._scope, {})
        for other in buffer:
            if other != key and (other.startswith(f"{key}/") or key.startswith(f"{other}/")):
                raise ConfigError([f"metric key {key!r} and {other!r}: one is a leaf under the other; a key is "
                                   "either a leaf or a parent (parents are summed from their leaves)"],
                                  what="MetricsBuilder.add_metric")
        buffer[key] = buffer.get(key, 0.0) + float(value)

    def add_cost(self, path: str, usd: float) -> None:
        """Add `usd` to ``costs/<path>`` (e.g. ``train/llm_judge/correctness``)."""
        if not path:
            raise ConfigError(["a cost path must be non-empty (e.g. 'train/llm_judge')"], what="MetricsBuilder.add_cost")
        self.add_metric(f"costs/{path}", usd)

    def add_response_cost(self, source: str, response: Any, *, provider: str, model_name: str,
                          prompt_price_per_million: float | None = None,
                          completion_price_per_million: float | None = None,
                          cached_prompt_price_per_million: float | None = None,
                          cache_creation_price_per_million: float | None = None,
                          cache_read_price_per_million: float | None = None) -> float | None:
        """Price `response` (module doc) and add it to ``costs/<cost context>/<source>``; the USD added,
        or None when it cannot be priced (a warning says why)."""
        source = source.strip("/")
        if not source:
            raise ConfigError(["source must be non-empty (e.g. 'llm_judge/correctness')"], what="track_api_cost")
        given = (prompt_price_per_million, completion_price_per_million, cached_prompt_price_per_million,
                 cache_creation_price_per_million, cache_read_price_per_million)
        cost = self._price(response, provider.strip().lower(), model_name, given)
        if cost is not None:
            self.add_cost(f"{self.cost_context}/{source}", cost)
        return cost

    def add_data(self, step_num_scenarios: int | None = None, step_actor_tokens: int | None = None,
                 scenario_ids: list[str] | None = None) -> None:
        if step_num_scenarios is not None:
            self.add_metric("data/step_num_scenarios", step_num_scenarios)
        if step_actor_tokens is not None:
            self.add_metric("data/step_actor_tokens", step_actor_tokens)
        if scenario_ids is not None:
            self._shared.scenario_ids.setdefault(self._scope, set()).update(map(str, scenario_ids))

    def add_user_timing(self, step_wall_s: float | None = None, step_actor_s: float | None = None,
                        step_eval_s: float | None = None) -> None:
        for name, value in (("wall", step_wall_s), ("actor", step_actor_s), ("eval", step_eval_s)):
            if value is not None:
                self.add_metric(f"time/step_{name}_s", value)

    def add_idle_times(self, step_trainer_idle_s: float | None = None, step_actor_idle_s: float | None = None) -> None:
        for name, value in (("trainer", step_trainer_idle_s), ("actor", step_actor_idle_s)):
            if value is not None:
                self.add_metric(f"throughput/step_{name}_idle_s", value)

    @contextlib.contextmanager
    def measure(self, key: str) -> Iterator[None]:
        """Add the seconds the block takes to `key` (e.g. ``time/step_actor_s``)."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.add_metric(key, time.monotonic() - start)

    # ------------------------------------------------------------------ flushing
    async def flush(self) -> dict[str, float]:
        """This scope's buffered step, with its rollups and running totals (module doc); the buffer empties."""
        return self.take()

    def take(self) -> dict[str, float]:
        """`flush`, for synchronous callers."""
        shared = self._shared
        row = dict(shared.buffers.pop(self._scope, {}))
        costs = {k: v for k, v in row.items() if k.startswith("costs/")}
        rollups: dict[str, float] = {}
        for key, usd in costs.items():  # every parent of a leaf, then the sum of all
            parts = key.split("/")
            for depth in range(2, len(parts)):
                parent = "/".join(parts[:depth])
                rollups[parent] = rollups.get(parent, 0.0) + usd
        if costs:
            rollups["costs/all"] = sum(costs.values())
        row.update(rollups)
        for key, value in list(row.items()):
            if key.split("/", 1)[0] in _TOTALLED_SECTIONS:
                total = to_cumulative_metric_key(key)
                shared.totals[total] = shared.totals.get(total, 0.0) + value
                row[total] = shared.totals[total]
        for name in ("trainer", "actor"):
            if f"throughput/step_{name}_idle_s" in row:
                total = f"throughput/cum/{name}_idle_s"
                shared.totals[total] = shared.totals.get(total, 0.0) + row[f"throughput/step_{name}_idle_s"]
                row[total] = shared.totals[total]
        ids = shared.scenario_ids.pop(self._scope, set())
        if ids:
            shared.unique_scenarios |= ids
            row["data/cum/num_unique_scenarios"] = float(len(shared.unique_scenarios))
        for name, tokens, seconds in _THROUGHPUT:
            if (f"data/step_{name}_tokens" in row or f"time/step_{name}_s" in row) and shared.totals.get(seconds):
                if tokens in shared.totals:
                    row[f"throughput/avg_{name}_tok_per_s"] = shared.totals[tokens] / shared.totals[seconds]
        return row

    # ------------------------------------------------------------------ context
    def activate(self) -> Token:
        """Make this builder the one `track_api_cost` adds to, in this task; reset the returned token to undo."""
        return _active.set(self)

    @contextlib.contextmanager
    def activate_context(self) -> Iterator["MetricsBuilder"]:
        token = self.activate()
        try:
            yield self
        finally:
            _active.reset(token)

    @staticmethod
    def get_active() -> "MetricsBuilder":
        """The active builder; LookupError when there is none (as ART's)."""
        return _active.get()

    def for_cost_context(self, cost_context: str, *, buffer_scope: str | None = None) -> "MetricsBuilder":
        """A builder of `cost_context` sharing this one's buffers, totals and pricing."""
        context = cost_context.strip()
        scope = (buffer_scope or context).strip()
        if context == self.cost_context and scope == self._scope:
            return self
        return MetricsBuilder(context, _shared_state=self._shared, _buffer_scope=scope)

    # ------------------------------------------------------------------ pricing
    def register_cost_extractor(self, provider: str, extractor: Callable[[Any], float | None]) -> None:
        """`extractor(response)` gives the USD of a response of `provider` (None: price it by its usage)."""
        self._shared.extractors[provider.strip().lower()] = extractor

    def register_model_pricing(self, model_name: str, *, prompt_per_million: float, completion_per_million: float,
                               cached_prompt_per_million: float | None = None,
                               cache_creation_per_million: float | None = None,
                               cache_read_per_million: float | None = None) -> None:
        self._shared.pricing[model_name] = TokenPricing(prompt_per_million, completion_per_million,
                                                        cached_prompt_per_million, cache_creation_per_million,
                                                        cache_read_per_million)

    def _price(self, response: Any, provider: str, model_name: str, given: tuple) -> float | None:
        usage = getattr(response, "usage", None) if not isinstance(response, dict) else response.get("usage")
        direct = _field(usage, "cost")
        if isinstance(direct, (int, float)) and not isinstance(direct, bool):
            return float(direct)
        extractor = self._shared.extractors.get(provider)
        if extractor is not None and (cost := extractor(response)) is not None:
            return float(cost)
        pricing = self._pricing(model_name, given)
        if pricing is None or usage is None:
            warnings.warn(GroupwiseWarning(
                f"track_api_cost: {'no usage in the response' if usage is None else f'no price known for {model_name!r}'}"
                f"; this call is not counted in costs/. Pass prompt_price_per_million= and "
                f"completion_price_per_million=, or register_model_pricing({model_name!r}, ...)."), stacklevel=3)
            return None
        m = 1e-6
        if provider == "anthropic" or _field(usage, "input_tokens") is not None:
            def tokens(name: str) -> float:
                return float(_field(usage, name) or 0)
            write = pricing.cache_creation_per_million if pricing.cache_creation_per_million is not None \
                else pricing.prompt_per_million
            read = pricing.cache_read_per_million if pricing.cache_read_per_million is not None \
                else pricing.prompt_per_million
            return m * (tokens("input_tokens") * pricing.prompt_per_million + tokens("cache_creation_input_tokens") * write
                        + tokens("cache_read_input_tokens") * read + tokens("output_tokens") * pricing.completion_per_million)
        prompt = float(_field(usage, "prompt_tokens") or 0)
        cached = float(_field(_field(usage, "prompt_tokens_details"), "cached_tokens") or 0)
        cached_price = pricing.cached_prompt_per_million if pricing.cached_prompt_per_million is not None \
            else pricing.prompt_per_million
        return m * ((prompt - cached) * pricing.prompt_per_million + cached * cached_price
                    + float(_field(usage, "completion_tokens") or 0) * pricing.completion_per_million)

    def _pricing(self, model_name: str, given: tuple) -> TokenPricing | None:
        base = self._shared.pricing.get(model_name) or self._shared.pricing.get(model_name.split("/", 1)[-1])
        if base is None:
            from groupwise.core.cost import price_of

            known = price_of(model_name)
            base = TokenPricing(*known) if known else None
        if given[0] is not None and given[1] is not None:
            return TokenPricing(*given)
        if base is None:
            return None
        return TokenPricing(*(g if g is not None else b for g, b in zip(given, (
            base.prompt_per_million, base.completion_per_million, base.cached_prompt_per_million,
            base.cache_creation_per_million, base.cache_read_per_million))))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"cum_state": dict(self._shared.totals), "unique_scenario_ids": sorted(self._shared.unique_scenarios)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._shared.totals = {str(k): float(v) for k, v in (state.get("cum_state") or {}).items()}
        self._shared.unique_scenarios = {str(v) for v in state.get("unique_scenario_ids") or []}
        self._shared.buffers.clear()
        self._shared.scenario_ids.clear()


def _field(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def track_api_cost(*, source: str, provider: str, model_name: str,
                   response_getter: Callable[[Any], Any] | None = None,
                   prompt_price_per_million: float | None = None, completion_price_per_million: float | None = None,
                   cached_prompt_price_per_million: float | None = None,
                   cache_creation_price_per_million: float | None = None,
                   cache_read_price_per_million: float | None = None) -> Callable[[Callable], Callable]:
    """Decorate a function (sync or async) that returns a provider's response (or, with
    `response_getter`, something holding one): each call's cost goes to the active builder's
    ``costs/<cost context>/<source>`` (module doc)."""
    problems = [f"{name} must be non-empty" for name, value in (("source", source.strip("/")),
                                                                  ("provider", provider.strip()),
                                                                  ("model_name", model_name.strip())) if not value]
    if problems:
        raise ConfigError(problems, what="track_api_cost")
    prices = dict(prompt_price_per_million=prompt_price_per_million,
                  completion_price_per_million=completion_price_per_million,
                  cached_prompt_price_per_million=cached_prompt_price_per_million,
                  cache_creation_price_per_million=cache_creation_price_per_million,
                  cache_read_price_per_million=cache_read_price_per_million)

    def record(result: Any) -> None:
        try:
            builder = MetricsBuilder.get_active()
        except LookupError:
            return
        response = response_getter(result) if response_getter is not None else result
        builder.add_response_cost(source, response, provider=provider, model_name=model_name, **prices)

    def decorate(fn: Callable) -> Callable:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                result = await fn(*args, **kwargs)
                record(result)
                return result

            return run_async

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            record(result)
            return result

        return run

    return decorate
