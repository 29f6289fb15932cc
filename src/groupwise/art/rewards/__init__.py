"""ART's path of RULER: ``from art.rewards import ruler_score_group`` ports as
``from groupwise.rewards import ruler_score_group``. The judge lives in `groupwise.judge`."""

from groupwise.judge import DEFAULT_RUBRIC, TrajectoryScore, ruler, ruler_score_group

__all__ = ["DEFAULT_RUBRIC", "TrajectoryScore", "ruler", "ruler_score_group"]
