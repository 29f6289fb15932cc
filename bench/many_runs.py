"""N runs of one base model at once on one backend, against the same N runs one after another.

    python bench/many_runs.py --device cuda --arch qwen2.5-0.5b           # one GPU, random Qwen2.5-0.5B shape
    python bench/many_runs.py --device cpu --arch smollm2 --workload 2048  # 2 CPU cores, the main job's env
    python bench/many_runs.py --device cpu --arch tiny-qwen --steps 1      # a smoke test (numbers mean nothing)
    python bench/many_runs.py --device cuda --runs 1,4 --cases together --engine-process in_process,separate
    python bench/many_runs.py --device cuda --runs 4 --lockstep --warmup 4 --steps 2 --rounds 2 --engine-process in_process,separate
    python bench/many_runs.py --device cuda --runs 4 --cases together --engine-process separate --decode-during-updates off
    python bench/many_runs.py --device cuda --runs 8 --cases sequence,joined --engine-process separate --lockstep --warmup 4

Each case runs in a process of its own (its peak memory is its own):
- ``sequence``: for each of --runs runs, a fresh `LocalBackend` loads the base, the run trains --warmup
  untimed and --steps timed GRPO steps, the backend closes (what a sweep costs today);
- ``together``: one `LocalBackend`, the --runs models registered on it (one base, one engine: backend/replica.py),
  every run's steps at once (asyncio tasks; the timed steps start together, after every run's warm-up);
  with --lockstep every step's rollouts start together, as `gw.fit([...])` runs them by default
  (`LoopConfig.lockstep`), else each run goes at its own pace (and on CUDA the engine decodes the runs'
  requests in flight during another run's update: --decode-during-updates off pauses it instead).
- ``joined``: as ``together``, but each run's driver is a process of its own: the case's process holds a
  `LocalBackend(engine_process="separate")` and shares its worker (`backend.share()`), and each run's process
  registers its model there with `LocalBackend(join=address)` and runs its rollouts' requests, tokenising and
  trajectory writes itself, in parallel with the other runs' (backend/sharing.py); one base, one engine as in
  ``together`` (needs --engine-process separate).
With --processes each case's backend runs its engine and trainer in a worker process
(`LocalBackend(devices=[device])`), so the bench's process only sends requests, parses responses and
writes trajectories. With --engine-process separate each case's backend is
`LocalBackend(engine_process="separate")`: one worker process holds the model, engine and trainer and serves
the engine as an engine core, and the bench's process runs every request's Python over it
(backend/frontends.py); its peak memory is the worker's (`DeviceWorker.peak_memory`). --runs and
--engine-process take comma lists: every combination runs, each case in its own process, and each
``separate`` case is printed against its ``in_process`` one (rollout tokens/s, step time, peak memory).

A step is a user's loop: --prompts groups of --group-size rollouts, then `model.train`; with --off-policy a
run gathers its next step's rollouts while the step trains, as `gw.fit` does with
`LoopConfig(max_steps_off_policy=1)` (free-running: such runs are no lockstep members; with --lockstep too, every
run's gathers start together while the last step's updates go on, which `gw.fit` does not do: on an H100 it did
not pay, the updates slowed by the decoding beside them; docs/benchmarks.md). Workload ``chat``
(bench/scaling.py's): one chat request per rollout, --completion-len tokens, a reward of the text. Workload
``2048``: the built-in 2048 env's rollouts (multi-turn, the main job's) on scenarios of the run's seed.
Runs differ by seed (rollouts) and learning rate (1e-3 x (1 + run / 2)), as a sweep's do.

With --rounds N every case runs N times, alternating, and each round's together / sequence ratio is printed with
their median: one call's answer against the machine's spread, which moved one case by up to 1.5 s between runs.

Printed: per case the timed wall time, rollout + trainable tokens, tokens/s, peak memory (CUDA: the
allocator's peak; CPU: peak RSS) and the time in rollout and in train phases (and in the train phases,
the trainer's own steps: forward, backward, optimizer), the engine's passes and its seconds in prefill and in
decode (EngineStats), then the ratios together / sequence: tokens/s (higher is better) and
peak memory (against one run alone, i.e. the sequence's peak).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from groupwise.backend.base import PUBLISH_PARTS
from train_step import KV_CHOICES  # this folder is on the path wherever this file runs

HERE = Path(__file__).resolve().parent


def random_model(name: str, device: str | None = None, dtype: str | None = None) -> tuple[Any, Any]:
    """`load_model` for the backend: ``random:<arch>`` builds bench/train_step.py's shape on `device`."""
    from train_step import build_model

    return build_model(name.removeprefix("random:"), device or "cuda", dtype, seed=0)


