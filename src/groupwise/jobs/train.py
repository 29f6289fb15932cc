"""`groupwise train <env>`: the main job. Trains a model on a built-in environment with `gw.fit`.

What it does, in order:

1. builds the env's scenarios (train / val / test; val and test are the same held-out set for every seed);
2. registers a `TrainableModel` on a `LocalBackend`; a run folder with checkpoints is resumed, so the
   same command with a larger ``--steps`` trains an existing run further;
3. picks the reward: the env's own (verifiable), or RULER (judge / hybrid envs). A judge named
   ``local/<the base model>`` reuses the engine that serves the rollouts, asking for ``<name>@0`` (the
   base weights, adapter off), so the machine holds one copy of the weights;
4. `gw.fit`: validation at step 0 (the untrained base) and every ``eval_every`` steps, GRPO steps, the
   stopping rules and detectors; the best checkpoint is evaluated on the test split. One line per step
   (reward, seconds of rollouts / judge / update, validation with its interval, ETA), a progress bar
   during each update, each alert once when raised;
5. prints the base and the best validation with their intervals, the test, the stop reason once, what
   to do next, and writes the plots of `groupwise report` and ``summary.json``.

An env is only its contract (rollout, scenarios, validation, reward kind); how much to train on it is
this job's: `PRESETS` holds each env's defaults, sized for about 10 minutes on 2 CPU cores with
SmolLM2-135M, and a flag left out takes the env's preset.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from groupwise.config import (DEFAULT_ENGINE_PROCESS, DEFAULT_MARGIN, MARGIN_BOUNDS, EngineProcess, LoopConfig, TrainConfig,
                              TrainSFTConfig)
from groupwise.core.validated import field_default
from groupwise.jobs.common import (Dtype, device_field, dtype_field, folder_name_problem, model_field, run_name_problem,
                                   store_field)
from groupwise.jobs.fields import Command, Job, arg
from groupwise.jobs.sft import SFT_EPOCHS, SFT_LEARNING_RATE, SFT_RATE_WHY, warm_start_fields, warm_started
from groupwise.jobs.train_setup import (job_backend, judge_target, loop_config, peak_rss_gb, score_group_of,
                                        show_progress, with_ci)
from groupwise.jobs.train_sweep import DEFAULT_RUN_PROCESSES, EACH_MIN_ROLLOUTS, RunProcesses, own_judge_copies

if TYPE_CHECKING:
    from groupwise.envs import EnvSpec


def _sets(config: type, name: str, **default: Any) -> Any:
    """A preset field whose value goes into `config`'s field `name` (`Preset.settings`, checked there);
    `default=` where every env shares one."""
    return dataclasses.field(metadata={"sets": (config, name)}, **default)


def _own(default: Any, low: int) -> Any:
    """A preset field the job itself reads (no config has it): `low` bounds it (None stays allowed)."""
    return dataclasses.field(default=default, metadata={"sets": None, "low": low})


# A preset's settings for a run with a teacher (Preset.distilling), by the field each one replaces.
DISTILL_FIELDS = {"distill_learning_rate": "learning_rate", "distill_iterations": "num_iterations"}


@dataclass(frozen=True)
class Preset:
    """How much the train job trains on an env by default (each env states its own: there is no default
    preset to drift from); a flag given replaces its value.

    Each field is either a config field's value (`_sets`: `settings()` maps it by (config, field name)) or
    the job's own (`_own`). Making a preset checks every value against the config it goes into, by that
    config's own validation (`groupwise.jobs.fields.settings_problems`): a preset naming a field the config
    lost, or a value it refuses, is a ConfigError when the module loads, not a run that fails later."""

    steps: int = _sets(LoopConfig, "max_steps")  # GRPO's; the job adds the warm start's steps (sft) to them
    rollouts_per_group: int = _sets(LoopConfig, "rollouts_per_group")
    groups_per_step: int = _sets(LoopConfig, "groups_per_step")
    learning_rate: float = _sets(TrainConfig, "learning_rate")
    val_size: int | None = _own(None, low=1)  # how many val (and test) scenarios the 10-minute job uses (None: the whole split)
    sft: int = _own(0, low=0)  # demonstrations of the env's scripted player for a supervised warm start first (0: none)
    num_iterations: int = _sets(TrainConfig, "num_iterations", default=field_default(TrainConfig, "num_iterations"))  # optimizer steps on each step's batch (GRPO's mu)
    # A run with a teacher (--teacher) trains at these where they were measured to differ from GRPO's (None:
    # GRPO's). The teacher's per-token signal is dense and steady where GRPO's is one noisy number per
    # rollout, so it bears a larger step, or several on one batch; and a fresh LoRA's first Adam step moves
    # only B (A's gradient is zero while B is), so one update at GRPO's rate barely moves a student's answers.
    distill_learning_rate: float | None = _own(None, low=0)
    distill_iterations: int | None = _own(None, low=1)

    def distilling(self) -> "Preset":
        """This preset for a run with a teacher: its distillation settings in place of GRPO's, where it has them."""
        return dataclasses.replace(self, **{field: getattr(self, own) for own, field in DISTILL_FIELDS.items()
                                            if getattr(self, own) is not None})

    def settings(self) -> dict[tuple[type, str], Any]:
        """The preset's config values, by (config, field name)."""
        return {f.metadata["sets"]: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["sets"]}

    def __post_init__(self) -> None:
        from groupwise.errors import ConfigError
        from groupwise.jobs.fields import settings_problems

        found = settings_problems(self.settings())
        sets = {f.name: f.metadata["sets"] for f in dataclasses.fields(self)}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in DISTILL_FIELDS:  # checked as the config field it stands in for
                found += [] if value is None else settings_problems({sets[DISTILL_FIELDS[f.name]]: value})
            elif f.metadata["sets"] is None and value is not None and (
                    not isinstance(value, int) or isinstance(value, bool) or value < f.metadata["low"]):
                found.append(f"{f.name}={value!r}: must be an integer >= {f.metadata['low']}")
        if found:
            raise ConfigError(found, what="a train preset (groupwise.jobs.train.PRESETS)")


