"""`LocalBackend`: serve and train on this machine, one copy of the base weights per model.

    model = gw.TrainableModel(name="agent-001", project="2048", base_model="smollm2-135m")
    await model.register(gw.LocalBackend(lora=gw.LoraConfig(rank=8)))
    await model.train(groups, config=gw.TrainConfig(learning_rate=1e-5))

Per registered model it holds: the base model wrapped with peft (one trainable adapter, peft's
"default"), an inference `Engine` over that same object, a `ModelRegistry` + FastAPI app (the app
`groupwise serve` exposes; here reached in process through an httpx ASGI transport), and a `Trainer`
with the AdamW state. The same registry is also served over real HTTP on loopback (uvicorn in a
thread, a free port, a generated API key), so code that hands `model.inference_base_url` and
`model.inference_api_key` to another client (curl, litellm, LangGraph, the OpenAI Agents SDK)
reaches the model; `model.openai_client()` keeps the in-process path, which skips the socket. After step k the adapter is saved to ``checkpoints/<k>/`` and loaded into the
engine as its own adapter, served as ``name@k`` and as ``name`` (latest).

A train step, in order (each step of the order is there for a failure seen in ART):
1. write the step's trajectories to the run store FIRST: a crash during training loses nothing;
   a step whose groups all have equal rewards is skipped here (see `TrainConfig.max_skipped_steps`):
   no gradient step, a warning naming the groups, an ``alert`` row ``no_signal`` in the history, and
   the unchanged adapter checkpointed and served as the next step, as ART does;
2. tokenise (token-in/token-out; raises `NotTrainableError` saying why when nothing is trainable);
3. pause the engine (no forward pass runs), run the GRPO step, resume;
4. save the checkpoint atomically (adapter, optimizer, RNG, step, data cursor, the step's history
   row; state.json last), then append that row to history.jsonl;
5. load the new adapter into the engine and check it: its LoRA tensors must equal the trainer's, and
   a real chat request through the server must answer as ``name@k`` -- else `AdapterMismatchError`
   (ART once served a stale adapter silently);
6. retention: keep the latest checkpoint and the best by `best_checkpoint_metric`; serve only the
   last `served_steps` steps.

`train_sft()` (supervised steps on demonstrations) follows the same order, with one optimizer update
per batch of trajectories; it is a step like any other (checkpoint, history row, served adapter).

`register()` resumes from the latest intact checkpoint: adapter weights, optimizer tensors, RNG
and step (an incomplete or corrupt checkpoint folder is skipped with a warning), and replays its
history row if history.jsonl lacks it (a crash between the checkpoint and the append). The data cursor of a
checkpoint is the run store's state.json at save time (the loop keeps its cursor there).

No global state: everything lives on the instance, so a cluster backend can reuse Engine and
Trainer unchanged. Different models registered on one LocalBackend each load their own base copy.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from groupwise.backend.base import Backend, InferenceEndpoint, TrainResult
from groupwise.backend.memory import release_freed_memory
from groupwise.compat import train_config_from_art, warn_ignored
from groupwise.compute import compute_thread
from groupwise.config import LoraConfig, TrainConfig, TrainSFTConfig
from groupwise.errors import AdapterMismatchError, ConfigError, GroupwiseError, NotTrainableError
from groupwise.store import history_row, numeric_metrics

if TYPE_CHECKING:
    from groupwise.model import TrainableModel
    from groupwise.types import Trajectory, TrajectoryGroup

DEFAULT_PATH = ".groupwise"
API_KEY = "groupwise-local"

log = logging.getLogger(__name__)


@dataclass
class _Served:
    """Everything the backend holds for one registered model."""

    peft_model: Any
    tokenizer: Any
    engine: Any
    registry: Any
    app: Any
    trainer: Any
    store: Any
    step: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    checkpoint_path: str | None = None
    cursor: dict[str, Any] = field(default_factory=dict)  # data cursor of the latest checkpoint
    skipped_in_a_row: int = 0  # consecutive steps skipped for lack of signal (restored on resume)
    http: "_HttpServer | None" = None  # the loopback HTTP server of this model's app


class LocalBackend(Backend):
    """Serve and train `TrainableModel`s on this machine (CPU or one GPU).

    Args:
        path: root of the run store (``<path>/<project>/<model>/``) when the model keeps the default
            base_path; a model constructed with its own base_path keeps it.
        device: "cpu", "cuda", "cuda:1" (default: CUDA when available).
        dtype: "bfloat16", "float32", ... (default: bf16 on CUDA, fp32 on CPU). LoRA weights are fp32.
        lora: the adapter's rank, alpha, dropout and target modules (`gw.LoraConfig`); a model built
            with ``TrainableModel(..., config=gw.LoraConfig(...))`` uses its own instead.
        max_batch_size: sequences the engine decodes together.
        served_steps: how many recent steps stay loaded in the engine (name@k); older ones unload.
        best_checkpoint_metric: retention keeps the latest checkpoint and the best by this metric
            (read from the step metrics or from history.jsonl's val rows); None keeps every checkpoint.
        verify_adapter: after each step, check the engine serves the new adapter (recommended).
        serve_http: also serve each model over HTTP on 127.0.0.1 (a free port and a generated API key,
            in `model.inference_base_url` / `model.inference_api_key`); False serves in process only.
        in_process, gpu_cost_per_hour_usd, enable_expert_replay: ART's; accepted (everything here runs
            in this process; GPU cost and MoE replay have no counterpart) and named once in a warning.
    """

    def __init__(
        self,
        path: str | None = DEFAULT_PATH,
        *,
        in_process: bool | None = None,
        gpu_cost_per_hour_usd: float | None = None,
        enable_expert_replay: bool | None = None,
        device: str | None = None,
        dtype: str | None = None,
        lora: LoraConfig | None = None,
        max_batch_size: int = 32,
        served_steps: int = 2,
        best_checkpoint_metric: str | None = "val/reward",
        verify_adapter: bool = True,
        serve_http: bool = True,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        ignored = [k for k, v in (("in_process", in_process is False), ("gpu_cost_per_hour_usd", gpu_cost_per_hour_usd),
                                  ("enable_expert_replay", enable_expert_replay)) if v]
        if ignored:
            warn_ignored("LocalBackend()", ignored, "the engine and trainer always run in this process")
        self.path = str(path if path is not None else DEFAULT_PATH)
        self.device = device
        self.dtype = dtype
        self.lora = lora if lora is not None else LoraConfig()
        self.max_batch_size = max_batch_size
        self.served_steps = max(1, served_steps)
        self.best_checkpoint_metric = best_checkpoint_metric
        self.verify_adapter = verify_adapter
        self.serve_http = serve_http
        self.engine_kwargs = dict(engine_kwargs or {})
        self._models: dict[str, _Served] = {}
        self._judges: dict[str, tuple[Any, Any]] = {}  # base model -> (engine, in-process client)

    # ------------------------------------------------------------------------------------ register
    def _served(self, model: "TrainableModel") -> _Served:
        served = self._models.get(model.name)
        if served is None:
            raise GroupwiseError(
                f"model {model.name!r} is not registered with this LocalBackend; call `await model.register(backend)`"
            )
        return served

    async def register(self, model: "TrainableModel") -> None:
        if model.name in self._models:
            return
        if model.base_path == DEFAULT_PATH and self.path != DEFAULT_PATH:
            model.base_path = self.path  # the backend's path is where a default-configured model's run lives
            model._store = None
        # torch work runs on the one compute thread (groupwise/compute.py: OpenMP on CPU)
        served = await compute_thread().run(self._load, model)
        if self.serve_http:
            from groupwise.inference.server import create_app

            served.http = await asyncio.to_thread(_HttpServer.start, create_app, served.registry, model.name)
        self._models[model.name] = served

    def _load(self, model: "TrainableModel") -> _Served:
        from groupwise.inference.engine import Engine
        from groupwise.inference.registry import ModelRegistry
        from groupwise.inference.server import create_app
        from groupwise.loading import load_base_model
        from groupwise.training.checkpoint import latest_checkpoint, load_checkpoint, replay_history
        from groupwise.training.trainer import Trainer, wrap_with_lora

        base, tokenizer = load_base_model(model.base_model, device=self.device, dtype=self.dtype)
        # The model's own LoRA settings (config=, ART's lora_config= / peft_args) override the backend's.
        lora = model.lora_for(self.lora)
        peft_model = wrap_with_lora(base, lora)
        peft_model.eval()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        trainer = Trainer(peft_model, pad_token_id=pad)
        engine = Engine(peft_model, tokenizer, max_batch_size=self.max_batch_size, **self.engine_kwargs)
        registry = ModelRegistry(engine, base_name=model.base_model)
        registry.register_model(model.name)
        app = create_app(registry)
        store = model.store
        served = _Served(peft_model, tokenizer, engine, registry, app, trainer, store)
        state = latest_checkpoint(store.checkpoints_dir)
        if state is not None:
            trainer.ensure_optimizer(TrainConfig())  # lr and weight decay are reset by each step's config
            names = [n for n, _ in trainer.trainable_named_parameters()]
            load_checkpoint(state, model=peft_model, optimizer=trainer.optimizer, param_names=names)
            replay_history(state, store)
            served.step = state.step
            served.checkpoint_path = str(state.path)
            served.cursor = dict(state.cursor)
            served.skipped_in_a_row = int(state.metrics.get("skipped_in_a_row", 0))
            registry.add_step(model.name, state.step, str(state.path))
        return served

    # ------------------------------------------------------------------------------------ serve
    def inference_endpoint(self, model: "TrainableModel") -> InferenceEndpoint:
        from groupwise.inference.client import BASE_URL, in_process_http_client

        served = self._served(model)
        return InferenceEndpoint(base_url=BASE_URL, api_key=API_KEY, http_client=in_process_http_client(served.app))

    def http_endpoint(self, model: "TrainableModel") -> InferenceEndpoint | None:
        """The model's loopback HTTP endpoint (base URL and API key), or None with serve_http=False."""
        http = self._served(model).http
        return None if http is None else InferenceEndpoint(base_url=http.base_url, api_key=http.api_key)

    async def get_step(self, model: "TrainableModel") -> int:
        return self._served(model).step

    def judge_client(self, base_model: str) -> Any:
        """An `openai.AsyncOpenAI` client of `base_model` served by this backend in process (no key, no
        network), for a RULER judge that runs here: ``ruler_score_group(group, base_model,
        client=backend.judge_client(base_model))``. Loaded once per base model; closed with the backend.

        To judge with the weights a registered model already holds, pass ``client=model.openai_client()``
        and ask for ``model.inference_name(0)`` (the base, adapter off): no second copy is loaded."""
        if base_model not in self._judges:
            from groupwise.inference.client import in_process_client
            from groupwise.inference.engine import Engine
            from groupwise.inference.registry import ModelRegistry
            from groupwise.inference.server import create_app
            from groupwise.loading import load_base_model

            lm, tokenizer = compute_thread().call(load_base_model, base_model, device=self.device, dtype=self.dtype)
            engine = Engine(lm, tokenizer, max_batch_size=self.max_batch_size, **self.engine_kwargs)
            client = in_process_client(create_app(ModelRegistry(engine, base_name=base_model)), api_key=API_KEY)
            self._judges[base_model] = (engine, client)
        return self._judges[base_model][1]

    def checkpoint_cursor(self, model: "TrainableModel") -> dict[str, Any]:
        """The data cursor saved with the latest checkpoint (the store's state.json at save time);
        a loop resuming after a crash reads where its data stood when the step it resumes from ended."""
        return dict(self._served(model).cursor)

    # ------------------------------------------------------------------------------------ train
    async def train(
        self, model: "TrainableModel", groups: "list[TrajectoryGroup]", config: TrainConfig | None = None,
        **options: Any,
    ) -> TrainResult:
        """One GRPO step on `groups`; returns once the new adapter is served and verified.

        ART 0.5's form works too: ``await backend.train(model, groups, learning_rate=1e-5, ...)``; its
        options map onto `TrainConfig` fields or are named once in a warning (docs/porting-from-art.md).
        Unlike `model.train`, this does not log the groups to the history (as in ART)."""
        from groupwise.inference.tool_calls import prepare_messages
        from groupwise.training.tokenize import tokenize_groups

        if options or not isinstance(config, TrainConfig):
            config = train_config_from_art(config, options, where="LocalBackend.train")
        served = self._served(model)
        async with served.lock:  # one step at a time per model
            t0 = time.perf_counter()
            step = served.step
            groups = list(groups)
            # 1. trajectories first: a crash in the step loses nothing.
            await asyncio.to_thread(served.store.write_trajectories, "train", step, groups)
            no_signal = self._no_signal(served, groups, step, config)
            if no_signal is not None:
                metrics = no_signal
            else:
                # 2. token-in/token-out batch, rendered as the server rendered the prompts.
                batch = await compute_thread().run(
                    tokenize_groups, groups, served.tokenizer, max_seq_len=config.max_seq_len,
                    scale_rewards=config.scale_rewards, prepare=prepare_messages,
                )
                # 3. exclusive use of the shared model while training.
                async with served.engine.paused():
                    metrics = await compute_thread().run(served.trainer.train_step, batch, config, step=step)
                del batch
                if served.trainer.device.type == "cpu":
                    release_freed_memory()  # else RSS grows by GBs a step (backend/memory.py)
                served.skipped_in_a_row = 0
                metrics.update(skipped=0.0, skipped_in_a_row=0.0)
            row = history_row(groups, step=step, split="train", metrics=numeric_metrics(metrics))
            path = await self._publish(model, served, step + 1, metrics, row)
            metrics["step_time"] = time.perf_counter() - t0
            return TrainResult(step=step + 1, metrics=metrics, checkpoint_path=str(path))

    async def train_sft(
        self, model: "TrainableModel", trajectories: "list[Trajectory]", config: TrainSFTConfig | None = None
    ) -> TrainResult:
        """One supervised step: the same order as `train` (store first, tokenise, exclusive use of the
        model, checkpoint, serve and verify, retention), with one optimizer update per batch of
        `config.batch_size` trajectories (training/sft.py's loss on their assistant turns)."""
        from groupwise.inference.tool_calls import prepare_messages
        from groupwise.training.sft import tokenize_sft
        from groupwise.types import TrajectoryGroup

        config = config if config is not None else TrainSFTConfig()
        served = self._served(model)
        trajectories = list(trajectories)
        if not trajectories:
            raise GroupwiseError("train_sft() got no trajectories; pass the demonstrations to imitate")
        size = config.resolved_batch_size()
        chunks = [trajectories[i:i + size] for i in range(0, len(trajectories), size)]
        rates = config.rates(len(chunks))
        async with served.lock:
            t0 = time.perf_counter()
            step = served.step
            # 1. demonstrations first (one group per batch): a crash in the step loses nothing.
            await asyncio.to_thread(served.store.write_trajectories, "sft", step, [TrajectoryGroup(c) for c in chunks])
            # 2. token-in/token-out, rendered as the server renders requests.
            batches = [await compute_thread().run(tokenize_sft, c, served.tokenizer, max_seq_len=config.max_seq_len,
                                                  assistant_turns=config.assistant_turns, prepare=prepare_messages)
                       for c in chunks]
            # 3. one update per batch, with exclusive use of the shared model.
            per_update: list[dict[str, float]] = []
            async with served.engine.paused():
                for batch, rate in zip(batches, rates):
                    update = TrainConfig(
                        learning_rate=rate, max_grad_norm=config.max_grad_norm, weight_decay=config.weight_decay,
                        micro_batch_tokens=config.micro_batch_tokens, max_seq_len=config.max_seq_len,
                        logprob_chunk_size=config.logprob_chunk_size, seed=config.seed,
                        gradient_checkpointing=config.gradient_checkpointing)
                    per_update.append(await compute_thread().run(
                        served.trainer.train_step, batch, update, step=step, objective="sft"))
            del batches
            if served.trainer.device.type == "cpu":
                release_freed_memory()
            tokens = sum(m["trainable_tokens"] for m in per_update)
            metrics = {
                "loss": sum(m["loss"] * m["trainable_tokens"] for m in per_update) / max(tokens, 1.0),
                "first_loss": per_update[0]["loss"], "last_loss": per_update[-1]["loss"],
                "grad_norm": sum(m["grad_norm"] for m in per_update) / len(per_update),
                "trainable_tokens": tokens,
                "sequences": sum(m["sequences"] for m in per_update),
                "updates": float(len(per_update)),
                "dropped_too_long": sum(m["dropped_too_long"] for m in per_update),
                "update_time": sum(m["update_time"] for m in per_update),
                "learning_rate": rates[-1],
            }
            # 4-6. checkpoint, serve and verify, retention: an SFT step is a step like any other.
            row = history_row([], step=step, split="sft", metrics=numeric_metrics(metrics))
            path = await self._publish(model, served, step + 1, metrics, row)
            metrics["step_time"] = time.perf_counter() - t0
            return TrainResult(step=step + 1, metrics=metrics, checkpoint_path=str(path))

    async def _publish(self, model: "TrainableModel", served: _Served, new_step: int, metrics: dict[str, float],
                       row: dict[str, Any]) -> Path:
        """4. save the checkpoint with the step's history row, append the row, 5. serve the new
        adapter and verify it, 6. retention."""
        cursor = await asyncio.to_thread(served.store.read_state)
        path = await compute_thread().run(self._save, served, new_step, metrics, cursor, row)
        await asyncio.to_thread(served.store.append_history, row)
        served.cursor = cursor
        await compute_thread().run(served.registry.add_step, model.name, new_step, str(path))
        served.step = new_step
        served.checkpoint_path = str(path)
        if self.verify_adapter:
            await self._verify(model, served, new_step)
        await compute_thread().run(self._retain, model, served, new_step)
        return path

    def _no_signal(self, served: _Served, groups: "list[TrajectoryGroup]", step: int,
                   config: TrainConfig) -> dict[str, float] | None:
        """None when some group's rewards differ; else the skipped step's metrics, after the warning
        and the history record. Raises NotTrainableError past `config.max_skipped_steps`."""
        from groupwise.training.advantages import compute_advantages

        rewards = [g.rewards() for g in groups]
        if compute_advantages(rewards).zero_variance_groups < len(groups):
            return None
        shown = "; ".join(f"group {g}: {r[:6]}{' ...' if len(r) > 6 else ''}" for g, r in enumerate(rewards[:6]))
        why = (f"no learning signal: in every one of the {len(groups)} group(s) all rewards are equal "
               f"({shown}{'; ...' if len(groups) > 6 else ''}), so every group-relative advantage is 0"
               if groups else "no learning signal: no groups were given (did the reward step drop every group?)")
        fix = ("Make rewards differ within a group: more rollouts per group, a graded reward instead of "
               "pass/fail, harder or easier scenarios, or a judge (RULER).")
        if served.skipped_in_a_row >= config.max_skipped_steps:
            raise NotTrainableError(
                f"step {step}: {why}. {served.skipped_in_a_row} step(s) in a row were already skipped for this "
                f"and TrainConfig.max_skipped_steps={config.max_skipped_steps} allows no more. {fix}"
            )
        served.skipped_in_a_row += 1
        message = (f"step {step} skipped: {why}. No gradient step was taken; the adapter of step {step} is "
                   f"served unchanged as step {step + 1}. {served.skipped_in_a_row} of at most "
                   f"{config.max_skipped_steps} consecutive skipped step(s) (TrainConfig.max_skipped_steps). {fix}")
        log.warning("%s", message)
        served.store.append_history({
            "step": step, "split": "alert", "recorded_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "name": "no_signal", "severity": "warning", "message": message, "action": "skip",
            "evidence": {"rewards": [r[:8] for r in rewards[:8]], "skipped_in_a_row": served.skipped_in_a_row},
        })
        return {"skipped": 1.0, "skipped_in_a_row": float(served.skipped_in_a_row),
                "no_signal_groups": float(len(groups))}

    def _save(self, served: _Served, step: int, metrics: dict[str, float], cursor: dict[str, Any],
              row: dict[str, Any]) -> Path:
        from groupwise.training.checkpoint import save_checkpoint

        names = [n for n, _ in served.trainer.trainable_named_parameters()]
        return save_checkpoint(
            served.store.checkpoints_dir, step, model=served.peft_model, optimizer=served.trainer.optimizer,
            param_names=names, adapter_name=served.trainer.adapter_name, cursor=cursor,
            metrics=metrics, history=[row],
        )

    async def _verify(self, model: "TrainableModel", served: _Served, step: int) -> None:
        """The engine's adapter for `step` holds the trained weights, and the server answers with it."""
        import torch

        from groupwise.inference.client import in_process_client

        adapter = served.engine.peft_adapter_name(served.registry.adapter_name(model.name, step))
        trained = dict(served.trainer.trainable_named_parameters())
        tag = f".{served.trainer.adapter_name}."
        mismatched = []
        for name, param in served.peft_model.named_parameters():
            if f".{adapter}." in name:
                ref = trained.get(name.replace(f".{adapter}.", tag))
                if ref is None or not torch.equal(ref.detach().to(param.dtype), param.detach()):
                    mismatched.append(name)
        if mismatched or not any(f".{adapter}." in n for n, _ in served.peft_model.named_parameters()):
            raise AdapterMismatchError(
                f"after step {step} the engine's adapter {adapter!r} does not hold the trained weights "
                f"({len(mismatched)} tensor(s) differ, e.g. {mismatched[:2]}). The checkpoint at "
                f"{served.checkpoint_path} was not what the engine loaded; the rollouts would sample a stale policy."
            )
        client = in_process_client(served.app, api_key=API_KEY)
        try:
            response = await client.chat.completions.create(
                model=model.name, messages=[{"role": "user", "content": "ping"}], max_tokens=1, temperature=0.0
            )
        finally:
            await client.close()
        expected = f"{model.name}@{step}"
        if response.model != expected:
            raise AdapterMismatchError(
                f"after step {step} the server answers requests for {model.name!r} as {response.model!r}, "
                f"expected {expected!r}: the new adapter is not the one served. Rollouts would sample a stale policy."
            )

    def _retain(self, model: "TrainableModel", served: _Served, step: int) -> None:
        for old in served.registry.steps(model.name):
            if 0 < old <= step - self.served_steps:
                served.registry.remove_step(model.name, old)
        if self.best_checkpoint_metric is not None:
            self._prune(served, self.best_checkpoint_metric)

    def _prune(self, served: _Served, best_metric: str) -> list[int]:
        from groupwise.training.checkpoint import prune_checkpoints

        by_step: dict[int, float] = {}
        split, _, key = best_metric.partition("/")
        if key:  # "val/reward": the val rows of history.jsonl; a val row at step k evaluates checkpoint k
            for row in served.store.history(skip_corrupt=True):
                if row.get("split") == split and isinstance(row.get(key), (int, float)):
                    by_step[int(row["step"])] = float(row[key])
        return prune_checkpoints(served.store.checkpoints_dir, best_metric=best_metric, metrics_by_step=by_step)

    async def delete_checkpoints(self, model: "TrainableModel", best_checkpoint_metric: str = "val/reward") -> None:
        """Delete every checkpoint but the latest and the best by `best_checkpoint_metric` (ART's
        `model.delete_checkpoints()`); steps still served keep being served from memory."""
        await compute_thread().run(self._prune, self._served(model), best_checkpoint_metric)

    # ------------------------------------------------------------------------------------ S3 (ART)
    def _mirror_dir(self, model: "TrainableModel", s3_bucket: str | None, prefix: str | None) -> Path:
        bucket = s3_bucket or os.environ.get("BACKUP_BUCKET")
        if not bucket:
            raise ConfigError("no bucket: pass s3_bucket= or set BACKUP_BUCKET (as ART reads it)",
                              what="S3 backup arguments")
        if bucket.startswith("s3://"):
            raise GroupwiseError(
                f"{bucket!r}: groupwise does not talk to S3. Its backup methods copy the run folder to a local "
                "folder: pass s3_bucket='/path/to/folder' (or file:///path), e.g. a bucket mounted with "
                "mountpoint-s3 or s3fs, or sync the run folder yourself with `aws s3 sync`."
            )
        root = Path(bucket.removeprefix("file://"))
        return root.joinpath(*([prefix.strip("/")] if prefix else []), model.project, "models", model.storage_name)

    def _run_dir(self, model: "TrainableModel") -> Path:
        base = self.path if model.base_path == DEFAULT_PATH else model.base_path
        return Path(base) / model.project / model.storage_name

    async def _experimental_push_to_s3(self, model: "TrainableModel", *, s3_bucket: str | None = None,
                                       prefix: str | None = None, verbose: bool = False, delete: bool = False,
                                       **ignored: Any) -> None:
        """ART's backup: copy the model's run folder to ``<bucket>/[prefix/]<project>/models/<run>``,
        where the bucket is a local folder (see `_mirror_dir`); `delete` first removes the copy's
        files that the run no longer has. Before the run wrote anything there is nothing to copy."""
        if ignored:
            warn_ignored("LocalBackend._experimental_push_to_s3", ignored)
        source, target = self._run_dir(model), self._mirror_dir(model, s3_bucket, prefix)
        if source.is_dir():
            await asyncio.to_thread(_mirror, source, target, delete)
        if verbose:
            print(f"[groupwise] pushed {source} -> {target}" if source.is_dir() else f"[groupwise] nothing yet at {source}")

    async def _experimental_pull_from_s3(self, model: "TrainableModel", *, s3_bucket: str | None = None,
                                         prefix: str | None = None, verbose: bool = False, delete: bool = False,
                                         **ignored: Any) -> None:
        """ART's restore: copy ``<bucket>/[prefix/]<project>/models/<run>`` (a local folder) into the run
        folder before `register`, which then resumes from its latest checkpoint. Nothing there: a no-op."""
        if ignored:
            warn_ignored("LocalBackend._experimental_pull_from_s3", ignored)
        source, target = self._mirror_dir(model, s3_bucket, prefix), self._run_dir(model)
        if model.name in self._models:
            raise GroupwiseError(f"pull before register: model {model.name!r} is already loaded from {target}")
        if source.is_dir():
            await asyncio.to_thread(_mirror, source, target, delete)
        if verbose:
            print(f"[groupwise] pulled {source} -> {target}" if source.is_dir() else f"[groupwise] nothing at {source}")

    async def _experimental_fork_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        raise GroupwiseError("_experimental_fork_checkpoint is not supported: copy a checkpoint folder "
                             "(checkpoints/<step>/) into a new run's folder and register the new model")

    async def _experimental_deploy(self, *args: Any, **kwargs: Any) -> Any:
        raise GroupwiseError("_experimental_deploy is not supported: serve a checkpoint with "
                             "`groupwise serve --model <base> --adapter <run>/checkpoints/<step>`")

    # ------------------------------------------------------------------------------------ close
    async def close(self) -> None:
        self._close()

    def _close(self) -> None:
        for served in self._models.values():
            if served.http is not None:
                served.http.stop()
            served.engine.close()
        self._models.clear()
        for engine, _client in self._judges.values():
            engine.close()
        self._judges.clear()

    async def __aenter__(self) -> "LocalBackend":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __enter__(self) -> "LocalBackend":  # ART's `with LocalBackend() as backend:`
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close()

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "LocalBackend", "path": self.path, "device": self.device, "dtype": self.dtype,
            "lora": self.lora.to_dict(), "models": {k: v.step for k, v in self._models.items()},
        }


def _mirror(source: Path, target: Path, delete: bool) -> None:
    """Copy the tree `source` over `target`; with `delete`, first drop what `source` does not have."""
    if delete and target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, dirs_exist_ok=True)


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

        api_key = f"gw-{secrets.token_urlsafe(24)}"
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(create_app(registry, api_key=api_key), log_level="warning", lifespan="off",
                                access_log=False)
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
