# Restated from zenml-io/zenml-projects, art-rl/environment/models.py (corpus/README.md).
from typing import List

from pydantic import BaseModel


class Scenario(BaseModel):
    id: int
    question: str
    answer: str
    message_ids: List[str]
    inbox_address: str
    query_date: str


class EmailScenario(BaseModel):
    step: int
    scenario: Scenario


class FinalAnswer(BaseModel):
    answer: str
    source_ids: List[str]
