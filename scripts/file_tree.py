"""Rewrite the "File tree" block of docs/architecture.md: one line per tracked file, from its docstring.

    python scripts/file_tree.py        # run after adding or moving files
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Files without a Python docstring, and tests' shared helpers, described here.
NOTES = {
    ".ci/run": "CI: fresh venv, then exactly the README's test command (pytest; 'no tests' fails too)",
    ".gitignore": "ignored: venvs, caches, run stores",
    "README.md": "the front door: what groupwise is, the two commands, an example, results",
    "bench/data/joint_updates_sweep_h200.json": "an H200, 2026-12-05: the joint update alone at 65,536 tokens, the 4-run sweep bench at 16 rollouts a step with joint updates and in turn, and the train job's sweep with a process per run or one",
    "bench/data/many_runs_joined_h200.json": "bench/many_runs.py on H200s, 4 and 8 runs: a driver process per run on one shared worker (joined) against one driver (together) and in sequence, six calls on two machines",
    "bench/data/many_runs_decode_during_updates_h200.json": "bench/many_runs.py on H200s, 4 runs with the separate core: free-running with the engine decoding during updates or paused, lockstep, and in sequence, three calls",
    "bench/data/many_runs_host_copies_h200.json": "bench/many_runs.py and bench/train_parts.py on H200s, 4 runs: a checkpoint's copies to the CPU and the served adapter's check in bulk against the code before, three calls",
    "bench/data/many_runs_adapter_switch_h200.json": "bench/many_runs.py on H200s, 4 and 8 runs: the trainers' adapter switch, the pause's eval flags and the trainer's own modules against the code before, four calls",
    "bench/data/many_runs_interleaved_h200.json": "bench/many_runs.py on H200s, 4 and 8 runs: the worker's commands interleaved against one at a time, the separate core against the in-process engine, three calls",
    "bench/data/many_runs_inline_answers_h200.json": "bench/many_runs.py on an H200, 4 runs together: answers built on the event loop (tried, not kept) against on a worker thread, one call",
    "bench/data/many_runs_compiled_h200.json": "bench/many_runs.py on an H200, 4 runs with a driver each: compiled updates against eager ones, in sequence and joined, one call",
    "bench/data/many_runs_full_collections_h200.json": "bench/many_runs.py on an H200, 4 runs with a driver each, compiled updates: joined before and after freezing again after slow full collections, with every full collection of the second case's processes",
    "bench/data/many_runs_free_running_h100.json": "bench/many_runs.py on an H100, 4 runs with a driver each and the separate core, compiled updates: joined free-running against lockstep, and in sequence",
    "bench/data/many_runs_4_8_h100.json": "bench/many_runs.py on one H100, compiled updates, a driver per run: 4 runs joined (also with a 1 ms GIL switch interval, not kept) and in sequence, 8 runs joined and in sequence, two calls",
    "bench/data/update_inductor_modes_h100.json": "bench/train_step.py on one H100, the 0.5B update compiled: Inductor's Python wrapper against its C++ wrapper and CUDA graphs (environment switches, not kept), one call",
    "bench/data/update_end_h100.json": "bench/train_step.py (7B and 0.5B) and bench/many_runs.py (4 runs) on one H100: the update's end in one read-back against the code before it, with the profiled updates' device gaps",
    "bench/data/many_runs_keep_snapshot_h100.json": "bench/many_runs.py on three H100 machines, 4 runs with a driver each, compiled updates: joined with the checkpoint's copy at the update's end against the code before it and in sequence, two experiments not kept, and a checkpoint-sized write timed on the host",
    "bench/data/many_runs_timeline_h100.json": "bench/many_runs.py on an H100, 4 runs with a driver each, compiled updates, one call: joined with a timeline of the worker (updates, publication parts, engine steps, full collections) and in sequence",
    "bench/data/many_runs_update_order_h100.json": "bench/many_runs.py on an H100, 4 runs with a driver each, compiled updates, one call: each step's updates in the order they ended, joined with the updates beside the publications and on the compute thread, and in sequence",
    "bench/data/many_runs_hashed_checkpoint_h100.json": "bench/many_runs.py on an H100, 4 runs with a driver each, compiled updates: joined with the checkpoint hashed as written and read back (the code before), alternating over two calls, and in sequence; bench/checkpoint_write.py on the GPU snapshot",
    "bench/data/many_runs_checkpoint_writer_h100.json": "bench/many_runs.py on an H100, 4 runs with a driver each, compiled updates: joined with the checkpoint writer that lets go of the GIL and with safetensors' save_file, and in sequence, one call",
    "bench/data/many_runs_gc_h200.json": "bench/many_runs.py on an H200, 4 runs: the tokenising fast path, async route dependencies and the frozen heap against the code before them, three calls on one slow machine",
    "bench/data/distill_2048_topk.json": "bench/distill_smollm2.py's curves on the CPU, 2048 at its preset, top-k, the `groupwise train 2048` teacher: the docs block's run",
    "bench/data/distill_2048_topk_coef3.json": "bench/distill_smollm2.py on the CPU, 2048: the top-k students alone with distill_coef 3, 2 steps (docs/benchmarks.md)",
    "bench/data/distill_2048_h200_teacher13.json": "bench/distill_smollm2.py on an H200, 2048: a 13-step teacher trained in the bench, seeds 0-5, top-k and sampled",
    "bench/data/distill_2048_h200_teacher30.json": "bench/distill_smollm2.py on an H200, 2048: the 30-step teacher (0.979), seeds 0-2, lr 1e-3",
    "bench/data/distill_2048_h200_teacher30_lr2e-3.json": "bench/distill_smollm2.py on an H200, 2048: the 30-step teacher, seeds 0-2, both arms at lr 2e-3",
    "bench/data/distill_2048_h200_select_s3-5.json": "bench/distill_smollm2.py on an H200, 2048: four distillation settings on student seeds 3-5, where the preset was chosen (docs/benchmarks.md)",
    "bench/data/distill_2048_h200_measure_s0-2.json": "bench/distill_smollm2.py on an H200, 2048: the preset (4 updates a step) against GRPO alone on seeds 0-2, teacher 0.979",
    "bench/data/distill_2048_h200_reselect_s3-5.json": "bench/distill_smollm2.py on an H200, 2048: the selection again on seeds 3-5 with a second teacher (0.597); it kept the preset",
    "bench/data/distill_2048_h200_measure2_s0-2.json": "bench/distill_smollm2.py on an H200, 2048: the preset against GRPO alone on seeds 0-2, a third teacher (0.691)",
    "bench/data/distill_2048_h200_measure_s6-8.json": "bench/distill_smollm2.py on an H200, 2048: the preset against GRPO alone on fresh seeds 6-8, teacher 0.691",
    "bench/data/distill_2048_cpu_iter4.json": "bench/distill_smollm2.py on the 2-core CPU, 2048 with the preset's 4 updates a step, seeds 0-2, one step each",
    "bench/data/distill_oneword_sampled.json": "bench/distill_smollm2.py's curves on the CPU, oneword, sampled-token estimate (docs/benchmarks.md)",
    "bench/data/distill_oneword_sampled_exact.json": "the same, the students on oneword's sparse reward (reward=exact)",
    "bench/data/distill_oneword_topk.json": "the same, top-k estimate",
    "bench/data/distill_oneword_topk_4replies.json": "the same, top-k, 4 replies a step: the docs block's run (--from-json renders it)",
    "bench/data/2048_val_labels.jsonl": "2048 validation games of base SmolLM2 labelled by the env's reward (bench/judge_eval_2048.py)",
    "tests/art_compat/art_api_snapshot.json": "facts about ART 0.1-0.5's public API, from its wheels (scripts/art_api_snapshot.py)",
    "pyproject.toml": "package, extras (backend, plots, benchmarking, dashboard, ray, vllm, wandb, langgraph, mcp, tensorboard, verifiers, openenv, dev, all), pytest settings",
    "src/groupwise/dashboard/static/index.html": "the dashboard's page: tabs for runs, curves, rollouts, compare",
    "src/groupwise/dashboard/static/app.js": "the dashboard's script: polls the API every 2 s, draws the charts with uPlot",
    "src/groupwise/dashboard/static/style.css": "the dashboard's styles (token colours: trained, grammar-forced, masked)",
    "src/groupwise/dashboard/static/uPlot.iife.min.js": "uPlot 1.6.32 (MIT), the chart library, from the npm registry's package",
    "src/groupwise/dashboard/static/uPlot.min.css": "uPlot's styles",
    "src/groupwise/dashboard/static/uPlot.LICENSE": "uPlot's MIT license",
    "docs/img/dashboard-runs.png": "screenshot: the dashboard's runs list (tests/dashboard/test_dashboard_browser.py takes it)",
    "docs/img/dashboard-curves.png": "screenshot: curves with bands, baselines, alert markers",
    "docs/img/dashboard-rollouts.png": "screenshot: a step's groups ranked by reward, a trajectory and its tokens",
    "docs/img/dashboard-compare.png": "screenshot: the same scenarios at two steps",
    "docs/img/distill_smollm2_2048.png": "figure: the same on 2048, from the teacher `groupwise train 2048` trained (bench/distill_smollm2.py)",
    "bench/data/many_runs_engine_process_h200.json": "bench/many_runs.py on an H200: 1 and 4 runs together, the engine in process against the separate core",
    "bench/data/many_runs_core_sequence_h200.json": "bench/many_runs.py on an H200: 4 runs together against in sequence, the engine in process and as a core",
    "bench/data/many_runs_4_8_h200.json": "bench/many_runs.py on an H200: 4 and 8 runs together against in sequence, the engine in process",
    "bench/data/decode_profile_512_h200.json": "bench/decode_profile.py on an H200: a decode pass of 512 rows on the base, one adapter, and 16 stacked adapters before and after the stack ran in bf16 with shared products",
    "bench/data/many_runs_8_core_one_call_h200.json": "bench/many_runs.py on an H200: 8 runs in sequence and together in one call, the engine core in its own process",
    "bench/data/many_runs_capture_fix_h200.json": "bench/many_runs.py on an H200: 4 and 8 runs, in sequence and together, before and after the decode graphs' capture ran with the collector off",
    "bench/data/train_step_7b_compile_h200.json": "bench/train_step.py on an H200: the 7B step with compiled decoder layers and eager, one after the other on one machine",
    "bench/data/many_runs_addmm_h200.json": "bench/many_runs.py on an H200: 4 and 8 runs, in sequence and together, two rounds after the stacked LoRA's add went into its matmul's epilogue",
    "bench/data/train_step_7b_compile_trl_h200.json": "bench/train_step.py on an H200: the 7B step compiled against TRL 1.16 in the same call, three calls",
    "bench/data/decode_fusion_h200.json": "bench/decode_profile.py on an H200: decode passes of 512 rows with the graphs' norms, rotary and sampling compiled and not; the engine against static generate, both ways",
    "bench/data/many_runs_fused_h200.json": "bench/many_runs.py on an H200: 4 and 8 runs, in sequence and together, with the decode graphs fused",
    "bench/data/train_step_7b_fused_trl_h200.json": "bench/train_step.py on an H200: the 7B step compiled, decode fused, against TRL 1.16 in the same call, two calls (and once unfused)",
    "bench/data/many_runs_8_engine_split_h200.json": "bench/many_runs.py on an H200: 8 runs, in sequence and together, with the engine's seconds in prefill, decode and waiting for the device",
    "docs/img/distill_smollm2_2048_h200.png": "figure: 2048 on an H200, the 30-step teacher, GRPO alone and distillation per seed (bench/distill_smollm2.py)",
    "docs/img/distill_smollm2_2048_h200_iterations.png": "figure: 2048 on an H200, the distillation preset (4 updates a step) on seeds 0-2, teacher 0.979",
    "docs/img/distill_smollm2_2048_h200_s0-2_teacher691.png": "figure: 2048 on an H200, the preset on seeds 0-2, teacher 0.691",
    "docs/img/distill_smollm2_2048_h200_s6-8.png": "figure: 2048 on an H200, the preset on fresh seeds 6-8, teacher 0.691",
    "docs/img/distill_smollm2.png": "figure: validation per step of GRPO alone and with a teacher, per seed (bench/distill_smollm2.py)",
}

# Folders listed as one line: third-party files kept verbatim (their own docstrings say nothing here).
FOLDERS = {
    "tests/art_compat/art_repo/": "ART's example programs and notebook code cells, as ART wrote them (NOTICE.md; art_runner.py)",
}


def describe(path: Path) -> str:
    rel = path.relative_to(ROOT).as_posix()
    if rel in NOTES:
        return NOTES[rel]
    if path.suffix == ".py":
        try:
            doc = ast.get_docstring(ast.parse(path.read_text()))
        except SyntaxError:
            doc = None
        if doc:
            line = doc.strip().splitlines()[0].rstrip(".")
            return line if len(line) <= 90 else line[:89] + "…"
        return "(package marker)" if path.name == "__init__.py" else ""
    if path.suffix == ".md":
        for line in path.read_text().splitlines():
            if line.startswith("#"):
                return "docs: " + line.lstrip("# ").strip()
    if path.suffix == ".json":
        return "data"
    return ""


def main() -> None:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    folded = {next((d for d in FOLDERS if f.startswith(d)), f) for f in files if (ROOT / f).is_file()}
    lines = [f"{f:<55} {FOLDERS.get(f) or describe(ROOT / f)}".rstrip() for f in sorted(folded)]
    doc = ROOT / "docs" / "architecture.md"
    text = doc.read_text()
    head, rest = text.split("## File tree", 1)
    intro, after = rest.split("```\n", 1)
    _, tail = after.split("```\n", 1)
    doc.write_text(head + "## File tree" + intro + "```\n" + "\n".join(lines) + "\n```\n" + tail)
    print(f"{len(lines)} files listed in {doc.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
