"""`scratchbert attention-map`: one layer's attention heads, drawn as heatmaps."""

from __future__ import annotations

import argparse

from scratchbert.inspection import attention_weights, load_encoder, plot_attention, save_figure


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "attention-map",
        help="draw every attention head of one layer as heatmaps",
        description="Run TEXT through the checkpoint and draw each head's attention weights, tokens on both axes.",
    )
    parser.add_argument("text", help="text to run through the model")
    parser.add_argument("--model", required=True, help="checkpoint folder (config.json, weights, tokenizer) or Hugging Face Hub name")
    parser.add_argument("--layer", type=int, default=-1, help="layer to draw, from 0; negative counts from the end (default -1, the last)")
    parser.add_argument("--out", required=True, help="image file to write, e.g. attention.png")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model, tokenizer = load_encoder(args.model)
    tokens, weights = attention_weights(model, tokenizer, args.text, args.layer)
    layers = model.config.num_hidden_layers
    layer = args.layer % layers
    out = save_figure(plot_attention(tokens, weights, title=f"{args.model}: layer {layer} of 0-{layers - 1}"), args.out)
    print(f"wrote {out}: layer {layer}, {weights.size(0)} heads, {len(tokens)} tokens")
    return 0
