"""`scratchbert pretrain`: BERT from scratch (see `scratchbert.training.pretraining.loop` for the loop).

Several processes: `accelerate launch -m scratchbert.commands.pretrain ...` (or
`accelerate launch scripts/pretrain.py ...`) runs this same command in each of them.
"""

from __future__ import annotations

import argparse
import sys

from accelerate import PartialState

from scratchbert.training.run_setup import add_config_arguments, format_sources, resolve_args
from scratchbert.training.pretraining.config import PretrainConfig
from scratchbert.training.pretraining.loop import DEMO_SENTENCES, pretrain, print_fill_mask
from scratchbert.training.pretraining.prepared import read_manifest

from .report import report_errors

HELP = (
    "pretrain BERT from scratch (default recipe 'packed': MLM on text packed to full length; 'paper': MLM + NSP); "
    "with no arguments, a tiny model on the embedded corpus"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, PretrainConfig)
    parser.add_argument(
        "--print-config", action="store_true", help="print every option's value and where it came from (flag, file, recipe, preset, default), then exit"
    )
    parser.add_argument(
        "--fill-mask",
        nargs="*",
        metavar="SENTENCE",
        default=None,
        help="sentences with [MASK] to complete at the end (default: Python-docs examples for the embedded corpus; "
        "on your own corpus, held-out passages with a word hidden)",
    )


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("pretrain", help=HELP, description=HELP)
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # A prepared-data folder's options are the defaults its examples need; --config and flags still win.
    prepared = read_manifest(args.prepared_data)["options"] if getattr(args, "prepared_data", None) else None
    config, sources = resolve_args(args, PretrainConfig, under_file=prepared)
    if args.print_config:
        print(format_sources(config, sources))
        return 0
    result = pretrain(config)  # --no-progress-bar silences datasets' and transformers' bars too
    sentences, hidden = args.fill_mask, None
    if sentences is None:  # the demo's sentences suit the embedded corpus only; on others, held-out text
        own_corpus = config.train_files or config.dataset or config.prepared_data
        sentences = [text for text, _ in result.held_out_passages] if own_corpus else DEMO_SENTENCES
        hidden = [word for _, word in result.held_out_passages] if own_corpus else None
    if sentences and PartialState().is_main_process:
        print_fill_mask(result.masked_lm_dir, sentences, hidden=hidden)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `accelerate launch -m scratchbert.commands.pretrain` and scripts/pretrain.py."""
    parser = argparse.ArgumentParser(prog="scratchbert pretrain", description=HELP)
    add_arguments(parser)
    return report_errors(run, parser.parse_args(argv), "scratchbert pretrain")


if __name__ == "__main__":
    sys.exit(main())
