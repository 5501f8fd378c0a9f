"""What a classifier reads of a text: which tokens (`truncation`), how many (`max_length`) and in how
many windows, for training (`fitted_inputs`, `tokenize_splits`) and for prediction (`classify_texts`) alike.

The saved classifier's config records the three (`INPUT_KEYS`), so `classify_texts` reads a text as
the run that trained the model did.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pyarrow.compute as pc
import torch

from scratchbert.errors import ScratchBertError
from scratchbert.training.finetuning.metrics import document_predictions

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
