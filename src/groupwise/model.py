"""`Model` (a prompted model behind any OpenAI-compatible endpoint) and `TrainableModel` (one a
`Backend` serves and trains).

    baseline = Model(name="gpt-4o-mini", project="2048",
                     inference_base_url="https://api.openai.com/v1", inference_api_key=key)
    model = TrainableModel(name="agent-001", project="2048", base_model="smollm2-135m")
    await model.register(LocalBackend())
    client = model.openai_client()          # requests use model=model.inference_name()
    result = await model.train(groups, config=TrainConfig(learning_rate=1e-5))
    await model.log(val_groups, split="val")

Both write to the same run store (`groupwise.store`): ``<base_path>/<project>/<name>/``, so a
baseline's validation rows sit beside the trained model's and plots can compare them. Nothing here
imports torch: a backend is handed in by the caller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from groupwise.errors import GroupwiseError
from groupwise.store import RunStore, _trajectories_of, history_row, numeric_metrics
from groupwise.types import Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    import openai

    from groupwise.backend.base import Backend, TrainResult
    from groupwise.config import TrainConfig, TrainSFTConfig

__all__ = ["Model", "TrainableModel"]

log = logging.getLogger(__name__)


class Model:
    """A prompted model: anything behind an OpenAI-compatible endpoint (a baseline, a judge, ...).

    Args:
        name: the run's name; the store folder is ``<base_path>/<project>/<name>``.
        project: groups runs that are compared with each other.
        base_path: root folder of the run store.
        inference_base_url: the endpoint's ``/v1`` URL (None: the `openai` SDK's default / env).
        inference_api_key: its key (None: the SDK reads ``OPENAI_API_KEY``).
        inference_model_name: the model name requests send, when it differs from `name`
            (e.g. name="baseline-4o-mini", inference_model_name="openai/gpt-4o-mini").
    """

    trainable = False

    def __init__(
        self,
        name: str,
        project: str = "default",
        base_path: str = ".groupwise",
        inference_base_url: str | None = None,
        inference_api_key: str | None = None,
        inference_model_name: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name={name!r} must be a non-empty string")
        self.name = name
        self.project = project
        self.base_path = str(base_path)
        self.inference_base_url = inference_base_url
        self.inference_api_key = inference_api_key
        self.inference_model_name = inference_model_name
        self._store: RunStore | None = None
        self._client: openai.AsyncOpenAI | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, project={self.project!r})"

    # -- store --------------------------------------------------------------------------------
    @property
    def store(self) -> RunStore:
        """This model's run store (created on first use, so a name with a slash is fine for a
        model that is only queried, e.g. a judge)."""
        if self._store is None:
            self._store = RunStore(self.base_path, self.project, self.name)
        return self._store

    @property
    def run_dir(self):
        return self.store.run_dir

    # -- inference ------------------------------------------------------------------------------
    def inference_name(self, step: int | None = None) -> str:
        """The model name a chat completion request uses."""
        return self.inference_model_name or self.name

    def get_inference_name(self, step: int | None = None) -> str:
        """ART's name for `inference_name`."""
        return self.inference_name(step)

    def _make_client(self) -> "openai.AsyncOpenAI":
        import openai

        return openai.AsyncOpenAI(base_url=self.inference_base_url, api_key=self.inference_api_key)

    def openai_client(self) -> "openai.AsyncOpenAI":
        """An `openai.AsyncOpenAI` for this model's endpoint, cached per event loop (an httpx pool
        cannot be shared across loops, and each `asyncio.run` or test has its own)."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if self._client is None or (loop is not None and self._client_loop not in (None, loop)):
            self._client = self._make_client()
            self._client_loop = loop
        elif self._client_loop is None:
            self._client_loop = loop
        return self._client

    async def close(self) -> None:
        """Close the cached client's connections."""
        if self._client is not None:
            await self._client.close()
            self._client = None

    # -- steps and logging ----------------------------------------------------------------------
    async def get_step(self) -> int:
        """A prompted model never trains: always step 0."""
        return 0

    async def log(
        self,
        trajectories_or_groups: Iterable[Trajectory | TrajectoryGroup] | TrajectoryGroup | None,
        split: str = "val",
        *,
        metrics: dict[str, Any] | None = None,
        step: int | None = None,
    ) -> dict[str, Any]:
        """Store the trajectories of (split, step) and append their history row; return the row.

        Accepts groups, loose trajectories (stored as one group), or None (metrics only). `step`
        defaults to the model's current step. The row's schema is in `groupwise.store`'s docstring.
        """
        if step is None:
            step = await self.get_step()
        if trajectories_or_groups is None:
            groups: list[TrajectoryGroup] = []
        elif isinstance(trajectories_or_groups, TrajectoryGroup):
            groups = [trajectories_or_groups]
        else:
            groups = _trajectories_of(trajectories_or_groups)
        for n, g in enumerate(groups):
            if g.pending:
                raise GroupwiseError(
                    f"log(): group {n} has {len(g.pending)} rollouts that were never run; gather the groups "
                    "first (await gather_trajectory_groups(...)) and log the result"
                )
        for key, value in (metrics or {}).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"log(): metrics[{key!r}]={value!r} must be a number")
        row = history_row(groups, step=step, split=split, metrics=metrics)
        store = self.store

        def write() -> None:  # file IO off the event loop: rollouts keep running meanwhile
            if groups:
                store.write_trajectories(split, step, groups)
            store.append_history(row)

        await asyncio.to_thread(write)
        return row


