"""`Replica`: one model on one device, the unit every backend places (in process, in a worker process,
or in a Ray actor), and `SharedBase`: the base model its replicas share.

A `SharedBase` holds the base model wrapped with peft, an inference `Engine` over that same object (one
copy of the base weights serves and trains), and a `ModelRegistry` with its FastAPI app. Every model of
that base registered on the worker is a `Replica` of it: its own trainable LoRA adapter in the one peft
model (peft's "default" for the first, ``gw-train-<k>`` for the others), its own `Trainer` with its own
AdamW state, and its names in the one registry. So several runs on one base cost one copy of the base
weights and one engine: their rollouts share its batches (each request names its adapter), and their
updates take turns on the base weights, each moving only its own adapter (the trainer activates it
and trains its parameters only). After step k a replica's adapter is served as ``name@k`` and as
``name`` (latest).

Its methods are synchronous torch work: callers run them on the process's compute thread
(groupwise/runtime/compute.py), except `check_answers`, which reads only the registry and the engine's names.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from groupwise.core.adapter_names import served_name
from groupwise.config import DEFAULT_MAX_BATCH_SIZE, LoraConfig, TrainConfig
from groupwise.errors import AdapterMismatchError, CheckpointError, CheckpointMismatchError, GroupwiseError, ModelNotFoundError

API_KEY = "groupwise-local"
# Sequences an engine decodes together: the default of every backend, worker, replica and local judge.


def fingerprint(tensors: Any) -> list[int]:
    """Two integer sums over the raw bits of `tensors` (plain, and weighted by position): a flipped bit
    anywhere changes them, so equal fingerprints mean bitwise-equal tensors (short of a contrived
    collision). Cheap enough to compare the ranks' adapters after every step: the sums stay on the
    tensors' device until one read at the end (a read per tensor waited on the GPU hundreds of times)."""
    import torch

    # Tensors of one shape are summed in one pass: a few launches per shape, not per tensor (hundreds).
    groups: dict[tuple, list[Any]] = {}
    for t in tensors:
        groups.setdefault((tuple(t.shape), t.dtype, t.device), []).append(t.detach())
    sums = []
    for (_, _, device), ts in groups.items():
        flat = torch.stack(ts).contiguous().view(len(ts), -1)
        bits = flat.view(torch.int32 if flat.element_size() == 4 else torch.int16).to(torch.int64)
        position = torch.arange(1, bits.shape[1] + 1, device=device)
        sums.append(torch.stack([bits.sum(), (bits * position % 1_000_003).sum()]))
    if not sums:
        return [0, 0]
    plain, weighted = torch.stack([s.to(sums[0].device) for s in sums]).sum(dim=0).tolist()  # int64: no overflow at LoRA sizes
    return [int(plain), int(weighted)]


def _check_memory(model: Any, base_model: str, lora: LoraConfig, max_batch_size: int,
                  engine_kwargs: dict[str, Any] | None, memory_budget_gb: float | None) -> Any:
    """The base's memory budget (backend/budget.py), checked against the device's free memory now that
    its weights are loaded and before the engine and trainers allocate; the weights go on a refusal."""
    from groupwise.backend.budget import check_budget, estimate_budget

    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    budget = estimate_budget(parameters=sum(p.numel() for p in params), config=model.config,
                             dtype_bytes=params[0].element_size(),
                             max_batch_size=max_batch_size, lora_rank=lora.rank,
                             lora_targets=len(lora.target_modules), stated_gb=memory_budget_gb)
    if (engine_kwargs or {}).get("max_kv_bytes") is not None:  # the engine's own bound on its KV cache
        budget.kv_cache = min(budget.kv_cache, int(engine_kwargs["max_kv_bytes"]))  # type: ignore[index]
    check_budget(budget, params[0].device, base_model=base_model, held=weights)
    return budget


