"""Do environments from the hubs learn? A verifiers and an OpenEnv environment, each trained by `gw.fit` on
SmolLM2-135M-Instruct for several seeds, validated on held-out scenarios before and after.

    python bench/envs_learning.py                       # both envs, seeds 0,1,2: the table (~20 min, 2 cores)
    python bench/envs_learning.py --write-docs          # ... and its block in docs/benchmarks.md
    python bench/envs_learning.py --from-json runs.json --write-docs    # the table of a saved run

The two environments (bench/envs_learning_tasks/), each written as its ecosystem's authors write one:

- **verifiers**: a ``vf.SingleTurnEnv`` (`verifiers_naming.py`): a dataset of requests for one member of a
  category ("Name a fruit."), an eval dataset of 32 requests of 8 categories the dataset never asks for, a
  system prompt asking for a one-word answer, and a ``vf.Rubric`` whose reward is the one-word score (1 /
  words for a longer reply), halved when the reply names no member; its two parts are weight-0 functions
  (metrics). `gw.envs.from_verifiers(load_environment())`; validation: the rubric's reward, with both parts.
- **OpenEnv**: the same task behind a server laid out as ``openenv init`` lays one out (`openenv_naming/`),
  started as its users start it (``uvicorn openenv_naming.server.app:app``), driven through its typed client
  by `gw.envs.from_openenv(NamingEnv, base_url=...)`: an episode is a request, the step's reward the same
  score. Validation: the same 32 held-out requests (``reset(seed, split="val")``).

SmolLM2 answers in sentences (validation near 0.1); ten steps of 2 groups x 4 rollouts move it.
Each env's seeds train at once in one process (`gw.fit_runs`: one model load, the engine batches their
rollouts), and the two envs' processes run at the same time, `--threads` each (one each on the 2-core CPU:
the updates of small batches gain little from a second thread). Validated at step 0, every `--eval-every`
steps and at the end (the loop's validation rows hold
each mean's confidence interval). The detectors only warn, so every run trains its steps. A run *learned
beyond its noise* when its final validation beats its step-0 validation by more than the two intervals'
facing half-widths in quadrature (`groupwise.loop.stopping.significant_gap`, the loop's own test).

verifiers pins ``openai < 3`` and groupwise's venv runs 3.x, so the verifiers runs go in a subprocess of a
venv of its own, as tests/envs/test_verifiers_hub.py does: built once (cached under
``$GROUPWISE_BENCH_CACHE`` or ``~/.cache/groupwise-bench``) with verifiers and openai 2.x, reading this
venv's packages for everything else (`--verifiers-python` gives another). The OpenEnv runs go in a
subprocess of this venv (``pip install 'groupwise[openenv]'``). Each subprocess writes its runs to a JSON
that this process reads back; `--json` keeps the whole, `--write-docs` writes the table between the
``<!-- bench:envs_learning -->`` markers of docs/benchmarks.md with its command, commit and machine
(bench/results_block.py).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import site
import socket
import subprocess
import sys
import tempfile
import time
import venv
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_block import BENCHMARKS, commit, machine, provenance, this_command, write_block  # noqa: E402

NAME = "envs_learning"
ENVS = ("verifiers", "openenv")
TASKS = Path(__file__).resolve().parent / "envs_learning_tasks"
ROOT = Path(__file__).resolve().parent.parent
# the versions tests/envs/test_verifiers_hub.py trains under: verifiers' classic API, its openai 2.x
VERIFIERS_REQUIREMENTS = ["verifiers==0.3.1", "openai>=2.54,<3"]
VERIFIERS_PROBE = "import openai, verifiers; assert openai.__version__.startswith('2.')"
PARTS = ("one_word_reward", "names_a_member")  # the verifiers rubric's weight-0 parts, kept per validation
DETECTOR_ACTIONS = ("on_reward_against_task", "on_val_drop", "on_val_unstable", "on_val_plateau")


# ------------------------------------------------------------------------------- the verifiers venv

def verifiers_python() -> Path:
    """The python of a venv holding verifiers and openai 2.x over this venv's packages, built when missing:
    a venv without pip whose site-packages reads this one's (a .pth appends them, so torch and groupwise come
    from here while verifiers' pins win), filled by this venv's pip."""
    root = Path(os.environ.get("GROUPWISE_BENCH_CACHE") or Path.home() / ".cache" / "groupwise-bench")
    tag = hashlib.sha256("\n".join([*VERIFIERS_REQUIREMENTS, sys.prefix]).encode()).hexdigest()[:12]
    env = root / f"verifiers-env-py{sys.version_info.major}{sys.version_info.minor}-{tag}"
    python = env / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(with_pip=False, clear=True).create(env)
        own = Path(subprocess.check_output([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                                           text=True).strip())
        (own / "zz_groupwise_bench_venv.pth").write_text(
            "".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages()))
    if subprocess.run([str(python), "-c", VERIFIERS_PROBE], capture_output=True).returncode != 0:
        print(f"[envs] installing {VERIFIERS_REQUIREMENTS} into {env} (once; about a minute)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                        "--disable-pip-version-check", *VERIFIERS_REQUIREMENTS], check=True)
    return python


# ------------------------------------------------------------------------------- the OpenEnv server

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(log: Path) -> tuple[subprocess.Popen, str]:
    """The naming env's server, as its users start it: uvicorn on its app. Returns (process, base_url)."""
    import httpx

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", "openenv_naming.server.app:app", "--host", "127.0.0.1",
                                "--port", str(port), "--app-dir", str(TASKS)],
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"the OpenEnv server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def stop_server(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# ------------------------------------------------------------------------------- one env's runs (a worker)

