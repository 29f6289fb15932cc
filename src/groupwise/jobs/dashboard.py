"""`groupwise dashboard [PATH]`: a local web page watching runs (groupwise.dashboard.app serves it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from groupwise.config import DEFAULT_RUN_STORE
from groupwise.jobs.common import allowed_host_field, api_key_field, host_field, loopback_problem, port_field
from groupwise.jobs.fields import Command, Job, arg


def _folder_problem(path: str) -> str | None:
    if Path(path).exists() and not Path(path).is_dir():
        return "is a file; pass a run store folder (e.g. .groupwise), a project or a run folder " \
               "<base_path>/<project>/models/<model>"
    return None


@dataclass
class DashboardJob(Job):
    path: str = arg(DEFAULT_RUN_STORE, positional=True, on_machine=_folder_problem,
                    help="a run store folder, a project or one run folder")
    host: str = host_field()
    port: int = port_field(8100)
    api_key: str | None = api_key_field()
    allowed_host: list[str] = allowed_host_field()

    def rules(self) -> list[str]:
        problem = loopback_problem(self.host, self.api_key, exposes="read your runs")
        return [problem] if problem else []


def run(job: DashboardJob) -> int:
    from groupwise.dashboard.app import serve_dashboard

    serve_dashboard(job.path, host=job.host, port=job.port, api_key=job.api_key, allowed_hosts=job.allowed_host)
    return 0


COMMAND = Command("dashboard", DashboardJob, run,
                  help="a local web page watching runs: curves, alerts, rollouts, tokens (live)")
