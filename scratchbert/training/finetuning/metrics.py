"""Metrics of classifiers, written out (accuracy and macro-F1 need a few lines of numpy), the scoring
of a text read in several windows by the mean of their logits, and the one-class answer's report.

Shapes: N = examples (windows), D = texts, T = tokens per example, K = number of labels.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import torch
from transformers import EvalPrediction

from scratchbert.modeling_scratchbert import IGNORE_INDEX

logger = logging.getLogger(__name__)

# A classifier that gives this share (or more) of the examples one class, where the labels are
# more spread than that, has learned the class balance instead of the task: it is reported.
COLLAPSE_SHARE = 0.95

COLLAPSE_ADVICE = (
    "the classifier learned the class balance, not the task. Try a higher --learning-rate (narrow models take "
    "1e-4 to 1e-3), more optimizer steps (--epochs, or min_steps in --config without --epochs), --pooling mean (the [CLS] "
    "pooler collapsed more often), no --early-stopping-patience, and check that the labels belong to the texts "
    "(--text-column, --label-column)."
)

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

def document_metrics(eval_prediction, documents: Sequence[int]) -> dict[str, float]:
    """`compute_metrics` that scores texts, not windows: `sequence_classification_metrics` on the mean logits
    of each text's windows (`document_predictions`); `documents` (N,) names the text of each row of the split
    (Trainer is given `functools.partial(document_metrics, documents=split["document"])`)."""
    logits, labels = document_predictions(eval_prediction.predictions, eval_prediction.label_ids, documents)
    return sequence_classification_metrics(EvalPrediction(logits, labels))

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

def report_collapse(log_history: list[dict], outputs: dict, label_names: Sequence[str]) -> dict | None:
    """Whether the kept model gives (nearly) every example one class (`collapse_of`), split by split.

    `outputs` maps split names to (logits (D, K), labels (D,)) of each text; `log_history` is
    Trainer's. Returns None, or the collapsed
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

def unprefixed(metrics: dict, prefix: str) -> dict:
    """Trainer's metrics without their split prefix ("eval_accuracy" -> "accuracy")."""
    return {key.removeprefix(prefix): value for key, value in metrics.items()}
