"""`Replica`: one model on one device, the unit every backend places (in process, in a worker process,
or in a Ray actor).

It holds the base model wrapped with peft (one trainable adapter, peft's "default"), an inference `Engine`
over that same object (one copy of the base weights serves and trains), a `ModelRegistry` with its
FastAPI app, and a `Trainer` with the AdamW state (a data-parallel rank's trainer sums its gradients
over the process group). After step k the adapter is served as ``name@k`` and as ``name`` (latest).

Its methods are synchronous torch work: callers run them on the process's compute thread
(groupwise/compute.py), except `check_answers`, which sends a request through the app.
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Sequence
from typing import Any

from groupwise.adapter_names import served_name
from groupwise.config import LoraConfig, TrainConfig
from groupwise.errors import AdapterMismatchError, CheckpointError, GroupwiseError

API_KEY = "groupwise-local"
# Sequences an engine decodes together: the default of every backend, worker, replica and local judge.
DEFAULT_MAX_BATCH_SIZE = 32


def fingerprint(tensors: Any) -> list[int]:
    """Two integer sums over the raw bits of `tensors` (plain, and weighted by position): a flipped bit
    anywhere changes them, so equal fingerprints mean bitwise-equal tensors (short of a contrived
    collision). Cheap enough to compare the ranks' adapters after every step."""
    import torch

    plain = weighted = 0
    for t in tensors:
        bits = t.detach().contiguous().view(-1).view(torch.int32 if t.element_size() == 4 else torch.int16)
        bits = bits.to(torch.int64)
        plain += int(bits.sum())
        weighted += int((bits * torch.arange(1, bits.numel() + 1, device=bits.device) % 1_000_003).sum())
    return [plain, weighted]


