"""Fine-tuning BERT checkpoints with `transformers.Trainer`.

`scratchbert finetune` turns any scratchbert or transformers BERT checkpoint (with its
tokenizer) into a text classifier, in five steps that each have a function here:

1. `read_splits`,           read train / validation / test from local CSV, JSON or JSONL
   `carve_splits`           files, or from a `datasets` name; hold out validation rows.
2. `check_columns`,         validate the columns and cells and turn string or integer labels
   `label_names_of`,        into ids `0..K-1`, whose names go into the config as `id2label`;
   `encode_labels`,         warn of labels only validation or test rows have, or that differ
   `label_warnings`         only in case or spaces.
3. `load_sequence_classifier`  load the checkpoint into `ScratchBertForSequenceClassification`
                            (scratchbert keeps BERT's state-dict names, so transformers BERT
                            checkpoints load too), checking the size of an existing head;
                            its pooling ([CLS] or the mean of the tokens) from
                            `classifier_pooling_of`.
4. `make_trainer`           a `Trainer` with `processing_class=tokenizer` and dynamic padding,
                            correct under gradient accumulation (see there).
5. `finetune(FinetuneConfig)`  fit the learning rate and epochs not given to the model and
                            the data (`fitted_schedule`), train with evaluation each epoch
                            (stopping early when asked), keep the best epoch (or, for a soup, the
                            mean of several runs' best epochs: `WeightAverage`), say so when it gives (nearly) every example
                            one class (`report_collapse`), save model + tokenizer + metrics.
                            (`finetune_text_classification(checkpoint, out, **options)` is the
                            same with the options as keyword arguments; `scratchbert finetune`
                            builds the `FinetuneConfig` from its flags and a --config file.)

The metric helpers for token classification and question answering
(`token_classification_metrics`, `span_metrics`) work with the same `make_trainer`.

Shapes: N = examples, T = tokens per example (padded), K = number of labels.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from accelerate import PartialState
from transformers import EarlyStoppingCallback, EvalPrediction, TrainerCallback

from scratchbert.configuration_scratchbert import CLASSIFIER_POOLINGS
from scratchbert.errors import ScratchBertError
from scratchbert.ingestion import load_named_dataset, load_table
from scratchbert.modeling_scratchbert import IGNORE_INDEX, ScratchBertPreTrainedModel
from scratchbert.tokenization import load_tokenizer
from scratchbert.training.config_file import ConfigFile
from scratchbert.training.folder_lock import OutputDirLock
from scratchbert.weights import check_weights, model_folder, quiet_loading, read_model_config, tensor_shape

logger = logging.getLogger(__name__)

METRICS = ("accuracy", "macro_f1")  # what each evaluation reports; either can pick the best epoch
TIES = ("latest", "earliest")  # which of several epochs with the same best score is kept (`LatestOfEqualEpochs`)
WINDOW_LOSSES = ("window", "text")  # what a training label is scored against: each window's logits, or the mean of its text's windows' logits
LABEL_KINDS = {  # Arrow dtype of a label column -> how its values become label names
    **dict.fromkeys(("string", "large_string"), "string"),
    **dict.fromkeys(("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"), "integer"),
    "bool": "integer",  # False/True are the integers 0/1
}
DEFAULT_MAX_LENGTH = 256  # tokens per example unless asked otherwise (or the model has fewer positions); measured: DOCS
DEFAULT_WINDOWS = 4  # windows of DEFAULT_MAX_LENGTH per single text unless asked otherwise; measured: DOCS
# The `FinetuneConfig` fields that choose the data (`read_splits`) and cut it (`carve_splits`).
READ_OPTIONS = (
    "train_files", "validation_files", "test_files", "dataset_name", "dataset_config", "train_split", "validation_split", "test_split",
)  # fmt: skip
CARVE_OPTIONS = ("label_column", "validation_fraction", "max_train_samples", "max_eval_samples", "seed")
HEAD_KEY = "classifier.weight"  # (K, H) weight of BERT's classification head, in every BERT checkpoint
DOCS = "docs/finetuning.md"  # what was measured, and why the defaults are what they are

# Defaults fitted to the model and the data, used where no flag or file sets the option (DOCS).
# A narrow encoder needs larger steps than BERT-base's 5e-5 (Google fine-tuned its BERT
# miniatures at up to 3e-4, Turc et al. 2019; `tiny` measured best at 1e-3): the peak
# learning rate by hidden size H, as (largest H, rate).
LEARNING_RATES_BY_WIDTH = ((128, 1e-3), (256, 3e-4), (512, 1e-4), (math.inf, 5e-5))
DEFAULT_EPOCHS = 3  # BERT's; with few labels, epochs are added until there are `min_steps` optimizer steps
DEFAULT_MIN_STEPS = 300
# What a new classification head reads when --pooling is not given, by hidden size H, as (largest
# H, pooling): the mean of the real tokens measured above BERT's pooler on [CLS] for `tiny`
# (the [CLS] head collapsed where the mean did not); wider encoders keep BERT's [CLS]. A
# checkpoint's trained head keeps the pooling it was trained with.
POOLING_BY_WIDTH = ((128, "mean"), (math.inf, "cls"))
POOLING_WORDS = {"cls": "BERT's pooled [CLS] vector", "mean": "the mean of the real tokens", "max": "each feature's largest value over the real tokens"}
# Fine-tuning runs averaged into the kept model when --soup is not given (`WeightAverage`), by hidden
# size H, as (largest H, runs): five for `tiny`, better than one run on IMDB (+0.9 over six seeds, five
# better) and BBC News (+0.45 over six seeds, four better, one level) (DOCS); one above: an L2/H256 soup
# gained on both sets (+1.2 on IMDB; +0.3 on BBC News, its runs sharing one head), every seed of three, but costs five times a run
# that already takes twice tiny's, and one model of that width is not every width above 128.
SOUP_BY_WIDTH = ((128, 5), (math.inf, 1))
# Evaluations without a better `best_metric` before training stops; None: every epoch runs
# (patience 2 saved a third to a half of the steps at accuracy within the noise: time only, DOCS).
DEFAULT_EARLY_STOPPING_PATIENCE = None
# A classifier that gives this share (or more) of the examples one class, where the labels are
# more spread than that, has learned the class balance instead of the task: it is reported.
COLLAPSE_SHARE = 0.95
COLLAPSE_ADVICE = (
    "the classifier learned the class balance, not the task. Try a higher --learning-rate (narrow models take "
    "1e-4 to 1e-3), more optimizer steps (--epochs, or --min-steps without --epochs), --pooling mean (the [CLS] "
    "pooler collapsed more often), no --early-stopping-patience, and check that the labels belong to the texts "
    "(--text-column, --label-column)."
)


# ---------------------------------------------------------------------------
# 1. Data: local files or a `datasets` name -> {"train", "validation", ("test")}
# ---------------------------------------------------------------------------


def read_splits(
    train_files: Sequence[str | Path] | None = None,
    validation_files: Sequence[str | Path] | None = None,
    test_files: Sequence[str | Path] | None = None,
    dataset_name: str | None = None,
    dataset_config: str | None = None,
    train_split: str | None = None,
    validation_split: str | None = None,
    test_split: str | None = None,
):
    """Read the data splits for fine-tuning, rows in the order of their files.

    Give either local `train_files` (CSV/TSV/JSON/JSONL/Parquet, optionally compressed; globs
    are expanded) with optional
    `validation_files`/`test_files`, or a `dataset_name` for `datasets.load_dataset` with
    split names (`train_split` defaults to "train", `validation_split` to "validation" when
    the dataset has one). `carve_splits` then holds out validation rows and takes subsets.

    Returns:
        {"train": Dataset, and "validation" and "test" when given}
    """
    import datasets

    if (train_files is None) == (dataset_name is None):
        raise ScratchBertError("give either local train files (--train-file) or a datasets name (--dataset), not both or neither.")
    if train_files is not None and any(x is not None for x in (dataset_config, train_split, validation_split, test_split)):
        raise ScratchBertError(
            "--dataset-config and split names (--train-split, ...) go with --dataset; with local files give --validation-file/--test-file."
        )
    if dataset_name is not None and (validation_files or test_files):
        raise ScratchBertError("--validation-file/--test-file go with --train-file; with --dataset choose --validation-split/--test-split.")
    if train_files is not None:
        splits = {"train": load_table(train_files, "the train data")}
        for name, files in (("validation", validation_files), ("test", test_files)):
            if files:
                splits[name] = load_table(files, f"the {name} data")
    else:
        loaded = load_named_dataset(dataset_name, dataset_config)
        # without an explicit choice, a split named "validation" is used when the dataset has one
        if validation_split is None and "validation" in loaded:
            validation_split = "validation"
        splits = {}
        for name, split in (("train", train_split or "train"), ("validation", validation_split), ("test", test_split)):
            if split is None:
                continue
            if split not in loaded:
                raise ScratchBertError(f"dataset {dataset_name!r} has no split {split!r} (it has: {', '.join(loaded)}).")
            splits[name] = loaded[split]

    if len(splits["train"]) == 0:
        raise ScratchBertError("the training data is empty: there are no rows to fine-tune on.")
    return splits


def carve_splits(
    splits: dict,
    label_column: str = "label",
    validation_fraction: float = 0.1,
    max_train_samples: int | None = None,
    max_eval_samples: int | None = None,
    seed: int = 42,
):
    """Hold out `validation_fraction` of train when there is no validation split, the same share
    of every label (`hold_out_by_label`), and take the `max_*_samples` seeded random subsets
    (files are often sorted by label).

    Returns:
        `datasets.DatasetDict` with "train", "validation" and, when given, "test".
    """
    import datasets

    splits = dict(splits)
    if "validation" not in splits:
        if not 0 < validation_fraction < 1:
            raise ScratchBertError(f"validation_fraction must be between 0 and 1, got {validation_fraction}.")
        if len(splits["train"]) < 2:
            raise ScratchBertError("the training data has one row: give a separate validation file (--validation-file).")
        train_rows, validation_rows = hold_out_by_label(splits["train"][label_column], validation_fraction, seed)
        splits["train"], splits["validation"] = splits["train"].select(train_rows), splits["train"].select(validation_rows)
        logger.info("held out %d of the training rows for validation, the same share of each label", len(validation_rows))
    for name, split in splits.items():
        if len(split) == 0:
            raise ScratchBertError(f"the {name} data is empty: it has no rows to evaluate on.")
        limit = max_train_samples if name == "train" else max_eval_samples
        if limit is not None and limit < len(split):
            splits[name] = split.shuffle(seed=seed).select(range(limit))
    return datasets.DatasetDict(splits)


def hold_out_by_label(labels: Sequence, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deal the rows into train and validation so that each label keeps its share in both.

    A random hold-out of a few hundred rows can take every row of a rare label (which the
    classifier then never sees) or none (which the epoch choice then never scores). Here each
    label gives `fraction` of its rows, rounded so that the total is `datasets`'
    `ceil(fraction * rows)` (the labels with the largest remainders give one more), and keeps at
    least one row for training. Only when no label has two rows are rows held out at random.

    Returns:
        (train row indices, validation row indices), each in a seeded random order.
    """
    rng = np.random.default_rng(seed)
    rows_of = {}  # label -> its row indices, shuffled
    for row, label in enumerate(labels):
        rows_of.setdefault(repr(label), []).append(row)  # repr: a key even for a list, which `label_names_of` then refuses
    rows_of = {label: rng.permutation(rows).tolist() for label, rows in rows_of.items()}
    total = math.ceil(fraction * len(labels))

    # Each label's share, floored and capped to leave one training row; then the largest remainders.
    shares = {label: fraction * len(rows) for label, rows in rows_of.items()}
    taken = {label: min(math.floor(share), len(rows_of[label]) - 1) for label, share in shares.items()}
    for label in sorted(rows_of, key=lambda label: shares[label] - math.floor(shares[label]), reverse=True):
        if sum(taken.values()) >= total:
            break
        if taken[label] < len(rows_of[label]) - 1:
            taken[label] += 1
    if sum(taken.values()) == 0:  # every label has a single row: nothing to stratify
        order = rng.permutation(len(labels)).tolist()
        return order[total:], order[:total]

    validation = [row for label, rows in rows_of.items() for row in rows[: taken[label]]]
    train = [row for label, rows in rows_of.items() for row in rows[taken[label] :]]
    return rng.permutation(train).tolist(), rng.permutation(validation).tolist()


