"""Per-step metric means of stored trajectories, for ART's first benchmarking helpers."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from groupwise.errors import StoreError
from groupwise.runs.history import load_history
from groupwise.runs.store import read_groups, trajectory_files
from groupwise.art.utils.old_benchmarking.calculate_step_metrics import calculate_step_std_dev
from groupwise.art.utils.old_benchmarking.types import BenchmarkedModel, BenchmarkedModelKey, BenchmarkedModelStep
from groupwise.runs.output_dirs import ART_DEFAULT_PATH, art_path_or_default, get_output_dir_from_model_properties

__all__ = ["load_benchmarked_models"]


def load_benchmarked_models(project: str, benchmark_keys: list[BenchmarkedModelKey], metrics: list[str] | None = None,
                            api_path: str = ART_DEFAULT_PATH) -> list[BenchmarkedModel]:
    """One `BenchmarkedModel` per key: for each of its steps, each metric's mean over the step's groups
    of the group's mean (over the trajectories that report it; ``reward`` is each trajectory's reward
    unless its metrics name one), ``reward_std_dev`` (`calculate_step_std_dev`), and the time of the
    step's history row. The keys are not changed (ART reads copies too)."""
    metrics = ["reward"] if metrics is None else list(metrics)
    root = art_path_or_default(api_path)
    out = []
    for key in benchmark_keys:
        run_dir = Path(get_output_dir_from_model_properties(project, key.model, root))
        files = {step: path for _, step, path in trajectory_files(run_dir, key.split)}
        if not files:
            raise StoreError(f"no {key.split!r} trajectories of {key.model!r} in project {project!r} under {root} "
                             f"(looked in {run_dir / 'trajectories' / key.split}); log them with model.log(groups, "
                             f"split={key.split!r}) or pass the store folder as api_path=")
        last = max(files)
        indices = list(range(last + 1)) if key.step_indices is None else \
            [i - 1 + last if i < 0 else i for i in key.step_indices]
        recorded = {row["step"]: row.get("recorded_at") for row in load_history(run_dir)
                    if row.get("split") == key.split and "recorded_at" in row}
        model = BenchmarkedModel(BenchmarkedModelKey(key.model, key.split, indices))
        for index in indices:
            if index not in files:
                raise StoreError(f"no trajectory file for step {index} of {key.model!r} ({key.split!r}); "
                                 f"stored steps: {sorted(files)}")
            model.steps.append(_step(index, read_groups(files[index]), metrics, recorded.get(index)))
        out.append(model)
    return out


def _step(index: int, groups: list, metrics: list[str], recorded_at: str | None) -> BenchmarkedModelStep:
    step = BenchmarkedModelStep(index)
    if recorded_at:
        step.recorded_at = datetime.fromisoformat(recorded_at.replace("Z", "+00:00"))
    for metric in metrics:
        means = []
        for group in groups:
            values = [_metric(t, metric) for t in group.trajectories]
            values = [v for v in values if v is not None]
            if values:
                means.append(sum(values) / len(values))
        if means:
            step.metrics[metric] = sum(means) / len(means)
    step.metrics["reward_std_dev"] = calculate_step_std_dev(groups)
    return step


def _metric(trajectory: object, metric: str) -> float | None:
    if isinstance(trajectory, BaseException):
        return None
    if metric in trajectory.metrics:
        return float(trajectory.metrics[metric])
    return float(trajectory.reward) if metric == "reward" else None
