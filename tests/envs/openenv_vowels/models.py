"""Data models of the vowel environment."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class VowelAction(Action):
    """Action: the text the agent writes."""

    message: str = Field(..., description="The text written")


class VowelObservation(Observation):
    """Observation: the instruction, and how many of the vowel the last text had."""

    instruction: str = Field(default="", description="What to write")
    vowel_count: int = Field(default=0, description="How many times the vowel occurs in the last text")


def vowel_share(text: str, vowel: str) -> float:
    """The reward of one text: the vowel's share of its letters (0 for a text without letters)."""
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c == vowel for c in letters) / len(letters) if letters else 0.0
