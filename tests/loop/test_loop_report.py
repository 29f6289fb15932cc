"""`groupwise report` and `groupwise compare` on a run made by fit with the scripted backend."""

import asyncio
import sys

import pytest
from loop_helpers import SCENARIOS, ScriptedBackend, make_rollout

import groupwise as gw
from groupwise.cli import main
from groupwise.runs.compare import compare
from groupwise.runs.report import table, val_metric_name


def gamed(step, scenario):
    if step <= 2:
        return f"answer {scenario['answer']}", 0.1 * step
    return "pad " * (5 * step), 0.1 * step + 0.5


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("report")

    async def go():
        model = gw.TrainableModel("gamed", project="rep", base_model="none", base_path=str(base))
        await model.register(ScriptedBackend())
        cfg = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, eval_every=2, max_steps=20, num_epochs=10)
        # four validation scenarios: a fall from 3/3 to 0/3 is inside val_drop's noise (the two readings'
        # plus the best-of-3 excess); from 4/4 to 0/4 beyond it
        return await gw.fit(model, make_rollout(gamed), SCENARIOS[:7], val_scenarios=SCENARIOS[7:11],
                            validate=lambda t, s: float(t.messages()[-1]["content"] == f"answer {s['answer']}"),
                            baselines=[gw.Model("prompted", project="rep")], config=cfg)

    return asyncio.run(go()).run_dir


