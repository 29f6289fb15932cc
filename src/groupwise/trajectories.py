"""ART's module path ``art.trajectories`` (``from art.trajectories import TrajectoryGroup``); the
types live in `groupwise.types`. `LegacyHistory` is the name ART's later docs give `History` (an
additional history of a trajectory: a sub-agent, a compacted earlier segment)."""

from groupwise.types import History, MetadataValue, PydanticException, Trajectory, TrajectoryGroup

LegacyHistory = History

__all__ = ["History", "LegacyHistory", "MetadataValue", "PydanticException", "Trajectory", "TrajectoryGroup"]
