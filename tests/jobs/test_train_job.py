"""`groupwise train`'s own logic: the CPU step settings that keep memory low, and advice that fits the run."""

import dataclasses
import shlex
import json

import pytest

import groupwise as gw
from groupwise.errors import ConfigError
from groupwise.envs import get_env
from groupwise.runs.series import Point
from groupwise.jobs.train import PRESETS, Preset, TrainJob, advice
from groupwise.jobs.train_setup import train_config

RUN = ".groupwise/2048/models/2048-s3"


def tips(base, best, rule, final_step=8):
    return " ".join(advice(base, best, final_step, rule, env="2048", seed=3, steps=8, run_dir=RUN))


def test_advice_fits_how_the_run_went():
    base = Point(0, 0.30, 0.20, 0.40)
    # learned beyond the noise: train longer by resuming with more steps
    text = tips(base, Point(8, 0.70, 0.60, 0.80), "max_steps")
    assert "it learned" in text and "`groupwise train 2048 --seed 3 --steps 16` continues this run from step 8" in text
    assert f"groupwise report {RUN}" in text
    # a gain inside the noise: more steps or another seed, nothing about a reward
    text = tips(base, Point(8, 0.36, 0.26, 0.46), "max_steps")
    assert "did not rise beyond its noise" in text and "--seed 4" in text and "--steps 16" in text
    assert "reward" not in text
    # the best is still the base
    assert "did not rise beyond its noise" in tips(base, base, "max_steps")
    # hacking: the built-in env's reward cannot be changed from the CLI, so another seed (and gw.fit for one's own)
    text = tips(base, base, "alert:val_drop", final_step=4)
    assert "--split train --best" in text and "--seed 4" in text and "gw.fit" in text
    # instability is not called hacking
    text = tips(base, base, "alert:val_unstable", final_step=4)
    assert "--seed 4" in text and "gamed" in text and "hacking" not in text


def test_cpu_micro_batches_are_small_and_keep_the_gradient():
    config = train_config(get_env("2048"), 1e-3, "cpu")
    assert isinstance(config, gw.TrainConfig) and config.micro_batch_tokens == 512
    assert config.learning_rate == 1e-3  # the TrainConfig owns the rate (the loop's is left unset)
    email = train_config(get_env("email"), 5e-5, "cpu")
    assert email.gradient_checkpointing and email.micro_batch_tokens == 2048


def test_distill_top_k_selects_the_top_k_estimate_and_needs_a_teacher():
    assert train_config(get_env("2048"), 1e-3, "cpu").distill_estimate == "sampled"  # TrainConfig's default
    config = train_config(get_env("2048"), 1e-3, "cpu", distill_top_k=20)
    assert (config.distill_estimate, config.distill_top_k) == ("topk", 20)
    assert TrainJob("2048", teacher="base", distill_top_k=20).distill_top_k == 20
    with pytest.raises(ConfigError, match="--distill-top-k sets how a teacher's KL is estimated: give the teacher "
                                          "with --teacher"):
        TrainJob("2048", distill_top_k=20)


def test_an_envs_preset_fills_what_the_job_leaves_out():
    assert TrainJob("2048").preset() == PRESETS["2048"]
    job = TrainJob("2048", lr=[2e-3], steps=3, groups_per_step=5)
    assert (job.preset().learning_rate, job.preset().steps, job.preset().groups_per_step) == (2e-3, 3, 5)
    assert job.preset().rollouts_per_group == PRESETS["2048"].rollouts_per_group
    assert set(PRESETS) == set(__import__("groupwise.envs", fromlist=["ENVS"]).ENVS)  # one preset per env
    # every preset setting is a flag of the same name (the rate: --lr), or the preset's own (val_size, and what
    # a run with a teacher trains at in place of the rate and the iterations)
    flags = {f.name for f in dataclasses.fields(TrainJob)}
    assert {f.name for f in dataclasses.fields(Preset)} - flags == {"learning_rate", "val_size", "distill_learning_rate",
                                                                     "distill_iterations"}
    # a run with a teacher takes the distillation preset; a flag given still replaces it
    assert (TrainJob("2048").preset().num_iterations, PRESETS["2048"].distill_iterations) == (1, 4)
    distilling = TrainJob("2048", teacher="base").preset()
    assert (distilling.num_iterations, distilling.learning_rate) == (4, PRESETS["2048"].learning_rate)
    assert TrainJob("2048", teacher="base", num_iterations=2, lr=[5e-4]).preset().num_iterations == 2
    assert TrainJob("2048", teacher="base", lr=[5e-4]).preset().learning_rate == 5e-4
    assert TrainJob("oneword", teacher="base").preset() == PRESETS["oneword"]  # no distillation preset: GRPO's
    job = TrainJob("tictactoe", sft=0)  # a flag given at 0 still replaces the preset's 64
    assert job.preset().sft == 0 and PRESETS["tictactoe"].sft == 64


