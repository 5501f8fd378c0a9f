"""`scratchbert finetune`: a text classifier, a word tagger or a question answerer from a BERT checkpoint, with `transformers.Trainer`."""

from __future__ import annotations

import argparse
import json
import logging

from scratchbert.training.run_setup import add_config_arguments, config_from_args
from scratchbert.training.finetuning.config import METRICS_BY_TASK, FinetuneConfig
from scratchbert.training.finetuning.run import finetune


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "finetune",
        help="fine-tune a BERT checkpoint: text classification, token classification or question answering",
        description="Fine-tune a scratchbert or transformers BERT checkpoint with transformers.Trainer as a text (or "
        "text-pair) classifier (accuracy, macro-F1; says so when the classifier gives nearly every example one class), "
        "a word tagger (--task token-classification: word accuracy, entity F1) or an extractive question answerer "
        "(--task question-answering: SQuAD's exact match and F1); evaluates each epoch and saves the best one.",
    )
    add_config_arguments(parser, FinetuneConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = config_from_args(args, FinetuneConfig)
    results = finetune(config)
    metrics = METRICS_BY_TASK[config.task]
    summary = {split: {k: results[split][k] for k in metrics if k in results[split]} for split in ("validation", "test") if split in results}
    if "collapsed" in results:
        summary["collapsed"] = results["collapsed"]  # None, or the one-class answer and what to try (also warned above)
    if results.get("label_warnings"):  # labels only validation or test rows have, or that differ only in case or spaces (also warned above)
        summary["label_warnings"] = results["label_warnings"]
    print(json.dumps(summary))
    return 0
