"""Tests of scratchbert.tokenization: training, loading, transformers round trips, BERT parity."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from scratchbert.tokenization import SPECIAL_TOKENS, ScratchBertTokenizer, tokenizer_from_vocab, train_tokenizer

SENTENCES = [
    "Call me Ishmael. Some years ago - never mind how long precisely - having little money,",
    "In the beginning God created the heaven and the earth.",
    "The quick brown fox jumps over the lazy dog; the DOG sleeps on.",
    "Playing, played, player, plays: the players play.",
] * 20


@pytest.fixture(scope="module")
def cased_tokenizer() -> ScratchBertTokenizer:
    return train_tokenizer(SENTENCES, vocab_size=200, min_frequency=1, lowercase=False, show_progress=False)


def test_trained_tokenizer_has_bert_special_tokens_first(cased_tokenizer):
    vocab = cased_tokenizer.get_vocab()
    assert [vocab[token] for token in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert cased_tokenizer.pad_token_id == 0
    assert cased_tokenizer.mask_token == "[MASK]"
    assert len(cased_tokenizer) <= 200


def test_pair_template_and_segment_ids(cased_tokenizer):
    encoding = cased_tokenizer("The dog", "plays")
    tokens = cased_tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2 and tokens[-1] == "[SEP]"
    first_sep = tokens.index("[SEP]")
    assert encoding["token_type_ids"] == [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)


def test_save_and_autotokenizer_round_trip_keeps_ids_and_casing(cased_tokenizer, tmp_path):
    cased_tokenizer.save_pretrained(tmp_path)
    assert {"vocab.txt", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in tmp_path.iterdir()}
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(reloaded, ScratchBertTokenizer)
    for text in ["The DOG sleeps.", "the dog sleeps."]:
        assert reloaded(text, "Playing on") == cased_tokenizer(text, "Playing on")
    assert reloaded("DOG")["input_ids"] != reloaded("dog")["input_ids"]
    assert reloaded.model_max_length == 512


def test_empty_corpus_is_a_clear_error():
    with pytest.raises(ValueError, match="empty"):
        train_tokenizer(["", "   ", "\n"], vocab_size=100, show_progress=False)


def test_tokenizer_from_vocab_reads_bert_vocabulary(bert_vocab_file):
    tokenizer = tokenizer_from_vocab(bert_vocab_file, lowercase=True)
    assert tokenizer.convert_ids_to_tokens(tokenizer("Unaffable!")["input_ids"]) == [
        "[CLS]", "una", "##ffa", "##ble", "!", "[SEP]"
    ]
    assert (tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id) == (0, 101, 102)
