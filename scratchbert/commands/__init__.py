"""The `scratchbert` command line: one module per command, over the library.

Each module here has `add_parser(subparsers)` (its flags and help) and `run(args) -> int`
(calls the library, prints the result). The dependency runs one way: commands import the
library; nothing in the library imports a command.

Errors: anything a user can fix reaches `main` as a `ScratchBertError` (or one of the plain
exceptions the library raises for bad values and missing files) and is printed as one line,
`scratchbert <command>: error: <what and how to fix it>`, with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from scratchbert.errors import ScratchBertError

from . import attention_map, export_bert, export_onnx, fill_mask, finetune, pretrain, train_tokenizer

COMMANDS = (train_tokenizer, pretrain, finetune, fill_mask, attention_map, export_bert, export_onnx)
# What a user can fix: printed as one line. Anything else is a bug and keeps its traceback.
USER_ERRORS = (ScratchBertError, ValueError, FileNotFoundError, NotADirectoryError, UnicodeDecodeError)


def build_parser(commands=COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scratchbert", description="BERT from scratch, as a Hugging Face model package.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands:
        command.add_parser(subparsers)
    return parser


def report_errors(run: Callable[[argparse.Namespace], int | None], args: argparse.Namespace, prog: str) -> int:
    """Run a command; a user's error becomes one line on stderr and exit status 2."""
    try:
        return int(run(args) or 0)
    except USER_ERRORS as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return report_errors(args.func, args, f"scratchbert {args.command}")


__all__ = ["COMMANDS", "build_parser", "main", "report_errors"]
