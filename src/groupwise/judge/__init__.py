"""RULER, the relative LLM judge: score a group of trajectories against each other in one request.

    judged = await gw.ruler_score_group(group, "openai/o4-mini", debug=True)
    judged = await gw.ruler_score_group(group, "anthropic/claude-sonnet-4-20250514")
    judged = await gw.ruler_score_group(group, "smollm2-135m",                # offline, no key
                                        client=backend.judge_client("smollm2-135m"))

Files: prompt.py (what the judge sees), providers.py (where it runs), parse.py (strict answers),
ruler.py (requests, retries, passes, chunks, mapping by id), reconcile.py (orders, anchors,
alignment, Spearman), evaluate.py (a judge's agreement with labels, position bias, consistency),
select.py (the judge to train with, chosen on a labelled set), cache.py, cost.py, hybrid.py
(verifiable x judge rewards), config.py (`JudgeConfig`). No torch here: the judge only receives an
`openai.AsyncOpenAI` client (a local judge's comes from the backend, `LocalBackend.judge_client`).
"""

from groupwise.judge.cache import JudgeCache
from groupwise.judge.config import JudgeConfig
from groupwise.core.cost import PRICES, Usage, set_price
from groupwise.judge.evaluate import (
    JudgeReport,
    JudgeSpec,
    LabelledGroup,
    evaluate_judges,
    format_table,
    labelled_from_groups,
    load_labelled,
    save_labelled,
)
from groupwise.judge.hybrid import apply_hybrid, gate, weighted
from groupwise.judge.parse import BadAnswer
from groupwise.judge.prompt import DEFAULT_RUBRIC, SYSTEM_PROMPT
from groupwise.judge.select import JudgeSelection, select_judge
from groupwise.judge.ruler import (
    JudgeStats,
    RulerResult,
    TrajectoryScore,
    format_debug,
    judge_stats,
    ruler,
    ruler_detailed,
    ruler_score_group,
)

__all__ = [
    "DEFAULT_RUBRIC",
    "PRICES",
    "SYSTEM_PROMPT",
    "BadAnswer",
    "JudgeCache",
    "JudgeConfig",
    "JudgeReport",
    "JudgeSelection",
    "JudgeSpec",
    "JudgeStats",
    "LabelledGroup",
    "RulerResult",
    "TrajectoryScore",
    "Usage",
    "apply_hybrid",
    "evaluate_judges",
    "format_table",
    "labelled_from_groups",
    "load_labelled",
    "save_labelled",
    "format_debug",
    "gate",
    "judge_stats",
    "ruler",
    "ruler_detailed",
    "ruler_score_group",
    "select_judge",
    "set_price",
    "weighted",
]
