"""Tests of scratchbert.tokenization.

* training: inputs (strings, batches, generators, files, .gz, a datasets column), special
  tokens, clear errors;
* transformers: save_pretrained -> AutoTokenizer round trip, casing kept, model_max_length,
  decoding, DataCollatorForLanguageModeling and pipeline("fill-mask");
* parity with BERT's reference (transformers' pure-Python `BertTokenizerLegacy`) built from
  bert-base-uncased's vocab.txt: IMDB reviews, hard cases, random text, and the two places
  where transformers' own `BertTokenizer` differs from the reference;
* the readable WordPiece encoder against the Rust model; the train-tokenizer command.
"""

from __future__ import annotations

import gzip
import json
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, BertTokenizer, DataCollatorForLanguageModeling, pipeline
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
from transformers.utils import logging as transformers_logging

from scratchbert import ScratchBertConfig, ScratchBertForMaskedLM
from scratchbert.commands import main as cli_main
from scratchbert.ingestion import text_batches
from scratchbert.tokenization import (
    SPECIAL_TOKENS,
    ScratchBertTokenizer,
    python_tokenize,
    reference_pair_lengths,
    tokenizer_from_vocab,
    train_tokenizer,
    wordpiece_tokenize,
)

SENTENCES = [
    "Call me Ishmael. Some years ago - never mind how long precisely - having little money,",
    "In the beginning God created the heaven and the earth.",
    "The quick brown fox jumps over the lazy dog; the DOG sleeps on.",
    "Playing, played, player, plays: the players play.",
] * 20

# How many IMDB test reviews (and neighbouring pairs) the default run checks against the
# pure-Python reference, a few seconds; the `slow` run checks all 25,000 reviews and pairs
# (minutes: the reference alone needs about 2-7 ms per review).
DEFAULT_REVIEWS = 1000
DEFAULT_PAIRS = 300

HARD_CASES = [
    # accents, precomposed and combining
    "Café naïve résumé Ångström façade Dvořák Zoë Ærøskøbing",
    "e\u0301cole cafe\u0301 n\u0303 A\u030a",
    "\u0301 a combining mark with no base, and many: o\u0300\u0301\u0302\u0303",
    # CJK: ideographs become words of their own; kana and hangul do not
    "北京欢迎你，東京へようこそ。한국어 텍스트 ﾊﾝｶｸ",
    "豈更車 compatibility ideographs, \U00020000\U0002a700 extension B and C",
    # emoji: plain, skin tone, ZWJ family, flags (regional indicators, tag sequence)
    "Hello 😀 world 👍🏽 👨\u200d👩\u200d👧 🇫🇷 🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f!",
    # control, format and zero-width characters
    "tab\there\x00null\x07bell\x1bescape\x7fdel\x85nel",
    "zero\u200bwidth\u200cnon\u200djoiner\u2060word\ufeffbom\u00adsoft\u200e\u202blrm",
    "\u00a0nbsp\u2003em\u3000ideographic\u2028line\u2029para\x0bvt\x0cff",
    "unassigned \u0378\u0379 private \ue000 replacement \ufffd",
    # words over, at and under BERT's 100-character limit
    "a" * 101,
    "a" * 100,
    "x" * 150 + " ok " + "y" * 99,
    "supercalifragilistic" * 6 + "! then short words",
    # empty and whitespace-only
    "",
    " ",
    "   \n\t  \r\n ",
    # Greek (final sigma), Turkish dotted I, ligatures, full width, superscripts
    "ΟΔΟΣ Σίσυφος ΑΣ. ΟΣ'Α",
    "İstanbul ǅ ﬁne ß Ｆｕｌｌｗｉｄｔｈ ² ½ Ⅻ",
    # special tokens written in the text, punctuation everywhere
    "[MASK] is [CLS] and [SEP], but [mask] is not",
    "don't can't 3.14 $5 #tag @user e-mail <br /> ... ?!",
]


