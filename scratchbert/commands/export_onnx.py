"""`scratchbert export-onnx`: a saved model as an ONNX graph that onnxruntime runs for any batch shape."""

from __future__ import annotations

import argparse

from scratchbert.onnx_export import TASKS, export_onnx


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-onnx",
        help="export a saved model to ONNX (dynamic batch and sequence axes), checked against PyTorch in onnxruntime",
        description="Export MODEL_DIR to OUT/model.onnx with its tokenizer beside it; the graph takes any batch "
        "shape, and when onnxruntime is installed its outputs are compared with PyTorch's before the command succeeds.",
    )
    parser.add_argument("model_dir", help="folder of a saved model (config.json, weights, tokenizer) or its Hugging Face Hub name")
    parser.add_argument("out", help="folder to write model.onnx and the tokenizer to")
    parser.add_argument("--task", choices=list(TASKS), default="feature-extraction", help="which outputs the graph has (default: feature-extraction)")
    parser.add_argument("--int8", action="store_true", help="the encoder's Linears in int8, as scratchbert.quantize_dynamic computes them "
                        "(int8 weights per channel, activations per token); checked against it in onnxruntime (docs/deployment.md)")
    parser.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo", help="torch.export (default) or the TorchScript tracer")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = export_onnx(args.model_dir, args.out, task=args.task, dynamo=args.exporter == "dynamo", int8=args.int8)
    print(f"exported the {'int8 ' if args.int8 else ''}{args.task} graph: {result}")
    return 0