def test_the_job_says_each_step_and_its_stop_once(tmp_path, capsys, monkeypatch, tiny_model_dir):
    # The whole main job on a tiny random model for one step: the per-step line, the summary, and the stop
    # reason printed once (it used to come from the loop and again from the summary).
    from groupwise.cli import main

    monkeypatch.chdir(tmp_path)  # --path relative, as the default .groupwise is
    code = main(["train", "2048", "--model", tiny_model_dir, "--steps", "1", "--path", "runs",
                 "--device", "cpu", "--lr", "2e-3"])
    out = capsys.readouterr().out
    assert code == 0
    assert "[groupwise train] step 1/1 · reward" in out and "ETA" in out
    assert out.count("reached max_steps=1") == 1, out
    assert "validation valid_move_rate: base" in out and "test (48 held-out scenarios" in out
    assert "lr=0.002" in out  # --lr replaces the env's rate (1e-3)
    # the dashboard command works from any folder (a second terminal opens elsewhere), and says where to look
    assert (f"watch it live: run `groupwise dashboard {(tmp_path / 'runs').resolve()}` in another terminal, "
            "then open http://127.0.0.1:8100") in out
    summary = json.loads((tmp_path / "runs" / "2048" / "models" / "2048-s0" / "summary.json").read_text())
    assert summary["learning_rate"] == 2e-3


def test_a_judge_that_fails_the_labelled_check_stops_the_job_before_training(tmp_path, capsys, monkeypatch,
                                                                              tiny_model_dir):
    # `groupwise train titles --judge ollama/a --judge-labels FILE`: the judge is evaluated on a labelled
    # title pair first. It cannot answer (an Ollama host on a closed port), so it orders the pair no
    # better than chance; the job stops with the table (exit 1) before any step is trained.
    from groupwise.cli import main

    monkeypatch.setenv("OLLAMA_HOST", "http://127.0.0.1:9")
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"messages": [{"role": "user", "content": "A library now lends tools."}],
                                  "chosen": "Borrow a Drill: The Library That Lends Tools",
                                  "rejected": "YOU WON'T BELIEVE WHAT HAPPENED NEXT!!!"}) + "\n")
    code = main(["train", "titles", "--model", tiny_model_dir, "--steps", "1", "--path", str(tmp_path / "runs"),
                 "--device", "cpu", "--judge", "ollama/a", "--judge-labels", str(labels)])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert "no judge orders the labelled set better than chance" in err and "pairwise acc" in err
    assert "ollama/a" in err and "0.50 [0.50, 0.50]" in err and "acc lo > 0.55" in err
    assert not (tmp_path / "runs" / "titles" / "models" / "titles-s0" / "history.jsonl").exists()


def test_advice_repeats_the_flags_that_name_the_run(tmp_path):
    """`groupwise train 2048 --path P --steps 1` ended advising `groupwise train 2048 --seed 0 --steps 5`,
    which, typed as printed, trains a new run in .groupwise instead of continuing the one in P."""
    store = tmp_path / "my runs"
    job = TrainJob(env="2048", path=str(store), lr=[5e-4], rollouts_per_group=4, batch_invariant=True, steps=1,
                   seed=2)
    flags = job.same_run_flags()
    assert flags == f"--path '{store}' --lr 0.0005 --rollouts-per-group 4 --batch-invariant"
    text = " ".join(advice(Point(0, 0.3, 0.2, 0.4), Point(0, 0.3, 0.2, 0.4), 1, "max_steps", env="2048", seed=2,
                           steps=1, run_dir=RUN, flags=flags))
    assert f"`groupwise train 2048 --seed 2 {flags} --steps 5` continues this run from step 1" in text
    assert f"`groupwise train 2048 --seed 3 {flags}`" in text
    named = TrainJob(env="2048", name="mine", judge=["local/a", "local/b"], judge_labels="titles")
    assert named.same_run_flags() == "--judge local/a --judge local/b --judge-labels titles"
    text = " ".join(advice(Point(0, 0.3, 0.2, 0.4), Point(4, 0.9, 0.8, 1.0), 4, "max_steps", env="2048", seed=0,
                           steps=4, run_dir=RUN, flags="", name="mine"))
    assert "`groupwise train 2048 --seed 0 --name mine --steps 8` continues this run from step 4" in text


