"""ART's module path ``art.rewards.ruler``; the judge lives in `groupwise.judge`."""

from groupwise.judge import DEFAULT_RUBRIC, TrajectoryScore, ruler, ruler_score_group

__all__ = ["DEFAULT_RUBRIC", "TrajectoryScore", "ruler", "ruler_score_group"]
