"""Part-of-speech tagging with all-MiniLM-L6-v2's weights in scratchbert's ScratchBertForTokenClassification and in
transformers' BertForTokenClassification: the same `scratchbert finetune --task token-classification` run (same
Trainer arguments and seed), test word accuracy and seconds per epoch of each, and the ratio (issue 85's targets:
accuracy within 0.5 points of transformers' and >= 0.93; time <= 0.7x).

The data is the Brown Corpus press sentences of the project's shared data (../shared/data/brown-pos: 114 tags,
train and test split by text). Seconds per epoch are Trainer's train runtime over the epochs (each epoch's
validation included, for both alike).

    python scripts/bench_token_classification.py --epochs 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from bench_finetune import minilm_dir  # scripts/bench_finetune.py
from labelled_sets import cpu_name  # scripts/labelled_sets.py
from transformers import BertForTokenClassification

from scratchbert import ScratchBertForTokenClassification
from scratchbert.training.finetuning.token_classification import finetune_token_classification_folder

MODEL_CLASSES = {"scratchbert": ScratchBertForTokenClassification, "transformers": BertForTokenClassification}
BROWN_POS = Path(__file__).resolve().parents[2] / "shared" / "data" / "brown-pos"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=BROWN_POS, help="folder of train.jsonl.gz and test.jsonl.gz (tokens, tags)")
    parser.add_argument("--train-samples", type=int, help="a seeded random subset of the training sentences (default: all)")
    parser.add_argument("--test-samples", type=int, help="a seeded random subset of the test sentences (default: all)")
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--models", nargs="+", choices=MODEL_CLASSES, default=list(MODEL_CLASSES))
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    results = {"cpu": cpu_name(), "threads": args.threads, "data": str(args.data), "arms": {}}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        for arm in args.models:
            run = finetune_token_classification_folder(
                minilm_dir(), folder / arm, model_class=MODEL_CLASSES[arm], train_files=[str(args.data / "train.jsonl.gz")],
                test_files=[str(args.data / "test.jsonl.gz")], text_column="tokens", label_column="tags", max_length=args.max_length,
                max_train_samples=args.train_samples, max_eval_samples=args.test_samples, epochs=args.epochs, batch_size=args.batch_size,
                learning_rate=args.learning_rate, seed=args.seed, progress_bar=False,
            )  # fmt: skip
            results["words_cut"] = run["words_cut"]
            results["arms"][arm] = {"accuracy": run["test"]["accuracy"], "seconds_per_epoch": run["train"]["runtime"] / args.epochs}
            print(json.dumps({arm: results["arms"][arm]}), flush=True)
    arms = results["arms"]
    if len(arms) == 2:
        results["accuracy_points_behind"] = 100 * (arms["transformers"]["accuracy"] - arms["scratchbert"]["accuracy"])
        results["time_ratio"] = arms["scratchbert"]["seconds_per_epoch"] / arms["transformers"]["seconds_per_epoch"]
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
