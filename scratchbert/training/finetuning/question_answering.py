"""Extractive question answering with `transformers.Trainer`: `finetune_question_answering(config)`, read
top to bottom, and `answer_questions`, which answers as the saved model's run scored it.

`scratchbert finetune CKPT --task question-answering` reads, one block each:

1. the checkpoint  `CheckpointInfo.read`, its fast tokenizer (the windows need its offsets), `max_length`;
2. the data        SQuAD v1.1/v2 JSON files or the `squad` dataset's flat columns (id, context, question,
                   answers {text, answer_start}) through `read_splits` (`question_rows`, `check_questions`,
                   `carve_splits`); v2 is recognised by questions without an answer; each split as windows
                   of `max_length` tokens sharing `doc_stride` (`spans.tokenize_windows`); the schedule;
3. the model       the checkpoint as `ScratchBertForQuestionAnswering` (or `model_class`);
4. the Trainer     `make_trainer` (steps.py); each epoch's validation is scored per question over its
                   windows (`span_scores`: `best_answers`, then SQuAD's EM and F1), and the best kept;
5. evaluation      validation and test: `trainer.predict` on the windows, then the same scoring;
6. saving          model (its config records the `SpanReading`), tokenizer, metrics.json.

Training reads each question's first answer; evaluation scores against all of them (the official script).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from accelerate import PartialState

from scratchbert.errors import ScratchBertError
from scratchbert.tokenization import check_vocabulary, load_tokenizer
from scratchbert.training.finetuning.config import METRICS_BY_TASK, FinetuneConfig
from scratchbert.training.finetuning.data import carve_splits, fitted_inputs, read_splits
from scratchbert.training.finetuning.metrics import unprefixed
from scratchbert.training.finetuning.spans import SpanReading, best_answers, check_stride, tokenize_windows
from scratchbert.training.finetuning.squad_metrics import squad_scores
from scratchbert.training.finetuning.steps import (
    CheckpointInfo,
    determinism_restored,
    fitted_schedule,
    make_trainer,
    refuse_text_classification_options,
    report_loaded_weights,
    run_outcome,
    save_run,
    training_arguments,
)
from scratchbert.training.run_setup import OutputDirLock, check_output_folder
from scratchbert.weights import check_weights, model_folder, quiet_loading

logger = logging.getLogger(__name__)

COLUMNS = ("id", "question", "context", "answers")  # the `squad` dataset's columns (and "title")


def finetune_question_answering(config: FinetuneConfig, model_class=None) -> dict[str, Any]:
    """Fine-tune as `config` says, in the module's six steps, into a `model_class` (default: scratchbert's QA head).

    Returns {"reading", "schedule", "windows", "train", "validation", "test" (with a test split), "best_checkpoint",
    "early_stopping", "log_history"}, EM and F1 on SQuAD's 0-100 scale; also written to metrics.json."""
    from transformers import set_seed  # on use: importing it takes a while

    refuse_text_classification_options(config, "windows of --max-length sharing --doc-stride", **{"--reinit-head": config.reinit_head})
    best_metric = config.best_metric or METRICS_BY_TASK[config.task][0]

    # 1. The checkpoint, read once; its fast tokenizer (the windows' offsets come from it); the window's length.
    output_dir = check_output_folder(config.output_dir, config.overwrite)
    checkpoint = CheckpointInfo.read(config.checkpoint)
    tokenizer = load_tokenizer(config.tokenizer if config.tokenizer is not None else checkpoint.folder, max_length=checkpoint.positions)
    check_vocabulary(checkpoint.vocab_size or len(tokenizer), tokenizer, config.tokenizer or checkpoint.name)
    max_length = fitted_inputs(config, checkpoint.positions)["max_length"]
    if not tokenizer.is_fast:
        raise ScratchBertError(f"question answering needs a fast tokenizer (its offsets map answers to pieces); {type(tokenizer).__name__} is not one.")

    # 2. The data: questions flat and checked in the files' order, validation held out, each split as windows.
    splits = read_splits(config.train_files, config.validation_files, config.test_files, config.dataset, config.dataset_config,
                         config.train_split, config.validation_split, config.test_split)  # fmt: skip
    splits = {name: question_rows(split, name) for name, split in splits.items()}
    check_questions(splits)
    splits = carve_splits(splits, "id", config.validation_fraction, config.max_train_samples, config.max_eval_samples, config.seed)  # ids: one each, so held out at random
    null_answers = any(not answers["text"] for split in splits.values() for answers in split["answers"])  # SQuAD v2
    reading = SpanReading(max_length, config.doc_stride, config.n_best, config.max_answer_length, null_answers)
    check_stride(tokenizer, [q for split in splits.values() for q in split["question"]], reading)
    windows = {name: split_windows(split, tokenizer, reading, name) for name, split in splits.items()}
    logger.info("%s questions: %s windows of %d tokens sharing %d; %s answers", ", ".join(f"{len(s)} {n}" for n, s in splits.items()),
                ", ".join(f"{len(w)} {n}" for n, w in windows.items()), max_length, config.doc_stride,
                "SQuAD v2: no-answer" if null_answers else "SQuAD v1.1: span")  # fmt: skip

    # The data is good: only now is the folder made, and held against a second run writing there too.
    with OutputDirLock(output_dir, "scratchbert finetune") as lock:
        lock.claim(PartialState(), writing=True)
        # 3. The model: the checkpoint's encoder under a question-answering head (new unless the checkpoint has one).
        set_seed(config.seed)
        model = load_span_model(checkpoint, model_class)

        with determinism_restored():  # what Trainer's full determinism switches, put back when the run ends
            # 4. The Trainer: evaluation and a checkpoint each epoch, scored per question; the best epoch reloaded at the end.
            schedule = fitted_schedule(config, checkpoint.hidden_size, len(windows["train"]))
            args = training_arguments(config, schedule, output_dir, best_metric)
            trainer = make_trainer(
                model, tokenizer, args, windows["train"].remove_columns(["example", "offset_mapping"]), windows["validation"],
                compute_metrics=partial(span_scores, windows=windows["validation"], questions=splits["validation"], reading=reading),
                early_stopping_patience=config.early_stopping_patience,
            )  # fmt: skip
            train_output = trainer.train()

            # 5. Evaluation: the kept epoch's validation as logged when it was evaluated; the test windows predicted and scored.
            results = {"reading": reading.__dict__, "schedule": schedule, "windows": {name: len(split) for name, split in windows.items()},
                       **run_outcome(trainer, train_output, config.keep_checkpoints)}  # fmt: skip
            if "test" in splits:
                trainer.compute_metrics = partial(span_scores, windows=windows["test"], questions=splits["test"], reading=reading)
                results["test"] = unprefixed(trainer.predict(windows["test"], metric_key_prefix="test").metrics, "test_")

            # 6. Saving: the config records how the model read a question and picked its answer (read back by `answer_questions`).
            reading.record(trainer.model.config)
            save_run(trainer, tokenizer, max_length, output_dir, results, config.keep_checkpoints)
    logger.info("saved the fine-tuned model and tokenizer to %s", output_dir)
    for split in ("validation", "test"):
        if split in results:
            logger.info("%s: exact match %.2f, F1 %.2f", split, results[split]["exact_match"], results[split]["f1"])
    return results