def _tokens(groups: list[Any]) -> int:
    """Generated tokens of the groups' rollouts (every sampled choice)."""
    from groupwise.core.choices import choice_token_ids

    n = 0
    for g in groups:
        for t in g.trajectories:
            for m in t.messages_and_choices:
                ids = choice_token_ids(m) if not isinstance(m, dict) else None
                n += len(ids or [])
    return n


async def _gather(model: Any, args: Any, run: int, step: int, scenarios: list[Any]) -> list[Any]:
    import groupwise as gw

    if args.workload == "2048":
        from groupwise.envs import get_env
        from groupwise.loop.rollout_inputs import seeded_scenario

        rollout = get_env("2048").rollout
        picks = [(step * args.prompts + g) % len(scenarios) for g in range(args.prompts)]
        groups = [gw.TrajectoryGroup(rollout(model, seeded_scenario(scenarios[i], run, step, i, j))
                                     for j in range(args.group_size)) for i in picks]
        return await gw.gather_trajectory_groups(groups, pbar_desc=None, max_exceptions=0.5)
    return await chat_groups(model, run, step, prompts=args.prompts, group_size=args.group_size,
                             completion_len=args.completion_len)


async def chat_groups(model: Any, run: int, step: int, *, prompts: int, group_size: int,
                      completion_len: int) -> list[Any]:
    """The chat workload's step (bench/scaling.py's): `prompts` groups of `group_size` rollouts, each one
    chat request of `completion_len` tokens seeded by (run, step, group, rollout), rewarded on its text."""
    import groupwise as gw
    from train_step import QUESTIONS, reward_fn

    client = model.openai_client()

    async def ask(g: int, i: int) -> Any:
        messages = [{"role": "user", "content": f"{QUESTIONS[(g + run) % len(QUESTIONS)]} (step {step})"}]
        r = await client.chat.completions.create(model=model.inference_name(), messages=messages,
                                                 max_tokens=completion_len, temperature=1.0,
                                                 seed=1_000_000 * run + 1000 * step + group_size * g + i)
        c = r.choices[0]
        return gw.Trajectory(messages_and_choices=[*messages, c], reward=reward_fn(c.message.content or ""))

    flat = await asyncio.gather(*(ask(g, i) for g in range(prompts) for i in range(group_size)))
    return [gw.TrajectoryGroup(flat[g * group_size:(g + 1) * group_size]) for g in range(prompts)]


async def _train_run(model: Any, args: Any, run: int, barrier: asyncio.Barrier | None, totals: dict[str, float]) -> None:
    import groupwise as gw

    scenarios: list[Any] = []
    if args.workload == "2048":
        from groupwise.envs import get_env

        scenarios = list(get_env("2048").scenarios(run)[0])
    micro = 512 if args.device == "cpu" else args.micro_batch_tokens
    config = gw.TrainConfig(learning_rate=1e-3 * (1 + run / 2), micro_batch_tokens=micro, compile=args.compile,
                            off_policy="tis" if args.off_policy else "none")
    training: asyncio.Future | None = None  # --off-policy: the last step's update, training while the next gathers

    async def train(step: int, t0: float, t1: float, groups: list[Any]) -> None:
        result = await model.train(groups, config=config)
        if step >= args.warmup:
            totals.setdefault("events", []).append((step, t0, t1, time.perf_counter(), result.metrics.get("update_time", 0)))
            totals["rollout_tokens"] = totals.get("rollout_tokens", 0) + _tokens(groups)
            totals["trainable_tokens"] = totals.get("trainable_tokens", 0) + result.metrics.get("trainable_tokens", 0)
            for key, metric in STEP_TIMES.items():
                totals[key] = totals.get(key, 0) + result.metrics.get(metric, 0)

    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            if training is not None:  # the timed steps start with no update of a warm-up step in flight
                await training
                training = None
            if barrier is not None:
                await barrier.wait()  # every run's timed steps start together
            totals.setdefault("t0", time.perf_counter())
            if "engine0" not in totals:
                totals["engine0"] = await _engine_counters(model.backend())
        if args.lockstep and barrier is not None and step > args.warmup:
            await barrier.wait()  # every run's rollouts of this step start together: one batch
        t0 = time.perf_counter()
        groups = await _gather(model, args, run, step, scenarios)
        t1 = time.perf_counter()
        if args.off_policy:
            # gw.fit with LoopConfig(max_steps_off_policy=1): step s+1's rollouts are gathered while step s
            # trains (sampled by the policy before it), and an update starts after the one before it ended
            if training is not None:
                await training
            training = asyncio.ensure_future(train(step, t0, t1, groups))
        else:
            await train(step, t0, t1, groups)
    if training is not None:
        await training


