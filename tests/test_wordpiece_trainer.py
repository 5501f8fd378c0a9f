"""Tests of the deterministic WordPiece trainer behind `train_tokenizer` (`tokenization.train_wordpiece_vocab`).

* determinism: the same vocabulary for the same texts in one process (whatever the batching
  or order of the texts) and byte-identical saved files across processes with different
  PYTHONHASHSEED and TOKENIZERS_PARALLELISM;
* correctness: the incremental merges equal BPE recounted from scratch after every merge;
  word counting equals pre-tokenizing every text whole; min_frequency and limit_alphabet;
* the tokenizer it yields: special tokens first, `##` pieces, vocab_size, clear errors,
  save_pretrained -> AutoTokenizer round trip, close to the `tokenizers` trainer's vocabulary.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

from scratchbert.ingestion import default_corpus_documents
from scratchbert.tokenization import SPECIAL_TOKENS, ScratchBertTokenizer, train_tokenizer, wordpiece_pipeline
from scratchbert.tokenization import count_words, segmentation_stats, train_wordpiece_vocab

REPO = Path(__file__).resolve().parents[1]
# The embedded corpus at a size where many merges tie (pairs seen 2 or 3 times), so that
# any dependence on hash order would show.
VOCAB_SIZE = 2000


@pytest.fixture(scope="module")
def documents() -> list[str]:
    return default_corpus_documents()


def bert_pipeline(lowercase: bool = True):
    return wordpiece_pipeline(None, lowercase=lowercase, strip_accents=None, handle_chinese_chars=True, clean_text=True)


def train(texts, vocab_size: int = VOCAB_SIZE, min_frequency: int = 2, lowercase: bool = True, **options) -> list[str]:
    pipeline = bert_pipeline(lowercase)
    return train_wordpiece_vocab(
        texts,
        normalizer=pipeline.normalizer,
        pre_tokenizer=pipeline.pre_tokenizer,
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        **options,
    )


# --------------------------------------------------------------------------------------
# Determinism
# --------------------------------------------------------------------------------------


def test_same_vocabulary_whatever_the_batching_or_order_of_the_texts(documents):
    lines = [line for document in documents for line in document.splitlines()]
    first = train([lines])
    assert train([lines]) == first
    assert train([lines[i : i + 7] for i in range(0, len(lines), 7)]) == first
    shuffled = lines[:]
    random.Random(0).shuffle(shuffled)
    assert train([shuffled]) == first  # the vocabulary depends on the word counts only
    assert len(first) == VOCAB_SIZE


# Trains on the corpus file argv[1] and saves the tokenizer in argv[2].
TRAIN_AND_SAVE = (
    "import sys; from scratchbert.tokenization import train_tokenizer; "
    f"train_tokenizer(sys.argv[1], vocab_size={VOCAB_SIZE}, show_progress=False).save_pretrained(sys.argv[2])"
)


def test_saved_files_are_byte_identical_across_processes(documents, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(documents), encoding="utf-8")
    # Each run pays for importing torch and transformers (seconds), so two runs, plus
    # this process with its own (random, by default) hash seed.
    settings_by_run = {
        "hashseed-0-serial": {"PYTHONHASHSEED": "0", "TOKENIZERS_PARALLELISM": "false"},
        "hashseed-1-parallel": {"PYTHONHASHSEED": "1", "TOKENIZERS_PARALLELISM": "true"},
    }
    runs = {}
    for name, overrides in settings_by_run.items():
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONHASHSEED", "TOKENIZERS_PARALLELISM")}
        runs[name] = subprocess.Popen(
            [sys.executable, "-c", TRAIN_AND_SAVE, str(corpus), str(tmp_path / name)],
            env={**env, **overrides},
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
        )
    for name, process in runs.items():
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, f"{name}: {stderr}"
    train_tokenizer(str(corpus), vocab_size=VOCAB_SIZE, show_progress=False).save_pretrained(tmp_path / "in-process")

    def saved(name: str) -> dict[str, bytes]:
        return {path.name: path.read_bytes() for path in sorted((tmp_path / name).iterdir())}

    expected = saved("in-process")
    assert {"vocab.txt", "tokenizer.json", "tokenizer_config.json"} <= set(expected)
    assert len(expected["vocab.txt"].splitlines()) == VOCAB_SIZE
    for name in settings_by_run:
        assert saved(name) == expected, f"{name} saved different files"


# --------------------------------------------------------------------------------------
# The algorithm
# --------------------------------------------------------------------------------------


def recounted_vocab(texts: list[str], vocab_size: int, min_frequency: int, prefix: str = "##") -> list[str]:
    """WordPiece training the slow, obvious way: count every pair again after every merge."""
    word_counts = Counter(word for text in texts for word in text.split())
    alphabet = sorted({char for word in word_counts for char in word})
    continuations = sorted({prefix + char for word in word_counts for char in word[1:]})
    vocab = [*SPECIAL_TOKENS, *alphabet, *continuations]
    ids = {token: index for index, token in enumerate(vocab)}
    pieces = {word: [word[0]] + [prefix + char for char in word[1:]] for word in word_counts}
    while len(vocab) < vocab_size:
        pair_counts = Counter()
        for word, count in word_counts.items():
            for pair in zip(pieces[word], pieces[word][1:]):
                pair_counts[pair] += count
        candidates = [pair for pair, count in pair_counts.items() if count >= max(min_frequency, 1)]
        if not candidates:
            break
        left, right = min(candidates, key=lambda pair: (-pair_counts[pair], ids[pair[0]], ids[pair[1]]))
        token = left + right.removeprefix(prefix)
        if token not in ids:
            ids[token] = len(vocab)
            vocab.append(token)
        for word, old in pieces.items():
            new, i = [], 0
            while i < len(old):
                if i + 1 < len(old) and (old[i], old[i + 1]) == (left, right):
                    new.append(token)
                    i += 2
                else:
                    new.append(old[i])
                    i += 1
            pieces[word] = new
    return vocab


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(st.text(alphabet="aaabbc  ", max_size=30), min_size=1, max_size=12).filter(lambda texts: any(t.strip() for t in texts)),
    vocab_size=st.integers(min_value=14, max_value=40),
    min_frequency=st.integers(min_value=0, max_value=3),
)
def test_incremental_merges_equal_recounting_from_scratch(texts, vocab_size, min_frequency):
    # Few letters, so words like "aaaa" test overlapping pairs and many pairs tie.
    vocab_size = max(vocab_size, len(recounted_vocab(texts, 0, min_frequency)))
    expected = recounted_vocab(texts, vocab_size, min_frequency)
    got = train_wordpiece_vocab(
        [texts], pre_tokenizer=pre_tokenizers.WhitespaceSplit(), vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS
    )
    assert got == expected


def test_incremental_merges_equal_recounting_on_real_text(documents):
    texts = [bert_pipeline().normalizer.normalize_str(document) for document in documents[:6]]
    texts = [" ".join(word for word, _ in bert_pipeline().pre_tokenizer.pre_tokenize_str(text)) for text in texts]
    expected = recounted_vocab(texts, 500, min_frequency=2)
    assert train_wordpiece_vocab([texts], pre_tokenizer=pre_tokenizers.WhitespaceSplit(), vocab_size=500, min_frequency=2, special_tokens=SPECIAL_TOKENS) == expected


TRICKY_TEXTS = [
    "  two  spaces,\tand a tab\nnewline\r\n",
    "Café naïve e\u0301cole ΟΔΟΣ İstanbul ß ﬁne",
    "北京欢迎你，東京へようこそ。한국어",
    "nbsp\u00a0em\u2003ideographic\u3000zero\u200bwidth\x00nul\x85nel",
    "[MASK] is [CLS]; don't 3.14 $5 #tag e-mail <br /> ...?!",
    "",
    "   ",
]


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_words_are_counted_as_the_tokenizer_splits_them(lowercase):
    pipeline = bert_pipeline(lowercase)
    whole = Counter(
        word for text in TRICKY_TEXTS for word, _ in pipeline.pre_tokenizer.pre_tokenize_str(pipeline.normalizer.normalize_str(text))
    )
    assert count_words([TRICKY_TEXTS], pipeline.normalizer, pipeline.pre_tokenizer) == whole


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=5))
def test_counting_space_separated_chunks_first_changes_nothing(texts):
    pipeline = bert_pipeline()
    whole = Counter(word for text in texts for word, _ in pipeline.pre_tokenizer.pre_tokenize_str(pipeline.normalizer.normalize_str(text)))
    assert count_words([texts], pipeline.normalizer, pipeline.pre_tokenizer) == whole


def test_a_pre_tokenizer_that_keeps_spaces_is_refused():
    with pytest.raises(ValueError, match="splits at spaces and drops them"):
        count_words([["some text"]], pre_tokenizer=pre_tokenizers.Metaspace())


def test_min_frequency_and_limit_alphabet():
    texts = ["axb"] * 5 + ["ab", "ab", "ab"]
    # "x" is the least frequent character: left out, it splits "axb" into "a" and "##b".
    vocab = train_wordpiece_vocab([texts], vocab_size=100, limit_alphabet=2, min_frequency=2)
    assert vocab == ["a", "b", "##b", "ab"]  # (a, ##b) seen 3 times, not 8
    assert "ab" not in train_wordpiece_vocab([texts], vocab_size=100, limit_alphabet=2, min_frequency=4)
    assert "axb" in train_wordpiece_vocab([texts], vocab_size=100, min_frequency=5)


# --------------------------------------------------------------------------------------
# The tokenizer
# --------------------------------------------------------------------------------------


def test_special_tokens_first_then_characters_and_continuations(documents):
    vocab = train([documents])
    assert vocab[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    assert len(vocab) == len(set(vocab)) == VOCAB_SIZE
    assert {"##s", "##ing", "the", "def"} <= set(vocab)
    characters = [token for token in vocab[len(SPECIAL_TOKENS) :] if len(token) == 1]
    assert characters == sorted(characters)  # by code point, right after the special tokens


def test_vocab_size_is_respected_or_the_error_says_what_would_fit(documents):
    assert len(train([documents], vocab_size=700)) == 700
    assert len(train([documents[:3]], vocab_size=30522)) < 30522  # ran out of pairs seen twice
    with pytest.raises(ValueError, match=r"vocab_size=50 is too small.*raise vocab_size to at least \d+"):
        train([documents], vocab_size=50)


@pytest.mark.parametrize("texts", [[], ["", "  \n"], ["\x00\x07"]], ids=["no-texts", "blank", "control-characters-only"])
def test_empty_corpus_is_a_clear_error(texts):
    with pytest.raises(ValueError, match="corpus is empty.*pass files or strings that contain text"):
        train([texts])
    with pytest.raises(ValueError, match="corpus is empty"):
        train_tokenizer(texts, vocab_size=100, show_progress=False)


def test_trained_tokenizer_round_trips_through_autotokenizer(documents, tmp_path):
    tokenizer = train_tokenizer(documents, vocab_size=VOCAB_SIZE, show_progress=False)
    assert isinstance(tokenizer, ScratchBertTokenizer) and len(tokenizer) == VOCAB_SIZE
    assert [tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(reloaded, ScratchBertTokenizer)
    assert (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines() == train([documents])
    texts = ["The assert statement raises AssertionError.", "Déjà vu: lambda x: x ** 2", documents[5][:500]]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert reloaded(text)["input_ids"] == ids
        assert tokenizer.unk_token_id not in ids
        decoded = reloaded.decode(ids, skip_special_tokens=True)
        normalized = tokenizer.backend_tokenizer.normalizer.normalize_str(text)
        assert decoded.replace(" ", "") == normalized.replace(" ", "")


def test_close_to_the_tokenizers_trainer(shared_data):
    lines = (shared_data / "corpus" / "moby-dick.txt").read_text(encoding="utf-8").splitlines()
    train_lines, held_out = lines[:6000], lines[-2000:]
    ours = train_tokenizer(train_lines, vocab_size=VOCAB_SIZE, show_progress=False)
    theirs = train_tokenizer(train_lines, vocab_size=VOCAB_SIZE, show_progress=False, deterministic=False)
    assert len(ours) == len(theirs) == VOCAB_SIZE
    assert list(theirs.get_vocab())  # the `tokenizers` trainer still works, special tokens first:
    assert [theirs.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    # Two runs of the `tokenizers` trainer differ in a few tokens; ours differs about as much.
    shared = set(ours.get_vocab()) & set(theirs.get_vocab())
    assert len(shared) / VOCAB_SIZE > 0.98
    ours_per_word = segmentation_stats(ours, held_out)["tokens_per_word"]
    theirs_per_word = segmentation_stats(theirs, held_out)["tokens_per_word"]
    assert abs(ours_per_word - theirs_per_word) / theirs_per_word < 0.01


@pytest.mark.slow
def test_benchmark_script_runs(shared_data):
    result = subprocess.run(
        [sys.executable, "scripts/bench_wordpiece.py", "--quick", "--runs", "1", "--held-out-texts", "200"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "CPU:" in result.stdout and result.stdout.count("scratchbert ") == 2