_TICTACTOE = Preset(
    # lr 1e-4 moved the invalid-move rate from 0.96 to 0.88 in 6 steps (seed 0): too slow for a job
    # of 12 steps. As in 2048, the first thing to learn is to name one free cell. On the 2-core CPU,
    # seeds 0-2 vs random: at 5e-4 one seed of three rose beyond its validation noise in 12 steps, at
    # 1e-3 two (win rate 0 -> 0.667, 0.125, 0.333; docs/benchmarks.md). Minimax: not measured at 1e-3.
    steps=12, rollouts_per_group=8, groups_per_step=3, learning_rate=1e-3)

PRESETS: dict[str, Preset] = {
    # 24 rollouts of <= 4 turns x 16 tokens per step; the signal is the format. At lr 5e-4 the
    # valid-move rate barely moved by step 4 (0.31-0.40 on five seeds) and took off between steps 4
    # and 8, so a seed that took off late ended the 8-step job unlearnt; at 1e-3 it takes off by
    # mid-run and 17 of 17 seeds learnt (docs/benchmarks.md, the main job).
    # With a teacher: 4 updates a step, chosen on student seeds 3-5 among lr 1e-3 or 2e-3 with 1 update and lr
    # 1e-3 with 2 or 4 (on an H200, the job's teacher of 16 steps, 0.979): the distilling students stood at
    # 0.89-0.91 after one step, against 0.23-0.25 at one update (docs/benchmarks.md, distillation on 2048).
    "2048": Preset(steps=8, rollouts_per_group=8, groups_per_step=3, learning_rate=1e-3, distill_iterations=4),
    # GRPO alone left seed 1 at a win rate of 0 through 20 steps; after 64 demonstrations of the scripted
    # minimax player (2 SFT steps) the 12 GRPO steps end at 0.79 / 0.67 / 0.67 on seeds 0-2, in 10-12
    # minutes a run, most of it from the warm start (0.46 / 0.54 / 0.33; docs/benchmarks.md).
    "tictactoe": dataclasses.replace(_TICTACTOE, sft=64),
    "tictactoe-minimax": _TICTACTOE,  # the same agent; only the opponent differs (no warm start measured)
    # At 5e-5 no step beat the base on 3 seeds; at 5e-4 (2-core CPU, seeds 0-2) the best checkpoint's test
    # accuracy went from the base's 0.140 to 0.430 / 0.490 / 0.375 (200 problems; docs/benchmarks.md).
    "math": Preset(steps=15, rollouts_per_group=8, groups_per_step=4, learning_rate=5e-4),
    # The format alone, 8 replies a step as scripts/smollm2_format_task.py trains it. At lr 1e-3 (seed 100, one
    # thread on 2 shared CPU cores) the one-word rate went 0.06 -> 0.41 [0.26, 0.58] in 12 steps, 2.6 minutes.
    "oneword": Preset(steps=12, rollouts_per_group=4, groups_per_step=2, learning_rate=1e-3),
    # Measured on 2 shared CPU cores: ~35 s per 4-turn episode with SmolLM2 (long tool prompts), so
    # this env does not fit 10 minutes; these defaults take ~30 (GPU recommended).
    "email": Preset(steps=6, rollouts_per_group=4, groups_per_step=2, learning_rate=5e-5, val_size=8),
    "titles": Preset(steps=10, rollouts_per_group=4, groups_per_step=3, learning_rate=5e-5),
}


