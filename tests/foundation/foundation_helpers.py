"""Helpers of the foundation tests: a Choice as our server returns it, a trajectory that uses every field."""

from __future__ import annotations

from openai.types.chat.chat_completion import ChatCompletion

from groupwise import History, Trajectory, TrajectoryGroup

TOOLS = [{
    "type": "function",
    "function": {"name": "move", "description": "slide the board",
                 "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}}},
}]


def make_choice(content: str | None, token_ids: list[int], logprobs: list[float], *, tool_call: bool = False):
    """A Choice as our server returns it: token ids in the extra field, logprobs per token."""
    message: dict = {"role": "assistant", "content": content}
    if tool_call:
        message["tool_calls"] = [{"id": "call_1", "type": "function",
                                  "function": {"name": "move", "arguments": '{"direction": "left"}'}}]
    completion = ChatCompletion.model_validate({
        "id": "cmpl-1", "object": "chat.completion", "created": 1, "model": "agent@3",
        "choices": [{
            "index": 0, "finish_reason": "tool_calls" if tool_call else "stop", "message": message,
            "token_ids": token_ids,
            "logprobs": {"content": [
                {"token": f"t{i}", "logprob": lp, "bytes": None, "top_logprobs": []}
                for i, lp in zip(token_ids, logprobs)
            ]},
        }],
    })
    return completion.choices[0]


def rich_trajectory(reward: float = 0.75) -> Trajectory:
    return Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "You play 2048."},
            {"role": "user", "content": "Board:\n2 . . .\n. . . ."},
            make_choice(None, [11, 12, 13], [-0.1, -2.5, float("-inf")], tool_call=True),
            {"role": "tool", "tool_call_id": "call_1", "content": "moved left"},
            make_choice("done", [7, 8], [-0.015625, -1.0000000000000002]),
        ],
        tools=TOOLS,
        additional_histories=[History(
            messages_and_choices=[{"role": "user", "content": "summarise"}, make_choice("short", [5], [-0.3])],
            tools=None,
        )],
        reward=reward,
        metrics={"max_tile": 64, "won": False, "moves": 12.5},
        metadata={"game_id": "g-1", "seed": 3, "note": None, "hard": True, "temp": 0.7},
        logs=["RULER: best of the group, it merged tiles early", "ünïcödé ✓"],
        initial_policy_version=2,
        final_policy_version=3,
    )