def test_ctrl_c_is_one_line_and_the_same_command_resumes_without_repeating_a_row(tmp_path, tiny_model_dir):
    """Ctrl-C in `groupwise train` printed two chained tracebacks (CancelledError, KeyboardInterrupt); now one
    line says what is kept, and running the same command again finishes the run with each row once."""
    import os
    import signal
    import subprocess
    import sys

    import groupwise as gw

    args = [sys.executable, "-m", "groupwise", "train", "2048", "--model", tiny_model_dir, "--path", str(tmp_path),
            "--device", "cpu", "--steps", "3", "--groups-per-step", "2", "--rollouts-per-group", "2"]
    # Started as a terminal starts a job: its own process group, SIGINT not ignored (a background runner's
    # children inherit it ignored), and Ctrl-C sent to the whole group.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stdout:
        if "step 1/3 ·" in line:  # step 1 is trained and checkpointed; step 2's rollouts have begun
            os.killpg(proc.pid, signal.SIGINT)
            break
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1] == (
        "groupwise train: interrupted: every step finished before it is kept (history, trajectories, checkpoint); "
        "the same command resumes from the last checkpoint")
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "(resuming at step 1)" in done.stdout or "(resuming at step 2)" in done.stdout, done.stdout
    history = gw.load_history(tmp_path / "2048" / "models" / "2048-s0")
    rows = [json.dumps({k: v for k, v in r.items() if k != "recorded_at"}, sort_keys=True) for r in history]
    assert len(rows) == len(set(rows)), rows
    assert [r["step"] for r in history if r["split"] == "train"] == [0, 1, 2]


def test_a_run_without_validation_is_pointed_at_answers_it_has():
    """titles (judged, no validation set) ended advising `groupwise compare RUN --steps 0,best`, which
    compares validation answers: it failed with 'no val trajectories stored for step 0'."""
    text = " ".join(advice(None, None, 1, "max_steps", env="titles", seed=0, steps=1, run_dir=RUN))
    assert f"`groupwise inspect {RUN} --split train --best`" in text and "compare" not in text


def test_a_run_store_that_fills_up_mid_run_is_one_line(tmp_path, tiny_model_dir):
    """A full disk (here: a file size limit, which the kernel enforces the same way) under the run store
    crashed `groupwise train` with the writer thread's OSError traceback; now one line names the file."""
    import resource
    import signal
    import subprocess
    import sys

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
        # the tiny model's adapter (~70 kB, written at load) fits; the test split's trajectories (~90 kB) do not
        resource.setrlimit(resource.RLIMIT_FSIZE, (80_000, 80_000))

    proc = subprocess.run([sys.executable, "-m", "groupwise", "train", "2048", "--model", tiny_model_dir, "--path",
                           str(tmp_path), "--device", "cpu", "--steps", "1", "--groups-per-step", "2",
                           "--rollouts-per-group", "2"], capture_output=True, text=True, timeout=600, preexec_fn=limit)
    assert proc.returncode == 2, proc.stderr  # as a run store that cannot be written from the start
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"groupwise train: error: cannot write '{tmp_path / '2048' / 'models' / '2048-s0'}/"), last
    assert "(File too large): free space or fix permissions there" in last, last
    assert not [p for p in tmp_path.rglob("*.tmp")]  # the half-written temporary file is gone


def test_a_judged_env_says_which_judge_scores_it():
    """`groupwise train titles` judged with the base model without saying so; that judge ties every pair on
    titles' labelled set (docs/judge.md), so the user is told before loading how to check and change it."""
    from groupwise.jobs.train import judge_line

    line = judge_line("titles", None, "smollm2-135m")
    assert line.startswith("judge=local/smollm2-135m (the default")
    assert "`groupwise judge eval --labels titles --judge local/smollm2-135m`" in line and "--judge NAME" in line
    assert judge_line("email", ["openai/o4-mini"], "smollm2-135m") == "judge=openai/o4-mini"