# a step's own times (its metrics), summed over a case's timed steps: bench key -> the step metric
STEP_TIMES = {"update_s": "update_time", "tokenize_s": "time/tokenize_s", "publish_s": "time/publish_s",
              **{f"{part}_s": f"time/publish_{part}_s" for part in PUBLISH_PARTS}}


COUNTERS = ("prefill_passes", "warm_passes", "decode_passes", "graph_captures", "prefill_s", "decode_s",
            "decode_wait_s", "decode_s_in_updates")
DECODE_DURING_UPDATES = {"auto": None, "on": True, "off": False}  # --decode-during-updates: Engine(decode_during_updates=)


async def _engine_counters(backend: Any) -> dict[str, float]:
    """The engine's pass counters (inference/step_state.py's EngineStats), for where a rollout phase's time
    goes; read from the in-process worker (a bench's look inside, not an API), or asked of the worker
    process (`DeviceWorker.engine_stats`) with --engine-process separate; 0 with --processes."""
    if backend.worker_pids and getattr(backend, "engine_process", None) == "separate":
        [stats] = await backend._call_all("engine_stats")
        return {k: stats.get(k, 0) for k in COUNTERS}
    worker = getattr(backend, "_worker", None)
    engines = [b.engine for b in getattr(worker, "bases", {}).values()]
    return {k: sum(getattr(e.stats, k, 0) for e in engines) for k in COUNTERS}


def _backend(args: Any, path: str) -> Any:
    import groupwise as gw
    from many_runs import random_model as load_model  # importable by a worker process (this file runs as __main__)

    if args.join is not None:  # a joined case's run: the worker's settings are the sharing backend's
        return gw.LocalBackend(path=path, join=args.join, best_checkpoint_metric=None, served_steps=1, serve_http=False,
                               lora=gw.LoraConfig(rank=args.rank, alpha=2 * args.rank))
    random_arch = args.arch not in ("smollm2",)
    runs = args.runs if args.case in ("together", "joined") else 1  # the engine batches every run's rollouts of a step
    where = {"devices": [args.device]} if args.processes else {"device": args.device}
    return gw.LocalBackend(path=path, **where, engine_process=args.engine_process, dtype=args.dtype, best_checkpoint_metric=None,
                           served_steps=1, serve_http=False, verify_adapter=not args.no_verify, max_batch_size=runs * args.prompts * args.group_size,
                           joint_updates=args.joint_updates,
                           lora=gw.LoraConfig(rank=args.rank, alpha=2 * args.rank),
                           load_model=load_model if random_arch else None,
                           engine_kwargs={"release_when_idle": KV_CHOICES[args.kv],
                                          "decode_during_updates": DECODE_DURING_UPDATES[args.decode_during_updates],
                                          **({"fuse_decode": False} if args.no_fuse else {})})


def _base(args: Any) -> str:
    return "smollm2-135m" if args.arch == "smollm2" else f"random:{args.arch}"


async def _worker_peak_gb(backend: Any, args: Any) -> float:
    """The peak memory of the backend's worker process (its model is there); NaN for an in-process backend."""
    if not backend.worker_pids:
        return float("nan")
    [peak] = await backend._call_all("peak_memory")  # a bench's look inside, as _engine_counters
    return peak["device_gb"] if args.device.startswith("cuda") else peak["rss_gb"]


