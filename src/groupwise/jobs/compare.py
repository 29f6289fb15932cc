"""`groupwise compare RUN_DIR`: answers of two steps to the same validation scenarios, side by side."""

from __future__ import annotations

from dataclasses import dataclass

from groupwise.jobs.common import run_dir_field
from groupwise.jobs.fields import Command, Job, arg


@dataclass
class CompareJob(Job):
    run_dir: str = run_dir_field()
    steps: str = arg("0,best", help="two steps, comma separated: numbers, 'best' or 'latest'")
    split: str = arg("val", help="split to compare on")
    n: int = arg(5, help="how many scenarios", low=1)


def run(job: CompareJob) -> int:
    from groupwise.runs.compare import compare

    print(compare(job.run_dir, job.steps, split=job.split, n=job.n))  # a ConfigError is the CLI's one line
    return 0


COMMAND = Command("compare", CompareJob, run,
                  help="show answers of two steps to the same validation scenarios side by side")
