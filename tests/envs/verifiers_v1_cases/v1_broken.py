"""A v1 taskset whose reward raises: v1 records the error on the trace (it does not raise), and
gw.envs.from_verifiers must not train on the rollout as if it had scored 0."""

import verifiers.v1 as vf


class BrokenData(vf.TaskData):
    answer: str


class BrokenTask(vf.Task[BrokenData]):
    @vf.reward
    async def needs_a_missing_key(self, trace: vf.Trace) -> float:
        raise KeyError("no 'expected' field on this task")


class BrokenTaskset(vf.Taskset[BrokenTask, vf.TasksetConfig]):
    def load(self) -> list[BrokenTask]:
        return [BrokenTask(BrokenData(idx=i, prompt=f"Say {i}.", answer=str(i)), self.config.task) for i in range(4)]


__all__ = ["BrokenTaskset"]
