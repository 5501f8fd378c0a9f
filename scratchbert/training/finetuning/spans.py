"""Extractive QA between texts and tokens: a context read in overlapping windows (`tokenize_windows`),
the answer's characters as the pieces a window starts and ends it at, and back from each window's
start/end logits to the best answer of the question over all its windows (`best_answers`).

As transformers' run_qa.py does: the fast tokenizer cuts a long context (`truncation="only_second"`)
into windows of `max_length` tokens that share `doc_stride` tokens; the offsets of the context's pieces
map characters to pieces and back; a window without the answer (or a question without one, SQuAD v2)
points at [CLS] (position 0); an answer is a span inside the context, ending at or after its start, of
at most `max_answer_length` pieces, chosen among each window's `n_best` starts times `n_best` ends.

Shapes: N = windows, T = tokens per window (padded), E = questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from scratchbert.errors import ScratchBertError

CLS_POSITION = 0  # where a window without the answer points, for both ends (run_qa.py's convention)

# A question scores "no answer" when the [CLS] score (start + end) beats the best span's by more than this (run_qa.py's default).
NULL_SCORE_DIFF_THRESHOLD = 0.0


@dataclass(frozen=True)
class SpanReading:
    """How a question-answering model reads a question and its context, and picks its answer; the saved
    model's config records it (`record`) so `answer_questions` reads as the run that scored it did."""

    max_length: int  # tokens per window: [CLS] question [SEP] context piece [SEP]
    doc_stride: int  # context tokens that consecutive windows share
    n_best: int  # start and end candidates per window
    max_answer_length: int  # the longest answer, in pieces
    null_answers: bool  # SQuAD v2: a question may have no answer in its context

    CONFIG_KEY = "question_answering"

    def record(self, model_config) -> None:
        setattr(model_config, self.CONFIG_KEY, asdict(self))

    @classmethod
    def saved(cls, model_config) -> SpanReading:
        recorded = getattr(model_config, cls.CONFIG_KEY, None)
        if not recorded:
            raise ScratchBertError(
                "this model was not fine-tuned by `scratchbert finetune --task question-answering`: its config.json has no "
                f"{cls.CONFIG_KEY!r} entry (max_length, doc_stride, n_best, max_answer_length); fine-tune it with that command."
            )
        return cls(**recorded)


def check_stride(tokenizer, questions: Sequence[str], reading: SpanReading) -> None:
    """Fail, saying what to change, when a window has no room for the context beside the longest question,
    or when consecutive windows would share all of that room (the tokenizer could not move on)."""
    longest = max(len(ids) for ids in tokenizer(list(questions), add_special_tokens=False)["input_ids"])
    room = reading.max_length - longest - 3  # [CLS] question [SEP] context [SEP]
    if room < 1:
        raise ScratchBertError(f"a question of {longest} tokens leaves no room for its context in windows of max_length {reading.max_length}: raise --max-length.")
    if reading.doc_stride >= room:
        raise ScratchBertError(
            f"doc_stride {reading.doc_stride} must be less than the {room} context tokens a window has (max_length {reading.max_length} minus "
            f"the longest question's {longest} tokens and 3 special tokens): lower --doc-stride or raise --max-length."
        )


def tokenize_windows(batch: dict, indices: Sequence[int], tokenizer, reading: SpanReading) -> dict:
    """`datasets.map` over questions -> their windows, each with the question it reads (`example`: the
    question's row in the split), the character span of each context piece (`offset_mapping`; None for the
    question and special tokens) and the first answer's first and last piece (`start_positions`,
    `end_positions`; [CLS] where the window lacks it)."""
    questions = [question.lstrip() for question in batch["question"]]  # run_qa.py: leading spaces only waste tokens
    encoded = tokenizer(
        questions, batch["context"], truncation="only_second", max_length=reading.max_length, stride=reading.doc_stride,
        return_overflowing_tokens=True, return_offsets_mapping=True,
    )  # fmt: skip
    questions_of = encoded.pop("overflow_to_sample_mapping")  # (N,): the question of each window, in the batch
    encoded["example"], encoded["start_positions"], encoded["end_positions"] = [], [], []
    for window, question in enumerate(questions_of):
        context = [part == 1 for part in encoded.sequence_ids(window)]  # (T,): the context's pieces
        offsets = [tuple(span) if inside else None for span, inside in zip(encoded["offset_mapping"][window], context)]
        encoded["offset_mapping"][window] = offsets
        encoded["example"].append(indices[question])
        start, end = answer_pieces(offsets, batch["answers"][question])
        encoded["start_positions"].append(start)
        encoded["end_positions"].append(end)
    return encoded


