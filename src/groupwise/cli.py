"""The `groupwise` command.

Each subcommand's arguments are declared here (so `groupwise --help` lists everything without importing
torch) and its work is done by a function in the module that owns it, imported only when that
subcommand runs.

Argument errors are one line and exit code 2, before anything is loaded: argparse checks each value
(`_int_at_least`, `_device`, `_folder_name`, ...), `check_paths_and_device` what needs the machine (a
local model path, the run store folder, a CUDA device), and a `ConfigError` a command raises while
checking its arguments (before loading a model) is printed as one line too. Warnings of groupwise's own (a skipped corrupt line, a
skipped checkpoint) are printed as one line each.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn


class _Parser(argparse.ArgumentParser):
    """argparse, with its error as one line (the usage is one `--help` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _int_at_least(lo: int, hi: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < lo or (hi is not None and value > hi):
            span = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"must be an integer {span}, got {text!r}")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


_STEP = _int_at_least(0)
_COUNT = _int_at_least(1)
_DEVICE = re.compile(r"^(cpu|mps|cuda(:\d+)?)$")
# What `groupwise.loading.resolve_dtype` accepts, as the command line spells it.
DTYPES = ("float32", "bfloat16", "float16", "fp32", "bf16", "fp16")


def _device(text: str) -> str:
    if not _DEVICE.match(text):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda, cuda:N or mps, got {text!r}")
    return text


def _dtype(text: str) -> str:
    if text not in DTYPES:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(DTYPES)}, got {text!r}")
    return text


def _served_name(text: str) -> str:
    """A model name requests use: ``name@3`` asks for step 3 of ``name``, so a name has no '@'."""
    if not text or "@" in text:
        raise argparse.ArgumentTypeError(f"must be a non-empty name without '@' (it separates the step, as in "
                                         f"name@3), got {text!r}")
    return text


def _folder_name(served: bool) -> Callable[[str], str]:
    """A project or model name that names a folder of the run store (and, for a model, a served name)."""
    def parse(text: str) -> str:
        from groupwise.store import folder_name_problem

        if served:
            _served_name(text)
        problem = folder_name_problem(text)
        if problem:
            raise argparse.ArgumentTypeError(f"{text!r} {problem}")
        return text

    return parse


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="print stored trajectories readably (watch your rollouts)")
    p.add_argument("run_dir", help="a run folder: <base_path>/<project>/<model>")
    p.add_argument("--split", default=None, help="train, val, test, ... (default: all splits)")
    p.add_argument("--step", type=_STEP, default=None, help="only this step (default: the latest)")
    order = p.add_mutually_exclusive_group()
    order.add_argument("--best", action="store_true", help="highest rewards first")
    order.add_argument("--worst", action="store_true", help="lowest rewards first")
    p.add_argument("-n", type=_COUNT, default=3, help="how many trajectories to print (default 3)")
    p.add_argument("--skip-corrupt", action="store_true",
                   help="skip lines of a trajectory file that do not parse (each is named in a warning)")
    p.set_defaults(_target="groupwise.inspect:run_inspect")


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model (and LoRA adapters) over an OpenAI-compatible HTTP API")
    p.add_argument("--model", required=True, help="base model: short name (smollm2-135m), HF id or local path")
    p.add_argument("--adapter", action="append", default=[], metavar="DIR",
                   help="a LoRA adapter folder to serve (repeatable); served as <name>@<step> or by folder name")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; any other needs --api-key)")
    p.add_argument("--port", type=_int_at_least(0, 65535), default=8000, help="port (default 8000)")
    p.add_argument("--api-key", default=None, help="require this bearer token (required off loopback)")
    p.add_argument("--name", type=_served_name, default=None, help="served model name (default: the --model value)")
    p.add_argument("--device", type=_device, default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--dtype", type=_dtype, default=None, help="float32, bfloat16 or float16 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--max-batch-size", type=_COUNT, default=32,
                   help="sequences decoded together, and the most choices (n) a request may ask (default 32)")
    p.add_argument("--max-body-bytes", type=_COUNT, default=8 * 2**20,
                   help="larger request bodies are refused with 413 (default 8 MiB)")
    p.add_argument("--max-kv-gb", type=_positive_float, default=None,
                   help="the KV cache's largest size; the context shrinks to what it holds at --max-batch-size "
                        "(default: a third of the memory free at startup)")
    p.set_defaults(_target="groupwise.inference.server:run_serve")


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="plot a run's curves, baselines, alerts and stop point; print a table")
    p.add_argument("run_dir", help="a run folder: <base_path>/<project>/<model>")
    p.add_argument("--out", default=None, help="where to write the PNGs (default: <run_dir>/report)")
    p.add_argument("--wandb", default=None, metavar="PROJECT", help="also log the history to this W&B project (needs wandb)")
    p.add_argument("--tensorboard", default=None, metavar="DIR", help="also write TensorBoard scalars to DIR (needs tensorboard)")
    p.set_defaults(_target="groupwise.loop.report:run_report")


