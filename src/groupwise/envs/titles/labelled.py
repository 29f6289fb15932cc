"""Known-good and known-bad titles for the titles env's texts: the labelled set a judge is checked on.

Per text, one group of 6 titles: 2 good ones written for this set (accurate, specific, short; label 1)
and 4 bad ones (label 0), one per way a title fails the rubric: generic ("An Interesting Story"),
clickbait in capitals, an accurate title of ANOTHER text (fluent but wrong), and a reply that is not a
title (a "Title:" label, the text's first sentence, an explanation). A judge with signal on this task
ranks the good titles above the bad; `groupwise judge eval --labels titles` measures how often.
"""

from __future__ import annotations

from groupwise.envs.titles.env import SYSTEM_PROMPT
from groupwise.envs.titles.texts import TEXTS
from groupwise.judge.evaluate import LabelledGroup

GOOD = (
    ("Bread by Bicycle: A Storm-Born Sunrise Delivery", "The Coastal Bakery That Pedals Breakfast to Town"),
    ("Ten Years of Park Birds: Fewer Sparrows, More Crows", "Old Trees Bring Woodpeckers Back to the City Park"),
    ("From Garden Shed to Sunday Tram: A 1950s Rebuild", "Three Winters to Put an Old Tram Back on Track"),
    ("No More Exams: A Project Fair Keeps Students Coming", "Why Attendance Rose When a School Dropped Its Exams"),
    ("The Mountain Night Train Returns After Twelve Years", "Sold Out in a Day: The Night Train Is Back"),
    ("Borrow a Drill: The Library That Lends Tools", "A Carpet Cleaner Tops This Library's Loan List"),
    ("Free Cherries on an Old Railway Line", "Two Hundred Fruit Trees Planted for Anyone to Pick"),
    ("No Friday Afternoon Releases, Half the Weekend Calls", "How One Team Halved Outages by Skipping Friday Deploys"),
    ("The 96-Year-Old Who Beats Teenagers at Chess", "A Chess Club for Over-Seventies Grows to Sixty Players"),
    ("A Village Under the Lake: Church Tower Found Four Metres Down", "Divers Find a Village Drowned by a 1930s Dam"),
    ("Swift Nests Required: How a Town Brought Its Birds Back", "A Building Rule That Filled the Sky With Swifts Again"),
    ("Amateur Astronomer Finds a Comet With a Kit Telescope", "A Home-Built Telescope Spots Next Spring's Comet"),
)
BAD_KINDS = ("generic", "clickbait", "other text", "not a title")


def titles_for(i: int) -> list[tuple[str, bool]]:
    """The 6 titles of text i: (title, is good), the 2 good first, then one bad title per BAD_KINDS."""
    first_sentence = TEXTS[i].split(". ")[0].rstrip(".") + "."
    bad = [
        "An Interesting Story",
        "YOU WON'T BELIEVE WHAT HAPPENED NEXT!!!",
        GOOD[(i + len(GOOD) // 2) % len(GOOD)][0],  # fluent, but about another text
        f"Title: {first_sentence} This title summarizes the text above in one sentence.",
    ]
    return [(t, True) for t in GOOD[i]] + [(t, False) for t in bad]


def labelled_groups(texts: int | None = None) -> list[LabelledGroup]:
    """One labelled group per text (the first `texts` of the 12): good titles 1, bad ones 0."""
    out = []
    for i in range(len(GOOD) if texts is None else min(texts, len(GOOD))):
        titles = titles_for(i)
        lists = [[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": TEXTS[i]},
                  {"role": "assistant", "content": t}] for t, _ in titles]
        out.append(LabelledGroup(lists, [1.0 if ok else 0.0 for _, ok in titles], name=f"text {i}"))
    return out