def finetune_question_answering_folder(checkpoint: str | Path, output_dir: str | Path, *, model_class=None, **options) -> dict[str, Any]:
    """`finetune_question_answering` with `FinetuneConfig`'s fields as keyword arguments (train_files=..., epochs=...)."""
    config = FinetuneConfig(checkpoint=str(checkpoint), output_dir=str(output_dir), task="question-answering", **options)
    return finetune_question_answering(config, model_class)


def question_rows(split, name: str):
    """A split as one row per question in the `squad` dataset's columns: SQuAD JSON files ({"version", "data": [{"title",
    "paragraphs": [{"context", "qas"}]}]}) are flattened, in their order; flat rows are kept as they are."""
    from datasets import Dataset

    if "data" not in split.column_names or "question" in split.column_names:
        return split
    rows = {column: [] for column in ("id", "title", "context", "question", "answers")}
    for file in split["data"]:
        for article in file or []:
            for paragraph in article.get("paragraphs") or []:
                for qa in paragraph.get("qas") or []:
                    answers = [] if qa.get("is_impossible") else qa.get("answers") or []
                    rows["id"].append(str(qa.get("id")))
                    rows["title"].append(article.get("title") or "")
                    rows["context"].append(paragraph.get("context"))
                    rows["question"].append(qa.get("question"))
                    rows["answers"].append({"text": [a["text"] for a in answers], "answer_start": [a["answer_start"] for a in answers]})
    if not rows["id"]:
        raise ScratchBertError(f"the {name} data is a SQuAD file without questions: its data holds no paragraphs with qas.")
    return Dataset.from_dict(rows)


