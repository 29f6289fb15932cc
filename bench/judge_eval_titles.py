"""`evaluate_judges` on the titles env's labelled set: a scripted reference judge, and optionally real ones.

The reference judge is a few lines of rules taken from `titles.RUBRIC` (4 to 12 words, no "Title:"
label or explanation, no ALL CAPS or "You won't believe", words shared with the text), answering over
the OpenAI chat API in process (an `httpx.MockTransport` behind a real `openai.AsyncOpenAI` client), so
the whole request/parse path runs. It is position-blind and deterministic by construction: the table
shows what a judge with signal looks like (accuracy well above 0.5, flip rate 0) next to the judges
under test.

Run:  python bench/judge_eval_titles.py [--judge local/smollm2-135m] [--groups 4] [--orders 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time

import httpx
from openai import AsyncOpenAI

from groupwise.envs.titles import RUBRIC
from groupwise.envs.titles.labelled import labelled_groups
from groupwise.judge import JudgeSpec, evaluate_judges, format_table

TRAJ_RE = re.compile(r'<trajectory id="([^"]+)">\n(.*?)\n</trajectory>', re.DOTALL)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def rule_score(text: str, title: str) -> float:
    """The rubric's checkable parts: a title of 4-12 words, no label, no caps, sharing words with the text."""
    title = title.strip()
    words = _words(title)
    score = 1.0
    if not 4 <= len(words) <= 12 or "\n" in title:
        score -= 0.5
    if title.lower().startswith("title:") or "summar" in title.lower():
        score -= 0.6
    if title.isupper() or "believe" in title.lower() or "!!" in title:
        score -= 0.6
    content = {w for w in _words(text) if len(w) > 3}
    shared = sum(w in content for w in words if len(w) > 3)
    score += 0.1 * min(shared, 3) - (0.4 if shared == 0 else 0.0)
    return max(0.0, min(1.0, score))


def reference_judge(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    user = body["messages"][1]["content"]
    text = user.split("<trajectory", 1)[0]
    scores = []
    for tid, block in TRAJ_RE.findall(user):
        answer = block.split("[assistant]", 1)[-1].strip()
        s = rule_score(text, answer)
        scores.append({"trajectory_id": tid, "explanation": f"rules: {s:.2f}", "score": s})
    content = json.dumps({"scores": scores})
    return httpx.Response(200, json={
        "id": "ref", "object": "chat.completion", "created": 0, "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": len(user) // 4, "completion_tokens": len(content) // 4,
                  "total_tokens": (len(user) + len(content)) // 4},
    })


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--judge", action="append", default=[], help="judges to evaluate besides the reference")
    ap.add_argument("--groups", type=int, default=12, help="labelled groups (texts), at most 12")
    ap.add_argument("--orders", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-concurrent", type=int, default=2)
    args = ap.parse_args()
    client = AsyncOpenAI(base_url="http://reference.judge/v1", api_key="none",
                         http_client=httpx.AsyncClient(transport=httpx.MockTransport(reference_judge)))
    specs = [JudgeSpec("reference-rules", rubric=RUBRIC, client=client)]
    specs += [JudgeSpec(j, rubric=RUBRIC) for j in args.judge]
    labelled = labelled_groups(args.groups)
    t0 = time.monotonic()
    reports = await evaluate_judges(labelled, specs, orders=args.orders, repeats=args.repeats,
                                    max_concurrent=args.max_concurrent)
    print(format_table(reports, margin=0.05))
    for r in reports:
        for e in r.errors:
            print(f"{r.judge}: {e}")
    print(f"{time.monotonic() - t0:.0f}s")


if __name__ == "__main__":
    asyncio.run(main())
