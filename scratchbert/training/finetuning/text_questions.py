"""Questions on real text whose answers are real spans of it: a small extractive QA set built from
any English documents (by default the Python documentation CPython carries, `default_corpus_documents`).

No question-answering set is on the package registries here, so the QA tests and scripts/bench_qa.py
ask questions the text's own structure answers, two kinds:

    definition  "The X statement is Y." -> "What is the X statement?", answered by "Y"
    cloze       a sentence naming one quoted literal, "The "global" statement is a declaration ..."
                -> "The what statement is a declaration ...?", answered by "global" (SQuAD's cloze form)

A context is a run of consecutive paragraphs of one document, up to `context_words` words, so long
contexts are read in several windows. With `unanswerable` > 0, that share of the questions is put
to a context of another document (SQuAD v2's no-answer questions). Rows have the columns of the
`squad` dataset (id, title, context, question, answers {text, answer_start}); `squad_json` nests them
as SQuAD's JSON files are.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

PARAGRAPH_BREAK = re.compile(r"\n\s*\n")

# A sentence "The/A/An X is/are Y." (or ""X" is Y."): the subject asks, the predicate answers.
DEFINITION = re.compile(r'(?:^|(?<=\. ))((?:The|A|An) [^.,;:?!()"*]{2,40}?|"[^"]{1,30}") (is|are) ([^.;:?!"]{3,80}?)\.(?= |$)')

# A sentence (up to its full stop) that quotes exactly one literal: the literal is the answer.
SENTENCE = re.compile(r"[^.?!]*[.?!](?= |$)")
QUOTED = re.compile(r'"([^"]{1,30})"')

# Subjects that are not the name of a thing ("When a name is not found ...", "This is ...").
NOT_A_SUBJECT = re.compile(r"\b(?:when|if|this|that|which|whose|where|it)\b", re.IGNORECASE)


def contexts_of(document: str, context_words: int) -> list[str]:
    """A document's paragraphs, whitespace collapsed, joined in order into contexts of up to `context_words` words
    (a longer paragraph is a context of its own). Code, lists, tables and one-line headings are left out."""
    paragraphs = [" ".join(p.split()) for p in PARAGRAPH_BREAK.split(document)]
    paragraphs = [p for p in paragraphs if len(p.split()) >= 8 and not p.startswith(("*", ">>>", "...", "|", "+")) and "---" not in p and "===" not in p]
    contexts, current = [], []
    for paragraph in paragraphs:
        if current and len(" ".join(current + [paragraph]).split()) > context_words:
            contexts.append(" ".join(current))
            current = []
        current.append(paragraph)
    if current:
        contexts.append(" ".join(current))
    return contexts


def questions_of(context: str) -> list[tuple[str, str, int]]:
    """The (question, answer text, answer's first character) pairs the context's structure answers."""
    found = []
    for match in DEFINITION.finditer(context):
        subject, verb, answer = match.groups()
        if NOT_A_SUBJECT.search(subject):
            continue
        subject = subject if subject.startswith('"') else subject[0].lower() + subject[1:]
        found.append((f"What {verb} {subject}?", answer, match.start(3)))
    for sentence in SENTENCE.finditer(context):
        quoted = list(QUOTED.finditer(sentence.group()))
        if len(quoted) != 1 or len(sentence.group().split()) < 6:
            continue
        literal = quoted[0]
        text = sentence.group().strip()
        question = (text[: text.index(literal.group())] + "what" + text[text.index(literal.group()) + len(literal.group()) :]).rstrip(".?!") + "?"
        found.append((question, literal.group(1), sentence.start() + literal.start(1)))
    return found


def questions_from_text(
    documents: Sequence[str] | None = None, context_words: int = 150, unanswerable: float = 0.0, seed: int = 0
) -> list[dict]:
    """Rows of a QA set on `documents` (default: `default_corpus_documents()`), in document order;
    each answer's text is its context's characters at answer_start. `title` is the document's number,
    so a test set can be drawn from other documents than the training set's."""
    if documents is None:
        from scratchbert.ingestion import default_corpus_documents

        documents = default_corpus_documents()
    rng = random.Random(seed)
    rows = []
    for title, document in enumerate(documents):
        for context in contexts_of(document, context_words):
            for question, answer, start in questions_of(context):
                rows.append({"id": f"q{len(rows)}", "title": str(title), "context": context, "question": question,
                             "answers": {"text": [answer], "answer_start": [start]}})  # fmt: skip
    for row in rows:
        if rng.random() < unanswerable:  # put the question to a context of another document that lacks its answer
            others = [other for other in rows if other["title"] != row["title"] and row["answers"]["text"][0] not in other["context"]]
            if others:  # an answer every other context holds (a short word) stays answerable
                row["context"] = rng.choice(others)["context"]
                row["answers"] = {"text": [], "answer_start": []}
    return rows


def squad_json(rows: Sequence[dict], version: str = "v2.0") -> dict:
    """Flat rows as a SQuAD JSON file holds them: {"version", "data": [{"title", "paragraphs": [{"context", "qas"}]}]}."""
    titles: dict[str, dict[str, list]] = {}
    for row in rows:
        answers = [{"text": t, "answer_start": s} for t, s in zip(row["answers"]["text"], row["answers"]["answer_start"])]
        question = {"id": row["id"], "question": row["question"], "answers": answers, "is_impossible": not answers}
        titles.setdefault(row.get("title", ""), {}).setdefault(row["context"], []).append(question)
    data = [{"title": title, "paragraphs": [{"context": c, "qas": qas} for c, qas in contexts.items()]} for title, contexts in titles.items()]
    return {"version": version, "data": data}
