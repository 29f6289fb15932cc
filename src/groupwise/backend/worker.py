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
each base's engine as an engine core whose app runs in the driver's process (backend/frontends.py). Rank 0 writes the checkpoints
(`Publications`, backend/publication.py, publishes and retains for the worker);
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from groupwise.errors import ConfigError
from groupwise.runtime.memory import freeze_loaded, refreeze_wanted, release_freed_memory, thaw_loaded
from groupwise.backend.protocol import PruneCommand, Published, PublishCommand, RetainCommand, UpdateCommand
from groupwise.backend.publication import Publications
from groupwise.backend.replica import Replica, SharedBase
from groupwise.runtime.compute import compute_thread, update_thread
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
        self.publications = Publications(rank, self.trains, self.train_world, options.verify_adapter,
                                         with_generators=options.train_workers is not None)

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
        await self.publications.forget(name)
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
        self.publications.drop(command.run)
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
        """Keep `run`'s copy for its publication of `step`, taken on the thread that ran the update, right
        after it, before the next run's update starts (`Publications.keep` says why)."""
        replica = self.replicas[run]

        async def on_update_thread(copy: Callable[[], Any]) -> Any:
            runner, fn = self.update_runner(replica, pause, copy)
            return await runner.run(fn)

        await self.publications.keep(run, step, on_update_thread, replica)

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
        """The adapter's publication after the updates of the command's step (`Publications.publish`),
        then the step's retention (`command.retain`), in one call."""
        published = await self.publications.publish(self.replicas[command.run], self.specs[command.run].checkpoints_dir,
                                                    command)
        if refreeze_wanted():  # what the step compiled or imported is walked by no further full collection
            await compute_thread().run(freeze_loaded)
        if command.retain is None:
            return published
        return replace(published, deleted=tuple(await self.retain(command.retain)))

    # ------------------------------------------------------------------------------ serving and retention
    async def serve_step(self, name: str, step: int) -> None:
        replica, spec = self.replicas[name], self.specs[name]
        await compute_thread().run(replica.serve_checkpoint, spec.checkpoints_dir, step)

    async def retain(self, command: RetainCommand) -> list[int]:
        """`Publications.retain` for the command's run: the steps served, the checkpoints kept."""
        return await self.publications.retain(self.replicas[command.run], self.specs[command.run].checkpoints_dir,
                                              command)

    async def prune(self, command: PruneCommand) -> list[int]:
        """`Publications.prune`: ART's on-request deletion of the run's checkpoints."""
        return await self.publications.prune(self.specs[command.run].checkpoints_dir, command)

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
        await self.publications.close()
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
