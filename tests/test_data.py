"""Pretraining data: sources, the sentence splitter, and BERT's next-sentence pairs.

Most pair tests run on a synthetic corpus in which every word is a distinct single
token of bert-base-uncased's vocabulary, so every token of an example points back to
exactly one position of one source document: "A and B are consecutive text" is then
checked exactly, not guessed from decoded strings.
"""

from __future__ import annotations

import doctest
import logging
import math
import random

import datasets
import huggingface_hub.constants
import pytest
import torch
import transformers
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from scratchbert.errors import ScratchBertError
from scratchbert.ingestion import default_corpus_documents, load_documents
from scratchbert.training.pretraining import examples as data_module
from scratchbert.training.pretraining.config import available_cores
from scratchbert.training.pretraining.examples import (
    build_packed_dataset,
    build_pretraining_dataset,
    create_pairs_from_document,
    cut_long_sentences,
    split_sentences,
    tokenize_documents,
    truncate_pair,
)
from scratchbert.training.pretraining.masking import DataCollatorForPretraining

datasets.disable_progress_bars()
MAX_SEQ_LENGTH = 24


@pytest.fixture(scope="module")
def bert_tokenizer(minilm_dir):
    """bert-base-uncased's WordPiece tokenizer (the vocabulary all-MiniLM-L6-v2 ships)."""
    return AutoTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def unique_word_corpus(bert_tokenizer):
    """Documents whose words are all different single tokens, one sentence per paragraph.

    Returns (documents, location, sentence_starts, sentence_ends): location maps a token id
    to (document, position in the document's token stream).
    """
    words = sorted(w for w in bert_tokenizer.get_vocab() if w.isascii() and w.isalpha() and w.islower() and len(w) >= 3)
    ids = bert_tokenizer(words, add_special_tokens=False)["input_ids"]
    singles = [(w, i[0]) for w, i in zip(words, ids) if len(i) == 1]
    rng = random.Random(1234)
    rng.shuffle(singles)
    documents, location, starts, ends = [], {}, set(), set()
    cursor = 0
    while cursor < len(singles) - 200:
        sentences = []
        position = 0
        for _ in range(rng.randint(2, 14)):
            length = rng.randint(1, 10)  # at most half an example: never cut into pieces
            sentence = singles[cursor : cursor + length]
            cursor += length
            starts.add((len(documents), position))
            for _, token_id in sentence:
                location[token_id] = (len(documents), position)
                position += 1
            ends.add((len(documents), position))
            sentences.append(" ".join(w for w, _ in sentence))
        documents.append("\n\n".join(sentences))  # blank lines: each paragraph is one sentence
    return documents, location, starts, ends


