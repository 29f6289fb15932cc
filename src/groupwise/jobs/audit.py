"""`groupwise audit <env>`: can answers without content score as well as honest ones? Checked before training.

Runs `groupwise.loop.audit.audit_reward` on an env's training scenarios: probe answers (empty, the prompt
echoed, the task's words stuffed, maximal length, empty tags, one fixed answer, flattery aimed at a judge)
through the env's real rollout and reward (and its judge for judged envs), against honest answers: the
env's scripted demonstrator replayed through the rollout where it has one, else the base model's own
samples (loaded in process). Prints one row per probe with its mean reward and interval; exit code 1 when
a probe is flagged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from groupwise.jobs.common import device_field, model_field
from groupwise.jobs.fields import Command, Job, arg


def _env_problem(value: Any) -> str | None:
    from groupwise.envs import ENVS

    return None if value in ENVS else f"no environment {value!r}; the built-in ones are {', '.join(sorted(ENVS))}"


def _probes_problem(value: Any) -> str | None:
    from groupwise.loop.audit import PROBES

    return None if value in PROBES else f"no probe {value!r}; the probes are {', '.join(PROBES)}"


@dataclass
class AuditJob(Job):
    env: str = arg(help="the environment whose reward to audit", positional=True, check=_env_problem)
    honest: Literal["auto", "model", "reference"] = arg(
        "auto", help="honest answers: the base model's samples (model), the env's scripted demonstrator "
                     "replayed through the rollout (reference), or auto: the reference where the env has one")
    model: str = model_field("base model whose samples are the honest answers (and the default judge)")
    judge: str | None = arg(None, help="judged envs (titles, email): the RULER judge, e.g. openai/o4-mini "
                                       "(default: local/<--model>)")
    scenarios: int = arg(16, low=2, help="training scenarios audited (probes cost no model time)")
    samples: int = arg(2, low=1, help="honest samples per scenario from the model")
    probe: list[str] | None = arg(None, check=_probes_problem, help="only these probes (comma-separated; "
                                                                      "default: all)")
    seed: int = arg(0, low=0, help="seed of the env's scenario split")
    device: str | None = device_field()
    json: str | None = arg(None, metavar="PATH", help="also write the audit as JSON")


class _LocalModel:
    """The base model served in process, as a rollout sees a model (`name`, `openai_client()`)."""

    def __init__(self, name: str, client: Any):
        self.name, self._client = name, client

    def openai_client(self) -> Any:
        return self._client


def _score_group(spec: Any, judge: str, local: _LocalModel | None) -> Any:
    from groupwise.judge import ruler_score_group

    kwargs: dict[str, Any] = {"rubric": spec.rubric} if spec.rubric else {}
    name = judge
    if local is not None and judge == f"local/{local.name}":  # the honest model's own engine judges
        name, kwargs["client"] = local.name, local.openai_client()

    async def score_group(group: Any) -> Any:
        return await ruler_score_group(group, name, **kwargs)

    return score_group


def run(job: AuditJob) -> int:
    import asyncio

    from groupwise.envs import ENVS, get_env
    from groupwise.loop.audit import PROBES, audit_reward

    spec = get_env(job.env)
    train, _, _ = spec.scenarios(job.seed)
    use_model = job.honest == "model" or (job.honest == "auto" and spec.demonstrate is None)
    if job.honest == "reference" and spec.demonstrate is None:
        from groupwise.errors import ConfigError

        with_demo = ", ".join(sorted(n for n, e in ENVS.items() if e.demonstrate is not None))
        raise ConfigError(f"--honest reference: {spec.name} has no scripted demonstrator (these do: {with_demo}); "
                          "use --honest model", what="audit")
    judged = spec.reward != "verifiable"
    judge = job.judge or (f"local/{job.model}" if judged else None)
    local: _LocalModel | None = None
    engine = None
    if use_model or (judge or "").startswith("local/"):
        from groupwise.backend.judges import build_local_judge

        name = job.model if use_model or judge == f"local/{job.model}" else judge.removeprefix("local/")
        engine, client = build_local_judge(name, device=job.device)
        local = _LocalModel(name, client)
    try:
        report = asyncio.run(audit_reward(
            spec.rollout, train, honest=local if use_model else spec.demonstrate,
            validate=spec.validate if spec.val_metric else None,
            score_group=_score_group(spec, judge, local) if judge else None,
            probes=job.probe or PROBES, samples=job.samples, max_scenarios=job.scenarios))
    finally:
        if engine is not None:
            engine.close()
    print(f"[groupwise audit] env={spec.name} reward={spec.reward}" + (f" judge={judge}" if judge else ""))
    print(report)
    if job.json:
        Path(job.json).write_text(json.dumps(report.to_dict(), indent=1))
    return 1 if report.flagged else 0


COMMAND = Command(
    "audit", AuditJob, run,
    help="check a reward before training: do answers without content score as well as honest ones?",
    description="Send probe answers (empty, whitespace, the prompt echoed, the task's words stuffed, maximal "
                "length, empty tags, one fixed answer for every input, flattery aimed at a judge) through the "
                "env's real rollout and reward, next to honest answers, and flag the probes whose mean reward "
                "is at or above the honest mean while the validation metric says they are worse. Exit code 1 "
                "when a probe is flagged.",
    epilog="Example: groupwise audit tictactoe; groupwise audit math --honest model --scenarios 8")
