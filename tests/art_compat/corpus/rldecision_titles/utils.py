# Helpers of the program below (johnson7788/RLDecisionAgent, backend/ART_title_generator/utils.py),
# restated: its data comes from a Hugging Face data set of Hacker News stories, its reward from a
# local reward function (the title's length against the story's); the cache decorator memoizes.
import functools

from datasets import load_dataset


class _Cache:
    def cache(self):
        def wrap(fn):
            memo = {}

            @functools.wraps(fn)
            async def inner(*args, **kwargs):
                key = (args, tuple(sorted(kwargs.items())))
                if key not in memo:
                    memo[key] = await fn(*args, **kwargs)
                return memo[key]
            return inner
        return wrap


cache = _Cache()


def pull_data(split="train", max_items=10, min_score=20):
    data = load_dataset("OpenPipe/hacker-news-scraped-stories-filtered", split=split)
    return data.filter(lambda x: x["score"] >= min_score).select(range(min(max_items, len(data))))


def prompt_for_title(body: str):
    return [{"role": "system", "content": "Write a title for this Hacker News story."},
            {"role": "user", "content": body}]


async def score_title(row_with_title, kind: str) -> float:
    return 1.0 / (1.0 + abs(len(row_with_title["title"].split()) - 8))
