"""The results tables of README.md and docs/benchmarks.md are written by the bench script that measures
them (bench/results_block.py, bench/seeds_2048.py), each with its command, commit and machine, and a
row's `groupwise train` line is one the CLI accepts. On synthetic results: nothing is trained here."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import results_block  # noqa: E402
import seeds_2048  # noqa: E402


def _summary(seed: int, base: float, best: float, test: float, wall_s: float, peak: float = 3.1,
             metric: str = "valid_move_rate") -> dict:
    return {"seed": seed, "learning_rate": 1e-3, "metric": f"val/{metric}", "base": base,
            "base_interval": [base - 0.1, base + 0.1], "trained_best": best,
            "best_interval": [best - 0.05, best + 0.05], "best_step": 8,
            "test": {metric: test, f"{metric}_lo": test - 0.1, f"{metric}_hi": test + 0.1},
            "wall_s": wall_s, "peak_rss_gb": peak, "val_by_step": {"0": base, "4": (base + best) / 2, "8": best}}


def _measurement(runs: list[dict], row_command: str) -> dict:
    # a results.json as measure() writes it: the JSON round trip turns val_by_step's keys into strings
    return json.loads(json.dumps({
        "command": "python bench/seeds_2048.py --seeds 0-2 --threads 2 --write-readme --write-docs",
        "commit": "0123456789", "machine": "AMD EPYC 7R13, 2 cores, 24 GiB, torch 2.13.0",
        "date": "2026-11-27", "row_command": row_command, "parallel": 1, "runs": runs}))


ROW = "OMP_NUM_THREADS=2 groupwise train 2048 --seed S --device cpu --batch-invariant"
RUNS = [
    {"lr": None, "seed": 0, "rc": 0, "wall_s": 400.0, "summary": _summary(0, 0.25, 0.91, 0.78, 390.0, 3.24)},
    {"lr": None, "seed": 1, "rc": 0, "wall_s": 330.0, "summary": _summary(1, 0.30, 0.40, 0.50, 320.0, 2.99)},
    {"lr": None, "seed": 2, "rc": 1, "wall_s": 12.0, "summary": None},
]


def test_the_readme_table_says_what_was_measured_where_and_how_to_reproduce_a_column():
    block = seeds_2048.readme_block(_measurement(RUNS, ROW))
    lines = block.splitlines()
    assert lines[0] == (
        "Measured by `python bench/seeds_2048.py --seeds 0-2 --threads 2 --write-readme --write-docs` at commit "
        "`0123456789` on AMD EPYC 7R13, 2 cores, 24 GiB, torch 2.13.0, 2026-11-27. One run at a time; "
        f"`{ROW}` (S the row's seed) reproduces its row exactly on the same machine (`--batch-invariant`).")
    table = [line for line in lines if line.startswith("|")]
    assert table == [
        "| seed | 0 | 1 | 2 | mean | worst |",
        "|---|---|---|---|---|---|",
        "| validation base | 0.250 | 0.300 | failed | 0.275 |  |",
        "| validation best | 0.910 | 0.400 | failed | 0.655 | 0.400 (seed 1) |",
        "| gain | +0.66 | +0.10 | failed | +0.38 | +0.10 |",
        "| test | 0.780 | 0.500 | failed | 0.640 | 0.500 |",
        "| minutes | 6.5 | 5.3 | failed | 5.9 | 6.5 |",
    ]
    assert lines[-1] == (
        "1 of 2 seeds beat their base by at least +0.15 (gains +0.10 to +0.66, mean +0.38); the held-out test "
        "of the best checkpoint averages 0.640. Wall time 5.3-6.5 minutes a run, peak memory 2.99-3.24 GiB. "
        "Below the bar: seed 1 (+0.10). Failed (no summary): seed 2.")


def test_the_docs_table_has_intervals_and_one_row_per_rate_when_several_were_run():
    runs = [dict(r, lr="5e-4") for r in RUNS[:2]] + [dict(RUNS[0], lr="1e-3")]
    block = seeds_2048.docs_block(_measurement(runs, "groupwise train 2048 --seed S --device cpu"))
    assert "without `--batch-invariant` the engine's batching moves the logits' last bits" in block
    assert "(S the row's seed and `--lr` the row's rate)" in block
    assert "| 5e-4 | 0 | 0.250 | 0.910 [0.860, 0.960] (step 8) | +0.660 | 0.780 [0.680, 0.880] | 6.5 min | 3.24 GiB |" in block
    assert block.splitlines()[-2:] == ["| 5e-4 | 2 | 0.465 | +0.100 / +0.380 | 1 of 2 |",  # by rate, ascending
                                       "| 1e-3 | 1 | 0.580 | +0.660 / +0.660 | 1 of 1 |"]
    with pytest.raises(SystemExit, match="one learning rate"):
        seeds_2048.readme_block(_measurement(runs, ROW))


def test_the_other_envs_table_has_an_env_column_with_each_envs_metric_and_a_sentence_each():
    runs = [{"env": "tictactoe", "lr": None, "seed": 0, "rc": 0, "wall_s": 500.0,
             "summary": _summary(0, 0.0, 0.208, 0.125, 504.0, metric="win_rate")},
            {"env": "tictactoe", "lr": None, "seed": 1, "rc": 0, "wall_s": 550.0,
             "summary": _summary(1, 0.0, 0.0, 0.083, 552.0, metric="win_rate")},
            {"env": "math", "lr": None, "seed": 0, "rc": 0, "wall_s": 420.0,
             "summary": _summary(0, 0.146, 0.146, 0.140, 426.0, metric="correct")}]
    m = _measurement(runs, "OMP_NUM_THREADS=2 groupwise train ENV --seed S --device cpu --batch-invariant")
    block = seeds_2048.docs_block(m)
    assert "(ENV the row's env, S the row's seed)" in block
    rows = [line for line in block.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| env (metric) | seed |")
    assert [r.split(" | ")[:3] for r in rows[1:]] == [["| tictactoe (win_rate)", "0", "0.000"], ["| ", "1", "0.000"],
                                                       ["| math (correct)", "0", "0.146"]]
    assert "| 0.125 [0.025, 0.225] |" in rows[1]  # the test under the env's own metric
    sentences = block.splitlines()[-2:]
    assert sentences[0].startswith("tictactoe: 1 of 2 seeds beat their base by at least +0.15")
    assert sentences[1].startswith("math: 0 of 1 seeds beat their base")
    with pytest.raises(SystemExit, match="writes the 2048 table"):
        seeds_2048.readme_block(m)


def test_writing_a_block_replaces_only_what_lies_between_its_markers(tmp_path):
    doc = tmp_path / "README.md"
    doc.write_text("intro\n<!-- bench:seeds_2048 -->\nold table\n<!-- /bench:seeds_2048 -->\nafter\n")
    results_block.write_block(doc, "seeds_2048", "| new |\n")
    results_block.write_block(doc, "seeds_2048", "| newer |\n")  # idempotent: the markers stay
    assert doc.read_text() == "intro\n<!-- bench:seeds_2048 -->\n| newer |\n<!-- /bench:seeds_2048 -->\nafter\n"
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit, match="needs exactly one <!-- bench:seeds_2048 -->"):
        results_block.write_block(doc, "seeds_2048", "x")


def test_the_script_writes_both_files_from_a_saved_measurement(tmp_path, monkeypatch):
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(_measurement(RUNS, ROW)))
    readme, docs = tmp_path / "README.md", tmp_path / "benchmarks.md"
    for f in (readme, docs):
        f.write_text("before\n<!-- bench:seeds_2048 -->\n<!-- /bench:seeds_2048 -->\nafter\n")
    monkeypatch.setattr(seeds_2048, "README", readme)
    monkeypatch.setattr(seeds_2048, "BENCHMARKS", docs)
    monkeypatch.setattr(sys, "argv", ["seeds_2048.py", "--from-json", str(saved), "--write-readme", "--write-docs"])
    seeds_2048.main()
    assert results_block.read_block(readme, "seeds_2048") == seeds_2048.readme_block(_measurement(RUNS, ROW))
    assert results_block.read_block(docs, "seeds_2048") == seeds_2048.docs_block(_measurement(RUNS, ROW))
    assert docs.read_text().startswith("before\n") and docs.read_text().endswith("after\n")


def test_the_repository_docs_have_the_markers_the_scripts_write_between():
    for doc, names in ((results_block.README, ["seeds_2048"]),
                       (results_block.BENCHMARKS, ["seeds_2048", "seeds_other_envs", "gather"])):
        for name in names:
            assert results_block.blocks(doc).count(name) == 1, (doc, name)
            assert doc.read_text().count(f"<!-- /bench:{name} -->") == 1, (doc, name)


def test_a_rows_command_is_one_the_cli_accepts():
    from groupwise.cli import build_parser

    args = argparse.Namespace(
        device="cpu", dtype="float32", model=None, steps="16", batch_invariant=True)
    line = seeds_2048.row_command(seeds_2048.job_flags(args, "1e-3"), threads=2, seed="7")
    assert line == ("OMP_NUM_THREADS=2 groupwise train 2048 --seed 7 --device cpu --lr 1e-3 --dtype float32 "
                    "--steps 16 --batch-invariant")
    words = shlex.split(line)
    assert words[:2] == ["OMP_NUM_THREADS=2", "groupwise"]
    parsed = build_parser().parse_args(words[2:])
    job = parsed._command.job(**{k: v for k, v in vars(parsed).items() if not k.startswith("_")})
    assert (job.env, job.seed, job.device, job.lr, job.dtype, job.steps, job.batch_invariant) == (
        "2048", 7, "cpu", [1e-3], "float32", 16, True)


def test_provenance_names_the_commit_and_says_when_the_code_had_uncommitted_changes(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "--short=10", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert results_block.commit(tmp_path) == head
    (tmp_path / "src" / "a.py").write_text("x = 2\n")
    assert results_block.commit(tmp_path) == f"{head} + uncommitted changes"
    assert " cores" in results_block.machine("cpu")


def test_the_detector_bench_writes_its_figures_once_into_the_detector_configs_docstring(tmp_path):
    import dataclasses

    import detector_tables as bench

    from groupwise.config import DetectorConfig

    config = tmp_path / "config.py"
    original = (REPO / "src" / "groupwise" / "config.py").read_text()
    config.write_text(original)
    rows = [{"detector": name, "false_alarms": 1, "clean": 4, "detected": 2, "dropped": 3, "early": 1,
             "leads": [1.0, -2.0]} for name in bench.FIELDS]
    bench.write_defaults_help(config, {"rows": rows})
    bench.write_defaults_help(config, {"rows": rows})  # idempotent: the figures are replaced, not appended
    text = config.read_text()
    lines = [line for line in text.splitlines() if line.startswith("    - ") and "planted hacks" in line]
    assert lines == [f"    - {name} ({', '.join(fields)}): false alarms on 1/4 clean runs, fired on 2/3 planted "
                     "hacks (1 before the validation drop, median lead -0.5 steps)." for name, fields in bench.FIELDS.items()]
    # only those lines changed, and the repository's file has one line per detector in the same place
    assert [l for l in text.splitlines() if l not in lines] == [
        l for l in original.splitlines() if not (l.startswith("    - ") and "planted hacks" in l)]
    assert sum(1 for l in original.splitlines() if l.startswith("    - ") and "planted hacks" in l) == len(bench.FIELDS)
    # each field's help says only what is particular to it: no sentence is repeated across the fields
    sentences = [s.strip() for f in dataclasses.fields(DetectorConfig) for s in f.metadata["help"].split(". ")]
    assert len(sentences) == len(set(sentences)) and not any("Measured" in s for s in sentences)