class _StdioBarrier:
    """A joined run's side of the barriers of --lockstep and of the timed steps' start: say READY, wait for GO
    (the case's process answers once every run's process is ready: `_joined`)."""

    async def wait(self) -> None:
        print("READY", flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        if line.strip() != "GO":
            raise SystemExit("the joined case's process is gone")


async def _one_joined_run(args: Any) -> None:
    """A joined case's run (--case run): its model on the shared worker, its steps; prints its totals, then
    closes when told (the case's process reads the engine's counters first: the last run to leave the worker
    closes the base and its engine)."""
    import groupwise as gw

    backend = _backend(args, args.store)
    model = gw.TrainableModel(f"run{args.run_index}", project="bench", base_model=_base(args))
    totals: dict[str, Any] = {}
    try:
        await model.register(backend)
        await _train_run(model, args, args.run_index, _StdioBarrier(), totals)
        totals["end"] = time.perf_counter()
        totals.pop("engine0", None)
        print("RESULT " + json.dumps(totals), flush=True)
        await asyncio.to_thread(sys.stdin.readline)
    finally:
        await backend.close()


async def _joined(args: Any, path: str, totals: dict[str, Any]) -> tuple[float, float]:
    """The joined case (module doc): the shared worker here, a process per run; (timed s, worker peak).
    perf_counter is the system's monotonic clock, so the runs' times compare across processes."""
    if args.engine_process != "separate":
        raise SystemExit("the joined case shares a worker: run it with --engine-process separate")
    backend = _backend(args, path)
    procs: list[subprocess.Popen] = []
    try:
        address = await backend.share()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]))
        for r in range(args.runs):
            procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--case", "run", "--join", address,
                                           "--run-index", str(r), "--store", path], env=env, text=True,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE))

        async def line(p: subprocess.Popen) -> str:
            while True:
                text = await asyncio.to_thread(p.stdout.readline)
                if not text:
                    raise SystemExit(f"a joined run's process exited ({p.wait()})")
                if text.startswith(("READY", "RESULT ")):
                    return text.strip()

        rounds = 1 + (args.steps - 1 if args.lockstep else 0)
        for i in range(rounds):
            assert all(x == "READY" for x in await asyncio.gather(*(line(p) for p in procs)))
            if i == 0:
                totals["engine0"] = await _engine_counters(backend)
            for p in procs:
                p.stdin.write("GO\n")
                p.stdin.flush()
        results = [json.loads(x.removeprefix("RESULT ")) for x in await asyncio.gather(*(line(p) for p in procs))]
        end = await _engine_counters(backend)
        for p in procs:
            p.stdin.write("CLOSE\n")
            p.stdin.flush()
        await asyncio.gather(*(asyncio.to_thread(p.wait) for p in procs))
        totals.update({k: end[k] - totals["engine0"][k] for k in COUNTERS})
        for one in results:
            for k in ("rollout_tokens", "trainable_tokens", *STEP_TIMES):
                totals[k] = totals.get(k, 0) + one.get(k, 0)
            totals.setdefault("events", []).extend(one.get("events", []))
        timed = max(one["end"] for one in results) - min(one["t0"] for one in results)
        return timed, await _worker_peak_gb(backend, args)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        await backend.close()


