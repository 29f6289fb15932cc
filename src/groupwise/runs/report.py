"""The run's curves as PNGs and a table on stdout (`groupwise report RUN_DIR`, groupwise/jobs/report.py).

Writes into ``<run_dir>/report/`` (or ``--out``):

- ``curves.png``: top, the mean train reward per step with a +-1 std band (spread over the step's
  rollouts); bottom, the validation metric with its confidence interval as error bars (how far another
  draw of the same policy could land: differences inside it are noise), every baseline as a horizontal
  dashed line (the base's interval as a band), and the best step starred. Both panels mark alerts (triangles coloured by severity, named) and the stop point (a
  vertical line labelled with the rule).
- ``cost.png``: seconds per step spent gathering, judging (fit's score_group) and training, and the judge's
  cumulative cost in USD.

The table has one line per step: train reward +- std, the validation metric where measured, step time,
judge cost, alerts. Then baselines, the stop reason, the best step, the test result.

Optional: ``--wandb PROJECT`` / ``--tensorboard DIR`` replay the history into W&B / TensorBoard when
those packages are installed (imports guarded; a clear error names the extra to install otherwise).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from groupwise.errors import MissingDependencyError
from groupwise.runs.series import BOOKKEEPING_FIELDS, Row, events, interval, rows, val_metric_name, value
from groupwise.runs.view import RunView

__all__ = ["load_run", "log_external", "plot_run", "table", "val_metric_name"]

SEVERITY_COLOUR = {"info": "tab:blue", "warning": "tab:orange", "critical": "tab:red"}
_SKIP = BOOKKEEPING_FIELDS


def load_run(run_dir: str | Path) -> list[Row]:
    """The run's history (`RunView.history`: corrupt lines skipped with a warning; a StoreError naming the
    layout when the folder has none)."""
    return RunView(run_dir).history


def _float(v: Any) -> float | None:
    """`v` as a finite float, or None: not a number, non-finite, or an integer past float's range."""
    if not isinstance(v, (int, float)):
        return None
    try:
        v = float(v)
    except OverflowError:
        return None
    return v if math.isfinite(v) else None


def _drawable(v: float | None) -> float:
    """`v`, or NaN (a gap in the curve) where matplotlib cannot place it: near float's limit an axis's
    range overflows and the tick computation raises (a reward of 1e308 is finite, and accepted)."""
    return v if v is not None and math.isfinite(v) and abs(v) <= 1e300 else math.nan


