"""`DeviceWorker`: one rank of a backend, holding a `Replica` per registered model on its device; the
implementation of the step protocol's `Worker` (backend/protocol.py).

Models of one base model share its `SharedBase` (backend/replica.py): one copy of the base weights,
one engine, one registry and app. Their updates take turns (one lock per base): an update pauses the
shared engine, and a pause's end resets the model's train/eval state, which must not happen in the
middle of another model's update. Updates that wait for that lock at once may train in one pass
(backend/joint_updates.py).

The same class runs in the driver's own process (one device), in a process of its own per device
(data-parallel on one host, backend/processes.py) and as a Ray actor (backend/ray.py). Its methods are
coroutines the driver awaits (in process), sends through a pipe, or calls as actor methods; the torch
work runs on the process's compute thread (groupwise/runtime/compute.py), so the event loop keeps serving HTTP
meanwhile.

A worker of a data-parallel group joins the torch.distributed process group (NCCL between GPUs, gloo
on CPUs) whose collectives sum the trainer's gradients, and serves each replica's OpenAI-compatible app
over HTTP (uvicorn), where the driver's router sends rollout requests; or, with `WorkerOptions.engine_core`,
each base's engine as an engine core whose app runs in the driver's process (backend/frontends.py). Rank 0 writes the checkpoints;
every other rank serves its own copy of the new adapter from memory (its trainer's tensors, which the
all-reduce kept equal to rank 0's), so no weights travel between ranks beyond the gradient all-reduce.

With a placement (`WorkerOptions.train_workers`), ranks below it only train: they form the
torch.distributed group among themselves, and their apps are not served over HTTP (no rollout reaches
them). The other ranks only generate: no trainer, no optimizer, no process group; after each step they
load the adapter from rank 0's checkpoint folder (the run's base_path, which every worker sees), the
same file rank 0's own engine loaded, so the engines serve the same bits. A LoRA adapter is megabytes:
reading it from disk costs less than a broadcast would need in setup (a group spanning generators that
must then join every collective), and the checkpoint is written anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from groupwise.errors import ConfigError
from groupwise.runtime.memory import freeze_loaded, refreeze_wanted, release_freed_memory, thaw_loaded
from groupwise.backend.protocol import PruneCommand, Published, PublishCommand, RetainCommand, UpdateCommand
from groupwise.backend.replica import Replica, SharedBase
from groupwise.runtime.compute import compute_thread, error_of, update_thread
from groupwise.config import LoraConfig

LOOPBACK = "127.0.0.1"  # where a worker's servers listen unless told otherwise: this host only
log = logging.getLogger("groupwise.backend")


@contextlib.contextmanager
def update_bar(step: int, *, enabled: bool = True) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar over an update's tokens, micro-batch by micro-batch: on a CPU an update takes
    minutes, and a silent terminal reads as a hang. Rank 0 only (the ranks' bars would interleave)."""
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=None, desc=f"update step {step}", unit="tok", leave=False, mininterval=1.0)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        bar.close()


@dataclass
class ModelSpec:
    """What a worker needs to load (or resume) one model."""

    name: str  # the run's key (`RunId.key`, ``<project>/<run>``): what the workers and engines know it by
    base_model: str
    lora: LoraConfig
    checkpoints_dir: str
    # adapter slots made for it when it loads: the steps it serves at once in its steady state
    # (BackendOptions.served_steps + 1 while a new step is swapped in; inference/adapter_slots.py)
    reserve_slots: int = 0
    # the model's own name: requests may ask for it while no other run of the base has it (registry.py)
    short_name: str | None = None


