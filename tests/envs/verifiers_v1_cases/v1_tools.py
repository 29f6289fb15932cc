"""A multi-turn verifiers v1 taskset with a tool, as v1's glossary example writes one: a task-scoped
`vf.Toolset` whose `@vf.tool` the harness gets over MCP, a stop after two model turns, and rewards read
off the trace's messages."""

from typing import Literal

import json

import verifiers.v1 as vf

Digit = Literal[1, 2, 3, 4]  # the operands of this taskset's sums (a schema the tiny model's sampler can finish)


class AddToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: Digit, b: Digit) -> str:
        """Add two integers."""
        return str(a + b)


class AddTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class AddData(vf.TaskData):
    a: int
    b: int
    answer: str


class AddTask(vf.Task[AddData, vf.State, AddTaskConfig]):
    @classmethod
    def toolsets(cls, config: AddTaskConfig) -> list[vf.Toolset]:
        return [AddToolset(config.tools)]

    @vf.stop
    async def two_turns(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 2

    @vf.reward(weight=1.0)
    async def used_the_result(self, trace: vf.Trace) -> float:
        results = [str(m.content) for m in trace.messages if m.role == "tool"]
        return float(self.data.answer in results)

    @vf.reward(weight=0.5)
    async def right_operands(self, trace: vf.Trace) -> float:
        """The share of the question's operands the first call passed (partial credit, so a group differs)."""
        calls = [c for m in trace.messages if m.role == "assistant" for c in (m.tool_calls or [])]
        if not calls:
            return 0.0
        args = json.loads(calls[0].arguments or "{}")
        return (float(args.get("a") == self.data.a) + float(args.get("b") == self.data.b)) / 2

    @vf.metric
    async def tool_results(self, trace: vf.Trace) -> float:
        return float(sum(1 for m in trace.messages if m.role == "tool"))


class AddConfig(vf.TasksetConfig):
    task: AddTaskConfig = AddTaskConfig()


class AddTaskset(vf.Taskset[AddTask, AddConfig]):
    def load(self) -> list[AddTask]:
        pairs = [(a, b) for a in range(1, 5) for b in range(1, 5)]
        return [AddTask(AddData(idx=i, prompt=f"Use the add tool to compute {a} + {b}.", a=a, b=b,
                                        answer=str(a + b)),
                        self.config.task) for i, (a, b) in enumerate(pairs)]


__all__ = ["AddTaskset"]


if __name__ == "__main__":  # v1 launches a task's toolset as `python -m <its module>`, one server per rollout
    AddToolset.run()
