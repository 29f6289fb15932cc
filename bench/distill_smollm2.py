"""On-policy distillation into SmolLM2 against GRPO alone: how many steps each needs to reach the teacher.

    python bench/distill_smollm2.py --device cpu --steps 14 --teacher-steps 24 --arms grpo topk \
        --groups-per-step 1 --time-budget 1800 --teacher-budget 500 \
        --json distill.json --png docs/img/distill_smollm2.png        # oneword, the 2-core CPU, ~27 minutes
    python bench/distill_smollm2.py --from-json distill.json --png docs/img/distill_smollm2.png --write-docs
    groupwise train 2048 --seed 100 --name teacher-s100 --device cpu               # the teacher, as a user trains it
    python bench/distill_smollm2.py --device cpu --env 2048 --teacher-run .groupwise/2048/models/teacher-s100 \
        --arms grpo topk --steps 10 --time-budget 3300 --json distill_2048.json     # 2048 at its preset
    python bench/distill_smollm2.py --smoke            # a tiny random model, one step: the plumbing, in seconds

The env (`--env`, any built-in one with a validation metric) must be one whose GRPO teacher clearly beats
its base within the teacher's budget, or there is nothing to reach: `oneword` (the default; one-word
answers, learnt in a dozen steps on the CPU) is, and so is 2048's job on the CPU (`groupwise train 2048`).

What it runs, in one process on one `LocalBackend` (one copy of the base weights, one engine):

1. **the teacher**: a LoRA of the base trained by GRPO on the env with the main job's own settings
   (`groupwise.jobs.train_setup.loop_config` of the env's preset: what `groupwise train oneword --seed 100
   --name teacher-s100` trains; `--teacher-steps` its steps), validated at step 0, mid-run and at its end
   (or where the loop stops it early: every rollout of a step solved); its best checkpoint is the teacher. Its seed (`--teacher-seed`) is none of the students', so no GRPO student
   replays the teacher's own run. While its best validation does not beat the base's beyond their noise
   (the job's "it learned"), it trains `--teacher-steps` more at a time as `--teacher-budget` seconds allow
   (the job's advice for a run that did not learn: more steps); the JSON and the table say whether it
   ended clearly above. `--teacher-run DIR` takes a run `groupwise train` made (or a checkpoint) instead.
   The best of its validations is a little above what that checkpoint would score again (the maximum of
   noisy measures), which makes the teacher harder to reach for both arms alike.
2. **the students**, every seed of `--seeds` and every arm of `--arms` at once (`gw.fit_runs`: the engine
   batches all their rollouts): a fresh LoRA of the same base, the same preset, `--steps` steps, validated
   after every step on the teacher's validation scenarios (the same held-out set for every seed). Arm
   ``grpo``: GRPO alone. Arm ``sampled`` (``topk``): `gw.fit(..., teacher=<the teacher's best checkpoint>)`
   with the sampled-token (top-k) estimate of the reverse KL, mixed with GRPO's advantage as the job's
   ``--teacher`` does. The loop's detectors only warn here, so every run trains its steps.
3. **the measure**: a run reaches the teacher at the first step whose validation interval contains or
   exceeds the teacher's validation mean (its best checkpoint's). Per seed: the steps each arm needed
   ("never" within the steps it trained), their ratio, and whether the issue's target holds: distillation
   in at most half GRPO's steps. A GRPO run that never reached the teacher needed more than the steps it
   trained, so the target holds when distillation took at most half of those plus one; a seed neither arm
   settles is "open", not a pass.

`--time-budget` (seconds from the start) bounds the whole: the teacher first, then the students' steps
until the budget, when they are cancelled (a step under way ends at its checkpoint) and the table is made
of the steps they finished. The JSON (`--json`) is rewritten every few seconds while the students train,
so a process killed from outside still leaves its curves. `--from-json` prints the table of a saved JSON,
draws its PNG and, with `--write-docs`, writes its env's block of docs/benchmarks.md (between
``<!-- bench:distill_smollm2 -->`` markers for oneword, ``distill_smollm2_<env>`` for another env, with the
command, commit and machine: bench/results_block.py); the tables are bench/distill_tables.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
import tempfile
import time
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_block import BENCHMARKS, commit, machine, this_command, write_block  # noqa: E402
from distill_tables import (  # noqa: E402
    arm_kind, arm_name, arm_setting, block_name, chosen_setting, curves_table, docs_block, plot, point_text, results_table,
    summary_sentence, teacher_line)

ARMS = ("grpo", "sampled", "topk")
WRITE_EVERY_S = 10.0


def write_json(m: dict[str, Any], path: Path | None) -> None:
    """Atomically: a reader (or a kill) never sees half a file."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(m, indent=1))
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------- train

