"""The `Backend` interface: what `Model`/`TrainableModel` need from whatever serves and trains them.

`LocalBackend` (backend/local.py) implements it on one machine: one copy of the base weights shared by
the inference engine and the trainer. A cluster backend (Ray + torch.distributed) implements the same
methods later, so user code and the loop do not change.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

    from groupwise.config import TrainConfig, TrainSFTConfig
    from groupwise.model import TrainableModel
    from groupwise.types import Trajectory, TrajectoryGroup


@dataclass
class InferenceEndpoint:
    """How an `openai.AsyncOpenAI` client reaches a served model."""

    base_url: str
    api_key: str
    # In-process backends pass an httpx client with an ASGI transport (no port, same code path as HTTP).
    http_client: "httpx.AsyncClient | None" = None


@dataclass
class TrainResult:
    """What one training step produced."""

    step: int  # the step now served (number of completed steps)
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint_path: str | None = None


LocalTrainResult = TrainResult  # ART 0.5's name for LocalBackend's result


class Backend(ABC):
    """Serves and trains `TrainableModel`s. Every method is async; none may block the event loop."""

    @abstractmethod
    async def register(self, model: "TrainableModel") -> None:
        """Load (or resume) the model: base weights, latest complete checkpoint, served adapters."""

    @abstractmethod
    def inference_endpoint(self, model: "TrainableModel") -> InferenceEndpoint:
        """Where the model's OpenAI-compatible API is served."""

    def http_endpoint(self, model: "TrainableModel") -> InferenceEndpoint | None:
        """Where the model is served over real HTTP, for clients other than `model.openai_client()`
        (None when the backend serves only in process)."""
        return None

    @abstractmethod
    async def train(
        self, model: "TrainableModel", groups: "list[TrajectoryGroup]", config: "TrainConfig"
    ) -> TrainResult:
        """One GRPO step on `groups`; returns once the new adapter is served and verified."""

    async def train_sft(
        self, model: "TrainableModel", trajectories: "list[Trajectory]", config: "TrainSFTConfig"
    ) -> TrainResult:
        """One supervised step on demonstrations (assistant turns are the targets): one optimizer update
        per batch, then like `train`, a checkpoint and the new adapter served and verified."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement train_sft (supervised fine-tuning); "
            "use LocalBackend, or train with GRPO only."
        )

    @abstractmethod
    async def get_step(self, model: "TrainableModel") -> int:
        """Number of completed training steps (0 before any)."""

    async def close(self) -> None:
        """Release engines, threads and memory."""

    async def delete_checkpoints(self, model: "TrainableModel", best_checkpoint_metric: str = "val/reward") -> None:
        """Delete every checkpoint of `model` but the latest and the best by `best_checkpoint_metric`."""
        raise NotImplementedError(f"{type(self).__name__} does not delete checkpoints on request")

    def __call__(self) -> "Backend":
        # ART's `model.backend()` is a method; groupwise's `model.backend` a property. Calling the
        # backend returns it, so both spellings give the backend.
        return self

    def inference_name(self, model: "TrainableModel", step: int | None = None) -> str:
        """The model name a request uses: ``name`` (latest) or ``name@step``."""
        return model.name if step is None else f"{model.name}@{step}"

    def describe(self) -> dict[str, Any]:
        return {"backend": type(self).__name__}