@pytest.fixture(autouse=True)
def quiet_transformers():
    """The reference logs a warning per truncated pair; keep test output readable."""
    previous = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    yield
    transformers_logging.set_verbosity(previous)


@pytest.fixture(scope="module")
def cased_tokenizer() -> ScratchBertTokenizer:
    return train_tokenizer(SENTENCES, vocab_size=200, min_frequency=1, lowercase=False, show_progress=False)


@pytest.fixture(scope="module")
def uncased_tokenizer() -> ScratchBertTokenizer:
    return train_tokenizer(SENTENCES, vocab_size=200, min_frequency=1, lowercase=True, show_progress=False)


@pytest.fixture(scope="module")
def reference(bert_vocab_file) -> BertTokenizerLegacy:
    """BERT's reference tokenizer, pure Python, bert-base-uncased's vocabulary."""
    return BertTokenizerLegacy(str(bert_vocab_file))


@pytest.fixture(scope="module")
def bert_tokenizer(bert_vocab_file) -> ScratchBertTokenizer:
    return tokenizer_from_vocab(bert_vocab_file, lowercase=True)


@pytest.fixture(scope="module")
def imdb_reviews(shared_data) -> list[str]:
    with gzip.open(shared_data / "imdb" / "test.jsonl.gz", "rt", encoding="utf-8") as file:
        return [json.loads(line)["text"] for line in file]


# --------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------


