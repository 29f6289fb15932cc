"""`evaluate_judges` on the 2048 env's validation games, labelled by the env's own reward.

Step 1 (once, `--make`): the base model (SmolLM2-135M-Instruct, as `groupwise train 2048` starts from)
plays `--groups` validation games `--group-size` times each (every rollout its own sampling seed); each
game is labelled with its reward (invalid move -1 plus progress credit, else tiles and format), groups
whose games all scored alike are dropped, and the rest is written as a labelled JSONL
(`gw.judge.save_labelled`). That file is what `groupwise judge eval --labels FILE` reads, so any judge
can be measured on it later without playing again.

Step 2: the judges. The reference is a few scripted rules from the game's reply format (each reply
with one ``<move>`` tag counts 1, a reply that names one direction word 0.5, the first reply without a
move ends the count), answering over the OpenAI chat API in process (an `httpx.MockTransport` behind a
real `openai.AsyncOpenAI` client), position-blind and deterministic by construction: it shows what a
judge with signal scores on these labels. `--judge local/smollm2-135m` adds the offline judge (slow
on a CPU: `--judge-groups` limits it to the first groups).

    python bench/judge_eval_2048.py --judge local/smollm2-135m --judge-groups 4   # on bench/data's set
    python bench/judge_eval_2048.py --make --labels my-2048.jsonl --groups 16 --group-size 4   # a new set
    groupwise judge eval --labels bench/data/2048_val_labels.jsonl --judge openai/o4-mini    # any judge
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path

import httpx
from openai import AsyncOpenAI

from groupwise.judge import JudgeSpec, evaluate_judges, format_table, labelled_from_groups, load_labelled, save_labelled

RUBRIC = """- The agent plays 2048: every reply must be exactly one <move>left</move>, <move>right</move>, <move>up</move> or <move>down</move> tag.
- A reply without a valid move, or with a move that does not change the board, ends the game: that is the worst outcome.
- A game that makes more valid moves is better; among those, larger tiles and a larger board total are better.
- A move named without the tag is played but worse than a tagged one."""

# The set the figures in docs/judge.md were measured on (written by --make; the rollouts are not
# bitwise the same on another machine, so the set is kept to judge new judges on the same games).
LABELS = Path(__file__).resolve().parent / "data" / "2048_val_labels.jsonl"

TRAJ_RE = re.compile(r'<trajectory id="([^"]+)">\n(.*?)\n</trajectory>', re.DOTALL)
TAG_RE = re.compile(r"<move>\s*(left|right|up|down)\s*</move>", re.IGNORECASE)
WORD_RE = re.compile(r"\b(left|right|up|down)\b", re.IGNORECASE)


def rule_score(block: str, max_turns: int = 4) -> float:
    """The replies' format, turn by turn: one tag 1, one direction word 0.5, else the game ends here."""
    score = 0.0
    for reply in re.findall(r"\[assistant\] (.*?)(?=\n\[user\]|\Z)", block, re.DOTALL):
        if len(TAG_RE.findall(reply)) == 1:
            score += 1.0
        elif len({w.lower() for w in WORD_RE.findall(reply)}) == 1:
            score += 0.5
        else:
            break
    return min(1.0, score / max_turns)


def reference_judge(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    user = body["messages"][1]["content"]
    scores = [{"trajectory_id": tid, "explanation": f"rules: {rule_score(block):.2f}", "score": rule_score(block)}
              for tid, block in TRAJ_RE.findall(user)]
    content = json.dumps({"scores": scores})
    return httpx.Response(200, json={
        "id": "ref", "object": "chat.completion", "created": 0, "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": len(user) // 4, "completion_tokens": len(content) // 4,
                  "total_tokens": (len(user) + len(content)) // 4},
    })


async def make_labels(path: Path, groups: int, group_size: int, model_name: str, work: str) -> None:
    """Roll out the base model on the first `groups` validation games, `group_size` times each."""
    import groupwise as gw
    from groupwise.envs import get_env

    spec = get_env("2048")
    _, val, _ = spec.scenarios(0, max_tokens=spec.max_tokens)
    model = gw.TrainableModel(name="labels", project="2048-labels", base_model=model_name, base_path=work)
    backend = gw.LocalBackend(work, max_batch_size=max(32, groups * group_size))
    await model.register(backend)
    try:
        async def group(scenario):
            # val scenarios carry a fixed sampling seed; each rollout of the group gets its own
            seeds = [scenario.sampling_seed * 1009 + 7 * k for k in range(group_size)]
            trajs = await asyncio.gather(*(spec.rollout(model, scenario.model_copy(update={"sampling_seed": s}))
                                           for s in seeds))
            for t in trajs:
                t.metrics["env_reward"] = t.reward
            print(f"game seed {scenario.seed}: rewards {[round(t.reward, 3) for t in trajs]}", flush=True)
            return gw.TrajectoryGroup(trajs, metadata={"scenario": f"2048 val game seed {scenario.seed}"})

        t0 = time.monotonic()
        played = await asyncio.gather(*(group(s) for s in val[:groups]))
    finally:
        await backend.close()
    labelled = labelled_from_groups(played, "env_reward")
    save_labelled(labelled, path)
    print(f"played {groups} x {group_size} games in {time.monotonic() - t0:.0f}s; {len(labelled)} groups "
          f"have labels that differ (kept) -> {path}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labels", default=str(LABELS), help="the labelled JSONL (written by --make)")
    ap.add_argument("--make", action="store_true", help="play the games and write --labels first")
    ap.add_argument("--groups", type=int, default=16, help="--make: validation games")
    ap.add_argument("--group-size", type=int, default=4, help="--make: rollouts per game")
    ap.add_argument("--model", default="smollm2-135m", help="--make: the policy that plays")
    ap.add_argument("--work", default=".groupwise/2048-labels", help="--make: the backend's folder (git-ignored)")
    ap.add_argument("--judge", action="append", default=[], help="judges to evaluate besides the reference")
    ap.add_argument("--judge-groups", type=int, default=None, help="the --judge judges see only the first N groups")
    ap.add_argument("--orders", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-concurrent", type=int, default=2)
    args = ap.parse_args()
    path = Path(args.labels)
    if args.make:
        await make_labels(path, args.groups, args.group_size, args.model, args.work)
    labelled = load_labelled(path)
    client = AsyncOpenAI(base_url="http://reference.judge/v1", api_key="none",
                         http_client=httpx.AsyncClient(transport=httpx.MockTransport(reference_judge)))
    t0 = time.monotonic()
    reports = await evaluate_judges(labelled, [JudgeSpec("reference-rules", rubric=RUBRIC, client=client)],
                                    orders=args.orders, repeats=args.repeats)
    if args.judge:
        reports += await evaluate_judges(labelled[: args.judge_groups], [JudgeSpec(j, rubric=RUBRIC) for j in args.judge],
                                         orders=args.orders, repeats=args.repeats, max_concurrent=args.max_concurrent)
    print(format_table(reports, margin=0.05))
    for r in reports:
        for e in r.errors:
            print(f"{r.judge}: {e}")
    print(f"{time.monotonic() - t0:.0f}s")


if __name__ == "__main__":
    asyncio.run(main())