def parts(example, tokenizer):
    """Check the [CLS] A [SEP] B [SEP] layout and token types; return (A, B) token ids."""
    ids = list(example["input_ids"])
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert ids[0] == cls and ids[-1] == sep and ids.count(sep) == 2 and ids.count(cls) == 1
    first_sep = ids.index(sep)
    tokens_a, tokens_b = ids[1:first_sep], ids[first_sep + 1 : -1]
    assert tokens_a and tokens_b
    assert list(example["token_type_ids"]) == [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    assert list(example["attention_mask"]) == [1] * len(ids)
    return tokens_a, tokens_b


def span(tokens, location):
    """The (document, start, end) a segment was copied from; asserts it is one contiguous run."""
    places = [location[t] for t in tokens]
    document, start = places[0]
    assert places == [(document, start + k) for k in range(len(tokens))], "segment is not contiguous source text"
    return document, start, start + len(tokens)


# -- sources ---------------------------------------------------------------------


def test_default_corpus_is_cpythons_topics_without_heading_underlines():
    documents = default_corpus_documents()
    assert len(documents) > 70  # 79 in CPython 3.11; the topic list changes a little between versions
    assert sum(map(len, documents)) > 400_000
    assert documents == default_corpus_documents()
    assert documents[0].startswith('The "assert" statement\n\nAssert statements')
    assert not any(line.strip().startswith("****") for doc in documents for line in doc.splitlines())


def test_load_documents_from_blank_line_separated_files_and_globs(tmp_path):
    (tmp_path / "a.txt").write_text("First doc. Line two\nstill first.\n\n\n\nSecond doc.\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("  \nThird doc. Ünïcödé ok.\n", encoding="utf-8")
    expected = ["First doc. Line two\nstill first.", "Second doc.", "Third doc. Ünïcödé ok."]
    cache = tmp_path / "cache"
    assert load_documents(str(tmp_path / "*.txt"), cache_dir=cache)["text"] == expected
    assert load_documents([tmp_path / "a.txt", tmp_path / "b.txt"], cache_dir=cache)["text"] == expected
    per_file = load_documents(str(tmp_path / "*.txt"), one_document_per_file=True, cache_dir=cache)
    assert len(per_file) == 2 and per_file[0]["text"].startswith("First doc.")
    streamed = load_documents(str(tmp_path / "*.txt"), streaming=True)
    assert isinstance(streamed, datasets.IterableDataset)
    assert [row["text"] for row in streamed] == expected


def test_load_documents_sees_edited_files(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("Old text.\n", encoding="utf-8")
    assert load_documents(path, cache_dir=tmp_path / "cache")["text"] == ["Old text."]
    path.write_text("New text, longer.\n", encoding="utf-8")
    assert load_documents(path, cache_dir=tmp_path / "cache")["text"] == ["New text, longer."]


def test_load_documents_from_saved_and_in_memory_datasets(tmp_path):
    data = datasets.Dataset.from_dict({"body": ["One. Two.", "Three. Four."], "label": [0, 1]})
    data.save_to_disk(str(tmp_path / "saved"))
    loaded = load_documents(tmp_path / "saved", text_column="body")
    assert loaded.column_names == ["text"] and loaded["text"] == ["One. Two.", "Three. Four."]
    assert load_documents(data, text_column="body")["text"] == ["One. Two.", "Three. Four."]
    streamed = load_documents(datasets.DatasetDict({"train": data}), text_column="body", streaming=True)
    assert [row["text"] for row in streamed] == ["One. Two.", "Three. Four."]
    with pytest.raises(ValueError, match="no column 'text'.*text_column"):
        load_documents(data)
    with pytest.raises(ValueError, match="not text"):
        load_documents(data, text_column="label")
    with pytest.raises(ValueError, match="no split 'validation'"):
        load_documents(datasets.DatasetDict({"train": data}), text_column="body", split="validation")


def test_load_documents_bad_input_gets_clear_errors(tmp_path, monkeypatch):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Fine line.\nCaf\xe9 cr\xe8me.\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt is not valid utf-8 text.*on line 2.*iconv"):
        load_documents(latin1, cache_dir=tmp_path / "cache")
    assert load_documents(latin1, encoding="latin-1", cache_dir=tmp_path / "cache")["text"] == ["Fine line.\nCafé crème."]
    (tmp_path / "empty.txt").write_text("\n   \n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no documents"):
        load_documents(tmp_path / "empty.txt", cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="no documents"):
        load_documents(tmp_path / "empty.txt", streaming=True)
    with pytest.raises(FileNotFoundError, match="no such corpus file"):
        load_documents(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match="no corpus file matches the glob"):
        load_documents(str(tmp_path / "*.md"))
    with pytest.raises(FileNotFoundError, match="is a folder, not a corpus file.*nor a saved `datasets` dataset.*glob"):
        load_documents(tmp_path)
    with pytest.raises(ValueError, match="empty list"):
        load_documents([])
    # A hub name while offline: one clear error, not a traceback from deep inside datasets.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match="as a `datasets` name failed.*without network access, pass local files"):
        load_documents("no-such-owner/no-such-corpus")


def test_an_unreachable_hub_name_is_one_line_without_the_hubs_retry_notices(monkeypatch, caplog):
    """No network (not offline mode): huggingface_hub logs each retry at WARNING above the error."""
    import logging

    def unreachable(name, *args, **kwargs):
        logging.getLogger("huggingface_hub.utils._http").warning("'[Errno -2] Name or service not known' thrown while requesting HEAD https://huggingface.co/datasets/%s", name)
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    before = logging.getLogger("huggingface_hub").level
    with caplog.at_level(logging.WARNING), pytest.raises(FileNotFoundError, match=r"ConnectionError: Couldn't reach 'no-such-owner/corpus'"):
        load_documents("no-such-owner/corpus")
    assert "thrown while requesting" not in caplog.text
    assert logging.getLogger("huggingface_hub").level == before  # as it was


# -- sentences -------------------------------------------------------------------


def test_docstring_examples_run():
    failures, tried = doctest.testmod(data_module, verbose=False)
    assert tried >= 1 and failures == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        (" \n\t\n ", []),
        ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
        ("Wrapped\nline ends here.  Next one.", ["Wrapped line ends here.", "Next one."]),
        ("Heading\n\nBody text without a period", ["Heading", "Body text without a period"]),
        ("Dr. Smith met J. R. Tolkien, e.g. at St. Giles. Fine.", ["Dr. Smith met J. R. Tolkien, e.g. at St. Giles.", "Fine."]),
        ("The value is 3.14. it goes on.", ["The value is 3.14. it goes on."]),
        ('He said "stop." Then left.', ['He said "stop."', "Then left."]),
        ("Wait... What?! (Really.) Yes.", ["Wait...", "What?!", "(Really.)", "Yes."]),
        ("First U.S. Army. Second.", ["First U.S. Army.", "Second."]),
        ("这是第一句。这是第二句！第三句？", ["这是第一句。", "这是第二句！", "第三句？"]),
    ],
)
def test_split_sentences_rules(text, expected):
    assert split_sentences(text) == expected


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300) | st.lists(st.sampled_from(["A.", " ", "\n", "b?", "。", "x", "Dr.", '"']), max_size=60).map("".join))
def test_split_sentences_keeps_every_character_and_only_trims_whitespace(text):
    sentences = split_sentences(text)
    assert "".join("".join(s.split()) for s in sentences) == "".join(text.split())
    for sentence in sentences:
        assert sentence and sentence == sentence.strip() and len(sentence.splitlines()) == 1