def test_trained_tokenizer_has_bert_special_tokens_first(cased_tokenizer):
    vocab = cased_tokenizer.get_vocab()
    assert [vocab[token] for token in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (cased_tokenizer.pad_token, cased_tokenizer.pad_token_id) == ("[PAD]", 0)
    assert set(cased_tokenizer.all_special_tokens) == set(SPECIAL_TOKENS)
    assert len(cased_tokenizer) <= 200
    assert cased_tokenizer.model_max_length == 512


def test_vocabulary_reaches_the_requested_size_on_real_text(shared_data):
    lines = (shared_data / "corpus" / "moby-dick.txt").read_text(encoding="utf-8").splitlines()[:3000]
    tokenizer = train_tokenizer(lines, vocab_size=800, show_progress=False)
    assert len(tokenizer) == 800
    assert any(token.startswith("##") for token in tokenizer.get_vocab())


def test_pair_template_and_segment_ids(cased_tokenizer):
    encoding = cased_tokenizer("The dog", "plays")
    tokens = cased_tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2 and tokens[-1] == "[SEP]"
    first_sep = tokens.index("[SEP]")
    assert encoding["token_type_ids"] == [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)
    assert encoding["attention_mask"] == [1] * len(tokens)


def test_every_input_form_streams_the_same_texts(tmp_path):
    texts = [f"line {i} of the corpus" for i in range(2500)]
    plain = tmp_path / "corpus.txt"
    plain.write_text("".join(text + "\n" for text in texts), encoding="utf-8")
    packed = tmp_path / "corpus.txt.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as file:
        file.write("".join(text + "\n" for text in texts))

    def flat(source):
        batches = list(text_batches(source))
        assert all(len(batch) <= 1000 for batch in batches)  # streamed, never the whole corpus at once
        return [text.rstrip("\n") for batch in batches for text in batch]

    assert flat(texts) == texts
    assert flat(text for text in texts) == texts
    assert flat([texts[:7], texts[7:]]) == texts  # batches, e.g. batch["text"] of Dataset.iter
    assert flat(plain) == texts and flat(str(plain)) == texts and flat([plain, packed]) == texts + texts
    assert flat([str(packed)]) == texts


def test_trains_from_a_datasets_column_streamed_in_batches():
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_dict({"text": SENTENCES, "label": [0] * len(SENTENCES)})
    column_batches = list(text_batches(dataset["text"]))
    assert [text for batch in column_batches for text in batch] == SENTENCES
    streamed = (batch["text"] for batch in dataset.iter(batch_size=16))
    tokenizer = train_tokenizer(streamed, vocab_size=150, min_frequency=1, show_progress=False)
    # What must hold for any vocabulary; that training gives the same one every time is
    # tests/test_wordpiece_trainer.py's job.
    assert len(tokenizer) == 150
    for sentence in SENTENCES[:4]:
        assert "[UNK]" not in tokenizer.tokenize(sentence)
        decoded = tokenizer.decode(tokenizer(sentence)["input_ids"], skip_special_tokens=True)
        assert decoded.replace(" ", "") == sentence.lower().replace(" ", "")  # BERT's decoding loses some spaces


def test_trains_from_files(tmp_path, shared_data):
    tokenizer = train_tokenizer(shared_data / "corpus" / "moby-dick.txt", vocab_size=500, show_progress=False)
    assert tokenizer.tokenize("whale") == ["whale"]


@pytest.mark.parametrize("texts", [[], ["", "   ", "\n"], iter([])], ids=["no-texts", "blank-texts", "empty-iterator"])
def test_empty_corpus_is_a_clear_error(texts):
    with pytest.raises(ValueError, match="corpus is empty"):
        train_tokenizer(texts, vocab_size=100, show_progress=False)


def test_bad_training_input_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such text file"):
        train_tokenizer(tmp_path / "missing.txt", vocab_size=100, show_progress=False)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt is not valid utf-8 text"):
        train_tokenizer(latin1, vocab_size=100, show_progress=False)
    with pytest.raises(ValueError, match="vocab_size=3"):
        train_tokenizer(SENTENCES, vocab_size=3, show_progress=False)
    with pytest.raises(ValueError, match="must contain strings"):
        train_tokenizer([b"bytes are not text"], vocab_size=100, show_progress=False)


def test_normalizer_options(uncased_tokenizer, cased_tokenizer):
    assert uncased_tokenizer.backend_tokenizer.normalizer.normalize_str("Café DOG") == "cafe dog"
    assert cased_tokenizer.backend_tokenizer.normalizer.normalize_str("Café DOG") == "Café DOG"
    keep_accents = train_tokenizer(SENTENCES, vocab_size=120, lowercase=True, strip_accents=False, show_progress=False)
    assert keep_accents.backend_tokenizer.normalizer.normalize_str("Café") == "café"
    no_cjk = train_tokenizer(SENTENCES, vocab_size=120, handle_chinese_chars=False, show_progress=False)
    assert no_cjk.backend_tokenizer.normalizer.normalize_str("北京") == "北京"
    assert uncased_tokenizer.backend_tokenizer.normalizer.normalize_str("北京") == " 北  京 "


# --------------------------------------------------------------------------------------
# transformers integration
# --------------------------------------------------------------------------------------


def test_save_pretrained_writes_bert_files(cased_tokenizer, tmp_path):
    cased_tokenizer.save_pretrained(tmp_path)
    assert {"vocab.txt", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in tmp_path.iterdir()}
    lines = (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert lines == cased_tokenizer.convert_ids_to_tokens(list(range(len(lines))))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "ScratchBertTokenizer"
    assert config["do_lower_case"] is False and config["model_max_length"] == 512


@pytest.mark.parametrize("fixture", ["cased_tokenizer", "uncased_tokenizer"])
def test_autotokenizer_round_trip_gives_identical_encodings(fixture, request, tmp_path):
    tokenizer = request.getfixturevalue(fixture)
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(reloaded, ScratchBertTokenizer)
    assert reloaded.model_max_length == tokenizer.model_max_length
    assert reloaded.special_tokens_map == tokenizer.special_tokens_map
    calls = [
        (("The DOG sleeps.",), {}),
        (("The DOG sleeps.", "Playing on"), {}),
        ((SENTENCES[:4], SENTENCES[4:8]), dict(padding=True, truncation=True, max_length=16)),
        ((SENTENCES[:3],), dict(padding="max_length", max_length=40, return_tensors="pt")),
        (("Playing", ""), {}),
    ]
    for args, kwargs in calls:
        before, after = tokenizer(*args, **kwargs), reloaded(*args, **kwargs)
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            assert torch.equal(torch.as_tensor(before[key]), torch.as_tensor(after[key])), (args, key)


def test_cased_tokenizer_reloads_cased(cased_tokenizer, uncased_tokenizer, tmp_path):
    cased_tokenizer.save_pretrained(tmp_path / "cased")
    uncased_tokenizer.save_pretrained(tmp_path / "uncased")
    cased = AutoTokenizer.from_pretrained(tmp_path / "cased")
    uncased = AutoTokenizer.from_pretrained(tmp_path / "uncased")
    assert cased("DOG")["input_ids"] != cased("dog")["input_ids"]
    assert uncased("DOG")["input_ids"] == uncased("dog")["input_ids"]
    # transformers' BertTokenizer reads the casing from tokenizer_config.json, which we write.
    assert BertTokenizer.from_pretrained(tmp_path / "cased").tokenize("DOG") == cased.tokenize("DOG")


def test_v5_bert_tokenizer_lowercases_when_the_config_does_not_say(cased_tokenizer, tmp_path):
    """The v5 trap: BertTokenizer rebuilds its normalizer from tokenizer_config.json keys,
    defaulting to do_lower_case=True. ScratchBertTokenizer reads tokenizer.json as it is."""
    cased_tokenizer.save_pretrained(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    del config["do_lower_case"]
    config_path.write_text(json.dumps(config))
    assert BertTokenizer.from_pretrained(tmp_path).tokenize("DOG") == BertTokenizer.from_pretrained(tmp_path).tokenize("dog")
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.tokenize("DOG") == cased_tokenizer.tokenize("DOG") != cased_tokenizer.tokenize("dog")


def test_checkpoint_folder_loads_tokenizer_and_fill_mask(uncased_tokenizer, tmp_path):
    """A folder with a scratchbert model and this tokenizer works with Auto classes and pipelines."""
    config = ScratchBertConfig(
        vocab_size=len(uncased_tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=uncased_tokenizer.model_max_length,
    )
    torch.manual_seed(0)
    ScratchBertForMaskedLM(config).save_pretrained(tmp_path)
    uncased_tokenizer.save_pretrained(tmp_path)
    assert isinstance(AutoTokenizer.from_pretrained(tmp_path), ScratchBertTokenizer)

    fill_mask = pipeline("fill-mask", model=str(tmp_path))
    predictions = fill_mask("the quick [MASK] fox", top_k=3)
    assert len(predictions) == 3
    scores = [prediction["score"] for prediction in predictions]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1
    for prediction in predictions:
        assert prediction["token_str"] == uncased_tokenizer.decode([prediction["token"]])
        assert prediction["sequence"].startswith("the quick") and prediction["sequence"].endswith("fox")


def test_masked_lm_collator_masks_only_real_tokens(uncased_tokenizer):
    torch.manual_seed(0)
    collator = DataCollatorForLanguageModeling(uncased_tokenizer, mlm_probability=0.5)
    examples = [uncased_tokenizer(text) for text in SENTENCES[:32]]
    batch = collator(examples)
    length = max(len(example["input_ids"]) for example in examples)
    assert batch["input_ids"].shape == batch["labels"].shape == (32, length)
    original = torch.full((32, length), uncased_tokenizer.pad_token_id)
    for row, example in enumerate(examples):
        original[row, : len(example["input_ids"])] = torch.tensor(example["input_ids"])
    chosen = batch["labels"] != -100
    assert chosen.any()
    assert torch.equal(batch["labels"][chosen], original[chosen])
    special = torch.isin(original, torch.tensor(uncased_tokenizer.all_special_ids))
    assert not (chosen & special).any()  # [CLS], [SEP] and [PAD] are never prediction targets
    assert (batch["input_ids"][chosen] == uncased_tokenizer.mask_token_id).float().mean() > 0.6
    assert torch.equal(batch["input_ids"][~chosen], original[~chosen])


def test_tokenizer_from_vocab_reads_bert_vocabulary(bert_tokenizer, bert_vocab_file):
    lines = bert_vocab_file.read_text(encoding="utf-8").splitlines()
    assert len(bert_tokenizer) == len(lines) == 30522
    assert bert_tokenizer.convert_ids_to_tokens(bert_tokenizer("Unaffable tokenizers!")["input_ids"]) == [
        "[CLS]", "una", "##ffa", "##ble", "token", "##izer", "##s", "!", "[SEP]"
    ]  # unknown words split into known pieces, "##" continues a word
    assert (bert_tokenizer.pad_token_id, bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id) == (0, 101, 102)
    assert (bert_tokenizer.unk_token_id, bert_tokenizer.mask_token_id) == (100, 103)
    with pytest.raises(FileNotFoundError, match="no such vocabulary file"):
        tokenizer_from_vocab(bert_vocab_file.parent / "missing.txt")
    assert tokenizer_from_vocab(bert_vocab_file, model_max_length=128).model_max_length == 128
    with pytest.raises(ValueError, match="model_max_length=0"):
        tokenizer_from_vocab(bert_vocab_file, model_max_length=0)


def test_vocabulary_without_special_tokens_is_a_clear_error(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\nthe\n##s\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"no \[CLS\], \[SEP\], \[MASK\]"):
        tokenizer_from_vocab(vocab)
    vocab.write_text("\n".join([*SPECIAL_TOKENS, "the", "##s", "the"]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="lists 'the' twice"):
        tokenizer_from_vocab(vocab)


def test_decode_joins_wordpieces(bert_tokenizer):
    text = "the unaffable tokenizer was playing"
    ids = bert_tokenizer(text)["input_ids"]
    assert any(token.startswith("##") for token in bert_tokenizer.convert_ids_to_tokens(ids))
    assert bert_tokenizer.decode(ids, skip_special_tokens=True) == text
    assert bert_tokenizer.decode(ids) == f"[CLS] {text} [SEP]"


# --------------------------------------------------------------------------------------
# Parity with BERT's reference
# --------------------------------------------------------------------------------------


def reference_encode(reference, ids_a, ids_b=None, max_length=None):
    """The reference's own assembly and truncation (`prepare_for_model`) on given token ids."""
    truncation = "longest_first" if max_length else False
    return reference.prepare_for_model(
        ids_a, ids_b, truncation=truncation, max_length=max_length, return_token_type_ids=True
    )


def assert_same_encodings(ours, reference, label):
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        if ours[key] != reference[key]:
            raise AssertionError(f"{label}: {key} differs\nours:      {ours[key]}\nreference: {reference[key]}")


def check_imdb_parity(tokenizer, reference, texts, pair_count, chunk_size=500):
    """Singles (all `texts`) and pairs of neighbours (the first `pair_count`), with and
    without truncation: our batch calls against the reference, `chunk_size` reviews at a time.

    (Chunks, because the Rust backend keeps every overflow window of a truncated pair:
    about 1 MB per pair of long reviews truncated to 128 tokens, as in BertTokenizer.)
    """
    for start in range(0, len(texts), chunk_size):
        chunk = texts[start : start + chunk_size + 1]  # one more: the last pair's second text
        singles = chunk[:chunk_size]
        # The reference's full path (tokenize, ids, [CLS]/[SEP]) once per review...
        expected = [reference(text, return_token_type_ids=True) for text in chunk]
        ours = tokenizer(singles)
        truncated = tokenizer(singles, truncation=True, max_length=128)
        # ...then its truncation and pair assembly on those ids (re-tokenizing is the slow part).
        ids = [want["input_ids"][1:-1] for want in expected]
        for index in range(len(singles)):
            label = f"review {start + index}"
            assert_same_encodings({key: ours[key][index] for key in expected[index]}, expected[index], label)
            want = reference_encode(reference, ids[index], max_length=128)
            assert_same_encodings({key: truncated[key][index] for key in want}, want, label + ", 128 tokens")
        pairs_here = max(0, min(pair_count - start, len(chunk) - 1, chunk_size))
        if pairs_here == 0:
            continue
        firsts, seconds = chunk[:pairs_here], chunk[1 : pairs_here + 1]
        for max_length in (None, 128, 129, 512):
            pairs = tokenizer(firsts, seconds, truncation=max_length is not None, max_length=max_length)
            for index in range(pairs_here):
                want = reference_encode(reference, ids[index], ids[index + 1], max_length=max_length)
                label = f"reviews {start + index} + {start + index + 1}, max_length={max_length}"
                assert_same_encodings({key: pairs[key][index] for key in want}, want, label)


def test_matches_reference_on_imdb_reviews(bert_tokenizer, reference, imdb_reviews):
    check_imdb_parity(bert_tokenizer, reference, imdb_reviews[:DEFAULT_REVIEWS], pair_count=DEFAULT_PAIRS)


@pytest.mark.slow
def test_matches_reference_on_all_imdb_test_reviews(bert_tokenizer, reference, imdb_reviews):
    assert len(imdb_reviews) == 25_000
    check_imdb_parity(bert_tokenizer, reference, imdb_reviews, pair_count=len(imdb_reviews) - 1)


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_matches_reference_on_hard_cases(lowercase, bert_vocab_file):
    reference = BertTokenizerLegacy(str(bert_vocab_file), do_lower_case=lowercase)
    tokenizer = tokenizer_from_vocab(bert_vocab_file, lowercase=lowercase)
    for text in HARD_CASES:
        assert tokenizer.tokenize(text) == reference.tokenize(text), repr(text)
        assert_same_encodings(tokenizer(text), reference(text, return_token_type_ids=True), repr(text))
    for first, second in zip(HARD_CASES, HARD_CASES[1:] + HARD_CASES[:1]):
        for max_length in (None, 8, 9, 40):
            kwargs = dict(truncation=max_length is not None, max_length=max_length)
            want = reference(first, second, return_token_type_ids=True, **kwargs)
            assert_same_encodings(tokenizer(first, second, **kwargs), want, repr((first, second, max_length)))


def test_hard_cases_really_are_hard(bert_tokenizer):
    """The cases above exercise what they claim to."""
    assert bert_tokenizer.tokenize("a" * 101) == ["[UNK]"] and bert_tokenizer.tokenize("a" * 100) != ["[UNK]"]
    assert bert_tokenizer.tokenize("zero\u200bwidth") == bert_tokenizer.tokenize("zerowidth")
    assert bert_tokenizer.tokenize("北京") == ["北", "京"]
    assert bert_tokenizer.tokenize("") == bert_tokenizer.tokenize(" \n\t ") == []
    assert bert_tokenizer("   ")["input_ids"] == [bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id]


# Characters from the blocks BERT meets in practice, plus controls, format characters,
# unassigned code points and CJK compatibility ideographs.
RANDOM_TEXT_BLOCKS = [
    (0x20, 0x7F), (0x00, 0x20), (0x7F, 0xA0), (0xA0, 0x180), (0x300, 0x370), (0x378, 0x37A),
    (0x391, 0x3CA), (0x410, 0x450), (0x2000, 0x2028), (0x2060, 0x2065), (0x3000, 0x3003),
    (0x3041, 0x3097), (0x4E00, 0x4E40), (0xAC00, 0xAC40), (0xF900, 0xF910), (0xFEFF, 0xFF00),
    (0x1F600, 0x1F650), (0xE0061, 0xE007B),
]
RANDOM_TEXT_ALPHABET = [chr(code) for start, stop in RANDOM_TEXT_BLOCKS for code in range(start, stop)] + [" "] * 40


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from(RANDOM_TEXT_ALPHABET), max_size=40))
def test_matches_reference_on_random_text(text, bert_tokenizer, reference):
    assert bert_tokenizer.tokenize(text) == reference.tokenize(text)


def test_reference_pair_lengths_follow_truncate_seq_pair():
    def truncate_seq_pair(len_a, len_b, budget):  # google-research/bert, on lengths
        while len_a + len_b > budget:
            if len_a > len_b:
                len_a -= 1
            else:
                len_b -= 1
        return len_a, len_b

    for len_a in range(0, 30):
        for len_b in range(0, 30):
            for budget in (0, 1, 7, 20, 29, 60):
                assert reference_pair_lengths(len_a, len_b, budget) == truncate_seq_pair(len_a, len_b, budget)
    assert reference_pair_lengths(40, 40, 31) == (16, 15)  # A keeps the odd token


def test_differs_from_transformers_bert_tokenizer_where_the_reference_does(bert_vocab_file, reference, tmp_path):
    """transformers v5's BertTokenizer splits long pairs and drops an empty second text's [SEP]
    unlike BERT's reference; ours follows the reference, also after save / AutoTokenizer."""
    theirs = BertTokenizer(vocab=str(bert_vocab_file))
    ours = tokenizer_from_vocab(bert_vocab_file)
    ours.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    long_a, long_b = "one two three four " * 8, "five six seven eight nine ten " * 6  # 32 and 36 tokens

    cases = [
        ((long_a, long_b), dict(truncation=True, max_length=32)),  # reference 15 + 14 tokens, BertTokenizer 14 + 15
        ((long_a, long_a), dict(truncation=True, max_length=32)),  # a tie: the reference cuts B first
        (("hello world", ""), {}),  # empty second text: [CLS] hello world [SEP] [SEP]
        (("", ""), {}),
    ]
    for args, kwargs in cases:
        want = reference(*args, return_token_type_ids=True, **kwargs)
        assert_same_encodings(ours(*args, **kwargs), want, repr(args))
        assert_same_encodings(reloaded(*args, **kwargs), want, repr(args))
        assert theirs(*args, **kwargs)["input_ids"] != want["input_ids"], "transformers now matches: simplify"
    assert ours(long_a, long_b, truncation=True, max_length=32)["token_type_ids"].count(1) == 14 + 1
    assert ours("hello world", "")["input_ids"] == [101, 7592, 2088, 102, 102]
    # Batched pairs take the same path.
    batch = ours([long_a, "hello world"], [long_b, ""], truncation=True, max_length=32, padding=True)
    assert batch["input_ids"][0] == reference(long_a, long_b, truncation=True, max_length=32)["input_ids"]
    assert batch["input_ids"][1][:5] == [101, 7592, 2088, 102, 102]


def test_pair_encoding_keeps_offsets_and_tensor_outputs(bert_tokenizer):
    encoding = bert_tokenizer(
        ["Hello world!", "a b"], ["Second text here", ""], padding=True, return_offsets_mapping=True, return_tensors="pt"
    )
    assert encoding["input_ids"].shape == encoding["offset_mapping"].shape[:2]
    assert encoding["offset_mapping"][0, 1].tolist() == [0, 5]  # "Hello"
    assert encoding.word_ids(0)[:3] == [None, 0, 1]
    assert encoding["attention_mask"][1].sum() == 5  # [CLS] a b [SEP] [SEP]


# --------------------------------------------------------------------------------------
# The readable WordPiece encoder
# --------------------------------------------------------------------------------------


def test_wordpiece_tokenize_greedy_longest_match_first():
    vocab = {"un", "una", "##aff", "##able", "##ffable", "[UNK]"}
    assert wordpiece_tokenize("unaffable", vocab) == ["una", "##ffable"]  # longest first piece wins
    assert wordpiece_tokenize("unaffable", vocab - {"una"}) == ["un", "##aff", "##able"]
    assert wordpiece_tokenize("unaffablex", vocab) == ["[UNK]"]  # one unknown piece: the whole word
    assert wordpiece_tokenize("un" * 51, vocab | {"##un"}) == ["[UNK]"]  # over 100 characters
    assert wordpiece_tokenize("un" * 50, vocab | {"##un"}) == ["un"] + ["##un"] * 49


def test_python_wordpiece_equals_rust_on_real_text(shared_data, bert_tokenizer, cased_tokenizer, imdb_reviews):
    moby = (shared_data / "corpus" / "moby-dick.txt").read_text(encoding="utf-8").splitlines()
    rng = random.Random(0)
    # (Special tokens written in the text are the Rust tokenizer's added tokens, not WordPiece.)
    texts = rng.sample(moby, 1500) + rng.sample(imdb_reviews, 300) + [t for t in HARD_CASES if "[CLS]" not in t]
    for tokenizer in (bert_tokenizer, cased_tokenizer):
        vocab = tokenizer.get_vocab()
        for text in texts:
            assert python_tokenize(tokenizer, text, vocab) == tokenizer.tokenize(text), repr(text)


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def test_cli_trains_and_saves_a_loadable_tokenizer(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES), encoding="utf-8")
    out = tmp_path / "tokenizer"
    assert cli_main(["train-tokenizer", "--train-files", str(corpus), "--vocab-size", "150", "--no-lowercase", "--output-dir", str(out)]) == 0
    assert "saved a cased WordPiece tokenizer of" in capsys.readouterr().out
    reloaded = AutoTokenizer.from_pretrained(out)
    assert reloaded("DOG")["input_ids"] != reloaded("dog")["input_ids"]
    assert len(reloaded) <= 150


def test_cli_trains_from_a_dataset_file(tmp_path):
    data = tmp_path / "reviews.jsonl.gz"
    with gzip.open(data, "wt", encoding="utf-8") as file:
        file.writelines(json.dumps({"review": text, "label": 1}) + "\n" for text in SENTENCES)
    out = tmp_path / "tokenizer"
    argv = ["train-tokenizer", "--dataset", str(data), "--text-column", "review", "--vocab-size", "120", "--output-dir", str(out)]
    assert cli_main(argv) == 0
    assert AutoTokenizer.from_pretrained(out).tokenize("The DOG") == ["the", "dog"]


def run_cli_error(argv, capsys) -> str:
    assert cli_main(["train-tokenizer", *argv]) == 2
    return capsys.readouterr().err


def test_cli_errors_are_one_clear_line(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert "no such text file: " in run_cli_error(["--train-files", str(tmp_path / "nope.txt"), "--output-dir", out], capsys)

    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert "corpus is empty" in run_cli_error(["--train-files", str(empty), "--output-dir", out], capsys)

    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\t\n")
    assert "corpus is empty" in run_cli_error(["--train-files", str(blank), "--output-dir", out], capsys)

    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("na\xefve caf\xe9\n".encode("latin-1"))
    message = run_cli_error(["--train-files", str(latin1), "--output-dir", out], capsys)
    assert "latin1.txt is not valid utf-8 text" in message and "Traceback" not in message

    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"body": "text"}) + "\n")
    assert "no column 'text'" in run_cli_error(["--dataset", str(data), "--output-dir", out], capsys)
    assert "no such corpus file" in run_cli_error(["--dataset", str(tmp_path / "missing.jsonl"), "--output-dir", out], capsys)
    assert not (tmp_path / "out").exists()  # nothing written by failed runs


def test_cli_never_overwrites_a_saved_tokenizer_silently(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES), encoding="utf-8")
    out = tmp_path / "tokenizer"
    argv = ["--train-files", str(corpus), "--vocab-size", "120", "--output-dir", str(out)]
    assert cli_main(["train-tokenizer", *argv]) == 0
    saved = (out / "tokenizer.json").read_bytes()
    assert "already holds a tokenizer" in run_cli_error(argv, capsys)
    assert (out / "tokenizer.json").read_bytes() == saved
    assert cli_main(["train-tokenizer", *argv, "--overwrite", "--no-lowercase"]) == 0


def test_cli_needs_exactly_one_source(tmp_path):
    with pytest.raises(SystemExit):
        cli_main(["train-tokenizer", "--output-dir", str(tmp_path)])
    with pytest.raises(SystemExit):
        cli_main(["train-tokenizer", "--train-files", "a.txt", "--dataset", "imdb", "--output-dir", str(tmp_path)])