def env_spec(env: str, args: argparse.Namespace, url: str | None) -> tuple[Any, Any, list]:
    """(spec, train scenarios of a seed, validation scenarios) of `env`."""
    import groupwise as gw

    sys.path.insert(0, str(TASKS))
    if env == "verifiers":
        from verifiers_naming import load_environment

        # its eval dataset, all of it, is the validation set (test_size=0: no test split is run here)
        spec = gw.envs.from_verifiers(load_environment(), max_tokens=args.max_tokens, val_size=32, test_size=0)
        return spec, (lambda seed: spec.scenarios(seed)[0]), spec.scenarios(0)[1]
    from oneword import NAMING, SYSTEM
    from openenv_naming import NamingEnv

    from groupwise.envs.openenv_hub import OpenEnvScenario

    spec = gw.envs.from_openenv(NamingEnv, base_url=url, system_prompt=SYSTEM, max_turns=1, max_tokens=args.max_tokens)

    def split(name: str) -> list:  # reset(seed=i, split=...) is the split's i-th request
        return [OpenEnvScenario(reset={"seed": i, "split": name}, max_tokens=args.max_tokens)
                for i in range(len(NAMING[name]))]

    return spec, (lambda seed: split("train")), split("val")


def curve(run_dir: str, metric: str) -> list[dict]:
    """The run's validations: step, mean, interval (the loop's val rows: `metric`, `metric`_lo/_hi/_n), and
    the mean of each other metric the rollouts reported (a verifiers rubric's reward functions)."""
    import groupwise as gw

    out = []
    for row in gw.load_history(run_dir, skip_corrupt=True, warn=False):
        if row.get("split") == "val" and metric in row:
            out.append({"step": row["step"], "value": row[metric], "lo": row.get(f"{metric}_lo"),
                        "hi": row.get(f"{metric}_hi"), "n": row.get(f"{metric}_n"),
                        "metrics": {k: v for k, v in row.items() if k in PARTS}})
    return sorted(out, key=lambda p: p["step"])


async def train_env(env: str, args: argparse.Namespace, url: str | None) -> dict:
    """Every seed of `env` at once (`gw.fit_runs`), on one backend; what each run validated."""
    import groupwise as gw
    from groupwise.config import DEFAULT_MAX_BATCH_SIZE
    from groupwise.jobs.train_setup import train_config

    spec, train_of, val = env_spec(env, args, url)
    seeds = [int(s) for s in args.seeds.split(",")]
    path = Path(args.path) / env
    metric = spec.val_metric
    batch = len(seeds) * max(len(val), args.groups * args.rollouts)
    backend = gw.LocalBackend(str(path), best_checkpoint_metric=f"val/{metric}",
                              max_batch_size=max(DEFAULT_MAX_BATCH_SIZE, batch))
    t0 = time.monotonic()
    try:
        plans, names = [], []
        for seed in seeds:
            model = gw.TrainableModel(name=f"{env}-s{seed}", project="envs-learning", base_model=args.model)
            await model.register(backend)
            config = gw.LoopConfig(
                rollouts_per_group=args.rollouts, groups_per_step=args.groups, max_steps=args.steps, num_epochs=100,
                train_config=train_config(spec, args.lr, "cpu"), eval_every=args.eval_every, metric=metric,
                patience=args.steps + 1, seed=seed,
                **{action: "warn" for action in DETECTOR_ACTIONS})
            plans.append(gw.FitRun(model, spec.rollout, train_of(seed), val_scenarios=val, validate=spec.validate,
                                   config=config))
            names.append((seed, str(model.run_dir)))
        results = await gw.fit_runs(plans)
    finally:
        await backend.close()
    wall = time.monotonic() - t0
    runs = []
    for (seed, run_dir), result in zip(names, results):
        run = {"seed": seed, "run_dir": run_dir, "curve": curve(run_dir, metric),
               "stop": result.stop.rule if isinstance(result, gw.FitSummary) else None}
        if isinstance(result, BaseException):
            run["error"] = f"{type(result).__name__}: {' '.join(str(result).split())[:300]}"
        runs.append(run)
    return {"env": env, "spec": spec.name, "metric": metric, "val_size": len(val), "wall_s": round(wall, 1),
            "runs": runs}


