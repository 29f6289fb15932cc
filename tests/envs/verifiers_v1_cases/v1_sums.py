"""A single-turn verifiers v1 taskset, written as v1's examples (reverse_text) write one: task data with the
answer, a stop after the first reply, a weighted reward and a metric. Its module id is what v1 loads
(`vf.TasksetConfig(id="v1_sums")`, `groupwise train verifiers:v1_sums`)."""

import verifiers.v1 as vf

SYSTEM = "Answer with the number only."


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float((trace.last_reply or "").strip() == self.data.answer)

    @vf.reward(weight=0.5)
    async def brevity(self, trace: vf.Trace) -> float:
        return 1.0 / (1.0 + len((trace.last_reply or "").split()))

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply or ""))


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self) -> list[SumTask]:
        pairs = [(a, b) for a in range(1, 5) for b in range(1, 5)]
        return [SumTask(SumData(idx=i, prompt=f"What is {a} + {b}?", system_prompt=SYSTEM, answer=str(a + b)),
                        self.config.task) for i, (a, b) in enumerate(pairs)]


__all__ = ["SumTaskset"]