# -- pairs: the pure core ----------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), max_size=30),
    other_lengths=st.lists(st.integers(1, 30), min_size=1, max_size=10),
    max_num_tokens=st.integers(2, 40),
    short_seq_prob=st.floats(0, 1),
    nsp_probability=st.floats(0, 1),
    has_other=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_create_pairs_invariants(lengths, other_lengths, max_num_tokens, short_seq_prob, nsp_probability, has_other, seed):
    # Token ids are positions: document tokens 0..N-1, the other document's from 10**6 on.
    def document(sizes, base):
        sentences, start = [], base
        for size in sizes:
            sentences.append(list(range(start, start + size)))
            start += size
        return cut_long_sentences(sentences, max_num_tokens)

    sentences, other = document(lengths, 0), document(other_lengths, 10**6)
    pairs = create_pairs_from_document(
        sentences,
        (lambda rng: other) if has_other else None,
        random.Random(seed),
        max_num_tokens=max_num_tokens,
        short_seq_prob=short_seq_prob,
        nsp_probability=nsp_probability,
    )
    if len(sentences) >= 2:
        assert pairs, "a document of two or more sentences yields at least one pair"
    for tokens_a, tokens_b, label in pairs:
        assert tokens_a and tokens_b and len(tokens_a) + len(tokens_b) <= max_num_tokens
        assert tokens_a == list(range(tokens_a[0], tokens_a[0] + len(tokens_a))) and tokens_a[-1] < 10**6
        assert tokens_b == list(range(tokens_b[0], tokens_b[0] + len(tokens_b)))
        if label == 0:
            assert tokens_b[0] > tokens_a[-1] and tokens_b[-1] < 10**6
            if len(tokens_a) + len(tokens_b) < max_num_tokens:  # untruncated: B starts where A ends
                assert tokens_b[0] == tokens_a[-1] + 1
        else:
            assert has_other and tokens_b[0] >= 10**6


def test_truncate_pair_trims_the_longer_segment_from_both_ends():
    rng = random.Random(0)
    fronts = backs = 0
    for _ in range(200):
        a, b = truncate_pair(list(range(30)), [100, 101], 12, rng)
        assert b == [100, 101] and len(a) == 10 and a == list(range(a[0], a[0] + 10))
        fronts += a[0] > 0
        backs += a[-1] < 29
    assert fronts > 150 and backs > 150  # both ends lose tokens in most draws


def test_cut_long_sentences_into_half_example_pieces():
    assert cut_long_sentences([[1, 2, 3, 4, 5], [6]], 4) == [[1, 2], [3, 4], [5], [6]]
    assert cut_long_sentences([[1, 2, 3, 4, 5], [6]], 5) == [[1, 2, 3], [4, 5], [6]]


# -- pairs: the datasets pipeline --------------------------------------------------


def test_pairs_are_real_text_with_right_layout_and_balanced_labels(bert_tokenizer, unique_word_corpus):
    documents, location, sentence_starts, sentence_ends = unique_word_corpus
    max_num_tokens = MAX_SEQ_LENGTH - 3
    labels = []
    for seed in (0, 1):
        examples = build_pretraining_dataset(documents, bert_tokenizer, max_seq_length=MAX_SEQ_LENGTH, seed=seed)
        for example in examples.to_list():
            assert len(example["input_ids"]) <= MAX_SEQ_LENGTH
            tokens_a, tokens_b = parts(example, bert_tokenizer)
            doc_a, start_a, end_a = span(tokens_a, location)
            doc_b, start_b, end_b = span(tokens_b, location)
            if example["next_sentence_label"] == 0:  # IsNext: B follows A in the same document
                assert doc_b == doc_a and start_b >= end_a
                if len(tokens_a) + len(tokens_b) < max_num_tokens:  # nothing truncated
                    assert start_b == end_a
                    assert (doc_a, start_a) in sentence_starts and (doc_b, end_b) in sentence_ends
            else:
                assert example["next_sentence_label"] == 1 and doc_b != doc_a
            labels.append(example["next_sentence_label"])
    # NotNext is a fair coin per example: allow 4.5 standard deviations (false alarm < 1e-5).
    n = len(labels)
    assert n > 1500
    assert abs(sum(labels) / n - 0.5) < 4.5 * math.sqrt(0.25 / n)