# ---------------------------------------------------------------------------
# 2. Columns and labels
# ---------------------------------------------------------------------------


def check_columns(splits, text_column: str, text_pair_column: str | None, label_column: str) -> None:
    """Fail early, naming the fix, when a column is missing or a cell has no text or no label.

    Run it on `read_splits`' rows, before `carve_splits` shuffles them, so that "row 41 of the
    train data" is the 41st row of its files.
    """
    from datasets import ClassLabel

    for name, split in splits.items():
        columns = split.column_names
        wanted = [(text_column, "--text-column"), (label_column, "--label-column")]
        if text_pair_column is not None:
            wanted.append((text_pair_column, "--text-pair-column"))
        for column, flag in wanted:
            if column not in columns:
                raise ScratchBertError(
                    f"the {name} data has no column {column!r} (its columns: {', '.join(columns)}); "
                    f"name the right one with {flag}."
                )
        for column in (text_column, text_pair_column):
            if column is None:
                continue
            for row, text in enumerate(split[column], start=1):
                if text is None or (isinstance(text, str) and not text.strip()):
                    raise ScratchBertError(f"{_row(row, name)} has no text in column {column!r}: fill it in or drop the row.")
                if not isinstance(text, str):
                    raise ScratchBertError(f"{_row(row, name)}: column {column!r} holds {text!r}, not a text string.")
        label = split.features[label_column]
        for row, value in enumerate(split[label_column], start=1):
            # `datasets` writes -1 in a ClassLabel column for "no label"
            if value is None or (isinstance(label, ClassLabel) and not 0 <= value < label.num_classes):
                raise ScratchBertError(f"{_row(row, name)} has no label in column {label_column!r} (found {value!r}).")


def _row(row: int, split: str) -> str:
    """Where a bad cell is, as a user finds it in the files."""
    return f"row {row} of the {split} data (the first row is 1)"


def label_names_of(splits, label_column: str) -> list[str]:
    """Label names in id order, from the label column of every split.

    A `datasets.ClassLabel` column keeps its own names. String labels are sorted; integer
    labels are sorted by value and named by their value ("0", "1", ...), so labels that
    already are `0..K-1` keep their ids. Every row has a label (`check_columns`).
    """
    from datasets import ClassLabel, Value

    feature = splits["train"].features[label_column]
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    kinds = set()
    for name, split in splits.items():
        feature = split.features[label_column]
        kind = LABEL_KINDS.get(feature.dtype) if isinstance(feature, Value) else None
        if kind is None:
            types = {type(value) for value in split[label_column] if value is not None}
            if types == {str, int}:  # `datasets` reads such a JSON column as untyped "Json"
                raise ScratchBertError(f"column {label_column!r} of the {name} data mixes strings and integers; use one kind of label.")
            example = next((value for value in split[label_column] if value is not None), None)
            raise ScratchBertError(
                f"labels must be strings or integers, but column {label_column!r} of the {name} data holds "
                f"{getattr(feature, 'dtype', type(feature).__name__)} values (e.g. {example!r}). "
                "Map them to class names or integer ids first (regression is not supported)."
            )
        kinds.add(kind)
    if len(kinds) > 1:
        raise ScratchBertError(f"column {label_column!r} holds strings in one split and integers in another; use one kind.")
    values = {value for split in splits.values() for value in split[label_column]}
    if kinds == {"integer"}:
        return [str(int(value)) for value in sorted(values)]
    return sorted(values)


def encode_labels(splits, label_column: str, label_names: Sequence[str]):
    """Add a "labels" column of ids `0..K-1` (what the model's loss takes)."""
    from datasets import ClassLabel

    label2id = {name: i for i, name in enumerate(label_names)}
    feature = splits["train"].features[label_column]

    def name_of(value) -> str:
        if isinstance(feature, ClassLabel):
            return feature.int2str(value)
        return str(int(value)) if isinstance(value, (bool, int)) else value

    def to_ids(batch):
        return {"labels": [label2id[name_of(value)] for value in batch[label_column]]}

    return splits.map(to_ids, batched=True, desc="encoding labels")


def label_warnings(splits, label_names: Sequence[str]) -> dict | None:
    """What about the encoded labels is likely a mistake, though training can go on; each is logged.

    - "not_in_train": {split: {label: rows}}: labels of the validation or test rows that no
      training row has. They keep a class of their own, as transformers' `run_classification`
      does, but the classifier cannot learn it, so those rows count as errors.
    - "look_alike": groups of labels that differ only in case or spaces ("pos", "Pos ").

    Returns None when there is nothing to say.
    """
    warnings = {}
    trained = set(splits["train"]["labels"])
    for name, split in splits.items():
        unseen = Counter(label_names[i] for i in split["labels"] if i not in trained)
        if name == "train" or not unseen:
            continue
        warnings.setdefault("not_in_train", {})[name] = dict(sorted(unseen.items()))
        logger.warning(
            "the %s data has labels no training row has (%s): the classifier cannot learn them, so those rows count as "
            "errors. Add training rows with them, or fix or drop those rows.", name,
            ", ".join(f"{label!r} in {rows} row{'s' * (rows > 1)}" for label, rows in sorted(unseen.items())),
        )  # fmt: skip
    alike = {}
    for label in label_names:
        alike.setdefault(" ".join(label.split()).casefold(), []).append(label)
    groups = [group for group in alike.values() if len(group) > 1]
    if groups:
        warnings["look_alike"] = groups
        logger.warning(
            "labels that differ only in case or spaces are different classes: %s. If each group is one class, make them equal in the data.",
            "; ".join(" / ".join(repr(label) for label in group) for group in groups),
        )
    return warnings or None


TRUNCATIONS = ("head", "head+tail")


def head_and_tail(token_ids: Sequence[int], budget: int, head_fraction: float = 0.25) -> list[int]:
    """The first and the last tokens of a text that has more than `budget` of them.

    Long reviews and articles often say what they mean at the end; keeping the first
    quarter of the budget from the start and the rest from the end beats keeping the start
    only (Sun et al. 2019, "How to Fine-Tune BERT for Text Classification": head 128 + tail
    382 was their best cut of IMDB reviews to 512 tokens).
    """
    if len(token_ids) <= budget:
        return list(token_ids)
    head = int(budget * head_fraction)
    return list(token_ids[:head]) + list(token_ids[len(token_ids) - (budget - head) :])


