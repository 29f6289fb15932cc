"""The measure and the tables of bench/distill_smollm2.py: how many steps each arm needed to reach the
teacher, whether the issue's target holds per seed, and the docs block and figure of a saved JSON.

Pure functions of the JSON the bench writes (no torch, no training), so `--from-json` and the tests read
a measurement without loading a model. The measure itself is in distill_smollm2.py's docstring.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from results_block import provenance

NAME = "distill_smollm2"
ARM_LABEL = {"grpo": "GRPO alone", "sampled": "distillation (sampled)", "topk": "distillation (top-k)"}
RATE_MARK, ITER_MARK = "-lr", "-it"  # a distilling arm at its own settings (--distill-settings): "topk-lr0.002-it2"


def arm_kind(arm: str) -> str:
    """The estimate of an arm ("grpo", "sampled", "topk"), without its settings."""
    return arm.split("-")[0]


def arm_setting(arm: str) -> tuple[float | None, int | None]:
    """(learning rate, optimizer steps per batch) an arm's name carries (--distill-settings); None where it
    trained at the runs' own."""
    rate = re.search(re.escape(RATE_MARK) + r"([0-9.eE+-]+?)(?:-it|$)", arm)
    iterations = re.search(re.escape(ITER_MARK) + r"(\d+)$", arm)
    return (float(rate.group(1)) if rate else None), (int(iterations.group(1)) if iterations else None)


def arm_name(kind: str, rate: float, iterations: int) -> str:
    return f"{kind}{RATE_MARK}{rate:g}" + (f"{ITER_MARK}{iterations}" if iterations != 1 else "")


def arm_label(arm: str) -> str:
    rate, iterations = arm_setting(arm)
    return ARM_LABEL[arm_kind(arm)] + ("" if rate is None else f" at lr {rate:g}") + (
        f", {iterations} updates a step" if iterations else "")


def block_name(env: str) -> str:
    """The docs block of a measurement on `env`: the first env measured (oneword) owns the plain name, every
    other env a block of its own, so measuring one env never overwrites another's evidence."""
    return NAME if env == "oneword" else f"{NAME}_{env}"


def steps_to_reach(curve: list[dict[str, Any]], target: float) -> int | None:
    """The first step whose validation interval contains or exceeds `target` (its mean, where a point has
    no interval); None when no step of `curve` does."""
    for p in sorted(curve, key=lambda p: p["step"]):
        top = p["hi"] if p.get("hi") is not None else p["value"]
        if top is not None and top >= target:
            return p["step"]
    return None


def last_step(curve: list[dict[str, Any]]) -> int | None:
    return max((p["step"] for p in curve), default=None)


def verdict(distill: int | None, distill_last: int | None, grpo: int | None,
            grpo_last: int | None) -> tuple[bool | None, str]:
    """Whether distillation reached the teacher in at most half GRPO's steps: True, False, or None (open),
    with why. A run that never reached it needed more steps than it trained (`*_last`)."""
    if grpo == 0 or distill == 0:
        return None, "the base already reaches the teacher's mean within its interval: nothing to measure"
    if distill is not None and grpo is not None:
        return 2 * distill <= grpo, f"{distill} vs {grpo} steps"
    if distill is not None:  # GRPO needs at least grpo_last + 1
        if grpo_last is not None and 2 * distill <= grpo_last + 1:
            return True, f"{distill} vs more than {grpo_last} steps"
        return None, f"{distill} vs more than {grpo_last} steps: GRPO did not train long enough to tell"
    if grpo is not None:  # distillation needs at least distill_last + 1
        if distill_last is not None and 2 * (distill_last + 1) > grpo:
            return False, f"more than {distill_last} vs {grpo} steps"
        return None, f"more than {distill_last} vs {grpo} steps: distillation did not train long enough to tell"
    return None, f"neither reached the teacher in {grpo_last} / {distill_last} steps"


def ratio_text(distill: int | None, distill_last: int | None, grpo: int | None, grpo_last: int | None) -> str:
    """Distillation's steps over GRPO's; a bound where one arm never reached the teacher (it needed at least
    one step more than it trained)."""
    if distill is not None and grpo:
        return f"{distill / grpo:.2f}"
    if distill is not None and grpo is None and grpo_last is not None:
        return f"<= {distill / (grpo_last + 1):.2f}"
    if distill is None and grpo and distill_last is not None:
        return f">= {(distill_last + 1) / grpo:.2f}"
    return "-"


