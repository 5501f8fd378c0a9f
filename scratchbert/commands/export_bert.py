"""`scratchbert export-bert`: a scratchbert checkpoint as a plain transformers BERT checkpoint."""

from __future__ import annotations

import argparse

from scratchbert.export import export_to_transformers_bert


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-bert",
        help="write a scratchbert checkpoint as a plain transformers BERT checkpoint",
        description="Copy a scratchbert checkpoint to OUT as model_type 'bert', loadable by transformers' Bert* classes; "
        "what is written is read back and checked.",
    )
    parser.add_argument("checkpoint", help="directory of a saved scratchbert model, or its Hugging Face Hub name")
    parser.add_argument("out", help="directory to write the transformers BERT checkpoint to")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(f"exported to {export_to_transformers_bert(args.checkpoint, args.out)}")
    return 0
