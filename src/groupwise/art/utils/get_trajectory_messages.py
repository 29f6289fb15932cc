"""`get_trajectory_messages`: a trajectory's conversation as plain messages, at ART's path
(``art.utils.get_trajectory_messages``). ART's keeps only the text of each assistant turn; this returns
`Trajectory.messages()`, which also keeps the turn's tool calls, so the conversation can be sent on."""

from __future__ import annotations

from groupwise.core.trajectory import Messages, Trajectory


def get_trajectory_messages(trajectory: Trajectory) -> Messages:
    return trajectory.messages()