async def case(args: Any) -> dict[str, Any]:
    import groupwise as gw

    path = tempfile.mkdtemp(prefix=f"gw-many-{args.case}-")
    totals: dict[str, float] = {}
    timed = 0.0
    worker_peak = float("nan")
    if args.case == "joined":
        timed, worker_peak = await _joined(args, path, totals)
    elif args.case == "together":
        backend = _backend(args, path)
        models = [gw.TrainableModel(f"run{r}", project="bench", base_model=_base(args)) for r in range(args.runs)]
        try:
            for m in models:
                await m.register(backend)
            barrier = asyncio.Barrier(args.runs)
            await asyncio.gather(*(_train_run(m, args, r, barrier, totals) for r, m in enumerate(models)))
            timed = time.perf_counter() - totals["t0"]
            end = await _engine_counters(backend)
            totals.update({k: end[k] - totals["engine0"][k] for k in COUNTERS})
            worker_peak = await _worker_peak_gb(backend, args)
        finally:
            await backend.close()
    else:
        for r in range(args.runs):
            backend = _backend(args, path)
            model = gw.TrainableModel(f"run{r}", project="bench", base_model=_base(args))
            one: dict[str, float] = {}
            try:
                await model.register(backend)
                await _train_run(model, args, r, None, one)
                timed += time.perf_counter() - one["t0"]
                end = await _engine_counters(backend)
                for k in COUNTERS:
                    totals[k] = totals.get(k, 0) + end[k] - one["engine0"][k]
                peak = await _worker_peak_gb(backend, args)
                worker_peak = peak if worker_peak != worker_peak else max(worker_peak, peak)  # NaN: the first
            finally:
                await backend.close()
            for k in ("rollout_tokens", "trainable_tokens", *STEP_TIMES):
                totals[k] = totals.get(k, 0) + one.get(k, 0)
            totals.setdefault("events", []).extend(one.get("events", []))
    # where the time went: the rollout phase (first rollout started -> last group gathered) and the train
    # phase (-> last update served), per step of the case, summed over the timed steps; in sequence each
    # run's steps are their own
    phases = {"rollout_s": 0.0, "train_s": 0.0}
    by_step: dict[tuple, list] = {}
    for i, (step, *ts) in enumerate(totals.get("events", [])):
        by_step.setdefault(i if args.case == "sequence" else step, []).append(ts)
    # a step's updates in the order they ended, averaged over the steps: an update that waits on nothing but
    # is slower when it comes later in a step shares the worker with what the updates before it left running
    by_order: list[list[float]] = []
    for ts in by_step.values():
        phases["rollout_s"] += max(t[1] for t in ts) - min(t[0] for t in ts)
        phases["train_s"] += max(t[2] for t in ts) - max(t[1] for t in ts)
        for k, t in enumerate(sorted(ts, key=lambda t: t[2])):
            if len(by_order) == k:
                by_order.append([])
            by_order[k].append(t[3])
    phases["update_by_order_s"] = [round(sum(u) / len(u), 4) for u in by_order]
    return {"case": args.case, "timed_s": timed, **phases, "rollout_tokens": totals.get("rollout_tokens", 0),
            "trainable_tokens": totals.get("trainable_tokens", 0), **{k: totals.get(k, 0) for k in STEP_TIMES},
            **{k: totals.get(k, 0) for k in COUNTERS},
            "peak_gb": worker_peak if args.engine_process == "separate" else
            float("nan") if args.processes else _peak_gb(args.device)}


