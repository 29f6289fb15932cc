"""bench/distill_smollm2.py: how it counts the steps each arm needs to reach the teacher and when the issue's
target holds (on synthetic curves), the docs block it writes from a saved JSON, and its smoke run end to end
(a tiny random model: the teacher, both students, the JSON, the table and the PNG)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import distill_smollm2 as bench  # noqa: E402
import distill_tables as tables  # noqa: E402


def _curve(values: list[float], half_width: float = 0.1) -> list[dict]:
    return [{"step": s, "value": v, "lo": v - half_width, "hi": v + half_width} for s, v in enumerate(values)]


def _measurement(grpo: list[list[float]], distill: list[list[float]], teacher: float = 0.8) -> dict:
    seeds = list(range(len(grpo)))
    runs = {}
    for seed in seeds:
        runs[f"grpo-s{seed}"] = {"arm": "grpo", "seed": seed, "run_dir": "x", "curve": _curve(grpo[seed])}
        runs[f"sampled-s{seed}"] = {"arm": "sampled", "seed": seed, "run_dir": "x", "curve": _curve(distill[seed])}
    return json.loads(json.dumps({
        "meta": {"command": "python bench/distill_smollm2.py --device cuda --json d.json", "commit": "0123456789",
                 "machine": "an H200", "date": "2026-12-02", "env": "2048", "metric": "valid_move_rate",
                 "model": "smollm2-135m", "device": "cuda", "dtype": "bfloat16", "seeds": seeds,
                 "arms": ["grpo", "sampled"], "steps": max(len(c) for c in grpo) - 1, "teacher_seed": 100,
                 "learning_rate": 1e-3, "groups_per_step": 3, "rollouts_per_group": 8, "val_size": 24},
        "status": "done", "wall_s": 300.0,
        "teacher": {"run_dir": "t", "checkpoint": "t/checkpoints/0008", "seed": 100, "steps": 8,
                    "base": {"step": 0, "value": 0.3, "lo": 0.2, "hi": 0.4},
                    "best": {"step": 8, "value": teacher, "lo": teacher - 0.1, "hi": teacher + 0.1},
                    "clearly_above_base": True},
        "runs": runs}))


def test_a_run_reaches_the_teacher_at_its_first_step_whose_interval_holds_the_teachers_mean():
    curve = _curve([0.3, 0.5, 0.71, 0.75, 0.9])
    assert tables.steps_to_reach(curve, 0.8) == 2  # 0.71 + 0.1 >= 0.8: within its interval
    assert tables.steps_to_reach(curve, 0.95) == 4
    assert tables.steps_to_reach(curve, 1.01) is None
    assert tables.steps_to_reach([{"step": 0, "value": 0.9, "lo": None, "hi": None}], 0.8) == 0  # no interval: the mean


def test_the_target_holds_fails_or_stays_open_by_the_steps_each_arm_trained():
    assert tables.verdict(3, 12, 6, 12) == (True, "3 vs 6 steps")
    assert tables.verdict(4, 12, 7, 12)[0] is False
    # GRPO never reached the teacher in 12 steps: it needs 13 or more, so 6 is at most half, 7 open
    assert tables.verdict(6, 12, None, 12)[0] is True
    assert tables.verdict(7, 12, None, 12)[0] is None
    # distillation never reached it in 5 steps while GRPO did in 8: it needs 6 or more, more than half
    assert tables.verdict(None, 5, 8, 12)[0] is False
    assert tables.verdict(None, 3, 8, 12)[0] is None  # 4 or more: not yet known
    assert tables.verdict(None, 12, None, 12)[0] is None
    assert tables.verdict(0, 12, 0, 12)[0] is None  # the base already reaches the teacher
    # the ratio, or its bound where an arm never reached the teacher
    assert [tables.ratio_text(3, 12, 6, 12), tables.ratio_text(6, 12, None, 12), tables.ratio_text(None, 5, 8, 12),
            tables.ratio_text(None, 12, None, 12)] == ["0.50", "<= 0.46", ">= 0.75", "-"]


def _history(folder: Path, vals: dict[int, tuple[float, float, float]], stop_best: int | None = None) -> str:
    folder.mkdir(parents=True)
    rows = [{"step": s, "split": "val", "n_groups": 24, "valid_move_rate": v, "valid_move_rate_lo": lo,
             "valid_move_rate_hi": hi} for s, (v, lo, hi) in vals.items()]
    rows += [{"step": max(vals), "split": "stop", "best_step": stop_best}] if stop_best is not None else []
    (folder / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def test_the_teacher_is_its_best_checkpoint_and_clearly_above_its_base_only_beyond_both_noises(tmp_path):
    learnt = _history(tmp_path / "a", {0: (0.3, 0.2, 0.4), 4: (0.6, 0.5, 0.7), 8: (0.8, 0.7, 0.9)}, stop_best=8)
    t = bench.best_of(learnt, "valid_move_rate", None)  # the stop row's best
    assert (t["base"]["value"], t["best"]["step"], t["clearly_above_base"]) == (0.3, 8, True)
    assert bench.best_of(learnt, "valid_move_rate", 4)["best"]["value"] == 0.6
    assert bench.validated_on(learnt) == 24
    # 0.45 against 0.3: a gain inside the two intervals' noise is no teacher
    noisy = _history(tmp_path / "b", {0: (0.3, 0.15, 0.45), 8: (0.45, 0.3, 0.6)}, stop_best=8)
    assert bench.best_of(noisy, "valid_move_rate", None)["clearly_above_base"] is False


def test_a_teacher_run_is_a_run_folder_or_one_of_its_checkpoints():
    assert bench.given_teacher("s/2048/models/t") == ("s/2048/models/t", None)  # its best, from its history
    assert bench.given_teacher("s/2048/models/t/checkpoints/0008") == ("s/2048/models/t", 8)
    assert bench.given_teacher("s/2048/models/0008") == ("s/2048/models/0008", None)  # a run named 0008


def test_the_table_and_the_docs_block_say_per_seed_what_each_arm_needed(tmp_path):
    m = _measurement(grpo=[[0.3, 0.4, 0.5, 0.6, 0.75], [0.3, 0.35, 0.4, 0.45, 0.5], [0.3, 0.5, 0.72, 0.8, 0.8]],
                     distill=[[0.3, 0.72, 0.8, 0.8, 0.8], [0.3, 0.6, 0.75, 0.8, 0.8], [0.3, 0.45, 0.72, 0.8, 0.8]])
    table = tables.results_table(m)
    assert table[2:] == [
        "| 0 | sampled | 4 | 1 | 0.25 | **holds** (1 vs 4 steps) |",
        "| 1 | sampled | never (of 4) | 2 | <= 0.40 | **holds** (2 vs more than 4 steps) |",
        "| 2 | sampled | 2 | 2 | 1.00 | fails (2 vs 2 steps) |",
    ]
    assert tables.summary_sentence(m) == "distillation (sampled): the target holds on 2 of 3 seeds, fails on 1."
    assert "`t` trained 8 GRPO steps on 2048 (seed 100)" in tables.teacher_line(m)
    # a teacher the loop stopped early (every reply of a step solved) trained the steps of its last validation
    early = {**m, "teacher": {**m["teacher"], "curve": [{"step": 0}, {"step": 5}]}}
    assert "trained 5 GRPO steps (of up to 8) on 2048" in tables.teacher_line(early)
    docs = tmp_path / "benchmarks.md"
    oneword = "<!-- bench:distill_smollm2 -->\nthe oneword evidence\n<!-- /bench:distill_smollm2 -->\n"
    docs.write_text("# B\n\n<!-- bench:distill_smollm2_2048 -->\nNot measured yet.\n<!-- /bench:distill_smollm2_2048 -->\n"
                    + oneword + "after\n")
    saved = tmp_path / "d.json"
    saved.write_text(json.dumps(m))
    png = tmp_path / "img" / "d.png"
    bench.main(["--from-json", str(saved), "--write-docs", "--docs", str(docs), "--png", str(png)])
    text = docs.read_text()
    # a 2048 measurement writes the 2048 block; the oneword one (another env's evidence) stays as it was
    assert (tables.block_name("2048"), tables.block_name("oneword")) == ("distill_smollm2_2048", "distill_smollm2")
    assert text.startswith("# B\n\n<!-- bench:distill_smollm2_2048 -->\nMeasured by `python bench/distill_smollm2.py "
                           "--device cuda --json d.json` at commit `0123456789` on an H200, 2026-12-02.")
    assert "Not measured yet" not in text and text.endswith("<!-- /bench:distill_smollm2_2048 -->\n" + oneword + "after\n")
    assert "| 0 | sampled | 4 | 1 | 0.25 | **holds** (1 vs 4 steps) |" in text
    assert "| step | grpo-s0 | sampled-s0 | grpo-s1 | sampled-s1 | grpo-s2 | sampled-s2 |" in text
    assert "| 4 | 0.750 [0.650, 0.850] | 0.800 [0.700, 0.900] |" in text
    assert "![validation per step, both arms, per seed](img/d.png)" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_repository_docs_hold_each_envs_block_once():
    from results_block import BENCHMARKS, blocks

    assert [blocks(BENCHMARKS).count(tables.block_name(env)) for env in ("oneword", "2048")] == [1, 1]


def test_a_student_scenario_field_is_read_as_json_where_it_parses():
    assert [bench.scenario_field(t) for t in ("reward=exact", "max_tokens=8", "strict=true")] == [
        ("reward", "exact"), ("max_tokens", 8), ("strict", True)]
    for bad in ("reward", "=exact", "two words=1"):
        with pytest.raises(argparse.ArgumentTypeError, match="FIELD=VALUE"):
            bench.scenario_field(bad)


def test_the_smoke_run_trains_the_teacher_and_both_students_and_writes_their_curves(tmp_path):
    out = tmp_path / "d.json"
    m = bench.main(["--smoke", "--val-size", "2", "--student-scenario", "reward=exact", "--json", str(out),
                    "--png", str(tmp_path / "d.png")])
    saved = json.loads(out.read_text())
    assert saved["status"] == "done" and saved == json.loads(json.dumps(m))
    assert (saved["meta"]["env"], saved["meta"]["student_scenario"]) == ("oneword", {"reward": "exact"})
    # the students trained on the sparse reward: each of their 2 rollouts scored 0 or 1 (the teacher's graded
    # reward, 1 / words, of a tiny random model's many-word replies is neither)
    for name in ("grpo-s0", "sampled-s0"):
        assert saved["runs"][name]["curve"][1]["train_reward"] in (0.0, 0.5, 1.0), name
    assert saved["teacher"]["best"]["step"] in (0, 1) and saved["meta"]["val_size"] == 2
    for name in ("grpo-s0", "sampled-s0"):
        run = saved["runs"][name]
        assert [p["step"] for p in run["curve"]] == [0, 1], name
        assert all(0.0 <= p["lo"] <= p["value"] <= p["hi"] <= 1.0 for p in run["curve"]), name
    # the distilling student trained against the teacher's checkpoint: its step's row has the teacher's KL
    assert saved["runs"]["sampled-s0"]["curve"][1]["teacher_kl"] is not None
    assert saved["runs"]["grpo-s0"]["curve"][1]["teacher_kl"] is None
    assert (tmp_path / "d.png").stat().st_size > 0
