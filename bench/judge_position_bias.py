"""Position bias of a judge: one group judged under every rotation of the order it is shown in.

For a group of n trajectories, the input is rotated n times; because the shown order is a fixed
seeded permutation of the input, over the n rotations every trajectory is shown at every position
exactly once. A position-blind judge gives each trajectory the same score in every rotation; the
spread (max - min over rotations) of each trajectory's score measures how much the position moved it.

Reported for passes=1, passes=2 and passes=n. With passes=n each call already shows every trajectory
at every position once (the n rotations of pass_orders); what spread remains then comes from the
order of the other trajectories around it, which still differs between input rotations. Also reported: the mean Spearman correlation
between passes (judge/pass_spearman) and each trajectory's mean score (does the ranking make sense?).

Run:  python bench/judge_position_bias.py [--judge local/smollm2-135m] [--passes 1,2,4]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from groupwise.judge import ruler_detailed
from groupwise.judge.reconcile import pass_orders

TASK = [
    {"role": "system", "content": "You are a careful math tutor. Answer with the final number and one line of reasoning."},
    {"role": "user", "content": "A shop sells pens at 3 dollars each. Ana buys 4 pens and pays with a 20 dollar bill. How much change does she get?"},
]
ANSWERS = [
    "4 pens cost 4 x 3 = 12 dollars, so the change is 20 - 12 = 8 dollars. Answer: 8",
    "The change is 20 - 3 = 17 dollars. Answer: 17",
    "Pens are nice. I like blue pens the most.",
    "4 x 3 = 12; 20 - 12 = 8. But maybe tax applies, so roughly 7 or 8 dollars. Answer: 8",
]


def group() -> list[list[dict]]:
    return [[*TASK, {"role": "assistant", "content": a}] for a in ANSWERS]


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


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--judge", default="local/smollm2-135m")
    ap.add_argument("--passes", default="1,2,4")
    ap.add_argument("-n", type=int, default=4, help="trajectories in the group (at most 4)")
    ap.add_argument("--temperature", type=float, default=0.0)
    args = ap.parse_args()
    print(f"judge {args.judge}; {args.n} trajectories; every rotation of the shown order; temperature {args.temperature}")
    for i, a in enumerate(ANSWERS[: args.n]):
        print(f"  t{i}: {a}")
    print(f"{'passes':>6} | {'spread per trajectory (max-min over rotations)':<48} | {'mean spread':>11} | {'pass rho':>8} | mean score per trajectory | seconds")
    for k in (int(x) for x in args.passes.split(",")):
        m = await measure(args.judge, k, args.n, temperature=args.temperature)
        spreads = " ".join(f"{s:.2f}" for s in m["spreads"])
        rho = "-" if m["rho"] is None else f"{m['rho']:.2f}"
        means = " ".join(f"{s:.2f}" for s in m["means"])
        print(f"{k:>6} | {spreads:<48} | {statistics.fmean(m['spreads']):>11.3f} | {rho:>8} | {means:<25} | {m['seconds']:.0f}")
        for r, row in enumerate(m["rotations"]):
            print(f"{'':>6}   rotation {r}: scores of t0..t{args.n - 1} = " + " ".join(f"{x:.2f}" for x in row))
        print(f"{'':>6}   pass-0 score by shown position 1..{args.n} (mean over rotations): "
              + " ".join(f"{x:.2f}" for x in m["by_position"]))


if __name__ == "__main__":
    asyncio.run(main())
