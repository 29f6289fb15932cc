"""ART 0.5's metrics taxonomy (`art.metrics`): `track_api_cost` on a judge call, the model's builders
(`metrics_builder`, `activate_metrics_context`) and what `model.log` writes from them into the run's
history: cost leaves, rollups and running totals, timings, data counts and throughput, kept across a
restart of the run."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletion

import groupwise as art
from groupwise.errors import ConfigError, GroupwiseWarning
from groupwise.core.metrics import MetricsBuilder, track_api_cost


def _completion(prompt: int, completion: int, cached: int = 0) -> ChatCompletion:
    return ChatCompletion.model_validate({
        "id": "x", "object": "chat.completion", "created": 0, "model": "gpt-4.1",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached}}})


@track_api_cost(source="llm_judge/correctness", provider="openai", model_name="openai/gpt-4.1",
                prompt_price_per_million=1.0, completion_price_per_million=2.0)
async def judge(prompt: int, completion: int) -> ChatCompletion:
    return _completion(prompt, completion)


class _Usage:  # the shape of ART's own example's response (examples/metrics_taxonomy_smoke.py)
    def __init__(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens, self.completion_tokens = prompt_tokens, completion_tokens


class _Response:
    def __init__(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.usage = _Usage(prompt_tokens, completion_tokens)


@track_api_cost(source="llm_judge/decorator_demo", provider="openai", model_name="openai/gpt-4o-mini")
def priced_from_the_table(step: int) -> _Response:
    return _Response(prompt_tokens=1_000_000 * step, completion_tokens=0)


def _rows(model, split):
    return [r for r in art.load_history(model.run_dir) if r["split"] == split]


async def test_judge_costs_reach_the_next_row_with_rollups_and_totals(tmp_path):
    model = art.Model(name="agent", project="p", base_path=str(tmp_path))
    group = art.TrajectoryGroup([art.Trajectory(messages_and_choices=[], reward=1.0)])
    await judge(10**6, 10**6)  # outside any builder: not counted, as in ART
    with model.metrics_builder("train").activate_context():
        await judge(1_000_000, 500_000)  # 1.0 + 1.0 USD
        priced_from_the_table(2)  # gpt-4o-mini from groupwise's judge price table: 2 x 0.15
    token = model.activate_metrics_context("eval")
    await judge(500_000, 0)
    token.var.reset(token)
    await model.log([group], split="train", step=0)
    row = _rows(model, "train")[-1]
    assert row["costs/train/llm_judge/correctness"] == pytest.approx(2.0)
    assert row["costs/train/llm_judge/decorator_demo"] == pytest.approx(0.3)
    assert row["costs/train/llm_judge"] == pytest.approx(2.3) and row["costs/train"] == pytest.approx(2.3)
    assert row["costs/all"] == pytest.approx(2.3) and row["costs/cum/all"] == pytest.approx(2.3)
    assert "costs/eval" not in row  # the eval call waits for the next val or test row
    await model.log([group], split="val", step=0)
    assert _rows(model, "val")[-1]["costs/eval/llm_judge/correctness"] == pytest.approx(0.5)
    assert _rows(model, "val")[-1]["costs/cum/all"] == pytest.approx(2.8)  # totals run across splits
    # metrics passed to log under costs/ go through the builder too; totals survive a restart of the run
    again = art.Model(name="agent", project="p", base_path=str(tmp_path))
    await again.log(metrics={"costs/train/gpu": 1.5, "loss": 0.25}, step=1, split="train")
    row = _rows(again, "train")[-1]
    assert row["loss"] == 0.25 and row["costs/train"] == 1.5 and row["costs/cum/all"] == pytest.approx(4.3)


async def test_timings_data_and_throughput(tmp_path):
    model = art.Model(name="agent", project="p", base_path=str(tmp_path))
    builder = model.metrics_builder()
    for step, (tokens, ids) in enumerate(((1000, ["a", "b"]), (3000, ["b", "c"]))):
        with builder.measure("time/step_actor_s"):
            pass
        builder.add_user_timing(step_actor_s=1.0)
        builder.add_data(step_actor_tokens=tokens, scenario_ids=ids)
        await model.log(metrics={"loss": 1.0}, split="train", step=step)
    first, second = _rows(model, "train")
    assert first["data/step_actor_tokens"] == 1000 and second["data/cum/actor_tokens"] == 4000
    assert second["data/cum/num_unique_scenarios"] == 3
    assert 2.0 <= second["time/cum/actor_s"] < 2.5
    assert second["throughput/avg_actor_tok_per_s"] == pytest.approx(4000 / second["time/cum/actor_s"])


def test_builder_refusals_and_unknown_prices():
    builder = MetricsBuilder("train")
    for bad in ("loss", "costs/cum/all"):
        with pytest.raises(ConfigError):
            builder.add_metric(bad, 1.0)
    builder.add_cost("train/judge", 1.0)
    with pytest.raises(ConfigError, match="a leaf or a parent"):
        builder.add_cost("train/judge/extra", 1.0)
    with pytest.raises(ConfigError, match="source must be non-empty"):
        track_api_cost(source="/", provider="openai", model_name="m")
    with pytest.warns(GroupwiseWarning, match="no price known for 'acme/unknown'"):
        assert builder.add_response_cost("judge", _completion(10, 10), provider="openai", model_name="acme/unknown") is None
    with pytest.raises(LookupError):
        MetricsBuilder.get_active()