def test_same_seed_same_examples_new_seed_new_pairing(bert_tokenizer, unique_word_corpus):
    documents = unique_word_corpus[0][:60]
    build = lambda **kw: build_pretraining_dataset(documents, bert_tokenizer, max_seq_length=MAX_SEQ_LENGTH, **kw).to_dict()
    first = build(seed=7)
    assert build(seed=7) == first
    assert build(seed=7, batch_size=5) == first  # per-document generators: batching does not matter
    tokenized = tokenize_documents(documents, bert_tokenizer)
    assert build_pretraining_dataset(tokenized, bert_tokenizer, max_seq_length=MAX_SEQ_LENGTH, seed=7).to_dict() == first
    assert build(seed=8) != first


def test_maps_over_files_are_cached_and_reused(tmp_path, bert_tokenizer, unique_word_corpus):
    (tmp_path / "corpus.txt").write_text("\n\n\n".join(d.replace("\n\n", ". ") for d in unique_word_corpus[0][:20]), encoding="utf-8")
    documents = load_documents(tmp_path / "corpus.txt", cache_dir=tmp_path / "cache")
    first = build_pretraining_dataset(documents, bert_tokenizer, max_seq_length=MAX_SEQ_LENGTH, seed=0)
    assert first.cache_files  # written to the Arrow cache next to the documents
    again = build_pretraining_dataset(documents, bert_tokenizer, max_seq_length=MAX_SEQ_LENGTH, seed=0)
    assert again.cache_files == first.cache_files and again.to_dict() == first.to_dict()
    next_epoch = build_pretraining_dataset(documents, bert_tokenizer, max_seq_length=MAX_SEQ_LENGTH, seed=1)
    assert next_epoch.cache_files != first.cache_files


@pytest.fixture
def worker_counts(monkeypatch):
    """The number of processes each `map` of the pipeline was given (None: this one)."""
    counts = []
    choose = data_module._worker_processes

    def recording(*args):
        counts.append(choose(*args))
        return counts[-1]

    monkeypatch.setattr(data_module, "_worker_processes", recording)
    return counts


def test_num_proc_gives_the_same_examples(bert_tokenizer, unique_word_corpus, worker_counts):
    documents = unique_word_corpus[0][:40]
    build = lambda **kw: build_pretraining_dataset(documents, bert_tokenizer, max_seq_length=MAX_SEQ_LENGTH, seed=3, batch_size=8, **kw)
    one = build()
    assert set(worker_counts) == {None}
    two = build(num_proc=2)
    assert set(worker_counts) == {None, 2}  # every map of the second build really ran in two processes
    assert one.to_dict() == two.to_dict()


def test_tokens_and_packed_blocks_do_not_depend_on_the_number_of_processes(bert_tokenizer, worker_counts):
    """Real text; 79 documents in batches of 10 give 2 workers shards of 40 and 39 documents, so the
    second shard starts in the middle of a packing group."""
    documents = default_corpus_documents()
    one = tokenize_documents(documents, bert_tokenizer, batch_size=10)
    two = tokenize_documents(documents, bert_tokenizer, batch_size=10, num_proc=2)
    assert worker_counts == [None, 2] and one["sentences"] == two["sentences"]
    packed = {n: build_packed_dataset(one, bert_tokenizer, max_seq_length=64, batch_size=10, num_proc=n) for n in (1, 2, 3)}
    assert worker_counts[-3:] == [None, 2, 3]
    assert packed[1]["input_ids"] == packed[2]["input_ids"] == packed[3]["input_ids"]
    assert len(packed[1]) > 1000 and all(len(ids) == 64 for ids in packed[1]["input_ids"])
    # Groups of 10 documents, whatever the batches: the same as packing each group on its own.
    stream = [ids for start in range(0, len(documents), 10) for ids in data_module.pack_token_stream(one[start : start + 10]["sentences"], 62, bert_tokenizer.sep_token_id)]
    assert [ids[1:-1] for ids in packed[1]["input_ids"]] == stream
    streamed = build_packed_dataset(datasets.Dataset.from_dict({"text": documents}).to_iterable_dataset(), bert_tokenizer, max_seq_length=64, batch_size=10)
    assert [example["input_ids"] for example in streamed] == packed[1]["input_ids"]