def _peak_gb(device: str) -> float:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KB


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--arch", default="qwen2.5-0.5b", help="a shape of bench/train_step.py's ARCHS (random weights) "
                                                          "or smollm2 (SmolLM2-135M's real weights)")
    p.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--workload", default="chat", choices=["chat", "2048"])
    p.add_argument("--runs", default="4", help="runs of a case; a comma list (1,4) runs each number")
    p.add_argument("--prompts", type=int, default=8, help="groups per step of each run")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--completion-len", type=int, default=128, help="chat workload: tokens per rollout")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--micro-batch-tokens", type=int, default=16384, help="GPU; the CPU uses 512 (the main job's)")
    p.add_argument("--lockstep", action="store_true", help="together: every run starts a step's rollouts when all "
                   "runs have trained the last one (their rollouts batch together), instead of free-running")
    p.add_argument("--off-policy", action="store_true", help="each run gathers a step's rollouts while its last step "
                   "trains, as gw.fit with LoopConfig(max_steps_off_policy=1) and TrainConfig(off_policy='tis'), "
                   "free-running as gw.fit's such runs are; with --lockstep as well, the runs' gathers start "
                   "together while the last step's updates go on: an experiment, not a mode of gw.fit (it did not pay: "
                   "docs/benchmarks.md)")
    p.add_argument("--no-verify", action="store_true", help="skip the check after each step that the engine "
                   "serves the new adapter (BackendOptions.verify_adapter): what the check costs")
    p.add_argument("--processes", action="store_true", help="run each backend's engine and trainer in a worker "
                   "process (LocalBackend(devices=[device])): the client's work (requests, parsing responses, "
                   "writing trajectories) stays in this process; peak memory is then not measured")
    p.add_argument("--engine-process", default="in_process",
                   help="in_process, separate or a comma list of both (LocalBackend(engine_process=); module doc)")
    p.add_argument("--joint-updates", action="store_true", help="the runs' updates that wait at once train in one "
                   "pass (BackendOptions(joint_updates=True)); without it they take turns, the default")
    p.add_argument("--no-fuse", action="store_true", help="capture the decode graphs unfused (Engine(fuse_decode=False)): the baseline of the fusion")
    p.add_argument("--compile", action="store_true", help="TrainConfig(compile=True): the updates' decoder layers "
                   "compiled (the runs' first, warm-up step compiles)")
    p.add_argument("--rounds", type=int, default=1, help="run every case this many times, the cases alternating "
                   "(sequence, together, sequence, ...): each round's ratio and their median are printed, so one call "
                   "measures the ratio against the machine's spread")
    p.add_argument("--decode-during-updates", choices=list(DECODE_DURING_UPDATES), default="auto",
                   help="the engine's running requests during a run's update: decoded by graph replays (on), paused "
                        "(off), or the engine's default, on with CUDA graphs (auto); free-running runs overlap there")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--case", choices=["together", "sequence", "joined", "run"], default=None, help="(internal) run one case")
    p.add_argument("--join", default=None, help="(internal) a joined case's run: the shared worker's address")
    p.add_argument("--run-index", type=int, default=0, help="(internal) a joined case's run: which run")
    p.add_argument("--store", default=None, help="(internal) a joined case's run: the runs' folder")
    p.add_argument("--cases", default="sequence,together", help="which cases to run, of sequence, together and "
                   "joined (each ratio needs the sequence)")
    p.add_argument("--kv", choices=list(KV_CHOICES), default="auto",
                   help="the engine's KV, prefixes and CUDA graphs in each update's pause: freed (release), kept "
                        "(keep), or the engine's default, freed under memory pressure (auto)")
    args = p.parse_args()
    sys.path.insert(0, str(HERE))  # train_step's builder
    if args.case is not None:
        args.runs = int(args.runs)
        if args.case == "run":
            asyncio.run(_one_joined_run(args))
            return 0
        print("RESULT " + json.dumps(asyncio.run(case(args))), flush=True)
        return 0
    runs_list = [int(n) for n in args.runs.split(",")]
    modes = args.engine_process.split(",")

    card = "cpu"
    if args.device.startswith("cuda"):
        import torch

        card = torch.cuda.get_device_name(0)
    rounds: list[dict[str, dict[str, Any]]] = []
    for _ in range(args.rounds):
        this_round: dict[str, dict[str, Any]] = {}
        for mode in modes:
            for runs in runs_list:
                results = _cases(args, mode, runs, card)
                if results is None:
                    return 1
                this_round[f"{mode}/{runs}"] = results
        rounds.append(this_round)
    all_results = rounds[0]
    if args.rounds > 1:
        _print_rounds(rounds, card)
    if len(modes) > 1:
        print(f"\nseparate engine core / in process, on {card}:")
        for key, r in all_results.items():
            mode, runs = key.split("/")
            if mode != "in_process":
                for name, x in r.items():
                    base = all_results.get(f"in_process/{runs}", {}).get(name)
                    if base is not None:
                        print(f"  {runs} run(s) {name:>9}: rollout tokens/s {x['rollout_tok_s'] / base['rollout_tok_s']:.2f}x "
                              f"({x['rollout_tok_s']:.0f} vs {base['rollout_tok_s']:.0f}), step time "
                              f"{x['step_s'] / base['step_s']:.2f}x ({x['step_s']:.2f} vs {base['step_s']:.2f} s), "
                              f"peak {x['peak_gb']:.2f} vs {base['peak_gb']:.2f} GB")
    if args.json:
        out = {"args": vars(args), "card": card, "results": all_results}
        if args.rounds > 1:
            out["rounds"] = rounds
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def _ratio(together: dict[str, Any] | None, sequence: dict[str, Any] | None) -> float | None:
    if together is None or sequence is None:
        return None
    return together["tok_s"] / sequence["tok_s"]