def test_a_preset_is_its_config_fields_values_checked_by_the_configs():
    """Each preset value that goes into a config is keyed by that config's field and checked by its own
    validation, so a preset cannot name a field the config lost, nor a value it refuses."""
    from groupwise.config import LoopConfig, TrainConfig
    from groupwise.errors import ConfigError
    from groupwise.jobs.fields import flags as job_flags
    from groupwise.jobs.fields import settings_problems
    from groupwise.jobs.train import HUB_PRESET

    assert PRESETS["2048"].settings() == {(LoopConfig, "max_steps"): 8, (LoopConfig, "rollouts_per_group"): 8,
                                          (LoopConfig, "groups_per_step"): 3, (TrainConfig, "learning_rate"): 1e-3,
                                          (TrainConfig, "num_iterations"): 1}
    for name, preset in {**PRESETS, "hub": HUB_PRESET}.items():
        assert settings_problems(preset.settings()) == [], name
    # a flag of the job that feeds a config field, and the preset field it replaces, set the same field
    feeds = {spec.name: spec.meta["feeds"] for spec in job_flags(TrainJob)}
    sets = {f.name: f.metadata["sets"] for f in dataclasses.fields(Preset)}
    for flag, preset_field in (("rollouts_per_group", "rollouts_per_group"), ("groups_per_step", "groups_per_step"),
                               ("lr", "learning_rate"), ("num_iterations", "num_iterations")):
        assert feeds[flag] == sets[preset_field], flag
    # the planted drifts: a field the config does not have, values its validation refuses
    found = settings_problems({(LoopConfig, "rollout_per_group"): 8, (TrainConfig, "learning_rate"): 0.0})
    assert len(found) == 2 and "no field 'rollout_per_group'" in found[0] and "rollouts_per_group" in found[0]
    assert found[1].startswith("TrainConfig.learning_rate=0.0: must be")
    with pytest.raises(ConfigError, match=r"LoopConfig.groups_per_step=0: must be an integer >= 1"):
        dataclasses.replace(PRESETS["2048"], groups_per_step=0)
    with pytest.raises(ConfigError, match=r"sft=-1: must be an integer >= 0"):
        dataclasses.replace(PRESETS["2048"], sft=-1)
    with pytest.raises(ConfigError, match=r"val_size=0: must be an integer >= 1"):
        Preset(steps=1, rollouts_per_group=2, groups_per_step=1, learning_rate=1e-4, val_size=0)


def test_the_engine_process_flag_reaches_the_backend_and_is_repeated_in_advice(tmp_path):
    """`groupwise train --engine-process separate` trains through the backend's engine core
    (LocalBackend(engine_process=)); the default leaves the backend's own "auto"."""
    from groupwise.config import DEFAULT_ENGINE_PROCESS
    from groupwise.jobs.train_setup import job_backend

    job = TrainJob(env="2048", path=str(tmp_path), engine_process="separate")
    backend = job_backend(job, job.preset())
    assert backend.engine_process == "separate"
    assert job.same_run_flags() == f"--path {shlex.quote(str(tmp_path))} --engine-process separate"
    default = TrainJob(env="2048", path=str(tmp_path))
    assert job_backend(default, default.preset()).engine_process == DEFAULT_ENGINE_PROCESS == "auto"
    assert "--engine-process" not in default.same_run_flags()


def test_auto_puts_a_sweep_on_cuda_in_a_core_process_and_leaves_one_run_and_the_cpu_in_process(tmp_path, monkeypatch):
    """`engine_process_for`: "auto" is the separate core only for several runs on one CUDA backend; an explicit
    choice is kept whatever the runs and device. The sweep job asks it with its run count."""
    from groupwise.backend.local import engine_process_for
    from groupwise.jobs.train_setup import job_backend

    assert engine_process_for("auto", runs=4, device_type="cuda") == "separate"
    assert engine_process_for(None, runs=2, device_type="cuda") == "separate"
    assert engine_process_for("auto", runs=1, device_type="cuda") == "in_process"
    assert engine_process_for("auto", runs=4, device_type="cpu") == "in_process"
    assert engine_process_for("in_process", runs=8, device_type="cuda") == "in_process"
    assert engine_process_for("separate", runs=1, device_type="cpu") == "separate"
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the backends are built, never started
    cuda = TrainJob(env="2048", path=str(tmp_path), device="cuda")
    assert job_backend(cuda, cuda.preset(), runs=4).engine_process == "separate"
    assert job_backend(cuda, cuda.preset()).engine_process == "auto"
    kept = TrainJob(env="2048", path=str(tmp_path), device="cuda", engine_process="in_process")
    assert job_backend(kept, kept.preset(), runs=4).engine_process == "in_process"
    cpu = TrainJob(env="2048", path=str(tmp_path), device="cpu")
    assert job_backend(cpu, cpu.preset(), runs=4).engine_process == "in_process"


def test_the_reported_peak_memory_counts_a_worker_process_that_held_the_model():
    """With `--engine-process separate` the model lives in the backend's worker process: the job's
    "peak memory" read only its own process and printed 0.4 GB for a SmolLM2 run. A child that ended
    (the worker, once the backend closed) is counted now."""
    import subprocess
    import sys

    code = ("import subprocess, sys; from groupwise.jobs.train_setup import peak_rss_gb; before = peak_rss_gb(); "
            "subprocess.run([sys.executable, '-c', 'held = b\"x\" * (400 * 2**20)'], check=True); "
            "print(before, peak_rss_gb())")
    before, after = map(float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                              check=True).stdout.split())
    assert after - before >= 0.35  # the child's 400 MiB, which this process never held