def check_questions(splits: dict) -> None:
    """Fail in one line, naming the question and the fix, on a missing column, an empty question or context,
    or an answer whose answer_start does not point at its text in the context."""
    for name, split in splits.items():
        missing = [column for column in COLUMNS if column not in split.column_names]
        if missing:
            raise ScratchBertError(
                f"the {name} data has no column {', '.join(map(repr, missing))} (its columns: {', '.join(split.column_names)}); question "
                "answering reads SQuAD JSON files or rows with id, question, context and answers {text: [...], answer_start: [...]}."
            )
        for row, (qid, question, context, answers) in enumerate(zip(*(split[c] for c in COLUMNS)), start=1):
            where = f"question {qid!r} (row {row} of the {name} data)"
            for column, text in (("question", question), ("context", context)):
                if not isinstance(text, str) or not text.strip():
                    raise ScratchBertError(f"{where} has no {column}: fill it in or drop the question.")
            if not isinstance(answers, dict) or len(answers.get("text") or []) != len(answers.get("answer_start") or []):
                raise ScratchBertError(f"{where}: answers must be {{text: [...], answer_start: [...]}} of equal length, got {answers!r}.")
            for text, start in zip(answers["text"], answers["answer_start"]):
                if context[start : start + len(text)] != text:
                    found = context.find(text)
                    fix = f"it is at character {found}: set answer_start to {found}" if found >= 0 else "the context does not contain it: fix the answer's text"
                    raise ScratchBertError(f"{where}: answer {text!r} is not at answer_start {start} of its context ({fix}).")


def split_windows(split, tokenizer, reading: SpanReading, name: str):
    """A split's questions as the windows the model reads (`tokenize_windows`), labelled with the first answer."""
    return split.map(partial(tokenize_windows, tokenizer=tokenizer, reading=reading), batched=True, with_indices=True,
                     remove_columns=split.column_names, desc=f"windows of {name}")  # fmt: skip


def load_span_model(checkpoint: CheckpointInfo, model_class=None):
    """The checkpoint as a question answerer: its encoder, and its QA head where it has one (else a new one)."""
    if model_class is None:
        from scratchbert import ScratchBertForQuestionAnswering as model_class
    with quiet_loading():  # `report_loaded_weights` says what transformers' table would, in words
        model, loading = model_class.from_pretrained(str(checkpoint.folder), output_loading_info=True)
    report_loaded_weights(checkpoint.name, loading)
    return model


def span_scores(eval_prediction, windows, questions, reading: SpanReading) -> dict[str, float]:
    """`compute_metrics` that scores questions, not windows: each question's answer over its windows
    (`best_answers`), then SQuAD's exact match and F1 against all its gold answers (0-100). Trainer is given
    `partial(span_scores, windows=..., questions=..., reading=...)` for the split it predicts."""
    start_logits, end_logits = eval_prediction.predictions[:2]  # (N, T) each
    answers = best_answers(start_logits, end_logits, windows, questions["context"], reading)
    return squad_scores([answer["text"] for answer in answers], [gold["text"] for gold in questions["answers"]])


def answer_questions(model, questions: Sequence[str], contexts: Sequence[str], tokenizer=None, batch_size: int = 64) -> list[dict]:
    """The answer to each question in its context, {"text", "start", "end" (characters, end exclusive), "score"},
    read as the model's fine-tuning run read them (its config's `SpanReading`): the answers whose scores it reported.

    `model`: a folder saved by `scratchbert finetune --task question-answering` (or its model, with `tokenizer`).
    transformers 5.24 removed the question-answering pipeline; this takes its place for these models.
    """
    import torch
    from datasets import Dataset
    from transformers import DataCollatorWithPadding

    if isinstance(model, (str, Path)):
        from transformers import AutoModelForQuestionAnswering

        check_weights(model_folder(model))  # a missing, truncated or corrupt folder fails here, in one line
        tokenizer = tokenizer or load_tokenizer(model)
        with quiet_loading():
            model = AutoModelForQuestionAnswering.from_pretrained(str(model))
    if len(questions) != len(contexts) or not questions:
        raise ScratchBertError(f"give one context per question, and at least one: got {len(questions)} questions and {len(contexts)} contexts.")
    reading = SpanReading.saved(model.config)
    check_stride(tokenizer, questions, reading)
    split = Dataset.from_dict({"question": list(questions), "context": list(contexts), "answers": [{"text": [], "answer_start": []}] * len(questions)})
    windows = split_windows(split, tokenizer, reading, "the questions")
    collate = DataCollatorWithPadding(tokenizer)
    inputs = windows.remove_columns(["example", "offset_mapping", "start_positions", "end_positions"])
    model.eval()
    starts, ends = np.full((len(windows), reading.max_length), -np.inf), np.full((len(windows), reading.max_length), -np.inf)  # (N, T)
    with torch.no_grad():
        for first in range(0, len(windows), batch_size):
            batch = collate([inputs[i] for i in range(first, min(first + batch_size, len(windows)))])  # (B, T') each
            output = model(**batch)
            rows, length = output.start_logits.shape
            starts[first : first + rows, :length] = output.start_logits.float().numpy()
            ends[first : first + rows, :length] = output.end_logits.float().numpy()
    return best_answers(starts, ends, windows, split["context"], reading)
