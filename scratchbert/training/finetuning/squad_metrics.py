"""Exact match and F1 of extractive answers, as SQuAD's official evaluation script computes them.

Both compare normalized answers (`normalize_answer`: lower case, punctuation and the articles a/an/the
removed, whitespace collapsed); F1 is over the bags of their words; a prediction scores the best of
its gold answers. An unanswerable question (no gold answer, SQuAD v2) counts the empty answer as
gold, as v2's script does: the empty prediction scores 1, any other 0. Scores are on the official
script's 0-100 scale.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

PUNCTUATION = frozenset(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (the official script's order of steps)."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """The harmonic mean of the precision and recall of the prediction's words among the gold answer's."""
    predicted, wanted = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not wanted:  # an empty answer matches only an empty answer (v2's script)
        return float(predicted == wanted)
    same = sum((Counter(predicted) & Counter(wanted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """Mean exact match and F1 (0-100) of `predictions` (one text per question, "" for no answer) against
    each question's gold answers (none: unanswerable), each prediction scored by its best gold answer."""
    if len(predictions) != len(references) or not predictions:
        raise ValueError(f"need one prediction per question, got {len(predictions)} predictions for {len(references)} questions.")
    exact, overlap = 0.0, 0.0
    for prediction, golds in zip(predictions, references):
        golds = list(golds) or [""]
        exact += max(exact_match(prediction, gold) for gold in golds)
        overlap += max(f1(prediction, gold) for gold in golds)
    return {"exact_match": 100 * exact / len(predictions), "f1": 100 * overlap / len(predictions)}
