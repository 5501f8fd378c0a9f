"""`scratchbert finetune`: a text classifier from a BERT checkpoint, with `transformers.Trainer`."""

from __future__ import annotations

import argparse
import json
import logging

from scratchbert.training.config_file import add_config_arguments, config_from_args
from scratchbert.training.finetuning.config import FinetuneConfig
from scratchbert.training.finetuning.run import finetune


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "finetune",
        help="fine-tune a BERT checkpoint as a text classifier",
        description="Fine-tune a scratchbert or transformers BERT checkpoint as a text (or text-pair) classifier "
        "with transformers.Trainer; evaluates accuracy and macro-F1 each epoch, saves the best epoch, and says so "
        "when the classifier gives (nearly) every example one class.",
    )
    add_config_arguments(parser, FinetuneConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = finetune(config_from_args(args, FinetuneConfig))
    summary = {split: {k: results[split][k] for k in ("accuracy", "macro_f1")} for split in ("validation", "test") if split in results}
    summary["collapsed"] = results["collapsed"]  # None, or the one-class answer and what to try (also warned above)
    if results["label_warnings"]:  # labels only validation or test rows have, or that differ only in case or spaces (also warned above)
        summary["label_warnings"] = results["label_warnings"]
    print(json.dumps(summary))
    return 0