def curve_of(run_dir: str, metric: str) -> list[dict[str, Any]]:
    """The validation points of a run folder's history, each with its train row's reward and teacher KL."""
    import groupwise as gw
    from groupwise.runs.curves import value
    from groupwise.runs.series import points, rows

    history = gw.load_history(run_dir, skip_corrupt=True, warn=False)
    train = {r["step"]: r for r in rows(history, "train")}
    out = []
    for p in points(history, "val", metric):
        row = train.get(p.step - 1, {})  # the train row of step k-1 made the policy of step k
        out.append({"step": p.step, "value": p.value, "lo": p.lo, "hi": p.hi,
                    "train_reward": value(row, "train", "reward"), "teacher_kl": value(row, "train", "teacher_kl")})
    return out


def best_of(run_dir: str, metric: str, best_step: int | None) -> dict[str, Any]:
    """The teacher's base and best validation points (best: `best_step`, else the stop row's, else the max)."""
    import groupwise as gw
    from groupwise.loop.stopping import significant_gap
    from groupwise.runs.curves import Point
    from groupwise.runs.series import events

    curve = curve_of(run_dir, metric)
    if best_step is None:
        stops = [r for r in events(gw.load_history(run_dir, skip_corrupt=True, warn=False), "stop")
                 if r.get("best_step") is not None]
        best_step = stops[-1]["best_step"] if stops else max(curve, key=lambda p: p["value"])["step"] if curve else None
    by_step = {p["step"]: p for p in curve}
    base, best = by_step.get(0), by_step.get(best_step)
    # the job's own test of "it learned" (`groupwise train` says so when it holds): a gain beyond both noises
    above = bool(base and best and significant_gap(Point(best["step"], best["value"], best["lo"], best["hi"]),
                                                   Point(base["step"], base["value"], base["lo"], base["hi"])))
    return {"base": base, "best": best, "curve": curve, "clearly_above_base": above}


def given_teacher(path: str) -> tuple[str, int | None]:
    """(run folder, step) of `--teacher-run`: a run folder (step None: its best) or one of its checkpoints."""
    from groupwise.runs.store import CHECKPOINTS_DIR, dir_name_step

    given = Path(path)
    if given.parent.name == CHECKPOINTS_DIR and dir_name_step(given.name) is not None:
        return str(given.parent.parent), dir_name_step(given.name)
    return path, None


