"""A verifiers 0.4 taskset for the tests (``agent.program=verifiers:<this file>``):
four sums, answered in one chat turn; rewards: exact match (1.0), a reply of at
most 2 characters (0.5), any reply (0.25)."""

import verifiers.v1 as vf

SUMS = [(1, 2), (3, 4), (5, 6), (7, 8)]


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float((trace.last_reply or "").strip() == self.data.answer)

    @vf.reward(weight=0.5)
    async def short(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply or "") <= 2)

    @vf.reward(weight=0.25)
    async def replied(self, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply))


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self) -> list[SumTask]:
        return [
            SumTask(SumData(prompt=f"{a}+{b}=", answer=str(a + b)), self.config.task)
            for a, b in SUMS
        ]


__all__ = ["SumTaskset"]
