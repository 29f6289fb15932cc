"""A verifiers environment written the way its authors write one: a dataset of questions and answers, a
system prompt, a parser, and a Rubric of reward functions with weights. The task: answer a short trivia
question with exactly one word, the right one (`oneword.py` has the questions and the scoring). The rubric
pays the one-word score, halved when the reply does not name the answer: the form pays at every length (a
dense signal a dozen steps can climb), and a wrong one-word reply earns half of a right one. Paying the
form alone taught SmolLM2 invented one-word replies ("terrajita" for the colour of a tomato: the answer
share fell from 0.27 to 0.06); its two parts are weight-0 functions, which verifiers keeps as metrics.

Runs where verifiers is installed (it pins openai < 3: bench/envs_learning.py runs it in a venv of its
own). ``load_environment()`` is the entry point every environment module on the hub exposes.
"""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

from oneword import SYSTEM, TRAIN_QUESTIONS, VAL_QUESTIONS, mentions, one_word


def load_environment(**env_args) -> vf.Environment:
    parser = vf.Parser()  # the reply as written: the task is its form

    def one_word_reward(completion, **kwargs) -> float:
        return one_word(parser.parse_answer(completion) or "")

    def correct_answer(completion, answer, **kwargs) -> float:
        return 1.0 if mentions(parser.parse_answer(completion) or "", answer) else 0.0

    def one_word_answer(completion, answer, **kwargs) -> float:
        return one_word_reward(completion) * (1.0 if correct_answer(completion, answer) else 0.5)

    rubric = vf.Rubric(funcs=[one_word_answer, one_word_reward, correct_answer], weights=[1.0, 0.0, 0.0],
                       parser=parser)
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(TRAIN_QUESTIONS),
        eval_dataset=Dataset.from_list(VAL_QUESTIONS),  # held-out questions, never trained on
        system_prompt=SYSTEM,
        parser=parser,
        rubric=rubric,
        **env_args,
    )
