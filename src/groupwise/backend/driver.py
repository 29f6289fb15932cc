"""`WorkerBackend`: the driver side shared by `LocalBackend` and `RayBackend`.

The driver owns the run store (trajectories, history) and the decisions; the models live on workers
(backend/worker.py), one per device. Where the workers run is the subclass's business: in the driver's
process (one device), in one process per device on this host (backend/processes.py), or as Ray actors
on a cluster (backend/ray.py). The driver reaches them only through `_call` (a method of every rank)
and `_endpoint` (where rollout requests go); a step crosses as two typed commands of the step protocol
(backend/protocol.py, sent by `_send`): `UpdateCommand`, then `PublishCommand`, which carries 4.-6.
below to each rank in one call (its retention decided here first); `RetainCommand` changes retention
between steps, and `PruneCommand` is `delete_checkpoints`. Runs are keyed by their `RunId` (groupwise/runs/run_id.py), never by the bare model name:
the workers and engines know a run by ``<project>/<run>``.

A train step, in order (each step of the order is there for a failure seen in ART):
1. write the step's trajectories to the run store FIRST: a crash during training loses nothing;
   a step whose groups all have equal rewards is skipped here (see `TrainConfig.max_skipped_steps`):
   no gradient step, a warning naming the groups, an ``alert`` row ``no_signal`` in the history, and
   the unchanged adapter checkpointed and served as the next step, as ART does;
2. tokenise once, here (token-in/token-out; raises `NotTrainableError` saying why when nothing is
   trainable), and split the sequences over the ranks, balanced by length (backend/ranks.py says why
   any split gives the gradient of the whole batch);
3. each rank pauses its engine (no forward pass runs), runs the GRPO step, resumes;
4. rank 0 saves the checkpoint atomically (adapter, optimizer, RNG, step, the caller's data cursor,
   the step's history row; state.json last), then the driver appends that row to history.jsonl;
5. every rank loads its own copy of the new adapter into its engine and checks it: its LoRA tensors
   must equal the trainer's, and the app's registry must resolve a request for ``name`` to ``name@k`` -- else
   `AdapterMismatchError` (ART once served a stale adapter silently); the driver checks that every
   rank holds the same adapter, bit for bit -- else `ReplicaDivergenceError`;
6. retention: keep the latest checkpoint, the best (named by `keep_best`, else by
   `best_checkpoint_metric`, the step's own row counted) and the KL reference of the last GRPO step
   (`TrainConfig.kl_reference_step`: each rank loads it before the update); serve only the last
   `served_steps` steps (backend/retention.py decides, each rank applies it in the same call as 4.-5.,
   once its own check passed).

With a placement (`BackendOptions.train_workers`), steps 2-3 run on the trainer ranks only (the
sequences are split over them), and in step 5 the trainers serve and check first; then every generator
loads the adapter of rank 0's checkpoint into its engine, answers a real request as ``name@k``, and the
driver checks that each serves rank 0's bits (`served_fingerprint`). Rollouts reach the generators only,
and they keep serving while the trainers update.

`train_sft()` (supervised steps on demonstrations) follows the same order, with one optimizer update
per batch of trajectories; it is a step like any other (checkpoint, history row, served adapter).

`register()` resumes from the latest intact checkpoint on every rank: the same files give every rank
the same adapter, optimizer state and RNG, and the driver gets the step and data cursor saved with it
(and replays the step's history row if history.jsonl lacks it: a crash between the two writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import time
import warnings
from abc import abstractmethod
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from groupwise.backend.base import BEST_CHECKPOINT_METRIC, Backend, InferenceEndpoint, TrainResult
from groupwise.backend.options import BackendOptions
from groupwise.backend.protocol import Command, Published, PublishCommand, RetainCommand, Update, UpdateCommand
from groupwise.backend.ranks import (ReplicaDivergenceError, check_identical, check_served, merge_ranks,
                                     shard_batch, sft_step_metrics)
from groupwise.backend.retention import prune_command, prune_row, retain_command
from groupwise.backend.worker import LOOPBACK, ModelSpec, WorkerOptions
from groupwise.core.compat import ART_LOCAL_TRAIN_KEYWORDS, not_provided, with_art_keywords
from groupwise.runtime.compute import compute_thread, error_of
from groupwise.runtime.memory import freeze_loaded, refreeze_wanted, thaw_loaded
from groupwise.config import DEFAULT_RUN_STORE, CheckpointRetention, TrainConfig
from groupwise.core.adapter_names import served_name
from groupwise.runs import wandb_log
from groupwise.errors import ArgumentTypeError, ConfigError, GroupwiseError, GroupwiseWarning, NotTrainableError, StoreError
from groupwise.core.learning_signal import step_verdict
from groupwise.runs.run_id import RunId
from groupwise.runs.lock import RunLocks

if TYPE_CHECKING:
    from groupwise.config import TrainSFTConfig
    from groupwise.model import TrainableModel
    from groupwise.core.trajectory import Trajectory, TrajectoryGroup

DEFAULT_PATH = DEFAULT_RUN_STORE

log = logging.getLogger("groupwise.backend")


class WorkerError(GroupwiseError):
    """A worker died, stopped answering, or failed a call; the run can resume from its last checkpoint."""


@dataclass
class _Run:
    """What the driver keeps for one registered model."""

    id: RunId
    spec: ModelSpec  # spec.name is id.key: the workers, the engines and the served names know the run by it
    store: Any
    tokenizer: Any
    vocab_size: int | None = None  # the embedding's rows: sampled ids past them are refused before the update
    step: int = 0
    checkpoint_path: str | None = None
    cursor: dict[str, Any] = field(default_factory=dict)
    best_step: int | None = None  # named by keep_best(); retention keeps it
    kl_reference_step: int | None = None  # the KL anchor of the last GRPO step: retention keeps it (restored on resume)
    held_steps: list[int] = field(default_factory=list)  # hold_steps(): an asynchronous loop still samples them
    pins: dict[int, int] = field(default_factory=dict)  # pin_step() count by step: code blocks sampling from it
    retention: CheckpointRetention = field(default_factory=CheckpointRetention)  # set_retention()

    @property
    def pinned_steps(self) -> list[int]:
        return sorted(self.pins)
    skipped_in_a_row: int = 0  # consecutive steps skipped for lack of signal (restored on resume)
    warned_base_samples: bool = False  # `_base_samples_warning` said it once
    # Why the trainer holds an update that no checkpoint has (its step's write or publish failed after
    # it): every later step would build on it and checkpoint weights that no history explains.
    unsaved_update: str | None = None
    urls: list[str | None] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


async def run_to_end(step: Any) -> Any:
    """Await the coroutine `step` (a train step); a cancelled caller does not cancel it. A step cut off
    between its update and its checkpoint would leave the trainer holding an adapter that no checkpoint
    has and the engine does not serve, and on a backend shared by several runs an update cut off inside
    its pause would release the shared model while the trainer still runs on it. So the step finishes
    (or fails) on its own, holding the run's lock, and the next step of the run starts from it."""
    task = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        # the step's own failure, if it fails, is logged rather than lost (nobody awaits it now)
        task.add_done_callback(lambda t: t.cancelled() or t.exception() is None
                               or log.error("a train step whose caller was cancelled failed: %r", t.exception()))
        raise