# An env from a hub (`groupwise train verifiers:<module>`) brings no preset of its own and none was measured
# for it: a start sized like math's (a dataset of short answers), to be set with the flags.
HUB_PRESET = Preset(steps=10, rollouts_per_group=8, groups_per_step=4, learning_rate=5e-4)


def _presets_of(key: str) -> str:
    """Each env's preset value of `key`, for a flag's help: the preset is the default."""
    return ", ".join(f"{env} {getattr(p, key):g}" for env, p in PRESETS.items())


def _env_problem(name: Any) -> str | None:
    """A built-in env (each has a preset: tests/jobs checks the two registries list the same names), or a hub's
    env by name (``verifiers:<module>``, `groupwise.envs.HUB_PREFIXES`)."""
    from groupwise.envs import HUB_PREFIXES

    if name in PRESETS or (isinstance(name, str) and name.startswith(HUB_PREFIXES) and name.partition(":")[2]):
        return None
    return f"no environment {name!r}; the built-in ones are {sorted(PRESETS)}, or verifiers:<module>"


def _judge_problem(judge: str) -> str | None:
    """A hosted judge's name and key, checked before any model loads (a local one is served in process)."""
    if judge.startswith("local/"):
        return None
    from groupwise.errors import GroupwiseError
    from groupwise.judge.providers import resolve

    try:
        resolve(judge)
    except GroupwiseError as exc:  # ConfigError (an unknown provider), JudgeError (no key)
        return f"{judge}: {'; '.join(getattr(exc, 'problems', None) or [' '.join(str(exc).split())])}"
    return None


