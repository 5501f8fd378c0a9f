"""`scratchbert prepare-data`: build a run's tokenizer and examples ahead, into a folder `pretrain --prepared-data` reads."""

from __future__ import annotations

import argparse

from scratchbert.errors import ScratchBertError
from scratchbert.training.run_setup import add_config_arguments, resolve_args
from scratchbert.training.pretraining.config import PretrainConfig
from scratchbert.training.pretraining.prepared import PREPARE_OPTIONS, prepare_data, read_manifest

HELP = (
    "tokenize and pack a corpus once, into --output-dir (with pretrain's options that shape the examples); "
    "then `scratchbert pretrain --prepared-data DIR` starts from it, here or on another machine"
)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("prepare-data", help=HELP, description=HELP)
    add_config_arguments(parser, PretrainConfig, only=PREPARE_OPTIONS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config, sources = resolve_args(args, PretrainConfig)
    if sources["output_dir"] == "default":
        raise ScratchBertError("prepare-data needs --output-dir: the folder to write the prepared data to.")
    if config.prepared_data:
        raise ScratchBertError("prepare-data builds a prepared-data folder; --prepared-data reads one. Leave it out.")
    folder = prepare_data(config)
    manifest = read_manifest(folder)
    print(
        f"prepared {manifest['train_examples']} training and {manifest['held_out_examples']} held-out examples "
        f"({config.packing}, {config.max_seq_length} tokens) in {folder}; train on them with "
        f"`scratchbert pretrain --prepared-data {folder} --output-dir ...`"
    )
    return 0