class WorkerBackend(Backend):
    """Serve and train `TrainableModel`s on workers, one per device (module doc). Subclasses place the
    workers and implement `_start`, `_call`, `_endpoint` and `_stop`.

    Args:
        path: root of the run store (``<path>/<project>/models/<model>/``) when the model keeps the default
            base_path; a model constructed with its own base_path keeps it.
        options: the settings every worker backend shares (backend/options.py); the subclasses take
            them as keywords too.
    """

    stores_steps = True  # a step's trajectories and train row are written here, once (the order above)

    def __getattr__(self, name: str) -> Any:
        # only reached when normal lookup fails: ART's backend methods groupwise has no counterpart of say
        # why (groupwise.core.compat.NOT_PROVIDED); any other name is Python's AttributeError
        raise not_provided("LocalBackend", name)

    def __init__(self, path: str = DEFAULT_PATH, options: BackendOptions | None = None) -> None:
        self.path = str(path)
        self.options = options if options is not None else BackendOptions()
        self.options.check()
        self._runs: dict[RunId, _Run] = {}  # one identity per run (run_id.py): never the bare model name
        self._run_locks = RunLocks()  # one writer per run folder (run_lock.py says why)
        self._started = False

    # ------------------------------------------------------------------------------ placement
    @property
    @abstractmethod
    def world_size(self) -> int:
        """Number of workers (data-parallel ranks, or trainers and generators with `train_workers`)."""

    @property
    def train_ranks(self) -> list[int]:
        """The ranks that train: the first `options.train_workers`, or every rank without a placement."""
        return list(range(self.options.train_workers or self.world_size))

    @property
    def generator_ranks(self) -> list[int]:
        """The ranks that only generate (none without a placement)."""
        return list(range(len(self.train_ranks), self.world_size)) if self.options.train_workers else []

    def _worker_options(self, *, serve_http: bool, http_host: str = LOOPBACK,
                        api_key: str | None = None) -> WorkerOptions:
        o = self.options
        return WorkerOptions(dtype=o.dtype, max_batch_size=o.max_batch_size, engine_kwargs=o.engine_kwargs,
                             verify_adapter=o.verify_adapter, serve_http=serve_http, http_host=http_host,
                             api_key=api_key, load_model=o.load_model,
                             memory_budget_gb=o.memory_budget_gb, joint_updates=o.joint_updates,
                             train_workers=o.train_workers)

    @abstractmethod
    async def _start(self) -> None:
        """Start the workers (and their process group)."""

    @abstractmethod
    async def _call(self, method: str, kwargs: "list[dict[str, Any] | None]") -> list[Any]:
        """Call `Worker.<method>(**kwargs[r])` on every rank r at once; the results by rank. A rank whose
        kwargs are None is not called (its result is None). Raises `WorkerError` when a worker dies or fails."""

    @abstractmethod
    def _endpoint(self, name: str, urls: list[str | None]) -> InferenceEndpoint:
        """Where requests for model `name` go (its app on each rank: `urls`, None in process)."""

    @abstractmethod
    async def _stop(self) -> None:
        """Stop the workers."""

    async def _call_all(self, method: str, **kwargs: Any) -> list[Any]:
        return await self._call(method, [kwargs] * self.world_size)

    async def _call_ranks(self, method: str, kwargs_by_rank: dict[int, dict[str, Any]]) -> dict[int, Any]:
        """`DeviceWorker.<method>` on the ranks of `kwargs_by_rank` only (trainers, or generators), at once."""
        results = await self._call(method, [kwargs_by_rank.get(r) for r in range(self.world_size)])
        return {r: results[r] for r in kwargs_by_rank}

    async def _send(self, commands: "dict[int, Command]") -> dict[int, Any]:
        """A step's typed command (backend/protocol.py) to each rank of `commands`, at once: the
        transports carry the command's method and the command itself. The answers by rank."""
        methods = {c.method for c in commands.values()}
        assert len(methods) == 1, f"one kind of command at a time, got {sorted(methods)}"
        return await self._call_ranks(methods.pop(), {r: {"command": c} for r, c in commands.items()})

    # ------------------------------------------------------------------------------ register
    def _run(self, model: "TrainableModel") -> _Run:
        run = self._runs.get(RunId.of(model))
        if run is None:
            raise GroupwiseError(
                f"model {model.name!r} is not registered with this {type(self).__name__}; "
                "call `await model.register(backend)`"
            )
        return run

    def _registers(self, model: "TrainableModel") -> RunId | None:
        """The identity `model`'s run takes on this backend, or None when that run is registered already
        (another `TrainableModel` of the same folder is the same run). A run of another store with the
        same project and run name is refused: its served names would be this one's (run_id.py)."""
        if model.base_path == DEFAULT_PATH and self.path != DEFAULT_PATH:
            model.base_path = self.path  # the backend's path is where a default-configured model's run lives
        run_id = RunId.of(model)
        if run_id in self._runs:
            return None
        taken = next((other for other in self._runs if other.key == run_id.key), None)
        if taken is not None:
            raise ConfigError(
                f"cannot register {model.name!r}: its run {run_id.key!r} in {run_id.folder} has the project and "
                f"name of a run already registered with this {type(self).__name__}, in {taken.folder}, and the two "
                "would be served under one name. Give one of them another project or run_name, or register it "
                "with another backend.", what="model registration")
        return run_id

    async def register(self, model: "TrainableModel") -> None:
        run_id = self._registers(model)
        if run_id is None:
            return
        with self._run_locks.holding(run_id.key, model.store.run_dir):  # refused before anything loads
            await self._register(model, run_id)

    async def unregister(self, model: "TrainableModel") -> None:
        """Drop a registered model: its adapter, optimizer and served steps leave the workers (the base
        weights and engine stay while another model of the same base uses them) and its run folder is
        free for another process. Its run folder and checkpoints stay; `register` resumes it."""
        run = self._runs.get(RunId.of(model))
        if run is None:
            return
        async with run.lock:  # not in the middle of its own step
            thaw_loaded()  # what it alone held is collectable again (`_register` froze it)
            try:
                await self._call_all("unload", name=run.spec.name)
            finally:
                del self._runs[run.id]
                self._run_locks.release(run.id.key)
                # An in-process worker's unload froze the rest again already (one full collection, not two)
                if self._runs and gc.get_freeze_count() == 0:
                    await compute_thread().run(freeze_loaded)

    async def _register(self, model: "TrainableModel", run_id: RunId) -> None:
        if not self._started:
            await self._start()
            self._started = True
        # The model's own LoRA settings (config=, ART's lora_config= / peft_args) override the backend's.
        lora = model.lora_for(self.options.lora)
        store = model.store
        spec = ModelSpec(run_id.key, model.base_model, lora, str(store.checkpoints_dir),
                         reserve_slots=self.options.served_steps + 1, short_name=model.name)
        infos = await self._call_all("load", spec=spec)
        steps = {info["step"] for info in infos}
        prints = {tuple(infos[r]["fingerprint"]) for r in self.train_ranks}
        # generators hold no trainable adapter: they must serve what the trainers serve
        prints_served = {tuple(i["served_fingerprint"]) for i in infos if i.get("served_fingerprint") is not None}
        if len(steps) > 1 or len(prints) > 1 or len(prints_served) > 1:
            raise ReplicaDivergenceError(
                f"the ranks resumed {model.name!r} differently (steps {sorted(steps)}, {len(prints)} distinct "
                f"adapters) from {spec.checkpoints_dir}: every rank must read the same checkpoint folder "
                "(on several hosts, put the run's base_path on a filesystem every host sees)."
            )
        head = infos[0]
        for row in head["history"]:  # a crash between the checkpoint and the history append lost none
            await asyncio.to_thread(store.append_history, row, if_missing=True)
        self._runs[run_id] = _Run(run_id, spec, store, head["tokenizer"], head.get("vocab_size"), step=head["step"],
                                      checkpoint_path=head["checkpoint_path"], cursor=head["cursor"],
                                      urls=[info["url"] for info in infos],
                                      skipped_in_a_row=int(head["metrics"].get("skipped_in_a_row", 0)),
                                      kl_reference_step=int(head["metrics"].get("kl_reference_step", 0)) or None)
        # Where the model lives in a worker process (which froze its own load), this process's full collections
        # would walk what the registration loaded here (torch, transformers, the client, the tokenizer: ~300,000
        # objects, 0.15 s a collection on the 2-core CPU, set off every few steps by the rollouts' objects). In
        # process, the worker's load froze them already and this freezes what the registration added beside.
        await compute_thread().run(freeze_loaded)

    # ------------------------------------------------------------------------------ serve
    def inference_endpoint(self, model: "TrainableModel") -> InferenceEndpoint:
        run = self._run(model)
        return self._endpoint(run.spec.name, run.urls)

    def inference_name(self, model: "TrainableModel", step: int | None = None) -> str:
        """``name`` / ``name@step`` (ART's), or the run's qualified ``<project>/<run>`` / ``...@step`` while
        another run registered here has the same model name (run_id.py): either resolves to this run."""
        run = self._runs.get(RunId.of(model))
        if run is not None:
            return served_name(self._shown_name(run), step)
        return super().inference_name(model, step)

    async def get_step(self, model: "TrainableModel") -> int:
        return self._run(model).step

    async def checkpoint_cursor(self, model: "TrainableModel") -> dict[str, Any]:
        return dict(self._run(model).cursor)

    async def serve_step(self, model: "TrainableModel", step: int) -> None:
        run = self._run(model)
        await self._call_all("serve_step", name=run.spec.name, step=step)

    async def keep_best(self, model: "TrainableModel", step: int, *, metrics_by_step: dict[int, float] | None = None,
                        maximize: bool = True) -> None:
        run = self._run(model)
        run.best_step = int(step)
        await self._retain(run)

    async def set_retention(self, model: "TrainableModel", retention: CheckpointRetention) -> None:
        if not isinstance(retention, CheckpointRetention):
            raise ArgumentTypeError(f"set_retention takes a gw.CheckpointRetention, got {type(retention).__name__}")
        run = self._run(model)
        # Applied from the next step's publication on, not now: a loop sets it as it starts, before it holds
        # the policies it samples from (a pipelined run resumed needs its previous step's checkpoint to
        # serve), and a prune now would delete what it is about to hold.
        run.retention = retention

    async def hold_steps(self, model: "TrainableModel", steps: list[int]) -> None:
        run = self._run(model)
        run.held_steps = sorted({int(s) for s in steps if int(s) > 0})
        await self._retain(run)

    async def pin_step(self, model: "TrainableModel", step: int) -> None:
        run = self._run(model)
        await self.serve_step(model, step)  # a pruned checkpoint is refused here, before anything is held
        if step > 0:  # the base (name@0) is always served and has no checkpoint
            run.pins[step] = run.pins.get(step, 0) + 1
            await self._retain(run)

    async def unpin_step(self, model: "TrainableModel", step: int) -> None:
        run = self._run(model)
        if step not in run.pins:
            return
        if run.pins[step] <= 1:
            del run.pins[step]
        else:
            run.pins[step] -= 1
        await self._retain(run)

    async def served_steps(self, model: "TrainableModel") -> list[int]:
        """The steps each engine serves now (the same on every rank)."""
        return (await self._call_all("served_steps", name=self._run(model).spec.name))[0]

    async def rank_states(self, model: "TrainableModel") -> list[dict[str, Any]]:
        """Each trainer rank's adapter tensors, optimizer tensors and torch RNG state (CPU copies), by rank:
        to check that the ranks hold the same model, e.g. after a resume. (Generators train nothing:
        `served_adapters` reads what they serve.)"""
        name = self._run(model).spec.name
        states = await self._call_ranks("state_tensors", {r: {"name": name} for r in self.train_ranks})
        return [states[r] for r in self.train_ranks]

    async def served_adapters(self, model: "TrainableModel", step: int) -> list[dict[str, Any]]:
        """The adapter tensors each rank's engine serves as ``name@step`` (CPU copies, by the trainer's
        parameter names), by rank: with generators, to see that they serve the trained adapter."""
        return await self._call_all("served_tensors", name=self._run(model).spec.name, step=step)

    # ------------------------------------------------------------------------------ train
    @with_art_keywords(**ART_LOCAL_TRAIN_KEYWORDS)
    async def train(
        self, model: "TrainableModel", trajectory_groups: "list[TrajectoryGroup]", config: TrainConfig | None = None, *,
        cursor: dict[str, Any] | None = None, **options: Any,
    ) -> TrainResult:
        """One GRPO step on `trajectory_groups`; returns once the new adapter is served and verified.

        ART 0.5's form works too: ``await backend.train(model, groups, learning_rate=1e-5, ...)``; its
        options map onto `TrainConfig` fields or are named once in a warning (docs/porting-from-art.md).
        The step's trajectories and train row are stored here, with its checkpoint (`stores_steps`):
        `model.train` does not write them again.

        A caller cancelled during the step does not cut it short (`run_to_end`)."""
        return await run_to_end(self._train(model, trajectory_groups, config, cursor=cursor, **options))

    async def _train(
        self, model: "TrainableModel", trajectory_groups: "list[TrajectoryGroup]", config: TrainConfig | None = None, *,
        cursor: dict[str, Any] | None = None, **options: Any,
    ) -> TrainResult:
        from groupwise.core.compat import ART_BACKEND_TRAIN_LOSS, is_resolved, resolve_train_config
        from groupwise.runs.store import history_row, numeric_metrics

        # The API edge: `model.train` resolved its config already (once); a direct call (ART 0.5's
        # backend.train(model, groups, learning_rate=...)) is resolved here, with the model's own
        # settings (ART's _internal_config trainer_args, ...) as on every path in.
        if options or not is_resolved(config):
            config = resolve_train_config(config, options, where=f"{type(self).__name__}.train",
                                          model_settings=model.train_defaults(), arts_loss=ART_BACKEND_TRAIN_LOSS)
        run = self._run(model)
        async with run.lock:  # one step at a time per model
            self._check_saved(run)
            t0 = time.perf_counter()
            step = run.step
            run.kl_reference_step = config.kl_reference_step or None  # kept from now on (retention)
            groups = run.store.check_storable(trajectory_groups)  # a group the store refuses fails here
            # 1. trajectories first: a crash in the step loses nothing. They are written on another thread
            # while the step tokenises and updates (the driver's CPU is idle while the ranks update, and
            # 4 GPUs' rollouts take it ~0.3 s to dump); nothing is checkpointed, and no error leaves the
            # step, before they are on disk.
            written = asyncio.ensure_future(asyncio.to_thread(run.store.write_trajectories, "train", step, groups))
            try:
                metrics = await self._update(run, model, groups, step, config)
            except BaseException:
                if (error := await error_of(written)) is not None:
                    log.error("%s: step %d's trajectories were not written either: %r", model.name, step, error)
                raise
            with self._saving(run, step, updated=not metrics.get("skipped")):
                await written
                if run.kl_reference_step is not None:  # saved with the checkpoint: a resumed run keeps the anchor
                    metrics["kl_reference_step"] = float(run.kl_reference_step)
                # 4.-6. checkpoint (with the step's history row), serve and verify, retention.
                row = history_row(groups, step=step, split="train", metrics=numeric_metrics(metrics))
                t_publish = time.perf_counter()
                await self._publish(run, step + 1, metrics, dict(cursor or {}), row)
            # after the row: the checkpoint holds the row, so its own writing cannot be in it (the loop's row has it)
            metrics["time/publish_s"] = time.perf_counter() - t_publish
            if refreeze_wanted():
                await compute_thread().run(freeze_loaded)
            metrics["step_time"] = time.perf_counter() - t0
            return TrainResult(step=run.step, metrics=metrics, checkpoint_path=run.checkpoint_path)

    @staticmethod
    @contextlib.contextmanager
    def _saving(run: _Run, step: int, *, updated: bool):
        """Around what follows a step's update: if it fails, the trainer holds weights that no checkpoint
        has, and the run takes no further step (`_check_saved`) until it is loaded again."""
        try:
            yield
        except BaseException as exc:
            if updated:
                run.unsaved_update = (f"step {step}'s update ran, but the step failed before its checkpoint was "
                                      f"complete ({type(exc).__name__}: {exc})")
            raise

    @staticmethod
    def _check_saved(run: _Run) -> None:
        if run.unsaved_update is not None:
            raise StoreError(
                f"{run.spec.name}: {run.unsaved_update}. The trainer still holds that update, and a step on top "
                f"of it would checkpoint weights no history explains. Load the run again from its last complete "
                "checkpoint first: `await backend.unregister(model)` then `await model.register(backend)` (or "
                "restart the program), then train the step again.")

    async def _update(self, run: _Run, model: "TrainableModel", groups: "list[TrajectoryGroup]", step: int,
                      config: TrainConfig) -> dict[str, float]:
        """2.-3. of a GRPO step: its metrics, those of a skipped step where no group has a signal."""
        from groupwise.training.tokenize import tokenize_groups

        # A teacher scores every token, so a step whose rewards all tie still has a signal to train.
        metrics = await self._no_signal(run, groups, step, config) if config.teacher is None else None
        self._base_samples_warning(run, groups, step)
        if metrics is not None:
            return metrics
        # 2. token-in/token-out batch, rendered as the server rendered the prompts; one share per rank.
        t0 = time.perf_counter()
        batch = await compute_thread().run(
            tokenize_groups, groups, run.tokenizer, max_seq_len=config.max_seq_len, vocab_size=run.vocab_size,
            scale_rewards=config.scale_rewards,
            train_forced_tokens=config.train_forced_tokens, keep_tied_groups=config.teacher is not None,
        )
        tokenized = time.perf_counter()
        trainers = self.train_ranks
        shards = shard_batch(batch, len(trainers))
        del batch
        # 3. the update on every trainer rank (gradients summed over them).
        per_rank = await self._send({r: UpdateCommand(run.spec.name, step, (Update(shard, config, "grpo"),))
                                     for r, shard in zip(trainers, shards)})
        del shards
        metrics = merge_ranks([per_rank[r][0] for r in trainers])
        metrics["time/tokenize_s"] = tokenized - t0
        run.skipped_in_a_row = 0
        metrics.update(skipped=0.0, skipped_in_a_row=0.0)
        return metrics

    def _base_samples_warning(self, run: _Run, groups: "list[TrajectoryGroup]", step: int) -> None:
        """Once a run: a step past the first two whose every sampled token came from the base model (policy
        version 0), with no asynchronous loop holding older steps. Rollouts whose requests name the base
        model (or ``name@0``) instead of the model train it on the base's samples step after step: it
        learns little and nothing says why."""
        if step < 2 or run.held_steps or run.warned_base_samples:
            return
        versions = [v for g in groups for t in g.trajectories for v in t.policy_versions()]
        if versions and not any(versions):
            run.warned_base_samples = True
            name = self._shown_name(run)
            warnings.warn(GroupwiseWarning(
                f"{name}: step {step} trains on tokens the base model sampled (policy version 0 on every "
                f"token), not the adapter of step {step}: the rollouts' requests name the base model or "
                f"{name}@0. Pass model=model.name (or model.get_inference_name()) to the client so each "
                "step samples from the adapter trained last."), stacklevel=2)

    def _shown_name(self, run: _Run) -> str:
        """The name a user's requests reach `run` by: its model's name, or its qualified name while another
        run registered here has the same model name (run_id.py)."""
        short = run.spec.short_name
        if short is None or any(o is not run and o.spec.short_name == short for o in self._runs.values()):
            return run.spec.name
        return short

    async def _no_signal(self, run: _Run, groups: "list[TrajectoryGroup]", step: int,
                         config: TrainConfig) -> dict[str, float] | None:
        """None when the step trains; else the skipped step's metrics, after its warning and alert row.
        Raises NotTrainableError past `config.max_skipped_steps` (the rule and its words:
        `groupwise.core.learning_signal.step_verdict`)."""
        verdict = step_verdict([g.rewards() for g in groups], step=step, skipped_in_a_row=run.skipped_in_a_row,
                               max_skipped_steps=config.max_skipped_steps)
        if verdict.action == "raise":
            raise NotTrainableError(verdict.message)
        if verdict.action == "train":
            return None
        run.skipped_in_a_row = verdict.skipped_in_a_row
        log.warning("%s", verdict.message)
        now = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        await run.store.run_history.write({**verdict.alert_row(step), "recorded_at": now})
        return {"skipped": 1.0, "skipped_in_a_row": float(run.skipped_in_a_row), "no_signal_groups": float(len(groups))}

    async def train_sft(
        self, model: "TrainableModel", trajectories: "list[Trajectory]", config: "TrainSFTConfig | None" = None
    ) -> TrainResult:
        """`_train_sft`, run to its end even when the caller is cancelled (`run_to_end`)."""
        return await run_to_end(self._train_sft(model, trajectories, config))

    async def _train_sft(
        self, model: "TrainableModel", trajectories: "list[Trajectory]", config: "TrainSFTConfig | None" = None
    ) -> TrainResult:
        """One supervised step: the same order as `train` (store first, tokenise, exclusive use of the
        model, checkpoint, serve and verify, retention), with one optimizer update per batch of
        `config.batch_size` trajectories (training/sft.py's loss on their assistant turns). The data
        cursor of the last GRPO step is kept in its checkpoint."""
        from groupwise.config import TrainSFTConfig
        from groupwise.runs.store import metrics_row, numeric_metrics
        from groupwise.training.sft import tokenize_sft
        from groupwise.core.trajectory import TrajectoryGroup

        config = config if config is not None else TrainSFTConfig()
        config.check()  # again: its fields may have been assigned since it was built
        run = self._run(model)
        trajectories = list(trajectories)
        if not trajectories:
            raise GroupwiseError("train_sft() got no trajectories; pass the demonstrations to imitate")
        size = config.resolved_batch_size()
        chunks = [trajectories[i:i + size] for i in range(0, len(trajectories), size)]
        rates = config.rates(len(chunks))
        async with run.lock:
            self._check_saved(run)
            t0 = time.perf_counter()
            step = run.step
            # 1. demonstrations first (one group per batch): a crash in the step loses nothing.
            await asyncio.to_thread(run.store.write_trajectories, "sft", step, [TrajectoryGroup(c) for c in chunks])
            # 2. token-in/token-out, rendered as the server renders requests; each batch split over the ranks.
            shards = [shard_batch(await compute_thread().run(
                tokenize_sft, c, run.tokenizer, max_seq_len=config.max_seq_len, vocab_size=run.vocab_size,
                assistant_turns=config.assistant_turns), len(self.train_ranks)) for c in chunks]
            # 3. one update per batch, with exclusive use of the shared model; none for a batch at rate 0
            # (where ART's decaying schedules end): AdamW scales both its step and its decay by the rate.
            live = [(parts, rate) for parts, rate in zip(shards, rates) if rate > 0]
            updates = [config.update_config(rate) for _, rate in live]
            by_rank = await self._send({
                r: UpdateCommand(run.spec.name, step, tuple(Update(parts[i], u, "sft") for (parts, _), u in zip(live, updates)))
                for i, r in enumerate(self.train_ranks)
            }) if live else {}
            per_rank = list(by_rank.values())
            del shards, live
            per_update = [merge_ranks(list(ranks)) for ranks in zip(*per_rank)]
            metrics = sft_step_metrics(per_update, rates[-1])
            # 4-6. checkpoint, serve and verify, retention: an SFT step is a step like any other.
            row = metrics_row(step=step, split="sft", metrics=numeric_metrics(metrics))  # no rollouts, no reward
            with self._saving(run, step, updated=bool(per_update)):
                await self._publish(run, step + 1, metrics, dict(run.cursor), row)
            metrics["step_time"] = time.perf_counter() - t0
            return TrainResult(step=run.step, metrics=metrics, checkpoint_path=run.checkpoint_path)

    async def _publish(self, run: _Run, new_step: int, metrics: dict[str, float], cursor: dict[str, Any],
                       row: dict[str, Any]) -> None:
        """4.-6. in one `PublishCommand` per rank: rank 0 saves the checkpoint with the step's history row,
        every rank serves its copy of the new adapter, checks it and applies the step's retention; then
        the row is appended and the ranks' adapters are compared. With a placement the generators get the
        same command once the trainers answered, with rank 0's checkpoint to serve.

        Retention is decided here, before the checkpoint exists, from the history and the step's own row
        (as if appended), so no rank waits for a second round trip. A rank whose own check fails raises
        before its retention; ranks that disagree with each other (`ReplicaDivergenceError`, found once
        they answered) have applied it, which deletes only what the next step would: the new checkpoint
        is the latest, always kept, and the run resumes from it."""
        retain = retain_command(run, run.spec.name, self.options, step=new_step, new_rows=(row,))
        publish = PublishCommand(run.spec.name, new_step, metrics, cursor, history=(row,), retain=retain)
        trained = await self._send({r: publish for r in self.train_ranks})
        results: list[Published] = [trained[r] for r in self.train_ranks]
        for part, seconds in results[0].times.items():  # where the publication's time went, rank 0's
            metrics[f"time/publish_{part}_s"] = seconds
        await run.store.run_history.write(row)
        if results[0].deleted:  # rank 0 deleted checkpoints by the step's retention: the history says which, and why
            await run.store.run_history.write(prune_row(retain, list(results[0].deleted)))
        check_identical(run.spec.name, new_step, results)
        if self.generator_ranks:  # they serve rank 0's checkpoint, once it is complete (module doc)
            from_rank_0 = dataclasses.replace(publish, checkpoint_path=results[0].checkpoint_path)
            served = await self._send({r: from_rank_0 for r in self.generator_ranks})
            check_served(run.spec.name, new_step, [*results, *(served[r] for r in self.generator_ranks)])
        run.step = new_step
        run.checkpoint_path = results[0].checkpoint_path
        run.cursor = cursor

    async def delete_checkpoints(self, model: "TrainableModel", best_checkpoint_metric: str = BEST_CHECKPOINT_METRIC) -> None:
        """Delete every checkpoint but the latest and the best by `best_checkpoint_metric` (ART's
        `model.delete_checkpoints()`); steps still served keep being served from memory."""
        run = self._run(model)
        prune = prune_command(run, run.spec.name, best_checkpoint_metric)
        deleted = (await self._send({r: prune for r in range(self.world_size)}))[0]
        if deleted:
            command = RetainCommand(run=prune.run, step=prune.step, served_steps=self.options.served_steps,
                                    best_metric=prune.best_metric, in_use=prune.in_use)
            await run.store.run_history.write(prune_row(command, deleted, why=(
                f"delete_checkpoints(): not the latest, nor the best by {best_checkpoint_metric}, nor in use")))

    async def _retain(self, run: _Run) -> None:
        """Retention between steps (`keep_best`, `hold_steps`, pins; backend/retention.py decides what
        stays); a step's own retention travels in its `PublishCommand`. A prune is logged in the run's history."""
        command = retain_command(run, run.spec.name, self.options)
        deleted = (await self._send({r: command for r in range(self.world_size)}))[0]
        if deleted:
            await run.store.run_history.write(prune_row(command, deleted))

    # ------------------------------------------------------------------------------ close
    async def close(self) -> None:
        try:
            if self._started:
                for run in list(self._runs.values()):
                    async with run.lock:  # a step whose caller was cancelled ends first (run_to_end)
                        pass
                try:
                    await self._call_all("close")
                except WorkerError:
                    pass  # the workers failed already, and that was raised where it happened: stop what is left
                finally:
                    self._forget_runs()
                    self._started = False
                    await self._stop()
        finally:
            self._run_locks.release_all()  # another process may train the runs now

    def _forget_runs(self) -> None:
        """Drop every registered run, the W&B run of each ending with the backend (wandb_log, "Until when");
        both closes end here, the async one and ART's ``with LocalBackend()``."""
        for run in self._runs.values():
            wandb_log.finish_store(run.store)
        if self._runs:
            thaw_loaded()  # `_register` froze what it loaded
        self._runs.clear()

    def describe(self) -> dict[str, Any]:
        return {
            "backend": type(self).__name__, "path": self.path, "dtype": self.options.dtype,
            "world_size": self.world_size, "train_workers": self.options.train_workers,
            "lora": self.options.lora.to_dict(), "models": {k.key: v.step for k, v in self._runs.items()},
        }