def worker(args: argparse.Namespace) -> None:
    server = None
    url = None
    try:
        if args.worker == "openenv":
            server, url = start_server(Path(args.path) / "openenv-server.log")
        result = asyncio.run(train_env(args.worker, args, url))
    finally:
        if server is not None:
            stop_server(server)
    Path(args.out).write_text(json.dumps(result, indent=1))


# ------------------------------------------------------------------------------- the measure and the table

def point(p: dict) -> Any:
    from groupwise.runs.curves import Point

    return Point(p["step"], p["value"], p.get("lo"), p.get("hi"))


def verdict(run: dict) -> dict:
    """Base (step 0), best and final validation of a run, and whether the final one beats the base beyond
    the noise of the two (`significant_gap`)."""
    from groupwise.loop.stopping import significant_gap

    c = run["curve"]
    if not c or c[0]["step"] != 0 or len(c) < 2:
        return {"base": c[0] if c else None, "best": None, "final": None, "learned": False}
    best = max(c[1:], key=lambda p: p["value"])
    return {"base": c[0], "best": best, "final": c[-1], "learned": significant_gap(point(c[-1]), point(c[0]))}


def interval(p: dict | None) -> str:
    if p is None:
        return "-"
    ci = f" [{p['lo']:.2f}, {p['hi']:.2f}]" if p.get("lo") is not None else ""
    return f"{p['value']:.2f}{ci}"


LABEL = {"verifiers": "verifiers `SingleTurnEnv` (rubric reward)", "openenv": "OpenEnv server (episode return)"}


def parts(env: dict) -> str:
    """The reward's parts at step 0 and at the end, averaged over the seeds (where the rollouts reported
    them: a verifiers rubric's reward functions), so a gain of form alone shows as one."""
    ends = [(r["curve"][0], r["curve"][-1]) for r in env["runs"] if len(r["curve"]) >= 2]
    found = [k for k in PARTS if ends and all(k in a["metrics"] and k in b["metrics"] for a, b in ends)]
    if not found:
        return ""
    said = ", ".join(f"`{k}` {sum(a['metrics'][k] for a, _ in ends) / len(ends):.2f} -> "
                     f"{sum(b['metrics'][k] for _, b in ends) / len(ends):.2f}" for k in found)
    return f" Its parts, step 0 -> final (mean of the seeds): {said}."


def table(result: dict) -> str:
    meta = result["meta"]
    lines = ["| env | seed | val at step 0 [95% CI] | best val (step) | final val (step) [95% CI] | learned beyond noise |",
             "|---|---|---|---|---|---|"]
    for env in result["envs"]:
        for run in env["runs"]:
            v = verdict(run)
            best = f"{v['best']['value']:.2f} ({v['best']['step']})" if v["best"] else "-"
            final = f"{interval(v['final'])} ({v['final']['step']})" if v["final"] else "-"
            if v["final"] and run.get("stop") not in (None, "max_steps"):
                final += f", stopped: {run['stop']}"  # e.g. converged: every rollout scored the maximum
            learned = "yes" if v["learned"] else "no"
            if run.get("error"):  # the run ended early: say so beside what it measured before
                learned += f"; then ended by {run['error'].split(' The unfinished')[0][:110]}"
            lines.append(f"| {LABEL.get(env['env'], env['env'])} | {run['seed']} | {interval(v['base'])} | {best} | "
                         f"{final} | {learned} |")
    lines.append("")
    for env in result["envs"]:
        learned = sum(verdict(r)["learned"] for r in env["runs"])
        lines.append(f"- {env['spec']}: {learned} of {len(env['runs'])} seeds learned beyond their noise; "
                     f"{len(env['runs'])} seeds at once in {env['wall_s'] / 60:.1f} min (validation: "
                     f"`val/{env['metric']}` on {env['val_size']} held-out scenarios).{parts(env)}")
    lines.append(f"- Each run: {meta['steps']} steps x {meta['groups']} groups x {meta['rollouts']} rollouts, "
                 f"lr {meta['lr']:g}, LoRA r=8, at most {meta['max_tokens']} tokens a reply, validated every "
                 f"{meta['eval_every']} steps; the envs' processes at once, {meta['threads']} thread(s) each: "
                 f"{meta['wall_s'] / 60:.1f} min for the whole command.")
    return "\n".join(lines)


