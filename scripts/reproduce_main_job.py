"""The main job's seeded rows reproduce bitwise: `groupwise train ENV --batch-invariant` run twice with one
seed, each in a process of its own as a user runs it, must write the same history rows (every field but
the volatile ones: `groupwise.runs.history.VOLATILE_FIELDS`), the same sampled tokens and logprobs, and
the same adapter files.

    python scripts/reproduce_main_job.py                  # the tiny random model, 2 steps of 2 x 4 rollouts
    python scripts/reproduce_main_job.py --model smollm2-135m --steps 2

A script, not a test: each run is the whole job (its validation and held-out test included), minutes on a
busy CPU, and the claim is about separate processes. Without --model it saves the tiny random Llama
(`groupwise.runtime.loading.tiny_random_model`, SmolLM2's tokenizer) to the work folder: its answers are
noise, so every reward ties and the job skips its updates (the rows, rollouts and served adapters are
still compared); SmolLM2 trains. Exit code 0 when the runs match, 1 with the first difference named.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def run_job(store: Path, args: argparse.Namespace) -> Path:
    command = [sys.executable, "-m", "groupwise", "train", args.env, "--model", args.model, "--steps", str(args.steps),
               "--seed", str(args.seed), "--path", str(store), "--device", "cpu", "--batch-invariant",
               "--rollouts-per-group", str(args.rollouts_per_group), "--groups-per-step", str(args.groups_per_step)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return store / args.env / "models" / f"{args.env}-s{args.seed}"


def what_it_wrote(run: Path) -> dict[str, Any]:
    """Rows as JSON text (equal text is equal bits: json writes each float's shortest exact repr and tells
    -0.0 from 0.0); per stored trajectory file, each rollout's sampled token ids, their logprobs, its reward
    and its metrics but the volatile ones (``duration``, as in the rows); each checkpoint's adapter bytes."""
    from openai.types.chat.chat_completion import Choice

    import groupwise as gw
    from groupwise.core.choices import choice_logprobs, choice_token_ids
    from groupwise.runs.history import is_volatile, stable_rows
    from groupwise.runs.store import read_groups, trajectory_files

    def rollout(t: Any) -> str:
        choices = [c for c in t.messages_and_choices if isinstance(c, Choice)]
        return json.dumps({"tokens": [choice_token_ids(c) for c in choices],
                           "logprobs": [choice_logprobs(c) for c in choices], "reward": t.reward,
                           "metrics": {k: v for k, v in t.metrics.items() if not is_volatile(k)}}, sort_keys=True)

    return {"rows": [json.dumps(r, sort_keys=True) for r in stable_rows(gw.load_history(run))],
            "trajectories": {f"{split}/{step}": [[rollout(t) for t in g.trajectories] for g in read_groups(path)]
                             for split, step, path in trajectory_files(run)},
            "adapters": {p.relative_to(run).as_posix(): p.read_bytes()
                         for p in sorted(run.glob("checkpoints/*/adapter_model.safetensors"))}}


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    if a["rows"] != b["rows"]:
        for i, (x, y) in enumerate(zip(a["rows"], b["rows"])):
            if x != y:
                rx, ry = json.loads(x), json.loads(y)
                keys = sorted(k for k in set(rx) | set(ry) if rx.get(k) != ry.get(k))
                return f"history row {i} (step {rx.get('step')}, {rx.get('split')}) differs in {keys}"
        return f"{len(a['rows'])} history rows against {len(b['rows'])}"
    for kind in ("trajectories", "adapters"):
        if a[kind].keys() != b[kind].keys():
            return f"{kind}: {sorted(a[kind])} against {sorted(b[kind])}"
        for name in a[kind]:
            if a[kind][name] != b[kind][name]:
                return f"{kind} {name} differ"
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="2048")
    p.add_argument("--model", default=None, help="base model (default: the tiny random Llama, saved to --path)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rollouts-per-group", type=int, default=4)
    p.add_argument("--groups-per-step", type=int, default=2)
    p.add_argument("--path", default=None, help="work folder (default: a temp folder)")
    args = p.parse_args()
    work = Path(args.path or tempfile.mkdtemp(prefix="reproduce-main-job-"))
    if args.model is None:
        from groupwise.runtime.loading import tiny_random_model

        model, tokenizer = tiny_random_model(seed=0)
        model.save_pretrained(work / "tiny")
        tokenizer.save_pretrained(work / "tiny")
        args.model = str(work / "tiny")
    first, second = (what_it_wrote(run_job(work / name, args)) for name in ("first", "second"))
    difference = first_difference(first, second)
    print(json.dumps({"env": args.env, "model": args.model, "steps": args.steps, "seed": args.seed,
                      "rows": len(first["rows"]), "trajectory_files": len(first["trajectories"]),
                      "adapters": len(first["adapters"]), "same": difference is None, "difference": difference}))
    return 0 if difference is None else 1


if __name__ == "__main__":
    sys.exit(main())
