"""Scores of word tagging as `seqeval` computes them (the package transformers' run_ner.py reports):
word accuracy, and for IOB, IOB2 and BIOES tags the entities' precision, recall and F1, overall
(micro-averaged) and per entity type.

An entity is a chunk of words (type, first word, last word). seqeval's default reading is lenient, and
this one is the same: a chunk starts at B- or S-, at an I- or E- that follows O, E- or S- or another
type, and ends before O, B-, S- or another type and after E- or S-; so IOB1's "I-PER I-PER" is one PER,
and IOB2's "O I-PER" starts one too. A tag without a prefix is its own type ("NP": I of type NP).
Sentences are joined with an O between them, so no entity runs across two. A predicted entity counts
only when its type and both ends equal a gold one. tests/test_finetune_token_classification.py checks
these rules on seqeval's own documented examples.
"""

from __future__ import annotations

from collections.abc import Sequence

OUTSIDE = "O"
ENTITY_PREFIXES = ("B", "I", "E", "S")  # the chunk tags of IOB1, IOB2 and BIOES


def is_entity_scheme(tag_names: Sequence[str]) -> bool:
    """Whether the tags are IOB/IOB2/BIOES (every tag O or PREFIX-TYPE, at least one with a type): then
    entities are scored; otherwise (part-of-speech tags, say) word accuracy is the measure."""
    typed = [tag for tag in tag_names if tag != OUTSIDE]
    return bool(typed) and all(tag[:1] in ENTITY_PREFIXES and tag[1:2] == "-" and len(tag) > 2 for tag in typed)


def split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', ''); a tag without a prefix ('NP') -> ('I', 'NP')."""
    if tag == OUTSIDE:
        return OUTSIDE, ""
    if tag[:1] in ENTITY_PREFIXES and tag[1:2] == "-":
        return tag[0], tag[2:]
    return "I", tag


def ends_chunk(previous: str, previous_type: str, tag: str, kind: str) -> bool:
    """Whether the chunk that `previous` belongs to ends before `tag`."""
    if previous in ("E", "S"):
        return True
    if previous in ("B", "I") and tag in ("B", "S", OUTSIDE):
        return True
    return previous != OUTSIDE and previous_type != kind


def starts_chunk(previous: str, previous_type: str, tag: str, kind: str) -> bool:
    """Whether `tag` starts a chunk, after `previous`."""
    if tag in ("B", "S"):
        return True
    if tag in ("I", "E") and previous in (OUTSIDE, "E", "S"):
        return True
    return tag != OUTSIDE and previous_type != kind


def entities(sentences: Sequence[Sequence[str]]) -> set[tuple[str, int, int]]:
    """Every entity of the sentences as (type, first word, last word), words counted over all sentences
    joined with an O between them."""
    found, begin = set(), 0
    previous, previous_type = OUTSIDE, ""
    tags = [tag for sentence in sentences for tag in [*sentence, OUTSIDE]]
    for position, full_tag in enumerate([*tags, OUTSIDE]):
        tag, kind = split_tag(full_tag)
        if ends_chunk(previous, previous_type, tag, kind):
            found.add((previous_type, begin, position - 1))
        if starts_chunk(previous, previous_type, tag, kind):
            begin = position
        previous, previous_type = tag, kind
    return found


def precision_recall_f1(true_positives: int, predicted: int, gold: int) -> dict[str, float]:
    precision = true_positives / predicted if predicted else 0.0
    recall = true_positives / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def tagging_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], entity_scheme: bool) -> dict:
    """{"accuracy"} over every word, and with `entity_scheme` also "precision", "recall", "f1" of the
    entities and "per_type" {type: {"precision", "recall", "f1", "number"}} (seqeval's report; "number":
    the gold entities of that type). `gold` and `predicted`: each sentence's tags, word by word."""
    words = sum(len(sentence) for sentence in gold)
    correct = sum(g == p for gold_sentence, predicted_sentence in zip(gold, predicted) for g, p in zip(gold_sentence, predicted_sentence))
    scores: dict = {"accuracy": correct / words if words else 0.0}
    if not entity_scheme:
        return scores
    gold_entities, predicted_entities = entities(gold), entities(predicted)
    scores.update(precision_recall_f1(len(gold_entities & predicted_entities), len(predicted_entities), len(gold_entities)))
    scores["per_type"] = {}
    for kind in sorted({entity[0] for entity in gold_entities | predicted_entities}):
        gold_of = {entity for entity in gold_entities if entity[0] == kind}
        predicted_of = {entity for entity in predicted_entities if entity[0] == kind}
        scores["per_type"][kind] = {**precision_recall_f1(len(gold_of & predicted_of), len(predicted_of), len(gold_of)), "number": len(gold_of)}
    return scores
