"""The one-word task of bench/envs_learning.py: its prompts, held-out split and scoring.

Plain Python (no verifiers, no OpenEnv), so the verifiers environment (`verifiers_naming.py`, run in the
verifiers venv) and the OpenEnv server (`openenv_naming/`) ask and score the same way, and the bench's tests
can check them without either package.

"Name a fruit."-style requests for one member of a category, asked with the system prompt SYSTEM. Held out
by category: the validation categories are never asked in training, so a policy must generalise the
answer's form and its content, not memorise answers.

SmolLM2-135M-Instruct answers in sentences whatever the system prompt says (a one-word-answer rate near
0.1); the form is learnable within a dozen GRPO steps on the CPU (docs/benchmarks.md, the format task).
The reward halves a reply that names no member, so a policy that only shortens its answers is not paid in
full.
"""

from __future__ import annotations

import re

SYSTEM = "Answer with exactly one word. No punctuation, no explanation."
WORD = re.compile(r"[A-Za-z0-9']+")


def words(text: str) -> list[str]:
    return WORD.findall(text or "")


def one_word(text: str) -> float:
    """1 for a reply that is one word (a final '.' or '!' allowed), else 1 / its number of words (0 for none):
    graded, so a shorter reply is better even before it is one word and a group keeps its variance."""
    found = words(text)
    if not found:
        return 0.0
    if len(found) == 1 and re.fullmatch(r"\s*[A-Za-z0-9']+[.!]?\s*", text) is not None:
        return 1.0
    return 1.0 / len(found)


def _stem(word: str) -> str:
    w = word.lower().strip("'")
    return w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w


def mentions(text: str, answers: str | set[str] | list[str]) -> bool:
    """Whether the reply names one of `answers` (a '|'-separated string or a collection), ignoring case and
    a plural 's'."""
    wanted = {_stem(a) for a in (answers.split("|") if isinstance(answers, str) else answers)}
    return any(_stem(w) in wanted for w in words(text))


# ------------------------------------------------------------------------------------------------- naming

CATEGORIES = {
    "fruit": "apple banana orange pear grape cherry peach plum mango lemon lime kiwi melon strawberry pineapple "
             "apricot berry blueberry raspberry watermelon coconut fig papaya",
    "color": "red blue green yellow black white orange purple pink brown gray grey violet silver gold",
    "animal": "dog cat cow horse pig sheep lion tiger bear wolf fox rabbit mouse elephant giraffe zebra monkey "
              "deer goat duck bird fish snake",
    "planet": "mercury venus earth mars jupiter saturn uranus neptune",
    "vegetable": "carrot potato tomato onion cabbage lettuce broccoli pea bean spinach cucumber pepper corn garlic "
                 "celery pumpkin",
    "musical instrument": "piano guitar violin drum drums flute trumpet cello harp saxophone clarinet trombone",
    "metal": "iron gold silver copper aluminum aluminium tin lead zinc steel nickel platinum titanium",
    "sport": "soccer football tennis basketball baseball golf hockey cricket rugby swimming boxing cycling "
             "volleyball running skiing",
    "day of the week": "monday tuesday wednesday thursday friday saturday sunday",
    "month": "january february march april may june july august september october november december",
    "country": "france germany italy spain japan china india brazil canada mexico russia egypt england usa "
               "america australia peru kenya greece",
    "drink": "water milk tea coffee juice soda beer wine lemonade cola",
    "body part": "arm leg hand foot head eye ear nose mouth finger toe knee elbow heart neck",
    "vehicle": "car bus truck bike bicycle train plane airplane boat ship motorcycle van taxi",
    "bird": "eagle sparrow robin owl parrot crow pigeon duck swan penguin hawk chicken",
    "tree": "oak pine maple birch willow palm elm cedar apple spruce",
    "shape": "circle square triangle rectangle oval star diamond hexagon",
    "season": "spring summer autumn fall winter",
    "flower": "rose tulip daisy lily sunflower orchid",
    "insect": "ant bee fly butterfly beetle mosquito wasp moth",
}
PHRASINGS = ["Name a {c}.", "Name one {c}.", "Give an example of a {c}.", "Tell me a {c}."]
VAL_CATEGORIES = ["fruit", "planet", "metal", "month", "drink", "bird", "shape", "insect"]
TRAIN_CATEGORIES = [c for c in CATEGORIES if c not in VAL_CATEGORIES]
NAMING = {split: [{"request": p.format(c=c), "category": c} for c in cats for p in PHRASINGS]
          for split, cats in (("train", TRAIN_CATEGORIES), ("val", VAL_CATEGORIES))}


def naming_reward(reply: str, category: str) -> float:
    """The one-word score of the reply, halved when it names no member of `category`: the form pays at
    every length (a dense signal), and a one-word reply that is no member earns half of one that is."""
    named = mentions(reply, set(CATEGORIES[category].split()))
    return one_word(reply) * (1.0 if named else 0.5)