def test_report_writes_pngs_and_prints_the_table(run_dir, tmp_path, capsys):
    assert main(["report", run_dir, "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    for name in ("curves.png", "cost.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    lines = text.splitlines()
    assert lines[0].split() == ["step", "train", "reward", "val", "accuracy", "time", "s", "judge", "$", "alerts"]
    # step 0: train reward 0.000 +- 0.000 (gamed at step 0), val 1.000
    assert lines[2].split()[:5] == ["0", "0.000", "+-", "0.000", "1.000"]
    assert any(line.split()[0] == "4" and "val_drop(stop)" in line for line in lines[2:8])
    assert "baseline gamed@0: val accuracy = 1.000" in text and "baseline prompted: val accuracy = 1.000" in text
    assert "stopped at step 4 (alert:val_drop)" in text and "best val/accuracy: step 2" in text


def test_report_table_and_metric_from_history(run_dir):
    h = gw.load_history(run_dir)
    assert val_metric_name(h) == "accuracy"
    assert "val_drop(stop)" in table(h)
    # each validation shows its interval: 4 of 4 right on 4 scenarios is 1.000 with Wilson [0.510, 1]
    assert "1.000 [0.510, 1.000]" in table(h).splitlines()[2]


def test_report_draws_the_validation_interval(run_dir, tmp_path, monkeypatch):
    import matplotlib.axes

    drawn = []
    real = matplotlib.axes.Axes.errorbar
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar",
                        lambda self, x, y, *a, **k: drawn.append((list(x), list(y), k.get("yerr"))) or real(self, x, y, *a, **k))
    from groupwise.runs.report import plot_run

    plot_run(gw.load_history(run_dir), tmp_path)
    (steps, values, (below, above)), = drawn
    assert steps == [0, 2, 4] and values[0] == 1.0 and below[0] == pytest.approx(1 - 0.5101, abs=1e-3) and above[0] == 0


def test_report_external_loggers_fail_loud_when_missing(run_dir, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError, installed or not
    assert main(["report", run_dir, "--out", str(tmp_path), "--wandb", "proj"]) == 1
    assert capsys.readouterr().err.splitlines()[-1].endswith("Install it with: pip install 'groupwise[wandb]'")


def _val_points(run_dir, metric):
    return [(r["step"], r[metric]) for r in gw.load_history(run_dir) if r.get("split") == "val" and metric in r]


def test_report_replays_the_history_into_tensorboard(run_dir, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (extra 'tensorboard')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert main(["report", run_dir, "--out", str(tmp_path / "png"), "--tensorboard", str(tmp_path / "tb")]) == 0
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    expected = _val_points(run_dir, "accuracy")
    assert len(expected) >= 3
    got = [(e.step, e.value) for e in events.Scalars("val/accuracy")]
    assert [s for s, _ in got] == [s for s, _ in expected]
    assert [v for _, v in got] == pytest.approx([v for _, v in expected])
    assert "train/reward" in events.Tags()["scalars"]


def test_report_replays_the_history_into_wandb_offline(run_dir, tmp_path):
    pytest.importorskip("wandb", reason="wandb is not installed (extra 'wandb')")
    import os
    import subprocess

    # The real command in a process of its own, as a user runs it: W&B keeps a per-process service whose
    # settings an earlier test in this process could have fixed. Offline: no account, no network.
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    cmd = [sys.executable, "-m", "groupwise.cli", "report", run_dir, "--out", str(tmp_path / "png"), "--wandb", "gw-test"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    data = runs[0].read_bytes()  # W&B's record file: the logged keys appear in it as text
    assert data.count(b"val/accuracy") >= len(_val_points(run_dir, "accuracy")) >= 3
    assert b"train/reward" in data


def test_report_on_a_folder_without_history(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "holds no run (no history.jsonl or trajectories/ at or below it)" in capsys.readouterr().err


def test_compare_base_and_best_side_by_side(run_dir, capsys):
    # best is step 2 (val 1.0 at 0 and 2, 0.0 at 4: the latest of equal bests); compare 2 and latest (4)
    text = compare(run_dir, "2,latest", split="val", n=2, width=100)
    assert "val answers of step 2 (left) and step 4 (right)" in text
    assert "scenario 0: question 7" in text and "scenario 1: question 8" in text
    pair = [line for line in text.splitlines() if line.startswith("answer 7 ")][0]
    left, right = pair.split(" | ")
    assert left.strip() == "answer 7" and right.startswith("pad pad")
    assert "step 2: reward 0.2, accuracy 1" in text and "step 4: reward 0.9, accuracy 0" in text
    assert main(["compare", run_dir, "--steps", "0,best", "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "step 0 (left) and step 2 (right)" in out  # best resolved from the stop row
    assert main(["compare", run_dir, "--steps", "0,7"]) == 2
    assert "stored steps: [0, 2, 4]" in capsys.readouterr().err


def test_report_of_rewards_near_the_float_limit_draws_and_prints(tmp_path, capsys):
    # finite rewards are accepted however large; near 1e308 matplotlib's ticks overflowed and the report
    # died with a traceback, and the table printed a 300-digit number
    from groupwise.runs.store import RunStore, history_row

    big = 1.7e308
    group = gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=r)
                                for r in (big, -big, 0.0)])
    store = RunStore(tmp_path, "p", "huge")
    store.append_history(history_row([group], step=0, split="train"))
    assert main(["report", str(store.run_dir), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    row = [line for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["0"]][0]
    assert row.split()[:4] == ["0", "0.000", "+-", "1.388e+308"]


def test_report_reads_an_integer_past_floats_range_as_no_number(tmp_path, capsys):
    # history_row now refuses such a metric; a file written before (or by hand) made `groupwise report`
    # die with OverflowError in math.isfinite (curves.value), and the dashboard's reader too.
    import json

    from groupwise.dashboard.runs import _finite
    from groupwise.runs.store import RunStore, history_row

    store = RunStore(tmp_path, "p", "bigint")
    group = gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=r)
                                for r in (0.0, 1.0)])
    row = history_row([group], step=0, split="train")
    store.history_path.parent.mkdir(parents=True)
    store.history_path.write_text(json.dumps({**row, "reward": 10**400, "x": 10**400}) + "\n")
    assert main(["report", str(store.run_dir), "--out", str(tmp_path / "out")]) == 0
    assert _finite(10**400) is None and _finite(3) == 3.0


def test_a_running_runs_metric_is_the_one_validated_with_an_interval():
    """Before its stop row, `groupwise report` on a 2048 run plotted and named max_tile (the first number of
    its val rows) while the job tracked valid_move_rate: the metric with an interval is the one validated."""
    from groupwise.runs.report import val_metric_name

    history = [{"step": 0, "split": "val", "reward": -0.9, "max_tile": 2.6, "board_sum": 6.3, "valid_move_rate": 0.3,
                "valid_move_rate_lo": 0.15, "valid_move_rate_hi": 0.45, "valid_move_rate_n": 24}]
    assert val_metric_name(history) == "valid_move_rate"
    assert val_metric_name([{"step": 0, "split": "val", "reward": 1.0, "accuracy": 0.5}]) == "accuracy"
