"""`scratchbert answer`: the span of a context that answers a question, from a model `scratchbert finetune --task question-answering` saved."""

from __future__ import annotations

import argparse
import json

from scratchbert.errors import ScratchBertError
from scratchbert.ingestion import load_table
from scratchbert.training.finetuning.question_answering import answer_questions


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "answer",
        help="answer questions from their contexts with a fine-tuned question-answering model",
        description="Print, as one JSON line per question, the answer (text, start and end characters in its context, score: "
        "the start + end logit) that a model saved by `scratchbert finetune --task question-answering` gives, read as its "
        "run read the questions it scored (windows, n_best, max_answer_length, no-answer).",
    )
    parser.add_argument("--model", required=True, help="the folder `scratchbert finetune --task question-answering` saved")
    parser.add_argument("--question", help="one question (with --context)")
    parser.add_argument("--context", help="the text that holds its answer")
    parser.add_argument("--file", help="JSON lines (or a table file) with columns question and context, and optionally id, instead")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.question is None or args.context is None) or (args.file and (args.question or args.context)):
        raise ScratchBertError("give --question and --context, or --file with question and context columns.")
    if args.file is None:
        rows = {"question": [args.question], "context": [args.context]}
    else:
        table = load_table([args.file], "the questions")
        missing = [column for column in ("question", "context") if column not in table.column_names]
        if missing:
            raise ScratchBertError(f"{args.file} has no column {', '.join(map(repr, missing))} (its columns: {', '.join(table.column_names)}).")
        rows = {column: table[column] for column in table.column_names if column in ("id", "question", "context")}
    answers = answer_questions(args.model, rows["question"], rows["context"])
    for number, answer in enumerate(answers):
        print(json.dumps({"id": rows["id"][number]} | answer if "id" in rows else answer))
    return 0
