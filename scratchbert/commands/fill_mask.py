"""`scratchbert fill-mask`: what a checkpoint's MLM head predicts at each [MASK]."""

from __future__ import annotations

import argparse

from scratchbert.inspection import DEFAULT_TOP_K, fill_mask, load_masked_lm
from scratchbert.tokenization import MASK_TOKEN


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "fill-mask",
        help="predict the tokens hidden behind [MASK] with a pretrained checkpoint",
        description="Print the most probable tokens, with their probabilities, at every [MASK] in TEXT.",
    )
    parser.add_argument("text", help='text containing [MASK], e.g. "the capital of france is [MASK]."')
    parser.add_argument("--model", required=True, help="checkpoint folder with an MLM head (config.json, weights, tokenizer) or Hugging Face Hub name")
    parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help=f"predictions per [MASK] (default {DEFAULT_TOP_K})")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model, tokenizer = load_masked_lm(args.model)
    predictions = fill_mask(model, tokenizer, args.text, args.top_k)
    for number, ranked in enumerate(predictions, start=1):
        print(f"{MASK_TOKEN} {number} of {len(predictions)}:")
        width = max(len(token) for token, _ in ranked)
        for rank, (token, probability) in enumerate(ranked, start=1):
            print(f"  {rank:>2}. {token:<{width}}  {probability:.4f}")
    return 0
