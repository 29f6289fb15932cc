"""bench/envs_learning.py: its task holds its validation categories out of training and scores replies as
its docstring says; the table calls a run learned only when its final validation clears the base's beyond both
intervals. No model, no server, no verifiers or OpenEnv import: the training itself is the bench's
(docs/benchmarks.md), the adapters' plumbing is tests/envs/test_verifiers_hub.py's and test_openenv_hub.py's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "bench" / "envs_learning_tasks"))

import envs_learning  # noqa: E402
import oneword  # noqa: E402


def test_validation_holds_out_whole_categories():
    train, val = ({r["category"] for r in oneword.NAMING[split]} for split in ("train", "val"))
    assert train and val and train.isdisjoint(val) and train | val == set(oneword.CATEGORIES)
    assert len(oneword.NAMING["val"]) == 32 and len({r["request"] for r in oneword.NAMING["val"]}) == 32


@pytest.mark.parametrize("reply, score", [("Paris", 1.0), ("Paris.", 1.0), ("  paris!  ", 1.0),
                                          ("The capital is Paris.", 0.25), ("Paris, France", 0.5), ("", 0.0),
                                          ("...", 0.0)])
def test_one_word_pays_one_word_and_less_for_each_word_more(reply, score):
    assert oneword.one_word(reply) == pytest.approx(score)


def test_the_reward_pays_the_form_and_halves_a_reply_that_names_no_member():
    assert oneword.naming_reward("Apples", "fruit") == 1.0  # a plural names the member too
    assert oneword.naming_reward("Cheese", "fruit") == 0.5  # one word, not a fruit
    assert oneword.naming_reward("I like a ripe mango", "fruit") == pytest.approx(1 / 5)
    assert oneword.naming_reward("I cannot say", "fruit") == pytest.approx(0.5 / 3)
    assert oneword.mentions("The opposite is cold.", "cold") and not oneword.mentions("colder", "cold")


def _run(seed: int, values: list[tuple[float, float, float]], error: str | None = None) -> dict:
    run = {"seed": seed, "curve": [{"step": 5 * i, "value": v, "lo": lo, "hi": hi, "n": 32, "metrics": {}}
                                   for i, (v, lo, hi) in enumerate(values)]}
    return {**run, "error": error} if error else run


def test_a_run_learned_only_when_its_final_validation_clears_the_base_beyond_both_intervals():
    clear = envs_learning.verdict(_run(0, [(0.2, 0.1, 0.3), (0.5, 0.4, 0.6), (0.8, 0.7, 0.9)]))
    assert clear["learned"] and clear["best"]["step"] == 10 and clear["base"]["value"] == 0.2
    # +0.2, but the facing half-widths (0.15 and 0.15, in quadrature 0.21) are wider than the gain
    assert not envs_learning.verdict(_run(1, [(0.2, 0.05, 0.35), (0.4, 0.25, 0.55)]))["learned"]
    # a best mid-run that fell back by the end is not a final gain
    fell = envs_learning.verdict(_run(2, [(0.2, 0.1, 0.3), (0.8, 0.7, 0.9), (0.25, 0.15, 0.35)]))
    assert fell["best"]["value"] == 0.8 and not fell["learned"]
    assert not envs_learning.verdict(_run(3, [(0.2, 0.1, 0.3)]))["learned"]  # never validated after training


def test_the_table_has_a_row_per_run_and_says_how_many_seeds_learned():
    result = json.loads(json.dumps({
        "meta": {"command": "python bench/envs_learning.py --write-docs", "commit": "0123456789",
                 "machine": "AMD EPYC, 2 cores", "date": "2026-12-02", "wall_s": 1500.0, "steps": 10, "groups": 2,
                 "rollouts": 4, "lr": 1e-3, "max_tokens": 16, "eval_every": 5, "threads": 1},
        "envs": [{"env": "verifiers", "spec": "verifiers:SingleTurnEnv", "metric": "rubric_reward", "val_size": 32,
                  "wall_s": 700.0, "runs": [{**_run(0, [(0.2, 0.1, 0.3), (0.8, 0.7, 0.9)]), "stop": "converged"},
                                            _run(1, [(0.2, 0.1, 0.3)], error="EnvError: boom")]}]}))
    block = envs_learning.block(result)
    assert block.startswith("Measured by `python bench/envs_learning.py --write-docs` at commit `0123456789`")
    rows = [line for line in block.splitlines() if line.startswith("| verifiers")]
    assert len(rows) == 2
    assert "| 0.20 [0.10, 0.30] |" in rows[0] and "0.80 [0.70, 0.90] (5), stopped: converged" in rows[0]
    assert rows[0].endswith("| yes |")
    assert rows[1].endswith("| no; then ended by EnvError: boom |")
    assert "1 of 2 seeds learned beyond their noise" in block


def test_the_rubric_parts_are_reported_at_step_0_and_at_the_end():
    run = _run(0, [(0.2, 0.1, 0.3), (0.8, 0.7, 0.9)])
    for point, (form, answer) in zip(run["curve"], [(0.1, 0.3), (0.9, 0.7)]):
        point["metrics"] = {"one_word_reward": form, "names_a_member": answer}
    said = envs_learning.parts({"runs": [run]})
    assert "`one_word_reward` 0.10 -> 0.90" in said and "`names_a_member` 0.30 -> 0.70" in said
    assert envs_learning.parts({"runs": [_run(0, [(0.2, 0.1, 0.3), (0.8, 0.7, 0.9)])]}) == ""  # none reported
