"""ART's module path ``art.trajectories`` (``from art.trajectories import TrajectoryGroup``); the
types live in `groupwise.types`."""

from groupwise.types import History, MetadataValue, PydanticException, Trajectory, TrajectoryGroup

__all__ = ["History", "MetadataValue", "PydanticException", "Trajectory", "TrajectoryGroup"]
