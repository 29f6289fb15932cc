"""`RayBackend`: the data-parallel workers of `LocalBackend(devices=...)`, placed on a Ray cluster.

    import ray
    ray.init(address="auto")                      # or let RayBackend connect / start one
    backend = gw.RayBackend(num_workers=8)         # 8 GPUs, wherever the cluster has them
    await model.register(backend)                  # the rest of the script is unchanged

Ray does the placing only: a placement group reserves one bundle per worker (a GPU and some CPUs, or
CPUs alone), each `DeviceWorker` (backend/worker.py) becomes an actor pinned to its bundle, and the actors
form a torch.distributed group (NCCL on GPUs, gloo on CPUs) whose rendezvous is rank 0's node. The
gradient all-reduce runs in that group, not through Ray. Each actor serves its replica's OpenAI app
over HTTP on its node's address, behind a per-run API key; the driver's client spreads rollout requests
over them (backend/routing.py), so the driver needs no GPU. Driver -> worker commands are actor method
calls; an actor that dies surfaces as a `WorkerError` naming its rank.

Every node needs groupwise (with the backend extra) installed, and the run's base_path must be on a
filesystem every node sees: rank 0 writes the checkpoints there and every rank resumes from them.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from groupwise.backend.base import InferenceEndpoint
from groupwise.backend.driver import DEFAULT_PATH, WorkerBackend, WorkerError
from groupwise.backend.options import BackendOptions, spell_out_options
from groupwise.backend.worker import DeviceWorker
from groupwise.core.validated import check_positive
from groupwise.errors import MissingDependencyError

__all__ = ["RayBackend"]


class _RayWorker(DeviceWorker):
    """A `DeviceWorker` that can say where its node is (for the rendezvous and its servers)."""

    async def node_address(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    async def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    async def free_port(self) -> int:
        import socket

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    async def set_http_host(self, host: str) -> None:
        self.options.http_host = host


class RayBackend(WorkerBackend):
    """Serve and train `TrainableModel`s data-parallel on Ray workers (module doc).

    Args:
        path: as for `LocalBackend`.
        num_workers: data-parallel ranks (one engine replica and trainer rank each), or trainers and
            generators together with `train_workers`.
        use_gpu: one GPU per worker (NCCL); False runs the workers on CPUs (gloo).
        cpus_per_worker: CPUs each worker's bundle reserves.
        placement_strategy: Ray's placement group strategy: "PACK" (few nodes), "SPREAD",
            "STRICT_PACK" (one node) or "STRICT_SPREAD" (one worker per node).
        address: the cluster `ray.init` connects to when Ray is not initialised yet (None: Ray's
            default, which starts a local one when no cluster runs).
        ready_timeout_s: how long to wait for the cluster to grant the placement group.
        options: the settings every worker backend shares (`gw.BackendOptions`: dtype, lora,
            max_batch_size, served_steps, best_checkpoint_metric, verify_adapter, engine_kwargs,
            load_model, collective_timeout_s, train_workers), as keywords or whole (``options=``), as for
            `LocalBackend`. With `train_workers=k` the first k workers only train, the others only generate.
    """

    @spell_out_options
    def __init__(
        self,
        path: str = DEFAULT_PATH,
        *,
        num_workers: int = 1,
        use_gpu: bool = True,
        cpus_per_worker: float = 1.0,
        placement_strategy: str = "PACK",
        address: str | None = None,
        ready_timeout_s: float = 600.0,
        options: BackendOptions | None = None,
        **option_values: Any,
    ) -> None:
        problems: list[str] = []
        check_positive(problems, "ready_timeout_s", ready_timeout_s)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            problems.append(f"num_workers={num_workers!r} must be an int >= 1")
        if placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            problems.append(f"placement_strategy={placement_strategy!r} must be PACK, SPREAD, STRICT_PACK or STRICT_SPREAD")
        options = BackendOptions.from_arguments(
            options, option_values, what="RayBackend arguments", problems=problems, workers_arg="num_workers",
            workers=num_workers if isinstance(num_workers, int) and not isinstance(num_workers, bool) else 1)
        super().__init__(path, options)
        self.num_workers = num_workers
        self.use_gpu = use_gpu
        self.cpus_per_worker = cpus_per_worker
        self.placement_strategy = placement_strategy
        self.address = address
        self.ready_timeout_s = ready_timeout_s
        self._actors: list[Any] = []
        self._placement_group: Any = None
        self._api_key = secrets.token_urlsafe(24)
        self._failure: WorkerError | None = None

    @property
    def world_size(self) -> int:
        return self.num_workers

    async def _start(self) -> None:
        try:
            import ray
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError as exc:
            raise MissingDependencyError("RayBackend", "ray", "ray") from exc
        if not ray.is_initialized():
            ray.init(address=self.address, ignore_reinit_error=True, log_to_driver=True)
        bundle = {"CPU": self.cpus_per_worker, **({"GPU": 1} if self.use_gpu else {})}
        self._placement_group = placement_group([dict(bundle) for _ in range(self.num_workers)],
                                                strategy=self.placement_strategy)
        try:
            await asyncio.wait_for(self._placement_group.ready(), timeout=self.ready_timeout_s)
        except asyncio.TimeoutError as exc:
            raise WorkerError(
                f"the Ray cluster did not grant {self.num_workers} bundle(s) of {bundle} ({self.placement_strategy}) "
                f"within {self.ready_timeout_s:.0f} s; available: {ray.available_resources()}. Add nodes, lower "
                "num_workers or cpus_per_worker, or change placement_strategy."
            ) from exc
        remote = ray.remote(_RayWorker)
        device = "cuda:0" if self.use_gpu else "cpu"  # Ray makes the bundle's GPU the actor's only visible one
        for rank in range(self.num_workers):
            strategy = PlacementGroupSchedulingStrategy(self._placement_group, placement_group_bundle_index=rank)
            actor = remote.options(num_cpus=self.cpus_per_worker, num_gpus=1 if self.use_gpu else 0,
                                   scheduling_strategy=strategy, max_concurrency=64).remote(
                rank, self.num_workers, device, self._worker_options(serve_http=True, api_key=self._api_key))
            self._actors.append(actor)
        hosts = await self._call_all("node_address")
        await self._call("set_http_host", [{"host": h} for h in hosts])  # each serves on its node's address
        port = (await self._call_all("free_port"))[0]
        init = f"tcp://{hosts[0]}:{port}"  # the rendezvous: rank 0's node
        await self._call_all("init_process_group", init_method=init, timeout_s=self.options.collective_timeout_s)

    async def _call(self, method: str, kwargs: "list[dict[str, Any] | None]") -> list[Any]:
        """Every rank's actor method at once (a rank whose kwargs are None is not called). An actor that dies fails the call at once; after one rank
        raised, the others get a grace of `collective_timeout_s` (30 s at most; they may wait in a
        collective for the rank that failed), then every worker is stopped."""
        import ray

        if self._failure is not None:
            raise self._failure

        async def result(ref: Any) -> Any:
            return await ref

        tasks = {asyncio.ensure_future(result(getattr(actor, method).remote(**kw))): rank
                 for rank, (actor, kw) in enumerate(zip(self._actors, kwargs)) if kw is not None}
        results: list[Any] = [None] * len(self._actors)
        errors: list[BaseException] = []
        pending = set(tasks)
        while pending:
            grace = min(self.options.collective_timeout_s, 30.0) if errors else None
            done, pending = await asyncio.wait(pending, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
            if not done:  # the grace after an error ran out
                silent = sorted(tasks[t] for t in pending)
                self._failure = WorkerError(
                    f"rank(s) {silent} did not finish {method!r} after another rank failed; every worker was stopped. "
                    "Create the backend again to resume from the last checkpoint.")
                self._kill_all()
                raise self._failure from errors[0]
            for task in done:
                rank = tasks[task]
                try:
                    results[rank] = task.result()
                except ray.exceptions.RayActorError as exc:
                    self._failure = WorkerError(
                        f"Ray worker rank {rank} died during {method!r} ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:300]}). The other workers were stopped. The run's last complete "
                        "checkpoint is intact: create the backend again and register the model to resume from it."
                    )
                    self._kill_all()
                    raise self._failure from exc
                except ray.exceptions.RayTaskError as exc:
                    errors.append(exc.as_instanceof_cause())
        if errors:
            raise errors[0]
        return results

    def check_alive(self) -> None:
        """Raise the WorkerError of an actor that died (called when a replica cannot be reached)."""
        import ray

        if self._failure is not None:
            raise self._failure
        for rank, actor in enumerate(self._actors):
            try:
                ray.get(actor.ping.remote(), timeout=30)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                self._failure = WorkerError(f"Ray worker rank {rank} is not answering ({type(exc).__name__}); "
                                            "create the backend again to resume from the last checkpoint.")
                self._kill_all()
                raise self._failure from exc

    def _endpoint(self, name: str, urls: list[str | None]) -> InferenceEndpoint:
        from groupwise.backend.routing import routed_endpoint

        return routed_endpoint([u for u in urls if u], api_key=self._api_key, alive=self.check_alive)

    def _kill_all(self) -> None:
        import ray

        for actor in self._actors:
            ray.kill(actor, no_restart=True)

    async def _stop(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        self._kill_all()
        self._actors = []
        if self._placement_group is not None:
            remove_placement_group(self._placement_group)
            self._placement_group = None

    @property
    def actors(self) -> list[Any]:
        """The workers' Ray actor handles, by rank."""
        return list(self._actors)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "num_workers": self.num_workers, "use_gpu": self.use_gpu,
                "placement_strategy": self.placement_strategy}