@dataclass
class TrainJob(Job):
    env: str = arg(positional=True, check=_env_problem, help=f"the environment: {', '.join(PRESETS)}, or verifiers:<module> (a "
                                                                    "verifiers environment: its load_environment())")
    model: str = model_field()
    judge: list[str] | None = arg(None, repeat=True,
                                  help="RULER judge, e.g. local/smollm2-135m or openai/o4-mini; repeat it with "
                                       "--judge-labels to train with the best candidate", check=_judge_problem)
    judge_labels: str | None = arg(None, metavar="LABELS",
                                   help="check the judge(s) before training on a labelled set (an env with one: "
                                        "titles; 'env' for this env's; a JSONL file; a run folder) and train with "
                                        "the best that clears --judge-margin, or stop with the table when none does")
    judge_margin: float = arg(DEFAULT_MARGIN, **MARGIN_BOUNDS, help="the bar: pairwise accuracy's lower bound must exceed 0.5 + margin")
    steps: int | None = arg(None, low=1, help=f"train until this many steps are done in total (default: the env's "
                                              f"preset: {_presets_of('steps')}; a resumed run continues from where "
                                              "it stopped)")
    seed: int = arg(exclusive="seed", feeds=(LoopConfig, "seed"),
                    help="Here also the env's training scenarios and the run's name; the validation and test "
                         "scenarios are the same for every seed.")
    seeds: list[int] | None = arg(None, exclusive="seed", feeds=(LoopConfig, "seed"),
                                  help="Several seeds trained at once in this process, one run each (e.g. 0-3 or "
                                       "0,2,5): one copy of the model, one engine batching every run's rollouts, a "
                                       "line per step per run and a table at the end.")
    path: str = store_field()
    project: str | None = arg(None, check=folder_name_problem,
                              help="the project of the run (default: the env's name); `groupwise sft` prints it "
                                   "for the run it warm-started")
    name: str | None = arg(None, check=run_name_problem,
                           help="model name (default: <env>-s<seed>; an existing name resumes)")
    gate: bool = arg(False, help="hybrid envs (email): judge score x correctness. Off by default: an untrained "
                                 "small agent is never correct, and the gate would zero every reward (no signal)")
    device: str | None = device_field()
    dtype: Dtype | None = dtype_field()
    lr: list[float] | None = arg(None, feeds=(TrainConfig, "learning_rate"),
                                 help=f"GRPO's; several (5e-4,1e-3) train one run per rate at once, as --seeds "
                                      f"does (default: the env's preset: {_presets_of('learning_rate')})")
    rollouts_per_group: int | None = arg(None, low=2, feeds=(LoopConfig, "rollouts_per_group"),
                                         help=f"(default: the env's preset: {_presets_of('rollouts_per_group')})")
    groups_per_step: int | None = arg(None, feeds=(LoopConfig, "groups_per_step"),
                                      help=f"(default: the env's preset: {_presets_of('groups_per_step')})")
    sft: int | None = arg(None, low=0, metavar="N",
                          help="first a supervised warm start on N demonstrations of the env's scripted agent "
                               "(email: search, read, answer with the ground truth; tic-tac-toe: minimax's move in "
                               f"the tag), then GRPO from there; 0 is none (default: the env's preset: "
                               f"{_presets_of('sft')})")
    sft_epochs: int = arg(SFT_EPOCHS, low=1, help="SFT epochs, one step each")
    sft_lr: float = arg(SFT_LEARNING_RATE, feeds=(TrainSFTConfig, "learning_rate"), own_default=SFT_RATE_WHY,
                        help="The warm start's (--sft).")
    teacher: str | None = arg(None, metavar="RUN_OR_MODEL",
                              help="on-policy distillation: a teacher scores every token the student samples and "
                                   "its per-token reverse KL joins GRPO's objective (TrainConfig.teacher): 'base' "
                                   "(the base model), or a run folder or checkpoint folder of an adapter of the "
                                   "same base, e.g. .groupwise/2048/models/2048-s0 (its latest checkpoint) or "
                                   ".groupwise/2048/models/2048-s0/checkpoints/0008; or another base model of the "
                                   "same tokenizer (a model folder or a Hugging Face id, e.g. a bigger model of the "
                                   "family)")
    num_iterations: int | None = arg(None, low=1, metavar="N", feeds=(TrainConfig, "num_iterations"),
                                     help="optimizer steps on each step's batch (GRPO's mu; default: the env's preset, "
                                          "1; with --teacher, its distillation preset: "
                                          + ", ".join(f"{env} {p.distill_iterations}" for env, p in PRESETS.items()
                                                      if p.distill_iterations) + ")")
    distill_top_k: int | None = arg(None, low=1, metavar="K", feeds=(TrainConfig, "distill_top_k"),
                                    help="with --teacher: the top-k estimate of the reverse KL, over the student's and "
                                         "the teacher's K likeliest tokens per position (TrainConfig.distill_estimate="
                                         "'topk'); default: the sampled-token estimate")
    batch_invariant: bool = arg(False, help="CPU only: each rollout's tokens and logprobs do not depend on which "
                                            "rollouts the engine batched with it, so two runs of one seed on one "
                                            "machine match exactly (slower: no prefix cache)")
    engine_process: EngineProcess = arg(
        DEFAULT_ENGINE_PROCESS, help="where the backend's engine runs (LocalBackend(engine_process=)): in this "
        "process, or 'separate' (the engine and the trainer sharing its weights in a worker process, serving as an "
        "engine core, while this process runs the rollouts' HTTP work off the GIL of its decode loop); 'auto': "
        "'separate' for a sweep of several runs on CUDA (four runs stepped 1.13-1.29x faster on H200s), in process "
        "otherwise (one run, or the CPU: faster so; docs/benchmarks.md)")

    run_processes: RunProcesses = arg(
        DEFAULT_RUN_PROCESSES, help="where a sweep's runs (--seeds, several --lr) are driven: 'one' (this process "
        "drives every run), or 'each' (a process per run, all on this process's worker, which holds the one copy of "
        "the model, the engine and the trainer: their requests, answers and trajectory writes no longer take turns "
        "under one GIL; the engine in a core process of its own); 'auto': 'each' where the engine is separate on "
        f"CUDA and a run's step has {EACH_MIN_ROLLOUTS} rollouts or more (four runs 2.0-2.2x the runs in sequence on an H200, against "
        "1.8x from one process), 'one' otherwise (smaller steps gained nothing from the processes)")

    def rules(self) -> list[str]:
        found = []
        if self.run_processes != DEFAULT_RUN_PROCESSES and len(self.runs()) == 1:
            found.append(f"--run-processes {self.run_processes} sets how a sweep's runs are driven: give several "
                         "--seeds or --lr, or drop it")
        if self.run_processes == "each" and own_judge_copies(self):
            found.append(f"--run-processes each would load the judge {self.judge[0]} once in each run's process: "
                         "use --run-processes one (one copy for every run), or judge with the base model "
                         f"(--judge local/{self.model}, the worker's weights)")
        if self.run_processes == "each" and self.engine_process == "in_process":
            found.append("--run-processes each shares the engine of a core process of its own with the runs' "
                         "processes: drop --engine-process in_process (or use --run-processes one)")
        if self.distill_top_k is not None and self.teacher is None:
            found.append("--distill-top-k sets how a teacher's KL is estimated: give the teacher with --teacher")
        if self.judge and len(self.judge) > 1 and not self.judge_labels:
            found.append(f"{len(self.judge)} --judge candidates need --judge-labels to choose between them (titles, "
                         "'env', a JSONL file or a run folder)")
        if len(self.runs()) > 1:
            many = f"{len(self.runs())} runs (--seeds x --lr)"
            found.extend(f"{many}: {flag} {why}" for flag, given, why in (
                ("--name", self.name, "names one run (each run of a sweep is <env>-s<seed>[-lr<rate>])"),
                ("--judge-labels", self.judge_labels, "chooses a judge for one run: choose it first, then sweep "
                                                      "with --judge NAME")) if given)
        return found

    def runs(self) -> list[tuple[int, float | None]]:
        """The (seed, learning rate) of each run the job trains: every seed with every rate (None: the preset's)."""
        return [(seed, lr) for seed in (self.seeds or [self.seed]) for lr in (self.lr or [None])]

    def same_run_flags(self) -> str:
        """The flags given that every command about this run must repeat (the run store, the model, the
        training settings), as the user would type them; the seed, the steps and the name are left to the
        command (`advice` changes them)."""
        from groupwise.jobs.fields import flags

        words = []
        for spec in flags(type(self)):
            value = getattr(self, spec.name)
            if spec.meta["positional"] or spec.name in ("seed", "seeds", "steps", "name") or value == spec.default:
                continue
            if spec.kind is bool:
                words.append(spec.flag)
            elif spec.many and spec.meta["repeat"]:
                words.extend(w for v in value for w in (spec.flag, shlex.quote(str(v))))
            else:
                shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) if spec.many else (
                    f"{value:g}" if isinstance(value, float) else str(value))
                words.extend((spec.flag, shlex.quote(shown)))
        return " ".join(words)

    def project_of(self) -> str:
        """The project of the job's runs: the one given, else the env's name."""
        return self.project or self.env.replace(":", "-")  # a folder name: verifiers:m -> verifiers-m

    def preset(self, learning_rate: float | None = None) -> Preset:
        """The env's preset, with the values this job sets in place of its own (`learning_rate`: a run's, else
        the job's first)."""
        # every preset field the job has a flag of the same name for (None: not given), and the rate
        given = {f.name: getattr(self, f.name, None) for f in dataclasses.fields(Preset)}
        given["learning_rate"] = learning_rate if learning_rate is not None else (self.lr or [None])[0]
        preset = PRESETS.get(self.env, HUB_PRESET)
        if self.teacher is not None:  # a distilling run trains at the preset's distillation rate unless --lr says
            preset = preset.distilling()
        return dataclasses.replace(preset, **{k: v for k, v in given.items() if v is not None})