def analyse(m: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (seed, distillation arm): each arm's steps to the teacher, their ratio and the verdict."""
    teacher = m.get("teacher") or {}
    target = (teacher.get("best") or {}).get("value")
    runs = m.get("runs", {})
    rows = []
    for seed in m["meta"]["seeds"]:
        grpo_curve = (runs.get(f"grpo-s{seed}") or {}).get("curve", [])
        for arm in [a for a in m["meta"]["arms"] if a != "grpo"]:
            curve = (runs.get(f"{arm}-s{seed}") or {}).get("curve", [])
            if target is None:
                rows.append({"seed": seed, "arm": arm, "grpo": None, "distill": None, "holds": None,
                             "why": "no teacher validation", "ratio": "-"})
                continue
            g, d = steps_to_reach(grpo_curve, target), steps_to_reach(curve, target)
            g_last, d_last = last_step(grpo_curve), last_step(curve)
            holds, why = verdict(d, d_last, g, g_last)
            rows.append({"seed": seed, "arm": arm, "grpo": g, "grpo_last": g_last, "distill": d, "distill_last": d_last,
                         "holds": holds, "why": why, "ratio": ratio_text(d, d_last, g, g_last)})
    return rows


def _reached(step: int | None, last: int | None) -> str:
    if step is not None:
        return str(step)
    return "never" if last is None else f"never (of {last})"


def point_text(p: dict[str, Any] | None) -> str:
    if not p or p.get("value") is None:
        return "-"
    if p.get("lo") is None:
        return f"{p['value']:.3f}"
    return f"{p['value']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}]"


def results_table(m: dict[str, Any]) -> list[str]:
    rows = analyse(m)
    lines = ["| seed | arm | steps to the teacher: GRPO alone | with the teacher | ratio | target (at most half) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        mark = {True: "**holds**", False: "fails", None: "open"}[r["holds"]]
        lines.append(f"| {r['seed']} | {r['arm']} | {_reached(r['grpo'], r.get('grpo_last'))} | "
                     f"{_reached(r['distill'], r.get('distill_last'))} | {r['ratio']} | {mark} ({r['why']}) |")
    return lines


def curves_table(m: dict[str, Any]) -> list[str]:
    """Validation per step, every run a column: mean [interval]."""
    names = [f"{arm}-s{seed}" for seed in m["meta"]["seeds"] for arm in m["meta"]["arms"]]
    names = [n for n in names if n in m.get("runs", {})]
    by_run = {n: {p["step"]: p for p in m["runs"][n]["curve"]} for n in names}
    steps = sorted({s for c in by_run.values() for s in c})
    lines = ["| step | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for s in steps:
        lines.append(f"| {s} | " + " | ".join(point_text(by_run[n].get(s)) for n in names) + " |")
    return lines


def summary_sentence(m: dict[str, Any]) -> str:
    rows = analyse(m)
    if not rows:
        return "No distillation arm was trained: nothing to compare."
    parts = []
    for arm in [a for a in m["meta"]["arms"] if a != "grpo"]:
        mine = [r for r in rows if r["arm"] == arm]
        held = sum(r["holds"] is True for r in mine)
        failed = sum(r["holds"] is False for r in mine)
        parts.append(f"{arm_label(arm)}: the target holds on {held} of {len(mine)} seeds"
                     + (f", fails on {failed}" if failed else "")
                     + (f", open on {len(mine) - held - failed}" if len(mine) - held - failed else ""))
    return "; ".join(parts) + "."


def chosen_setting(m: dict[str, Any]) -> tuple[str, str]:
    """The distilling arm a measurement of several settings (`--distill-settings`) points to, with why.

    The rule, fixed before the settings are measured: the one whose runs meet the target on the most seeds;
    among those, the one that reached the teacher in the fewest steps summed over its seeds (a run that never
    did counts its last step plus one); then the fewest updates a step, then the smaller rate. It is meant for
    seeds other than the ones the target is then measured on, so the setting is chosen on data the verdict
    never sees."""
    rows = [r for r in analyse(m) if arm_setting(r["arm"])[0] is not None]
    if not rows:
        raise ValueError("no arm of this measurement carries its settings: measure with --distill-settings")

    def spent(r: dict[str, Any]) -> int:
        return r["distill"] if r["distill"] is not None else (r.get("distill_last") or 0) + 1

    score = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        rate, iterations = arm_setting(arm)
        score[arm] = (-sum(r["holds"] is True for r in mine), sum(spent(r) for r in mine), iterations or 1, rate)
    best = min(score, key=lambda arm: score[arm])
    why = "; ".join(f"{arm}: target on {-h} of {len(m['meta']['seeds'])} seeds, {n} steps in all"
                    for arm, (h, n, _, _) in score.items())
    return best, why


def teacher_line(m: dict[str, Any]) -> str:
    t, meta = m.get("teacher") or {}, m["meta"]
    if not t.get("best"):
        return "No teacher validation was recorded."
    clear = ("clearly above its base (a gain beyond the noise of both)" if t.get("clearly_above_base") else
             "**not clearly above its base** (within the noise of both: the comparison below measures little)")
    seed = f" (seed {t['seed']})" if t.get("seed") is not None else ""
    # the steps it trained: its last validation, which the loop takes where it stops (max_steps, or solved early)
    trained = max((p["step"] for p in t.get("curve") or []), default=t.get("steps", "?"))
    bound = f" (of up to {t['steps']})" if t.get("steps") not in (None, trained) else ""
    return (f"Teacher: `{Path(t.get('run_dir', '?')).name}` trained {trained} GRPO steps{bound} on {meta['env']}{seed}; "
            f"validation {meta['metric']} on {meta['val_size']} held-out scenarios: "
            f"base {point_text(t.get('base'))}, best {point_text(t['best'])} at step {t['best'].get('step')}, "
            f"{clear}. The students distil from that checkpoint.")


def distill_settings_text(meta: dict[str, Any]) -> str:
    """The distilling arms' rate, where it is not every run's (an env preset's distillation rate)."""
    rate, iterations = meta.get("distill_learning_rate"), meta.get("distill_iterations") or 1
    if rate is None or (rate, iterations) == (meta["learning_rate"], 1) or any(
            arm_setting(a)[0] is not None for a in meta["arms"]):
        return ""
    return f", the distilling arms at lr {rate:g} with {iterations} update(s) a step (the preset's distillation settings)"


def docs_block(m: dict[str, Any], png: str | None = None) -> str:
    meta = m["meta"]
    head = provenance(command=meta["command"], commit_id=meta["commit"], machine_text=meta["machine"], day=meta["date"])
    status = {"done": "", "budget": " The time budget ended the students before their last step: the table is "
                                    "made of the steps they finished.",
              "running": " The run did not finish (the JSON was written while it trained).",
              "failed": f" The run failed ({m.get('error')}): the table is made of the steps before."}.get(
                  m.get("status"), "")
    coef = meta.get("distill_coef")  # None: TrainConfig's own default
    weight = "" if coef is None else f", the distillation arms' teacher term weighted {coef:g} (distill_coef)"
    setup = (f"Base {meta['model']} ({meta['dtype']} on {meta['device']}); every run {meta['groups_per_step']} groups x "
             f"{meta['rollouts_per_group']} rollouts a step at lr {meta['learning_rate']:g}"
             f"{', the env preset' if meta.get('as_preset') else ''}"
             f"{''.join(f', the students trained with {k}={v}' for k, v in (meta.get('student_scenario') or {}).items())}"
             f"{weight}{distill_settings_text(meta)}"
             f"; students "
             f"of seeds {', '.join(map(str, meta['seeds']))}: {meta['steps']} steps each, validated after every step; "
             f"{m.get('wall_s', 0) / 60:.1f} minutes in all.{status}")
    out = [head, "", setup, "", teacher_line(m), "", *results_table(m), "", summary_sentence(m), "",
           "Validation per step (mean [95% interval]):", "", *curves_table(m)]
    if png:
        out += ["", f"![validation per step, both arms, per seed]({png})"]
    return "\n".join(out)


def plot(m: dict[str, Any], path: Path) -> None:
    """Both arms' validation curves with their intervals, one panel per seed, the teacher's mean and
    interval across each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds, meta = m["meta"]["seeds"], m["meta"]
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(seeds), figsize=(max(6.5, 4.2 * len(seeds)), 3.8), sharey=True, squeeze=False)
    best = (m.get("teacher") or {}).get("best") or {}
    colours = {"grpo": "tab:blue", "sampled": "tab:orange", "topk": "tab:green"}
    for ax, seed in zip(axes[0], seeds):
        if best.get("value") is not None:
            ax.axhline(best["value"], color="black", lw=1, ls="--", label="teacher (best val)")
            if best.get("lo") is not None:
                ax.axhspan(best["lo"], best["hi"], color="black", alpha=0.07)
        for i, arm in enumerate(meta["arms"]):
            colour, style = colours[arm_kind(arm)], ("-", "--", ":", "-.")[i % 4]
            curve = sorted((m.get("runs", {}).get(f"{arm}-s{seed}") or {}).get("curve", []), key=lambda p: p["step"])
            if not curve:
                continue
            xs = [p["step"] for p in curve]
            ax.plot(xs, [p["value"] for p in curve], marker="o", ms=3, color=colour, ls=style, label=arm_label(arm))
            if all(p.get("lo") is not None for p in curve):
                ax.fill_between(xs, [p["lo"] for p in curve], [p["hi"] for p in curve], color=colour, alpha=0.15)
            reached = steps_to_reach(curve, best["value"]) if best.get("value") is not None else None
            if reached is not None:  # where it reached the teacher
                ax.plot([reached], [next(p["value"] for p in curve if p["step"] == reached)], marker="*", ms=13,
                        color=colour, markeredgecolor="black", ls="none")
        ax.set_title(f"student seed {seed}")
        ax.set_xlabel("step (*: reached the teacher)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"val {meta['metric']}")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{meta['model']} on {meta['env']}: on-policy distillation vs GRPO alone", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
