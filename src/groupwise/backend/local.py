"""`LocalBackend`: serve and train on this machine, on one device or data-parallel on several.

    model = gw.TrainableModel(name="agent-001", project="2048", base_model="smollm2-135m")
    await model.register(gw.LocalBackend(lora=gw.LoraConfig(rank=8)))                  # one device
    await model.register(gw.LocalBackend(devices=["cuda:0", "cuda:1", "cuda:2", "cuda:3"]))  # four GPUs
    await model.train(groups, config=gw.TrainConfig(learning_rate=1e-5))

One device: the model lives in this process (a `DeviceWorker`, backend/worker.py): the base model wrapped with
peft, an inference `Engine` over that same object (one copy of the base weights), a `ModelRegistry` +
FastAPI app (the app `groupwise serve` exposes; reached in process through an httpx ASGI transport),
and a `Trainer` with the AdamW state. The same registry is also served over real HTTP on loopback
(uvicorn in a thread, a free port, a generated API key), so code that hands `model.inference_base_url`
and `model.inference_api_key` to another client (curl, litellm, LangGraph, the OpenAI Agents SDK)
reaches the model; `model.openai_client()` keeps the in-process path, which skips the socket. After
step k the adapter is saved to ``checkpoints/<k>/`` and served as ``name@k`` and as ``name`` (latest).

Several devices (``devices=[...]``): one worker process per device, each holding the base weights, an
engine replica and a trainer rank of a torch.distributed group (backend/processes.py); gradients are
summed over the ranks every step, so every rank holds the same adapter; rollout requests from the one
client spread over the replicas, a group's requests on one replica (backend/routing.py). The user's
script does not change beyond the `devices` argument. Every worker serves its replica over loopback HTTP
behind a per-run API key; `model.inference_base_url` is rank 0's server.

``engine_process="separate"`` (one device or several): each worker process holds its device's model,
engine and trainer as above, but serves its engine as an engine core over a ZeroMQ socket (no HTTP
there), and this process runs every rollout request's Python over it: the app `groupwise serve
--engine-process separate` builds, reached in process (backend/frontends.py says what crosses).

Several runs on one device, each from a process of its own: ``address = await backend.share()`` on a
backend with ``engine_process="separate"``, and ``LocalBackend(join=address)`` in the other processes. Each
joining process registers its models on the sharing worker (one base, one engine, one device) and runs
their requests' Python itself, in parallel with the others (backend/sharing.py).

``devices=4, train_workers=1``: the first device only trains, the other three only generate, loading
each new adapter from the checkpoint (backend/worker.py); rollouts go to those three.

The steps of a train step, retention and resume are the driver's (backend/driver.py).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from groupwise.backend.base import InferenceEndpoint
from groupwise.backend.driver import DEFAULT_PATH, ReplicaDivergenceError, WorkerBackend, WorkerError
from groupwise.backend.options import BackendOptions, spell_out_options
from groupwise.backend.replica import API_KEY
from groupwise.core.compat import warn_ignored
from groupwise.config import DEFAULT_BASE_MODEL, DEFAULT_ENGINE_PROCESS, ENGINE_PROCESS_CHOICES, EngineProcess
from groupwise.errors import ConfigError, GroupwiseError
from groupwise.runs.run_id import RunId
from groupwise.runs.store import CHECKPOINTS_DIR, checkpoint_folders, run_dir_of, step_dir_name
from groupwise.runs.s3 import mirror, mirror_dir

if TYPE_CHECKING:
    from groupwise.backend.worker import DeviceWorker
    from groupwise.model import TrainableModel

__all__ = ["LocalAPI", "LocalBackend", "ReplicaDivergenceError", "WorkerError", "API_KEY", "DEFAULT_PATH",
           "engine_process_for"]


def engine_process_for(choice: "EngineProcess | None", *, runs: int, device_type: str | None = None) -> str:
    """What `LocalBackend(engine_process=choice)` runs for `runs` runs on one backend on a `device_type`
    device: a choice other than "auto" as it is; "auto" the separate core for several runs on CUDA (their
    requests' Python off the engine's GIL, 1.13-1.29x faster at four runs on H200s, the same at eight)
    and in process otherwise (one run: 1.13-1.17x faster so; the CPU: always faster so) (the class
    docstring, docs/benchmarks.md)."""
    choice = choice or DEFAULT_ENGINE_PROCESS
    if choice != "auto":
        return choice
    return "separate" if runs > 1 and device_type == "cuda" else "in_process"


def _devices(devices: "int | list[str] | tuple[str, ...] | None") -> list[str] | None:
    if devices is None:
        return None
    if isinstance(devices, int) and not isinstance(devices, bool):
        if devices < 1:
            raise ConfigError([f"devices={devices} must be >= 1 (a number of GPUs) or a list of devices"],
                              what="LocalBackend arguments")
        return [f"cuda:{i}" for i in range(devices)]
    out = [str(d) for d in devices]
    if not out:
        raise ConfigError(["devices=[] names no device; pass e.g. ['cuda:0', 'cuda:1'] or None"],
                          what="LocalBackend arguments")
    return out


class LocalBackend(WorkerBackend):
    """Serve and train `TrainableModel`s on this machine: one device, or data-parallel on several.

    Args:
        path: root of the run store (``<path>/<project>/models/<model>/``) when the model keeps the default
            base_path; a model constructed with its own base_path keeps it.
        device: the one device: "cpu", "cuda", "cuda:1" (default: CUDA when available).
        devices: data-parallel over these devices, one worker process each: a list (``["cuda:0",
            "cuda:1"]``; ``["cpu", "cpu"]`` runs two gloo ranks on the CPU) or a number of GPUs (``4`` =
            cuda:0..3). A one-element list runs the model in one worker process. Give `device` or
            `devices`, not both. With `train_workers=k` (an option below) the first k devices only
            train and the others only generate (docs/scaling.md).
        serve_http: also serve each model over HTTP on 127.0.0.1 (a free port and a generated API key,
            in `model.inference_base_url` / `model.inference_api_key`); False serves in process only
            (with `devices`, the workers serve over loopback HTTP anyway: the router needs it; with
            ``engine_process="separate"`` this process serves the first worker's app on loopback, or nothing).
        options: the settings every worker backend shares (`gw.BackendOptions`: dtype, lora,
            max_batch_size, served_steps, best_checkpoint_metric, verify_adapter, engine_kwargs,
            load_model, collective_timeout_s, train_workers; backend/options.py says what each does); pass them as
            keywords (``LocalBackend(dtype="float32")``) or whole (``options=``), not both. With
            `devices`, `load_model` must be a module-level function of an importable module.
        engine_process: where each engine runs relative to the Python of its rollout requests (HTTP,
            chat template, tokenising, responses). ``"in_process"``: in one process (with one device this
            one, with `devices` each worker serves its app). ``"separate"``: the engine, and the trainer
            sharing its weights, in a worker process of their own per device (one for one device),
            serving as an engine core; this process is their frontend and runs the requests' Python, off
            the GIL of the loop that steps the engine. ``"auto"`` (the default,
            `groupwise.config.DEFAULT_ENGINE_PROCESS`): in process, unless the one who builds the backend
            knows it will hold several runs on CUDA (`engine_process_for`: the sweep job). On the CPU the
            forward passes are the bound and a second process only adds a hop (measured faster in
            process). On H200s (bench/many_runs.py ``--engine-process in_process,separate``,
            docs/benchmarks.md) a run alone stepped 1.13-1.17x slower with the separate core, and several
            runs on one backend 1.13-1.29x faster (four) or the same (eight), at the same peak memory.
        join: the address `share()` returned in another process of this host: this backend's models load on
            that backend's worker (its device, model settings and engine), and this process runs their
            requests' Python and its own driver. `close` drops only this backend's models. The worker's
            settings (device, devices, dtype, max_batch_size, engine_kwargs, load_model, memory_budget_gb,
            train_workers, verify_adapter) are the sharing backend's: giving them here is an error.
        in_process, gpu_cost_per_hour_usd, enable_expert_replay: ART's; accepted (GPU cost and MoE
            replay have no counterpart) and named once in a warning.
    """

    @spell_out_options
    def __init__(
        self,
        path: str | None = DEFAULT_PATH,
        *,
        in_process: bool | None = None,
        gpu_cost_per_hour_usd: float | None = None,
        enable_expert_replay: bool | None = None,
        device: str | None = None,
        devices: "int | list[str] | tuple[str, ...] | None" = None,
        serve_http: bool = True,
        engine_process: EngineProcess | None = None,
        join: str | None = None,
        options: BackendOptions | None = None,
        wandb_entity: str | None = None,
        wandb_project: str | None = None,
        **option_values: Any,
    ) -> None:
        ignored = [k for k, v in (("in_process", in_process is False), ("gpu_cost_per_hour_usd", gpu_cost_per_hour_usd),
                                  ("enable_expert_replay", enable_expert_replay)) if v]
        if ignored:
            warn_ignored("LocalBackend()", ignored, "the engine and trainer run on this machine")
        wandb = [k for k, v in (("wandb_entity", wandb_entity), ("wandb_project", wandb_project)) if v is not None]
        if wandb:  # ART 0.1.1-0.1.9's LocalAPI(wandb_entity=, wandb_project=)
            warn_ignored("LocalBackend()", wandb, "W&B run settings of the backend; as in later ART, each model's "
                         "W&B run is set on the model: Model(entity=...) with its project, logged when WANDB_API_KEY "
                         "(or WANDB_MODE=offline) is set (groupwise.runs.wandb_log)")
        problems: list[str] = []
        if device is not None and devices is not None:
            problems.append(f"device={device!r} and devices={devices!r}: give one (devices for several)")
        parsed = _devices(devices)
        if engine_process is not None and engine_process not in ENGINE_PROCESS_CHOICES:
            problems.append(f"engine_process={engine_process!r} must be one of {list(ENGINE_PROCESS_CHOICES)}")
        options = BackendOptions.from_arguments(options, option_values, what="LocalBackend arguments",
                                                problems=problems, workers=len(parsed) if parsed else None,
                                                workers_arg="devices")
        if join is not None:
            from groupwise.backend.sharing import join_problems

            problems += join_problems(join, device=device, devices=devices, engine_process=engine_process,
                                      options=options)
            if problems:
                raise ConfigError(problems, what="LocalBackend arguments")
        super().__init__(path if path is not None else DEFAULT_PATH, options)
        self.join = join
        self.devices = parsed
        self.device = device if self.devices is None else None
        self._worker: DeviceWorker | None = None  # one device: the worker lives in this process
        self._processes: Any = None  # several (or a separate engine): backend/processes.py's WorkerProcesses
        self.engine_process = "separate" if join is not None else engine_process
        self._frontends: Any = None  # engine cores: backend/frontends.py's CoreFrontends, in this process
        self._api_key = API_KEY
        self.serve_http = serve_http
        self._http: dict[str, _HttpServer] = {}  # one device: the loopback server of each model's app
        self._judges: dict[str, tuple[Any, Any]] = {}  # base model -> (engine, in-process client)

    @property
    def world_size(self) -> int:
        return len(self.devices) if self.devices is not None else 1

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' ids, by rank (several devices; empty before register and on one device)."""
        return self._processes.pids if self._processes is not None else []

    def _separate_engine(self) -> bool:
        """Whether the engines run as cores in worker processes, this process their frontend (`engine_process`;
        its "auto" is in process, the docstring says why; a joining backend's always do)."""
        return self.join is not None or engine_process_for(self.engine_process, runs=1) == "separate"

    async def share(self) -> str:
        """Let drivers in other processes of this host use this backend's worker: their
        ``LocalBackend(join=address)`` registers models on it (one base, one engine, one device), each
        process running its own runs' requests (backend/sharing.py). Returns that address. Needs
        ``engine_process="separate"`` and one device; starts the worker if no model has yet. Close this
        backend after the joining ones: its close stops the worker, failing theirs."""
        if self.join is not None:
            raise ConfigError("this backend joined another's worker; share the address it joined instead",
                              what="LocalBackend.share()")
        if not self._separate_engine() or (self.devices is not None and len(self.devices) > 1):
            raise ConfigError(f"share() needs LocalBackend(engine_process=\"separate\") on one device; this one has "
                              f"engine_process={self.engine_process!r}, devices={self.devices!r}. Several devices "
                              "take one driver's commands in one order, so they cannot be shared.",
                              what="LocalBackend.share()")
        if not self._started:
            await self._start()
            self._started = True
        return await self._processes.share()

    def lockstep_member(self, model: "TrainableModel") -> Any:
        """A joined backend's run: its place in the barrier the shared worker holds over the lockstep runs of
        every joining process (backend/sharing.py), so each step's rollouts of runs in different processes
        batch together as a sweep's do in one (loop/lockstep.py). None for a backend of its own."""
        if self.join is None:
            return None
        from groupwise.backend.sharing import SharedLockstep

        return SharedLockstep(self._processes, self._run(model).spec.name)

    async def _start(self) -> None:
        if self.join is not None:
            from groupwise.backend.frontends import CoreFrontends
            from groupwise.backend.sharing import SharedWorker

            self._frontends = CoreFrontends()
            self._processes = SharedWorker(self.join)
            await self._processes.start()
            return
        separate = self._separate_engine()
        if self.devices is not None or separate:
            import dataclasses

            from groupwise.backend.processes import WorkerProcesses
            from groupwise.runtime.loading import resolve_device

            threads = None
            if separate:
                import torch

                from groupwise.backend.frontends import CoreFrontends

                self._frontends = CoreFrontends()
                options = dataclasses.replace(self._worker_options(serve_http=False), engine_core=True)
                # on the CPU the worker's engine and trainer get the threads they would have here (torch's
                # count: OMP_NUM_THREADS or the cores), not every core: this process's frontend needs one too
                threads = torch.get_num_threads()
            else:
                self._api_key = secrets.token_urlsafe(24)  # the workers' loopback servers answer only this driver
                options = self._worker_options(serve_http=True, api_key=self._api_key)
            self._processes = WorkerProcesses(self.devices or [str(resolve_device(self.device))], options,
                                              timeout_s=self.options.collective_timeout_s, cpu_threads=threads)
            await self._processes.start()
        else:
            from groupwise.backend.worker import DeviceWorker

            self._worker = DeviceWorker(0, 1, self.device, self._worker_options(serve_http=False))

    async def _call(self, method: str, kwargs: list[dict[str, Any]]) -> list[Any]:
        if self._frontends is not None:
            return await self._frontends.call(self._processes, method, kwargs)
        if self._processes is not None:
            return await self._processes.call(method, kwargs)
        assert self._worker is not None, "LocalBackend used before register()"
        return [await getattr(self._worker, method)(**kwargs[0])]

    def _endpoint(self, name: str, urls: list[str | None]) -> InferenceEndpoint:
        if self._frontends is not None:
            return self._frontends.endpoint(name, api_key=API_KEY, processes=self._processes)
        if self._processes is not None:
            from groupwise.backend.routing import routed_endpoint

            return routed_endpoint([u for u in urls if u], api_key=self._api_key, alive=self._processes.check_alive)
        from groupwise.inference.client import BASE_URL, in_process_http_client

        assert self._worker is not None
        return InferenceEndpoint(base_url=BASE_URL, api_key=API_KEY,
                                 http_client=in_process_http_client(self._worker.app(name)))

    async def register(self, model: "TrainableModel") -> None:
        if self._registers(model) is None:
            return
        await super().register(model)
        if self.serve_http and (self._worker is not None or self._frontends is not None):
            from groupwise.inference.server import create_app

            key = RunId.of(model).key
            registry = (self._worker.replicas[key].registry if self._worker is not None
                        else self._frontends.of_run(key)[0].registry)  # the first rank's app, as with `devices`
            self._http[key] = await asyncio.to_thread(_HttpServer.start, create_app, registry, model.name)

    async def unregister(self, model: "TrainableModel") -> None:
        http = self._http.pop(RunId.of(model).key, None)
        if http is not None:
            await asyncio.to_thread(http.stop)
        await super().unregister(model)

    async def get_or_create_model(self, name: str, project: str | None = None, base_model: str = DEFAULT_BASE_MODEL,
                                  _config: dict[str, Any] | None = None) -> "TrainableModel":
        """ART 0.1.1-0.1.22's way to get a model (before ``TrainableModel(...)`` and ``register``):
        ``model = await api.get_or_create_model(name=..., project=..., base_model=..., _config=...)``
        gives the registered `TrainableModel`, resumed from its latest checkpoint if the run has one.
        ``_config`` is ART's model config (``init_args``, ``peft_args``, ...), read as `_internal_config`.
        ART 0.1.1-0.1.9 took no project (``(name, base_model, _config)``): a second argument with a
        "/" (a Hugging Face id or a path, which no project name has) is the base model."""
        from groupwise.config import DEFAULT_PROJECT
        from groupwise.model import TrainableModel

        if project is not None and "/" in project and base_model == DEFAULT_BASE_MODEL:
            project, base_model = None, project
        model = TrainableModel(name=name, project=project or DEFAULT_PROJECT, base_model=base_model,
                               _internal_config=_config)
        await model.register(self)
        return model

    _get_or_create_model = get_or_create_model

    def http_endpoint(self, model: "TrainableModel") -> InferenceEndpoint | None:
        """The model's loopback HTTP endpoint (base URL and API key): with one device its own server
        (None with serve_http=False), with several the first serving rank's: rank 0's, or the first
        generator's with `train_workers` (`model.openai_client()` spreads requests over every replica;
        another client through this URL reaches that one only). With ``engine_process="separate"`` it is
        served by this process, over the app of the first serving rank's core (None with serve_http=False)."""
        run = self._run(model)
        if self._processes is not None and self._frontends is None:
            url = next((u for u in run.urls if u), None)
            return InferenceEndpoint(base_url=url, api_key=self._api_key) if url else None
        http = self._http.get(run.spec.name)
        return None if http is None else InferenceEndpoint(base_url=http.base_url, api_key=http.api_key)

    def judge_client(self, base_model: str) -> Any:
        """An `openai.AsyncOpenAI` client of `base_model` served by this backend in process (no key, no
        network), for a RULER judge that runs here: ``ruler_score_group(group, base_model,
        client=backend.judge_client(base_model))``. Loaded once per base model; closed with the backend.

        To judge with the weights a registered model already holds, pass ``client=model.openai_client()``
        and ask for ``model.inference_name(0)`` (the base, adapter off): no second copy is loaded."""
        if base_model not in self._judges:
            from groupwise.backend.judges import build_local_judge

            self._judges[base_model] = build_local_judge(base_model, device=self.device, dtype=self.options.dtype,
                                                         max_batch_size=self.options.max_batch_size,
                                                         engine_kwargs=self.options.engine_kwargs)
        return self._judges[base_model][1]

    # ------------------------------------------------------------------------------------ S3 (ART)
    def _store_root(self, model: "TrainableModel") -> Path:
        """The run store `model`'s runs are in: the backend's folder, unless the model names its own."""
        return Path(self.path if model.base_path == DEFAULT_PATH else model.base_path)

    def _run_dir(self, model: "TrainableModel") -> Path:
        return run_dir_of(self._store_root(model), model.project, model.storage_name)

    async def _experimental_push_to_s3(self, model: "TrainableModel", *, s3_bucket: str | None = None,
                                       prefix: str | None = None, verbose: bool = False, delete: bool = False,
                                       **ignored: Any) -> None:
        """ART's backup: copy the model's run folder to ``<bucket>/[prefix/]<project>/models/<run>``,
        where the bucket is a local folder (`groupwise.runs.s3`); `delete` first removes the copy's
        files that the run no longer has. Before the run wrote anything there is nothing to copy."""
        if ignored:
            warn_ignored("LocalBackend._experimental_push_to_s3", ignored)
        source, target = self._run_dir(model), mirror_dir(s3_bucket, prefix, model.project, model.storage_name)
        if source.is_dir():
            await asyncio.to_thread(mirror, source, target, delete)
        if verbose:
            print(f"[groupwise] pushed {source} -> {target}" if source.is_dir() else f"[groupwise] nothing yet at {source}")

    async def _experimental_pull_from_s3(self, model: "TrainableModel", *, s3_bucket: str | None = None,
                                         prefix: str | None = None, verbose: bool = False, delete: bool = False,
                                         **ignored: Any) -> None:
        """ART's restore: copy ``<bucket>/[prefix/]<project>/models/<run>`` (a local folder) into the run
        folder before `register`, which then resumes from its latest checkpoint. Nothing there: a no-op."""
        if ignored:
            warn_ignored("LocalBackend._experimental_pull_from_s3", ignored)
        source, target = mirror_dir(s3_bucket, prefix, model.project, model.storage_name), self._run_dir(model)
        if RunId.of(model) in self._runs:
            raise GroupwiseError(f"pull before register: model {model.name!r} is already loaded from {target}")
        if source.is_dir():
            await asyncio.to_thread(mirror, source, target, delete)
        if verbose:
            print(f"[groupwise] pulled {source} -> {target}" if source.is_dir() else f"[groupwise] nothing at {source}")

    async def _experimental_fork_checkpoint(self, model: "TrainableModel", from_model: str,
                                            from_project: str | None = None, from_s3_bucket: str | None = None,
                                            not_after_step: int | None = None, verbose: bool = False,
                                            prefix: str | None = None) -> None:
        """ART's fork: copy the latest checkpoint of run `from_model` (of `from_project`, default the
        model's project) at or before `not_after_step` into this model's run folder under the same step.
        Before `register`, register then resumes from it. After `register` (ART's documented order: ART
        loads the model lazily, at its first use), the model is unloaded, the checkpoint copied, and the
        model loaded again from its latest checkpoint, so its next rollouts and step use the fork. With
        `from_s3_bucket` the checkpoint is read from the bucket's copy of that run (a local folder,
        `groupwise.runs.s3`). Only the checkpoint is copied (no history, no trajectories), as in ART."""
        import shutil

        from_project = from_project or model.project
        registered = RunId.of(model) in self._runs
        if from_s3_bucket is not None:
            source = mirror_dir(from_s3_bucket, prefix, from_project, from_model) / CHECKPOINTS_DIR
        else:
            source = run_dir_of(self._store_root(model), from_project, from_model) / CHECKPOINTS_DIR
        steps = checkpoint_folders(source)
        if not steps:
            raise GroupwiseError(f"no checkpoints of model {from_model!r} (project {from_project!r}) in {source}: "
                                 "train it first, or pass from_project= / from_s3_bucket= where it was saved")
        chosen = [s for s in steps if not_after_step is None or s[0] <= not_after_step]
        if not chosen:
            raise GroupwiseError(f"no checkpoint of model {from_model!r} at or before step {not_after_step}; "
                                 f"its checkpoints are steps {[s for s, _ in steps]} (the backend keeps the "
                                 "latest and best ones: set not_after_step= to one of these)")
        step, folder = chosen[-1]
        target = self._run_dir(model) / CHECKPOINTS_DIR / folder.name
        if registered:  # the loaded adapter, optimizer and served steps are the old run's: load again after
            await self.unregister(model)
        if target.exists():
            await asyncio.to_thread(shutil.rmtree, target)
        await asyncio.to_thread(shutil.copytree, folder, target)
        if registered:
            await model.register(self)
        if verbose:
            print(f"[groupwise] forked {from_project}/{from_model} step {step}: {folder} -> {target}"
                  + (f"; {model.name} reloaded at step {await self.get_step(model)}" if registered else ""))

    async def _experimental_pull_model_checkpoint(self, model: "TrainableModel", *, step: "int | str | None" = None,
                                                  local_path: str | None = None, s3_bucket: str | None = None,
                                                  prefix: str | None = None, verbose: bool = False) -> str:
        """ART 0.5's way to get a checkpoint's folder (a PEFT adapter, with its optimizer state): the path
        of step `step` (an int, or None / "latest": the latest, here or in the bucket folder `s3_bucket`,
        here when they tie), copied from the bucket first when only it has the step, and copied into
        `local_path` when given (then that path is returned)."""
        import shutil

        checkpoints = self._run_dir(model) / CHECKPOINTS_DIR
        backup = mirror_dir(s3_bucket, prefix, model.project, model.storage_name) / CHECKPOINTS_DIR \
            if s3_bucket is not None else None
        here = [s for s, _ in checkpoint_folders(checkpoints)]
        there = [s for s, _ in checkpoint_folders(backup)] if backup is not None else []
        if step is None or step == "latest":
            if not here and not there:
                raise GroupwiseError(f"no checkpoint of {model.project}/{model.name} in {checkpoints}"
                                     + (f" or in {backup}" if backup is not None else "") + ": train it first")
            chosen = max(here + there)
        elif isinstance(step, int) and not isinstance(step, bool):
            chosen = step
        else:
            raise ConfigError([f"step={step!r}: give a step number, 'latest' or None"],
                              what="_experimental_pull_model_checkpoint")
        folder = checkpoints / step_dir_name(chosen)
        if not folder.is_dir():
            if chosen not in there:
                raise GroupwiseError(f"no checkpoint of step {chosen} of {model.project}/{model.name} (here: {here}"
                                     + (f", in the bucket folder: {there}" if backup is not None else "") + ")")
            await asyncio.to_thread(shutil.copytree, backup / step_dir_name(chosen), folder)
            if verbose:
                print(f"[groupwise] pulled step {chosen} from {backup}")
        if local_path is None:
            if verbose:
                print(f"[groupwise] checkpoint of step {chosen}: {folder}")
            return str(folder)
        await asyncio.to_thread(shutil.copytree, folder, local_path, dirs_exist_ok=True)
        if verbose:
            print(f"[groupwise] copied the checkpoint of step {chosen} to {local_path}")
        return local_path

    async def _experimental_deploy(self, *args: Any, **kwargs: Any) -> Any:
        raise GroupwiseError("_experimental_deploy is not supported: serve a checkpoint with "
                             "`groupwise serve --model <base> --adapter <run>/checkpoints/<step>`")

    async def _stop(self) -> None:
        self._stop_local()
        if self._frontends is not None:
            self._frontends.close()
            self._frontends = None
        if self._processes is not None:
            await self._processes.stop()
            self._processes = None
        self._worker = None

    def _stop_local(self) -> None:
        for http in self._http.values():
            http.stop()
        self._http.clear()
        for engine, _client in self._judges.values():
            engine.close()
        self._judges.clear()

    def _close(self) -> None:
        """Close without an event loop (ART's ``with LocalBackend() as backend:``)."""
        self._stop_local()
        if self._worker is not None:
            for base in self._worker.bases.values():
                base.close()
        if self._frontends is not None:
            self._frontends.close()
            self._frontends = None
        if self._processes is not None:
            self._processes.kill()
        self._forget_runs()
        self._started, self._worker, self._processes = False, None, None
        self._run_locks.release_all()

    async def close(self) -> None:
        await super().close()
        self._stop_local()  # judges load on first use, also before any model is registered

    async def __aenter__(self) -> "LocalBackend":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __enter__(self) -> "LocalBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "backend": "LocalBackend", "device": self.device, "devices": self.devices,
                **({"join": self.join} if self.join is not None else {})}


