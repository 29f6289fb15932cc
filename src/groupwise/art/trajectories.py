"""ART's module path ``art.trajectories`` (``from art.trajectories import TrajectoryGroup``); the
types live in `groupwise.core.trajectory`. `LegacyHistory` is the name ART's later docs give `History` (an
additional history of a trajectory: a sub-agent, a compacted earlier segment)."""

from typing import Any

from groupwise.core.trajectory import History, Message, MetadataValue, PydanticException, Trajectory, TrajectoryGroup

LegacyHistory = History

__all__ = ["History", "LegacyHistory", "MetadataValue", "PydanticException", "Trajectory", "TrajectoryGroup",
           "get_messages"]


def get_messages(messages_and_choices: list[Any]) -> list[Message]:
    """ART's helper: plain messages, each Choice as its assistant message and content None as ""
    (`Trajectory.messages`'s rule, ART 0.4+'s)."""
    return History(messages_and_choices=messages_and_choices).messages()