def answer_pieces(offsets: Sequence[tuple[int, int] | None], answers: dict) -> tuple[int, int]:
    """The first and last piece of a window (`offsets`: each piece's characters, None outside the context)
    that hold the first answer's characters; [CLS] twice when the window does not hold all of them."""
    if not answers["text"]:
        return CLS_POSITION, CLS_POSITION
    first = answers["answer_start"][0]
    last = first + len(answers["text"][0])  # one past the answer's last character
    inside = [i for i, span in enumerate(offsets) if span is not None]
    if offsets[inside[0]][0] > first or offsets[inside[-1]][1] < last:
        return CLS_POSITION, CLS_POSITION
    start = next(i for i in inside if offsets[i][1] > first)  # the piece the answer's first character is in
    end = next(i for i in reversed(inside) if offsets[i][0] < last)  # the piece its last character is in
    return start, end


def best_answers(
    start_logits: np.ndarray, end_logits: np.ndarray, windows, contexts: Sequence[str], reading: SpanReading,
) -> list[dict]:  # fmt: skip
    """Each question's answer over all its windows: {"text", "start", "end" (characters of its context,
    end exclusive), "score" (start + end logit)}; the empty answer (start = end = 0, score: the [CLS]
    score) when no span is allowed or, with `reading.null_answers`, when [CLS] beats the best span.

    start_logits, end_logits (N, T), rows of `windows` (their `example` and `offset_mapping`); `contexts`
    (E,) by the question's row.
    """
    best = [None] * len(contexts)  # (score, start character, end character) of each question's best span
    null = [np.inf] * len(contexts)  # each question's smallest [CLS] score over its windows (run_qa.py)
    for window, (example, offsets) in enumerate(zip(windows["example"], windows["offset_mapping"])):
        starts, ends = start_logits[window], end_logits[window]  # (T,) each
        null[example] = min(null[example], float(starts[CLS_POSITION] + ends[CLS_POSITION]))
        for start, end in candidate_spans(starts, ends, offsets, reading):
            score = float(starts[start] + ends[end])
            if best[example] is None or score > best[example][0]:
                best[example] = (score, offsets[start][0], offsets[end][1])
    answers = []
    for example, context in enumerate(contexts):
        span = best[example]
        if span is None or (reading.null_answers and null[example] - span[0] > NULL_SCORE_DIFF_THRESHOLD):
            answers.append({"text": "", "start": 0, "end": 0, "score": null[example]})
        else:
            answers.append({"text": context[span[1] : span[2]], "start": span[1], "end": span[2], "score": span[0]})
    return answers


def candidate_spans(starts: np.ndarray, ends: np.ndarray, offsets: Sequence, reading: SpanReading) -> list[tuple[int, int]]:
    """The allowed (start, end) pieces among a window's `n_best` best starts and ends: both in the context,
    end >= start, at most `max_answer_length` pieces. Positions past the window's pieces (batch padding) are skipped."""
    length = len(offsets)
    top_starts = np.argsort(starts[:length])[::-1][: reading.n_best]
    top_ends = np.argsort(ends[:length])[::-1][: reading.n_best]
    return [
        (int(start), int(end)) for start in top_starts for end in top_ends
        if offsets[start] is not None and offsets[end] is not None and start <= end < start + reading.max_answer_length
    ]  # fmt: skip
