"""The data a fine-tuned model reads: the splits read and checked, validation carved out, labels as
ids, and texts tokenized into the windows the model reads.

`finetune` calls them in this order. Before any data is read, `fitted_inputs` fixes how many tokens
of each text the classifier reads (`max_length`), which ones (`truncation`) and in how many windows,
from the checkpoint's positions. Then `read_splits`, `check_columns` (on the rows in the files'
order, so an error names the row a user finds), `carve_splits` (validation held out, the same share
of each label), `label_names_of`, `encode_labels` and `label_warnings` turn string or integer labels
into ids `0..K-1` (whose names go into the model's `id2label`), in the order of a checkpoint's
trained head where it has one. `tokenize_splits` then cuts each text into the windows the model
reads, and `long_text_advice` says when one window cuts too many of them.

The saved classifier's config records how the run read a text (`record_inputs`, `INPUT_KEYS`), so
`classify_texts` reads a text for prediction as the run that trained the model did.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow.compute as pc
import torch

from scratchbert.errors import ScratchBertError
from scratchbert.ingestion import load_named_dataset, load_table
from scratchbert.training.finetuning.metrics import document_predictions

logger = logging.getLogger(__name__)

LABEL_KINDS = {  # Arrow dtype of a label column -> how its values become label names
    **dict.fromkeys(("string", "large_string"), "string"),
    **dict.fromkeys(("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"), "integer"),
    "bool": "integer",  # False/True are the integers 0/1
}

def read_splits(
    train_files: Sequence[str | Path] | None = None,
    validation_files: Sequence[str | Path] | None = None,
    test_files: Sequence[str | Path] | None = None,
    dataset: str | None = None,
    dataset_config: str | None = None,
    train_split: str | None = None,
    validation_split: str | None = None,
    test_split: str | None = None,
):
    """Read the data splits for fine-tuning, rows in the order of their files.

    Give either local `train_files` (CSV/TSV/JSON/JSONL/Parquet, optionally compressed; globs
    are expanded) with optional
    `validation_files`/`test_files`, or a `dataset` for `datasets.load_dataset` with
    split names (`train_split` defaults to "train", `validation_split` to "validation" when
    the dataset has one). `carve_splits` then holds out validation rows and takes subsets.

    Returns:
        {"train": Dataset, and "validation" and "test" when given}
    """

    if (train_files is None) == (dataset is None):
        raise ScratchBertError("give either local train files (--train-files) or a datasets name (--dataset), not both or neither.")
    if train_files is not None and any(x is not None for x in (dataset_config, train_split, validation_split, test_split)):
        raise ScratchBertError(
            "--dataset-config and split names (--train-split, ...) go with --dataset; with local files give --validation-file/--test-file."
        )
    if dataset is not None and (validation_files or test_files):
        raise ScratchBertError("--validation-file/--test-file go with --train-files; with --dataset choose --validation-split/--test-split.")
    if train_files is not None:
        splits = {"train": load_table(train_files, "the train data")}
        for name, files in (("validation", validation_files), ("test", test_files)):
            if files:
                splits[name] = load_table(files, f"the {name} data")
    else:
        loaded = load_named_dataset(dataset, dataset_config)
        # without an explicit choice, a split named "validation" is used when the dataset has one
        if validation_split is None and "validation" in loaded:
            validation_split = "validation"
        splits = {}
        for name, split in (("train", train_split or "train"), ("validation", validation_split), ("test", test_split)):
            if split is None:
                continue
            if split not in loaded:
                raise ScratchBertError(f"dataset {dataset!r} has no split {split!r} (it has: {', '.join(loaded)}).")
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

def label_names_of(splits, label_column: str, head_labels: Sequence[str | None] | None = None) -> list[str]:
    """Label names in id order, from the label column of every split; at least two.

    A `datasets.ClassLabel` column keeps its own names. String labels are sorted; integer
    labels are sorted by value and named by their value ("0", "1", ...), so labels that
    already are `0..K-1` keep their ids. Every row has a label (`check_columns`). A checkpoint's
    trained head (`head_labels`: the label of each of its rows; None without one, or to train a
    new one) keeps its order when it learned the same names (`in_head_order`).
    """
    from datasets import ClassLabel, Value

    first = splits["train"].features[label_column]
    if isinstance(first, ClassLabel):
        names = list(first.names)
    else:
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
        names = [str(int(value)) for value in sorted(values)] if kinds == {"integer"} else sorted(values)
    if len(names) < 2:
        raise ScratchBertError(f"the data has a single label ({names[0]!r}); a classifier needs at least two.")
    names = in_head_order(names, head_labels)
    logger.info("%d labels: %s; %s", len(names), ", ".join(names), ", ".join(f"{k} {len(v)} rows" for k, v in splits.items()))
    return names

def in_head_order(label_names: Sequence[str], head_labels: Sequence[str | None] | None) -> list[str]:
    """`label_names` in the order of a checkpoint's trained head (`head_labels`, the label of each of
    its rows) when that head was trained on the same names.

    Continuing to fine-tune a classifier must keep each label on the head row that learned it;
    otherwise (no head, another size, other names) the order is unchanged.
    """
    if head_labels is None or len(head_labels) != len(label_names):
        return list(label_names)
    if set(head_labels) == set(label_names):
        return list(head_labels)
    if not all(name is None or name == f"LABEL_{i}" for i, name in enumerate(head_labels)):
        logger.warning(
            "the checkpoint's head was trained on labels %s; it is kept and now predicts %s, row by row "
            "(pass --reinit-head to start the head afresh)", list(head_labels), list(label_names),
        )  # fmt: skip
    return list(label_names)

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

# How much of a text the model reads, and in how many windows: for training and for prediction alike.
DEFAULT_MAX_LENGTH = 256  # tokens per example unless asked otherwise (or the model has fewer positions); measured: docs/finetuning.md

DEFAULT_WINDOWS = 1  # windows per text unless --windows; more were measured better on long texts at their cost (docs/finetuning.md)

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

def fitted_inputs(options, positions: int) -> dict:
    """How many tokens of each example the classifier reads, and which: `options`' `max_length` (default
    `DEFAULT_MAX_LENGTH`, or the model's `positions` if fewer), `truncation` and `windows` (`options`: a
    `FinetuneConfig`, or anything with the three). -> {"max_length", "truncation", "windows", "positions"}"""
    max_length = options.max_length if options.max_length is not None else min(DEFAULT_MAX_LENGTH, positions)
    check_max_length(max_length, positions)
    return {"max_length": max_length, "truncation": options.truncation, "windows": options.windows, "positions": positions}

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

LONG_TEXT_SHARE = 0.25  # from this share of cut training texts on, the run says that windows read more

def long_text_advice(train, max_length: int, windows: int, text_pair_column: str | None) -> str | None:
    """A line for a one-window run whose training texts are often cut at `max_length`, else None.

    A tokenized row that fills all `max_length` tokens was (nearly always) cut. On such sets four
    windows read more of each text (docs/finetuning.md). The lengths are read from the Arrow
    column as it is, without turning the token ids into Python lists.
    """
    if windows > 1 or text_pair_column is not None or len(train) == 0:
        return None
    lengths = pc.list_value_length(train.with_format("arrow")["input_ids"])  # (rows,)
    cut = pc.sum(pc.greater_equal(lengths, max_length)).as_py() / len(train)
    if cut < LONG_TEXT_SHARE:
        return None
    return (
        f"{cut:.0%} of the training texts are cut at {max_length} tokens: --windows 4 --truncation head+tail reads up to "
        "four times as much of each (+5.2 points on IMDB, +1.4 on BBC News: docs/finetuning.md)"
    )

# What the saved classifier's config records of how the run read a text, read back by `classify_texts`.
INPUT_KEYS = {"max_length": "classifier_max_length", "truncation": "classifier_truncation", "windows": "classifier_windows"}

def record_inputs(model_config, inputs: dict) -> None:
    """Write the run's `max_length`, `truncation` and `windows` into the model's config (saved in config.json)."""
    for name, key in INPUT_KEYS.items():
        setattr(model_config, key, inputs[name])

def saved_inputs(model_config) -> dict:
    """How the model's run read a text (`record_inputs`): for a model saved without them, one window of
    `DEFAULT_MAX_LENGTH` tokens (or the model's positions), cut at the end, as a `pipeline` reads it."""
    positions = model_config.max_position_embeddings
    defaults = {"max_length": min(DEFAULT_MAX_LENGTH, positions), "truncation": "head", "windows": 1}
    return {name: getattr(model_config, key, None) or defaults[name] for name, key in INPUT_KEYS.items()}

@torch.no_grad()
def classify_texts(
    model, tokenizer, texts: Sequence[str], max_length: int | None = None, truncation: str | None = None, windows: int | None = None,
    batch_size: int = 64,
) -> np.ndarray:  # fmt: skip
    """Each text's class logits (D, K), read as `finetune` read it: up to `windows` windows of
    `max_length` tokens (`windows_of`), their logits averaged (`document_predictions`).

    What is not given is what the model's config recorded of its fine-tuning run (`saved_inputs`),
    so the predictions of a saved folder are those whose scores the run reported. With one window
    and head truncation (`finetune`'s defaults) they are a `pipeline("text-classification")`'s.
    """
    if not texts:
        raise ScratchBertError("classify_texts got no texts; give a list of strings.")
    given = {"max_length": max_length, "truncation": truncation, "windows": windows}
    inputs = saved_inputs(model.config) | {name: value for name, value in given.items() if value is not None}
    max_length, truncation, windows = inputs["max_length"], inputs["truncation"], inputs["windows"]
    check_max_length(max_length, model.config.max_position_embeddings)
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