def test_whole_documents_tokenize_to_their_sentences_run_together(bert_tokenizer, shared_data):
    """Packing tokenizes documents whole (no sentence splitter): on real text that is exactly the
    sentences' ids run together, and the Rust call gives transformers' own ids."""
    import gzip
    import json

    with gzip.open(shared_data / "imdb" / "test.jsonl.gz", "rt", encoding="utf-8") as handle:
        reviews = [json.loads(line)["text"] for _, line in zip(range(300), handle)]
    documents = reviews + default_corpus_documents() + ["", "   ", "Ünïcödé — “quoted”… e.g. U.S. 3.14"]
    whole = tokenize_documents(documents, bert_tokenizer, sentences=False)["sentences"]
    split = tokenize_documents(documents, bert_tokenizer)["sentences"]
    assert [[i for ids in doc for i in ids] for doc in whole] == [[i for ids in doc for i in ids] for doc in split]
    assert all(len(doc) <= 1 for doc in whole) and whole[-3] == whole[-2] == []
    expected = bert_tokenizer(documents[:50], add_special_tokens=False)["input_ids"]
    assert [doc[0] if doc else [] for doc in whole[:50]] == expected


# -- progress bars -------------------------------------------------------------------


@pytest.fixture
def datasets_bars_on(monkeypatch, tmp_path):
    """datasets' bars switched on (this module switches them off) and an empty cache, so every step draws its bar."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    datasets.enable_progress_bars()
    yield
    datasets.disable_progress_bars()


@pytest.fixture(scope="module")
def many_documents_file(tmp_path_factory):
    """2,400 short documents of real text (two sentences of the embedded corpus each): work for two processes."""
    sentences = [s for document in default_corpus_documents() for s in split_sentences(document) if len(s.split()) > 3]
    documents = [" ".join(sentences[i : i + 2]) for i in range(0, len(sentences) - 1, 2)]
    documents = (documents * math.ceil(2400 / len(documents)))[:2400]
    path = tmp_path_factory.mktemp("many") / "many.txt"
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return path


def finished_bars(stderr: str) -> list[str]:
    """The last state of every tqdm bar written to stderr (a bar redraws itself after carriage returns)."""
    return [line.rsplit("\r", 1)[-1] for line in stderr.split("\n") if "/s]" in line]


def test_no_progress_bar_silences_every_bar_datasets_included(many_documents_file, minilm_dir, tmp_path, capfd, datasets_bars_on, worker_counts, fresh_accelerator_state):
    from scratchbert.commands import main

    tiny = ["--hidden-size", "32", "--num-hidden-layers", "1", "--num-attention-heads", "4", "--intermediate-size", "64",
            "--max-position-embeddings", "64", "--max-seq-length", "32", "--batch-size", "4", "--max-steps", "1",
            "--eval-every", "0", "--save-every", "0", "--max-eval-examples", "8", "--report-to", "none"]  # fmt: skip
    flags = ["--train-files", str(many_documents_file), "--tokenizer", str(minilm_dir), "--output-dir", str(tmp_path / "run"), "--num-proc", "2"]
    assert main(["pretrain", *flags, *tiny, "--no-progress-bar"]) == 0
    err = capfd.readouterr().err
    assert 2 in worker_counts  # the bars of a map in several processes are silenced too
    assert finished_bars(err) == [] and "%|" not in err and "examples/s" not in err, err
    assert not datasets.utils.are_progress_bars_disabled()  # the global switches are back as they were
    assert transformers.utils.logging.is_progress_bar_enabled()


def test_with_bars_on_each_stage_draws_one_bar_with_its_rate(many_documents_file, bert_tokenizer, tmp_path, capfd, datasets_bars_on, fresh_accelerator_state):
    from scratchbert.training.pretraining import corpus
    from scratchbert.training.pretraining.config import PretrainConfig

    fresh = tmp_path / "many.txt"  # a file no other test has read into the Arrow cache
    fresh.write_bytes(many_documents_file.read_bytes())
    config = PretrainConfig(train_files=[str(fresh)], max_seq_length=32, max_position_embeddings=64, num_proc=2)
    train_docs, eval_docs = corpus.split_documents(corpus.load_corpus(config), config.eval_fraction, config.seed)
    corpus.build_datasets(config, bert_tokenizer, train_docs, eval_docs)
    bars = finished_bars(capfd.readouterr().err)
    assert [bar.split(":")[0] for bar in bars] == [
        "Generating train split",
        "Tokenizing (num_proc=2)",  # packing needs no sentence splitter; the training split, 2,160 documents: two processes, one bar
        "Packing text into blocks (num_proc=2)",
        "Tokenizing",  # the held-out split, 240 documents: one process
        "Packing text into blocks",
    ]
    assert all("examples/s" in bar for bar in bars) and all("100%" in bar for bar in bars[1:])  # reading has no total


def test_the_default_number_of_processes_is_the_cores_this_process_may_use():
    from scratchbert.training.pretraining.config import PretrainConfig

    assert available_cores() >= 1 and PretrainConfig().num_proc == available_cores()
    assert PretrainConfig(num_proc=1).num_proc == 1
    with pytest.raises(ScratchBertError, match="num_proc"):
        PretrainConfig(num_proc=0)


def test_default_corpus_builds_full_length_examples(bert_tokenizer):
    examples = build_pretraining_dataset(default_corpus_documents()[:12], bert_tokenizer, max_seq_length=64)
    lengths = [len(ids) for ids in examples["input_ids"]]
    assert max(lengths) == 64 and sum(length == 64 for length in lengths) > len(lengths) / 2
    assert examples.features["input_ids"].feature.dtype == "int32"


def test_skips_are_counted_and_logged(bert_tokenizer, unique_word_corpus, caplog):
    documents = ["", "   ", "Only one sentence here.", *unique_word_corpus[0][:5]]
    with caplog.at_level(logging.WARNING, logger="scratchbert.training.pretraining.examples"):
        examples = build_pretraining_dataset(documents, bert_tokenizer, max_seq_length=MAX_SEQ_LENGTH)
    assert len(examples) > 0
    assert "Skipped 3 of 8 documents: 2 empty, 1 of a single sentence" in caplog.text


def test_bad_input_gets_clear_errors(bert_tokenizer, unique_word_corpus):
    good = unique_word_corpus[0][:3]
    with pytest.raises(ValueError, match="none of the 0 documents"):
        build_pretraining_dataset([], bert_tokenizer)
    with pytest.raises(ValueError, match="has two sentences.*2 of one sentence"):
        build_pretraining_dataset(["Just one.", "Also one"], bert_tokenizer)
    with pytest.raises(ValueError, match="only one document has two sentences.*nsp_probability=0"):
        build_pretraining_dataset(good[:1], bert_tokenizer)
    assert set(build_pretraining_dataset(good[:1], bert_tokenizer, nsp_probability=0)["next_sentence_label"]) == {0}
    for too_small in (0, 3, 4):
        with pytest.raises(ValueError, match=f"max_seq_length={too_small} is too small.*>= 5"):
            build_pretraining_dataset(good, bert_tokenizer, max_seq_length=too_small)
    with pytest.raises(ValueError, match="nsp_probability=1.5 is not a probability"):
        build_pretraining_dataset(good, bert_tokenizer, nsp_probability=1.5)
    with pytest.raises(ValueError, match="not one string"):
        build_pretraining_dataset("A whole corpus. As one string.", bert_tokenizer)
    with pytest.raises(ValueError, match="needs a 'text' column"):
        build_pretraining_dataset(datasets.Dataset.from_dict({"body": good}), bert_tokenizer)


def test_smallest_max_seq_length_works(bert_tokenizer, unique_word_corpus):
    examples = build_pretraining_dataset(unique_word_corpus[0][:10], bert_tokenizer, max_seq_length=5)
    assert len(examples) > 0 and {len(ids) for ids in examples["input_ids"]} == {5}


def test_enormous_unpunctuated_document_is_cut_not_thrown_away(bert_tokenizer, unique_word_corpus):
    documents, location, _, _ = unique_word_corpus
    wall_ids = [t for t in location if location[t][0] >= 10][:3000]
    wall = " ".join(bert_tokenizer.convert_ids_to_tokens(wall_ids))  # one 3000-token "sentence"
    places = {t: place for t, place in location.items() if place[0] < 3}
    places.update({t: ("wall", k) for k, t in enumerate(wall_ids)})
    examples = build_pretraining_dataset([wall, *documents[:3]], bert_tokenizer, max_seq_length=MAX_SEQ_LENGTH, seed=5)
    seen = set()
    for example in examples.to_list():
        tokens_a, tokens_b = parts(example, bert_tokenizer)
        doc_a, _, end_a = span(tokens_a, places)
        doc_b, start_b, _ = span(tokens_b, places)
        if example["next_sentence_label"] == 0:
            assert doc_a == doc_b and start_b >= end_a
        seen.update(tokens_a + tokens_b)
    assert len(seen & set(wall_ids)) > 0.8 * len(wall_ids)  # most of the wall ends up in examples


def test_streaming_pipeline(tmp_path, bert_tokenizer, unique_word_corpus):
    documents, location, _, _ = unique_word_corpus
    # One sentence per line, capitalised and ending in a period; blank lines between documents.
    text = "\n\n".join("\n".join(s.capitalize() + "." for s in d.split("\n\n")) for d in documents[:30])
    (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
    stream = load_documents(tmp_path / "corpus.txt", streaming=True)
    examples = build_pretraining_dataset(stream, bert_tokenizer, max_seq_length=MAX_SEQ_LENGTH, batch_size=10)
    assert isinstance(examples, datasets.IterableDataset)
    period = bert_tokenizer.convert_tokens_to_ids(".")
    places = dict(location)
    labels = []
    for example in examples:
        assert len(example["input_ids"]) <= MAX_SEQ_LENGTH
        tokens_a, tokens_b = parts(example, bert_tokenizer)
        docs_a = {places[t][0] for t in tokens_a if t != period}
        docs_b = {places[t][0] for t in tokens_b if t != period}
        assert len(docs_a) <= 1 and len(docs_b) <= 1
        if example["next_sentence_label"] == 1 and docs_a and docs_b:
            assert docs_a != docs_b
        elif docs_a and docs_b:
            assert docs_a == docs_b
        labels.append(example["next_sentence_label"])
    assert len(labels) > 50 and set(labels) == {0, 1}


# -- random Unicode through the whole pipeline ---------------------------------------

unicode_documents = st.lists(
    st.one_of(
        st.text(max_size=200),
        st.lists(st.text(min_size=1, max_size=20), max_size=12).map(". ".join),
        st.builds(lambda piece, times: (piece + " ") * times, st.text(min_size=1, max_size=8), st.integers(300, 1500)),
    ),
    max_size=6,
)


# Each case builds a dataset (~0.3 s), so few cases and no shrinking (which could run for minutes).
@settings(
    max_examples=8,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(documents=unicode_documents, max_seq_length=st.integers(5, 40), seed=st.integers(0, 1000))
def test_random_unicode_documents_through_pairs_and_collation(bert_tokenizer, documents, max_seq_length, seed):
    try:
        examples = build_pretraining_dataset(documents, bert_tokenizer, max_seq_length=max_seq_length, seed=seed)
    except ValueError as err:  # the documented refusals; anything else is a bug
        assert "no pretraining examples" in str(err) or "only one document has two sentences" in str(err)
        return
    assert len(examples) > 0
    for example in examples.to_list():
        assert len(example["input_ids"]) <= max_seq_length
        parts(example, bert_tokenizer)
    collator = DataCollatorForPretraining(bert_tokenizer, whole_word_mask=seed % 2 == 0)
    batch = collator([examples[i] for i in range(min(8, len(examples)))])
    special = torch.tensor(bert_tokenizer.all_special_ids)
    labelled = batch["labels"] != -100
    has_candidate = ~torch.isin(batch["labels"].where(labelled, batch["input_ids"]), special)
    assert (labelled.any(dim=1) == has_candidate.any(dim=1)).all()  # rows of only [UNK]s have nothing to predict
    assert not torch.isin(batch["labels"][labelled], special).any()


def test_enormous_random_unicode_document(bert_tokenizer):
    rng = random.Random(0)
    alphabet = [chr(c) for c in range(0x20, 0x3000) if chr(c).isprintable()]
    enormous = "".join(rng.choice(alphabet) for _ in range(300_000))
    examples = build_pretraining_dataset([enormous, "A short one. Second sentence."], bert_tokenizer, max_seq_length=128)
    assert len(examples) > 100 and max(len(ids) for ids in examples["input_ids"]) == 128


def test_scratchbert_tokenizer_end_to_end():
    tokenization = pytest.importorskip("scratchbert.tokenization")
    documents = default_corpus_documents()[:20]
    tokenizer = tokenization.train_tokenizer(documents, vocab_size=800, show_progress=False)
    examples = build_pretraining_dataset(documents, tokenizer, max_seq_length=48, seed=1)
    assert len(examples) > 50
    for example in examples.to_list():
        assert len(example["input_ids"]) <= 48
        parts(example, tokenizer)
    batch = DataCollatorForPretraining(tokenizer, whole_word_mask=True)([examples[i] for i in range(16)])
    assert batch["input_ids"].shape == batch["labels"].shape and int(batch["input_ids"].max()) < len(tokenizer)


@pytest.mark.slow
def test_very_large_corpus_file_streams_and_builds(tmp_path, bert_tokenizer):
    """A 20 MB file of 50,000 documents, through files, the Arrow cache and pairing."""
    rng = random.Random(0)
    words = [w for w in bert_tokenizer.get_vocab() if w.isalpha() and w.isascii()]
    with open(tmp_path / "big.txt", "w", encoding="utf-8") as handle:
        for _ in range(50_000):
            sentences = (" ".join(rng.choices(words, k=rng.randint(3, 20))).capitalize() + "." for _ in range(rng.randint(1, 8)))
            handle.write(" ".join(sentences) + "\n\n")
    documents = load_documents(tmp_path / "big.txt", cache_dir=tmp_path / "cache")
    assert len(documents) == 50_000
    examples = build_pretraining_dataset(documents, bert_tokenizer, max_seq_length=128, num_proc=2)
    labels = examples["next_sentence_label"]
    assert len(examples) > 20_000 and abs(sum(labels) / len(labels) - 0.5) < 0.02
    assert max(len(ids) for ids in examples["input_ids"]) <= 128


# -- prepared once ---------------------------------------------------------------------


def test_prepared_data_is_reused_and_rebuilt_when_the_corpus_or_tokenizer_changes(tmp_path, monkeypatch, bert_tokenizer, fresh_accelerator_state):
    """A second run on the same corpus, tokenizer and options reads the cached examples without
    tokenizing; an edited corpus file or another tokenizer builds new ones."""
    from scratchbert.tokenization import train_tokenizer
    from scratchbert.training.pretraining import corpus
    from scratchbert.training.pretraining.config import PretrainConfig

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    tokenized = []  # the documents each preparation tokenized
    tokenize = data_module._tokenize_batch

    def counting(batch, tokenizer, sentences=True):
        tokenized.extend(batch["text"])
        return tokenize(batch, tokenizer, sentences)

    monkeypatch.setattr(data_module, "_tokenize_batch", counting)
    documents = [" ".join(document.split()) for document in default_corpus_documents()[:30]]
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    config = PretrainConfig(train_files=[str(path)], max_seq_length=32, max_position_embeddings=64, num_proc=1)

    def prepare(tokenizer):
        tokenized.clear()
        train_docs, eval_docs = corpus.split_documents(corpus.load_corpus(config), config.eval_fraction, config.seed)
        return corpus.build_datasets(config, tokenizer, train_docs, eval_docs)

    first = prepare(bert_tokenizer)
    assert sorted(tokenized) == sorted(documents) and all(split.cache_files for split in first)
    again = prepare(bert_tokenizer)
    assert tokenized == []  # read from the cache: nothing tokenized again
    assert [split.cache_files for split in again] == [split.cache_files for split in first]
    assert [split.to_dict() for split in again] == [split.to_dict() for split in first]

    other = prepare(train_tokenizer(documents, vocab_size=300, show_progress=False))
    assert len(tokenized) == 30 and other[0]["input_ids"] != first[0]["input_ids"]
    with path.open("a", encoding="utf-8") as handle:
        handle.write("\nA new document about nothing. It has two sentences.\n")
    edited = prepare(bert_tokenizer)
    assert len(tokenized) == 31 and "A new document about nothing. It has two sentences." in tokenized
    assert edited[0].cache_files != first[0].cache_files


@pytest.mark.slow
def test_data_scale_bench_prints_equal_examples_for_every_process_count(shared_data):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_data_scale.py"
    args = ["--megabytes", "1", "--num-proc", "1", "2", "--limit-documents", "200"]
    out = subprocess.run([sys.executable, str(script), *args], check=True, capture_output=True, text=True, timeout=600).stdout
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert [row[0].strip() for row in rows] == ["1", "2"] and rows[0][7] == rows[1][7]  # the same examples


def test_epoch_permutation_hands_out_every_example_once_in_a_seeded_order():
    from scratchbert.training.pretraining.masking import EpochPermutation

    sampler = EpochPermutation(10_000, seed=3)  # more than one chunk of indices
    first = list(sampler)
    assert sorted(first) == list(range(10_000)) and first != list(range(10_000))
    assert list(EpochPermutation(10_000, seed=3)) == first  # replayable: a resumed run skips into the same order
    sampler.set_epoch(1)
    second = list(sampler)
    assert sorted(second) == list(range(10_000)) and second != first
    assert all(type(index) is int for index in second[:5])


def test_a_tokenizer_that_pads_and_truncates_still_tokenizes_whole_documents(minilm_dir):
    """A tokenizer.json may switch padding and truncation on in the Rust tokenizer (all-MiniLM's does:
    128 tokens); the documents must come out whole and unpadded all the same, on either path."""
    from transformers import BertTokenizer

    documents = [document for document in default_corpus_documents()[:12]]
    clean = BertTokenizer.from_pretrained(minilm_dir)
    expected = [clean(d, add_special_tokens=False)["input_ids"] for d in documents]
    assert max(map(len, expected)) > 128
    for sentences in (False, True):
        padded = BertTokenizer.from_pretrained(minilm_dir)
        padded.backend_tokenizer.enable_truncation(max_length=16)
        padded.backend_tokenizer.enable_padding(pad_id=padded.pad_token_id, length=40)
        tokenized = tokenize_documents(documents, padded, sentences=sentences, batch_size=4)["sentences"]
        assert [[i for ids in doc for i in ids] for doc in tokenized] == expected

