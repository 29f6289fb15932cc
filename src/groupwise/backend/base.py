"""The `Backend` contract: everything `TrainableModel` and the training loop (`gw.fit`) ask of whatever
serves and trains a model. They call these methods and nothing else, so a backend can be swapped
without touching user code or the loop.

Implementations: `LocalBackend` (this machine: one device in process, or several devices data-parallel
with one worker process each) and `RayBackend` (the same workers placed on a Ray cluster). One contract
test suite (tests/backend/) runs against each of them.

What a backend promises:

* `register` loads the model, or resumes it from its latest complete checkpoint (adapter, optimizer,
  RNG, step, and the data cursor saved with it).
* `inference_endpoint` is an OpenAI-compatible API serving ``name`` (the latest step), ``name@k`` for
  recent steps and ``name@0`` (the base model).
* `train` runs one GRPO step, saves a checkpoint holding the caller's data `cursor`, and returns once
  the new adapter is served and verified. A backend that stores the step's trajectories and history
  row itself says so (`stores_steps`); `TrainableModel.train` stores them otherwise.
* `serve_step` serves an earlier step again (the loop evaluates the best checkpoint at the end).
* `keep_best` names the checkpoint that retention must keep besides the latest.
* `checkpoint_cursor` returns the data cursor saved with the latest checkpoint, so a restarted loop
  continues where its data stood.

Optional, with defaults that say what they lack: `train_sft` (a supervised step), `http_endpoint` (a
real HTTP URL for other clients), `delete_checkpoints` (ART's on-request pruning).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from groupwise.core.adapter_names import served_name

if TYPE_CHECKING:
    from groupwise.config import CheckpointRetention
    import httpx

    from groupwise.config import TrainConfig, TrainSFTConfig
    from groupwise.model import TrainableModel
    from groupwise.core.trajectory import Trajectory, TrajectoryGroup

__all__ = ["API", "BEST_CHECKPOINT_METRIC", "PUBLISH_PARTS", "Backend", "InferenceEndpoint", "TrainResult"]

# The history metric that names the best checkpoint when nothing else does (ART's default): retention
# keeps that checkpoint, `delete_checkpoints` spares it. `gw.fit` names the best itself (`keep_best`).
BEST_CHECKPOINT_METRIC = "val/reward"
# the parts of a step's publication a backend may time, reported as ``time/publish_<part>_s`` in its metrics
PUBLISH_PARTS = ("snapshot", "write", "serve", "check")


@dataclass
class InferenceEndpoint:
    """How an `openai.AsyncOpenAI` client reaches a served model."""

    base_url: str
    api_key: str
    # A backend may route requests itself: an httpx client with an ASGI transport (in process, no port)
    # or one that spreads requests over several replicas.
    http_client: "httpx.AsyncClient | None" = None


@dataclass
class TrainResult:
    """What one training step produced."""

    step: int  # the step now served (number of completed steps)
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint_path: str | None = None


LocalTrainResult = TrainResult  # ART 0.5's name for LocalBackend's result


@dataclass
class ServerlessTrainResult:
    """ART's result of `ServerlessBackend.train`, its fields in ART's order (serverless/backend.py: a
    LocalBackend here, so no W&B artifact names the checkpoint: `checkpoint_path` does)."""

    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    artifact_name: str | None = None
    checkpoint_path: str | None = None


class Backend(ABC):
    """Serves and trains `TrainableModel`s. Every method is async (or cheap); none blocks the event loop."""

    # Whether `train` and `train_sft` store the step in the model's run store themselves (its
    # trajectories and its history row: `WorkerBackend` writes them inside the step, so that a
    # checkpoint and its row are one unit). When False, `TrainableModel.train` logs them after the step
    # returns. Either way each step is written once.
    stores_steps: bool = False

    def __new__(cls, *args: Any, **kwargs: Any) -> "Backend":
        if cls is Backend and (args or kwargs):  # ART 0.2-0.4's art.API(base_url) / art.Backend(base_url)
            from groupwise.errors import ArgumentTypeError

            raise ArgumentTypeError(
                "art.Backend(base_url) (ART 0.2's art.API) is ART's client of a remote ART server; groupwise's "
                "backends run in this process: use LocalBackend() (RayBackend for several hosts), and "
                "`groupwise serve` to reach a model over HTTP (docs/porting-from-art.md)")
        return super().__new__(cls)

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
        self,
        model: "TrainableModel",
        trajectory_groups: "list[TrajectoryGroup]",
        config: "TrainConfig",
        *,
        cursor: dict[str, Any] | None = None,
    ) -> TrainResult:
        """One GRPO step on `trajectory_groups`; returns once the new adapter is served and verified.

        `cursor` (JSON-able) is saved with the step's checkpoint and returned by `checkpoint_cursor`
        after a restart: the caller's position in its data after this step. None saves ``{}``."""

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

    async def serve_step(self, model: "TrainableModel", step: int) -> None:
        """Serve ``name@step`` (loading its kept checkpoint if it is no longer served).

        Raises when the checkpoint of `step` no longer exists. This default serves only the base
        (step 0) and the latest step; backends that keep older checkpoints override it."""
        if step != 0 and step != await self.get_step(model):
            raise NotImplementedError(
                f"{type(self).__name__} cannot serve step {step} of {model.name!r} again; it serves only the "
                "latest step. Implement Backend.serve_step to serve kept checkpoints."
            )

    async def keep_best(
        self, model: "TrainableModel", step: int, *, metrics_by_step: dict[int, float] | None = None,
        maximize: bool = True,
    ) -> None:
        """Checkpoint `step` is the best so far (by the caller's metric): retention keeps it besides the
        latest, until another call names another step. `metrics_by_step` and `maximize` say how the
        caller ranked the steps (informational). This default keeps nothing special: a backend that
        never deletes checkpoints needs nothing more."""

    async def set_retention(self, model: "TrainableModel", retention: "CheckpointRetention") -> None:
        """Keep `model`'s checkpoints by `retention` (the newest k and the top k by a metric; the latest, the
        named best and those in use always) from the next step on (a loop sets it as it starts, before it
        holds what it samples from), each prune logged in its history. This default keeps everything: a
        backend that never deletes checkpoints needs nothing more."""

    async def hold_steps(self, model: "TrainableModel", steps: "list[int]") -> None:
        """The caller still samples from these steps (an asynchronous loop's rollouts in flight, and the
        older policies its resume regathers from): retention neither deletes their checkpoints nor stops
        serving them, until the next call names others. This default holds nothing: a backend that
        never deletes checkpoints or unloads steps needs nothing more."""

    async def pin_step(self, model: "TrainableModel", step: int) -> None:
        """Serve ``name@step`` and keep serving it, and keep its checkpoint, until as many `unpin_step`
        calls (`TrainableModel.pinned`: a block of code samples from it). Raises as `serve_step` when the
        checkpoint is gone. This default only serves it: a backend that never deletes checkpoints or
        unloads steps needs nothing more."""
        await self.serve_step(model, step)

    async def unpin_step(self, model: "TrainableModel", step: int) -> None:
        """The end of one `pin_step` of `step`."""

    def lockstep_member(self, model: "TrainableModel") -> Any:
        """The place of `model`'s run in a barrier that runs outside this process share with it (an object
        with ``async arrive()`` and ``async leave()``, as `groupwise.loop.lockstep.Member`), or None. A
        lockstep loop (`LoopConfig.lockstep`) that no sweep of its own process gates arrives there before
        each step's rollouts. This default has none: a backend whose runs share an engine only within one
        process needs nothing more."""
        return None

    async def checkpoint_cursor(self, model: "TrainableModel") -> dict[str, Any]:
        """The `cursor` saved with the latest checkpoint (``{}`` before any, or when none was given)."""
        return {}

    async def close(self) -> None:
        """Release engines, workers, threads and memory."""

    async def delete_checkpoints(self, model: "TrainableModel", best_checkpoint_metric: str = BEST_CHECKPOINT_METRIC) -> None:
        """Delete every checkpoint of `model` but the latest and the best by `best_checkpoint_metric`."""
        raise NotImplementedError(f"{type(self).__name__} does not delete checkpoints on request")

    def __call__(self) -> "Backend":
        # ART's `model.backend()` is a method; groupwise's `model.backend` a property. Calling the
        # backend returns it, so both spellings give the backend.
        return self

    def inference_name(self, model: "TrainableModel", step: int | None = None) -> str:
        """The model name a request uses: ``name`` (latest) or ``name@step``."""
        return served_name(model.name, step)

    def describe(self) -> dict[str, Any]:
        return {"backend": type(self).__name__}


API = Backend  # ART 0.2's name of the base class of backends (``art.API``)