def _print_rounds(rounds: list[dict[str, dict[str, Any]]], card: str) -> None:
    """Each round's together / sequence tokens/s for every engine placement, and for the runs together with
    the separate core against the runs alone in process (each case where it is faster: engine_process_for's
    choice), then the median over the rounds."""
    import statistics

    print(f"\ntogether / sequence tokens/s by round, on {card}:")
    keys = sorted({k for r in rounds for k in r})
    pairs = [(k, k, k) for k in keys]
    for key in keys:
        mode, runs = key.split("/")
        if mode == "separate" and f"in_process/{runs}" in keys:
            pairs.append((f"{runs} runs, together separate / sequence in process", key, f"in_process/{runs}"))
    for label, together_key, sequence_key in pairs:
        ratios = [_ratio(r.get(together_key, {}).get("together"), r.get(sequence_key, {}).get("sequence")) for r in rounds]
        ratios = [x for x in ratios if x is not None]
        if ratios:
            print(f"  {label}: " + ", ".join(f"{x:.2f}x" for x in ratios) + f"; median {statistics.median(ratios):.2f}x")


def _cases(args: Any, mode: str, runs: int, card: str) -> dict[str, Any] | None:
    """Every case of --cases for one engine placement and number of runs, each in a process of its own."""
    results = {}
    for name in args.cases.split(","):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]))
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--case", name, "--runs", str(runs),
                              "--engine-process", mode], env=env, text=True, stdout=subprocess.PIPE, stderr=None)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if out.returncode != 0 or line is None:
            print(out.stdout[-3000:])
            print(f"case {name} failed (exit {out.returncode})")
            return None
        r = json.loads(line.removeprefix("RESULT "))
        r["tok_s"] = (r["rollout_tokens"] + r["trainable_tokens"]) / r["timed_s"]
        r["rollout_tok_s"] = r["rollout_tokens"] / r["rollout_s"] if r["rollout_s"] else float("nan")
        r["step_s"] = r["timed_s"] / (args.steps * (runs if name == "sequence" else 1))
        results[name] = r
        print(f"[{mode}, {runs} run(s)] {name:>9}: {r['timed_s']:.1f} s timed, {r['rollout_tokens']:.0f} rollout + {r['trainable_tokens']:.0f} "
              f"trainable tokens, {r['tok_s']:.0f} tok/s, peak {r['peak_gb']:.2f} GB; rollout phases "
              f"{r['rollout_s']:.1f} s, train phases {r['train_s']:.1f} s "
              f"(each run's own times summed over its steps, waits for the shared compute thread included, so "
              f"together they overlap and can exceed the phases: optimizer steps {r['update_s']:.1f} s, tokenising "
              f"{r.get('tokenize_s', 0):.1f} s, checkpoint and publication {r.get('publish_s', 0):.1f} s: "
              + ", ".join(f"{part} {r.get(part + '_s', 0):.2f} s" for part in PUBLISH_PARTS)
              + "); engine passes: "
              + ", ".join(f"{k} {r.get(k, 0)}" for k in COUNTERS if not k.endswith("_s"))
              + "; a step's updates in the order they ended, s: " + ", ".join(f"{u:.3f}" for u in r.get("update_by_order_s", []))
              + f"; the engine busy {r.get('prefill_s', 0):.1f} s in prefill + {r.get('decode_s', 0):.1f} s in decode "
              f"(of which {r.get('decode_wait_s', 0):.1f} s waiting for the device, {r.get('decode_s_in_updates', 0):.1f} s "
              f"during updates; the rest of the rollout phases it waited for requests)", flush=True)
    seq = results.get("sequence")
    for name in ("together", "joined"):
        tog = results.get(name)
        if seq is None or tog is None:
            continue
        print(f"\n{runs} runs of {_base(args)} on {card} ({args.workload}: {args.prompts} x {args.group_size} rollouts "
              f"a step, {args.steps} timed steps each): {name} / sequence = "
              f"{tog['tok_s'] / seq['tok_s']:.2f}x tokens/s, peak memory {tog['peak_gb'] / seq['peak_gb']:.2f}x one run's "
              f"[{mode}]")
    return results


if __name__ == "__main__":
    sys.exit(main())
