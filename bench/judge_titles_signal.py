"""Does a judge have signal on the titles env? Known-good against known-bad titles, judged with its rubric.

For 12 texts of the titles env, one group of 6 titles each, in a seeded shuffled order: 2 good titles
written for this bench (accurate, specific, short) and 4 bad ones: a generic title ("An Interesting
Story"), clickbait in capitals, an accurate title of ANOTHER text (fluent but wrong), and a reply that is
not a title (a "Title:" label, the text's first sentence, an explanation). The judge scores each group
with `titles.RUBRIC`, as the titles env's reward does. Reported: over the (good, bad) pairs of a group
(8 per text), how often the good title scored higher (won / tied / lost), with a 95% Wilson interval of
the won share; a judge without signal wins about half the pairs that are not tied. Each order is judged
`--orders` times (different shuffles), so position bias cannot pass for signal.

Run:  python bench/judge_titles_signal.py [--judge local/smollm2-135m] [--orders 2]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time

from groupwise.envs.titles.env import RUBRIC, SYSTEM_PROMPT
from groupwise.envs.titles.labelled import GOOD, titles_for
from groupwise.envs.titles.texts import TEXTS
from groupwise.judge import ruler_detailed


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (c - h, c + h)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--judge", default="local/smollm2-135m")
    ap.add_argument("--orders", type=int, default=2, help="shuffled orders judged per text")
    ap.add_argument("--texts", type=int, default=len(GOOD), help=f"how many of the {len(GOOD)} texts")
    args = ap.parse_args()
    won = tied = lost = 0
    good_scores: list[float] = []
    bad_scores: list[float] = []
    by_kind = {k: [0, 0] for k in ("generic", "clickbait", "other text", "not a title")}
    flat = groups = 0
    t0 = time.monotonic()
    for i in range(args.texts):
        for order in range(args.orders):
            titles = titles_for(i)
            shown = list(range(len(titles)))
            random.Random(f"titles-signal:{i}:{order}").shuffle(shown)
            lists = [[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": TEXTS[i]},
                      {"role": "assistant", "content": titles[k][0]}] for k in shown]
            result = await ruler_detailed(lists, args.judge, RUBRIC)
            score = {shown[s.index]: s.score for s in result.scores}
            groups += 1
            flat += len(set(score.values())) == 1
            if groups == 1:
                print(f"the judge's first answer:\n{result.raw_answers[0] if result.raw_answers else None}\n")
            for g in (k for k, (_, ok) in enumerate(titles) if ok):
                good_scores.append(score[g])
                for b, kind in zip(range(2, 6), by_kind):
                    won += score[g] > score[b]
                    tied += score[g] == score[b]
                    lost += score[g] < score[b]
                    by_kind[kind][0] += score[g] > score[b]
                    by_kind[kind][1] += 1
            bad_scores += [score[b] for b in range(2, 6)]
            print(f"text {i} order {order}: " + ", ".join(f"{'GOOD' if titles[k][1] else 'bad'} {score[k]:.2f}"
                                                            for k in range(len(titles))), flush=True)
    n = won + tied + lost
    lo, hi = wilson(won, won + lost)
    print(f"\njudge {args.judge}, {args.texts} texts x {args.orders} orders, {n} (good, bad) pairs, "
          f"{time.monotonic() - t0:.0f}s")
    print(f"good won {won}, tied {tied}, lost {lost}: won share of untied pairs {won / max(won + lost, 1):.3f} "
          f"(95% CI {lo:.3f}-{hi:.3f}; no signal = 0.5)")
    print(f"groups scored all alike: {flat} of {groups}")
    print(f"mean score good {sum(good_scores) / len(good_scores):.3f}, bad {sum(bad_scores) / len(bad_scores):.3f}")
    for kind, (w, m) in by_kind.items():
        print(f"  good beat the {kind} title in {w} of {m} pairs")


if __name__ == "__main__":
    asyncio.run(main())
