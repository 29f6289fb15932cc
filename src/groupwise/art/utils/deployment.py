"""ART's deployment to hosted inference (`art.utils.deployment`: Together, W&B), which groupwise does not do.

ART uploads a checkpoint's LoRA adapter to a provider's service. groupwise talks to no provider, so a
program that imports these names still starts (its training runs), and `deploy_model` / `deploy_wandb`
raise a `GroupwiseError` that says what to do instead: serve the checkpoint yourself (`groupwise serve
--model <base> --adapter <run>/checkpoints/<step>`: an OpenAI-compatible endpoint), or upload that
folder, a PEFT adapter, to the provider with its own tools.
"""

from __future__ import annotations

import inspect
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel

from groupwise.errors import GroupwiseError

__all__ = ["DeploymentConfig", "DeploymentResult", "LoRADeploymentJob", "LoRADeploymentProvider", "Provider",
           "TOGETHER_SUPPORTED_BASE_MODELS", "TogetherDeploymentConfig", "TogetherJobStatus",
           "WANDB_SUPPORTED_BASE_MODELS", "WandbDeploymentConfig", "deploy_model", "deploy_wandb"]

Provider = Literal["together", "wandb"]
TOGETHER_SUPPORTED_BASE_MODELS: list[str] = []  # no provider is reached from here
WANDB_SUPPORTED_BASE_MODELS: list[str] = []


class DeploymentConfig(BaseModel):
    pass


class TogetherDeploymentConfig(DeploymentConfig):
    s3_bucket: str | None = None
    prefix: str | None = None
    wait_for_completion: bool = True


class WandbDeploymentConfig(DeploymentConfig):
    provenance: list[str] = []


class DeploymentResult(BaseModel):
    inference_model_name: str


class LoRADeploymentProvider(str, Enum):
    TOGETHER = "together"
    WANDB = "wandb"


class TogetherJobStatus(str, Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    COMPLETE = "Complete"
    FAILED = "Failed"


class LoRADeploymentJob(BaseModel):
    status: TogetherJobStatus
    job_id: str
    model_name: str
    failure_reason: str | None = None


def _not_provided(what: str, model: Any, step: Any) -> GroupwiseError:
    run = getattr(getattr(model, "store", None), "run_dir", "<run folder>")
    base = getattr(model, "base_model", "<base model>")
    return GroupwiseError(
        f"{what}: groupwise deploys to no hosted provider. Serve the checkpoint yourself with "
        f"`groupwise serve --model {base} --adapter {run}/checkpoints/{step}` (an OpenAI-compatible endpoint), "
        "or upload that folder (a PEFT LoRA adapter) to the provider with its own tools.")


_REQUIRED = inspect.Parameter.empty


async def deploy_model(*args: Any, **kwargs: Any) -> DeploymentResult:
    """ART's ``deploy_model(model, checkpoint_path, step, provider, ...)`` (and 0.3's ``deploy_model(deploy_to,
    model, step, ...)``): raises, saying how to serve or upload the checkpoint (module doc)."""
    model = kwargs.get("model") or next((a for a in args if hasattr(a, "base_model")), None)
    raise _not_provided("deploy_model", model, kwargs.get("step", "<step>"))


# introspection sees ART 0.5's parameters (the newest form); the call takes 0.3's order too
deploy_model.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, **({} if default is _REQUIRED else {"default": default}))
    for name, default in (("model", _REQUIRED), ("checkpoint_path", _REQUIRED), ("step", _REQUIRED),
                          ("provider", _REQUIRED), ("config", None), ("verbose", False))])


def deploy_wandb(model: Any, checkpoint_path: str, step: int, config: Any = None, verbose: bool = False) -> str:
    """ART's W&B artifact upload: raises, saying how to serve or upload the checkpoint (module doc)."""
    raise _not_provided("deploy_wandb", model, step)
