"""Supervised fine-tuning helpers at ART's path (``art.utils.sft``, ART 0.5): a learning-rate schedule
over a whole data set, cut into `train_sft` calls (`create_sft_dataset_iterator`), and training from a
JSONL file of chat examples (`train_sft_from_file`).

Why a schedule over the whole data set: `model.train_sft` is one step of the run with one optimizer
update per batch, and `TrainSFTConfig.learning_rate` may be a list (one rate per batch). A warm-up and
a decay only mean something across all the batches of all the epochs, so the schedule is computed
once and each call gets its slice. The numbers are ART's (same warm-up, same decay, same shuffles for
the same seed), so a ported program trains on the same batches at the same rates.

A JSONL row is ``{"messages": [...], "tools": [...]}`` (tools optional), whose assistant turns are the
targets; ``assistant_turns="last"`` makes only each row's last assistant turn a target.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import TYPE_CHECKING, Any, Iterator, Literal, NamedTuple

from groupwise.config import DEFAULT_ASSISTANT_TURNS, TrainSFTConfig
from groupwise.errors import ConfigError
from groupwise.core.readers import read_sft_file
from groupwise.core.trajectory import Trajectory

if TYPE_CHECKING:
    from groupwise.model import TrainableModel

__all__ = ["SFTChunk", "create_lr_schedule", "create_sft_dataset_iterator", "get_file_row_count", "iterate_file",
           "resolve_sft_batch_size", "train_sft_from_file"]

Schedule = Literal["cosine", "linear", "constant"]

# ART's defaults of these functions, each written once (two entry points share them).
PEAK_LR = 2e-4
SCHEDULE: Schedule = "linear"
WARMUP_RATIO = 0.1
SEED = 42
SHUFFLE_BUFFER_SIZE = 10000


class SFTChunk(NamedTuple):
    """One `train_sft` call's share: its trajectories, a config holding their batches' rates, and where
    it starts (`step`: the global batch index; `epoch_step`: the batch index within its epoch)."""

    trajectories: list[Trajectory]
    config: TrainSFTConfig
    step: int
    epoch: int
    epoch_step: int


def resolve_sft_batch_size(*, batch_size: int | Literal["auto"], default_batch_size: int) -> int:
    """`batch_size`, with "auto" meaning the backend's default (2 on `LocalBackend`)."""
    return default_batch_size if batch_size == "auto" else batch_size


def _require_jsonl(file_path: str) -> None:
    if not str(file_path).endswith(".jsonl"):
        raise ConfigError(f"{file_path}: only JSONL files (one JSON object per line, ending in .jsonl) are read")


def get_file_row_count(file_path: str) -> int:
    """The number of non-blank lines of a JSONL file."""
    _require_jsonl(file_path)
    with open(file_path) as f:
        return sum(1 for line in f if line.strip())


def create_lr_schedule(total_steps: int, peak_lr: float, method: Schedule = "linear", warmup_steps: int = 0,
                       min_lr: float = 0.0) -> list[float]:
    """One learning rate per step: a linear warm-up from `min_lr` to `peak_lr` over `warmup_steps`
    (its first step already above `min_lr`), then `method` from `peak_lr` down to `min_lr` at the last
    step ("cosine", "linear") or `peak_lr` throughout ("constant")."""
    if method not in ("cosine", "linear", "constant"):
        raise ConfigError(f"schedule {method!r}: choose 'cosine', 'linear' or 'constant'")
    rates: list[float] = []
    decay_steps = total_steps - warmup_steps
    for step in range(max(total_steps, 0)):
        if step < warmup_steps:
            rates.append(min_lr + (peak_lr - min_lr) * (step + 1) / warmup_steps)
            continue
        done = (step - warmup_steps) / (decay_steps - 1) if decay_steps > 1 else 0.0
        if method == "cosine":
            rates.append(min_lr + (peak_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * done)))
        elif method == "linear":
            rates.append(peak_lr - (peak_lr - min_lr) * done)
        else:
            rates.append(peak_lr)
    return rates


