"""`LocalBackend`: serve and train on this machine, one copy of the base weights per model.

    model = gw.TrainableModel(name="agent-001", project="2048", base_model="smollm2-135m")
    await model.register(gw.LocalBackend(lora=gw.LoraConfig(rank=8)))
    await model.train(groups, config=gw.TrainConfig(learning_rate=1e-5))

Per registered model it holds: the base model wrapped with peft (one trainable adapter, peft's
"default"), an inference `Engine` over that same object, a `ModelRegistry` + FastAPI app (the app
`groupwise serve` exposes; here reached in process through an httpx ASGI transport), and a `Trainer`
with the AdamW state. After step k the adapter is saved to ``checkpoints/<k>/`` and loaded into the
engine as its own adapter, served as ``name@k`` and as ``name`` (latest).

A train step, in order (each step of the order is there for a failure seen in ART):
1. write the step's trajectories to the run store FIRST: a crash during training loses nothing;
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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from groupwise.backend.memory import release_freed_memory
from groupwise.backend.base import Backend, InferenceEndpoint, TrainResult
from groupwise.compute import compute_thread
from groupwise.config import LoraConfig, TrainConfig, TrainSFTConfig
from groupwise.errors import AdapterMismatchError, GroupwiseError
from groupwise.store import history_row, numeric_metrics

if TYPE_CHECKING:
    from groupwise.model import TrainableModel
    from groupwise.types import Trajectory, TrajectoryGroup

DEFAULT_PATH = ".groupwise"
API_KEY = "groupwise-local"


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
    """

    def __init__(
        self,
        path: str = DEFAULT_PATH,
        *,
        device: str | None = None,
        dtype: str | None = None,
        lora: LoraConfig | None = None,
        max_batch_size: int = 32,
        served_steps: int = 2,
        best_checkpoint_metric: str | None = "val/reward",
        verify_adapter: bool = True,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.path = str(path)
        self.device = device
        self.dtype = dtype
        self.lora = lora if lora is not None else LoraConfig()
        self.max_batch_size = max_batch_size
        self.served_steps = max(1, served_steps)
        self.best_checkpoint_metric = best_checkpoint_metric
        self.verify_adapter = verify_adapter
        self.engine_kwargs = dict(engine_kwargs or {})
        self._models: dict[str, _Served] = {}

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
        self._models[model.name] = await compute_thread().run(self._load, model)

    def _load(self, model: "TrainableModel") -> _Served:
        from groupwise.inference.engine import Engine
        from groupwise.inference.registry import ModelRegistry
        from groupwise.inference.server import create_app
        from groupwise.loading import load_base_model
        from groupwise.training.checkpoint import latest_checkpoint, load_checkpoint, replay_history
        from groupwise.training.trainer import Trainer, wrap_with_lora

        base, tokenizer = load_base_model(model.base_model, device=self.device, dtype=self.dtype)
        # TrainableModel(config=gw.LoraConfig(...)) overrides the backend's LoRA settings for that model.
        lora = model.config if isinstance(model.config, LoraConfig) else self.lora
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
            registry.add_step(model.name, state.step, str(state.path))
        return served

    # ------------------------------------------------------------------------------------ serve
    def inference_endpoint(self, model: "TrainableModel") -> InferenceEndpoint:
        from groupwise.inference.client import BASE_URL, in_process_http_client

        served = self._served(model)
        return InferenceEndpoint(base_url=BASE_URL, api_key=API_KEY, http_client=in_process_http_client(served.app))

    async def get_step(self, model: "TrainableModel") -> int:
        return self._served(model).step

    def checkpoint_cursor(self, model: "TrainableModel") -> dict[str, Any]:
        """The data cursor saved with the latest checkpoint (the store's state.json at save time);
        a loop resuming after a crash reads where its data stood when the step it resumes from ended."""
        return dict(self._served(model).cursor)

    # ------------------------------------------------------------------------------------ train
    async def train(
        self, model: "TrainableModel", groups: "list[TrajectoryGroup]", config: TrainConfig
    ) -> TrainResult:
        from groupwise.inference.tool_calls import prepare_messages
        from groupwise.training.tokenize import tokenize_groups

        served = self._served(model)
        async with served.lock:  # one step at a time per model
            t0 = time.perf_counter()
            step = served.step
            groups = list(groups)
            # 1. trajectories first: a crash in the step loses nothing.
            await asyncio.to_thread(served.store.write_trajectories, "train", step, groups)
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
        from groupwise.training.checkpoint import prune_checkpoints

        for old in served.registry.steps(model.name):
            if 0 < old <= step - self.served_steps:
                served.registry.remove_step(model.name, old)
        if self.best_checkpoint_metric is None:
            return
        by_step: dict[int, float] = {}
        split, _, key = self.best_checkpoint_metric.partition("/")
        if key:  # "val/reward": the val rows of history.jsonl; a val row at step k evaluates checkpoint k
            for row in served.store.history(skip_corrupt=True):
                if row.get("split") == split and isinstance(row.get(key), (int, float)):
                    by_step[int(row["step"])] = float(row[key])
        prune_checkpoints(served.store.checkpoints_dir, best_metric=self.best_checkpoint_metric, metrics_by_step=by_step)

    # ------------------------------------------------------------------------------------ close
    async def close(self) -> None:
        for served in self._models.values():
            served.engine.close()
        self._models.clear()

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "LocalBackend", "path": self.path, "device": self.device, "dtype": self.dtype,
            "lora": self.lora.to_dict(), "models": {k: v.step for k, v in self._models.items()},
        }
