"""Fine-tuning on texts rather than windows (`finetune --window-loss text`).

`finetune` reads a long text as several windows. By default each window is a training example
with its text's label; with `window_loss="text"` a text's windows are one example, and the loss
is the cross-entropy of the mean of their logits (`mean_of_windows`), the prediction that
validation, test and `classify_texts` score:

1. `texts_of_windows`     the tokenized training split, one row per text (its windows' columns as lists)
2. `TextWindowsCollator`  a batch of texts -> one padded batch of their windows, with `window_text`
3. `TextLossTrainer`      `Trainer` with that loss

Shapes: B = texts in a batch, N = their windows, T = tokens per window (padded), K = labels.
(A module of its own, imported when the option is used: importing `Trainer` takes a while.)
"""

from __future__ import annotations

import torch
from datasets import Dataset
from transformers import DataCollatorWithPadding, Trainer

from scratchbert.training.finetune import mean_of_windows


def texts_of_windows(split):
    """A split of windows (`tokenize_splits`' rows, each with its `document`) -> one row per text, in the
    order of their index: each column a list of its windows' values (`input_ids`: one list of token
    ids per window), and its label. What `window_loss="text"` trains on (`TextWindowsCollator`,
    `TextLossTrainer`)."""
    rows_of_text: dict[int, list[int]] = {}
    for row, document in enumerate(split["document"]):
        rows_of_text.setdefault(document, []).append(row)
    columns = {name: split[name] for name in split.column_names if name not in ("labels", "document")}
    texts = {name: [[values[row] for row in rows] for rows in rows_of_text.values()] for name, values in columns.items()}
    labels = split["labels"]
    return Dataset.from_dict({**texts, "labels": [labels[rows[0]] for rows in rows_of_text.values()]})


class TextWindowsCollator:
    """Pads a batch of texts (`texts_of_windows`) as one batch of their windows, with `window_text`, the
    batch position of each window's text (N,), and one label per text (B,). Rows of single windows
    (evaluation reads windows: `document_metrics` scores them per text) are padded as they are."""

    def __init__(self, tokenizer):
        self.pad = DataCollatorWithPadding(tokenizer)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if not isinstance(features[0]["input_ids"][0], list):
            return self.pad(features)
        names = [name for name in features[0] if name != "labels"]
        windows = [{name: text[name][i] for name in names} for text in features for i in range(len(text["input_ids"]))]
        batch = self.pad(windows)
        batch["window_text"] = torch.tensor([position for position, text in enumerate(features) for _ in text["input_ids"]])
        batch["labels"] = torch.tensor([text["labels"] for text in features])
        return batch


class TextLossTrainer(Trainer):
    """Trains on texts, not windows: the cross-entropy of the mean of each text's windows' logits
    against its label, the prediction `document_metrics` and `classify_texts` score. A window that
    does not say what its text says (a review's plot summary) no longer trains on the text's label
    alone; the windows of a text are one example. Batches without `window_text` (evaluation) are
    Trainer's own."""

    loss_is_scaled_for_ga = False  # a mean over the micro-batch's texts: Trainer divides by the accumulation steps

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if "window_text" not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = dict(inputs)
        window_text, labels = inputs.pop("window_text"), inputs.pop("labels")
        outputs = model(**inputs)
        logits = mean_of_windows(outputs.logits.float(), window_text, labels.shape[0])  # (N, K) -> (B, K)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return (loss, outputs) if return_outputs else loss
