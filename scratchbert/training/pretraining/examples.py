"""Pretraining data: documents -> sentences -> token ids -> next-sentence-prediction pairs.

BERT is pretrained on pairs of text segments `[CLS] A [SEP] B [SEP]`. Half of the
time B really follows A in the same document (label 0, "IsNext"); otherwise B is
taken from another document (label 1, "NotNext"). The masked-language-model masks
are *not* made here: `DataCollatorForPretraining` draws fresh ones every time a
batch is formed, so every epoch sees different masks ("dynamic masking").

The pipeline, one function per step:

    ingestion.default_corpus_documents() / ingestion.load_documents(source) -> documents (text)
    split_sentences(text)                                  -> sentences of one document
    tokenize_documents(documents, tokenizer)               -> Dataset["sentences"]: token ids per sentence
    build_pretraining_dataset(documents, tokenizer, ...)   -> Dataset[input_ids, token_type_ids,
                                                              attention_mask, next_sentence_label]
    build_packed_dataset(documents, tokenizer, ...)        -> Dataset[input_ids, token_type_ids, attention_mask]:
                                                              contiguous text, no pairs (MLM without NSP)

`build_pretraining_dataset` runs the last two steps. Tokenization does not depend on
the seed, so a training loop can tokenize once and re-pair every epoch with
`build_pretraining_dataset(tokenized, tokenizer, seed=seed + epoch)`.

Every step is a `datasets.map` over documents; `num_proc` spreads it over processes
(`available_cores()` by default in `scratchbert pretrain`) and the examples are the same for
any number of them. `run_setup.progress_bars(False)` silences datasets' bars around any of these calls.

Labels follow transformers' `BertForPreTraining`: `next_sentence_label` 0 means B
continues A, 1 means B is random.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import datasets
from datasets.arrow_dataset import Column
from datasets.fingerprint import Hasher

from scratchbert.errors import ScratchBertError

logger = logging.getLogger(__name__)

# [CLS] A [SEP] B [SEP]: three positions of every example are special tokens.

# The smallest example holds one token of A and one of B besides the special tokens.
NUM_SPECIAL_TOKENS = 3  # [CLS] A [SEP] B [SEP]
MIN_MAX_SEQ_LENGTH = NUM_SPECIAL_TOKENS + 2


def check_max_seq_length(max_seq_length) -> None:
    """The one lower bound on example length, for every recipe (sentence pairs need the most room)."""
    if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, int) or max_seq_length < MIN_MAX_SEQ_LENGTH:
        raise ScratchBertError(
            f"max_seq_length={max_seq_length!r} is too small: [CLS] A [SEP] B [SEP] needs {NUM_SPECIAL_TOKENS} special "
            f"tokens plus at least one token each for A and B; use max_seq_length >= {MIN_MAX_SEQ_LENGTH} (BERT uses 128 and 512)"
        )


PRETRAINING_FEATURES = datasets.Features(
    {
        "input_ids": datasets.List(datasets.Value("int32")),
        "token_type_ids": datasets.List(datasets.Value("int8")),
        "attention_mask": datasets.List(datasets.Value("int8")),
        "next_sentence_label": datasets.Value("int64"),
    }
)

TOKENIZED_FEATURES = datasets.Features({"sentences": datasets.List(datasets.List(datasets.Value("int32")))})

TokenIds = list[int]

Documents = Sequence[str] | datasets.Dataset | datasets.IterableDataset


def _worker_processes(num_proc: int | None, num_documents: int, batch_size: int) -> int | None:
    """`num_proc` for a `map` over `num_documents`: None (this process) unless each worker gets a whole batch.

    Starting a worker costs more than a small corpus takes to process, so at most one worker
    per `batch_size` documents is started.
    """
    workers = min(num_proc or 1, -(-num_documents // batch_size))
    return workers if workers > 1 else None


# A Latin-script sentence ends with ., !, ?, or … (runs such as "?!" or "..." too), maybe
# followed by closing quotes or brackets, and then a space. Full-width CJK terminators
# end a sentence with or without a following space.
_SENTENCE_END = re.compile(r"(?P<latin>[.!?…]+[\"'”’»)\]]*)(?= )|(?P<cjk>[。！？]+[」』”’)）\]]*)")

# Abbreviations that end in a period but almost never end a sentence.
_ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "cf", "al", "fig", "approx"})


def split_sentences(text: str) -> list[str]:
    """Split one document into sentences, with simple rules and no dependencies.

    Rules, in order:
    1. A blank line (a line of only whitespace) always ends a sentence: paragraphs,
       headings and code blocks never run into each other.
    2. Inside a paragraph, line breaks are wrapping: lines are joined and every run of
       whitespace becomes one space.
    3. A sentence ends after ".", "!", "?" or "…" (runs allowed, closing quotes and
       brackets included) followed by a space, unless the next word starts with a
       lowercase letter ("e.g. this"), or the period closes a known abbreviation
       ("Dr.", "vs.", "et al."), an initial ("J. Smith") or a dotted abbreviation
       ("e.g.", "U.S.").
    4. "。", "！" and "？" end a sentence even without a following space.

    Nothing is dropped or changed except whitespace: joining the sentences gives back
    every non-whitespace character of `text`, in order. Each sentence is non-empty,
    has no leading or trailing whitespace and no line break.

    >>> split_sentences("BERT reads text. It predicts masked words!\\nDr. Who? yes.")
    ['BERT reads text.', 'It predicts masked words!', 'Dr. Who? yes.']
    """
    sentences: list[str] = []
    for paragraph in _paragraphs(text):
        sentences.extend(_split_paragraph(paragraph))
    return sentences


def _paragraphs(text: str) -> Iterator[str]:
    lines: list[str] = []
    for line in text.splitlines():
        if line.strip():
            lines.append(line)
        elif lines:
            yield " ".join(" ".join(lines).split())
            lines = []
    if lines:
        yield " ".join(" ".join(lines).split())


def _split_paragraph(paragraph: str) -> list[str]:
    sentences, start = [], 0
    for match in _SENTENCE_END.finditer(paragraph):
        if match.group("latin") is not None and not _is_latin_sentence_end(paragraph, match):
            continue
        sentence = paragraph[start : match.end()].strip()
        if sentence:
            sentences.append(sentence)
        start = match.end()
    rest = paragraph[start:].strip()
    if rest:
        sentences.append(rest)
    return sentences


def _is_latin_sentence_end(paragraph: str, match: re.Match) -> bool:
    next_char = paragraph[match.end() + 1 : match.end() + 2]  # the pattern guarantees a space, then text
    if next_char.islower():
        return False
    if match.group("latin") != ".":
        return True
    word = paragraph[paragraph.rfind(" ", 0, match.start()) + 1 : match.start()].lstrip("\"'“‘«([")
    if word.lower() in _ABBREVIATIONS:
        return False
    if len(word) == 1 and word.isupper():  # an initial: "J. Smith"
        return False
    return re.fullmatch(r"(?:\w\.)+\w", word) is None  # "e.g", "U.S": dotted abbreviations


def _token_ids(texts: list[str], tokenizer) -> list[TokenIds]:
    """WordPiece ids of each text, no special tokens: the Rust tokenizer's own batch call when there is one.

    `encode_batch_fast` is what `tokenizer(texts)` runs underneath, without the offsets and
    the Python-side `BatchEncoding` (about a quarter of the time per core); the ids are the same.
    Only while the Rust tokenizer has no padding or truncation switched on: a tokenizer.json may
    carry them (sentence-transformers' do), and they would pad and cut the documents. transformers'
    own call, used then, switches them off for good (as it does for any call without padding and
    truncation), so the next batch takes the fast path.
    """
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch_fast") and backend.padding is None and backend.truncation is None:
        return [encoding.ids for encoding in backend.encode_batch_fast(texts, add_special_tokens=False)]
    return tokenizer(texts, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False, verbose=False)["input_ids"]


def _tokenize_batch(batch: dict, tokenizer, sentences: bool = True) -> dict:
    """{"text": [document]} -> {"sentences": [[token ids of each sentence]]}, dropping empty sentences.

    With `sentences=False` each document is tokenized whole, as one "sentence": the ids are the
    same as the sentences' ids run together (the tokenizer splits at whitespace and punctuation
    first, and sentences end there), and there is no Python splitter to pay for.
    """
    if not sentences:
        return {"sentences": [[ids] if ids else [] for ids in _token_ids([text or "" for text in batch["text"]], tokenizer)]}
    per_document = [split_sentences(text) if text else [] for text in batch["text"]]
    ids = _token_ids([sentence for sentences in per_document for sentence in sentences], tokenizer)
    grouped, position = [], 0
    for document_sentences in per_document:
        grouped.append([sentence_ids for sentence_ids in ids[position : position + len(document_sentences)] if sentence_ids])
        position += len(document_sentences)
    return {"sentences": grouped}


def tokenize_documents(
    documents: Documents,
    tokenizer,
    *,
    num_proc: int | None = None,
    batch_size: int = 1000,
    sentences: bool = True,
) -> datasets.Dataset | datasets.IterableDataset:
    """Split documents into sentences and tokenize them, with `datasets.map(batched=True)`.

    Args:
        documents: a list of strings, a `Dataset` / `IterableDataset` with a "text" column, or
            a dataset's column (`dataset["text"]`, mapped over without copying it).
        tokenizer: any transformers tokenizer; special tokens are not added here.
        num_proc: processes for `map` (ignored for an `IterableDataset`, which is lazy); at
            most one per `batch_size` documents is started. Each document is tokenized on its
            own, so the result does not depend on it.
        batch_size: documents per `map` batch.
        sentences: False tokenizes each document whole, as one "sentence" (what packing
            needs: it runs a document's sentences together anyway), without the splitter.

    Returns:
        Dataset (IterableDataset for an IterableDataset) with one column "sentences":
        per document, a list of sentences, each a non-empty list of token ids. Documents
        keep their order and count (an empty document has no sentences).
    """
    if isinstance(documents, Column) and isinstance(documents.source, datasets.Dataset):
        # A column of a cached dataset (`dataset["text"]`): map over its table, which keeps the cache.
        column = documents.column_name
        documents = documents.source.select_columns([column])
        if column != "text":
            documents = documents.rename_column(column, "text")
    if isinstance(documents, (datasets.Dataset, datasets.IterableDataset)):
        if documents.column_names is not None and "text" not in documents.column_names:
            raise ScratchBertError(
                f"the documents dataset needs a 'text' column (it has {documents.column_names}); "
                "load it with load_documents(..., text_column=...)"
            )
        dataset = documents
    elif isinstance(documents, str):
        raise ValueError("documents must be a list of strings or a dataset, not one string; wrap it: [text]")
    else:
        dataset = datasets.Dataset.from_dict({"text": list(documents)}, features=datasets.Features({"text": datasets.Value("string")}))
    remove = dataset.column_names if dataset.column_names is not None else ["text"]
    map_kwargs = {"batched": True, "batch_size": batch_size, "remove_columns": remove, "fn_kwargs": {"tokenizer": tokenizer, "sentences": sentences}}
    if isinstance(dataset, datasets.IterableDataset):
        return dataset.map(_tokenize_batch, features=TOKENIZED_FEATURES, **map_kwargs)
    return dataset.map(
        _tokenize_batch,
        features=TOKENIZED_FEATURES,
        num_proc=_worker_processes(num_proc, len(dataset), batch_size),
        new_fingerprint=Hasher.hash([dataset._fingerprint, _code_fingerprint(), _tokenizer_fingerprint(tokenizer), sentences]),
        desc="Splitting and tokenizing" if sentences else "Tokenizing",
        **map_kwargs,
    )


def _tokenized(documents: Documents, tokenizer, num_proc: int | None, batch_size: int, sentences: bool = True):
    """`documents` as `tokenize_documents` returns them: already so (a "sentences" column), or tokenized now."""
    columns = getattr(documents, "column_names", None) or []
    if "sentences" in columns and "text" not in columns:
        return documents
    return tokenize_documents(documents, tokenizer, num_proc=num_proc, batch_size=batch_size, sentences=sentences)


def _code_fingerprint() -> str:
    """A hash of this file's source, part of every cache key: editing the splitter or the
    pairing code must not reuse results cached by the old code."""
    return Hasher.hash(Path(__file__).read_bytes())


def _tokenizer_fingerprint(tokenizer) -> str:
    """A cache key for a tokenizer that is cheap to compute (pickling the whole tokenizer,
    as `datasets` does by default, takes a quarter of a second per map call)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return Hasher.hash(tokenizer)
    state = json.loads(backend.to_str())
    state.pop("truncation", None)  # call-time settings, not part of what the tokenizer produces
    state.pop("padding", None)
    return Hasher.hash(type(tokenizer).__name__ + json.dumps(state, sort_keys=True))  # one string hashes fast


def cut_long_sentences(sentences: Sequence[TokenIds], max_num_tokens: int) -> list[TokenIds]:
    """Cut every sentence longer than half an example into consecutive pieces of at most half.

    A sentence that cannot share an example with another one (an unpunctuated wall of
    text, a long code listing) would otherwise be mostly truncated away. Cut into
    pieces of ceil(max_num_tokens / 2) tokens, two neighbouring pieces fill one
    example as A and B, and since the pieces are consecutive text, IsNext stays true.

    Args:
        sentences: token ids per sentence.
        max_num_tokens: room for A and B together in one example.
    Returns:
        the pieces, in order; each at most ceil(max_num_tokens / 2) long.
    """
    piece = (max_num_tokens + 1) // 2
    pieces: list[TokenIds] = []
    for sentence in sentences:
        for start in range(0, len(sentence), piece):
            pieces.append(list(sentence[start : start + piece]))
    return pieces


def truncate_pair(tokens_a: TokenIds, tokens_b: TokenIds, max_num_tokens: int, rng: random.Random) -> tuple[TokenIds, TokenIds]:
    """Shorten the longer segment one token at a time, from a random end, until the pair fits.

    Removing from either end at random (as BERT's data pipeline does) keeps the model
    from learning that segments always start or end at a sentence boundary. Returns new
    lists; both keep at least one token when `max_num_tokens >= 2`.
    """
    a_start, a_end, b_start, b_end = 0, len(tokens_a), 0, len(tokens_b)
    while (a_end - a_start) + (b_end - b_start) > max_num_tokens:
        take_from_a = (a_end - a_start) > (b_end - b_start)
        from_front = rng.random() < 0.5
        if take_from_a and from_front:
            a_start += 1
        elif take_from_a:
            a_end -= 1
        elif from_front:
            b_start += 1
        else:
            b_end -= 1
    return tokens_a[a_start:a_end], tokens_b[b_start:b_end]


def create_pairs_from_document(
    sentences: Sequence[TokenIds],
    random_document: Callable[[random.Random], Sequence[TokenIds]] | None,
    rng: random.Random,
    *,
    max_num_tokens: int,
    short_seq_prob: float = 0.1,
    nsp_probability: float = 0.5,
) -> list[tuple[TokenIds, TokenIds, int]]:
    """One document's (segment A, segment B, next_sentence_label) pairs, as in BERT: label 0 IsNext,
    1 NotNext, each segment non-empty and len(A) + len(B) <= max_num_tokens.

    sentences: the document's sentences as token ids, each non-empty (best cut with
    `cut_long_sentences`, as the pipeline does). random_document: draws the sentences of a
    *different* document for NotNext pairs; None when there is none (every pair is IsNext).
    rng: the only source of randomness, so a seed fixes the result. max_num_tokens: room for
    A and B together (max_seq_length minus 3 special tokens), >= 2. short_seq_prob: chance of
    aiming for a random shorter length, so the model also sees the short inputs of fine-tuning.
    nsp_probability: chance that B comes from a random document (label 1).

    The walk: gather sentences into a chunk until it reaches the target length (or the
    document ends); cut the chunk at a random sentence boundary into A and B. With probability
    `nsp_probability`, B is replaced by consecutive sentences of another document and the
    chunk's unused sentences start the next chunk. The longer segment is then truncated from
    random ends until the pair fits.

    One departure from BERT's script: a chunk of a single sentence is never paired with a
    random B; it grows by the next sentence instead (a lone last sentence is dropped). BERT forces
    such a chunk to NotNext, skewing short documents towards NotNext; here every label is drawn.
    """
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = rng.randint(2, max_num_tokens)
    pairs: list[tuple[TokenIds, TokenIds, int]] = []
    chunk: list[TokenIds] = []
    chunk_length = 0
    i = 0
    while i < len(sentences):
        chunk.append(sentences[i])
        chunk_length += len(sentences[i])
        at_end = i == len(sentences) - 1
        i += 1
        if not (at_end or chunk_length >= target):
            continue
        if len(chunk) == 1:
            if at_end:
                break  # a lone last sentence has no B to pair with (see the docstring)
            continue  # a single sentence cannot be cut into A and B: take the next one too
        a_end = rng.randint(1, len(chunk) - 1)
        tokens_a = [token for sentence in chunk[:a_end] for token in sentence]
        is_random_next = random_document is not None and rng.random() < nsp_probability
        if is_random_next:
            tokens_b = _random_next_segment(random_document(rng), target - len(tokens_a), rng)
            i -= len(chunk) - a_end  # put the unused sentences back
        else:
            tokens_b = [token for sentence in chunk[a_end:] for token in sentence]
        tokens_a, tokens_b = truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
        pairs.append((tokens_a, tokens_b, int(is_random_next)))
        chunk, chunk_length = [], 0
    return pairs


def _random_next_segment(other: Sequence[TokenIds], target_length: int, rng: random.Random) -> TokenIds:
    """A NotNext segment B: consecutive sentences of another document, from a random one on, until `target_length` tokens."""
    tokens: TokenIds = []
    for sentence in other[rng.randrange(len(other)) :]:
        tokens.extend(sentence)
        if len(tokens) >= target_length:
            break
    return tokens


def _document_rng(seed: int, index: int) -> random.Random:
    # One generator per document: the result does not depend on batch size, num_proc or order.
    return random.Random(f"scratchbert-nsp/{seed}/{index}")


def _empty_columns() -> dict[str, list]:
    return {name: [] for name in PRETRAINING_FEATURES}


def _append_example(columns: dict[str, list], tokens_a: TokenIds, tokens_b: TokenIds, label: int, cls_id: int, sep_id: int):
    """[CLS] A [SEP] B [SEP]; token type 0 up to and including the first [SEP], 1 after it."""
    columns["input_ids"].append([cls_id, *tokens_a, sep_id, *tokens_b, sep_id])
    columns["token_type_ids"].append([0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1))
    columns["attention_mask"].append([1] * (len(tokens_a) + len(tokens_b) + NUM_SPECIAL_TOKENS))
    columns["next_sentence_label"].append(label)


def _count_segments(batch: dict, max_num_tokens: int) -> dict:
    return {"num_segments": [len(cut_long_sentences(sentences, max_num_tokens)) for sentences in batch["sentences"]]}


def _pairs_of_documents(pieces_of, indices, partner_of, *, seed, max_num_tokens, short_seq_prob, nsp_probability, cls_id, sep_id) -> dict:
    """The loop both map functions share: each document's sentence pairs, as example columns.

    pieces_of: each document's segments (`cut_long_sentences`); indices: their dataset indices
    (which seed their generators); partner_of(slot, rng): a random *other* document's segments
    for NotNext, or None when NotNext pairs cannot (or need not) be drawn.
    """
    columns = _empty_columns()
    for slot, (pieces, index) in enumerate(zip(pieces_of, indices)):
        random_document = (lambda rng, slot=slot: partner_of(slot, rng)) if partner_of is not None else None
        pairs = create_pairs_from_document(
            pieces,
            random_document,
            _document_rng(seed, index),
            max_num_tokens=max_num_tokens,
            short_seq_prob=short_seq_prob,
            nsp_probability=nsp_probability,
        )
        for tokens_a, tokens_b, label in pairs:
            _append_example(columns, tokens_a, tokens_b, label, cls_id, sep_id)
    return columns


def _pairs_for_batch(batch: dict, indices: list[int], *, documents, max_num_tokens, nsp_probability, **pairing) -> dict:
    """Map function over usable documents; NotNext segments come from anywhere in `documents`."""

    # Reading a document from Arrow costs its full length; small corpora draw the same
    # documents again and again, so keep recent ones for the rest of this batch.
    @functools.lru_cache(maxsize=256)
    def document_pieces(index: int) -> list[TokenIds]:
        return cut_long_sentences(documents[index]["sentences"], max_num_tokens)

    def partner_of(slot: int, rng: random.Random) -> list[TokenIds]:
        other = rng.randrange(len(documents) - 1)
        return document_pieces(other + (other >= indices[slot]))  # uniform over the other documents

    pieces_of = [cut_long_sentences(sentences, max_num_tokens) for sentences in batch["sentences"]]
    partner = partner_of if nsp_probability > 0 else None
    return _pairs_of_documents(pieces_of, indices, partner, max_num_tokens=max_num_tokens, nsp_probability=nsp_probability, **pairing)


def _pairs_for_stream_batch(batch: dict, indices: list[int], *, max_num_tokens, nsp_probability, **pairing) -> dict:
    """Streaming variant: NotNext segments come from the other documents of the same batch."""
    documents = [cut_long_sentences(sentences, max_num_tokens) for sentences in batch["sentences"]]
    usable = [position for position, pieces in enumerate(documents) if len(pieces) >= 2]

    def partner_of(slot: int, rng: random.Random) -> list[TokenIds]:
        other = rng.randrange(len(usable) - 1)
        return documents[usable[other + (other >= slot)]]

    partner = partner_of if nsp_probability > 0 and len(usable) > 1 else None
    pieces_of, kept_indices = [documents[p] for p in usable], [indices[p] for p in usable]
    return _pairs_of_documents(pieces_of, kept_indices, partner, max_num_tokens=max_num_tokens, nsp_probability=nsp_probability, **pairing)


def build_pretraining_dataset(
    documents: Documents,
    tokenizer,
    *,
    max_seq_length: int = 128,
    short_seq_prob: float = 0.1,
    nsp_probability: float = 0.5,
    seed: int = 0,
    num_proc: int | None = None,
    batch_size: int = 1000,
) -> datasets.Dataset | datasets.IterableDataset:
    """Build BERT's pretraining examples: `[CLS] A [SEP] B [SEP]` with a next-sentence label.

    documents: a list of strings; a `Dataset` with a "text" column (see `load_documents`); the
    output of `tokenize_documents` (a "sentences" column: tokenization is then skipped, which is
    what a loop that re-pairs every epoch wants); or an `IterableDataset` of either, which gives
    a lazy `IterableDataset` of examples. tokenizer: a transformers tokenizer with [CLS] and
    [SEP]. max_seq_length: the longest example, special tokens included (>= `MIN_MAX_SEQ_LENGTH`).
    short_seq_prob: per document, the chance of a random shorter target length. nsp_probability:
    the chance that segment B comes from another document (label 1). seed: fixes the pairing
    (`seed + epoch` for a new pairing every epoch); each document draws from its own generator
    seeded by (seed, document index), so the result does not depend on `num_proc` or
    `batch_size`. num_proc: worker processes for the `datasets.map` calls (with several training
    processes, call this under `accelerator.main_process_first()` so the others reuse the main
    process's cache). batch_size: documents per `map` batch; when streaming also the pool that
    NotNext segments are drawn from (the other documents of the same batch).

    Returns a Dataset with columns input_ids (int32), token_type_ids (0 for `[CLS] A [SEP]`, 1 for
    `B [SEP]`), attention_mask (all 1: the collator pads) and next_sentence_label (0 IsNext,
    1 NotNext), at most `max_seq_length` tokens each, in document order (shuffle in the DataLoader).
    Empty documents and documents of a single sentence (after over-long sentences are cut, see
    `cut_long_sentences`) yield no example, counted and logged; an empty result is an error, as
    are a max_seq_length below `MIN_MAX_SEQ_LENGTH`, probabilities outside [0, 1], a tokenizer
    without [CLS]/[SEP], and NotNext pairs asked for with only one usable document.
    """
    pair_kwargs = _pair_options(tokenizer, max_seq_length, short_seq_prob, nsp_probability, seed)
    tokenized = _tokenized(documents, tokenizer, num_proc, batch_size)
    if isinstance(tokenized, datasets.IterableDataset):
        return tokenized.map(
            _pairs_for_stream_batch,
            batched=True,
            batch_size=batch_size,
            with_indices=True,
            remove_columns=["sentences"],
            features=PRETRAINING_FEATURES,
            fn_kwargs=pair_kwargs,
        )
    usable = _documents_with_pairs(tokenized, pair_kwargs["max_num_tokens"], nsp_probability, num_proc, batch_size)
    examples = _pairs_of(usable, pair_kwargs, num_proc, batch_size)
    labels = examples["next_sentence_label"]
    logger.info(
        "Built %d pretraining examples (%d NotNext) from %d documents, max_seq_length=%d, seed=%d.",
        len(examples), sum(labels), len(usable), max_seq_length, seed,
    )
    return examples


def _pair_options(tokenizer, max_seq_length: int, short_seq_prob: float, nsp_probability: float, seed: int) -> dict:
    """`build_pretraining_dataset`'s options, checked, as the keyword arguments of its pairing functions."""
    check_max_seq_length(max_seq_length)
    for name, value in (("short_seq_prob", short_seq_prob), ("nsp_probability", nsp_probability)):
        if not 0.0 <= value <= 1.0:
            raise ScratchBertError(f"{name}={value!r} is not a probability; use a value in [0, 1]")
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is None or sep_id is None:
        raise ScratchBertError("the tokenizer has no [CLS] or [SEP] token; BERT pairs need both (set cls_token and sep_token)")
    return {
        "seed": seed,
        "max_num_tokens": max_seq_length - NUM_SPECIAL_TOKENS,
        "short_seq_prob": short_seq_prob,
        "nsp_probability": nsp_probability,
        "cls_id": cls_id,
        "sep_id": sep_id,
    }


def _pairs_of(usable: datasets.Dataset, pair_kwargs: dict, num_proc: int | None, batch_size: int) -> datasets.Dataset:
    """The sentence-pair examples of the documents that make pairs (cached by datasets)."""
    examples = usable.map(
        _pairs_for_batch,
        batched=True,
        batch_size=batch_size,
        with_indices=True,
        remove_columns=usable.column_names,
        features=PRETRAINING_FEATURES,
        fn_kwargs={"documents": usable, **pair_kwargs},
        num_proc=_worker_processes(num_proc, len(usable), batch_size),
        # The documents ride along in fn_kwargs; fingerprint them by their own fingerprint
        # rather than by pickling their content.
        new_fingerprint=Hasher.hash([usable._fingerprint, _code_fingerprint(), pair_kwargs]),
        desc="Building sentence pairs",
    )
    if len(examples) == 0:
        raise ScratchBertError("no pretraining examples were built from the documents; check that they hold text")
    return examples


def _documents_with_pairs(tokenized: datasets.Dataset, max_num_tokens: int, nsp_probability: float, num_proc, batch_size: int):
    """The tokenized documents that yield a sentence pair (two segments or more), the others counted and logged."""
    counts = (
        list(
            tokenized.map(
                _count_segments,
                batched=True,
                batch_size=batch_size,
                remove_columns=tokenized.column_names,
                fn_kwargs={"max_num_tokens": max_num_tokens},
                num_proc=_worker_processes(num_proc, len(tokenized), batch_size),
                desc="Counting sentences",
            )["num_segments"]
        )
        if len(tokenized) > 0
        else []  # map does not run its function on an empty dataset
    )
    usable_indices = [index for index, count in enumerate(counts) if count >= 2]
    num_empty, num_single = counts.count(0), counts.count(1)
    if num_empty or num_single:
        logger.warning(
            "Skipped %d of %d documents: %d empty, %d of a single sentence (next-sentence pairs need two).",
            num_empty + num_single, len(counts), num_empty, num_single,
        )
    if not usable_indices:
        raise ScratchBertError(
            f"no pretraining examples: none of the {len(counts)} documents has two sentences "
            f"({num_empty} empty, {num_single} of one sentence). Next-sentence pairs need documents of several "
            "sentences; if your file holds one sentence per line, separate documents by blank lines, not sentences"
        )
    if len(usable_indices) < 2 and nsp_probability > 0:
        raise ScratchBertError(
            "NotNext pairs take segment B from a different document, but only one document has two sentences; "
            "add documents (separated by blank lines), or pass nsp_probability=0"
        )
    return tokenized.select(usable_indices) if len(usable_indices) < len(counts) else tokenized


PACKED_FEATURES = datasets.Features(
    {
        "input_ids": datasets.List(datasets.Value("int32")),
        "token_type_ids": datasets.List(datasets.Value("int8")),
        "attention_mask": datasets.List(datasets.Value("int8")),
    }
)


def pack_token_stream(documents: Sequence[Sequence[TokenIds]], block_length: int, separator_id: int) -> list[TokenIds]:
    """Concatenate documents (each a list of sentences) into one stream and cut it into blocks.

    Sentences of a document follow each other directly; a `separator_id` token marks where
    one document ends and the next begins (RoBERTa's FULL-SENTENCES: blocks may cross
    document boundaries, and the separator tells the model they do). Every block is exactly
    `block_length` tokens long; the tail of the stream that does not fill one is dropped.
    """
    stream: TokenIds = []
    for sentences in documents:
        if not sentences:
            continue
        if stream:
            stream.append(separator_id)
        for sentence in sentences:
            stream.extend(sentence)
    return [stream[start : start + block_length] for start in range(0, len(stream) - block_length + 1, block_length)]


def _packed_blocks_for_batch(
    batch: dict, indices: list[int], *, documents, group_size: int, block_length: int, cls_id: int, sep_id: int
) -> dict:
    """Map function: the full-length `[CLS] block [SEP]` examples of each group of documents that starts in this batch.

    The token stream is cut per group of `group_size` documents, counted from the first
    document, not per map batch: the blocks are then the same whatever batches and processes
    `map` hands out. A group that runs on past this batch (a worker's shard may end mid-group)
    is read whole from `documents` (None when streaming, whose batches are the groups); a
    group that started in an earlier batch is that batch's.
    """
    first, end = indices[0], indices[-1] + 1  # map batches are contiguous runs of documents
    blocks: list[TokenIds] = []
    for start in range(-(-first // group_size) * group_size, end, group_size):
        stop = min(start + group_size, end if documents is None else len(documents))
        group = batch["sentences"][start - first : stop - first] if stop <= end else documents[start:stop]["sentences"]
        blocks.extend(pack_token_stream(group, block_length, sep_id))
    length = block_length + 2
    return {
        "input_ids": [[cls_id, *block, sep_id] for block in blocks],
        "token_type_ids": [[0] * length for _ in blocks],
        "attention_mask": [[1] * length for _ in blocks],
    }


def build_packed_dataset(
    documents: Documents,
    tokenizer,
    *,
    max_seq_length: int = 128,
    num_proc: int | None = None,
    batch_size: int = 1000,
) -> datasets.Dataset | datasets.IterableDataset:
    """MLM examples of contiguous text packed to exactly `max_seq_length` tokens: no padding, no NSP.

    `[CLS] t1 t2 ... [SEP]`, all of segment 0, cut from the documents' token stream (see
    `pack_token_stream`). This is the input format RoBERTa found best for masked-language
    modelling alone (FULL-SENTENCES), and every position of every example is real text,
    so no compute goes to padding and the model learns from full-length context.

    Args:
        documents: as for `build_pretraining_dataset` (strings, a "text" dataset, the
            output of `tokenize_documents`, or an `IterableDataset` of either).
        max_seq_length: tokens per example, [CLS] and [SEP] included (at least
            `MIN_MAX_SEQ_LENGTH`, the one bound of every recipe: `check_max_seq_length`).
        num_proc: processes for the `map` calls; the examples do not depend on it.
        batch_size: documents per `map` batch and per packing group: the stream is cut per
            group of this many documents, so the last partial block of each group (at most
            max_seq_length - 3 tokens) is dropped.

    Returns:
        Dataset (IterableDataset when streaming) with input_ids, token_type_ids (all 0) and
        attention_mask (all 1), every example `max_seq_length` long, in corpus order.

    Raises:
        ValueError: max_seq_length below `MIN_MAX_SEQ_LENGTH`; a tokenizer without [CLS]/[SEP]; text too
            short to fill a single example.
    """
    check_max_seq_length(max_seq_length)
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is None or sep_id is None:
        raise ScratchBertError("the tokenizer has no [CLS] or [SEP] token; BERT examples need both (set cls_token and sep_token)")
    tokenized = _tokenized(documents, tokenizer, num_proc, batch_size, sentences=False)
    pack_kwargs = {"group_size": batch_size, "block_length": max_seq_length - 2, "cls_id": cls_id, "sep_id": sep_id}
    map_kwargs = {"batched": True, "batch_size": batch_size, "with_indices": True, "remove_columns": ["sentences"], "features": PACKED_FEATURES}
    if isinstance(tokenized, datasets.IterableDataset):
        return tokenized.map(_packed_blocks_for_batch, fn_kwargs={"documents": None, **pack_kwargs}, **map_kwargs)
    examples = tokenized.map(
        _packed_blocks_for_batch,
        fn_kwargs={"documents": tokenized, **pack_kwargs},
        num_proc=_worker_processes(num_proc, len(tokenized), batch_size),
        # The documents ride along in fn_kwargs: fingerprint them by their own fingerprint.
        new_fingerprint=Hasher.hash([tokenized._fingerprint, _code_fingerprint(), pack_kwargs]),
        desc="Packing text into blocks",
        **map_kwargs,
    )
    if len(examples) == 0:
        raise ScratchBertError(
            f"no pretraining examples: the text holds fewer than the {max_seq_length - 2} tokens one packed example needs. "
            "Add text or lower --max-seq-length"
        )
    logger.info("Packed %d examples of %d tokens from %d documents.", len(examples), max_seq_length, len(tokenized))
    return examples


def build_examples(documents: Documents, tokenizer, *, packing: str, seed: int, max_seq_length: int, nsp_probability: float,
                   short_seq_prob: float, num_proc: int | None = None) -> datasets.Dataset | datasets.IterableDataset:
    """A recipe's examples from documents (text or tokenized; a Dataset or a stream): `packing` "full-sentences"
    packs text to exactly `max_seq_length` tokens (`build_packed_dataset`), "sentence-pairs" makes BERT's
    A/B pairs (`build_pretraining_dataset`; NotNext partners with `nsp_probability`, the paper's 0.5)."""
    if packing == "full-sentences":
        return build_packed_dataset(documents, tokenizer, max_seq_length=max_seq_length, num_proc=num_proc)
    return build_pretraining_dataset(documents, tokenizer, seed=seed, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
                                     nsp_probability=nsp_probability, num_proc=num_proc)  # fmt: skip


__all__ = [
    "MIN_MAX_SEQ_LENGTH",
    "build_examples",
    "build_packed_dataset",
    "check_max_seq_length",
    "build_pretraining_dataset",
    "create_pairs_from_document",
    "cut_long_sentences",
    "pack_token_stream",
    "split_sentences",
    "tokenize_documents",
    "truncate_pair",
]
