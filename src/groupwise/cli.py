"""The `groupwise` command: a parser generated from the jobs' dataclasses, and the dispatch to their `run`.

Each command is a module of `groupwise.jobs` with one dataclass (its settings, help on every field) and
a `run(job)`; `COMMANDS` lists them. The parser is built from the dataclasses (`groupwise.jobs.fields`
says how a field becomes a flag), so adding a flag is adding a field. The job modules import nothing
heavy when they load (their `run` imports the domain it drives), so `groupwise --help` loads no torch.

Caller errors are one line and exit code 2, before anything is loaded: argparse refuses a value by
itself (a field's type, bounds, choices and check, and the check of the config field it feeds), and building the job refuses what needs the machine
(a local model path, the run store folder, a CUDA device) or several fields (`Job.rules`), as does a
`ConfigError` the job raises while checking its inputs before loading a model. Any other error of
groupwise's own (`GroupwiseError`: its message says what to do) is one line too, exit code 1; a traceback
is left for what is a bug. Ctrl-C ends a command with one line saying what it kept (exit code 130).
Warnings of groupwise's own (a skipped corrupt line, a skipped checkpoint) are printed as one line each.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from dataclasses import MISSING
from typing import Any, NoReturn

from groupwise.jobs import audit, compare, dashboard, inspect, judge_eval, report, serve, sft, train
from groupwise.jobs.fields import Command, Flag, flags, parse_text

COMMANDS: list[Command] = [m.COMMAND for m in (inspect, serve, report, compare, train, sft, audit, dashboard,
                                               judge_eval)]
# Help of the words that group nested commands (`groupwise judge eval`).
GROUPS = {"judge": "check a judge before trusting it: `groupwise judge eval`"}


class _Parser(argparse.ArgumentParser):
    """argparse, with its error as one line (the usage is one `--help` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _word(spec: Flag) -> Any:
    """argparse's `type` for a flag: the value of one word, or the flag's requirement as argparse's error."""
    def parse(text: str) -> Any:
        try:
            return parse_text(spec, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def add_command(sub: argparse._SubParsersAction, command: Command, name: str) -> argparse.ArgumentParser:
    """A subparser for `command`, one argument per field of its job; defaults stay the dataclass's (a flag
    left out is absent from the namespace, so the job's own default applies)."""
    p = sub.add_parser(name, help=command.help, description=command.description or command.help,
                       epilog=command.epilog)
    exclusive: dict[str, Any] = {}
    for spec in flags(command.job):
        kwargs: dict[str, Any] = {"help": spec.help_text(), "default": argparse.SUPPRESS}
        if spec.kind is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = _word(spec)
            if spec.meta["metavar"]:
                kwargs["metavar"] = spec.meta["metavar"]
            elif spec.choices:
                kwargs["metavar"] = "{" + ",".join(map(str, spec.choices)) + "}"
            if spec.many and spec.meta["repeat"]:
                kwargs["action"] = "append"
        if spec.meta["positional"]:
            if spec.default is not MISSING:
                kwargs["nargs"] = "?"
            p.add_argument(spec.name, **kwargs)
            continue
        if spec.default is MISSING:
            kwargs["required"] = True
        group = p
        if spec.meta["exclusive"]:
            if spec.meta["exclusive"] not in exclusive:
                exclusive[spec.meta["exclusive"]] = p.add_mutually_exclusive_group()
            group = exclusive[spec.meta["exclusive"]]
        group.add_argument(spec.flag, dest=spec.name, **kwargs)
    p.set_defaults(_command=command)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="groupwise", description="Train LLM agents with RL (GRPO on LoRA, RULER judging).")
    sub = parser.add_subparsers(dest="_word", required=True, metavar="COMMAND")
    nested: dict[str, argparse._SubParsersAction] = {}
    for command in COMMANDS:
        *group, name = command.name.split()
        where = sub
        if group:
            if group[0] not in nested:
                p = sub.add_parser(group[0], help=GROUPS[group[0]])
                nested[group[0]] = p.add_subparsers(dest=f"_{group[0]}_word", required=True,
                                                    metavar=f"{group[0].upper()}_COMMAND")
            where = nested[group[0]]
        add_command(where, command, name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command: Command = args._command
    values = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    from groupwise.errors import (ConfigError, GroupwiseError, JudgeSelectionError, ModelNotFoundError,
                                  RunFolderError, RunLockedError)

    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            result = command.run(command.job(**values))
        except ConfigError as exc:  # the job refused its settings (before loading anything)
            print(f"groupwise {command.name}: error: {'; '.join(exc.problems)}", file=sys.stderr)
            return 2
        except (ModelNotFoundError, RunLockedError, RunFolderError) as exc:  # no such model; another process
            # trains the run; the run store cannot be written
            print(f"groupwise {command.name}: error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2
        except JudgeSelectionError as exc:  # no judge cleared the bar: the table says why, line by line
            print(f"groupwise {command.name}: error: {exc}", file=sys.stderr)
            return 1
        except GroupwiseError as exc:  # every error of groupwise's own says what happened and what to do
            print(f"groupwise {command.name}: error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # Ctrl-C is how a user stops a job: say what is kept, not where Python was
            said = f": {command.interrupted}" if command.interrupted else ""
            print(f"\ngroupwise {command.name}: interrupted{said}", file=sys.stderr)
            return 130
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