def _names_a_model(source: str) -> bool:
    """Whether a teacher that is no checkpoint names a model to load: a short name, a folder with a model's
    config.json, or a Hugging Face id (``org/name``: no such local path, nor one that reads as a path, such
    as a run folder under an existing local folder: asking the hub for that costs its retries, a minute)."""
    from groupwise.runtime.loading import SHORT_NAMES

    path = Path(source).expanduser()
    if source in SHORT_NAMES or (path / "config.json").is_file():
        return True
    reads_as_path = source.startswith(("/", ".", "~")) or path.exists() or path.parent.is_dir()
    return not reads_as_path and source.count("/") == 1


class SharedBase:
    """A base model on one device, served by one engine and shared by the replicas of its models (module doc).

    Args:
        base_model: short name, local folder or Hugging Face id of the base.
        lora: the first adapter's settings (the first replica's).
        device, dtype: where and in what precision the base weights live (None: the defaults of
            `groupwise.runtime.loading.load_base_model`).
        max_batch_size, engine_kwargs: the engine's settings.
        api_key: the key the app asks of every request (None: any; an app reached only in process).
        load_model: ``(base_model, device=, dtype=) -> (model, tokenizer)`` in place of
            `groupwise.runtime.loading.load_base_model` (e.g. a custom architecture or a random-init benchmark model).
        memory_budget_gb: the memory this base and its runs may use on the device, in place of the
            estimate (backend/budget.py); either is checked against the device's free memory.
    """

    def __init__(
        self,
        base_model: str,
        lora: LoraConfig,
        *,
        device: str | None = None,
        dtype: str | None = None,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        engine_kwargs: dict[str, Any] | None = None,
        api_key: str | None = None,
        load_model: Any = None,
        memory_budget_gb: float | None = None,
    ) -> None:
        from groupwise.inference.engine import Engine
        from groupwise.inference.registry import ModelRegistry
        from groupwise.inference.server import create_app
        from groupwise.runtime.loading import load_base_model
        from groupwise.training.adapters import TRAIN_ADAPTER, wrap_with_lora
        from groupwise.training.checkpoint import base_fingerprint

        self.base_model = base_model
        base, self.tokenizer = (load_model or load_base_model)(base_model, device=device, dtype=dtype)
        # what its checkpoints record and a resume checks: before any adapter exists or is merged in
        self.identity = {"name": base_model, "fingerprint": base_fingerprint(base)}
        self.budget = _check_memory(base, base_model, lora, max_batch_size, engine_kwargs, memory_budget_gb)
        self.peft_model = wrap_with_lora(base, lora)
        self.peft_model.eval()
        self.engine = Engine(self.peft_model, self.tokenizer, max_batch_size=max_batch_size, **(engine_kwargs or {}))
        self.registry = ModelRegistry(self.engine, base_name=base_model)
        self.api_key = api_key
        self.app = create_app(self.registry, api_key=api_key)
        # Trainable adapters made but never trained, with their settings: the one made with the model.
        self._fresh: dict[str, LoraConfig] = {TRAIN_ADAPTER: lora}
        self._held: dict[str, str] = {}  # model name -> its trainable adapter
        self._serial = 0
        self._teachers: dict[str, Any] = {}  # distillation teachers of other bases, by TrainConfig.teacher

    def teacher_model(self, source: str) -> Any:
        """The frozen teacher `source`, another base model of this base's vocabulary (training/teacher.py),
        loaded on first use and then shared by every run of this base that names it."""
        from groupwise.training.teacher import load_teacher

        if source not in self._teachers:
            param = next(self.peft_model.parameters())
            self._teachers[source] = load_teacher(source, student_model=self.peft_model, student_tokenizer=self.tokenizer,
                                                  device=param.device, dtype=param.dtype)
        return self._teachers[source]

    def hold_adapter(self, name: str, lora: LoraConfig) -> str:
        """A fresh trainable adapter for model `name`: the one made with the model while it is free, else a
        new one, initialised from `lora.seed` as `wrap_with_lora` initialises the first (the same
        tensors a run training alone starts from)."""
        from groupwise.training.adapters import add_lora_adapter

        if name in self._held:
            raise GroupwiseError(f"model {name!r} already holds an adapter of base {self.base_model!r}")
        if self._held:
            self._check_join()
        adapter = next((a for a, made_with in self._fresh.items() if made_with == lora), None)
        if adapter is None:
            self._serial += 1
            adapter = f"gw-train-{self._serial}"
            add_lora_adapter(self.peft_model, lora, adapter)
        else:
            del self._fresh[adapter]
        self._held[name] = adapter
        self.budget.models = max(1, len(self._held))
        return adapter

    def _check_join(self) -> None:
        """Refuse (`MemoryBudgetError`) a run joining this base when the device cannot hold one more run's
        adapter and AdamW state: the budget counts every run on the base, and the part of it the runs
        already here were admitted with counts as held by this process."""
        from groupwise.backend.budget import check_budget

        held = self.budget.total
        joined = dataclasses.replace(self.budget, models=len(self._held) + 1)
        check_budget(joined, self.engine.device, base_model=self.base_model, held=held)

    def release_adapter(self, name: str) -> bool:
        """Model `name` is gone: its adapter and served steps go. True when no model is left (close the base)."""
        adapter = self._held.pop(name, None)
        self.budget.models = max(1, len(self._held))
        self.registry.unregister_model(name)
        if self._held and adapter is not None:  # the last model's adapter goes with the base
            with warnings.catch_warnings():  # peft warns that the active adapter changes: each trainer activates its own
                warnings.filterwarnings("ignore", message=r"Adapter .* was active which is now deleted")
                self.peft_model.delete_adapter(adapter)
        return not self._held

    @property
    def models(self) -> list[str]:
        return sorted(self._held)

    def close(self) -> None:
        self._teachers.clear()
        self.engine.close()


