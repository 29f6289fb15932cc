"""Checkpoints: everything a step needs to resume exactly, written atomically, no pickle.

Layout of ``checkpoints/<step:04d>/``::

    adapter_model.safetensors, adapter_config.json   the LoRA adapter (peft format; the engine loads it)
    optimizer.safetensors                            AdamW tensors, keyed "<param name>::<exp_avg|...>"
    optimizer.json                                   param groups (lr, betas, ...) with param NAMES
    rng.safetensors, rng.json                        torch CPU/CUDA RNG states; Python and NumPy RNG
    state.json                                       step, data cursor, metrics, the step's history
                                                     rows, each file's size and sha256, the base
                                                     model's name and weights digest: written LAST

A checkpoint is written into ``checkpoints/.tmp-<step>-<pid>/`` and renamed into place; `state.json`
is the completeness marker, so a folder without it (a process killed mid-save on a filesystem where
rename is not atomic, or by hand) is ignored with a warning and never resumed from. A complete
folder whose files no longer match the sizes and hashes in its state.json (a disk error, a copy cut
short, an edit) is corrupt: `latest_checkpoint` skips it with a warning naming it and what is
wrong, and the run resumes from the newest intact one. Intact also means usable: the step in
state.json matches the folder, the adapter and optimizer state are finite, and the optimizer and RNG
states have the shape a resume restores (training/checkpoint_contents.py); a checkpoint failing any of
these is skipped the same way.

A non-finite adapter is never written (`NonFiniteError`), and a save that fails (a full disk:
`DiskFullError`) removes its partial folder, so no ``.tmp-*`` is left behind. Retention deletes a
checkpoint by renaming it to ``.deleted-*`` first and removing its files after (`prune_checkpoints`).

A completed step is one unit: its history rows travel in its checkpoint's state.json, and a run
that resumes from it appends any of them that history.jsonl lacks (a crash between the checkpoint
and the history append lost none: the backend's `register` replays them).

A checkpoint belongs to the base weights it was trained on: a run loaded on other weights of the same
shape (another seed or fine-tune of the architecture) is refused at resume (`base_problem`), where
loading would have gone on training the adapter and its optimizer on the wrong base, silently. The
digest (`base_fingerprint`) does not depend on the dtype the weights are loaded in.

Optimizer tensors are stored by parameter name, not by position (training/optimizer_state.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import time
import warnings
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from groupwise.config import CheckpointRetention
from groupwise.errors import CheckpointError, CheckpointMismatchError, DiskFullError, GroupwiseWarning, NonFiniteError
from groupwise.runs.store import dir_name_step, step_dir_name
from groupwise.runtime.compute import usable_cores
from groupwise.runtime.loading import write_adapter_folder
from groupwise.runtime.tensor_files import file_fingerprint, save_tensors
from groupwise.training.adapters import TRAIN_ADAPTER, adapter_snapshot
from groupwise.training.checkpoint_contents import contents_problem, state_problem
from groupwise.training.finite import non_finite_names
from groupwise.training.optimizer_state import optimizer_from_tensors, optimizer_to_tensors

STATE_FILE = "state.json"
FORMAT_VERSION = 1
DELETED_PREFIX = ".deleted-"  # a checkpoint retention deleted, until its files are removed (`prune_checkpoints`)


@dataclass
class CheckpointState:
    """What `state.json` holds."""

    step: int
    cursor: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    path: Path | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # the step's history rows
    files: dict[str, dict[str, Any]] | list[str] = field(default_factory=dict)  # name -> {bytes, sha256}
    base: dict[str, Any] | None = None  # the base model it was trained on: {"name", "fingerprint"} (`base_fingerprint`)


def base_fingerprint(model: Any) -> str | None:
    """A digest of a base model's weights that a resume compares with its checkpoint's: the same weights
    give the same digest in any dtype they are loaded in (each sampled value is rounded to bfloat16
    first), another checkpoint of the same shape (another seed, another fine-tune) a different one.
    Samples up to 4096 evenly spaced values of the first, middle and last weight tensors by name, on
    their device; takes milliseconds. Call it before any adapter is merged into the weights. None for
    weights not loaded yet (meta tensors): then nothing is checked."""
    named = sorted((n, p) for n, p in model.named_parameters() if "lora_" not in n)
    if not named or any(p.is_meta for _, p in named):
        return None
    digest = hashlib.sha256()
    for name, param in {named[i][0]: named[i][1] for i in (0, len(named) // 2, len(named) - 1)}.items():
        flat = param.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 4096)][:4096]
        digest.update(f"{name}:{tuple(param.shape)}:".encode())
        digest.update(sample.to(torch.bfloat16).view(torch.int16).cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def base_problem(state: CheckpointState, base: dict[str, Any] | None) -> str | None:
    """Why `state` must not be resumed on `base` ({"name", "fingerprint"} of the loaded base), or None.
    A checkpoint that records no base (written before bases were recorded) is not checked."""
    saved = state.base
    if not saved or not base or saved.get("fingerprint") in (None, base.get("fingerprint")):
        return None
    return (f"checkpoint {state.path} was trained on base model {saved.get('name')!r} (weights "
            f"{saved.get('fingerprint')}), but this run loaded {base.get('name')!r} (weights {base.get('fingerprint')}): "
            "its adapter and optimizer belong to other weights, and would train on silently. Register the model "
            "with the base it was trained on, or give the new run its own name (TrainableModel(run_name=...)).")


def _write_json(path: Path, obj: Any) -> dict[str, Any]:
    """`obj` as JSON, synced to disk; returns the file's fingerprint (`file_fingerprint`'s form)."""
    data = json.dumps(obj, indent=1, sort_keys=True).encode()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- RNG state


def _rng_state() -> tuple[dict[str, torch.Tensor], dict]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    version, internal, gauss = random.getstate()
    meta: dict[str, Any] = {"python": [version, list(internal), gauss]}
    try:
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state()
        meta["numpy"] = [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    except ImportError:  # numpy is a core dependency, but RNG restore must not be why a save fails
        pass
    return tensors, meta


def _set_rng_state(tensors: dict[str, torch.Tensor], meta: dict) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("torch_cuda_"))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in meta:
        import numpy as np

        name, keys, pos, has_gauss, cached = meta["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


# ----------------------------------------------------------------------------- save / find / load


def save_checkpoint(
    checkpoints_dir: str | Path,
    step: int,
    *,
    model: Any,
    optimizer: torch.optim.Optimizer | None,
    param_names: list[str],
    adapter_name: str = TRAIN_ADAPTER,
    cursor: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    history: list[dict[str, Any]] | None = None,
) -> Path:
    """Save step `step` atomically into ``checkpoints_dir/<step:04d>/``; returns that folder.
    `history`: the rows of the step (the store appends them; a resume replays any it lacks)."""
    snap = snapshot_checkpoint(step, model=model, optimizer=optimizer, param_names=param_names,
                               adapter_name=adapter_name)
    return write_checkpoint(checkpoints_dir, snap, cursor=cursor, metrics=metrics, history=history)


@dataclass
class CheckpointSnapshot:
    """A step's checkpoint as CPU tensors, taken where the model lives. Why two halves: the snapshot
    needs the model (on the backend's compute thread, between updates); `write_checkpoint` needs only
    the snapshot, so serialising, hashing and writing the files run on another thread while the compute
    thread goes on stepping the engine (other runs' rollouts, compute.py)."""

    step: int
    adapter: dict[str, torch.Tensor]  # peft's state dict of the adapter (keys without the adapter's name)
    adapter_config: Any  # its peft config, as peft saves it (inference_mode=True)
    optimizer: tuple[dict[str, torch.Tensor], dict] | None
    rng: tuple[dict[str, torch.Tensor], dict]
    base: dict[str, Any] | None = None  # {"name", "fingerprint"} of the base model (`base_fingerprint`)


def snapshot_checkpoint(step: int, *, model: Any, optimizer: torch.optim.Optimizer | None, param_names: list[str],
                        adapter_name: str = TRAIN_ADAPTER, state: dict[str, torch.Tensor] | None = None,
                        base: dict[str, Any] | None = None) -> CheckpointSnapshot:
    """The checkpoint of `step` as CPU copies (`CheckpointSnapshot`); refuses a non-finite adapter.
    `state`: the adapter's live parameters by peft's keys, when the caller keeps them
    (`Trainer.adapter_state`): then no walk over the model's parameters."""
    if state is not None:
        named = list(state.items())
    else:
        params = dict(model.named_parameters())
        named = [(n, params[n]) for n in param_names if n in params]
    bad = non_finite_names(named)
    if bad:
        raise NonFiniteError(
            f"step {step} was not checkpointed: {len(bad)} of the adapter's {len(param_names)} tensors hold nan or "
            f"inf (e.g. {bad[:2]}); a resume must never start from a diverged adapter. Lower the learning rate."
        )
    tensors, config = adapter_snapshot(model, adapter_name, state)
    opt = None
    if optimizer is not None:
        opt = optimizer_to_tensors(optimizer, stored_names(param_names, adapter_name))
    return CheckpointSnapshot(step, tensors, config, opt, _rng_state(), base)


def write_checkpoint(checkpoints_dir: str | Path, snap: CheckpointSnapshot, *, cursor: dict[str, Any] | None = None,
                     metrics: dict[str, float] | None = None, history: list[dict[str, Any]] | None = None) -> Path:
    """Write `snap` atomically into ``checkpoints_dir/<step:04d>/`` (module doc); any thread."""
    root = Path(checkpoints_dir)
    step = snap.step
    tmp = root / f".tmp-{step}-{os.getpid()}"
    try:
        return _save(root, tmp, snap, cursor, metrics, history)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # never leave a half-written folder behind
        if _disk_full(exc):
            free = shutil.disk_usage(root).free if root.is_dir() else None
            raise DiskFullError(
                f"checkpoint of step {step} could not be written to {root}: the disk is full "
                f"({'%d bytes free' % free if free is not None else 'no space left'}). The partial folder was "
                "removed and earlier checkpoints are untouched; free space there (or point the run's base_path "
                "at a larger disk), then load the run again: it resumes from the last complete checkpoint."
            ) from exc
        if isinstance(exc, OSError) or type(exc).__name__ == "SafetensorError":
            raise CheckpointError(f"checkpoint of step {step} could not be written to {root} ({type(exc).__name__}: "
                                  f"{exc}); the partial folder was removed and earlier checkpoints are untouched.") from exc
        raise


def _disk_full(exc: BaseException) -> bool:
    """Whether a save failed for lack of space: an OSError with ENOSPC/EDQUOT, or safetensors' Rust
    writer, which reports the same OS error only in its message."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return any(s in text for s in ("No space left on device", "StorageFull", "Disk quota exceeded"))


def stored_names(param_names: list[str], adapter_name: str) -> list[str]:
    """The names a checkpoint stores the optimizer state under: peft's adapter key replaced by "default".
    Several runs on one base model train adapters of other names in one peft model (backend/replica.py),
    and a run's checkpoint must not depend on which adapter held it: the same files as training alone,
    resumable into any adapter of the same LoRA shape."""
    if adapter_name == TRAIN_ADAPTER:
        return list(param_names)
    tag = f".{adapter_name}."
    return [n.replace(tag, ".default.") for n in param_names]


def _save(root: Path, tmp: Path, snap: CheckpointSnapshot, cursor: dict[str, Any] | None,
          metrics: dict[str, float] | None, history: list[dict[str, Any]] | None) -> Path:
    step = snap.step
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    # Each tensor file is hashed as it is written (`save_tensors`), and both let go of the GIL. At 7B a
    # checkpoint is ~0.5 GB (the adapter and its AdamW moments) and hashing it is most of the write, so
    # where there are cores to spare the files are written side by side; on a machine of two, a thread of
    # the step beside the writer keeps more of its pace when they go one after another
    # (bench/checkpoint_write.py).
    side_by_side = 3 if usable_cores() > 2 else 1
    with ThreadPoolExecutor(max_workers=side_by_side, thread_name_prefix="groupwise-checkpoint") as pool:
        writes = [pool.submit(write_adapter_folder, tmp, snap.adapter, snap.adapter_config, fingerprint=True)]
        if snap.optimizer is not None:
            writes.append(pool.submit(_write_tensors, tmp, "optimizer", *snap.optimizer))
        writes.append(pool.submit(_write_tensors, tmp, "rng", *snap.rng))
        files = {name: fingerprint for write in writes for name, fingerprint in write.result().items()}
    state = {
        "format": FORMAT_VERSION,
        "step": step,
        "cursor": cursor or {},
        "metrics": {k: float(v) for k, v in (metrics or {}).items()},
        "saved_at": time.time(),
        "files": files,
        "history": list(history or []),
        "base": snap.base,
    }
    _write_json(tmp / STATE_FILE, state)  # last: the completeness marker
    _fsync_dir(tmp)
    if final.exists():  # re-saving a step (e.g. after a restart): replace the whole folder
        # moved aside as retention moves a deleted checkpoint: one a stopped process left is swept later
        old = root / f"{DELETED_PREFIX}{final.name}-{time.time_ns()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    return final


def _write_tensors(folder: Path, stem: str, tensors: dict[str, torch.Tensor],
                   meta: Any) -> dict[str, dict[str, Any]]:
    """``<stem>.safetensors`` and ``<stem>.json``; each file's name and fingerprint."""
    return {f"{stem}.safetensors": save_tensors(tensors, folder / f"{stem}.safetensors"),
            f"{stem}.json": _write_json(folder / f"{stem}.json", meta)}


def _fingerprints(folder: Path, files: list[str]) -> dict[str, dict[str, Any]]:
    """Each file's fingerprint read back from disk, the files hashed side by side: hashlib lets go of the
    GIL while it hashes, and at 7B a checkpoint is ~0.5 GB, ~0.3 s of SHA-256 on one core."""
    if not files:
        return {}
    with ThreadPoolExecutor(max_workers=min(4, len(files)), thread_name_prefix="groupwise-hash") as pool:
        return dict(zip(files, pool.map(file_fingerprint, [folder / name for name in files])))


def read_state_or_why(path: Path) -> CheckpointState | str:
    """The checkpoint's state.json, or what is wrong with it (missing, not JSON, nested past reading, a
    field of another type: `groupwise.core.readers.CheckpointStateFile`), naming the file and line."""
    from groupwise.core.readers import CheckpointStateFile, JSONProblem, RowError, read_json_file, validate

    file = path / STATE_FILE
    if not file.is_file():
        return f"no {STATE_FILE}"
    try:  # written by json.dump: an inf metric of an older version reads back (allow_nan)
        raw = validate(CheckpointStateFile, read_json_file(file, expected="a checkpoint state", allow_nan=True))
    except RowError as exc:
        return f"{exc.path}:{exc.line}: {exc.problem}"
    except JSONProblem as exc:
        return f"{file}: {exc}"
    return CheckpointState(raw.step, raw.cursor, raw.metrics, path, list(raw.history), raw.files,
                           raw.base if isinstance(raw.base, dict) else None)


def read_state(path: Path) -> CheckpointState | None:
    """The checkpoint's state.json, or None when it is missing or unreadable (`read_state_or_why` says why)."""
    state = read_state_or_why(path)
    return None if isinstance(state, str) else state


def verify_checkpoint(state: CheckpointState) -> str | None:
    """What is wrong with a complete checkpoint (None: intact and usable). Checks each file state.json
    lists against its recorded size and sha256 (a checkpoint saved before those were recorded has its
    safetensors headers and JSON files parsed instead), then what the files hold: the step matches the
    folder, the adapter and optimizer state are finite, the optimizer and RNG states have the shape a
    resume restores (training/checkpoint_contents.py)."""
    from safetensors import safe_open

    path = state.path
    assert path is not None
    names = state.files if isinstance(state.files, list) else list(state.files)
    if "adapter_model.safetensors" not in names:
        names = ["adapter_model.safetensors", *names]
    recorded = state.files if isinstance(state.files, dict) else {}
    # the files of the recorded size, hashed side by side as they were saved (`_fingerprints`)
    digests = _fingerprints(path, [n for n in names if recorded.get(n) and (path / n).is_file()
                                   and (path / n).stat().st_size == recorded[n]["bytes"]])
    for name in names:
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        expected = recorded.get(name)
        if expected:
            size = f.stat().st_size
            if size != expected["bytes"]:
                return f"{name} has {size} bytes, {expected['bytes']} were saved"
            if digests[name]["sha256"] != expected["sha256"]:
                return f"{name} differs from what was saved (sha256 mismatch)"
            continue
        try:
            if name.endswith(".safetensors"):
                with safe_open(str(f), framework="pt") as st:
                    for key in st.keys():
                        st.get_slice(key)
            elif name.endswith(".json"):
                json.loads(f.read_text())
        except Exception as exc:  # safetensors' SafetensorError, JSON errors, OSError
            return f"{name} cannot be read ({type(exc).__name__}: {exc})"
    problem = state_problem(path, state.step, state.cursor, state.metrics, state.history)
    if problem is not None:
        return problem
    try:
        return contents_problem(path, names)
    except Exception as exc:  # a file that hashes right but does not parse (saved by a broken writer)
        return f"its files cannot be read ({type(exc).__name__}: {exc})"


def list_checkpoints(checkpoints_dir: str | Path, *, warn: bool = True) -> list[CheckpointState]:
    """Complete checkpoints, oldest first. Incomplete folders are skipped (with a warning)."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    found: list[CheckpointState] = []
    for path in sorted(root.iterdir()):
        if not path.is_dir():
            continue
        if dir_name_step(path.name) is None:
            if warn and path.name.startswith(".tmp-"):
                warnings.warn(
                    f"{path} is an unfinished checkpoint (the process stopped while saving it); it is ignored. "
                    "Delete it to silence this warning.",
                    GroupwiseWarning, stacklevel=2,
                )
            continue
        state = read_state_or_why(path)
        if isinstance(state, str):
            if warn:
                warnings.warn(
                    f"checkpoint {path} is incomplete (no readable {STATE_FILE}: {state}); it is ignored and the "
                    "run resumes from the latest complete one. Delete the folder to silence this warning.",
                    GroupwiseWarning, stacklevel=2,
                )
            continue
        found.append(state)
    return sorted(found, key=lambda s: s.step)


def latest_checkpoint(checkpoints_dir: str | Path, *, verify: bool = True) -> CheckpointState | None:
    """The newest complete checkpoint; with `verify`, the newest intact one: corrupt ones are
    skipped with a warning naming each and what is wrong (`verify_checkpoint`)."""
    found = list_checkpoints(checkpoints_dir)
    if not verify:
        return found[-1] if found else None
    for state in reversed(found):
        problem = verify_checkpoint(state)
        if problem is None:
            return state
        older = [s.step for s in found if s.step < state.step]
        warnings.warn(
            f"checkpoint {state.path} is corrupt ({problem}); it is skipped and the run resumes from "
            f"{'step ' + str(older[-1]) if older else 'the start'}. Delete the folder to silence this warning.",
            GroupwiseWarning, stacklevel=2,
        )
    return None


def load_checkpoint(
    state: CheckpointState,
    *,
    model: Any,
    optimizer: torch.optim.Optimizer | None,
    param_names: list[str],
    adapter_name: str = TRAIN_ADAPTER,
    restore_rng: bool = True,
) -> CheckpointState:
    """Load adapter weights (into `adapter_name`), optimizer state and RNG of a complete checkpoint.
    A file that cannot be read raises `CheckpointError` naming the checkpoint."""
    from safetensors import SafetensorError

    path = state.path
    assert path is not None
    try:
        return _load(state, model, optimizer, param_names, adapter_name, restore_rng)
    except (SafetensorError, OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {path} cannot be loaded: {type(exc).__name__}: {exc}. Delete the folder "
                              "to resume from the checkpoint before it.") from exc


def _load(state: CheckpointState, model: Any, optimizer: torch.optim.Optimizer | None, param_names: list[str],
          adapter_name: str, restore_rng: bool) -> CheckpointState:
    from peft import set_peft_model_state_dict

    path = state.path
    assert path is not None
    device = next(model.parameters()).device
    weights = load_file(str(path / "adapter_model.safetensors"), device=str(device))
    result = set_peft_model_state_dict(model, weights, adapter_name=adapter_name)
    unexpected = getattr(result, "unexpected_keys", []) or []
    if unexpected:
        raise CheckpointMismatchError(
            f"checkpoint {path}: {len(unexpected)} adapter tensor(s) do not fit the model (e.g. {unexpected[:2]}); "
            "it was saved with another base model or LoRA config."
        )
    if optimizer is not None and (path / "optimizer.safetensors").is_file():
        tensors = load_file(str(path / "optimizer.safetensors"), device=str(device))
        meta = json.loads((path / "optimizer.json").read_text())
        optimizer_from_tensors(optimizer, stored_names(param_names, adapter_name), tensors, meta)
    if restore_rng and (path / "rng.safetensors").is_file():
        try:
            _set_rng_state(load_file(str(path / "rng.safetensors")), json.loads((path / "rng.json").read_text()))
        except (TypeError, ValueError, RuntimeError) as exc:  # a state of the wrong shape
            raise CheckpointError(f"checkpoint {path} cannot be loaded: its RNG state cannot be restored "
                                  f"({type(exc).__name__}: {exc})") from exc
    return state


def adapter_tensors(state: CheckpointState, *, model: Any, param_names: list[str],
                    adapter_name: str = TRAIN_ADAPTER) -> dict[str, torch.Tensor]:
    """A complete checkpoint's adapter, keyed by the model's parameter names (`param_names`), on the
    model's device and not loaded into it: e.g. the anchor of the KL term (TrainConfig.kl_reference_step).
    peft's own `get_peft_model_state_dict` names the file's key of each parameter, so the two namings
    cannot drift apart."""
    from peft import get_peft_model_state_dict
    from safetensors import SafetensorError

    path = state.path
    assert path is not None
    params = dict(model.named_parameters())
    named = {n: params[n] for n in param_names}
    saved = get_peft_model_state_dict(model, state_dict=named, adapter_name=adapter_name)
    file_key = {id(t): k for k, t in saved.items()}  # the same tensor objects, under the file's keys
    try:
        weights = load_file(str(path / "adapter_model.safetensors"), device=str(next(model.parameters()).device))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read: {type(exc).__name__}: {exc}") from exc
    keys = {n: file_key.get(id(p)) for n, p in named.items()}
    missing = [n for n, k in keys.items() if k not in weights]
    if missing:
        raise CheckpointError(
            f"checkpoint {path} lacks {len(missing)} of the adapter's {len(named)} tensors (e.g. {missing[:2]}): "
            "it was saved with another base model or LoraConfig (rank, target modules)."
        )
    return {n: weights[k] for n, k in keys.items()}


def prune_checkpoints(
    checkpoints_dir: str | Path,
    *,
    best_metric: str | None = None,
    maximize: bool = True,
    metrics_by_step: dict[int, float] | None = None,
    keep: Iterable[int] = (),
    keep_recent: int = CheckpointRetention.keep_recent,
    keep_top: int = CheckpointRetention.keep_top,
    named_best: Iterable[int] = (),
    sweep: bool = True,
) -> list[int]:
    """Delete every complete checkpoint but the latest, the `keep_recent` newest, the `keep_top` best and
    the steps in `keep` (e.g. the KL reference a run still trains against); returns deleted steps. The
    best are `named_best` (the caller's pick) and, for the rest of `keep_top`, the others best by
    `best_metric`.

    A deleted checkpoint is first renamed to ``.deleted-<step>-<ns>``: one rename ends it as a checkpoint
    at once, and a process stopped while its files are removed leaves no half-deleted step folder (which
    a listing would warn about) but a dot-folder that no listing reads and the next sweep removes. With
    `sweep` its files are removed before this returns; without, the caller runs `sweep_deleted` later,
    off a step's path (removing a checkpoint's files took up to 0.3 s of a publication on a GPU host).

    The metric is read from `metrics_by_step` (e.g. validation rewards from history.jsonl) or else from
    each checkpoint's state.json metrics. Checkpoints without the metric are never among the best; of
    equal scores the later step ranks first.
    """
    found = list_checkpoints(checkpoints_dir, warn=False)
    if not found:
        return []
    named = set(named_best)
    kept = {found[-1].step, *keep, *named,
            *(s.step for s in found[max(0, len(found) - keep_recent):] if keep_recent > 0)}
    if best_metric is not None and keep_top > len(named):
        scored = []
        for s in found:
            value = (metrics_by_step or {}).get(s.step, s.metrics.get(best_metric))
            if value is not None and s.step not in named:
                scored.append((value if maximize else -value, s.step))
        kept.update(step for _, step in sorted(scored, reverse=True)[:keep_top - len(named)])
    deleted = []
    for s in found:
        if s.step not in kept and s.path is not None:
            try:
                os.replace(s.path, s.path.with_name(f"{DELETED_PREFIX}{s.path.name}-{time.time_ns()}"))
            except OSError as exc:  # still a checkpoint: not reported deleted
                warnings.warn(f"checkpoint {s.path} was to be deleted by the retention but could not be moved "
                              f"({type(exc).__name__}: {exc}); it is kept. Check the folder's permissions.",
                              GroupwiseWarning, stacklevel=2)
                continue
            deleted.append(s.step)
    if sweep:
        sweep_deleted(checkpoints_dir)
    return deleted


def sweep_deleted(checkpoints_dir: str | Path) -> None:
    """Remove the files of every checkpoint `prune_checkpoints` deleted (its ``.deleted-*`` folders),
    those a stopped process left included; any thread."""
    root = Path(checkpoints_dir)
    try:
        trash = [p for p in root.iterdir() if p.name.startswith(DELETED_PREFIX)]
    except OSError:  # no folder, no trash
        return
    for path in trash:
        shutil.rmtree(path, ignore_errors=True)  # what could not go now is tried again by the next sweep