def block(result: dict) -> str:
    meta = result["meta"]
    head = provenance(command=meta["command"], commit_id=meta["commit"], machine_text=meta["machine"], day=meta["date"])
    return head + "\n\n" + table(result)


def measure(args: argparse.Namespace) -> dict:
    envs = args.envs.split(",")
    unknown = [e for e in envs if e not in ENVS]
    if unknown:
        raise SystemExit(f"--envs: unknown {unknown}; choose from {list(ENVS)}")
    Path(args.path).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    if args.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
    t0 = time.monotonic()
    started = []
    for name in envs:
        python = (Path(args.verifiers_python) if args.verifiers_python else verifiers_python()) \
            if name == "verifiers" else Path(sys.executable)
        result_file = Path(args.path) / f"{name}.json"
        cmd = [str(python), str(Path(__file__).resolve()), "--worker", name, "--out", str(result_file),
               "--path", args.path, "--seeds", args.seeds, "--steps", str(args.steps), "--groups", str(args.groups),
               "--rollouts", str(args.rollouts), "--lr", str(args.lr), "--max-tokens", str(args.max_tokens),
               "--eval-every", str(args.eval_every), "--model", args.model]
        print(f"[envs] {name}: seeds {args.seeds}, {args.steps} steps (log: {args.path}/{name}.log)", flush=True)
        log = open(Path(args.path) / f"{name}.log", "w")
        started.append((name, result_file, log, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                                  cwd=ROOT)))
    out = []
    for name, result_file, log, process in started:
        rc = process.wait()
        log.close()
        if rc != 0 or not result_file.exists():
            tail = (Path(args.path) / f"{name}.log").read_text()[-3000:]
            raise SystemExit(f"the {name} runs failed (rc {rc}):\n{tail}")
        out.append(json.loads(result_file.read_text()))
        print(f"[envs] {name}: done in {out[-1]['wall_s'] / 60:.1f} min", flush=True)
    meta = {"command": this_command(), "commit": commit(), "machine": machine("cpu"), "date": date.today().isoformat(),
            "wall_s": round(time.monotonic() - t0, 1), "path": args.path,
            **{k: getattr(args, k) for k in ("seeds", "steps", "groups", "rollouts", "lr", "max_tokens", "eval_every",
                                             "model", "threads")}}
    return {"meta": meta, "envs": out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default=",".join(ENVS), help="which envs, comma-separated")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--groups", type=int, default=2, help="groups (scenarios) per step")
    p.add_argument("--rollouts", type=int, default=4, help="rollouts per group")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-tokens", type=int, default=16, help="most tokens a reply")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each env's process (they run at once)")
    p.add_argument("--path", default=None, help="run store (default: a temporary folder)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--from-json", default=None, help="print (and with --write-docs write) a saved result's table")
    p.add_argument("--write-docs", action="store_true", help=f"write the table into {BENCHMARKS.relative_to(ROOT)}")
    p.add_argument("--verifiers-python", default=None, help="a python with verifiers and openai 2.x (default: "
                                                            "a venv built and cached for the bench)")
    p.add_argument("--worker", choices=ENVS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.path = args.path or tempfile.mkdtemp(prefix="gw-envs-learning-")
    if args.worker:
        worker(args)
        return
    result = json.loads(Path(args.from_json).read_text()) if args.from_json else measure(args)
    if args.json and not args.from_json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(block(result))
    if args.write_docs:
        write_block(BENCHMARKS, NAME, block(result))
        print(f"[envs] wrote the table into {BENCHMARKS}")


if __name__ == "__main__":
    main()