async def _select_judge(spec: EnvSpec, judges: list[str], labels: str, model: Any, base_model: str,
                        margin: float) -> str:
    """The `--judge` candidate to train with, chosen on the labelled set `labels` before training:
    the best one whose pairwise accuracy clears chance by `margin` at its lower bound; else
    `JudgeSelectionError` with the table (training would learn noise)."""
    from groupwise.judge import DEFAULT_RUBRIC, JudgeSpec, select_judge
    from groupwise.judge.eval_command import load_labels

    labelled, rubric = load_labels(spec.name if labels == "env" else labels)
    rubric = spec.rubric or rubric or DEFAULT_RUBRIC
    specs = []
    for j in judges:
        judge_model, kwargs = judge_target(j, model, base_model)
        specs.append(JudgeSpec(judge_model, rubric=rubric, name=j, client=kwargs.get("client")))
    chosen, _, table = await select_judge(labelled, specs, margin=margin, repeats=1)
    print(f"[groupwise train] judge check on {len(labelled)} labelled groups ({labels}):\n{table}")
    print(f"[groupwise train] judging with {chosen.label}")
    return chosen.label


async def train(job: TrainJob) -> dict[str, Any]:
    """Run the main job; returns a JSON-able summary (also written to <run_dir>/summary.json).

    `job.judge` may list several candidates; with `job.judge_labels` (an env with a labelled set, ``env``
    for this one's, a JSONL file or a run folder) they are evaluated before training and the best one that
    clears `job.judge_margin` is used, or the job stops with the table (`JudgeSelectionError`)."""
    import groupwise as gw
    from groupwise.envs import get_env
    from groupwise.runs.report import load_run, plot_run
    from groupwise.runs.series import points

    if len(job.runs()) > 1:
        from groupwise.jobs.train_sweep import sweep

        return await sweep(job)
    spec, preset, seed, model_name, path = get_env(job.env), job.preset(), job.runs()[0][0], job.model, job.path
    train_s, val_s, test_s = spec.scenarios(seed)
    if preset.val_size is not None:
        val_s = val_s[: preset.val_size]
        test_s = test_s[: preset.val_size]
    name = job.name or f"{spec.name}-s{seed}"
    max_steps = preset.steps
    metric = spec.val_metric or "reward"
    print(f"[groupwise train] env={spec.name} ({spec.description})")
    print(f"[groupwise train] model={model_name} steps<={max_steps} seed={seed} "
          f"groups/step={preset.groups_per_step} rollouts/group={preset.rollouts_per_group} "
          f"lr={preset.learning_rate:g}" + (f" updates/step={preset.num_iterations}" if preset.num_iterations > 1 else "")
          + f" train/val/test={len(train_s)}/{len(val_s)}/{len(test_s)}"
          + (f" sft={preset.sft} demonstrations first" if preset.sft else ""))
    if spec.reward != "verifiable" or job.judge:
        print(f"[groupwise train] {judge_line(spec.name, job.judge, model_name)}")
    # absolute: a second terminal opens in another folder, where the relative path names no runs
    print(f"[groupwise train] watch it live: run `groupwise dashboard {shlex.quote(str(Path(path).resolve()))}` "
          "in another terminal, then open http://127.0.0.1:8100")

    t0 = time.monotonic()
    model = gw.TrainableModel(name=name, project=job.project_of(), base_model=model_name, base_path=path)
    backend = job_backend(job, preset)
    await model.register(backend)
    load_s = time.monotonic() - t0
    resumed = await model.get_step()
    print(f"[groupwise train] loaded {model_name} in {load_s:.1f}s; run folder {model.run_dir}"
          + (f" (resuming at step {resumed})" if resumed else ""))
    sft_steps, baselines = await warm_started(spec, preset.sft, model, seed=seed, epochs=job.sft_epochs,
                                              learning_rate=job.sft_lr)
    max_steps += sft_steps  # --steps counts the GRPO steps

    config = loop_config(spec, preset, max_steps, seed, job.device, distill_top_k=job.distill_top_k)
    judges = list(job.judge or [])
    try:
        if job.judge_labels:
            candidates = judges or [f"local/{model_name}"]
            judges = [await _select_judge(spec, candidates, job.judge_labels, model, model_name, job.judge_margin)]
        summary = await gw.fit(
            model, spec.rollout, train_s, teacher=job.teacher,
            val_scenarios=val_s if spec.val_metric else None,
            test_scenarios=test_s if spec.val_metric else None,
            score_group=score_group_of(spec, judges[0] if judges else None, model, model_name, job.gate),
            validate=spec.validate if spec.val_metric else None,
            baselines=baselines if spec.val_metric else (),
            config=config,
        )
    finally:
        await backend.close()
    wall = time.monotonic() - t0

    history = load_run(model.run_dir)
    plots = plot_run(history, Path(model.run_dir) / "report", title=f"{spec.name}/{name}")
    base = next((p for p in points(history, "val", metric) if p.step == 0), None)
    best = next((p for p in points(history, "val", metric) if p.step == summary.best_step), None)
    result = {
        "env": spec.name, "model": model_name, "seed": seed, "run_dir": str(model.run_dir),
        "learning_rate": preset.learning_rate, "num_iterations": preset.num_iterations,
        "metric": f"val/{metric}", "base": base.value if base else None,
        "base_interval": [base.lo, base.hi] if base else None,
        "trained_best": summary.best_value, "best_interval": [best.lo, best.hi] if best else None,
        "best_step": summary.best_step, "final_step": summary.final_step, "test": summary.test,
        "stop_rule": summary.stop.rule, "stop_reason": summary.stop_reason, "status": summary.status,
        "wall_s": round(wall, 1), "load_s": round(load_s, 1), "peak_rss_gb": round(peak_rss_gb(), 2),
        "plots": [str(p) for p in plots], "alerts": [f"{a.name}@{a.step}" for a in summary.alerts],
        **warm_start_fields(model, sft_steps, summary.baselines),
    }
    Path(model.run_dir, "summary.json").write_text(json.dumps(result, indent=2))
    say = lambda text: print(f"[groupwise train] {text}")  # noqa: E731
    print()
    say(f"done in {wall / 60:.1f} min (model load {load_s:.0f}s), peak memory {result['peak_rss_gb']:.1f} GB")
    if base is not None:
        say(f"validation {metric}: base {with_ci(base)} -> best {with_ci(best)} at step {summary.best_step}")
    if summary.test:
        t = summary.test
        ci = f" [{t[f'{metric}_lo']:.3f}, {t[f'{metric}_hi']:.3f}]" if f"{metric}_lo" in t else ""
        shown = f"{metric} {t[metric]:.3f}{ci}" if metric in t else f"reward {t['reward']:.3f}"
        say(f"test ({len(test_s)} held-out scenarios, checkpoint of step {summary.best_step}): {shown}")
    rule = summary.stop.rule  # the loop printed the stop reason once, when it stopped
    # the env as the command names it (verifiers:m), not its run name (verifiers-m), which the CLI does not take
    for line in advice(base, best, summary.final_step, rule, env=job.env, seed=seed, steps=max_steps - sft_steps,
                       run_dir=str(model.run_dir), flags=job.same_run_flags(), name=job.name):
        say(line)
    return result