def create_sft_dataset_iterator(
    trajectories: list[Trajectory],
    chunk_size: int = 10,
    epochs: int = 1,
    batch_size: int = TrainSFTConfig.DEFAULT_BATCH_SIZE,
    peak_lr: float = PEAK_LR,
    schedule_type: Schedule = SCHEDULE,
    warmup_ratio: float = WARMUP_RATIO,
    shuffle: bool = True,
    seed: int = SEED,
    initial_step: int = 0,
    show_progress: bool = True,
) -> Iterator[SFTChunk]:
    """`chunk_size` batches per chunk, for one `await model.train_sft(chunk.trajectories, chunk.config)`
    each (each call a step of the run, with its own metrics). Each epoch is shuffled with
    ``random.Random(seed + epoch)``; `initial_step` (a batch index) resumes at the chunk holding it."""
    if chunk_size < 1:
        raise ConfigError(f"chunk_size={chunk_size} must be >= 1 (batches per train_sft call)")
    if not trajectories:
        return
    from tqdm.auto import tqdm

    batches_per_epoch = math.ceil(len(trajectories) / batch_size)
    total_batches = batches_per_epoch * epochs
    schedule = create_lr_schedule(total_batches, peak_lr, schedule_type, int(total_batches * warmup_ratio))
    per_chunk = batch_size * chunk_size
    chunks_per_epoch = math.ceil(len(trajectories) / per_chunk)
    progress = tqdm(initial=initial_step, total=total_batches, desc="SFT Training", unit="step") if show_progress else None
    for epoch in range(epochs):
        order = list(trajectories)
        if shuffle:
            random.Random(seed + epoch).shuffle(order)
        for chunk in range(chunks_per_epoch):
            if epoch * chunks_per_epoch + chunk < initial_step // chunk_size:
                continue
            start = chunk * per_chunk
            part = order[start:start + per_chunk]
            first_batch = epoch * batches_per_epoch + start // batch_size
            n_batches = math.ceil(len(part) / batch_size)
            config = TrainSFTConfig(learning_rate=schedule[first_batch:first_batch + n_batches], batch_size=batch_size)
            yield SFTChunk(part, config, first_batch, epoch, start // batch_size)
            if progress is not None:
                progress.update(n_batches)
    if progress is not None:
        progress.close()


def iterate_file(file_path: str, epochs: int = 1, shuffle_buffer_size: int = SHUFFLE_BUFFER_SIZE, seed: int = SEED,
                 initial_skip: int = 0) -> Iterator[Trajectory]:
    """The rows of a JSONL file as trajectories, `epochs` times, shuffled through a buffer of
    `shuffle_buffer_size` rows (seeded ``seed + epoch``) so a large file is never held whole;
    the first `initial_skip` of them are skipped (resuming)."""
    _require_jsonl(file_path)
    skipped = 0

    def emit(trajectory: Trajectory) -> Iterator[Trajectory]:
        nonlocal skipped
        if skipped < initial_skip:
            skipped += 1
        else:
            yield trajectory

    for epoch in range(epochs):
        rng = random.Random(seed + epoch)
        buffer: list[Trajectory] = []
        for _, trajectory in read_sft_file(file_path):  # a bad line: one error naming it (groupwise.core.readers)
            buffer.append(trajectory)
            if len(buffer) >= shuffle_buffer_size:
                yield from emit(buffer.pop(rng.randint(0, len(buffer) - 1)))
        rng.shuffle(buffer)
        for trajectory in buffer:
            yield from emit(trajectory)


async def train_sft_from_file(
    model: "TrainableModel",
    file_path: str,
    epochs: int = 1,
    batch_size: int = TrainSFTConfig.DEFAULT_BATCH_SIZE,
    peak_lr: float = PEAK_LR,
    schedule_type: Schedule = SCHEDULE,
    warmup_ratio: float = WARMUP_RATIO,
    initial_step: int = 0,
    final_step: int | None = None,
    _config: Any = None,
    verbose: bool = False,
    shuffle_buffer_size: int = SHUFFLE_BUFFER_SIZE,
    assistant_turns: Literal["all", "last"] = DEFAULT_ASSISTANT_TURNS,
) -> None:
    """Supervised fine-tuning on a JSONL file of chat examples: one `model.train_sft` step whose
    batches (`batch_size` rows each, over `epochs` passes) follow one schedule; `initial_step` /
    `final_step` (batch indices, the end exclusive) train a segment of it, e.g. between benchmarks.
    `assistant_turns="last"` (ART's later docs) trains only each row's last assistant turn."""
    rows = get_file_row_count(file_path)
    total = rows * epochs
    if rows == 0 or initial_step * batch_size >= total:
        if verbose:
            print(f"{file_path}: nothing to train ({rows} rows, initial_step {initial_step})")
        return
    total_batches = math.ceil(total / batch_size)
    schedule = create_lr_schedule(total_batches, peak_lr, schedule_type, int(total_batches * warmup_ratio))
    rates = schedule[initial_step:None if final_step is None else min(final_step, total_batches)]
    if verbose:
        print(f"{file_path}: {rows} rows; {len(rates)} batches of {batch_size}, {schedule_type} schedule, "
              f"peak_lr {peak_lr}")
    trajectories = itertools.islice(
        iterate_file(file_path, epochs, shuffle_buffer_size, initial_skip=initial_step * batch_size),
        len(rates) * batch_size)
    config = TrainSFTConfig(learning_rate=rates, batch_size=batch_size, assistant_turns=assistant_turns)
    await model.train_sft(trajectories, config, _config=_config, verbose=verbose)


# A program may replace create_lr_schedule, iterate_file, ... here, as in ART: train_sft_from_file looks
# them up at call time, so the replacement takes effect (groupwise.hooks.EFFECTIVE)
from groupwise.art.hooks import guard  # noqa: E402

guard(__name__)