def _add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="show answers of two steps to the same validation scenarios side by side")
    p.add_argument("run_dir", help="a run folder: <base_path>/<project>/<model>")
    p.add_argument("--steps", default="0,best", help="two steps, comma separated: numbers, 'best' or 'latest' (default 0,best)")
    p.add_argument("--split", default="val", help="split to compare on (default val)")
    p.add_argument("-n", type=_COUNT, default=5, help="how many scenarios (default 5)")
    p.set_defaults(_target="groupwise.loop.compare:run_compare")


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train an agent on a built-in environment (the main job)",
        description="Train a LoRA adapter with GRPO on a built-in environment, validating on held-out "
                    "scenarios; the best checkpoint is tested at the end. The run lives in "
                    "<path>/<env>/<name>; running the same command again resumes it from its last "
                    "checkpoint (raise --steps to train further).",
        epilog="Resume or extend a run: `groupwise train 2048 --seed 0 --steps 16` after an 8-step run "
               "continues at step 8. Watch it: `groupwise report .groupwise/2048/2048-s0`.")
    p.add_argument("env", help="2048, tictactoe, math, email, titles")
    p.add_argument("--model", default="smollm2-135m", help="base model (default smollm2-135m)")
    p.add_argument("--judge", action="append", default=None,
                   help="RULER judge, e.g. local/smollm2-135m or openai/o4-mini; repeat it with --judge-labels to "
                        "train with the best candidate")
    p.add_argument("--judge-labels", default=None, metavar="LABELS",
                   help="check the judge(s) before training on a labelled set (an env with one: titles; 'env' for "
                        "this env's; a JSONL file; a run folder) and train with the best that clears "
                        "--judge-margin, or stop with the table when none does")
    p.add_argument("--judge-margin", type=float, default=0.05,
                   help="the bar: pairwise accuracy's lower bound must exceed 0.5 + margin (default 0.05)")
    p.add_argument("--steps", type=_COUNT, default=None,
                   help="train until this many steps are done in total (default: the env's; a resumed run "
                        "continues from where it stopped)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the training scenarios, their order and the run's name (default 0); the "
                        "validation and test scenarios are the same for every seed")
    p.add_argument("--path", default=".groupwise", help="run store folder (default .groupwise)")
    p.add_argument("--name", type=_folder_name(served=True), default=None,
                   help="model name (default: <env>-s<seed>; an existing name resumes)")
    p.add_argument("--gate", action="store_true",
                   help="hybrid envs (email): judge score x correctness. Off by default: an untrained small "
                        "agent is never correct, and the gate would zero every reward (no signal)")
    p.add_argument("--device", type=_device, default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--dtype", type=_dtype, default=None, help="float32, bfloat16 or float16 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--lr", type=_positive_float, default=None,
                   help="GRPO learning rate (default: the env's, e.g. 1e-3 for 2048)")
    p.add_argument("--sft", type=_STEP, default=0, metavar="N",
                   help="first a supervised warm start on N demonstrations of the env's scripted agent (email: "
                        "search, read, answer with the ground truth), then GRPO from there (default 0: none)")
    p.add_argument("--sft-epochs", type=_COUNT, default=2, help="SFT epochs, one step each (default 2)")
    p.add_argument("--sft-lr", type=_positive_float, default=2e-4, help="SFT learning rate (default 2e-4)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="CPU only: each rollout's tokens and logprobs do not depend on which rollouts the engine "
                        "batched with it, so two runs of one seed on one machine match exactly (slower: no prefix "
                        "cache)")
    p.set_defaults(_target="groupwise.recipes.train:run_train")


