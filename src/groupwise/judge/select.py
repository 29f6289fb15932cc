"""Pick the judge to train with, on evidence, before training starts.

A judge that cannot order known-good above known-bad answers turns RL into learning noise, and the
run says nothing about it: rewards still vary, GRPO still has advantages. So several candidates are
evaluated on a labelled set (`evaluate.py`) and the best one whose pairwise accuracy clears chance by a
stated margin AT ITS LOWER BOUND is used; when none does, training does not start and the error
carries the table.

    selection = gw.JudgeSelection([JudgeSpec("local/smollm2-135m"), JudgeSpec("openai/o4-mini")], labelled)
    summary = await gw.fit(model, rollout, train, val_scenarios=val, score_group=selection, ...)

`gw.fit` calls a score_group's `before_training()` before its first validation, so the choice is made
before any step; the selection is then used as the score_group itself (RULER with the chosen judge).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from groupwise.config import DEFAULT_MARGIN, MARGIN_BOUNDS
from groupwise.errors import ConfigError, JudgeSelectionError
from groupwise.core.validated import check_number
from groupwise.judge.evaluate import JudgeReport, JudgeSpec, LabelledGroup, evaluate_judges, format_table

__all__ = ["JudgeSelection", "select_judge"]


def _rank(r: JudgeReport) -> tuple[float, float, float]:
    # Highest accuracy lower bound first; then fewer position flips; then the cheaper judge.
    flip = r.flip_rate[0] if r.flip_rate is not None and not math.isnan(r.flip_rate[0]) else 0.0
    return (-r.accuracy[1], flip, r.cost_per_group_usd)


async def select_judge(
    labelled: Sequence[LabelledGroup],
    judges: Sequence[JudgeSpec | str],
    *,
    margin: float = DEFAULT_MARGIN,
    **evaluate_options: Any,
) -> tuple[JudgeSpec, list[JudgeReport], str]:
    """(the chosen judge, every judge's report, the table). The chosen one has the highest lower bound
    of pairwise accuracy among those whose lower bound exceeds 0.5 + margin; `JudgeSelectionError`
    (with the table) when none does."""
    problems: list[str] = []
    check_number(problems, "margin", margin, **MARGIN_BOUNDS)
    if problems:
        raise ConfigError(problems, what="select_judge")
    specs = [j if isinstance(j, JudgeSpec) else JudgeSpec(str(j)) for j in judges]
    # The choice reads accuracy and flips only: the injection check (one more call per group) is left to
    # `groupwise judge eval` unless asked for.
    evaluate_options.setdefault("injection", None)
    reports = await evaluate_judges(labelled, specs, **evaluate_options)
    table = format_table(reports, margin=margin)
    passing = [(r, s) for r, s in zip(reports, specs) if r.clears(margin)]
    if not passing:
        raise JudgeSelectionError(
            f"no judge orders the labelled set better than chance by the margin: every candidate's pairwise "
            f"accuracy has a lower bound <= {0.5 + margin:.2f} on {reports[0].pairs} labelled pairs, so training "
            f"with it would learn noise. Use a stronger judge (a larger local model, an API judge), sharpen "
            f"the rubric, or add labelled groups to narrow the interval.\n{table}",
            table=table, reports=reports,
        )
    best, spec = min(passing, key=lambda rs: _rank(rs[0]))
    return spec, reports, table


class JudgeSelection:
    """A `score_group` for `gw.fit` that first picks its judge among `candidates` on `labelled`.

    Before training (`before_training`, called by `fit`), the candidates are evaluated and the best one
    that clears the bar becomes the judge; calls then score groups with RULER and that judge. The table
    is printed and kept in `.table`; `.reports` has the figures."""

    def __init__(self, candidates: Sequence[JudgeSpec | str], labelled: Sequence[LabelledGroup], *,
                 margin: float = DEFAULT_MARGIN, swallow_exceptions: bool = True, **evaluate_options: Any) -> None:
        self.candidates = [c if isinstance(c, JudgeSpec) else JudgeSpec(str(c)) for c in candidates]
        self.labelled = list(labelled)
        self.margin = margin
        self.swallow_exceptions = swallow_exceptions
        self.evaluate_options = evaluate_options
        self.chosen: JudgeSpec | None = None
        self.reports: list[JudgeReport] = []
        self.table = ""

    async def before_training(self) -> JudgeSpec:
        if self.chosen is None:
            self.chosen, self.reports, self.table = await select_judge(
                self.labelled, self.candidates, margin=self.margin, **self.evaluate_options)
            print(f"judge selection (pairwise accuracy lower bound must exceed {0.5 + self.margin:.2f}):\n"
                  f"{self.table}\nchosen: {self.chosen.label}", flush=True)
        return self.chosen

    async def __call__(self, group: Any) -> Any:
        from groupwise.judge.ruler import ruler_score_group

        spec = self.chosen or await self.before_training()
        return await ruler_score_group(group, spec.model, rubric=spec.rubric, client=spec.client,
                                       swallow_exceptions=self.swallow_exceptions, **spec.options)