def windows_of(token_ids: Sequence[int], window: int, windows: int = 1, truncation: str = "head+tail") -> list[list[int]]:
    """A text's tokens as up to `windows` pieces of at most `window` tokens, of (nearly) equal length.

    A text longer than `windows * window` tokens is first cut to that many: its start ("head"),
    or its start and its end (`head_and_tail`). What is kept is then split evenly, so a text of
    1.2 windows gives two pieces of 0.6 rather than a full one and a scrap.
    """
    budget = windows * window
    kept = head_and_tail(token_ids, budget) if truncation == "head+tail" else list(token_ids[:budget])
    count = max(1, math.ceil(len(kept) / window))
    bounds = [-(-i * len(kept) // count) for i in range(count + 1)]  # ceil: the first pieces take the remainder
    return [kept[start:end] for start, end in zip(bounds, bounds[1:])]


def check_max_length(max_length: int, positions: int) -> None:
    """Fail, naming the limits, when `max_length` tokens do not fit the model's `positions` or leave no room for text."""
    if not 2 <= max_length <= positions:
        raise ScratchBertError(f"max_length must be between 2 (room for [CLS] and [SEP]) and the model's {positions} positions, got {max_length}.")


def window_examples(texts: Sequence[str], tokenizer, max_length: int, truncation: str, windows: int) -> tuple[list[list[int]], list[int]]:
    """The `[CLS] window [SEP]` token ids of each text's windows (`windows_of`, `max_length` tokens
    with the two specials), and for each the position of its text in `texts`."""
    pieces = tokenizer(list(texts), add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    input_ids, positions = [], []
    for position, ids in enumerate(pieces):
        for piece in windows_of(ids, max_length - 2, windows, truncation):
            input_ids.append([tokenizer.cls_token_id, *piece, tokenizer.sep_token_id])
            positions.append(position)
    return input_ids, positions


def tokenize_splits(
    splits, tokenizer, text_column: str, text_pair_column: str | None, max_length: int, truncation: str = "head", windows: int = 1
):
    """Tokenize to `input_ids`/`token_type_ids`/`attention_mask` (unpadded: the collator pads per batch).

    `truncation`: "head" keeps the first `max_length` tokens (with [CLS] and [SEP]);
    "head+tail" keeps the start and the end of a long single text (`head_and_tail`).
    `windows` > 1 reads a long single text as up to that many examples of `max_length`
    tokens (`windows_of`), each with the text's label. Every row carries `document`, the
    index of its text in the split, so that a text's windows can be scored together
    (`document_predictions`).
    """
    if truncation not in TRUNCATIONS:
        raise ScratchBertError(f"truncation={truncation!r}: choose one of {', '.join(TRUNCATIONS)}.")
    if text_pair_column is not None and (truncation == "head+tail" or windows > 1):
        raise ScratchBertError("head+tail truncation and windows cut single texts; with a text pair use truncation='head' and windows=1.")

    def tokenize(batch, indices):
        if text_pair_column is not None or (truncation == "head" and windows == 1):
            pair = batch[text_pair_column] if text_pair_column is not None else None
            return {**tokenizer(batch[text_column], pair, truncation=True, max_length=max_length), "labels": batch["labels"], "document": indices}
        input_ids, positions = window_examples(batch[text_column], tokenizer, max_length, truncation, windows)
        return {
            "input_ids": input_ids,
            "token_type_ids": [[0] * len(ids) for ids in input_ids],
            "attention_mask": [[1] * len(ids) for ids in input_ids],
            "labels": [batch["labels"][i] for i in positions],
            "document": [indices[i] for i in positions],
        }

    tokenized = {}
    for name, split in splits.items():
        tokenized[name] = split.map(tokenize, batched=True, with_indices=True, remove_columns=split.column_names, desc=f"tokenizing {name}")
    return type(splits)(tokenized)


# ---------------------------------------------------------------------------
# 3. Model: checkpoint -> sequence classifier
# ---------------------------------------------------------------------------


def checkpoint_head_size(checkpoint: str | Path, key: str = HEAD_KEY) -> int | None:
    """Rows of the checkpoint's head weight `key` (its number of labels), or None if it has no such head.

    Reads only the tensor's shape, from the weight files' headers (`weights.tensor_shape`).
    """
    shape = tensor_shape(checkpoint, key)
    return shape[0] if shape is not None else None


def checkpoint_label_order(checkpoint: str | Path, label_names: Sequence[str], reinit_head: bool = False) -> list[str]:
    """`label_names` in the order of the checkpoint's head when that head was trained on the same names.

    Continuing to fine-tune a classifier must keep each label on the head row that learned it;
    otherwise (no head, another size, other names, or `reinit_head`) the order is unchanged.
    """
    if reinit_head or checkpoint_head_size(checkpoint) != len(label_names):
        return list(label_names)
    id2label = read_model_config(checkpoint).get("id2label") or {}
    head_names = [id2label.get(str(i)) for i in range(len(label_names))]
    if set(head_names) == set(label_names):
        return head_names
    if not all(name is None or name == f"LABEL_{i}" for i, name in enumerate(head_names)):
        logger.warning(
            "the checkpoint's head was trained on labels %s; it is kept and now predicts %s, row by row "
            "(pass --reinit-head to start the head afresh)", head_names, list(label_names),
        )  # fmt: skip
    return list(label_names)


def default_pooling(hidden_size: int) -> str:
    """What a new classification head reads for an encoder of width `hidden_size` (`POOLING_BY_WIDTH`)."""
    return next(pooling for width, pooling in POOLING_BY_WIDTH if hidden_size <= width)


def classifier_pooling_of(checkpoint: str | Path, pooling: str | None = None, reinit_head: bool = False) -> tuple[str, str]:
    """The pooling the classifier will read (`ScratchBertConfig.classifier_pooling`), and why.

    Given (`pooling`), it is used; else a checkpoint's own classification head keeps the pooling
    it was trained with, and a new head gets `default_pooling` of the encoder's width. A trained
    head is refused another pooling unless `reinit_head`: its weights were fitted to the other vector.
    """
    model_config = read_model_config(checkpoint)
    head_pooling = model_config.get("classifier_pooling", "cls")
    has_head = checkpoint_head_size(checkpoint) is not None and not reinit_head
    if pooling is None:
        if has_head:
            return head_pooling, "the checkpoint's head"
        hidden_size = model_config.get("hidden_size", 768)
        return default_pooling(hidden_size), f"default for hidden size {hidden_size}"
    if pooling not in CLASSIFIER_POOLINGS:
        raise ScratchBertError(f"pooling={pooling!r}: choose one of {', '.join(CLASSIFIER_POOLINGS)} (--pooling).")
    if has_head and pooling != head_pooling:
        raise ScratchBertError(
            f"the checkpoint {checkpoint} has a classification head trained on {head_pooling!r} pooling; it cannot read "
            f"{pooling!r} pooling. Pass --reinit-head to train a new head, or drop --pooling to keep {head_pooling!r}."
        )
    return pooling, "given"


# The parts of a checkpoint a classifier leaves unused or starts afresh, by the names' prefix.
PARTS = {
    "cls.predictions": "the MLM head",
    "cls.seq_relationship": "the NSP head",
    "bert.pooler": "the pooler",
    "classifier": "the classification head",
}
NEW_PARTS = ("the pooler", "the classification head")  # what a pretrained encoder may lack, and a classifier starts afresh


def part_of(key: str) -> str:
    """The part of BERT a state-dict key belongs to, in words ("cls.predictions.bias" -> "the MLM
    head"), or else its module ("discriminator.dense.weight" -> "discriminator.dense")."""
    return next((part for prefix, part in PARTS.items() if key == prefix or key.startswith(prefix + ".")), key.rsplit(".", 1)[0])


def report_loaded_weights(checkpoint, loading: dict) -> None:
    """Log what `from_pretrained(output_loading_info=True)` found: the checkpoint's parts the
    classifier does not use (its pretraining heads), a pooler that starts from random weights
    and, as a warning, any other weight the checkpoint lacks but the classification head (which
    `load_sequence_classifier` speaks of): an encoder that starts partly at random is a
    checkpoint of another shape, or one cut short."""
    unused = sorted({part_of(key) for key in loading["unexpected_keys"]})
    if unused:
        logger.info("not used from %s: %s", checkpoint, ", ".join(unused))
    missing = {key: part_of(key) for key in loading["missing_keys"]}
    if "the pooler" in missing.values():
        logger.info("%s has no pooler: it starts from random weights and is trained with the head", checkpoint)
    stray = sorted(key for key, part in missing.items() if part not in NEW_PARTS)
    if stray:
        logger.warning(
            "%d weight(s) of the encoder are not in %s and start from random values (%s): it may be a checkpoint of another "
            "architecture or size, or one cut short. Fine-tuning goes on; check the checkpoint.",
            len(stray), checkpoint, ", ".join(stray[:5]) + (", ..." if len(stray) > 5 else ""),
        )  # fmt: skip


def load_sequence_classifier(
    checkpoint: str | Path, label_names: Sequence[str], reinit_head: bool = False, model_class=None, pooling: str | None = None
):
    """Load `checkpoint` as a classifier over `label_names` (id order), with `id2label`/`label2id` set.

    A checkpoint without a classification head (a pretrained encoder) gets a fresh one. A
    checkpoint whose head has a different number of labels is refused unless
    `reinit_head=True`, which replaces the head with a freshly initialised one (as does
    `reinit_head=True` on a head of the right size).

    Args:
        model_class: the class to load into; `ScratchBertForSequenceClassification` by
            default (transformers' `BertForSequenceClassification` works the same way).
        pooling: "cls", "mean" or "max" (`classifier_pooling_of`: None keeps a trained head's, else
            the default for the encoder's width); transformers' BERT classes pool [CLS] only.
    """
    if model_class is None:
        from scratchbert import ScratchBertForSequenceClassification as model_class
    folder = model_folder(checkpoint)
    num_labels = len(label_names)
    head_size = checkpoint_head_size(folder)
    if head_size is not None and head_size != num_labels and not reinit_head:
        raise ScratchBertError(
            f"the checkpoint {checkpoint} has a classification head for {head_size} labels, but the data has "
            f"{num_labels} ({', '.join(label_names)}). Pass --reinit-head (reinit_head=True) to train a new head "
            "for these labels, or use data with the checkpoint's labels."
        )
    options = {}
    if issubclass(model_class, ScratchBertPreTrainedModel):
        pooling, chosen_by = classifier_pooling_of(folder, pooling, reinit_head)
        options["classifier_pooling"] = pooling
    elif pooling in (None, "cls"):
        pooling, chosen_by = "cls", f"{model_class.__name__}'s only pooling"
    else:
        raise ScratchBertError(f"pooling={pooling!r} needs scratchbert's classifier: {model_class.__name__} pools the [CLS] vector only.")
    logger.info("the classifier reads %s (%s)", POOLING_WORDS[pooling], chosen_by)
    id2label = dict(enumerate(label_names))
    with quiet_loading():  # the report below says what transformers' table would, in words
        model, loading = model_class.from_pretrained(
            str(folder),
            num_labels=num_labels,
            id2label=id2label,
            label2id={name: i for i, name in id2label.items()},
            ignore_mismatched_sizes=reinit_head,  # only reached with a mismatch when the user asked for a new head
            output_loading_info=True,
            **options,
        )
    report_loaded_weights(checkpoint, loading)
    if reinit_head and head_size == num_labels:
        # the loaded head had the right size, so from_pretrained kept it; start it afresh as asked
        model.classifier.weight.data.normal_(mean=0.0, std=model.config.initializer_range)
        model.classifier.bias.data.zero_()
    if head_size is None:
        logger.info("%s has no classification head: training a new one for %d labels", checkpoint, num_labels)
    elif reinit_head:  # transformers' load report, held back, would have listed a head of another size
        logger.info("%s's classification head for %d labels is replaced by a new one for %d (--reinit-head)", checkpoint, head_size, num_labels)
    return model


# ---------------------------------------------------------------------------
# 4. Metrics (written out: accuracy and macro-F1 need a few lines of numpy)
# ---------------------------------------------------------------------------


def classification_metrics(predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
    """Accuracy and macro-F1 of integer predictions against references, both (N,).

    Macro-F1 averages the per-class F1 = 2 TP / (2 TP + FP + FN) over the classes that occur
    in the references or the predictions (scikit-learn's convention).
    """
    predictions, references = np.asarray(predictions), np.asarray(references)
    if predictions.shape != references.shape or predictions.size == 0:
        raise ValueError(f"need equally many predictions and references, got {predictions.shape} and {references.shape}.")
    f1s = []
    for label in np.union1d(predictions, references):
        true_pos = np.sum((predictions == label) & (references == label))
        false_pos = np.sum((predictions == label) & (references != label))
        false_neg = np.sum((predictions != label) & (references == label))
        f1s.append(2 * true_pos / (2 * true_pos + false_pos + false_neg))
    return {"accuracy": float(np.mean(predictions == references)), "macro_f1": float(np.mean(f1s))}


def sequence_classification_metrics(eval_prediction) -> dict[str, float]:
    """`compute_metrics` for Trainer: logits (N, K) and labels (N,) -> accuracy, macro-F1, and the
    share of the examples given the most predicted class (`top_class_share`: near 1 is a collapse)."""
    predictions = predicted_classes(eval_prediction.predictions)
    top_class_share = np.bincount(predictions).max() / predictions.size
    return {**classification_metrics(predictions, eval_prediction.label_ids), "top_class_share": float(top_class_share)}


def mean_of_windows(logits: torch.Tensor, window_text: torch.Tensor, texts: int) -> torch.Tensor:
    """Windows' logits (N, K) and the text of each window (N,), numbered 0..B-1 -> each text's mean logits (B, K)."""
    sums = logits.new_zeros(texts, logits.shape[-1]).index_add(0, window_text, logits)
    counts = torch.bincount(window_text, minlength=texts).to(logits.dtype)
    return sums / counts[:, None]


def document_predictions(logits, labels: np.ndarray, documents: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Windows' logits (N, K), labels (N,) and the text each window is from (N,) -> each text's mean
    logits (D, K) and its label (D,), texts in the order of their index. One window per text: unchanged."""
    logits = np.asarray(logits[0] if isinstance(logits, tuple) else logits, dtype=np.float64)
    _, documents = np.unique(np.asarray(documents), return_inverse=True)  # (N,) -> 0..D-1
    count = int(documents.max()) + 1
    document_labels = np.zeros(count, dtype=np.asarray(labels).dtype)
    document_labels[documents] = labels
    return mean_of_windows(torch.from_numpy(logits), torch.from_numpy(documents), count).numpy(), document_labels


def document_metrics(documents: Sequence[int]):
    """`compute_metrics` that scores texts, not windows: `sequence_classification_metrics` on the mean logits
    of each text's windows (`document_predictions`); `documents` (N,) names the text of each row of the split."""

    def compute(eval_prediction) -> dict[str, float]:
        logits, labels = document_predictions(eval_prediction.predictions, eval_prediction.label_ids, documents)
        return sequence_classification_metrics(EvalPrediction(logits, labels))

    return compute


@torch.no_grad()
def classify_texts(
    model, tokenizer, texts: Sequence[str], max_length: int = DEFAULT_MAX_LENGTH, truncation: str = "head+tail", windows: int = DEFAULT_WINDOWS, batch_size: int = 64
) -> np.ndarray:
    """Each text's class logits (D, K), read as `finetune` reads it: up to `windows` windows of
    `max_length` tokens (`windows_of`), their logits averaged (`document_predictions`).

    A `pipeline("text-classification")` reads one window; a classifier fine-tuned with `windows`
    > 1 (a single-text classifier, by default) scores a long text as it was trained and validated
    with this. The defaults are `finetune`'s for single texts; a run's own values are in its
    metrics.json (`"inputs"`).
    """
    positions = model.config.max_position_embeddings
    if not texts:
        raise ScratchBertError("classify_texts got no texts; give a list of strings.")
    check_max_length(max_length, positions)
    if truncation not in TRUNCATIONS:
        raise ScratchBertError(f"truncation={truncation!r}: choose one of {', '.join(TRUNCATIONS)}.")
    if isinstance(windows, bool) or not isinstance(windows, int) or windows < 1:
        raise ScratchBertError(f"windows={windows!r}: it must be a whole number, 1 or more.")
    model.eval()
    rows, documents = window_examples(texts, tokenizer, max_length, truncation, windows)
    logits = []
    for start in range(0, len(rows), batch_size):
        batch = tokenizer.pad({"input_ids": rows[start : start + batch_size]}, return_tensors="pt")  # (B, T) ids and mask
        logits.append(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float().numpy())
    mean, _ = document_predictions(np.concatenate(logits), np.zeros(len(rows), dtype=int), documents)
    return mean


def predicted_classes(logits) -> np.ndarray:
    """Logits (N, K), or a tuple whose first item they are -> predicted class ids (N,)."""
    logits = logits[0] if isinstance(logits, tuple) else logits
    return np.asarray(logits).argmax(-1)


def collapse_of(predictions: np.ndarray, references: np.ndarray, label_names: Sequence[str], share: float = COLLAPSE_SHARE) -> dict | None:
    """The class that (nearly) every prediction names, when the references are spread: else None.

    Collapsed means at least `share` of the predictions (N,) are one class while under `share`
    of the references (N,) are any one class. Returns {"class", "predicted_share", "label_share"}:
    the class's name, its share of the predictions and of the references.
    """
    predictions, references = np.asarray(predictions), np.asarray(references)
    counts = np.bincount(predictions, minlength=len(label_names))
    top = int(counts.argmax())
    predicted_share = counts[top] / predictions.size
    if predicted_share < share or np.bincount(references).max() / references.size >= share:
        return None
    return {"class": label_names[top], "predicted_share": round(float(predicted_share), 4), "label_share": round(float(np.mean(references == top)), 4)}


def token_classification_metrics(eval_prediction) -> dict[str, float]:
    """`compute_metrics` for token tagging: logits (N, T, K), labels (N, T) with IGNORE_INDEX (-100) on
    special tokens and padding -> accuracy and macro-F1 over the labelled tokens only."""
    logits = eval_prediction.predictions
    logits = logits[0] if isinstance(logits, tuple) else logits
    labels = eval_prediction.label_ids
    keep = labels != IGNORE_INDEX
    return classification_metrics(logits.argmax(-1)[keep], labels[keep])


def span_metrics(eval_prediction) -> dict[str, float]:
    """`compute_metrics` for extractive QA: start/end logits (N, T) each, gold start/end
    positions (N,) each -> exact match (both ends right) and the accuracy of each end."""
    start_logits, end_logits = eval_prediction.predictions[:2]
    gold_start, gold_end = eval_prediction.label_ids
    start_right = start_logits.argmax(-1) == gold_start
    end_right = end_logits.argmax(-1) == gold_end
    return {
        "exact_match": float(np.mean(start_right & end_right)),
        "start_accuracy": float(np.mean(start_right)),
        "end_accuracy": float(np.mean(end_right)),
    }


# ---------------------------------------------------------------------------
# 5. Trainer and the whole fine-tuning run
# ---------------------------------------------------------------------------


def make_trainer(
    model, tokenizer, args, train_dataset=None, eval_dataset=None, data_collator=None, compute_metrics=None, callbacks=None, trainer_class=None
):
    """A `Trainer` whose loss and gradients do not depend on how a batch is split up.

    Under gradient accumulation, Trainer passes `num_items_in_batch` (the labelled items of
    the whole accumulated batch) to a model that accepts loss kwargs and then skips its own
    division by `gradient_accumulation_steps`, trusting the model to divide its summed loss
    by that count. scratchbert's heads declare whether they do (`accepts_loss_kwargs`: True
    for token-level losses). A model that does not declare it is judged by whether its
    `forward` takes `**kwargs`, and transformers' BERT heads do take `**kwargs` yet average
    each micro-batch: Trainer would add up the micro-batch means, making loss and gradients
    `gradient_accumulation_steps` times too large. So a model that does not declare it is
    marked `accepts_loss_kwargs = False`, and Trainer divides by the number of micro-batches.
    `trainer_class` is a subclass of `Trainer` to make instead (`text_loss.TextLossTrainer`).
    """
    from transformers import DataCollatorWithPadding, Trainer  # on use: importing Trainer takes a while

    if not hasattr(model, "accepts_loss_kwargs"):
        model.accepts_loss_kwargs = False
    return (trainer_class or Trainer)(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=data_collator if data_collator is not None else DataCollatorWithPadding(tokenizer),
        compute_metrics=compute_metrics,
        callbacks=callbacks,
    )


class OneClassAwareEarlyStopping(EarlyStoppingCallback):
    """transformers' early stopping, except that an evaluation where the classifier gives (nearly) every
    example one class (`top_class_share` >= `COLLAPSE_SHARE`) does not count against the patience.

    A small model's first epochs often answer with the majority class, and its score stays the same
    until it leaves that answer: a plateau that plain early stopping takes for the end of learning.
    """

    def on_evaluate(self, args, state, control, metrics, **kwargs):
        if metrics.get("eval_top_class_share", 0.0) >= COLLAPSE_SHARE:
            return
        super().on_evaluate(args, state, control, metrics, **kwargs)


class LatestOfEqualEpochs(TrainerCallback):
    """Keep the latest of the epochs that share the best score, not the first.

    Trainer replaces the kept epoch only with a strictly better one. A small validation split
    gives few distinct scores (45 texts: accuracy moves in steps of 1/45), so several epochs
    often tie, and Trainer's rule keeps the first of them: a model a quarter into its schedule,
    still at a high learning rate, where the tied later epochs have trained longer and annealed.
    Before Trainer compares, a score equal to the best so far lowers the best by one float
    step, so the tie counts as better. Registered after early stopping, which still counts a
    tie as no improvement.
    """

    def __init__(self, metric: str):
        self.key = f"eval_{metric}"  # `metric` is one of METRICS, as `compute_metrics` names it

    def on_evaluate(self, args, state, control, metrics, **kwargs):
        if state.best_metric is not None and metrics.get(self.key) == state.best_metric:
            state.best_metric = math.nextafter(state.best_metric, -math.inf)


# ---------------------------------------------------------------------------
# 6. The run: one configuration object, then train / select / score / save
# ---------------------------------------------------------------------------


@dataclass
class FinetuneConfig(ConfigFile):
    """Everything a fine-tuning run needs: `scratchbert finetune`'s flags and config file, in one place."""

    JOB = "fine-tuning"

    checkpoint: str | None = field(default=None, metadata={"positional": True, "help": "folder of the checkpoint to start from (config.json + weights), or a Hugging Face Hub name"})
    output_dir: str | None = field(default=None, metadata={"help": "where the fine-tuned model, tokenizer and metrics.json go (required)"})
    tokenizer: str | None = field(default=None, metadata={"help": "tokenizer folder or Hub name (default: the checkpoint's)"})
    # --- data: local files or a datasets name ---
    train_files: list[str] | None = field(default=None, metadata={"flag": "--train-file", "metavar": "FILE", "help": "CSV/TSV/JSON/JSONL/Parquet file(s) or globs, optionally compressed"})
    validation_files: list[str] | None = field(default=None, metadata={"flag": "--validation-file", "metavar": "FILE", "help": "default: hold out --validation-fraction of train"})
    test_files: list[str] | None = field(default=None, metadata={"flag": "--test-file", "metavar": "FILE", "help": "scored once at the end with the best model"})
    dataset_name: str | None = field(default=None, metadata={"flag": "--dataset", "metavar": "NAME", "help": "a datasets name or saved folder, instead of --train-file"})
    dataset_config: str | None = field(default=None, metadata={"help": "configuration name of --dataset"})
    train_split: str | None = field(default=None, metadata={"help": "split of --dataset to train on (default: train)"})
    validation_split: str | None = field(default=None, metadata={"help": "split of --dataset to select epochs on (default: validation if present)"})
    test_split: str | None = field(default=None, metadata={"help": "split of --dataset to score at the end"})
    validation_fraction: float = field(default=0.1, metadata={"help": "held out of train without a validation split, the same share of each label"})
    text_column: str = field(default="text", metadata={"help": "column of the text"})
    text_pair_column: str | None = field(default=None, metadata={"help": "second text of a pair (e.g. hypothesis), joined with [SEP]"})
    label_column: str = field(default="label", metadata={"help": "string or integer labels"})
    max_train_samples: int | None = field(default=None, metadata={"help": "train on a random subset of this size"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "evaluate on random subsets of this size"})
    max_length: int | None = field(default=None, metadata={"help": f"tokens per example after truncation (default: {DEFAULT_MAX_LENGTH} or the model's positions)"})
    truncation: str | None = field(
        default=None,
        metadata={"choices": TRUNCATIONS, "help": f"which tokens of a long text to keep: the first ones, or the first quarter and the last three quarters (default: head+tail for single texts, head for text pairs; {DOCS})"},
    )  # fmt: skip
    windows: int | None = field(
        default=None,
        metadata={"help": f"read a long single text as up to N windows of --max-length tokens, each a training example with the text's label; a text's prediction is the mean of its windows' logits (default: {DEFAULT_WINDOWS} for single texts, 1 for text pairs; {DOCS})"},
    )  # fmt: skip
    window_loss: str = field(
        default="window",
        metadata={"choices": WINDOW_LOSSES, "help": f"with windows, train each window on its text's label, or train on the text: the mean of its windows' logits against its label, as it is scored (a batch of --batch-size texts; {DOCS})"},
    )  # fmt: skip
    # --- training ---
    epochs: float | None = field(
        default=None, metadata={"help": f"passes over the training data (default: {DEFAULT_EPOCHS}, or more to reach --min-steps)"}
    )
    min_steps: int = field(
        default=DEFAULT_MIN_STEPS, metadata={"help": "without --epochs, add epochs until training takes at least this many optimizer steps"}
    )
    batch_size: int = field(default=16, metadata={"help": "examples per step"})
    eval_batch_size: int = field(default=64, metadata={"help": "examples per evaluation batch"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "forward passes per optimizer step"})
    learning_rate: float | None = field(
        default=None, metadata={"help": f"peak learning rate of AdamW (default: by the model's hidden size, from 1e-3 to 5e-5: {DOCS})"}
    )
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    warmup_ratio: float = field(default=0.1, metadata={"help": "fraction of steps with a linear warmup"})
    best_metric: str = field(default="macro_f1", metadata={"choices": METRICS, "help": "picks the epoch that is kept"})
    ties: str = field(
        default="latest",
        metadata={"choices": TIES, "help": f"of epochs with an equal best --best-metric, keep the latest (trained longest) or the earliest (Trainer's own rule; {DOCS})"},
    )  # fmt: skip
    early_stopping_patience: int | None = field(
        default=DEFAULT_EARLY_STOPPING_PATIENCE,
        metadata={"help": f"stop after this many epochs' evaluations without a better --best-metric; 0: train every epoch (default: {DEFAULT_EARLY_STOPPING_PATIENCE or 'off'}, {DOCS})"},
    )  # fmt: skip
    pooling: str | None = field(
        default=None,
        metadata={"choices": CLASSIFIER_POOLINGS, "help": f"what the classifier reads: BERT's pooler on [CLS], or the mean or each feature's max of the last layer over the real tokens (default: a trained head's own, else mean up to hidden size {POOLING_BY_WIDTH[0][0]} and cls above; {DOCS}). A mean or max classifier exports to ONNX, not with export-bert"},
    )  # fmt: skip
    soup: int | None = field(
        default=None,
        metadata={"help": f"fine-tune N times on the same labels and validation slice (seeds --seed, --seed + 1, ...) and keep the average of the N kept models' weights: one model of the same size (a model soup; default: by the model's hidden size, {SOUP_BY_WIDTH[0][1]} up to {SOUP_BY_WIDTH[0][0]}, else 1: {DOCS})"},
    )  # fmt: skip
    adversarial: float = field(
        default=0.0,
        metadata={"metavar": "EPS", "help": f"adversarial training: add to each step's loss the loss at each example's word embeddings moved along its gradient, a step of EPS times the length of an average word vector (Miyato et al. 2017; about twice the compute of a step). 0.12 made one run of `tiny` better on IMDB and not on BBC News, and a soup of such runs worse than a plain soup on IMDB, so it is off by default; with --soup 1, try 0.12 ({DOCS})"},
    )  # fmt: skip
    reinit_head: bool = field(default=False, metadata={"help": "train a new head even if the checkpoint has one"})
    seed: int = field(default=42, metadata={"help": "seed of the new head, the data order and dropout (of a soup's first run)"})
    full_determinism: bool = field(
        default=False,
        metadata={"help": "the same weights from the same seed on this machine: torch's deterministic mode, and no CPU kernel chosen by timing (slower where another kernel was faster; docs/finetuning.md)"},
    )  # fmt: skip
    logging_steps: int = field(default=50, metadata={"help": "log the training loss every N steps"})
    overwrite: bool = field(default=False, metadata={"help": "allow a non-empty --output-dir"})
    show_progress: bool = field(default=True, metadata={"help": "show Trainer's progress bars"})

    def __post_init__(self) -> None:
        for name in ("train_files", "validation_files", "test_files"):
            if isinstance(getattr(self, name), (str, Path)):
                setattr(self, name, [getattr(self, name)])
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError naming the bad value and the fix (the data and checkpoint are checked when read)."""
        if not self.checkpoint:
            raise ScratchBertError("give the checkpoint to fine-tune: a folder with config.json and the model weights.")
        if not self.output_dir:
            raise ScratchBertError("give --output-dir: the folder the fine-tuned model goes to.")
        for name in ("epochs", "batch_size", "eval_batch_size", "gradient_accumulation_steps", "learning_rate", "logging_steps"):
            value = getattr(self, name)
            if value is None and name in ("epochs", "learning_rate"):
                continue  # fitted to the model and the data when the run starts (`fitted_schedule`)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ScratchBertError(f"{name}={value!r}: it must be a positive number (--{name.replace('_', '-')}).")
        if isinstance(self.min_steps, bool) or not isinstance(self.min_steps, int) or self.min_steps < 0:
            raise ScratchBertError(f"min_steps={self.min_steps!r}: it must be a whole number, 0 or more (--min-steps).")
        if self.best_metric not in METRICS:
            raise ScratchBertError(f"best_metric must be one of {', '.join(METRICS)}, got {self.best_metric!r}.")
        if self.ties not in TIES:
            raise ScratchBertError(f"ties must be one of {', '.join(TIES)}, got {self.ties!r}.")
        patience = self.early_stopping_patience
        if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 0):
            raise ScratchBertError(f"early_stopping_patience={patience!r}: it must be a whole number of evaluations, 0 (off) or more (--early-stopping-patience).")
        if self.soup is not None and (isinstance(self.soup, bool) or not isinstance(self.soup, int) or self.soup < 1):
            raise ScratchBertError(f"soup={self.soup!r}: it must be a whole number of fine-tuning runs, 1 or more (--soup).")
        eps = self.adversarial
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < math.inf:
            raise ScratchBertError(f"adversarial={eps!r}: it must be the norm of the step on the word embeddings, 0 (off) or more (--adversarial).")
        if self.pooling is not None and self.pooling not in CLASSIFIER_POOLINGS:
            raise ScratchBertError(f"pooling must be one of {', '.join(CLASSIFIER_POOLINGS)}, got {self.pooling!r} (--pooling).")
        if self.windows is not None and (isinstance(self.windows, bool) or not isinstance(self.windows, int) or self.windows < 1):
            raise ScratchBertError(f"windows={self.windows!r}: it must be a whole number, 1 or more (--windows).")
        if self.windows is not None and self.windows > 1 and self.text_pair_column is not None:
            raise ScratchBertError("windows cut single texts; with --text-pair-column leave --windows at 1.")
        if self.window_loss not in WINDOW_LOSSES:
            raise ScratchBertError(f"window_loss must be one of {', '.join(WINDOW_LOSSES)}, got {self.window_loss!r} (--window-loss).")
        if self.truncation is not None and self.truncation not in TRUNCATIONS:
            raise ScratchBertError(f"truncation must be one of {', '.join(TRUNCATIONS)}, got {self.truncation!r}.")
        if not 0.0 <= self.warmup_ratio < 1.0 or self.weight_decay < 0:
            raise ScratchBertError("warmup_ratio must be in [0, 1) and weight_decay 0 or more.")


def _check_output_dir(output_dir: Path, overwrite: bool) -> None:
    if output_dir.exists() and not output_dir.is_dir():
        raise ScratchBertError(f"--output-dir {output_dir} is a file; give a folder.")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise ScratchBertError(
            f"--output-dir {output_dir} is not empty; pick a new folder, or pass --overwrite to replace what it holds."
        )


def by_width(table: tuple, hidden_size: int):
    """The value of a (largest hidden size, value) table (`*_BY_WIDTH`) for an encoder of width `hidden_size`."""
    return next(value for width, value in table if hidden_size <= width)


def default_learning_rate(hidden_size: int) -> float:
    """The peak learning rate for an encoder of width `hidden_size` (`LEARNING_RATES_BY_WIDTH`)."""
    return by_width(LEARNING_RATES_BY_WIDTH, hidden_size)


def default_soup(hidden_size: int) -> int:
    """The fine-tuning runs averaged into the kept model for an encoder of width `hidden_size` (`SOUP_BY_WIDTH`)."""
    return by_width(SOUP_BY_WIDTH, hidden_size)


# The options of `fitted_schedule` that follow the model's width when not given, and their defaults.
WIDTH_DEFAULTS = {"learning_rate": default_learning_rate, "soup": default_soup}


def optimizer_steps_per_epoch(train_rows: int, batch_size: int, gradient_accumulation_steps: int = 1) -> int:
    """Optimizer steps in one pass over `train_rows` examples, counted as `Trainer` does (one process)."""
    return max(math.ceil(math.ceil(train_rows / batch_size) / gradient_accumulation_steps), 1)


def fitted_schedule(config: FinetuneConfig, hidden_size: int, train_rows: int) -> dict[str, Any]:
    """The learning rate and the number of epochs of the run, and where each came from.

    A value given in `config` (a flag or a file) is used as it is. Otherwise the learning rate
    follows the model's width (`default_learning_rate`) and the epochs are `DEFAULT_EPOCHS`, or
    as many whole epochs as it takes to make `config.min_steps` optimizer steps: 400 labelled
    examples in batches of 16 make 25 steps an epoch, too few updates in 3 epochs for a small
    model to leave the majority class. The runs averaged into the kept model are `config.soup`, or
    follow the model's width (`default_soup`); "adversarial" is `config.adversarial`'s step (0: off);
    "optimizer_steps" counts one run's.

    Returns:
        {"learning_rate", "epochs", "optimizer_steps", "steps_per_epoch", "soup", "adversarial", "chosen_by": {option: why}}
    """
    per_epoch = optimizer_steps_per_epoch(train_rows, config.batch_size, config.gradient_accumulation_steps)
    chosen_by = {}
    fitted = {}
    for name, default in WIDTH_DEFAULTS.items():
        given = getattr(config, name)
        fitted[name] = default(hidden_size) if given is None else given
        chosen_by[name] = f"default for hidden size {hidden_size}" if given is None else "given"
    epochs = config.epochs
    if epochs is None:
        epochs = max(DEFAULT_EPOCHS, math.ceil(config.min_steps / per_epoch))
        chosen_by["epochs"] = f"default: {DEFAULT_EPOCHS}, or enough for --min-steps {config.min_steps}"
    else:
        chosen_by["epochs"] = "given"
    return {
        "learning_rate": fitted["learning_rate"],
        "epochs": epochs,
        "optimizer_steps": math.ceil(epochs * per_epoch),
        "steps_per_epoch": per_epoch,
        "soup": fitted["soup"],
        "adversarial": float(config.adversarial),
        "chosen_by": chosen_by,
    }


def fitted_inputs(config: FinetuneConfig, positions: int) -> dict[str, Any]:
    """How many tokens of each example the classifier reads, which ones, and where each choice came from.

    A value given in `config` is used as it is. Otherwise `DEFAULT_MAX_LENGTH` tokens (fewer if the
    model has fewer `positions`), cut head+tail from a single text (its start and its end) and from
    the start of a text pair, whose two texts head+tail cannot cut; a single text is read in up to
    `DEFAULT_WINDOWS` windows of that length, a text pair in one.

    Returns:
        {"max_length", "truncation", "windows", "positions", "chosen_by": {option: why}}
    """
    max_length, truncation, windows = config.max_length, config.truncation, config.windows
    chosen_by = {"max_length": "given", "truncation": "given", "windows": "given"}
    pairs = config.text_pair_column is not None
    if max_length is None:
        max_length = min(DEFAULT_MAX_LENGTH, positions)
        chosen_by["max_length"] = f"default: {DEFAULT_MAX_LENGTH}, or the model's positions"
    check_max_length(max_length, positions)
    if truncation is None:
        truncation = "head" if pairs else "head+tail"
        chosen_by["truncation"] = "default: head for text pairs" if pairs else "default: head+tail for single texts"
    if windows is None:
        windows = 1 if pairs else DEFAULT_WINDOWS
        chosen_by["windows"] = "default: 1 for text pairs" if pairs else f"default: {DEFAULT_WINDOWS} for single texts"
    return {"max_length": max_length, "truncation": truncation, "windows": windows, "positions": positions, "chosen_by": chosen_by}


def report_collapse(log_history: list[dict], outputs: dict, label_names: Sequence[str]) -> dict | None:
    """Whether the kept model gives (nearly) every example one class (`collapse_of`), split by split.

    `outputs` maps split names to (logits (D, K), labels (D,)) of each text; `log_history` is
    Trainer's (every run's, for a soup). Returns None, or the collapsed
    splits with "epochs_collapsed" ("E of N" evaluated epochs) and "advice"; each is also logged
    as a warning.
    """
    collapsed = {}
    for split, (logits, labels) in outputs.items():
        found = collapse_of(predicted_classes(logits), labels, label_names)
        if found is not None:
            collapsed[split] = found
    if not collapsed:
        return None
    epochs = [entry["eval_top_class_share"] for entry in log_history if "eval_top_class_share" in entry]
    collapsed["epochs_collapsed"] = f"{sum(share >= COLLAPSE_SHARE for share in epochs)} of {len(epochs)}"
    collapsed["advice"] = COLLAPSE_ADVICE
    for split in outputs:
        if split in collapsed:
            found = collapsed[split]
            logger.warning(
                "COLLAPSED: the classifier gives %r to %.0f%% of the %s examples (%.0f%% of their labels are %r; "
                "collapsed in %s epochs): %s", found["class"], 100 * found["predicted_share"], split,
                100 * found["label_share"], found["class"], collapsed["epochs_collapsed"], COLLAPSE_ADVICE,
            )  # fmt: skip
    return collapsed


def early_stopping_record(trainer, stopper, schedule: dict) -> dict:
    """What early stopping (`stopper`, an `EarlyStoppingCallback`, or None when off) did:
    {"patience", "stopped_early", "epochs_run", "optimizer_steps_run"}; a stop is logged."""
    patience = stopper.early_stopping_patience if stopper is not None else None
    stopped = stopper is not None and stopper.early_stopping_patience_counter >= patience
    record = {"patience": patience, "stopped_early": stopped, "epochs_run": trainer.state.epoch, "optimizer_steps_run": trainer.state.global_step}
    if stopped:
        logger.info(
            "early stopping: %d evaluations without a better validation %s; stopped after %g of %g epochs (%d of %d steps)",
            patience, trainer.args.metric_for_best_model, trainer.state.epoch, schedule["epochs"], trainer.state.global_step,
            schedule["optimizer_steps"],
        )  # fmt: skip
    return record


def finetune_text_classification(checkpoint: str | Path, output_dir: str | Path, *, model_class=None, **options) -> dict[str, Any]:
    """Fine-tune `checkpoint` as a text (or text-pair) classifier and save it to `output_dir`.

    `options` are the fields of `FinetuneConfig` (train_files=..., epochs=..., ...); see
    `finetune` for what happens.
    """
    config = FinetuneConfig(checkpoint=str(checkpoint), output_dir=str(output_dir), **options)
    return finetune(config, model_class=model_class)


# What `transformers.enable_full_determinism` (Trainer's `full_determinism`) sets for the rest of the process.
DETERMINISM_ENVIRONMENT = ("CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "ASCEND_LAUNCH_BLOCKING", "HCCL_DETERMINISTIC", "FLASH_ATTENTION_DETERMINISTIC")


@contextlib.contextmanager
def determinism_restored():
    """Put back what Trainer's `full_determinism` changes for good: torch's deterministic mode (which
    also keeps every CPU product on torch's own kernel, `cpu_gemm`), cuDNN's flags and the
    environment variables above, so work after a reproducible run runs at full speed."""
    mode = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    environment = {name: os.environ.get(name) for name in DETERMINISM_ENVIRONMENT}
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(mode[0], warn_only=mode[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def finetune(config: FinetuneConfig, model_class=None) -> dict[str, Any]:
    """Fine-tune as `config` says.

    Learning rate and epochs not given are fitted to the model's width and the number of
    training examples (`fitted_schedule`), the tokens read per example and which ones to the
    model's positions and the kind of text (`fitted_inputs`). Evaluates accuracy and macro-F1 on the
    validation split after every epoch, per text: a text read in several `windows` by its windows' mean
    logits (stopping after `early_stopping_patience` evaluations without a better `best_metric`, when
    set), reloads the epoch with the best `best_metric` at the end; with `soup` = N > 1 does that N
    times (seeds `seed`, `seed` + 1, ...; the same labels and validation slice) and keeps the mean of the
    N kept models' weights, validated again. It optionally scores a test split with the kept model,
    reports a classifier that gives (nearly) every example one class (`report_collapse`), and saves
    model (with `id2label`/`label2id`), tokenizer and `metrics.json`. Epoch checkpoints go to
    `output_dir/checkpoints` (a soup's to `checkpoints/run-k`).

    Returns:
        {"labels": [...], "label_warnings": None or {...} (`label_warnings`), "schedule": {...}, "inputs": {...} (`fitted_inputs`), "validation": {...}, "test": {...} (when a test
         split is given), "train": {...}, "pooling": "cls", "mean" or "max", "window_loss", "early_stopping": {...}
         (`early_stopping_record`; for a soup, steps and epochs summed over its runs), "collapsed": None or
         {split: {...}, "advice": ...}, and for a soup "soup": {"runs", "members": [each run's seed, validation,
         best_checkpoint and early_stopping]}}
        with metrics named without Trainer's "eval_" prefix.
    """
    checkpoint = config.checkpoint
    check_weights(checkpoint)  # a missing, truncated or corrupt weight file fails here, in one line
    model_config = read_model_config(checkpoint)
    inputs = fitted_inputs(config, model_config.get("max_position_embeddings", 512))
    logger.info(
        "%d tokens per example (%s), %s truncation (%s), up to %d windows per text (%s)", inputs["max_length"], inputs["chosen_by"]["max_length"],
        inputs["truncation"], inputs["chosen_by"]["truncation"], inputs["windows"], inputs["chosen_by"]["windows"],
    )  # fmt: skip
    output_dir = Path(config.output_dir)
    _check_output_dir(output_dir, config.overwrite)
    tokenizer = load_tokenizer(config.tokenizer if config.tokenizer is not None else checkpoint, max_length=inputs["positions"])

    # Everything about the data is checked before the (slow) model load, its cells in the files' order.
    splits = read_splits(**{name: getattr(config, name) for name in READ_OPTIONS})
    check_columns(splits, config.text_column, config.text_pair_column, config.label_column)
    splits = carve_splits(splits, **{name: getattr(config, name) for name in CARVE_OPTIONS})
    label_names = label_names_of(splits, config.label_column)
    if len(label_names) < 2:
        raise ScratchBertError(f"the data has a single label ({label_names[0]!r}); a classifier needs at least two.")
    label_names = checkpoint_label_order(checkpoint, label_names, config.reinit_head)
    logger.info("%d labels: %s; %s", len(label_names), ", ".join(label_names), ", ".join(f"{k} {len(v)} rows" for k, v in splits.items()))
    splits = encode_labels(splits, config.label_column, label_names)
    doubtful_labels = label_warnings(splits, label_names)
    splits = tokenize_splits(splits, tokenizer, config.text_column, config.text_pair_column, inputs["max_length"], inputs["truncation"], inputs["windows"])
    if config.window_loss == "text":
        from scratchbert.training.text_loss import texts_of_windows

        splits["train"] = texts_of_windows(splits["train"])  # one example per text: --batch-size and the steps count texts

    schedule = fitted_schedule(config, model_config.get("hidden_size", 768), len(splits["train"]))
    logger.info(
        "learning rate %g (%s), %g epochs of %d optimizer steps (%s), %d run%s averaged into the kept model (%s), adversarial step %g (0: off)",
        schedule["learning_rate"], schedule["chosen_by"]["learning_rate"], schedule["epochs"], schedule["steps_per_epoch"], schedule["chosen_by"]["epochs"],
        schedule["soup"], "s" if schedule["soup"] > 1 else "", schedule["chosen_by"]["soup"], schedule["adversarial"],
    )  # fmt: skip

    # The data is good: only now is the folder made, and held against a second run writing there too.
    with OutputDirLock(output_dir, "scratchbert finetune") as lock, determinism_restored():
        lock.claim(PartialState(), writing=True)
        return _train_and_score(config, model_class, tokenizer, splits, label_names, schedule, inputs, output_dir, doubtful_labels)


@dataclass
class Member:
    """What one fine-tuning run of `finetune` did (`_train_member`)."""

    seed: int
    train: dict  # Trainer's training metrics
    validation: dict  # the kept epoch's validation metrics, as logged when it was evaluated
    best_checkpoint: str | None
    early_stopping: dict  # `early_stopping_record`
    log_history: list[dict]


def unprefixed(metrics: dict, prefix: str) -> dict:
    """Trainer's metrics without their split prefix ("eval_accuracy" -> "accuracy")."""
    return {key.removeprefix(prefix): value for key, value in metrics.items()}


def _train_member(config: FinetuneConfig, model_class, tokenizer, splits, label_names, schedule: dict, checkpoints: Path, seed: int):
    """Train one classifier from `config.checkpoint` with `seed`, evaluating each epoch. -> (`Member`, its
    Trainer, which holds the kept epoch's model: Trainer reloads the best at the end).

    Each run of a soup draws its new head from its own `seed` (one shared start was measured: level
    for `tiny`, worse from random weights; DOCS).
    """
    from transformers import TrainingArguments, set_seed

    set_seed(seed)  # the new head's initialisation and the data order
    model = load_sequence_classifier(config.checkpoint, label_names, reinit_head=config.reinit_head, model_class=model_class, pooling=config.pooling)
    args = TrainingArguments(
        output_dir=str(checkpoints),
        num_train_epochs=schedule["epochs"],
        per_device_train_batch_size=config.batch_size,
        per_device_eval_batch_size=config.eval_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        learning_rate=schedule["learning_rate"],
        weight_decay=config.weight_decay,
        warmup_steps=config.warmup_ratio,  # a float in [0, 1) is a fraction of the total steps
        eval_strategy="epoch",
        save_strategy="epoch",  # best-model selection needs a checkpoint of each evaluated epoch
        load_best_model_at_end=True,
        metric_for_best_model=config.best_metric,
        greater_is_better=True,
        save_total_limit=1,  # Trainer still keeps the best checkpoint besides the latest
        save_only_model=True,  # epoch checkpoints are for picking the best, not for resuming: no optimizer state
        logging_steps=config.logging_steps,
        seed=seed,
        full_determinism=config.full_determinism,
        report_to="none",
        disable_tqdm=not config.show_progress,
    )
    # Early stopping reads the same per-epoch evaluation that picks the kept epoch (and the best one is still reloaded).
    stopper = OneClassAwareEarlyStopping(early_stopping_patience=config.early_stopping_patience) if config.early_stopping_patience else None
    callbacks = [stopper] if stopper else []
    if config.ties == "latest":
        callbacks.append(LatestOfEqualEpochs(config.best_metric))  # after the stopper: it must see the tie as a tie
    trainer_options = {}  # the loss's Trainer class and collator, where an option changes them
    if config.window_loss == "text":
        from scratchbert.training.text_loss import TextLossTrainer, TextWindowsCollator

        trainer_options = {"data_collator": TextWindowsCollator(tokenizer), "trainer_class": TextLossTrainer}
    if schedule["adversarial"]:
        from scratchbert.training.adversarial import adversarial_trainer

        trainer_options["trainer_class"] = adversarial_trainer(trainer_options.get("trainer_class"), schedule["adversarial"])
    trainer = make_trainer(
        model, tokenizer, args, splits["train"], splits["validation"], compute_metrics=document_metrics(splits["validation"]["document"]),
        callbacks=callbacks, **trainer_options,
    )  # fmt: skip
    train_output = trainer.train()
    # The best epoch's validation metrics were logged when it was evaluated; no need to evaluate again.
    best_epoch = next(e for e in trainer.state.log_history if e.get("step") == trainer.state.best_global_step and "eval_loss" in e)
    member = Member(
        seed, unprefixed(train_output.metrics, "train_"), unprefixed(best_epoch, "eval_"), trainer.state.best_model_checkpoint,
        early_stopping_record(trainer, stopper, schedule), trainer.state.log_history,
    )  # fmt: skip
    return member, trainer


class WeightAverage:
    """The running element-wise mean of the weights of models added one by one (a uniform model soup,
    Wortsman et al. 2022), holding one float32 copy of the weights rather than every model.

    Fine-tuned from one checkpoint, the runs stay close enough in weight space for their mean to be a
    classifier itself, better than the runs on average (DOCS). Tensors that are not floating point
    (index buffers) are the same in every run and are left as the model has them.
    """

    def __init__(self):
        self.total: dict[str, torch.Tensor] = {}
        self.count = 0

    def add(self, model) -> None:
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point():
                self.total[name] = self.total[name] + tensor.float() if self.count else tensor.detach().float().clone()
        self.count += 1

    def load_into(self, model) -> None:
        """Give `model` (one of the averaged models' architecture) the mean weights."""
        mean = {name: (total / self.count).to(model.state_dict()[name].dtype) for name, total in self.total.items()}
        model.load_state_dict(mean, strict=False)  # strict=False: the non-float buffers stay as they are


def soup_record(members: list[Member]) -> dict:
    """What the runs of a soup did together: training time and steps summed, the rest per run."""
    return {
        "train": {"runtime": sum(m.train["runtime"] for m in members), "loss": float(np.mean([m.train["loss"] for m in members])), "epoch": members[0].train["epoch"]},
        "early_stopping": {
            "patience": members[0].early_stopping["patience"],
            "stopped_early": any(m.early_stopping["stopped_early"] for m in members),
            "epochs_run": sum(m.early_stopping["epochs_run"] for m in members),
            "optimizer_steps_run": sum(m.early_stopping["optimizer_steps_run"] for m in members),
        },
        "soup": {"runs": len(members), "members": [{name: getattr(m, name) for name in ("seed", "validation", "best_checkpoint", "early_stopping")} for m in members]},
    }


SOUP_FALLBACK_ADVICE = (
    "its runs did not end in one basin of the loss, as fine-tunes of an untrained or barely pretrained checkpoint "
    "do not. Pretrain longer, or pass --soup 1 to train once."
)


def keep_soup_or_best_run(trainer, members: list[Member], validation, best_metric: str) -> dict:
    """Keep the soup in `trainer.model` if it validates no worse than the worst of its runs, else the best run.

    Runs fine-tuned from a pretrained checkpoint stay in one basin, and their mean is a classifier
    at least as good as they are; runs from random weights end in different basins, and their mean
    is close to a constant guess (on BBC News: validation loss 1.3 against 0.2 to 0.7 for each run,
    test macro-F1 0.77 to 0.88 where one run scores 0.92 to 0.97; DOCS). The validation loss tells the two apart where
    the score of a small validation split cannot. When the soup is worse than every run, the run with
    the best `best_metric` (then the lowest loss) is loaded into `trainer.model` instead, with a warning.
    It catches a soup that fell towards a constant guess, not every soup worse than one run: on IMDB the
    soup of five random-weight runs validated above its runs and tested 1.2 points under the first (DOCS).

    Returns:
        {"kept": "soup" or "run k", "validation": the soup's validation scores (loss, accuracy, macro_f1,
        top_class_share), kept or not, "worst_run_validation_loss"}
    """
    from safetensors.torch import load_file

    trainer.compute_metrics = document_metrics(validation["document"])
    metrics = unprefixed(trainer.predict(validation, metric_key_prefix="eval").metrics, "eval_")
    scores = {name: value for name, value in metrics.items() if name != "runtime" and not name.endswith("per_second")}
    worst = max(m.validation["loss"] for m in members)
    record = {"validation": scores, "worst_run_validation_loss": worst}
    if scores["loss"] <= worst:
        return record | {"kept": "soup"}
    best = max(range(len(members)), key=lambda k: (members[k].validation[best_metric], -members[k].validation["loss"]))
    trainer.model.load_state_dict(load_file(str(Path(members[best].best_checkpoint) / "model.safetensors")), strict=False)
    logger.warning(
        "SOUP NOT KEPT: the mean of the %d runs' weights has validation loss %.3f, above every run's (the worst: %.3f; "
        "the soup's %s %.4f): %s Keeping run %d (seed %d), the best on validation (%s %.4f).", len(members), scores["loss"], worst,
        best_metric, scores[best_metric], SOUP_FALLBACK_ADVICE, best, members[best].seed, best_metric, members[best].validation[best_metric],
    )  # fmt: skip
    return record | {"kept": f"run {best}"}


def _train_and_score(
    config: FinetuneConfig, model_class, tokenizer, splits, label_names, schedule: dict, inputs: dict, output_dir: Path,
    doubtful_labels: dict | None = None,
) -> dict[str, Any]:
    """`finetune`'s training, selection, scoring and saving, on the checked and tokenized data.

    With `schedule["soup"]` = N > 1, N runs (seeds `config.seed` + 0..N-1, checkpoints in
    `checkpoints/run-k`) each keep their best epoch, and the mean of their weights is the model that
    is validated, tested, checked for collapse and saved, unless it validates worse than every run
    (`keep_soup_or_best_run`).
    """
    runs = schedule["soup"]
    members, average = [], WeightAverage()
    for k in range(runs):
        if runs > 1:
            logger.info("soup: fine-tuning run %d of %d (seed %d)", k + 1, runs, config.seed + k)
        checkpoints = output_dir / "checkpoints" / (f"run-{k}" if runs > 1 else "")
        member, trainer = _train_member(config, model_class, tokenizer, splits, label_names, schedule, checkpoints, config.seed + k)
        members.append(member)
        if runs > 1:
            average.add(trainer.model)
    # The last run's Trainer scores and saves the kept model: the one run's best epoch, or the soup.
    if runs == 1:
        together = {"train": member.train, "early_stopping": member.early_stopping}
        log_history = member.log_history
    else:
        average.load_into(trainer.model)
        together = soup_record(members)
        together["soup"] |= keep_soup_or_best_run(trainer, members, splits["validation"], config.best_metric)
        log_history = [entry | {"run": k} for k, m in enumerate(members) for entry in m.log_history]
    results = {
        "labels": label_names,
        "label_warnings": doubtful_labels,
        "schedule": schedule,
        "inputs": inputs,
        "train": together["train"],
        "validation": member.validation,  # a soup's own replaces it below
        "best_checkpoint": member.best_checkpoint if runs == 1 else None,
        "pooling": getattr(trainer.model.config, "classifier_pooling", "cls"),
        "window_loss": config.window_loss,
        "early_stopping": together["early_stopping"],
    } | ({"soup": together["soup"]} if runs > 1 else {})
    # The kept model's predictions of each text, to check them for a one-class answer (the test split's scores come with them).
    outputs = {}
    for split, prefix in (("validation", "eval"), ("test", "test")):
        if split in splits:
            trainer.compute_metrics = document_metrics(splits[split]["document"])
            output = trainer.predict(splits[split], metric_key_prefix=prefix)
            outputs[split] = document_predictions(output.predictions, output.label_ids, splits[split]["document"])
            if split == "test" or runs > 1:
                results[split] = unprefixed(output.metrics, f"{prefix}_")
    if runs > 1:
        logger.info(
            "soup of %d runs: validation %s %.4f (each run's: %s)", runs, config.best_metric, results["validation"][config.best_metric],
            ", ".join(f"{m.validation[config.best_metric]:.4f}" for m in members),
        )  # fmt: skip
    results["collapsed"] = report_collapse(log_history, outputs, label_names)
    trainer.save_model(str(output_dir))  # save_pretrained of the model and of the tokenizer
    results["log_history"] = log_history
    (output_dir / "metrics.json").write_text(json.dumps(results, indent=2) + "\n")
    for split in ("validation", "test"):
        if split in results:
            logger.info("%s: accuracy %.4f, macro-F1 %.4f", split, results[split]["accuracy"], results[split]["macro_f1"])
    logger.info("saved the fine-tuned model and tokenizer to %s", output_dir)
    return results
