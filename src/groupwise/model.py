"""`Model` (a prompted model behind any OpenAI-compatible endpoint) and `TrainableModel` (one a
`Backend` serves and trains).

    baseline = Model(name="gpt-4o-mini", project="2048",
                     inference_base_url="https://api.openai.com/v1", inference_api_key=key)
    model = TrainableModel(name="agent-001", project="2048", base_model="smollm2-135m")
    await model.register(LocalBackend())
    client = model.openai_client()          # requests use model=model.inference_name()
    result = await model.train(groups, config=TrainConfig(learning_rate=1e-5))
    await model.log(val_groups, split="val")

Both write to the same run store (`groupwise.runs.store`): ``<base_path>/<project>/models/<name>/``, so a
baseline's validation rows sit beside the trained model's and plots can compare them. Nothing here
imports torch: a backend is handed in by the caller.

Both are pydantic models generic in their config, as ART's, because ported code relies on it
(``Model[MyConfig]``, ``model_copy``, ``model_dump``). ART's constructor arguments are accepted
(docs/porting-from-art.md): `run_name` names the run's folder (`name` stays the served name),
`lora_config` and `_internal_config`'s ``peft_args`` set the adapter, its ``trainer_args`` (and the
other settings in `groupwise.core.compat.INTERNAL_TRAIN_FIELDS`) are the model's `TrainConfig` values, and
the arguments of ART's own machinery (W&B entity, Unsloth and vLLM settings) are named once in an
`ArtCompatWarning`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import reprlib
import warnings
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any, Generic

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, field_validator
from typing_extensions import TypeVar

from groupwise.runs import wandb_log
from groupwise.core.adapter_names import served_name
from groupwise.backend.base import BEST_CHECKPOINT_METRIC
from groupwise.core.choices import COMPACT_TOKEN_DATA
from groupwise.core.compat import (init_signature_from_fields, internal_config_settings, merge_lora, resolve_train_config,
                              warn_ignored)
from groupwise.config import DEFAULT_BASE_MODEL, DEFAULT_PROJECT, DEFAULT_RUN_STORE
from groupwise.errors import (ArgumentTypeError, ConfigError, CorruptRecordError, GroupwiseError, GroupwiseWarning,
                              NotRegisteredError)
from groupwise.runs.store import RunStore, as_groups, history_row, metrics_row, train_metrics
from groupwise.core.trajectory import Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    import openai

    from groupwise.backend.base import Backend, TrainResult
    from groupwise.config import LoraConfig, TrainConfig, TrainSFTConfig
    from groupwise.core.metrics import MetricsBuilder

__all__ = ["Model", "TrainableModel"]

# As ART's: `Model[MyConfig]` validates `config` as MyConfig (a dict becomes one). Unparameterized, any
# value is kept as given. StateType is ART 0.5's second parameter (the type of its run state dict).
ModelConfig = TypeVar("ModelConfig", default=Any)
StateType = TypeVar("StateType", bound=dict[str, Any], default=dict[str, Any])

_client_class: type | None = None
# (project, name) -> the step a block of code is pinned to (`TrainableModel.pinned`). A context variable,
# so that tasks started in the block sample from it too and concurrent blocks of one model do not mix.
_PINNED: contextvars.ContextVar[dict[tuple[str, str], int]] = contextvars.ContextVar("groupwise_pinned", default={})


def _openai_client_class() -> type:
    """`openai.AsyncOpenAI`, awaitable: ART 0.1.1-0.1.22's `openai_client()` was a coroutine
    (``client = await model.openai_client()``); awaiting this client gives the client itself. Its
    requests are progress for the hang watch of the rollout that makes them."""
    global _client_class
    if _client_class is None:
        import openai

        from groupwise.rollout.hangs import note_answer, note_request

        class AsyncOpenAI(openai.AsyncOpenAI):
            def __await__(self):  # type: ignore[no-untyped-def]
                return _itself(self).__await__()

            async def request(self, cast_to, options, **kwargs):  # type: ignore[no-untyped-def]
                # Every call of the SDK passes here, in the caller's task: the rollout's hang watch
                # (groupwise.rollout.hangs) learns of each request and answer, and which it waits on.
                body = options.json_data if isinstance(options.json_data, dict) else {}
                model = f" model={body['model']}" if isinstance(body.get("model"), str) else ""
                note_request(f"{options.method.upper()} {options.url}{model}")
                try:
                    return await super().request(cast_to, options, **kwargs)
                finally:
                    note_answer()

        _client_class = AsyncOpenAI
    return _client_class


async def _itself(client: Any) -> Any:
    return client


# Private state that belongs to this process, not to the model's description: a copy shares the
# backend registration, and opens its own store handle and client (an httpx pool cannot be copied).
_RUNTIME = ("_backend", "_store", "_client", "_client_loop", "_metrics")
# where the metrics builder's running totals live in the run's state (Model.read_state), as ART's
METRICS_STATE_KEY = "_metrics_builder_state"


def _one_backend(backend: Any, api: Any) -> Any:
    if (backend is None) == (api is None):
        raise ArgumentTypeError("register() takes one backend: `await model.register(backend)`"
                                + (" (api= is ART 0.1's name of the same argument)" if api is not None else ""))
    return backend if backend is not None else api


@init_signature_from_fields
class Model(BaseModel, Generic[ModelConfig, StateType]):
    """A prompted model: anything behind an OpenAI-compatible endpoint (a baseline, a judge, ...).

    A pydantic model generic in its config, as ART's (``Model[MyConfig]``, ``model_copy``,
    ``model_dump``, validated fields); what the process holds for it (backend, client, store handle)
    is private state. Unknown arguments are an error that names them.

    Args:
        name: the run's name; the store folder is ``<base_path>/<project>/models/<name>``.
        project: groups runs that are compared with each other.
        base_path: root folder of the run store.
        inference_base_url: the endpoint's ``/v1`` URL (None: the `openai` SDK's default / env).
        inference_api_key: its key (None: the SDK reads ``OPENAI_API_KEY``).
        inference_model_name: the model name requests send, when it differs from `name`
            (e.g. name="baseline-4o-mini", inference_model_name="openai/gpt-4o-mini").
        config: your own settings for this model (kept as given, or validated as ``Model[Cfg]``'s Cfg).
        entity, report_metrics: ART's W&B settings: each history row goes to the W&B run of this model
            when W&B is configured (`groupwise.runs.wandb_log`: WANDB_API_KEY, WANDB_MODE=offline or
            ``report_metrics=["wandb"]``); `update_wandb_config` adds to that run's config.
        id, run_id: the ids ART's hosted (serverless) backend gives a model; kept, unused here.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    name: str
    project: str = DEFAULT_PROJECT
    entity: str | None = None
    id: str | None = None
    run_id: str | None = None
    config: ModelConfig | None = None
    trainable: bool = False  # ART's discriminator between the two kinds
    inference_api_key: str | None = None
    inference_base_url: str | None = None
    inference_model_name: str | None = None
    base_path: str = DEFAULT_RUN_STORE
    report_metrics: list[str] | None = None

    _backend: Any = PrivateAttr(default=None)
    _store: Any = PrivateAttr(default=None)  # (store key, RunStore): reopened when the key changes
    _client: Any = PrivateAttr(default=None)
    _client_loop: Any = PrivateAttr(default=None)
    _logged: set = PrivateAttr(default_factory=set)  # (step, split) this object logged trajectories for
    _metrics: Any = PrivateAttr(default=None)  # the run's MetricsBuilder (groupwise.core.metrics), made on first use
    _cost_calculator: Any = PrivateAttr(default=None)  # set_cost_calculator's
    _wandb_config: dict = PrivateAttr(default_factory=dict)  # update_wandb_config's, until the W&B run starts

    def __init__(self, name: str, project: str = DEFAULT_PROJECT, base_path: str = DEFAULT_RUN_STORE,
                 inference_base_url: str | None = None, inference_api_key: str | None = None,
                 inference_model_name: str | None = None, *, base_url: str | None = None,
                 api_key: str | None = None, **fields: Any) -> None:
        # base_url= and api_key=: ART 0.1's names of the endpoint's fields
        clashes = [f"{old}={given!r} and {new}={current!r} name the same setting; pass one"
                   for old, given, new, current in (("base_url", base_url, "inference_base_url", inference_base_url),
                                                    ("api_key", api_key, "inference_api_key", inference_api_key))
                   if given is not None and current is not None and given != current]
        if clashes:
            raise ConfigError(clashes, what=f"{type(self).__name__} arguments")
        inference_base_url = inference_base_url if inference_base_url is not None else base_url
        inference_api_key = inference_api_key if inference_api_key is not None else api_key
        try:
            super().__init__(name=name, project=project, base_path=base_path, inference_base_url=inference_base_url,
                             inference_api_key=inference_api_key, inference_model_name=inference_model_name, **fields)
        except ValidationError as err:
            raise ConfigError([f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']} (got {e.get('input')!r})"
                               for e in err.errors()], what=f"{type(self).__name__} arguments") from None

    @field_validator("name")
    @classmethod
    def _name_not_empty(cls, name: str) -> str:
        if not name:
            raise ValueError("must be a non-empty string")
        return name

    @field_validator("base_path", mode="before")
    @classmethod
    def _path_as_str(cls, path: Any) -> Any:
        return str(path) if hasattr(path, "__fspath__") else path

    def model_post_init(self, context: Any) -> None:
        given = [k for k in ("id", "run_id") if getattr(self, k) is not None]
        if given:
            warn_ignored(f"{type(self).__name__}()", given, "the ids ART's hosted (serverless) backend gives a "
                         "model; groupwise's backends name a run by its name (the W&B run id too, as ART's)")

    def __copy__(self) -> "Model":
        new = super().__copy__()
        new._share_runtime(self)
        return new

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> "Model":
        """Fields and settings are copied deeply; the copy shares the registration (`_RUNTIME`)."""
        cls = type(self)
        new = cls.__new__(cls)
        object.__setattr__(new, "__dict__", copy.deepcopy(self.__dict__, memo))
        object.__setattr__(new, "__pydantic_extra__", copy.deepcopy(self.__pydantic_extra__, memo))
        object.__setattr__(new, "__pydantic_fields_set__", set(self.__pydantic_fields_set__))
        private = {k: v for k, v in (self.__pydantic_private__ or {}).items() if k not in _RUNTIME}
        object.__setattr__(new, "__pydantic_private__", copy.deepcopy(private, memo))
        new._share_runtime(self)
        return new

    def safe_model_dump(self, **kwargs: Any) -> dict[str, Any]:
        """ART's: `model_dump` without `config` (your settings may not serialize)."""
        return {**self.model_dump(**kwargs), "config": None}

    def _share_runtime(self, original: "Model") -> None:
        self._backend, self._store, self._client, self._client_loop = original._backend, None, None, None
        self._metrics = original._metrics  # one run, one set of metric totals

    @property
    def storage_name(self) -> str:
        """The run's folder name under ``<base_path>/<project>/models/`` (`name`; a TrainableModel's `run_name`)."""
        return self.name

    def __repr__(self) -> str:  # not pydantic's: that would print inference_api_key
        return f"{type(self).__name__}(name={self.name!r}, project={self.project!r})"

    def __str__(self) -> str:
        return repr(self)

    # -- store --------------------------------------------------------------------------------
    @property
    def store(self) -> RunStore:
        """This model's run store, ``<base_path>/<project>/models/<storage_name>`` (opened on first use, so a
        name with a slash is fine for a model that is only queried, e.g. a judge). Changing
        `base_path` (a backend does, for a default-configured model) moves it: the next use reopens."""
        key = (str(self.base_path), self.project, self.storage_name)
        if self._store is None or self._store[0] != key:
            self._store = (key, RunStore(*key))
        return self._store[1]

    @property
    def run_dir(self):
        return self.store.run_dir

    def _get_output_dir(self) -> str:
        """ART 0.5's name for the run folder (ART's pipeline trainer and programs build paths on it)."""
        return str(self.run_dir)

    # ART 0.1's names of the endpoint's fields, read and written through
    @property
    def base_url(self) -> str | None:
        return self.inference_base_url

    @base_url.setter
    def base_url(self, value: str | None) -> None:
        self.inference_base_url = value

    @property
    def api_key(self) -> str | None:
        return self.inference_api_key

    @api_key.setter
    def api_key(self, value: str | None) -> None:
        self.inference_api_key = value

    # -- backend --------------------------------------------------------------------------------
    @property
    def api(self) -> "Backend":
        """ART 0.1-0.2's name of `backend` (``model.api()`` works: a backend called returns itself)."""
        return self.backend

    @property
    def backend(self) -> "Backend":
        """The backend this model is registered with. `model.backend()` (ART's method) works too:
        a `Backend` called with no arguments returns itself."""
        if self._backend is None:
            raise NotRegisteredError(
                f"model {self.name!r} is not registered with a backend; call `await model.register(backend)` "
                "first (e.g. groupwise.LocalBackend())"
            )
        return self._backend

    async def register(self, backend: "Backend | None" = None, *, api: "Backend | None" = None) -> None:
        """Attach a prompted model to `backend` (as ART does for comparison models): its logs go to the
        backend's run store, beside the trained models'. Its endpoint stays its own. (`api`: ART
        0.1-0.2's name of the argument.)"""
        from groupwise.backend.base import Backend

        backend = _one_backend(backend, api)
        if not isinstance(backend, Backend):
            raise ArgumentTypeError(f"register() takes a groupwise Backend, got {type(backend).__name__}")
        path = getattr(backend, "path", None)
        if path is not None and self.base_path == DEFAULT_RUN_STORE:
            self.base_path = str(path)
        self._backend = backend
        wandb_log.reporter_for(self)

    # -- inference ------------------------------------------------------------------------------
    def inference_name(self, step: int | None = None) -> str:
        """The model name a chat completion request uses."""
        return self.inference_model_name or self.name

    def litellm_completion_params(self, step: int | None = None) -> dict[str, Any]:
        """ART's keyword arguments for `litellm.completion`: this model over its OpenAI-compatible
        HTTP endpoint (a TrainableModel's is the backend's loopback server)."""
        prefix = "hosted_vllm/" if self.trainable else ""
        return {"model": prefix + self.inference_name(step), "base_url": self.inference_base_url,
                "api_key": self.inference_api_key, "temperature": 1}

    def get_inference_name(self, step: int | None = None) -> str:
        """ART's name for `inference_name`."""
        return self.inference_name(step)

    @property
    def cost_calculator(self) -> Any:
        """ART's per-request cost hook, ``(prompt_tokens, completion_tokens, context) -> metrics``: the one
        `set_cost_calculator` gave, else none (groupwise prices no GPU or API time; a judge's cost is in
        the `judge/*` metrics)."""
        if self._cost_calculator is not None:
            return self._cost_calculator
        return lambda prompt_tokens, completion_tokens, context: {}

    def set_cost_calculator(self, calculator: Any) -> None:
        """ART's: set (None: unset) the hook `cost_calculator` returns, for a program's own cost accounting."""
        self._cost_calculator = calculator

    def _make_client(self) -> "openai.AsyncOpenAI":
        return _openai_client_class()(base_url=self.inference_base_url, api_key=self.inference_api_key)

    def openai_client(self, _config: Any = None) -> "openai.AsyncOpenAI":
        """An `openai.AsyncOpenAI` for this model's endpoint, cached per event loop (an httpx pool
        cannot be shared across loops, and each `asyncio.run` or test has its own). ART 0.1.1-0.1.22
        awaited it (``await model.openai_client()``), which gives the same client; their `_config`
        (vLLM server settings) is named in a warning."""
        if _config is not None:
            warn_ignored("Model.openai_client", ["_config"], "vLLM server settings of ART's backend")
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
        """Close the cached client's connections and finish this run's W&B run (if one was started)."""
        if self._client is not None:
            await self._client.close()
            self._client = None
        wandb_log.finish(self)

    # -- W&B (groupwise.runs.wandb_log: when, which run, what is logged) ----------------------------------
    def update_wandb_config(self, config: dict[str, Any]) -> None:
        """Merge `config` into this model's W&B run config (ART's): kept until the run starts, sent at
        once to a live one. A key already set to another value is a `ConfigError` (ART: immutable).
        Without W&B configured it is kept, and it is said once where the metrics are."""
        if not isinstance(config, dict):
            raise ArgumentTypeError(f"update_wandb_config() takes a dict, got {type(config).__name__}")
        self._wandb_config = wandb_log.merge_config(self._wandb_config, config)
        reporter = wandb_log.reporter_for(self)
        if reporter is not None:
            reporter.update_config(config)
        elif not wandb_log.wandb_wanted(self.report_metrics):
            wandb_log.say_once(f"no-wandb-config:{self.store.run_dir}", (
                "update_wandb_config(): W&B is not configured (set WANDB_API_KEY, or WANDB_MODE=offline, or pass "
                "report_metrics=['wandb']), so no W&B run is made; this run's metrics are in "
                f"{self.store.run_history.path}"))

    def wandb_config_so_far(self) -> dict[str, Any]:
        """What `update_wandb_config` merged so far (the config the W&B run starts with)."""
        return copy.deepcopy(self._wandb_config)

    # -- run state (ART 0.5's names; the run's state.json, `store.read_state()`) ---------------------
    def read_state(self) -> dict[str, Any] | None:
        """The run's persistent state (state.json), or None before the first write (as ART's)."""
        return self.store.read_state() or None

    def merge_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Deep-merge `state` into the persistent state and write it; returns the merged state. Prefer
        it to `overwrite_state`: `gw.fit` keeps its data cursor in the same file."""
        merged = _deep_merge(self.store.read_state(), state)
        self.store.write_state(merged)
        return merged

    def overwrite_state(self, state: dict[str, Any]) -> None:
        """Replace the persistent state with `state`."""
        self.store.write_state(dict(state))

    write_state = overwrite_state  # ART's older name

    # -- steps and logging ----------------------------------------------------------------------
    def metrics_builder(self, cost_context: str | None = None) -> "MetricsBuilder":
        """ART 0.5's step-metrics builder of this run (`groupwise.core.metrics`): the ``train`` one, or that of
        `cost_context` (``eval`` for val and test); `log` writes what it holds into its split's next row."""
        from groupwise.core.metrics import MetricsBuilder

        if self._metrics is None:
            self._metrics = MetricsBuilder("train")
            saved = (self.read_state() or {}).get(METRICS_STATE_KEY)
            if saved is not None:
                from groupwise.core.readers import JSONProblem, MetricsState, validate

                try:  # running totals: finite numbers (a hand-edited "abc" or NaN would poison every later row)
                    validate(MetricsState, saved)
                except JSONProblem as exc:
                    raise CorruptRecordError(str(self.store.state_path), 1, f"{METRICS_STATE_KEY}: {exc}") from None
                self._metrics.load_state_dict(saved)
        return self._metrics if cost_context is None else self._metrics.for_cost_context(cost_context)

    def activate_metrics_context(self, cost_context: str) -> Any:
        """Make `cost_context`'s builder the one `track_api_cost` adds to; returns the token to reset."""
        return self.metrics_builder(cost_context).activate()

    def _with_builder_metrics(self, split: str, metrics: dict[str, Any]) -> dict[str, Any]:
        """`metrics` with the builder-managed keys (costs/, time/step_, ...) added to the split's builder,
        and what that builder holds (with its rollups and totals) in their place (ART's flush at log)."""
        from groupwise.core.metrics import is_builder_managed_metric

        managed = {k: v for k, v in metrics.items() if is_builder_managed_metric(k)}
        if self._metrics is None and not managed:
            return metrics
        scope = "train" if split == "train" else "eval" if split in ("val", "test") else split
        builder = self.metrics_builder().for_cost_context(scope, buffer_scope=scope)
        for key, value in managed.items():
            builder.add_metric(key, value)
        flushed = builder.take()
        if flushed:
            self.merge_state({METRICS_STATE_KEY: builder.state_dict()})
        return {**{k: v for k, v in metrics.items() if k not in managed}, **flushed}

    async def get_step(self) -> int:
        """A prompted model never trains: always step 0."""
        return 0

    async def log(
        self,
        trajectories: Iterable[Trajectory | TrajectoryGroup | BaseException] | TrajectoryGroup | None = None,
        split: str = "val",
        *,
        metrics: dict[str, Any] | None = None,
        step: int | None = None,
    ) -> dict[str, Any]:
        """Store the trajectories of (split, step) and append their history row; return the row.

        Accepts groups, loose trajectories and exceptions (stored as one group), or None: then only
        `metrics` are written, in a row without the reward fields (ART's
        ``model.log(metrics=result.metrics, step=result.step)``). `step` defaults to the model's
        current step. The row's schema is in `groupwise.runs.store`'s docstring.
        """
        if step is None:
            step = await self.get_step()
        metrics = {k: v.item() if type(v).__module__ == "numpy" and hasattr(v, "item") else v
                   for k, v in (metrics or {}).items()}
        if trajectories is None:
            groups: list[TrajectoryGroup] = []
        elif isinstance(trajectories, TrajectoryGroup):
            groups = [trajectories]
        else:
            groups = as_groups(trajectories)
        for n, g in enumerate(groups):
            if g.pending:
                raise GroupwiseError(
                    f"log(): group {n} has {len(g.pending)} rollouts that were never run; gather the groups "
                    "first (await gather_trajectory_groups(...)) and log the result"
                )
        for key, value in (metrics or {}).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ArgumentTypeError(f"log(): metrics[{reprlib.repr(key)}]={reprlib.repr(value)} must be a number")
        metrics = self._with_builder_metrics(split, metrics)
        row = (metrics_row(step=step, split=split, metrics=metrics) if trajectories is None
               else history_row(groups, step=step, split=split, metrics=metrics))
        store = self.store
        wandb_log.reporter_for(self)  # W&B gets the row as it is written (when configured)
        if trajectories is None:
            # metrics for a (step, split) that has its row: added to it. ART appends a second row; a
            # replacement would drop the row's reward, which best-checkpoint choice reads.
            row = {**(store.run_history.row_with_key(row) or {}), **row}
        elif groups and (step, split) in self._logged:
            warnings.warn(GroupwiseWarning(
                f"log(): step {step} of split {split!r} was logged already by this model; a history row and its "
                "trajectories are one per step and split, so these replace the earlier ones (ART keeps both "
                "rows). Log another evaluation under a split of its own (e.g. split='val_hard')."), stacklevel=2)
        if groups:  # file IO off the event loop: rollouts keep running meanwhile
            await asyncio.to_thread(store.write_trajectories, split, step, groups)
            self._logged.add((step, split))
        await store.run_history.write(row)
        return row


@init_signature_from_fields
class TrainableModel(Model[ModelConfig, StateType], Generic[ModelConfig, StateType]):
    """A model a `Backend` serves and trains (GRPO on a LoRA adapter over `base_model`).

    Args (beyond `Model`'s):
        base_model: a Hugging Face id or local path, or a short name of a packaged model
            ("smollm2-135m"); the backend resolves it.
        config: a `gw.LoraConfig` sets this model's adapter; anything else is kept as your own settings.
        run_name: the run's folder name (ART 0.5's durable run name); `name` stays the served name.
        lora_config: ART's adapter settings (``rank``, ``alpha``, ``dropout``, ``target_modules``,
            ``random_state``), a dict or `gw.LoraConfig`.
        _internal_config: ART's `art.dev.InternalModelConfig` (private state, as in ART; may be assigned
            after construction). ``peft_args`` (``r``, ``lora_alpha``, ``lora_dropout``,
            ``target_modules``, ``random_state``) set the adapter; the settings in
            `groupwise.core.compat.INTERNAL_TRAIN_FIELDS` (``trainer_args.max_grad_norm``, ...) are this model's
            `TrainConfig` values; the rest is named once in a warning, with what to use instead.
    """

    base_model: str = DEFAULT_BASE_MODEL
    trainable: bool = True
    run_name: str | None = None
    lora_config: Any = None

    _internal_config: Any = PrivateAttr(default=None)

    def __init__(self, name: str, project: str = DEFAULT_PROJECT, base_model: str = DEFAULT_BASE_MODEL,
                 base_path: str = DEFAULT_RUN_STORE, *, _internal_config: dict[str, Any] | None = None,
                 base_url: str | None = None, api_key: str | None = None, **fields: Any) -> None:
        super().__init__(name, project, base_path, base_model=base_model, base_url=base_url, api_key=api_key,
                         **fields)
        self._internal_config = _internal_config
        self.store  # fail now, not after minutes of training, when the name cannot be a folder

    def __repr__(self) -> str:
        return f"TrainableModel(name={self.name!r}, project={self.project!r}, base_model={self.base_model!r})"

    @property
    def storage_name(self) -> str:
        return self.run_name or self.name

    def _internal_settings(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return internal_config_settings(self._internal_config, where="TrainableModel(_internal_config=...)")

    def train_defaults(self) -> dict[str, Any]:
        """This model's `TrainConfig` values from ART's `_internal_config` (e.g. ``trainer_args``'
        ``max_grad_norm``): every step uses them where its own config does not set the field."""
        return self._internal_settings()[1]

    def lora_for(self, default: "LoraConfig") -> "LoraConfig":
        """This model's adapter settings: `default` (the backend's) overridden by ``config`` (a
        LoraConfig), ``lora_config`` and ``_internal_config["peft_args"]`` (`groupwise.core.compat.merge_lora`)."""
        return merge_lora(default, self.config, self.lora_config, self._internal_settings()[0])

    async def register(self, backend: "Backend | None" = None, _openai_client_config: dict[str, Any] | None = None,
                       *, api: "Backend | None" = None) -> None:
        """Attach to `backend` and let it load (or resume) the model; fills `inference_base_url` and
        `inference_api_key` when the backend serves over HTTP too. `_openai_client_config` (ART's vLLM
        server settings) is named in a warning: the backend's loopback server picks its port and key.
        (`api`: ART 0.1-0.2's name of `backend`.)"""
        from groupwise.backend.base import Backend

        backend = _one_backend(backend, api)
        if _openai_client_config:
            warn_ignored("TrainableModel.register", ["_openai_client_config"],
                         "vLLM server settings; the backend's server picks a free port and a generated key")

        if not isinstance(backend, Backend):
            raise ArgumentTypeError(f"register() takes a groupwise Backend, got {type(backend).__name__}")
        await backend.register(self)
        self._backend = backend
        self._client = None  # a new endpoint
        wandb_log.reporter_for(self, start=True)  # ART starts a trainable model's W&B run at register
        http = backend.http_endpoint(self)
        if http is not None:  # as ART fills them: for clients other than openai_client()
            self.inference_base_url, self.inference_api_key = http.base_url, http.api_key
            self.inference_model_name = self.inference_name()  # the served name of the latest step

    def _make_client(self) -> "openai.AsyncOpenAI":
        endpoint = self.backend.inference_endpoint(self)
        # a request that asks for no logprobs gets them as plain lists (groupwise.core.choices.TOKEN_DATA_HEADER)
        return _openai_client_class()(base_url=endpoint.base_url, api_key=endpoint.api_key,
                                  http_client=endpoint.http_client, default_headers=dict(COMPACT_TOKEN_DATA))

    def inference_name(self, step: int | None = None) -> str:
        """``name`` (the latest step) or ``name@step``: the model a request asks for. Inside
        ``async with model.pinned(k):`` the latest is ``name@k``."""
        if step is None:
            step = _PINNED.get().get((self.project, self.name))
        if self._backend is None:
            return served_name(self.name, step)
        return self._backend.inference_name(self, step)

    async def get_step(self) -> int:
        """Number of completed training steps (0 before any)."""
        return await self.backend.get_step(self)

    @contextlib.asynccontextmanager
    async def pinned(self, step: int) -> "AsyncIterator[str]":
        """Pin a block of code to checkpoint `step` (ART's ``adapter_leases.pin_inference_step``):

            async with model.pinned(3) as name:   # name == "agent@3"
                ...  # model.get_inference_name() / inference_name() answer "agent@3" here, and in tasks
                     # started here; the engine serves agent@3 and retention keeps its checkpoint

        It serves ``name@step`` (loading its kept checkpoint if it was unloaded) and holds it, served and
        kept, until the block ends, while training goes on (an evaluation of an older checkpoint). A
        step never trained, or whose checkpoint retention already removed, is refused before the block.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ArgumentTypeError(f"pinned(step) takes a step number >= 0, got {step!r}")
        latest = await self.get_step()
        if step > latest:
            raise GroupwiseError(f"pinned({step}): {self.name!r} has trained {latest} step(s); "
                                 f"pin a step from 0 to {latest}")
        await self.backend.pin_step(self, step)
        token = _PINNED.set({**_PINNED.get(), (self.project, self.name): step})
        try:
            yield self.inference_name(step)
        finally:
            _PINNED.reset(token)
            await self.backend.unpin_step(self, step)

    async def delete_checkpoints(self, best_checkpoint_metric: str = BEST_CHECKPOINT_METRIC) -> None:
        """Delete every checkpoint but the latest and the best by `best_checkpoint_metric` (read from
        the history's rows: ``val/reward`` is the reward of the val rows), as ART's."""
        await self.backend.delete_checkpoints(self, best_checkpoint_metric)

    async def train(
        self,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: "TrainConfig | None" = None,
        _config: dict[str, Any] | None = None,
        verbose: bool = False,
        *,
        cursor: dict[str, Any] | None = None,
    ) -> "TrainResult":
        """One training step on `trajectory_groups` (ART's name: ART programs pass it by keyword), then
        log them as the train split of the step that sampled them, with the trainer's metrics. Returns
        the backend's `TrainResult`.

        `config` is a `gw.TrainConfig` (ART's ``art.TrainConfig(learning_rate=..., beta=...)`` is the
        same class); ART's ``_config`` (`art.dev.TrainConfig`) options map onto it or are named once
        in a warning; `verbose` is accepted. `cursor`: the caller's data position after this step
        (JSON-able), saved with the step's checkpoint; `backend.checkpoint_cursor(model)` returns it
        after a restart."""
        groups = [_as_train_group(g, n) for n, g in enumerate(trajectory_groups)]
        for n, g in enumerate(groups):
            if g.pending:
                raise GroupwiseError(f"train(): group {n} has rollouts that were never run; gather the groups first")
        # ART's config forms resolved once, here at the API edge (the backend takes the result as it is)
        config = resolve_train_config(config, {**dict(_config or {}), "verbose": verbose}, where="model.train",
                                      model_settings=self.train_defaults())
        step_before = await self.get_step()
        extra = {} if cursor is None else {"cursor": cursor}  # a backend written before cursors still works
        result = await self.backend.train(self, groups, config, **extra)
        if not self.backend.stores_steps:  # else the backend wrote them, with the checkpoint: once
            await self.log(groups, split="train", step=step_before, metrics=train_metrics(result.metrics))
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
                raise ArgumentTypeError(f"train_sft(): trajectories[{n}] is {type(t).__name__}; expected a Trajectory")
        config = config if config is not None else TrainSFTConfig()
        step_before = await self.get_step()
        result = await self.backend.train_sft(self, trajectories, config)
        if not self.backend.stores_steps:
            await self.log(None, split="sft", step=step_before, metrics=train_metrics(result.metrics))
        if verbose:
            print(f"[sft] step {step_before} -> {result.step}: loss {result.metrics.get('loss', float('nan')):.4f} "
                  f"over {int(result.metrics.get('trainable_tokens', 0))} target tokens, "
                  f"{int(result.metrics.get('updates', 0))} update(s)")
        return result


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _as_train_group(group: Any, n: int) -> TrajectoryGroup:
    """A group of `train`: a TrajectoryGroup, or a list of Trajectories (ART iterates whatever it is
    given; its hn_title_generator example trains on lists it filtered)."""
    if isinstance(group, TrajectoryGroup):
        return group
    if isinstance(group, (list, tuple)) and group and all(isinstance(t, Trajectory) for t in group):
        return TrajectoryGroup(group)
    raise ArgumentTypeError(f"train(): trajectory_groups[{n}] is {type(group).__name__}; expected a TrajectoryGroup "
                            f"(or a list of Trajectories)")
