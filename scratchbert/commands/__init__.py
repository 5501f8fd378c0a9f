"""The `scratchbert` command line: one module per command, over the library.

Each module here has `add_parser(subparsers)` (its flags and help) and `run(args) -> int`
(calls the library, prints the result). The dependency runs one way: commands import the
library; nothing in the library imports a command. `main` is the `scratchbert` console script.

Errors (`report.py`, policy in `scratchbert.errors`): a `ScratchBertError` is printed as one line,
`scratchbert <command>: error: <what and how to fix it>`, with exit status 2; anything else is a
bug and keeps its traceback. `--debug` (or `SCRATCHBERT_DEBUG=1`) shows it for user errors too.
"""

from __future__ import annotations

import argparse

from . import answer, attention_map, export_bert, export_onnx, fill_mask, finetune, prepare_data, pretrain, train_tokenizer
from .report import report_errors

COMMANDS = (train_tokenizer, prepare_data, pretrain, finetune, answer, fill_mask, attention_map, export_bert, export_onnx)


def build_parser(commands=COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scratchbert", description="BERT from scratch, as a Hugging Face model package.")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a user's error too (or set SCRATCHBERT_DEBUG=1)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands:
        command.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return report_errors(args.func, args, f"scratchbert {args.command}")


__all__ = ["COMMANDS", "build_parser", "main", "report_errors"]
