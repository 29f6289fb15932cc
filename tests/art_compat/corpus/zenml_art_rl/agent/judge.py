# Restated from zenml-io/zenml-projects, art-rl/agent/judge.py (corpus/README.md): a correctness
# judge called through LiteLLM with a structured response.
from litellm import acompletion
from pydantic import BaseModel, Field


class CorrectnessJudgeResponse(BaseModel):
    reasoning: str = Field(description="Explanation of the reasoning process.")
    accept: bool = Field(description="Whether the AI answer should be accepted.")


async def judge_correctness(scenario, answer: str, judge_model: str = "openai/gpt-4.1") -> CorrectnessJudgeResponse:
    resp = await acompletion(model=judge_model, messages=[
        {"role": "system", "content": "Accept the AI answer only if it contains the reference answer."},
        {"role": "user", "content": f"Question: {scenario.question}\nReference: {scenario.answer}\nAI answer: {answer}"}],
        response_format=CorrectnessJudgeResponse)
    return CorrectnessJudgeResponse.model_validate_json(resp.choices[0].message.content or "{}")