class _HttpServer:
    """uvicorn serving one model's app on 127.0.0.1 in a daemon thread (its own event loop; the
    engine answers requests from any loop). Bound to a socket opened here, so the port is known
    before the server starts and no other process can take it in between."""

    def __init__(self, server: Any, thread: Any, sock: Any, api_key: str) -> None:
        self.server, self.thread, self.sock, self.api_key = server, thread, sock, api_key
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"

    @classmethod
    def start(cls, create_app: Any, registry: Any, name: str, timeout_s: float = 30.0) -> "_HttpServer":
        import secrets
        import socket
        import threading

        import uvicorn

        from groupwise.inference.connections import serve_options

        api_key = f"gw-{secrets.token_urlsafe(24)}"
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        # the same head deadline and connection cap as `groupwise serve`: the port is open to every
        # local process, not only to the rollouts that hold the key
        config = uvicorn.Config(create_app(registry, api_key=api_key), log_level="warning", lifespan="off",
                                access_log=False, **serve_options())
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                                  name=f"groupwise-http-{name}")
        thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                sock.close()
                raise GroupwiseError(f"the loopback HTTP server of model {name!r} did not start within {timeout_s:.0f} s; "
                                     "pass LocalBackend(serve_http=False) to serve in process only")
            time.sleep(0.01)
        return cls(server, thread, sock, api_key)

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        self.sock.close()


LocalAPI = LocalBackend  # ART 0.1-0.2's name (``art.LocalAPI(in_process=..., path=...)``)