class Replica:
    """A model served and trained on one device (module doc).

    Args:
        name: the served model name (``name``, ``name@k``).
        base_model: short name, local folder or Hugging Face id of the base.
        lora: the adapter's settings.
        device, dtype: where and in what precision the base weights live (None: the defaults of
            `groupwise.loading.load_base_model`).
        max_batch_size, engine_kwargs: the engine's settings.
        process_group: torch.distributed group of the data-parallel trainer ranks, or None.
        api_key: the key the app asks of every request (None: any; an app reached only in process).
        load_model: ``(base_model, device=, dtype=) -> (model, tokenizer)`` in place of
            `groupwise.loading.load_base_model` (e.g. a custom architecture or a random-init benchmark model).
    """

    def __init__(
        self,
        name: str,
        base_model: str,
        lora: LoraConfig,
        *,
        device: str | None = None,
        dtype: str | None = None,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        engine_kwargs: dict[str, Any] | None = None,
        process_group: Any = None,
        api_key: str | None = None,
        load_model: Any = None,
    ) -> None:
        from groupwise.inference.engine import Engine
        from groupwise.inference.registry import ModelRegistry
        from groupwise.inference.server import create_app
        from groupwise.loading import load_base_model
        from groupwise.training.trainer import Trainer, wrap_with_lora

        self.name = name
        base, self.tokenizer = (load_model or load_base_model)(base_model, device=device, dtype=dtype)
        self.peft_model = wrap_with_lora(base, lora)
        self.peft_model.eval()
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.trainer = Trainer(self.peft_model, pad_token_id=pad, process_group=process_group)
        self.engine = Engine(self.peft_model, self.tokenizer, max_batch_size=max_batch_size, **(engine_kwargs or {}))
        self.registry = ModelRegistry(self.engine, base_name=base_model)
        self.registry.register_model(name)
        self.api_key = api_key
        self.app = create_app(self.registry, api_key=api_key)

    @property
    def device(self) -> Any:
        return self.trainer.device

    def _param_names(self) -> list[str]:
        return [n for n, _ in self.trainer.trainable_named_parameters()]

    # ------------------------------------------------------------------------------ checkpoints
    def resume(self, checkpoints_dir: str | Path) -> Any:
        """Load the latest complete checkpoint (adapter, optimizer, RNG) and serve it; returns its
        `CheckpointState`, or None when there is none."""
        from groupwise.training.checkpoint import latest_checkpoint, load_checkpoint

        state = latest_checkpoint(checkpoints_dir)
        if state is None:
            return None
        self.serve(state.step, str(state.path))  # first: loading an adapter into the engine draws random numbers
        self.trainer.ensure_optimizer(TrainConfig())  # lr and weight decay are reset by each step's config
        load_checkpoint(state, model=self.peft_model, optimizer=self.trainer.optimizer, param_names=self._param_names())
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

    def save(self, checkpoints_dir: str | Path, step: int, metrics: dict[str, float], cursor: dict[str, Any],
             history: list[dict[str, Any]] | None = None) -> Path:
        """Write checkpoint `step` atomically (adapter, optimizer, RNG, cursor, metrics, and the step's
        history rows, which a resume replays if the run store lacks them)."""
        from groupwise.training.checkpoint import save_checkpoint

        return save_checkpoint(
            checkpoints_dir, step, model=self.peft_model, optimizer=self.trainer.optimizer,
            param_names=self._param_names(), adapter_name=self.trainer.adapter_name, cursor=cursor, metrics=metrics,
            history=history,
        )

    def save_adapter(self, folder: str | Path) -> Path:
        """Only the adapter, in peft's format: what a data-parallel rank > 0 loads into its own engine."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.peft_model.save_pretrained(str(folder), selected_adapters=[self.trainer.adapter_name],
                                        safe_serialization=True)
        return folder

    # ------------------------------------------------------------------------------ serving
    def serve(self, step: int, adapter_path: str) -> None:
        """Load the adapter folder of `step` into the engine, served as ``name@step``."""
        self.registry.add_step(self.name, step, adapter_path)

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

    def unserve_before(self, step: int, served_steps: int, keep: Sequence[int] = ()) -> None:
        """Stop serving steps older than the last `served_steps` (the base and `keep` stay)."""
        for old in self.registry.steps(self.name):
            if 0 < old <= step - served_steps and old not in keep:
                self.registry.remove_step(self.name, old)

    def served_steps(self) -> list[int]:
        return self.registry.steps(self.name)

    # ------------------------------------------------------------------------------ checks
    def check_adapter(self, step: int, checkpoint_path: str | None = None) -> None:
        """The engine's adapter for `step` holds the trainer's weights, tensor for tensor."""
        import torch

        served = served_name(self.name, step)
        slot = self.engine.peft_adapter_name(self.registry.adapter_name(self.name, step))  # peft's name of it
        trained = dict(self.trainer.trainable_named_parameters())
        tag = f".{self.trainer.adapter_name}."
        mismatched, found = [], False
        for name, param in self.peft_model.named_parameters():
            if f".{slot}." in name:
                found = True
                ref = trained.get(name.replace(f".{slot}.", tag))
                if ref is None or not torch.equal(ref.detach().to(param.dtype), param.detach()):
                    mismatched.append(name.replace(f".{slot}.", "."))  # the tensor, without peft's adapter key
        if mismatched or not found:
            raise AdapterMismatchError(
                f"after step {step} the engine's {served!r} does not hold the trained weights "
                f"({len(mismatched)} tensor(s) differ, e.g. {mismatched[:2]}). The adapter at "
                f"{checkpoint_path} was not what the engine loaded; the rollouts would sample a stale policy."
            )

    async def check_answers(self, step: int) -> None:
        """A real chat request for ``name`` through the app is answered by ``name@step``."""
        from groupwise.inference.client import in_process_client

        client = in_process_client(self.app, api_key=self.api_key or API_KEY)
        try:
            response = await client.chat.completions.create(
                model=self.name, messages=[{"role": "user", "content": "ping"}], max_tokens=1, temperature=0.0
            )
        finally:
            await client.close()
        expected = served_name(self.name, step)
        if response.model != expected:
            raise AdapterMismatchError(
                f"after step {step} the server answers requests for {self.name!r} as {response.model!r}, "
                f"expected {expected!r}: the new adapter is not the one served. Rollouts would sample a stale policy."
            )

    def adapter_fingerprint(self) -> list[int]:
        """`fingerprint` of the trainable adapter: equal on two ranks means bitwise equal adapters."""
        return fingerprint(p for _, p in self.trainer.trainable_named_parameters())

    def close(self) -> None:
        self.engine.close()
