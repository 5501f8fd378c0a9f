"""Question answering with all-MiniLM-L6-v2's weights in scratchbert's ScratchBertForQuestionAnswering and in
transformers' BertForQuestionAnswering: the same `scratchbert finetune --task question-answering` run (same
Trainer arguments and seed), EM/F1 and seconds per epoch of each, and the ratio (issue 85's target: <= 0.7).

The questions are asked of the Python documentation CPython carries, answers real spans of it
(`scratchbert.training.finetuning.text_questions`); the test questions come from other documents than the
training questions (every fifth document); questions of over 40 words are left out. Seconds per epoch are
Trainer's train_runtime over the epochs (each epoch's validation included, for both alike).

    python scripts/bench_qa.py --epochs 1                                   # run_qa.py's windows: 384 tokens, stride 128
    python scripts/bench_qa.py --epochs 1 --max-length 192 --doc-stride 64  # short windows, most of them full
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from bench_finetune import minilm_dir  # scripts/bench_finetune.py
from labelled_sets import cpu_name  # scripts/labelled_sets.py
from transformers import BertForQuestionAnswering

from scratchbert import ScratchBertForQuestionAnswering
from scratchbert.training.finetuning.question_answering import finetune_question_answering_folder
from scratchbert.training.finetuning.text_questions import questions_from_text, squad_json

MODEL_CLASSES = {"scratchbert": ScratchBertForQuestionAnswering, "transformers": BertForQuestionAnswering}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=float, default=1)
    parser.add_argument("--max-length", type=int, default=384)  # run_qa.py's max_seq_length and doc_stride
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [row for row in questions_from_text() if len(row["question"].split()) <= 40]  # windows keep room for the context
    train = [row for row in rows if int(row["title"]) % 5]
    test = [row for row in rows if int(row["title"]) % 5 == 0]
    results = {"cpu": cpu_name(), "threads": args.threads, "questions": {"train": len(train), "test": len(test)}, "arms": {}}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "train.json").write_text(json.dumps(squad_json(train)))
        (folder / "test.json").write_text(json.dumps(squad_json(test)))
        for arm, model_class in MODEL_CLASSES.items():
            run = finetune_question_answering_folder(
                minilm_dir(), folder / arm, model_class=model_class, train_files=[str(folder / "train.json")],
                test_files=[str(folder / "test.json")], max_length=args.max_length, doc_stride=args.doc_stride,
                epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate, seed=args.seed, progress_bar=False,
            )  # fmt: skip
            results["windows"] = run["windows"]
            results["arms"][arm] = {"exact_match": run["test"]["exact_match"], "f1": run["test"]["f1"],
                                    "seconds_per_epoch": run["train"]["runtime"] / args.epochs}  # fmt: skip
            print(json.dumps({arm: results["arms"][arm]}), flush=True)
    arms = results["arms"]
    results["time_ratio"] = arms["scratchbert"]["seconds_per_epoch"] / arms["transformers"]["seconds_per_epoch"]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