def plot_run(history: list[Row], out_dir: str | Path, *, title: str = "") -> list[Path]:
    """Write curves.png and cost.png; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metric = val_metric_name(history)
    train = rows(history, "train")
    val = [(r["step"], value(r, "val", metric)) for r in rows(history, "val")] if metric else []
    val = [(s, _drawable(v)) for s, v in val if v is not None]
    alerts = events(history, "alert")
    stops = events(history, "stop")
    baselines = [(str(r.get("name")), value(r, "val", metric)) for r in events(history, "baseline")] if metric else []

    names = sorted({str(a.get("name", "?")) for a in alerts})
    fig, axes = plt.subplots(3 if names else 2, 1, figsize=(10, 9 if names else 8), sharex=True,
                             gridspec_kw={"height_ratios": [3, 3, 0.4 + 0.35 * len(names)] if names else [3, 3]})
    ax_r, ax_v = axes[0], axes[1]
    steps = [r["step"] for r in train]
    mean_r = [_drawable(value(r, "train", "reward")) for r in train]
    std_r = [_drawable(value(r, "train", "reward_std") or 0.0) for r in train]
    if steps:
        ax_r.plot(steps, mean_r, "-o", ms=3, color="tab:blue", label="train reward (mean)")
        lo = [_drawable(m - s) for m, s in zip(mean_r, std_r)]
        hi = [_drawable(m + s) for m, s in zip(mean_r, std_r)]
        ax_r.fill_between(steps, lo, hi, color="tab:blue", alpha=0.2, label="+-1 std over rollouts")
    ax_r.set_ylabel("reward")
    ax_r.set_title(title or "training run")
    if val:
        ax_v.plot([s for s, _ in val], [v for _, v in val], "-o", color="tab:green", label=f"val {metric}")
        cis = {r["step"]: interval(r, "val", metric) for r in rows(history, "val")} if metric else {}
        with_ci = [(s, v, cis[s]) for s, v in val if cis.get(s)]
        if with_ci:
            ax_v.errorbar([s for s, _, _ in with_ci], [v for _, v, _ in with_ci],
                          yerr=[[max(0.0, v - ci[0]) for _, v, ci in with_ci], [max(0.0, ci[1] - v) for _, v, ci in with_ci]],
                          fmt="none", ecolor="tab:green", elinewidth=1.2, capsize=4, alpha=0.8,
                          label="95% interval (noise of the validation)")
        best_step = stops[-1].get("best_step") if stops else None
        best = [v for s, v in val if s == best_step]
        if best:
            ax_v.plot([best_step], best, "*", ms=16, color="gold", mec="black", label=f"best (step {best_step})")
    palette = ["tab:gray", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]
    base_ci = {str(r.get("name")): interval(r, "val", metric) for r in events(history, "baseline")} if metric else {}
    for i, (name, v) in enumerate(baselines):
        if v is not None:
            colour = palette[i % len(palette)]
            ax_v.axhline(v, ls="--", lw=1.3, color=colour, label=f"baseline {name}: {v:.3g}")
            if base_ci.get(name):
                ax_v.axhspan(*base_ci[name], color=colour, alpha=0.12)
    ax_v.set_ylabel(f"val {metric}" if metric else "no validation")
    # critical alerts: a red band on the curves; every alert: a marker on its own row of the timeline
    for a in alerts:
        if a.get("severity") == "critical":
            for ax in (ax_r, ax_v):
                ax.axvline(a["step"], color="tab:red", lw=6, alpha=0.15)
    if names:
        ax_a = axes[2]
        for a in alerts:
            colour = SEVERITY_COLOUR.get(a.get("severity"), "tab:orange")
            ax_a.plot([a["step"]], [names.index(str(a.get("name", "?")))], "v", ms=9, color=colour, mec="black")
        ax_a.set_yticks(range(len(names)), names, fontsize=8)
        ax_a.set_ylim(-0.6, len(names) - 0.4)
        ax_a.set_title("alerts (orange: warning, red: critical)", fontsize=9, loc="left")
        ax_a.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    from matplotlib.ticker import MaxNLocator

    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are integers
    if stops:
        s = stops[-1]
        for ax in axes:
            ax.axvline(s["step"], color="black", ls=":", lw=1.5)
        ax_r.annotate(f"stop: {s.get('rule', '?')}", (s["step"], 1.0), xycoords=("data", "axes fraction"),
                      textcoords="offset points", xytext=(-4, -14), ha="right", fontsize=9, weight="bold")
    for ax in (ax_r, ax_v):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best", framealpha=0.85)
    fig.tight_layout()
    curves = out / "curves.png"
    fig.savefig(curves, dpi=110)
    plt.close(fig)

    loop = rows(history, "loop")
    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=(11, 3.8))
    if loop:
        # a step's bar: gather, reward and train of step k (loop row k), then the validation of policy k
        by_step = {r["step"]: dict(r) for r in loop}
        for r in rows(history, "val"):
            by_step.setdefault(r["step"], {})["time/val_s"] = r.get("time/val_s", 0.0)
        xs = sorted(by_step)
        bottom = [0.0] * len(xs)
        for key, colour in (("time/gather_s", "tab:blue"), ("time/reward_s", "tab:purple"),
                            ("time/train_s", "tab:red"), ("time/val_s", "tab:green")):
            ys = [by_step[x].get(key, 0.0) or 0.0 for x in xs]
            ax_t.bar(xs, ys, bottom=bottom, color=colour, label=key.split("/")[1])
            bottom = [b + y for b, y in zip(bottom, ys)]
        xs = [r["step"] for r in loop]
        cost, total = [], 0.0
        for r in loop:
            total += r.get("judge/cost_usd", 0.0) or 0.0
            cost.append(total)
        ax_c.plot(xs, cost, "-o", ms=3, color="tab:purple")
    ax_t.set_title("seconds per step")
    ax_t.set_xlabel("step")
    ax_t.legend(fontsize=8)
    ax_c.set_title("judge cost, cumulative (USD)")
    ax_c.set_xlabel("step")
    fig.tight_layout()
    cost_png = out / "cost.png"
    fig.savefig(cost_png, dpi=110)
    plt.close(fig)
    return [curves, cost_png]


def _fmt(v: Any, spec: str = ".3f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if spec.endswith("f") and isinstance(v, (int, float)) and abs(v) >= 1e9:
        return format(v, ".4g")  # a fixed-point 1e300 is 300 digits wide
    return format(v, spec)


def _val_cell(row: Row | None, metric: str | None, split: str = "val") -> str:
    """'0.347 [0.210, 0.490]' (the value and its interval where logged), '-' without a value."""
    v = value(row, split, metric) if row is not None and metric else None
    if v is None:
        return "-"
    ci = interval(row, split, metric)  # type: ignore[arg-type]
    return f"{v:.3f}" if ci is None else f"{v:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def table(history: list[Row]) -> str:
    """The per-step table, then baselines, stop, best and test lines."""
    metric = val_metric_name(history)
    train = {r["step"]: r for r in rows(history, "train")}
    val = {r["step"]: r for r in rows(history, "val")}
    loop = {r["step"]: r for r in rows(history, "loop")}
    alerts: dict[int, list[str]] = {}
    for a in events(history, "alert"):
        alerts.setdefault(a["step"], []).append(f"{a.get('name')}({a.get('action', '')})")
    head = f"{'step':>5}  {'train reward':>16}  {('val ' + metric) if metric else 'val':>22}  {'time s':>7}  {'judge $':>8}  alerts"
    lines = [head, "-" * len(head)]
    for step in sorted(set(train) | set(val) | set(alerts)):
        t, v, lp = train.get(step), val.get(step), loop.get(step, {})
        reward = f"{_fmt(value(t, 'train', 'reward'))} +- {_fmt(value(t, 'train', 'reward_std'))}" if t else "-"
        secs = sum(lp.get(k, 0.0) or 0.0 for k in ("time/gather_s", "time/reward_s", "time/train_s")) if lp else None
        lines.append(f"{step:>5}  {reward:>16}  {_val_cell(v, metric):>22}  "
                     f"{_fmt(secs, '.1f'):>7}  {_fmt(lp.get('judge/cost_usd'), '.4f'):>8}  {' '.join(alerts.get(step, []))}")
    for b in events(history, "baseline"):
        lines.append(f"baseline {b.get('name')}: val {metric} = {_val_cell(b, metric, 'val')}")
    for s in events(history, "stop")[-1:]:
        lines.append(f"stopped at step {s['step']} ({s.get('rule')}): {s.get('reason')}")
        lines.append(f"best {s.get('best_metric')}: step {s.get('best_step')}")
    for r in rows(history, "test"):
        lines.append(f"test (checkpoint of step {r['step']}): reward {_fmt(r.get('reward'))}"
                     + (f", {metric} {_val_cell(r, metric, 'test')}" if metric else ""))
    return "\n".join(lines)


def log_external(history: list[Row], *, wandb_project: str | None = None, tensorboard_dir: str | None = None,
                 run_name: str = "run") -> None:
    """Replay the history's numeric fields into W&B and/or TensorBoard (when asked for)."""
    numeric = []
    for r in history:
        if r.get("split") in ("train", "val", "test", "loop", "baseline"):
            vals = {f"{r['split']}/{k.split('/', 1)[-1] if k.startswith(r['split'] + '/') else k}": f
                    for k, v in r.items()
                    if k not in _SKIP and not isinstance(v, bool) and (f := _float(v)) is not None}
            numeric.append((r["step"], vals))
    if wandb_project:
        try:
            import wandb
        except ImportError as exc:
            raise MissingDependencyError("W&B logging (--wandb)", "wandb", "wandb") from exc
        run = wandb.init(project=wandb_project, name=run_name, reinit=True)
        for step, vals in sorted(numeric, key=lambda x: x[0]):
            run.log(vals, step=step)
        run.finish()
    if tensorboard_dir:
        try:
            from tensorboardX import SummaryWriter  # type: ignore[import-not-found]
        except ImportError:
            try:
                import tensorboard  # noqa: F401  (torch's writer needs it)
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise MissingDependencyError("TensorBoard logging (--tensorboard)", "tensorboard", "tensorboard") from exc
        writer = SummaryWriter(tensorboard_dir)
        for step, vals in numeric:
            for k, v in vals.items():
                writer.add_scalar(k, v, step)
        writer.close()
