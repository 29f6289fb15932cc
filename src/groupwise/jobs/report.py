"""`groupwise report RUN_DIR`: plot a run's curves, baselines, alerts and stop point; print its table."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from groupwise.jobs.common import run_dir_field
from groupwise.jobs.fields import Command, Job, arg


@dataclass
class ReportJob(Job):
    run_dir: str = run_dir_field()
    out: str | None = arg(None, help="where to write the PNGs (default: <run_dir>/report)")
    wandb: str | None = arg(None, help="also log the history to this W&B project (needs wandb)", metavar="PROJECT")
    tensorboard: str | None = arg(None, help="also write TensorBoard scalars to DIR (needs tensorboard)",
                                  metavar="DIR")


def run(job: ReportJob) -> int:
    from groupwise.errors import StoreError
    from groupwise.runs.report import log_external, plot_run, table
    from groupwise.runs.view import RunView

    try:
        history = RunView(job.run_dir).history
    except StoreError as exc:
        print(f"groupwise report: {exc}", file=sys.stderr)
        return 2
    out = Path(job.out) if job.out else Path(job.run_dir) / "report"
    run_name = Path(job.run_dir).name
    paths = plot_run(history, out, title=f"{Path(job.run_dir).parent.name}/{run_name}")
    print(table(history))
    for p in paths:
        print(f"wrote {p}")
    if job.wandb or job.tensorboard:
        log_external(history, wandb_project=job.wandb, tensorboard_dir=job.tensorboard, run_name=run_name)
    sys.stdout.flush()
    return 0


COMMAND = Command("report", ReportJob, run,
                  help="plot a run's curves, baselines, alerts and stop point; print a table")