def _add_sft(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="supervised warm start of a run from demonstrations (GRPO continues it)")
    p.add_argument("data", help="a JSONL file in ART's SFT format ({\"messages\": [...], \"tools\": [...]} per "
                                "line), or an env with a scripted demonstrator (email)")
    p.add_argument("-n", type=_COUNT, default=None, help="how many demonstrations (default: the file's all; env: 64)")
    p.add_argument("--epochs", type=_COUNT, default=2, help="passes over the demonstrations, one step each (default 2)")
    p.add_argument("--lr", type=_positive_float, default=2e-4, help="learning rate (default 2e-4)")
    p.add_argument("--batch-size", type=_COUNT, default=4, help="demonstrations per optimizer update (default 4)")
    p.add_argument("--model", default="smollm2-135m", help="base model (default smollm2-135m)")
    p.add_argument("--seed", type=int, default=0, help="random seed: which demonstrations and their order (default 0)")
    p.add_argument("--path", default=".groupwise", help="run store folder (default .groupwise)")
    p.add_argument("--project", type=_folder_name(served=False), default=None,
                   help="project (default: the env's name, or 'sft' for a file)")
    p.add_argument("--name", type=_folder_name(served=True), default=None,
                   help="model name (default: <env>-s<seed>, as groupwise train names it)")
    p.add_argument("--device", type=_device, default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    p.set_defaults(_target="groupwise.recipes.sft:run_sft")


def _add_dashboard(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboard", help="a local web page watching runs: curves, alerts, rollouts, tokens (live)")
    p.add_argument("path", nargs="?", default=".groupwise",
                   help="a run store folder, a project or one run folder (default .groupwise)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; any other needs --api-key)")
    p.add_argument("--port", type=_int_at_least(0, 65535), default=8100, help="port (default 8100)")
    p.add_argument("--api-key", default=None, help="require this bearer token (required off loopback)")
    p.set_defaults(_target="groupwise.dashboard.app:run_dashboard")


def _add_judge(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("judge", help="check a judge before trusting it: `groupwise judge eval`")
    jsub = p.add_subparsers(dest="judge_command", required=True, metavar="JUDGE_COMMAND")
    e = jsub.add_parser(
        "eval", help="agreement of judges with labelled groups, position flips, consistency, cost",
        description="Judge labelled groups (known scores or preferences) with each judge, in a seeded order, "
                    "reversed, and repeated; print pairwise accuracy and Kendall tau with bootstrap intervals, "
                    "the flip rate between orders, self-consistency, invalid answers, tokens, cost and seconds "
                    "per group.",
        epilog="Example: groupwise judge eval --labels titles --judge local/smollm2-135m --judge openai/o4-mini")
    e.add_argument("--labels", required=True,
                   help="an env with a labelled set (titles), a JSONL file of labelled groups, or a run folder "
                        "(its validation trajectories, labelled by the validation metric)")
    e.add_argument("--judge", action="append", default=None,
                   help="a judge to evaluate (repeatable): local/smollm2-135m, openai/o4-mini, or with --base-url "
                        "the model an OpenAI-compatible server serves (default local/smollm2-135m)")
    e.add_argument("--rubric", default=None, help="the rubric, or @FILE (default: the env's, else RULER's default)")
    e.add_argument("--base-url", default=None, help="an OpenAI-compatible endpoint serving the --judge models")
    e.add_argument("--api-key", default=None, help="API key for --base-url")
    e.add_argument("--metric", default=None, help="run folder labels: the metric key (default: the run's)")
    e.add_argument("--groups", type=_COUNT, default=None, help="only the first N labelled groups")
    e.add_argument("--orders", type=_COUNT, default=2, help="orders per group: seeded, reversed, then more seeds (default 2)")
    e.add_argument("--repeats", type=_COUNT, default=2,
                   help="identical requests per group, for self-consistency (default 2; 1 skips it)")
    e.add_argument("--margin", type=float, default=0.05,
                   help="a judge clears the bar when its accuracy's lower bound exceeds 0.5 + margin (default 0.05)")
    e.add_argument("--max-concurrent", type=_COUNT, default=4, help="requests in flight per judge (default 4)")
    e.add_argument("--seed", type=int, default=0, help="seed of the orders and of the bootstrap (default 0)")
    e.add_argument("--json", default=None, metavar="PATH", help="also write the figures as JSON")
    e.add_argument("--plot", default=None, metavar="PNG", help="also plot them (needs the plots extra)")
    e.set_defaults(_target="groupwise.judge.eval_command:run_judge_eval")


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_inspect, _add_serve, _add_report, _add_compare, _add_train, _add_sft, _add_dashboard, _add_judge,
]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="groupwise", description="Train LLM agents with RL (GRPO on LoRA, RULER judging).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def check_paths_and_device(args: argparse.Namespace) -> list[str]:
    """What argparse cannot check from one value alone, before a command loads anything: that a local
    ``--model`` path exists, that ``--path`` can be a folder, that the ``--device`` is on this machine."""
    problems = []
    model = getattr(args, "model", None)
    if isinstance(model, str) and model.startswith(("/", "./", "../", "~", ".\\")):  # a path, not a hub id
        path = os.path.expanduser(model)
        if not os.path.isdir(path):
            what = "is a file" if os.path.exists(path) else "does not exist"
            problems.append(f"--model {model}: {what}; a local model is a folder with config.json and weights "
                            "(or pass a short name such as smollm2-135m, or a Hugging Face id)")
        elif not os.path.isfile(os.path.join(path, "config.json")):
            problems.append(f"--model {model}: no config.json in that folder (a local model is a folder that "
                            "save_pretrained wrote)")
    store = getattr(args, "path", None)
    if isinstance(store, str):
        at = os.path.abspath(os.path.expanduser(store))
        while not os.path.exists(at) and os.path.dirname(at) != at:
            at = os.path.dirname(at)  # the nearest part of the path that exists must be a folder
        if not os.path.isdir(at):
            problems.append(f"--path {store}: {at} is a file, not a folder; the run store is a folder of runs")
    device = getattr(args, "device", None)
    if isinstance(device, str) and device != "cpu":
        import torch  # only when a device other than the CPU is asked for

        if device == "mps":
            if not torch.backends.mps.is_available():
                problems.append("--device mps: no MPS device here; use --device cpu")
        elif not torch.cuda.is_available():
            problems.append(f"--device {device}: no CUDA device here (torch.cuda.is_available() is False); "
                            "use --device cpu")
        elif ":" in device and int(device.split(":")[1]) >= torch.cuda.device_count():
            problems.append(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                            f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module_name, func_name = args._target.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    from groupwise.errors import ConfigError, JudgeSelectionError, ModelNotFoundError, RunLockedError

    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            problems = check_paths_and_device(args)
            if problems:
                raise ConfigError(problems, what=f"{args.command} arguments")
            result = func(args)
        except ConfigError as exc:  # the command refused its arguments (before loading anything)
            print(f"groupwise {args.command}: error: {'; '.join(exc.problems)}", file=sys.stderr)
            return 2
        except (ModelNotFoundError, RunLockedError) as exc:  # no such model; another process trains the run
            print(f"groupwise {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2
        except JudgeSelectionError as exc:  # no judge cleared the bar: the table says why, line by line
            print(f"groupwise {args.command}: error: {exc}", file=sys.stderr)
            return 1
    return int(result or 0)


def _show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    """groupwise's own warnings (`GroupwiseWarning`) as one line; others as Python prints them."""
    from groupwise.errors import GroupwiseWarning

    if issubclass(category, GroupwiseWarning):
        print(f"groupwise: warning: {message}", file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


if __name__ == "__main__":
    sys.exit(main())