def judge_line(env: str, judges: list[str] | None, base_model: str) -> str:
    """Which judge scores the run's groups, said before it loads: the default (the base model judging its own
    answers) ties every pair on titles' labelled set, and a judge without signal teaches noise."""
    if judges:
        return f"judge={judges[0]}" if len(judges) == 1 else f"judge: the best of {', '.join(judges)}"
    return (f"judge=local/{base_model} (the default: the base model scores its own answers; a small one may rank "
            f"nothing, so check it with `groupwise judge eval --labels titles --judge local/{base_model}` and "
            "choose another with --judge NAME; docs/judge.md)")


def advice(base: Any, best: Any, final_step: int, rule: str, *, env: str, seed: int, steps: int,
           run_dir: str, flags: str = "", name: str | None = None) -> list[str]:
    """What the user of `groupwise train` can do next, given how the run went. `flags` are the ones the job
    was given that name the same run store, model and settings (`TrainJob.same_run_flags`), and `name` the
    run's --name if one was given: a command without them would train another run."""
    from groupwise.loop.stopping import significant_gap

    rest = f" {flags}" if flags else ""
    again = f"groupwise train {env} --seed {seed}{rest}" + (f" --name {shlex.quote(name)}" if name else "")
    another = f"groupwise train {env} --seed {seed + 1}{rest}"
    more = f"`{again} --steps {max(2 * steps, final_step + 4)}` continues this run from step {final_step}"
    answers = (f"`groupwise compare {run_dir} --steps 0,best`" if base is not None else  # no validation stored
               f"`groupwise inspect {run_dir} --split train --best`")
    watch = f"curves: `groupwise report {run_dir}`; answers: {answers}"
    learned = (base is not None and best is not None and best.step != base.step
               and significant_gap(best, base))
    if rule == "alert:reward_against_task":
        return [f"within its groups the env's reward preferred the answers its task metric scored lower: the "
                f"alert quotes them (and `groupwise inspect {run_dir} --split train --best` lists what the reward "
                f"liked). A built-in env's reward is fixed, so try another seed (`{another}`); for your own env, "
                f"fix its reward and train with gw.fit.", watch]
    if rule == "alert:val_drop":
        return [f"the env's reward rose while validation fell: read what the reward liked "
                f"(`groupwise inspect {run_dir} --split train --best`). A built-in env's reward is fixed, so "
                f"try another seed (`{another}`); for your own env, fix its "
                f"reward and train with gw.fit.", watch]
    if rule == "alert:val_unstable":
        return [f"validation fell beyond its noise without the reward being gamed: an unlucky or too large "
                f"step. Try another seed (`{another}`); the best checkpoint "
                f"(step {best.step if best else 0}) is kept.", watch]
    if learned:
        return [f"it learned (the gain is larger than the validation noise). To train longer: {more}.", watch]
    if best is not None:
        return [f"validation did not rise beyond its noise. Try more steps ({more}) or another seed "
                f"(`{another}`).", watch]
    return [watch]


def run(job: TrainJob) -> int:
    import asyncio

    show_progress()
    asyncio.run(train(job))
    return 0


COMMAND = Command(
    "train", TrainJob, run, help="train an agent on a built-in environment (the main job)",
    description="Train a LoRA adapter with GRPO on a built-in environment, validating on held-out scenarios; the "
                "best checkpoint is tested at the end. The run lives in <path>/<env>/models/<name>; running the same "
                "command again resumes it from its last checkpoint (raise --steps to train further).",
    epilog="Resume or extend a run: `groupwise train 2048 --seed 0 --steps 16` after an 8-step run continues at "
           "step 8. Watch it: `groupwise report .groupwise/2048/models/2048-s0`.",
    interrupted="every step finished before it is kept (history, trajectories, checkpoint); the same command "
                "resumes from the last checkpoint")
