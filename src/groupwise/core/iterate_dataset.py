"""`iterate_dataset`: a run's batches of scenarios, shuffled per epoch, resumable at any step.

Each epoch's order is a pure function of (seed, epoch), not of a random generator's history, so a run
resumed at step k (``initial_step=k``) sees exactly the batches the uninterrupted run saw from step k
on. With ``seed=0`` (the default) the order is ART's: ``random.Random(epoch)`` shuffles
``range(len(items))``, so a ported ART run trains on the same batches in the same order. With seed 0
`iterate_dataset` also leaves the global `random` as ART's does: ART reseeds it with the epoch and
shuffles with it, so a ported rollout that draws from `random` (a game's random tiles, a sampled
opponent) sees the numbers it saw under ART. The run loop orders by `epoch_order` and touches no global.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import astuple, dataclass
from typing import Generic, TypeVar

from groupwise.errors import ConfigError

__all__ = ["DatasetBatch", "epoch_order", "iterate_dataset"]

T = TypeVar("T")


@dataclass
class DatasetBatch(Generic[T]):
    """One step's scenarios. `step` is global (across epochs); `epoch_step` restarts each epoch.

    Also unpacks as ART 0.3's tuple: ``for items, epoch, step, epoch_step in iterate_dataset(...)``.
    """

    items: list[T]
    step: int
    epoch: int
    epoch_step: int

    def __iter__(self) -> Iterator:
        return iter((self.items, self.epoch, self.step, self.epoch_step))


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The permutation of range(n) used in `epoch`: a pure function of (seed, epoch).

    seed 0 is ART's order (`random.Random(epoch)`). Any other seed hashes the string
    "groupwise-epoch:<seed>:<epoch>" (SHA-512 inside `random.Random`), so orders are the same in
    every process and Python version that keeps `random`'s algorithm (PYTHONHASHSEED plays no part).
    """
    order = list(range(n))
    rng = random.Random(epoch) if seed == 0 else random.Random(f"groupwise-epoch:{seed}:{epoch}")
    rng.shuffle(order)
    return order


def _leave_global_random_as_art(n: int, epoch: int) -> None:
    """ART's side effect: ``random.seed(epoch)`` then a shuffle of n indices with the global generator."""
    random.seed(epoch)
    random.shuffle(list(range(n)))


def iterate_dataset(
    dataset: Iterable[T],
    groups_per_step: int = 1,
    num_epochs: int = 1,
    initial_step: int = 0,
    use_tqdm: bool = True,
    seed: int = 0,
    *,
    batch_size: int | None = None,
) -> Iterator[DatasetBatch[T]]:
    """Yield batches of `groups_per_step` items, shuffled per epoch, starting at global `initial_step`.

    Each epoch has ceil(len(items) / groups_per_step) steps (the last batch may be smaller); step s
    is epoch s // steps_per_epoch. Resuming with initial_step=k yields exactly the batches k, k+1, ...
    of a run started at 0 with the same arguments. The arguments are ART's, by name and position
    (`batch_size` is ART 0.1's name of `groups_per_step`).
    """
    items = list(dataset)
    problems = []
    if batch_size is not None:  # ART 0.1's name of groups_per_step
        if groups_per_step not in (1, batch_size):
            problems.append(f"batch_size={batch_size!r} and groups_per_step={groups_per_step!r} name the same "
                            "setting; pass one")
        groups_per_step = batch_size
    if not items:
        problems.append("dataset is empty; there is nothing to iterate over")
    for name, value, low in (("groups_per_step", groups_per_step, 1), ("num_epochs", num_epochs, 1),
                             ("initial_step", initial_step, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.append(f"{name}={value!r} must be an int >= {low}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        problems.append(f"seed={seed!r} must be an int")
    if problems:
        raise ConfigError(problems, what="iterate_dataset arguments")
    steps_per_epoch = math.ceil(len(items) / groups_per_step)
    total = steps_per_epoch * num_epochs
    bar = None
    if use_tqdm and initial_step < total:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=initial_step, desc="steps", unit="step", dynamic_ncols=True)
    first_epoch = initial_step // steps_per_epoch
    if first_epoch >= num_epochs and seed == 0:
        # resumed past the end: nothing to yield, but ART walked (and reseeded) every epoch
        _leave_global_random_as_art(len(items), num_epochs - 1)
    try:
        for epoch in range(first_epoch, num_epochs):
            order = epoch_order(len(items), seed, epoch)
            if seed == 0:
                _leave_global_random_as_art(len(items), epoch)
            for epoch_step in range(steps_per_epoch):
                step = epoch * steps_per_epoch + epoch_step
                if step < initial_step:
                    continue
                chunk = order[epoch_step * groups_per_step:(epoch_step + 1) * groups_per_step]
                yield DatasetBatch([items[i] for i in chunk], step, epoch, epoch_step)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
