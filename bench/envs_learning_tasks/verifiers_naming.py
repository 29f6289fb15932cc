"""A verifiers environment written the way its authors write one: a dataset of prompts and answers, an eval
dataset, a system prompt, a parser, and a Rubric of reward functions with weights. The task: name one
member of a category in exactly one word ("Name a fruit."); a row's answer holds the category's members
('|'-separated), and the eval rows ask for categories the dataset never does (`oneword.py`).

The rubric pays the one-word score, halved when the reply names no member: the form pays at every length
(a dense signal ten steps can climb), and a one-word reply that is no member earns half of one that is.
Its two parts are weight-0 functions, which verifiers keeps as metrics. (Trivia with one right answer a
question was tried first: SmolLM2-135M learned one-word replies and lost the answers, docs/benchmarks.md.)

Runs where verifiers is installed (it pins openai < 3: bench/envs_learning.py runs it in a venv of its
own). ``load_environment()`` is the entry point every environment module on the hub exposes.
"""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

from oneword import CATEGORIES, NAMING, SYSTEM, mentions, one_word


def rows(split: str) -> list[dict[str, str]]:
    return [{"question": r["request"], "answer": "|".join(CATEGORIES[r["category"]].split())} for r in NAMING[split]]


def load_environment(**env_args) -> vf.Environment:
    parser = vf.Parser()  # the reply as written: its form is half the task

    def one_word_reward(completion, **kwargs) -> float:
        return one_word(parser.parse_answer(completion) or "")

    def names_a_member(completion, answer, **kwargs) -> float:
        return 1.0 if mentions(parser.parse_answer(completion) or "", answer) else 0.0

    def one_word_member(completion, answer, **kwargs) -> float:
        return one_word_reward(completion) * (1.0 if names_a_member(completion, answer) else 0.5)

    rubric = vf.Rubric(funcs=[one_word_member, one_word_reward, names_a_member], weights=[1.0, 0.0, 0.0],
                       parser=parser)
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows("train")),
        eval_dataset=Dataset.from_list(rows("val")),  # categories the dataset never asks for
        system_prompt=SYSTEM,
        parser=parser,
        rubric=rubric,
        **env_args,
    )
