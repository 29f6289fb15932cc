"""Position bias of a judge: one group judged under every rotation of the order it is shown in.

For a group of n trajectories, the input is rotated n times; because the shown order is a fixed
seeded permutation of the input, over the n rotations every trajectory is shown at every position
exactly once. A position-blind judge gives each trajectory the same score in every rotation; the
spread (max - min over rotations) of each trajectory's score measures how much the position moved it.

The group: "What is the capital of France?" with three right, concise answers and three plainly
wrong or off-topic ones, so quality really differs and is easy to see. Reported per `passes` value
(default 1 and 2): each trajectory's spread, its mean score over rotations, the mean Spearman rank
correlation between passes (judge/pass_spearman; "-" when a pass scored everything alike), the
right-answer vs wrong-answer mean, how often a right answer out-scored a wrong one (over all
(right, wrong) pairs in all rotations), and the pass-0 score by shown position (position bias
proper: a position-blind judge gives the same mean at every position).

With passes=n each call already shows every trajectory at every position once (the n rotations of
pass_orders); what spread remains then comes from the order of the others around it.

Run:  python bench/judge_position_bias.py [--judge local/smollm2-135m] [--passes 1,2] [--temperature 1]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from groupwise.judge import ruler_detailed
from groupwise.judge.reconcile import pass_orders

TASK = [
    {"role": "system", "content": "Answer the question in a few words."},
    {"role": "user", "content": "What is the capital of France?"},
]
# (answer, correct): a question even a 135M model knows, three right and concise answers, three plainly
# wrong or off-topic ones, interleaved so that input order says nothing about quality.
ANSWERS = [
    ("Paris.", True),
    ("The capital of France is Berlin.", False),
    ("The capital of France is Paris.", True),
    ("I like turtles.", False),
    ("Paris is the capital of France.", True),
    ("Madrid.", False),
]


def group() -> list[list[dict]]:
    return [[*TASK, {"role": "assistant", "content": a}] for a, _ in ANSWERS]


async def measure(judge: str, passes: int, n: int, **options) -> dict:
    lists = group()[:n]
    per_rotation: list[list[float]] = []  # [rotation][trajectory]
    by_position: list[list[float]] = [[] for _ in range(n)]  # pass 0's score of whoever was shown at k
    rhos: list[float] = []
    first_order = pass_orders(n, passes, 0)[0]  # positions of the rotated input in pass 0
    t0 = time.monotonic()
    for r in range(n):
        rotated = lists[r:] + lists[:r]
        result = await ruler_detailed(rotated, judge, passes=passes, seed=0, **options)
        by_input = [0.0] * n
        for s in result.scores:
            by_input[(s.index + r) % n] = s.score  # rotated[i] is lists[(i + r) % n]
        per_rotation.append(by_input)
        for k, i in enumerate(first_order):
            by_position[k].append(result.scores[i].pass_scores[0])
        if "judge/pass_spearman" in result.metrics:
            rhos.append(float(result.metrics["judge/pass_spearman"]))
    spreads = [max(col) - min(col) for col in zip(*per_rotation)]
    means = [statistics.fmean(col) for col in zip(*per_rotation)]
    return {"passes": passes, "spreads": spreads, "means": means, "rotations": per_rotation,
            "by_position": [statistics.fmean(v) for v in by_position], "rho": statistics.fmean(rhos) if rhos else None,
            "seconds": time.monotonic() - t0}


def pair_order(scores: list[float], n: int) -> tuple[int, int, int]:
    """(right, tied, wrong) over the (correct, wrong-answer) pairs: does a correct answer out-score a wrong one?"""
    good = [scores[i] for i in range(n) if ANSWERS[i][1]]
    bad = [scores[i] for i in range(n) if not ANSWERS[i][1]]
    pairs = [(g, b) for g in good for b in bad]
    return sum(g > b for g, b in pairs), sum(g == b for g, b in pairs), sum(g < b for g, b in pairs)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--judge", default="local/smollm2-135m")
    ap.add_argument("--passes", default="1,2")
    ap.add_argument("-n", type=int, default=len(ANSWERS), help=f"trajectories in the group (at most {len(ANSWERS)})")
    ap.add_argument("--temperature", type=float, default=None,
                    help="sampling temperature; default none sent (local judges then decode greedily)")
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible judge endpoint (then --judge is its model name)")
    args = ap.parse_args()
    options = {k: v for k, v in (("temperature", args.temperature), ("base_url", args.base_url)) if v is not None}
    n = args.n
    print(f"judge {args.judge}; {n} trajectories; every rotation of the shown order; temperature {args.temperature or 'default'}")
    for i, (a, ok) in enumerate(ANSWERS[:n]):
        print(f"  t{i} ({'right' if ok else 'WRONG'}): {a}")
    print()
    print("| passes | spread t0..t" + str(n - 1) + " | mean spread | pass rho | mean score t0..t" + str(n - 1)
          + " | right / wrong mean | pairs right>wrong (won/tied/lost, all rotations) | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    details = []
    for k in (int(x) for x in args.passes.split(",")):
        m = await measure(args.judge, k, n, **options)
        good = statistics.fmean(m["means"][i] for i in range(n) if ANSWERS[i][1])
        bad = statistics.fmean(m["means"][i] for i in range(n) if not ANSWERS[i][1])
        won = tied = lost = 0
        for row in m["rotations"]:
            w, t, lo = pair_order(row, n)
            won, tied, lost = won + w, tied + t, lost + lo
        rho = "-" if m["rho"] is None else f"{m['rho']:.2f}"
        print(f"| {k} | {' '.join(f'{s:.2f}' for s in m['spreads'])} | {statistics.fmean(m['spreads']):.3f} | {rho} | "
              f"{' '.join(f'{s:.2f}' for s in m['means'])} | {good:.2f} / {bad:.2f} | {won}/{tied}/{lost} | {m['seconds']:.0f} |",
              flush=True)
        details.append((k, m))
    for k, m in details:
        print(f"\npasses={k}:")
        for r, row in enumerate(m["rotations"]):
            print(f"  rotation {r}: scores of t0..t{n - 1} = " + " ".join(f"{x:.2f}" for x in row))
        print(f"  pass-0 score by shown position 1..{n} (mean over rotations): " + " ".join(f"{x:.2f}" for x in m["by_position"]))


if __name__ == "__main__":
    asyncio.run(main())
