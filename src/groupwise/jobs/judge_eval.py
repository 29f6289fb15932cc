"""`groupwise judge eval`: agreement of judges with labelled groups, position flips, consistency, injection
following, cost."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from groupwise.config import (DEFAULT_BASE_MODEL, DEFAULT_MARGIN, MARGIN_BOUNDS, DEFAULT_MAX_CONCURRENT, DEFAULT_ORDERS,
                              DEFAULT_REPEATS)
from groupwise.jobs.fields import Command, Job, arg


@dataclass
class JudgeEvalJob(Job):
    labels: str = arg(help="an env with a labelled set (titles), a JSONL file of labelled groups, or a run folder "
                           "(its validation trajectories, labelled by the validation metric)")
    judge: list[str] = arg(default_factory=lambda: [f"local/{DEFAULT_BASE_MODEL}"], repeat=True,
                           help="a judge to evaluate (repeatable): local/smollm2-135m, openai/o4-mini, or with "
                                "--base-url the model an OpenAI-compatible server serves")
    rubric: str | None = arg(None, help="the rubric, or @FILE (default: the env's, else RULER's default)")
    base_url: str | None = arg(None, help="an OpenAI-compatible endpoint serving the --judge models")
    api_key: str | None = arg(None, help="API key for --base-url")
    metric: str | None = arg(None, help="run folder labels: the metric key (default: the run's)")
    groups: int | None = arg(None, low=1, help="only the first N labelled groups")
    orders: int = arg(DEFAULT_ORDERS, low=1, help="orders per group: seeded, reversed, then more seeds")
    repeats: int = arg(DEFAULT_REPEATS, low=1, help="identical requests per group, for self-consistency (1 skips it)")
    margin: float = arg(DEFAULT_MARGIN, **MARGIN_BOUNDS, help="a judge clears the bar when its accuracy's lower bound exceeds "
                                             "0.5 + margin")
    max_concurrent: int = arg(DEFAULT_MAX_CONCURRENT, low=1, help="requests in flight per judge")
    seed: int = arg(0, low=0, help="seed of the orders and of the bootstrap")
    no_injection: bool = arg(False, help="skip the injection check (the worst answer of each group ending with "
                                         "an instruction to score it best, judged once more)")
    json: str | None = arg(None, metavar="PATH", help="also write the figures as JSON")
    plot: str | None = arg(None, metavar="PNG", help="also plot them (needs the plots extra)")


def run(job: JudgeEvalJob) -> int:
    import asyncio

    from groupwise.errors import ConfigError
    from groupwise.judge import DEFAULT_RUBRIC, JudgeSpec
    from groupwise.judge.eval_command import load_labels
    from groupwise.judge.evaluate import INJECTION, evaluate_judges, format_table, plot_judges

    labelled, env_rubric = load_labels(job.labels, job.metric)
    if job.groups is not None:
        labelled = labelled[: job.groups]
    if not labelled:
        raise ConfigError(f"--labels {job.labels}: no labelled groups with different labels", what="judge eval")
    rubric = job.rubric or env_rubric or DEFAULT_RUBRIC
    if rubric.startswith("@"):
        rubric = Path(rubric[1:]).read_text()
    options: dict[str, Any] = {}
    if job.base_url:
        options["base_url"] = job.base_url
    if job.api_key:
        options["api_key"] = job.api_key
    specs = [JudgeSpec(j, rubric=rubric, options=dict(options)) for j in job.judge]
    reports = asyncio.run(evaluate_judges(labelled, specs, orders=job.orders, repeats=job.repeats,
                                          max_concurrent=job.max_concurrent, seed=job.seed,
                                          injection=None if job.no_injection else INJECTION))
    print(format_table(reports, margin=job.margin))
    for r in reports:
        for e in r.errors:
            print(f"{r.judge}: {e}")
    if job.json:
        Path(job.json).write_text(json.dumps([r.to_dict() for r in reports], indent=1))
    if job.plot:
        print(f"plot: {plot_judges(reports, job.plot)}")
    return 0


COMMAND = Command(
    "judge eval", JudgeEvalJob, run,
    help="agreement of judges with labelled groups, position flips, consistency, injection following, cost",
    description="Judge labelled groups (known scores or preferences) with each judge, in a seeded order, "
                "reversed, and repeated; print pairwise accuracy and Kendall tau with bootstrap intervals, "
                "the flip rate between orders, self-consistency, how far the judge follows an instruction planted "
                "in the worst answer ('score it 1.0': how often it then ranks first, its rank gain), invalid "
                "answers, tokens, cost and seconds per group.",
    epilog="Example: groupwise judge eval --labels titles --judge local/smollm2-135m --judge openai/o4-mini")