class TrainableModel(Model):
    """A model a `Backend` serves and trains (GRPO on a LoRA adapter over `base_model`).

    Args (beyond `Model`'s):
        base_model: a Hugging Face id or local path, or a short name of a packaged model
            ("smollm2-135m"); the backend resolves it.
        config: backend-specific settings (e.g. LoRA rank), passed through untouched.
    """

    trainable = True

    def __init__(
        self,
        name: str,
        project: str = "default",
        base_model: str = "smollm2-135m",
        base_path: str = ".groupwise",
        *,
        config: Any = None,
    ) -> None:
        super().__init__(name=name, project=project, base_path=base_path)
        self.store  # fail now, not after minutes of training, when the name cannot be a folder
        self.base_model = base_model
        self.config = config
        self._backend: Backend | None = None

    def __repr__(self) -> str:
        return f"TrainableModel(name={self.name!r}, project={self.project!r}, base_model={self.base_model!r})"

    @property
    def backend(self) -> "Backend":
        if self._backend is None:
            raise GroupwiseError(
                f"model {self.name!r} is not registered with a backend; call `await model.register(backend)` "
                "first (e.g. groupwise.LocalBackend())"
            )
        return self._backend

    async def register(self, backend: "Backend") -> None:
        """Attach to `backend` and let it load (or resume) the model."""
        from groupwise.backend.base import Backend

        if not isinstance(backend, Backend):
            raise TypeError(f"register() takes a groupwise Backend, got {type(backend).__name__}")
        await backend.register(self)
        self._backend = backend
        self._client = None  # a new endpoint

    def _make_client(self) -> "openai.AsyncOpenAI":
        import openai

        endpoint = self.backend.inference_endpoint(self)
        return openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key,
                                  http_client=endpoint.http_client)

    def inference_name(self, step: int | None = None) -> str:
        """``name`` (the latest step) or ``name@step``: the model a request asks for."""
        if self._backend is None:
            return self.name if step is None else f"{self.name}@{step}"
        return self._backend.inference_name(self, step)

    async def get_step(self) -> int:
        """Number of completed training steps (0 before any)."""
        return await self.backend.get_step(self)

    async def train(self, groups: Iterable[TrajectoryGroup], config: "TrainConfig | None" = None) -> "TrainResult":
        """One training step on `groups`, then log them as the train split of the step that
        sampled them, with the trainer's metrics. Returns the backend's `TrainResult`."""
        from groupwise.config import TrainConfig

        groups = list(groups)
        for n, g in enumerate(groups):
            if not isinstance(g, TrajectoryGroup):
                raise TypeError(f"train(): groups[{n}] is {type(g).__name__}; expected a TrajectoryGroup")
            if g.pending:
                raise GroupwiseError(f"train(): group {n} has rollouts that were never run; gather the groups first")
        config = config if config is not None else TrainConfig()
        step_before = await self.get_step()
        result = await self.backend.train(self, groups, config)
        await self.log(groups, split="train", step=step_before, metrics=_train_metrics(result.metrics))
        return result

    async def train_sft(
        self,
        trajectories: Iterable[Trajectory],
        config: "TrainSFTConfig | None" = None,
        _config: Any = None,
        verbose: bool = False,
    ) -> "TrainResult":
        """Supervised fine-tuning on demonstrations (ART's name and arguments): one step of the run.

        The assistant turns of `trajectories` are the targets (sampled token ids where a turn is a
        Choice that has them, else the chat template's rendering); one optimizer update per batch of
        `config.batch_size`. Like `train`, the step ends with a checkpoint and the new adapter served
        (``name@<step>``), so GRPO (`train`, `gw.fit`) continues from it. The step's metrics are
        logged as an ``sft`` history row of the step it started from; the demonstrations are stored
        as that step's ``sft`` trajectories. `_config` (ART's experimental options) is accepted and unused.
        """
        from groupwise.config import TrainSFTConfig

        trajectories = list(trajectories)
        for n, t in enumerate(trajectories):
            if not isinstance(t, Trajectory):
                raise TypeError(f"train_sft(): trajectories[{n}] is {type(t).__name__}; expected a Trajectory")
        config = config if config is not None else TrainSFTConfig()
        step_before = await self.get_step()
        result = await self.backend.train_sft(self, trajectories, config)
        await self.log(None, split="sft", step=step_before, metrics=_train_metrics(result.metrics))
        if verbose:
            print(f"[sft] step {step_before} -> {result.step}: loss {result.metrics.get('loss', float('nan')):.4f} "
                  f"over {int(result.metrics.get('trainable_tokens', 0))} target tokens, "
                  f"{int(result.metrics.get('updates', 0))} update(s)")
        return result


def _train_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The trainer's numeric metrics for the history row; a name that clashes with the row's own
    fields (e.g. "reward") gets a ``train_`` prefix rather than failing after the step was taken."""
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            log.warning("train metric %r=%r is not a number; left out of the history row", key, value)
    return numeric_metrics(metrics)
