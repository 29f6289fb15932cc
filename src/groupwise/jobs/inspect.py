"""`groupwise inspect RUN_DIR`: read stored trajectories like a transcript (`groupwise.runs.transcript` prints them)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from groupwise.jobs.common import run_dir_field
from groupwise.jobs.fields import Command, Job, arg


@dataclass
class InspectJob(Job):
    run_dir: str = run_dir_field()
    split: str | None = arg(None, help="train, val, test, ... (default: all splits)")
    step: int | None = arg(None, help="only this step (default: the latest)", low=0)
    best: bool = arg(False, help="highest rewards first", exclusive="order")
    worst: bool = arg(False, help="lowest rewards first", exclusive="order")
    n: int = arg(3, help="how many trajectories to print", low=1)
    skip_corrupt: bool = arg(False, help="skip lines of a trajectory file that do not parse (each is named in a "
                                         "warning)")

    def rules(self) -> list[str]:
        return ["--best and --worst exclude each other"] if self.best and self.worst else []


def run(job: InspectJob) -> int:
    from groupwise.errors import GroupwiseError
    from groupwise.runs.transcript import inspect_run

    order = "best" if job.best else "worst" if job.worst else "file"
    try:
        return inspect_run(job.run_dir, split=job.split, step=job.step, order=order, n=job.n,
                           skip_corrupt=job.skip_corrupt)
    except BrokenPipeError:  # `groupwise inspect ... | head`
        return 0
    except GroupwiseError as exc:  # a corrupt line: say which file and line, no traceback
        print(f"groupwise inspect: {exc}".replace("Pass skip_corrupt=True", "Pass --skip-corrupt"), file=sys.stderr)
        return 1


COMMAND = Command("inspect", InspectJob, run, help="print stored trajectories readably (watch your rollouts)")