@dataclass
class WorkerOptions:
    """Settings shared by every rank. The first eight are the backend's `BackendOptions` (which owns their
    defaults: the driver passes every one); the rest say how this placement reaches its workers."""

    dtype: str | None
    max_batch_size: int
    engine_kwargs: dict[str, Any] | None
    verify_adapter: bool
    load_model: Any  # (name, device=, dtype=) -> (model, tokenizer); None: groupwise.runtime.loading.load_base_model
    memory_budget_gb: float | None  # each base's budget on the device; None: estimated (backend/budget.py)
    joint_updates: bool  # concurrent updates of one base train in one pass (backend/joint_updates.py)
    train_workers: int | None = None  # ranks below it only train, the others only generate; None: all do both
    serve_http: bool = False  # serve each replica's app over HTTP (a worker outside the driver's process)
    http_host: str = LOOPBACK  # the address its servers listen on
    api_key: str | None = None  # the key requests to those servers must carry
    # serve each base's engine as an engine core (inference/engine_core.py) on a ZeroMQ address instead of
    # an app: the driver's process runs the app over it (backend/frontends.py); LocalBackend(engine_process=)
    engine_core: bool = False


class DeviceWorker:
    """One rank: replicas of the registered models on `device` (module doc). It implements the step
    protocol (`groupwise.backend.protocol.Worker`: `update`, `publish`, `retain`), wherever it is placed."""

    def __init__(self, rank: int, world_size: int, device: str | None, options: WorkerOptions) -> None:
        self.rank, self.world_size, self.device, self.options = rank, world_size, device, options
        self.replicas: dict[str, Replica] = {}
        self.specs: dict[str, ModelSpec] = {}
        self.bases: dict[str, SharedBase] = {}  # base model -> what its models share on this device
        self._update_locks: dict[str, asyncio.Lock] = {}  # base model -> one update at a time
        self._joint: dict[str, Any] = {}  # base model -> its `JointUpdates`: updates waiting to train together
        # Loads and unloads one at a time: two runs registering at once (asyncio.gather, or two drivers of a
        # shared worker: sharing.py) would each find no base and load it twice, each run on an engine of its
        # own; and an unload that closes an empty base must not close the one a load is about to use.
        self._loading = asyncio.Lock()
        self.process_group: Any = None
        split = options.train_workers
        self.trains = split is None or rank < split  # module doc: a placement's trainer ranks come first
        self.generates = split is None or not self.trains
        self.train_world = split or world_size  # the ranks of the gradient all-reduce
        self._servers: dict[str, Any] = {}  # base model -> the uvicorn server of its app
        self._server_urls: dict[str, str] = {}
        self._server_tasks: list[asyncio.Task] = []
        self._cores: dict[str, tuple[Any, Any]] = {}  # base model -> (its EngineCoreServer, the thread running it)
        # run -> (step, the copy its publication writes and serves, seconds it took): taken right after the update
        self._snapshots: dict[str, tuple[int, Any, float]] = {}
        self._sweeps: dict[str, asyncio.Future] = {}  # run -> the removal of the checkpoints its retention deleted

    # ------------------------------------------------------------------------------ setup
    async def init_process_group(self, init_method: str, timeout_s: float) -> dict[str, Any]:
        """Join the data-parallel group: NCCL when this rank's device is a GPU, else gloo. A collective
        waiting longer than `timeout_s` for a rank (a dead one) raises instead of hanging."""
        import torch
        import torch.distributed as dist

        if self.train_world == 1 or not self.trains:  # nothing to sum over, or a generator (it sums nothing)
            return {"rank": self.rank, "backend": None, "host": socket.gethostname()}
        device = torch.device(self.device) if self.device else torch.device("cpu")
        backend = "nccl" if device.type == "cuda" else "gloo"

        def init() -> None:
            if device.type == "cuda":
                torch.cuda.set_device(device)  # on the compute thread, where the CUDA work runs
            dist.init_process_group(backend, init_method=init_method, rank=self.rank, world_size=self.train_world,
                                    timeout=timedelta(seconds=timeout_s),
                                    device_id=device if device.type == "cuda" else None)

        await compute_thread().run(init)
        self.process_group = dist.group.WORLD
        return {"rank": self.rank, "backend": backend, "host": socket.gethostname()}

    # ------------------------------------------------------------------------------ models
    async def load(self, spec: ModelSpec) -> dict[str, Any]:
        """Load (or resume) a model; returns its step, the cursor and path of the checkpoint resumed
        from, (when serving over HTTP) the base URL of its app, and (rank 0) the tokenizer."""
        async with self._loading:
            return await self._load(spec)

    async def _load(self, spec: ModelSpec) -> dict[str, Any]:
        if spec.name in self.replicas:
            raise ConfigError(f"model {spec.name!r} is already loaded on rank {self.rank}", what="model name")
        o = self.options
        compute = compute_thread()
        base = self.bases.get(spec.base_model)
        if base is None:
            base = await compute.run(
                SharedBase, spec.base_model, spec.lora, device=self.device, dtype=o.dtype,
                max_batch_size=o.max_batch_size, engine_kwargs=o.engine_kwargs, api_key=o.api_key,
                load_model=o.load_model, memory_budget_gb=o.memory_budget_gb,
            )
            self.bases[spec.base_model] = base
            self._update_locks[spec.base_model] = asyncio.Lock()
        try:
            # its adapter joins the shared model's modules: not while another run's update runs beside the engine
            async with self._update_locks[spec.base_model]:
                replica = await compute.run(Replica, spec.name, base, spec.lora, process_group=self.process_group,
                                            trains=self.trains, short_name=spec.short_name)
        except BaseException:
            if not base.models:
                await self._close_base(spec.base_model)
            raise
        self.replicas[spec.name], self.specs[spec.name] = replica, spec
        # Every rank loads the same checkpoint files: the same adapter, optimizer and RNG everywhere.
        try:
            await compute.run(replica.reserve_slots, spec.reserve_slots)
            state = await compute.run(replica.resume, spec.checkpoints_dir)
        except BaseException:
            await self._unload(spec.name)
            raise
        info: dict[str, Any] = {
            "rank": self.rank, "step": state.step if state else 0, "cursor": dict(state.cursor) if state else {},
            "checkpoint_path": str(state.path) if state else None,
            "metrics": dict(state.metrics) if state else {}, "history": list(state.history) if state else [],
            "fingerprint": await compute.run(replica.adapter_fingerprint), "url": None,
            "served_fingerprint": (await compute.run(replica.served_fingerprint, state.step)
                                   if state is not None and state.step > 0 else None),
            # the driver tokenises the steps' batches with the same tokenizer (it may not reach the model files)
            "tokenizer": replica.tokenizer if self.rank == 0 else None,
            # the rows of the embedding: a sampled id at or past it cannot be trained (tokenize.py)
            "vocab_size": replica.peft_model.get_input_embeddings().num_embeddings,
        }
        if o.engine_core and self.generates:
            info["core"] = self._serve_core(spec.base_model, base)
        elif o.serve_http and self.generates:  # a trainer of a placement gets no rollouts
            info["url"] = await self._serve_http(spec.base_model, replica.app)
        await compute.run(freeze_loaded)  # the rollouts' garbage no longer walks the model (runtime/memory.py)
        return info

    async def unload(self, name: str) -> None:
        """Drop model `name` (its adapter, served steps and optimizer); the base, its engine and its server
        stay while another model uses them."""
        async with self._loading:
            await self._unload(name)

    async def _unload(self, name: str) -> None:
        replica = self.replicas.pop(name, None)
        self.specs.pop(name, None)
        self._snapshots.pop(name, None)
        if (sweep := self._sweeps.pop(name, None)) is not None:
            await sweep
        if replica is None:
            return
        thaw_loaded()  # its cycles collectable again; what the other models hold is frozen again below
        async with self._update_locks[replica.base.base_model]:  # not in the middle of another model's update
            empty = await compute_thread().run(replica.close)
        if empty:
            await self._close_base(replica.base.base_model)
        del replica
        if self.replicas:
            await compute_thread().run(freeze_loaded)

    async def _close_base(self, base_model: str) -> None:
        base = self.bases.pop(base_model)
        self._update_locks.pop(base_model, None)
        server = self._servers.pop(base_model, None)
        if server is not None:
            server.should_exit = True
        self._stop_core(base_model)
        base.close()

    def _serve_core(self, base_model: str, base: SharedBase) -> str:
        """Serve `base`'s engine to frontends in other processes (WorkerOptions.engine_core), once per base:
        an `EngineCoreServer` on a fresh ipc:// address, its I/O on a thread of its own, while the engine
        steps on the compute thread as before (the trainer's pause holds it exactly as for the app's
        requests) and this rank's adapters are loaded on it directly (the frontends learn of them from
        the core). Returns the address. The core stops when its owner, the driver, is gone."""
        import os
        import threading

        from groupwise.inference.engine_client import new_core_address
        from groupwise.inference.engine_core import EngineCoreServer

        if base_model not in self._cores:
            server = EngineCoreServer(base.engine, new_core_address(), owner_pid=os.getppid())
            thread = threading.Thread(target=server.run, name=f"groupwise-core-{self.rank}", daemon=True)
            thread.start()
            self._cores[base_model] = (server, thread)
        return self._cores[base_model][0].address

    def _stop_core(self, base_model: str) -> None:
        core = self._cores.pop(base_model, None)
        if core is not None:
            core[0].stop()
            core[1].join(timeout=10)

    async def served_state(self) -> dict[str, Any]:
        """What the driver's frontends mirror (backend/frontends.py): each base's core address and what
        the registry serves of each model (`ModelRegistry.model_state`), by the model's run name."""
        return {"cores": {b: server.address for b, (server, _) in self._cores.items()},
                "runs": {name: (r.base.base_model, r.registry.model_state(name)) for name, r in self.replicas.items()}}

    async def _serve_http(self, base_model: str, app: Any) -> str:
        """Serve `app` (one per base model: it serves every model of that base) with uvicorn on a free port
        of `http_host`, once; returns its ``/v1`` base URL."""
        import uvicorn

        if base_model in self._servers:
            return self._server_urls[base_model]

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.options.http_host, 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=30))
        self._servers[base_model] = server
        self._server_tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
        while not server.started:
            await asyncio.sleep(0.01)
        self._server_urls[base_model] = f"http://{self.options.http_host}:{port}/v1"
        return self._server_urls[base_model]

    def app(self, name: str) -> Any:
        """The replica's app (in-process use: the driver reaches it through an ASGI transport)."""
        return self.replicas[name].app

    # ------------------------------------------------------------------------------ training
    async def update(self, command: UpdateCommand) -> list[dict[str, float]]:
        """The command's optimizer updates on this rank's share, with exclusive use of the shared model.
        Returns each update's metrics (the loss terms and counts summed over the ranks). Updates of other
        runs of the same base that wait at the same time may train with it in one pass (`JointUpdates`)."""
        replica = self.replicas[command.run]
        base = replica.base.base_model
        lock = self._update_locks[base]
        if self._may_join(replica, command):
            joint = self._joint.get(base)
            if joint is None:
                from groupwise.backend.joint_updates import JointUpdates  # torch: loaded where updates run

                joint = self._joint[base] = JointUpdates(self, base)
            return await joint.update(command, lock)
        async with lock:
            return await self.update_alone(command)

    def _may_join(self, replica: Replica, command: UpdateCommand) -> bool:
        if not (self.options.joint_updates and self.trains and self.train_world == 1 and len(command.updates) == 1):
            return False
        if (self.options.engine_kwargs or {}).get("batch_invariant"):
            return False  # a run's numbers would depend on which runs joined its pass
        joint = self._joint.get(replica.base.base_model)
        if joint is not None and joint.refused is not None:
            return False  # this model cannot join (JointUpdates.refused says why)
        from groupwise.training.joint import JointPart, joint_problem

        u = command.updates[0]
        return joint_problem(JointPart(replica.trainer, u.batch, u.config), u.objective, 1) is None

    def runs_of(self, base_model: str) -> list[str]:
        """The runs this rank trains on `base_model`."""
        return [name for name, r in self.replicas.items() if r.base.base_model == base_model]

    @staticmethod
    def update_pause(replica: Replica, updates: Any) -> Any:
        """The engine's pause for `updates`.

        The engine runs no forward pass while the trainer runs, except, on CUDA, replays of its decode graphs
        (Engine.paused(decoding=True)), which run no module code: the other runs' requests go on decoding, and
        the update runs on a thread of its own. A step that first reads a KL anchor or a teacher pauses the
        engine whole: those load adapters and models."""
        decoding = (replica.device.type == "cuda" and getattr(replica.engine, "decode_during_updates", False)
                    and not any(u.objective == "grpo" and (u.config.kl_coef > 0 or u.config.teacher is not None)
                                for u in updates))
        return replica.engine.paused(decoding=True) if decoding else replica.engine.paused()

    async def update_alone(self, command: UpdateCommand) -> list[dict[str, float]]:
        """`update` of one run, by itself (the caller holds the base's update lock)."""
        from groupwise.training.finite import restore, snapshot

        replica, spec = self.replicas[command.run], self.specs[command.run]
        updates, step = command.updates, command.step
        trainer = replica.trainer
        compute = compute_thread()
        out = []
        # A step of several updates (SFT batches) is one unit: if a later update fails (a non-finite loss),
        # the earlier ones are undone too, so the trainer holds the adapter of the last checkpoint again.
        before = None
        if len(updates) > 1:
            before = await compute.run(lambda: snapshot([p for _, p in trainer.trainable_named_parameters()],
                                                        trainer.optimizer))
        self._snapshots.pop(command.run, None)
        pause = self.update_pause(replica, updates)
        async with pause:
            runs_update, train_step = self.update_runner(replica, pause, trainer.train_step)
            try:
                for u in updates:
                    if u.objective == "grpo" and u.config.kl_coef > 0:  # the anchor it names
                        await compute.run(replica.use_kl_reference, spec.checkpoints_dir, u.config.kl_reference_step)
                    if u.objective == "grpo" and u.config.teacher is not None:
                        await compute.run(replica.use_teacher, u.config.teacher)
                    with update_bar(step, enabled=self.rank == 0) as progress:
                        out.append(await runs_update.run(train_step, u.batch, u.config, step=step,
                                                         objective=u.objective, progress=progress))
            except Exception:
                if before is not None and out:
                    await compute.run(lambda: restore(trainer.trainable_named_parameters(), trainer.optimizer, before))
                raise
            await self.keep_snapshot(command.run, pause, step + 1)
        del updates, command
        if replica.device.type == "cpu":
            release_freed_memory()  # else RSS grows by GBs a step (memory.py)
        return out

    async def keep_snapshot(self, run: str, pause: Any, step: int) -> None:
        """The copy of `run`'s adapter that its publication of `step` writes and serves, taken on the thread
        that ran the update, right after it, before the next run's update starts.

        Taken at the publication instead, it ran on the compute thread beside the next run's update, and
        each slowed the other (on an H100 a 10-17 ms copy took 30-157 ms beside an update); here it costs
        its own time once, and a lockstep step's four updates took 2.13 s against 2.53 s over three steps
        (docs/benchmarks.md, "Several runs on one GPU"). The trainer holds the same weights until the
        publication: the run's lock keeps its next update out, and no other run's update touches its
        adapter. A copy that fails (a non-finite adapter) is taken again at the publication, which raises
        where a failed publication is handled (the step's checkpoint is then missing)."""
        if not self.trains:
            return
        replica = self.replicas[run]
        runner, copy = self.update_runner(replica, pause, self.copy_for_publication(replica, step))
        t0 = time.perf_counter()
        try:
            taken = await runner.run(copy)
        except Exception:  # noqa: BLE001 - raised again by the publication (docstring)
            return
        self._snapshots[run] = (step, taken, time.perf_counter() - t0)

    def copy_for_publication(self, replica: Replica, step: int) -> Callable[[], Any]:
        """What this trainer rank's publication of `step` needs from the trainer, as a call: rank 0 the
        checkpoint's snapshot (it writes and serves it), a rank > 0 the adapter's tensors and config (it
        serves its own copy)."""
        return functools.partial(replica.snapshot, step) if self.rank == 0 else replica.adapter_snapshot

    def take_snapshot(self, run: str, step: int) -> tuple[Any, float] | None:
        """(the copy `keep_snapshot` took for `run`'s publication of `step`, its seconds), once; else None."""
        kept = self._snapshots.pop(run, None)
        return (kept[1], kept[2]) if kept is not None and kept[0] == step else None

    def update_bar(self, step: int) -> Any:
        """The progress bar of an update of step `step` (rank 0's only)."""
        return update_bar(step, enabled=self.rank == 0)

    @staticmethod
    def update_runner(replica: Replica, pause: Any, fn: Callable[..., Any]) -> tuple[Any, Callable[..., Any]]:
        """(the thread an update runs on, `fn` as it must be called there): the compute thread, or, while the
        engine goes on decoding (`update_pause`), a thread of its own on the replica's CUDA device."""
        if getattr(pause, "decoding", False):  # an idle engine whose memory the update wants pauses whole
            return update_thread(), functools.partial(_on_cuda_device, replica.device, fn)
        return compute_thread(), fn

    async def publish(self, command: PublishCommand) -> Published:
        """The adapter's publication after the updates of the command's step, in one call: rank 0
        checkpoints (with the step's `history` rows), every rank serves its own copy of the new adapter and
        checks it, then applies the step's retention (`command.retain`). Returns the checkpoint path (rank
        0), the adapter's fingerprint and that of the served copy (the driver compares them), and the
        checkpoints retention deleted.

        A rank that only generates is called after the trainers, with rank 0's `checkpoint_path`: it
        serves that folder's adapter (module doc). A failed check raises before retention: a step whose
        adapter this rank could not serve leaves the steps it served and the checkpoints on disk as they were."""
        replica, spec = self.replicas[command.run], self.specs[command.run]
        step = command.step
        compute = compute_thread()
        times: dict[str, float] = {}  # seconds of each part, for the step's metrics (Published.times)

        @contextlib.contextmanager
        def timed(part: str) -> Iterator[None]:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                times[part] = times.get(part, 0.0) + time.perf_counter() - t0

        if not self.trains:
            if command.checkpoint_path is None:
                raise ConfigError(f"rank {self.rank} only generates: publish it with the trainers' checkpoint_path",
                                  what="publish arguments")
            with timed("serve"):
                await compute.run(replica.serve, step, command.checkpoint_path)
            if self.options.verify_adapter:
                with timed("check"):
                    replica.check_answers(step)
            published = Published(self.rank, served_fingerprint=await compute.run(replica.served_fingerprint, step),
                                  times=times)
        else:
            writing: asyncio.Future | None = None
            # the copy taken right after the update (`keep_snapshot`), reported as the publication's first
            # part though its time was the update's; else (a step without an update) taken here
            kept = self.take_snapshot(command.run, step)
            if kept is not None:
                copy, times["snapshot"] = kept
            else:
                with timed("snapshot"):
                    copy = await compute.run(self.copy_for_publication(replica, step))
            if self.rank == 0:
                snap = copy

                def write() -> Path:
                    with timed("write"):
                        return replica.write(spec.checkpoints_dir, snap, command.metrics, command.cursor,
                                             list(command.history))

                # The files are serialised, hashed and written on another thread: meanwhile the compute
                # thread serves and checks the same snapshot, and steps the engine for the other runs'
                # rollouts (compute.py). The publication ends with the write, so a step that returned has
                # its checkpoint on disk, and one whose check fails leaves it there as it would have before.
                writing = asyncio.ensure_future(asyncio.to_thread(write))
                tensors, config = snap.adapter, snap.adapter_config
            else:  # a rank > 0 serves its own copy of the same adapter (the ranks' fingerprints are compared)
                tensors, config = copy
            try:
                # served from the snapshot the checkpoint is written from, without reading the files back
                with timed("serve"):
                    await compute.run(replica.serve, step, None, tensors, config)
                if self.options.verify_adapter:
                    with timed("check"):
                        await compute.run(replica.check_adapter, step)
                        replica.check_answers(step)
            except BaseException:  # the check's error is raised, once the write is done (as it was before)
                if writing is not None and (error := await error_of(writing)) is not None:
                    log.error("%s: step %d's checkpoint was not written either: %r", command.run, step, error)
                raise
            try:
                path = await writing if writing is not None else None
            except BaseException:
                # served already, but no checkpoint holds it: the run is loaded again from the last one
                await compute.run(replica.unserve, step)
                raise
            published = Published(self.rank, checkpoint_path=str(path) if self.rank == 0 else None,
                                  # compared between trainer ranks: one rank has nothing to compare with
                                  fingerprint=(await compute.run(replica.adapter_fingerprint)
                                               if self.train_world > 1 else None),
                                  # with generators, the driver checks they serve the bits rank 0 serves
                                  served_fingerprint=(await compute.run(replica.served_fingerprint, step)
                                                      if self.options.train_workers is not None else None),
                                  times=times)
        if refreeze_wanted():  # what the step compiled or imported is walked by no further full collection
            await compute.run(freeze_loaded)
        if command.retain is None:
            return published
        return replace(published, deleted=tuple(await self.retain(command.retain)))

    # ------------------------------------------------------------------------------ serving and retention
    async def serve_step(self, name: str, step: int) -> None:
        replica, spec = self.replicas[name], self.specs[name]
        await compute_thread().run(replica.serve_checkpoint, spec.checkpoints_dir, step)

    async def retain(self, command: RetainCommand) -> list[int]:
        """Serve only the last `served_steps` steps; unless `best_metric` is None, rank 0 deletes the
        checkpoints that are neither the latest nor the best (`keep` when the caller named it, else the
        best by `best_metric`) nor `in_use` (a KL reference). Returns the deleted steps."""
        from groupwise.training.checkpoint import prune_checkpoints

        c = command
        replica, spec = self.replicas[c.run], self.specs[c.run]
        await compute_thread().run(replica.unserve_before, c.step, c.served_steps, c.in_use)
        if self.rank != 0 or c.best_metric is None:  # None: every checkpoint is kept
            return []
        # the step the caller named is one of the top: the metric ranks the others
        # reading the checkpoints' states takes a disk's time: not on the event loop, which serves the other
        # runs' requests meanwhile. The deleted folders are only renamed here; their files are removed
        # after the publication returns (`sweep`), off the step's path.
        deleted = await asyncio.to_thread(
            prune_checkpoints, spec.checkpoints_dir, best_metric=c.best_metric, maximize=c.maximize,
            metrics_by_step=c.metrics_by_step, keep=c.in_use, named_best=c.keep, keep_recent=c.keep_recent,
            keep_top=c.keep_top, sweep=False)
        if deleted:
            self.sweep(c.run, spec.checkpoints_dir)
        return deleted

    def sweep(self, run: str, checkpoints_dir: str | Path) -> None:
        """Remove the files of the checkpoints `run`'s retention deleted, on a thread, after any earlier
        removal of the same folder; `close` and `unload` wait for it."""
        from groupwise.training.checkpoint import sweep_deleted

        earlier = self._sweeps.get(run)

        async def sweep() -> None:
            if earlier is not None:
                await earlier
            await asyncio.to_thread(sweep_deleted, checkpoints_dir)

        self._sweeps[run] = asyncio.ensure_future(sweep())

    async def prune(self, command: PruneCommand) -> list[int]:
        """Rank 0 deletes every checkpoint but the latest, the best by `command.best_metric` and those
        `in_use`; nothing is unserved. Returns the deleted steps."""
        from groupwise.training.checkpoint import prune_checkpoints

        if self.rank != 0:
            return []
        return await asyncio.to_thread(  # off the event loop, as `retain` deletes
            prune_checkpoints, self.specs[command.run].checkpoints_dir, best_metric=command.best_metric,
            metrics_by_step=command.metrics_by_step, keep=command.in_use)

    async def served_steps(self, name: str) -> list[int]:
        return self.replicas[name].served_steps()

    async def served_tensors(self, name: str, step: int) -> dict[str, Any]:
        """CPU copies of the adapter this rank's engine serves as ``name@step``, by the trainer's names."""
        return await compute_thread().run(self.replicas[name].served_tensors, step)

    async def state_tensors(self, name: str) -> dict[str, Any]:
        """What a resume must restore, as CPU tensors: the adapter, the optimizer state, the torch RNG."""
        import torch

        from groupwise.training.checkpoint import optimizer_to_tensors

        def collect() -> dict[str, Any]:
            trainer = self.replicas[name].trainer
            named = trainer.trainable_named_parameters()
            optimizer = optimizer_to_tensors(trainer.optimizer, [n for n, _ in named])[0] if trainer.optimizer else {}
            return {"adapter": {n: p.detach().cpu().clone() for n, p in named}, "optimizer": optimizer,
                    "rng": torch.get_rng_state()}

        return await compute_thread().run(collect)

    # ------------------------------------------------------------------------------ shutdown
    async def close(self) -> None:
        thaw_loaded()
        if self._sweeps:  # a deleted checkpoint's files are removed before the process ends
            await asyncio.gather(*self._sweeps.values(), return_exceptions=True)
            self._sweeps.clear()
        for server in self._servers.values():
            server.should_exit = True
        for base_model in list(self._cores):
            self._stop_core(base_model)
        if self._server_tasks:
            await asyncio.wait(self._server_tasks, timeout=5)
        self.replicas.clear()
        self.specs.clear()
        for base in self.bases.values():
            base.close()
        self.bases.clear()
        if self.process_group is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self.process_group = None

    def ping(self) -> int:
        return self.rank

    async def engine_stats(self) -> dict[str, float]:
        """What this rank's engines did so far (`EngineStats`, summed over its bases), for benchmarks of a
        backend whose engines are in worker processes."""
        import dataclasses

        out: dict[str, float] = {}
        for base in self.bases.values():
            for k, v in dataclasses.asdict(base.engine.stats).items():
                out[k] = max(out.get(k, 0), v) if k.startswith("max_") else out.get(k, 0) + v
        return out

    async def peak_memory(self) -> dict[str, float]:
        """This rank's memory peaks so far, in GiB: its device's allocator (CUDA; NaN elsewhere) and its
        process's resident set (Linux), for benchmarks of a backend whose model is in a worker process."""
        import resource

        import torch

        device = self.device or ""
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")
        return {"device_gb": peak, "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def _on_cuda_device(device: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """fn with `device` as the thread's current CUDA device: a thread starts on device 0, and the
    trainer's collectives and any tensor made on plain "cuda" follow the current device."""
    import torch

    with torch.cuda.device(device):
        return fn(*args, **kwargs)