def validated_on(run_dir: str) -> int:
    """How many scenarios a run's validation had (its step-0 row's groups, one rollout each by default)."""
    import groupwise as gw
    from groupwise.runs.series import rows

    found = [r.get("n_groups") for r in rows(gw.load_history(run_dir), "val") if r["step"] == 0]
    if not found or not isinstance(found[0], int):
        raise SystemExit(f"{run_dir}: no validation at step 0 in its history.jsonl; the teacher needs a run "
                         "`groupwise train` (or this bench) validated")
    return found[0]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.json_path = Path(args.json) if args.json else None
        self.m: dict[str, Any] = {}

    def left(self) -> float:
        return self.args.time_budget - (time.monotonic() - self.t0)

    def save(self, status: str | None = None) -> None:
        if status:
            self.m["status"] = status
        self.m["wall_s"] = round(time.monotonic() - self.t0, 1)
        write_json(self.m, self.json_path)

    def refresh(self) -> None:
        for run in self.m["runs"].values():
            run["curve"] = curve_of(run["run_dir"], self.m["meta"]["metric"])
        self.save()

    async def keep_writing(self) -> None:
        while True:
            await asyncio.sleep(WRITE_EVERY_S)
            try:
                self.refresh()
            except Exception as exc:  # a torn read mid-append: the next pass reads it whole
                print(f"[distill] JSON refresh skipped: {type(exc).__name__}: {exc}")

    async def run(self) -> dict[str, Any]:
        import groupwise as gw
        from groupwise.core.validated import replace_set
        from groupwise.envs import get_env
        from groupwise.jobs.train import TrainJob
        from groupwise.jobs.train_setup import job_backend, loop_config
        from groupwise.runtime.loading import resolve_device, resolve_dtype

        a = self.args
        spec = get_env(a.env)
        metric = spec.val_metric
        if metric is None:
            raise SystemExit(f"{a.env} has no validation metric; the measure needs one (2048, tictactoe, math)")
        device = resolve_device(a.device)
        path = a.path or str(Path(".groupwise") / "bench-distill" / datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"))
        self.json_path = self.json_path or Path(path) / "distill.json"
        # The job's own settings object: the preset of the env, with the flags a GPU run may raise.
        job = TrainJob(env=a.env, model=a.model, seed=a.teacher_seed, path=path, device=a.device, dtype=a.dtype,
                       steps=a.teacher_steps, rollouts_per_group=a.rollouts_per_group,
                       groups_per_step=a.groups_per_step, lr=[a.lr] if a.lr else None)
        preset = job.preset()
        val_t = spec.scenarios(a.teacher_seed)[1]
        val_t = val_t[: a.val_size or preset.val_size or len(val_t)]
        if a.teacher_run:  # the students validate on the scenarios the teacher run validated on
            val_t = val_t[: validated_on(given_teacher(a.teacher_run)[0])]
        # The distilling arms' settings: --distill-settings (each arm once per setting), else --lr, else the
        # preset's for a run with a teacher (Preset.distilling: what `groupwise train --teacher` trains at).
        distilling = preset.distilling()
        distill_rate = a.lr or distilling.learning_rate
        arms = list(dict.fromkeys(arm if arm == "grpo" or not a.distill_settings else arm_name(arm, *setting)
                                  for arm in dict.fromkeys(a.arms) for setting in (a.distill_settings or [None])))
        self.m = {
            "meta": {"command": this_command(), "commit": commit(), "machine": machine(str(device)),
                     "date": date.today().isoformat(), "env": spec.name, "metric": metric, "model": a.model,
                     "device": str(device), "dtype": str(resolve_dtype(a.dtype, device)).removeprefix("torch."),
                     "seeds": a.seeds, "arms": arms, "steps": a.steps, "teacher_seed": a.teacher_seed,
                     "learning_rate": preset.learning_rate, "distill_learning_rate": distill_rate,
                     "distill_iterations": distilling.num_iterations,
                     "groups_per_step": preset.groups_per_step,
                     "rollouts_per_group": preset.rollouts_per_group, "val_size": len(val_t),
                     "as_preset": a.lr is None and a.rollouts_per_group is None and a.groups_per_step is None,
                     "distill_top_k": a.distill_top_k, "distill_coef": a.distill_coef,
                     "time_budget_s": a.time_budget, "path": path,
                     "student_scenario": a.student_scenario},
            "status": "running", "teacher": None, "runs": {},
        }
        self.save()
        print(f"[distill] {spec.name}: teacher seed {a.teacher_seed}, students {arms} x seeds {a.seeds}, "
              f"{a.steps} steps; run store {path}; budget {a.time_budget:.0f}s; curves in {self.json_path}")

        runs = 1 + len(arms) * len(a.seeds)
        backend = job_backend(job, preset, runs=runs)
        try:
            teacher_ckpt = await self.teacher(backend, job, spec, preset, val_t)
            if self.left() <= 0:
                print("[distill] the time budget went on the teacher: no student trained")
                self.save("budget")
                return self.m
            plans = []
            for seed in a.seeds:
                _, val_s, _ = spec.scenarios(seed)
                train_s = spec.scenarios(seed, **a.student_scenario)[0]
                val_s = val_s[: len(val_t)]
                if val_s != val_t:
                    raise SystemExit(f"{spec.name}'s validation scenarios differ between seeds {a.teacher_seed} and "
                                     f"{seed}: the students would not be measured on the teacher's")
                for arm in arms:
                    name = f"{arm}-s{seed}"
                    model = gw.TrainableModel(name=name, project=f"distill-{spec.name}", base_model=a.model,
                                              base_path=path)
                    await model.register(backend)
                    rate, iterations = preset.learning_rate, preset.num_iterations
                    if arm != "grpo":
                        given_rate, given_iterations = arm_setting(arm)
                        rate = given_rate or distill_rate
                        iterations = given_iterations or (1 if given_rate else distilling.num_iterations)
                    config = loop_config(spec, dataclasses.replace(preset, learning_rate=rate, num_iterations=iterations),
                                         a.steps, seed, a.device,
                                         distill_top_k=a.distill_top_k if arm_kind(arm) == "topk" else None)
                    if arm != "grpo" and a.distill_coef is not None:
                        config = replace_set(config, train_config=replace_set(config.train_config,
                                                                              distill_coef=a.distill_coef))
                    # Validation after every step, and every run trains its steps: the detectors warn only.
                    config = replace_set(config, eval_every=1, patience=a.steps + 1, **{
                        f: "warn" for f in ("on_reward_against_task", "on_val_drop", "on_val_unstable",
                                            "on_val_plateau")})
                    plans.append(gw.FitRun(model, spec.rollout, train_s, val_scenarios=val_t, validate=spec.validate,
                                           config=config, teacher=None if arm == "grpo" else teacher_ckpt))
                    self.m["runs"][name] = {"arm": arm, "seed": seed, "learning_rate": rate,
                                            "num_iterations": iterations, "run_dir": str(model.run_dir), "curve": []}
            self.save()
            writer = asyncio.create_task(self.keep_writing())
            status = "done"
            try:
                results = await asyncio.wait_for(gw.fit_runs(plans), timeout=max(1.0, self.left()))
                for name, result in zip(self.m["runs"], results):
                    if isinstance(result, BaseException):
                        self.m["runs"][name]["error"] = f"{type(result).__name__}: {' '.join(str(result).split())[:300]}"
            except asyncio.TimeoutError:
                status = "budget"
                print(f"[distill] time budget reached at {time.monotonic() - self.t0:.0f}s: students stopped")
            finally:
                writer.cancel()
            self.refresh()
            self.save(status)
        except BaseException as exc:  # the JSON says so, with the curves so far; the error goes on up
            self.m["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
            self.refresh()
            self.save("failed")
            raise
        finally:
            await backend.close()
        return self.m

    async def teacher(self, backend: Any, job: Any, spec: Any, preset: Any, val_t: list) -> str:
        """Train (or read) the teacher; its best checkpoint's folder ("base" when no step beat the base)."""
        import groupwise as gw
        from groupwise.jobs.train_setup import loop_config
        from groupwise.runs.store import CHECKPOINTS_DIR, step_dir_name

        a = self.args
        metric = spec.val_metric
        started = time.monotonic()
        if a.teacher_run:
            run_dir, best_step = given_teacher(a.teacher_run)
            steps = max((r["step"] for r in gw.load_history(run_dir) if r.get("split") == "val"), default=None)
        else:
            model = gw.TrainableModel(name=f"teacher-s{a.teacher_seed}", project=f"distill-{spec.name}",
                                      base_model=a.model, base_path=job.path)
            await model.register(backend)
            train_s = spec.scenarios(a.teacher_seed)[0]
            steps = preset.steps
            while True:
                summary = await gw.fit(model, spec.rollout, train_s, val_scenarios=val_t, validate=spec.validate,
                                       config=loop_config(spec, preset, steps, a.teacher_seed, a.device))
                run_dir, best_step = str(model.run_dir), summary.best_step
                t = best_of(run_dir, metric, best_step)
                spent = time.monotonic() - started
                if t["clearly_above_base"] or spent + spent / steps * preset.steps > a.teacher_budget:
                    break
                print(f"[distill] teacher not clearly above its base after {steps} steps ({spent:.0f}s): "
                      f"{preset.steps} more")
                steps += preset.steps
        t = best_of(run_dir, metric, best_step)
        if t["best"] is None:
            raise SystemExit(f"the teacher {run_dir} has no validation at step {best_step}: name a checkpoint of a "
                             "validated step (the job validates at 0, its midpoint and its end)")
        step = t["best"]["step"]
        ckpt = "base" if step == 0 else str(Path(run_dir) / CHECKPOINTS_DIR / step_dir_name(step))
        self.m["teacher"] = {"run_dir": run_dir, "checkpoint": ckpt, "seed": None if a.teacher_run else a.teacher_seed,
                             "steps": steps,
                             "wall_s": round(time.monotonic() - started, 1), **t}
        self.save()
        print(f"[distill] teacher: base {point_text(t['base'])} -> best {point_text(t['best'])} at step {step} "
              f"({'clearly above' if t['clearly_above_base'] else 'NOT clearly above'} its base) in "
              f"{time.monotonic() - started:.0f}s; checkpoint {ckpt}")
        return ckpt


# ----------------------------------------------------------------------------------------------- main

def smoke_model(folder: Path) -> str:
    """A tiny random Llama with SmolLM2's tokenizer, saved as a model folder (what the tests train)."""
    from groupwise.runtime.loading import tiny_random_model

    model, tokenizer = tiny_random_model(seed=0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def report(m: dict[str, Any], args: argparse.Namespace) -> None:
    print()
    print(teacher_line(m))
    print()
    print("\n".join(results_table(m)))
    print()
    print(summary_sentence(m))
    print()
    print("\n".join(curves_table(m)))
    if args.png:
        plot(m, Path(args.png))
        print(f"[distill] curves: {args.png}")
    if args.write_docs:
        png = None
        if args.png:
            try:
                png = os.path.relpath(Path(args.png).resolve(), Path(args.docs).resolve().parent)
            except ValueError:
                png = None
        name = block_name(m["meta"]["env"])
        write_block(Path(args.docs), name, docs_block(m, png))
        print(f"[distill] wrote the {name} block of {args.docs}")


def scenario_field(text: str) -> tuple[str, Any]:
    """FIELD=VALUE of --student-scenario: the value as JSON where it parses (5, 0.5, true), else the string."""
    field, eq, value = text.partition("=")
    if not eq or not field.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r}: give FIELD=VALUE, a field of the env's scenarios (reward=exact)")
    try:
        return field, json.loads(value)
    except json.JSONDecodeError:
        return field, value


def distill_setting(text: str) -> tuple[float, int]:
    """RATE[:N] of --distill-settings: a learning rate > 0 and N >= 1 optimizer steps a batch."""
    rate, _, iterations = text.partition(":")
    try:
        value = (float(rate), int(iterations or 1))
    except ValueError:
        value = (0.0, 0)
    if not (value[0] > 0 and value[1] >= 1):
        raise argparse.ArgumentTypeError(f"{text!r}: give RATE[:N], a learning rate > 0 and N >= 1 updates a step "
                                         "(2e-3, 1e-3:4)")
    return value


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="oneword",
                   help="a built-in env with a validation metric, whose GRPO teacher beats its base within its budget")
    p.add_argument("--model", default="smollm2-135m", help="the base model of the teacher and the students")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="the students' seeds")
    p.add_argument("--arms", nargs="+", default=["grpo", "sampled"], choices=ARMS,
                   help="grpo (GRPO alone) and the distillation estimates to train, each on every seed")
    p.add_argument("--steps", type=int, default=12, help="the students' steps (the time budget may cut them)")
    p.add_argument("--teacher-seed", type=int, default=100)
    p.add_argument("--teacher-steps", type=int, default=None,
                   help="the teacher's GRPO steps, and how many more at a time while it is not clearly above its "
                        "base (default: the env's preset, the main job's)")
    p.add_argument("--teacher-budget", type=float, default=150.0,
                   help="seconds the teacher may train before the students start, extensions included")
    p.add_argument("--teacher-run", default=None, metavar="DIR",
                   help="the teacher, instead of training one: a run folder `groupwise train` trained (of this base "
                        "and env; its best checkpoint by validation) or one of its checkpoint folders")
    p.add_argument("--distill-top-k", type=int, default=20, help="k of the topk arm")
    p.add_argument("--distill-coef", type=float, default=None,
                   help="the distillation arms' weight of the teacher's term (TrainConfig.distill_coef; default: its own)")
    p.add_argument("--student-scenario", action="append", default=[], metavar="FIELD=VALUE", type=scenario_field,
                   help="a field of the students' training scenarios, both arms alike (the teacher's and the "
                        "validation's stay the env's): e.g. reward=exact, oneword's sparse reward; repeatable")
    p.add_argument("--lr", type=float, default=None,
                   help="every run's (default: the env's preset; for the distilling arms, its distillation rate)")
    p.add_argument("--distill-settings", type=distill_setting, nargs="+", default=None, metavar="RATE[:N]",
                   help="train each distilling arm once per setting: its learning rate and N optimizer steps on each "
                        "step's batch (TrainConfig.num_iterations; default 1), runs named <arm>-lr<rate>[-it<N>]-s<seed>; "
                        "GRPO keeps --lr. With --choose, a saved measurement names the setting to use "
                        "(distill_tables.chosen_setting)")
    p.add_argument("--choose", action="store_true",
                   help="with --from-json: print, last, the distilling arm of a --distill-settings measurement that its "
                        "rule chooses (the most seeds meeting the target, then the fewest steps, the fewest updates, "
                        "the smaller rate)")
    p.add_argument("--rollouts-per-group", type=int, default=None, help="every run's (default: the env's preset)")
    p.add_argument("--groups-per-step", type=int, default=None, help="every run's (default: the env's preset)")
    p.add_argument("--val-size", type=int, default=None,
                   help="validate on the first N held-out scenarios (default: the job's; the smoke's 4)")
    p.add_argument("--time-budget", type=float, default=330.0,
                   help="seconds for the whole run: students stop adding steps when it is spent")
    p.add_argument("--threads", type=int, default=1,
                   help="torch's CPU threads: one, since on cores other processes share, torch's threads wait on "
                        "each other (a small matmul ran 16x slower with 2 threads than with 1 on 2 busy cores)")
    p.add_argument("--path", default=None, help="run store (default: a fresh .groupwise/bench-distill/<time>)")
    p.add_argument("--json", default=None,
                   help="write the curves here, rewritten as they come (default: distill.json in the run store)")
    p.add_argument("--png", default=None, help="draw both arms' curves per seed here")
    p.add_argument("--from-json", default=None, metavar="PATH", help="tabulate a saved JSON instead of training")
    p.add_argument("--write-docs", action="store_true", help="write the env's block of --docs (oneword: distill_smollm2, another env E: distill_smollm2_E)")
    p.add_argument("--docs", default=str(BENCHMARKS), help="the file whose block --write-docs rewrites")
    p.add_argument("--progress", action="store_true", help="show the rollouts' and updates' progress bars")
    p.add_argument("--smoke", action="store_true",
                   help="a tiny random model on the CPU, 1 teacher step, 1 student step, 4 validation games")
    args = p.parse_args(argv)
    args.student_scenario = dict(args.student_scenario)
    if args.choose and not args.from_json:
        p.error("--choose reads a saved measurement: give it with --from-json")
    if args.teacher_run and args.val_size:
        p.error("--val-size: with --teacher-run the students validate on the scenarios the teacher run did")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    if args.from_json:
        m = json.loads(Path(args.from_json).read_text())
        report(m, args)
        if args.choose:
            arm, why = chosen_setting(m)
            rate, iterations = arm_setting(arm)
            print(f"\n[distill] {why}\n[distill] chosen: {arm}\n{rate:g}:{iterations or 1}")
        return m
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if not args.progress:  # seven runs' progress bars would bury the step lines
        os.environ.setdefault("TQDM_DISABLE", "1")
    import torch

    torch.set_num_threads(args.threads)
    logging.basicConfig(format="[groupwise] %(message)s")
    logging.getLogger("groupwise.loop").setLevel(logging.INFO)
    with tempfile.TemporaryDirectory(prefix="distill-smoke-") as scratch:
        if args.smoke:
            args.model = smoke_model(Path(scratch) / "tiny")
            args.device, args.seeds, args.steps = "cpu", args.seeds[:1], 1
            args.teacher_steps, args.teacher_budget = 1, 0.0
            args.rollouts_per_group, args.groups_per_step = 2, 1
            if not args.teacher_run:  # a teacher run brings its own validation set
                args.val_size = args.val_size or 4
            args.path = args.path or str(Path(scratch) / "runs")
        m = asyncio.run(Bench(args).run())
        report(m, args)
    return m


if __name__ == "__main__":
    main()