class Replica:
    """A model served and trained on one device (module doc): its adapter in `base`'s peft model.

    Args:
        name: the run's served name (``name``, ``name@k``): its qualified name, `RunId.key`, on a backend.
        base: the `SharedBase` of its base model on this device.
        lora: the adapter's settings.
        process_group: torch.distributed group of the data-parallel trainer ranks, or None.
        trains: False for a replica that only generates: no `Trainer` (``trainer`` is None), no optimizer;
            it serves the adapters the trainer ranks checkpoint (`serve`, `resume`).
        short_name: the model's own name, which requests may use while no other run of the base has it
            (inference/registry.py).
    """

    def __init__(self, name: str, base: SharedBase, lora: LoraConfig, *, process_group: Any = None,
                 trains: bool = True, short_name: str | None = None) -> None:
        from groupwise.training.trainer import Trainer

        self.name = name
        self.base = base
        # A replica that only generates (BackendOptions.train_workers) still holds a trainable adapter of
        # the lora settings: the served adapters' names and shapes are those of the trained one.
        self.adapter = adapter = base.hold_adapter(name, lora)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        try:
            self.trainer: Any = (Trainer(self.peft_model, pad_token_id=pad, adapter_name=adapter,
                                         process_group=process_group) if trains else None)
            self.registry.register_model(name, short=short_name)
        except BaseException:
            base.release_adapter(name)
            raise

    @property
    def peft_model(self) -> Any:
        return self.base.peft_model

    @property
    def tokenizer(self) -> Any:
        return self.base.tokenizer

    @property
    def engine(self) -> Any:
        return self.base.engine

    @property
    def registry(self) -> Any:
        return self.base.registry

    @property
    def app(self) -> Any:
        return self.base.app

    @property
    def device(self) -> Any:
        return self.trainer.device if self.trainer is not None else self.engine.device

    def _param_names(self) -> list[str]:
        return [n for n, _ in self.trainer.trainable_named_parameters()]

    # ------------------------------------------------------------------------------ checkpoints
    def resume(self, checkpoints_dir: str | Path) -> Any:
        """Load the latest complete checkpoint (adapter, optimizer, RNG) and serve it; returns its
        `CheckpointState`, or None when there is none."""
        from groupwise.training.checkpoint import base_problem, latest_checkpoint, load_checkpoint

        state = latest_checkpoint(checkpoints_dir)
        if state is None:
            return None
        problem = base_problem(state, self.base.identity)
        if problem:
            raise CheckpointMismatchError(problem)
        self.serve(state.step, str(state.path))  # first: loading an adapter into the engine draws random numbers
        if self.trainer is None:  # a generator serves the checkpoint; it has no adapter or optimizer to train
            return state
        self.trainer.ensure_optimizer(TrainConfig())  # lr and weight decay are reset by each step's config
        load_checkpoint(state, model=self.peft_model, optimizer=self.trainer.optimizer, param_names=self._param_names(),
                        adapter_name=self.trainer.adapter_name)
        return state

    def use_kl_reference(self, checkpoints_dir: str | Path, step: int | None) -> None:
        """Anchor the trainer's KL term at checkpoint `step`'s adapter (None or 0: the base model), read
        from disk only when the step changes (TrainConfig.kl_reference_step)."""
        from groupwise.training.checkpoint import adapter_tensors, list_checkpoints, read_state, step_dir_name
        from groupwise.training.checkpoint import verify_checkpoint

        step = step or None
        if step == self.trainer.reference_step:
            return
        if step is None:
            self.trainer.set_reference(None, step=None)
            return
        path = Path(checkpoints_dir) / step_dir_name(step)
        state = read_state(path)
        if state is None:
            kept = [s.step for s in list_checkpoints(checkpoints_dir, warn=False)]
            raise CheckpointError(
                f"TrainConfig.kl_reference_step={step}: there is no checkpoint {path} of {self.name!r} (kept: {kept}). "
                "It was not written yet, or retention deleted it: retention keeps the latest, the best and the KL "
                "reference of the last GRPO step, so name the step from the first GRPO step after it (e.g. right "
                "after a warm start), or keep every checkpoint with best_checkpoint_metric=None. Else set "
                "kl_reference_step to a kept step, or None for the base model."
            )
        problem = verify_checkpoint(state)
        if problem is not None:
            raise CheckpointError(f"TrainConfig.kl_reference_step={step}: checkpoint {path} is corrupt ({problem}); "
                                  "set kl_reference_step to another kept step, or None for the base model.")
        tensors = adapter_tensors(state, model=self.peft_model, param_names=self._param_names(),
                                  adapter_name=self.trainer.adapter_name)
        self.trainer.set_reference(tensors, step=step)

    def use_teacher(self, source: str) -> None:
        """Distil the trainer toward `source` (TrainConfig.teacher): "base" (the adapter disabled), a
        checkpoint folder (or a run folder) of an adapter of this base, or another base model of this base's
        vocabulary (a short name, a model folder, a Hugging Face id; `SharedBase.teacher_model`); read or
        loaded only when the source changes."""
        from groupwise.training.checkpoint import adapter_tensors, base_problem, latest_checkpoint, read_state
        from groupwise.training.checkpoint import verify_checkpoint

        if source == self.trainer.teacher:
            return
        if source == "base":
            self.trainer.set_teacher(None, source="base")
            return
        path = Path(source).expanduser()
        # a step's folder (checkpoints/<k>) or a run's checkpoints folder (its latest step)
        state = read_state(path) or latest_checkpoint(path) or latest_checkpoint(path / "checkpoints")
        if state is None and _names_a_model(source):
            try:
                model = self.base.teacher_model(source)
            except ModelNotFoundError as exc:  # neither: say both, since a run folder's path may read as an HF id
                raise CheckpointError(f"TrainConfig.teacher={source!r}: no checkpoint there, nor a model of that "
                                      f"name: {exc}") from exc
            self.trainer.set_teacher(None, source=source, model=model)
            return
        if state is None:
            raise CheckpointError(f"TrainConfig.teacher={source!r}: no checkpoint there (a checkpoint folder holds "
                                  "state.json and adapter_model.safetensors), nor a model (a folder with config.json). "
                                  "Name a step's folder, e.g. <run>/checkpoints/<step>, a run folder, another base "
                                  "model of the same tokenizer, or 'base' for the base model.")
        problem = verify_checkpoint(state) or base_problem(state, self.base.identity)
        if problem is not None:
            raise CheckpointError(f"TrainConfig.teacher={source!r}: checkpoint {state.path} cannot teach this run: "
                                  f"{problem}")
        tensors = adapter_tensors(state, model=self.peft_model, param_names=self._param_names(),
                                  adapter_name=self.trainer.adapter_name)
        self.trainer.set_teacher(tensors, source=source)

    def snapshot(self, step: int) -> Any:
        """The checkpoint of `step` (adapter, optimizer, RNG) as CPU copies (training/checkpoint.py's
        `CheckpointSnapshot`): on the compute thread, between updates; `write` puts it on disk with the
        cursor, metrics and the step's history rows (which a resume replays if the run store lacks them)."""
        from groupwise.training.checkpoint import snapshot_checkpoint

        return snapshot_checkpoint(step, model=self.peft_model, optimizer=self.trainer.optimizer,
                                   param_names=self._param_names(), adapter_name=self.trainer.adapter_name,
                                   state=self.trainer.adapter_state(), base=self.base.identity)

    @staticmethod
    def write(checkpoints_dir: str | Path, snap: Any, metrics: dict[str, float], cursor: dict[str, Any],
              history: list[dict[str, Any]] | None = None) -> Path:
        """Write a `snapshot` as its step's checkpoint folder; needs no model, so any thread."""
        from groupwise.training.checkpoint import write_checkpoint

        return write_checkpoint(checkpoints_dir, snap, cursor=cursor, metrics=metrics, history=history)

    def adapter_snapshot(self) -> tuple[dict[str, Any], Any]:
        """(CPU copies of the trained adapter's tensors, its peft config): what a data-parallel rank > 0
        serves, without a checkpoint of its own."""
        from groupwise.training.adapters import adapter_snapshot

        return adapter_snapshot(self.peft_model, self.adapter,
                                self.trainer.adapter_state() if self.trainer is not None else None)

    def reserve_slots(self, n: int) -> None:
        """Make the engine's `n` adapter slots for this model's served steps now (Engine.reserve_slots)."""
        if n > 0:
            tensors, config = self.adapter_snapshot()
            self.engine.reserve_slots(n, weights=tensors, config=config)

    # ------------------------------------------------------------------------------ serving
    def serve(self, step: int, adapter_path: str | None, weights: dict[str, Any] | None = None,
              config: Any = None) -> None:
        """Serve the adapter of `step` as ``name@step``: its folder, or its `weights` and peft `config`
        (a snapshot of the trainer's, handed over in memory)."""
        self.registry.add_step(self.name, step, adapter_path, weights=weights, config=config)

    def serve_checkpoint(self, checkpoints_dir: str | Path, step: int) -> None:
        """Serve ``name@step`` from its kept checkpoint unless it is served already."""
        from groupwise.training.checkpoint import read_state, step_dir_name

        if step == 0 or step in self.registry.steps(self.name):
            return
        path = Path(checkpoints_dir) / step_dir_name(step)
        if read_state(path) is None:
            raise GroupwiseError(
                f"checkpoint of step {step} of {self.name!r} is missing at {path} (retention removed it, or it "
                "was never written); only the latest checkpoint and the one named by keep_best() are kept."
            )
        self.serve(step, str(path))

    def unserve(self, step: int) -> None:
        """Stop serving `step` (its checkpoint could not be written): no request is answered by weights
        that no checkpoint holds; ``name`` is refused until the run is loaded again (registry.py)."""
        self.registry.remove_step(self.name, step)

    def unserve_before(self, step: int, served_steps: int, keep: Sequence[int] = ()) -> None:
        """Stop serving steps older than the last `served_steps` (the base and `keep` stay)."""
        for old in self.registry.steps(self.name):
            if 0 < old <= step - served_steps and old not in keep:
                self.registry.remove_step(self.name, old)

    def served_steps(self) -> list[int]:
        return self.registry.steps(self.name)

    # ------------------------------------------------------------------------------ checks
    def check_adapter(self, step: int) -> None:
        """The engine's adapter for `step` holds the trainer's weights, tensor for tensor (one flat comparison
        and one device sync)."""
        import torch

        from groupwise.training.bulk import all_equal

        served = served_name(self.name, step)
        engine_has = self.engine.adapter_parameters(self.registry.adapter_name(self.name, step))
        trained = self.trainer.adapter_state()
        both = sorted(engine_has.keys() & trained.keys())
        mismatched = sorted(engine_has.keys() ^ trained.keys()) + [
            k for k in both if engine_has[k].shape != trained[k].shape]
        comparable = [k for k in both if engine_has[k].shape == trained[k].shape]
        if comparable and not all_equal([trained[k] for k in comparable], [engine_has[k] for k in comparable]):
            # which ones differ, one by one: only on the way to the error
            equal = torch.stack([(trained[k].detach().to(engine_has[k].dtype) == engine_has[k].detach()).all()
                                 for k in comparable]).tolist()
            mismatched += [k for k, ok in zip(comparable, equal) if not ok]
        if mismatched or not engine_has:
            self.registry.remove_step(self.name, step)  # never served under a name that means the trained step
            raise AdapterMismatchError(
                f"after step {step} the engine's {served!r} does not hold the trained weights "
                f"({len(mismatched)} tensor(s) differ, e.g. {mismatched[:2]}): the new adapter was not what the "
                "engine loaded; the rollouts would sample a stale policy."
            )

    def check_answers(self, step: int) -> None:
        """A request for ``name`` is answered by ``name@step``: the app's registry (what its routes
        resolve a request's model with, before the engine sees it) maps ``name`` to this step's adapter,
        and the engine holds that adapter. Without generating: a real request cost a prefill pass per
        run and step on the thread that steps the engine, and the step's first rollout runs one anyway;
        that the adapter holds the trained weights is `check_adapter`'s."""
        expected = served_name(self.name, step)
        try:
            target = self.registry.resolve(self.name)
        except ModelNotFoundError as exc:
            answered = f"with an error ({exc})"
        else:
            if target.served_as == expected and target.adapter in self.engine.adapters():
                return
            answered = f"as {target.served_as!r} with adapter {target.adapter!r}"
        self.registry.remove_step(self.name, step)  # `name` is then refused, never answered by another step
        raise AdapterMismatchError(
            f"after step {step} the server answers requests for {self.name!r} {answered}, expected "
            f"{expected!r} (an adapter the engine holds): the new adapter is not the one served. Rollouts "
            "would sample a stale policy."
        )

    def adapter_fingerprint(self) -> list[int] | None:
        """`fingerprint` of the trainable adapter: equal on two ranks means bitwise equal adapters (None on
        a replica that only generates: it trains nothing)."""
        if self.trainer is None:
            return None
        return fingerprint(p for _, p in self.trainer.trainable_named_parameters())

    def served_fingerprint(self, step: int) -> list[int]:
        """`fingerprint` of what the engine serves as ``name@step``: equal on a trainer rank and a generator
        means the generator serves the trained adapter bit for bit (rank 0's `check_adapter` ties its
        served copy to the trainer's tensors). Read from the slot's kept tensors, without a walk over
        the model each step (the fingerprint does not depend on their order or names)."""
        return fingerprint(self.engine.adapter_parameters(self.registry.adapter_name(self.name, step)).values())

    def served_tensors(self, step: int) -> dict[str, Any]:
        """CPU copies of the tensors served as ``name@step``, by the trainable adapter's parameter names
        (peft's slot name replaced by the adapter's)."""
        slot = f".{self.engine.peft_adapter_name(self.registry.adapter_name(self.name, step))}."
        return {n.replace(slot, f".{self.adapter}."): p.detach().cpu().clone()
                for n, p in self.peft_model.named_parameters() if "lora_" in n and slot in n}

    def close(self) -> bool:
        """Drop this model's adapter and served steps from the shared base. True when the base serves no
        model any more (the caller closes it)."""
        return self.base.release_adapter(self.name)
