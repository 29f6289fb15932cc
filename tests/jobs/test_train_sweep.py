"""`groupwise train <env> --seeds 0-1 --lr ...`: a sweep trains its runs at once in one process, one copy of
the model, a line per step per run and a table at the end (jobs/train_sweep.py)."""

import json

import pytest

from groupwise.errors import ConfigError
from groupwise.jobs.train import TrainJob


def test_a_sweep_is_every_seed_with_every_rate_and_refuses_what_names_one_run():
    job = TrainJob("2048", seeds=[0, 1], lr=[5e-4, 1e-3])
    assert job.runs() == [(0, 5e-4), (0, 1e-3), (1, 5e-4), (1, 1e-3)]
    assert job.preset(1e-3).learning_rate == 1e-3 and TrainJob("2048", seed=3).runs() == [(3, None)]
    with pytest.raises(ConfigError, match="--name names one run"):
        TrainJob("2048", seeds=[0, 1], name="mine")
    # the warm start is each run's: a sweep may ask for it, and tic-tac-toe's preset does
    assert TrainJob("2048", seeds=[0, 1], sft=4).preset().sft == 4
    assert TrainJob("tictactoe").preset().sft == 64 and TrainJob("tictactoe", sft=0).preset().sft == 0
    assert TrainJob("2048").preset().sft == 0 and TrainJob("tictactoe-minimax").preset().sft == 0


@pytest.mark.parametrize("engine_process", ["auto", "separate"])
def test_a_sweep_warm_starts_each_run_then_trains_it(tmp_path, capsys, tiny_model_dir, engine_process):
    # "separate": the runs' commands overlap over the worker's pipe (backend/processes.py), as a sweep on
    # CUDA runs them by default
    import asyncio

    import groupwise as gw
    from groupwise.jobs.train import train

    job = TrainJob("tictactoe", model=tiny_model_dir, seeds=[0, 1], path=str(tmp_path), device="cpu", sft=2,
                   sft_epochs=1, sft_lr=1e-3, steps=1, groups_per_step=2, rollouts_per_group=2,
                   engine_process=engine_process)
    result = asyncio.run(train(job))
    out = capsys.readouterr().out
    assert "first a warm start on 2 demonstrations each" in out
    assert ("run in a core process of their own" in out) == (engine_process == "separate")
    for seed, row in zip((0, 1), result["runs"]):
        assert row["sft_steps"] == 1 and row["final_step"] == 2 and row["sft"] is not None, row
        history = gw.load_history(row["run_dir"])
        assert [r["step"] for r in history if r["split"] == "sft"] == [0]
        assert [r["step"] for r in history if r["split"] == "train"] == [1]
        assert [r["name"] for r in history if r["split"] == "baseline"] == [f"tictactoe-s{seed}@0", f"tictactoe-s{seed}@1"]


def test_the_cli_trains_two_seeds_at_once_and_prints_a_line_per_step_per_run_and_a_table(tmp_path, capsys, monkeypatch,
                                                                                          tiny_model_dir):
    from groupwise.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit:
        main(["train", "2048", "--seed", "1", "--seeds", "0-1"])
    assert exit.value.code == 2 and "--seeds: not allowed with argument --seed" in capsys.readouterr().err
    code = main(["train", "2048", "--model", tiny_model_dir, "--steps", "1", "--path", "runs",
                 "--device", "cpu", "--seeds", "0-1", "--lr", "2e-3", "--groups-per-step", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "2 runs at once on one copy of" in out
    for seed in (0, 1):
        assert f"[groupwise train] [2048-s{seed}] step 1/1 · reward" in out
        summary = json.loads((tmp_path / "runs" / "2048" / "models" / f"2048-s{seed}" / "summary.json").read_text())
        assert summary["seed"] == seed and summary["learning_rate"] == 2e-3 and summary["final_step"] == 1
        row = next(line for line in out.splitlines() if line.startswith(f"| 2048-s{seed} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == "0.002" and cells[5] == "max_steps"
        assert cells[2].startswith(f"{summary['base']:.3f} [") and cells[4].count("[") == 1  # intervals
    assert "| run | lr | val valid_move_rate base | best (step) | test | stopped | minutes |" in out
