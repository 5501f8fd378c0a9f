"""The `scratchbert` command line.

Each sub-command lives next to the library code it wraps: a module listed in
`COMMANDS` defines `add_cli(subparsers)`, which adds its parser and sets
`func=<callable taking the parsed args>`. Modules are imported only when the
command line is built, so `import scratchbert` stays light.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# module -> the sub-commands it provides (listed here so `--help` stays readable)
COMMANDS = {
    "scratchbert.tokenization": ["train-tokenizer"],
    "scratchbert.training.pretrain": ["pretrain"],
    "scratchbert.training.finetune": ["finetune"],
    "scratchbert.inspection": ["fill-mask", "attention-map"],
    "scratchbert.export": ["export-bert"],
}


class CommandError(Exception):
    """A user-facing error: printed as one line, without a traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scratchbert", description="BERT from scratch, as a Hugging Face model package.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:
                raise
            continue  # a command whose module is not part of this install
        module.add_cli(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except (CommandError, ValueError, FileNotFoundError, UnicodeDecodeError) as err:
        print(f"scratchbert {args.command}: error: {err}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
