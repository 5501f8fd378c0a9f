"""The dynamic MLM collator: padding, the 15% / 80-10-10 rule, whole words, randomness.

Statistical checks use a fixed torch.Generator, so they are deterministic; their
tolerance is still stated as 5 binomial standard deviations (a fair implementation
would fail one with probability below 1e-6), so a change of seed does not break them.
"""

from __future__ import annotations

import math
import types

import datasets
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from scratchbert.ingestion import default_corpus_documents
from scratchbert.training.pretraining.examples import build_pretraining_dataset
from scratchbert.training.pretraining.masking import IGNORE_INDEX, DataCollatorForPretraining, SeededCollator

datasets.disable_progress_bars()


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    """bert-base-uncased's WordPiece tokenizer (the vocabulary all-MiniLM-L6-v2 ships)."""
    return AutoTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def real_examples(tokenizer):
    """Real NSP examples: CPython documentation, full of ## word pieces."""
    return build_pretraining_dataset(default_corpus_documents()[:25], tokenizer, max_seq_length=128).to_list()


def ordinary_ids(tokenizer):
    special = set(tokenizer.all_special_ids)
    return torch.tensor([i for i in range(len(tokenizer)) if i not in special])


def synthetic_examples(tokenizer, rows, generator):
    """[CLS] A [SEP] B [SEP] rows of random ordinary tokens, 64 to 128 long, some [UNK]s inside."""
    ordinary = ordinary_ids(tokenizer)
    examples = []
    for _ in range(rows):
        length = int(torch.randint(64, 129, (1,), generator=generator))
        body = ordinary[torch.randint(len(ordinary), (length - 3,), generator=generator)]
        body[torch.rand(len(body), generator=generator) < 0.02] = tokenizer.unk_token_id
        cut = int(torch.randint(1, length - 3, (1,), generator=generator))
        ids = [tokenizer.cls_token_id, *body[:cut].tolist(), tokenizer.sep_token_id, *body[cut:].tolist(), tokenizer.sep_token_id]
        types_ = [0] * (cut + 2) + [1] * (length - cut - 2)
        examples.append({"input_ids": ids, "token_type_ids": types_, "next_sentence_label": len(examples) % 2})
    return examples


def padded_originals(examples, length, pad_id):
    rows = [list(e["input_ids"]) + [pad_id] * (length - len(e["input_ids"])) for e in examples]
    return torch.tensor(rows)


def word_spans(ids, attention, tokenizer):
    """Words of one row as lists of positions: a "##" piece joins the word before it."""
    special = set(tokenizer.all_special_ids)
    tokens = tokenizer.convert_ids_to_tokens(ids)
    words, current = [], None
    for position, (token_id, token, real) in enumerate(zip(ids, tokens, attention)):
        if not real or token_id in special:
            current = None
            continue
        if current is not None and token.startswith("##"):
            current.append(position)
        else:
            current = [position]
            words.append(current)
    return words


def within(observed, expected, n, p=None):
    """|observed - expected| within 5 binomial standard deviations of a share over n draws."""
    p = expected if p is None else p
    return abs(observed - expected) < 5 * math.sqrt(p * (1 - p) / n)


# -- the 15% / 80-10-10 rule --------------------------------------------------------


@pytest.mark.parametrize("draws", ["per batch", "per example"])
def test_masking_rates_over_100k_tokens(tokenizer, draws):
    """Both ways of drawing give BERT's rates: one generator for the batch, or `SeededCollator`'s
    generator per example (what `scratchbert pretrain` uses, so that N processes train as one)."""
    generator = torch.Generator().manual_seed(0)
    examples = synthetic_examples(tokenizer, 1100, generator)
    collator = DataCollatorForPretraining(tokenizer, generator=generator)
    seeded = SeededCollator(collator, seed=0, model_inputs=("input_ids", "attention_mask", "labels"))
    special = torch.tensor(tokenizer.all_special_ids)
    candidates = chosen = to_mask = to_random = kept = 0
    for start in range(0, len(examples), 100):
        part = examples[start : start + 100]
        batch = collator(part) if draws == "per batch" else seeded(list(enumerate(part, start)))
        original = padded_originals(part, batch["input_ids"].shape[1], tokenizer.pad_token_id)
        candidate = batch["attention_mask"].bool() & ~torch.isin(original, special)
        labelled = batch["labels"] != IGNORE_INDEX
        # Special tokens, [UNK]s and padding are never chosen, never changed.
        assert not (labelled & ~candidate).any()
        assert torch.equal(batch["input_ids"][~labelled], original[~labelled])
        assert torch.equal(batch["labels"][labelled], original[labelled])
        corrupted = batch["input_ids"][labelled]
        candidates += int(candidate.sum())
        chosen += int(labelled.sum())
        to_mask += int((corrupted == tokenizer.mask_token_id).sum())
        kept += int((corrupted == original[labelled]).sum())
        replaced = (corrupted != tokenizer.mask_token_id) & (corrupted != original[labelled])
        to_random += int(replaced.sum())
        assert not torch.isin(corrupted[replaced], special).any()  # random tokens are never special
    assert candidates >= 100_000
    assert within(chosen / candidates, 0.15, candidates)
    assert within(to_mask / chosen, 0.8, chosen)
    assert within(to_random / chosen, 0.1, chosen)
    assert within(kept / chosen, 0.1, chosen)


def test_random_replacements_are_never_special_and_spread_over_the_vocabulary(tokenizer):
    generator = torch.Generator().manual_seed(1)
    collator = DataCollatorForPretraining(
        tokenizer, mlm_probability=1.0, mask_replace_prob=0.0, random_replace_prob=1.0, generator=generator
    )
    examples = synthetic_examples(tokenizer, 200, generator)
    batch = collator(examples)
    labelled = batch["labels"] != IGNORE_INDEX
    replacements = batch["input_ids"][labelled]
    assert not torch.isin(replacements, torch.tensor(tokenizer.all_special_ids)).any()
    assert len(replacements) > 15_000 and len(set(replacements.tolist())) > 10_000


def test_special_tokens_and_padding_are_never_chosen_even_at_probability_one(tokenizer):
    collator = DataCollatorForPretraining(tokenizer, mlm_probability=1.0)
    cls, sep, unk, pad = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.unk_token_id, tokenizer.pad_token_id
    word = tokenizer.convert_tokens_to_ids("bert")
    batch = collator([{"input_ids": [cls, word, unk, sep, word, sep]}, {"input_ids": [cls, word, sep]}])
    assert batch["labels"].tolist() == [[-100, word, -100, -100, word, -100], [-100, word, -100, -100, -100, -100]]
    assert batch["input_ids"][:, [0, 2, 3]].tolist() == [[cls, unk, sep], [cls, sep, pad]]
    assert batch["attention_mask"].tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]


def test_every_row_with_a_candidate_gets_a_prediction(tokenizer):
    collator = DataCollatorForPretraining(tokenizer, generator=torch.Generator().manual_seed(2))
    word = tokenizer.convert_tokens_to_ids("token")
    rows = [{"input_ids": [tokenizer.cls_token_id, *[word] * n, tokenizer.sep_token_id]} for n in (1, 1, 2, 3)]
    rows.append({"input_ids": [tokenizer.cls_token_id, tokenizer.unk_token_id, tokenizer.sep_token_id]})
    for _ in range(50):
        counts = (collator(rows)["labels"] != IGNORE_INDEX).sum(dim=1).tolist()
        assert all(count >= 1 for count in counts[:4]) and counts[4] == 0  # a row of only [UNK]: nothing to predict


# -- whole words -------------------------------------------------------------------


def test_whole_word_masking_never_splits_a_word_and_keeps_the_rate(tokenizer, real_examples):
    collator = DataCollatorForPretraining(tokenizer, whole_word_mask=True, generator=torch.Generator().manual_seed(3))
    tokens = chosen = squared_lengths = 0
    multi_piece_words_chosen = 0
    for _ in range(3):  # three fresh maskings of the same ~45k tokens
        for start in range(0, len(real_examples), 64):
            part = real_examples[start : start + 64]
            batch = collator(part)
            labelled = (batch["labels"] != IGNORE_INDEX).tolist()
            for ids, attention, row in zip(
                padded_originals(part, batch["input_ids"].shape[1], tokenizer.pad_token_id).tolist(),
                batch["attention_mask"].tolist(),
                labelled,
            ):
                for word in word_spans(ids, attention, tokenizer):
                    picked = {row[position] for position in word}
                    assert len(picked) == 1, "a word was split"
                    tokens += len(word)
                    squared_lengths += len(word) ** 2
                    chosen += len(word) * picked.pop()
                    multi_piece_words_chosen += len(word) > 1 and row[word[0]]
    assert tokens >= 100_000 and multi_piece_words_chosen > 500
    # Words are chosen with p = 0.15, so E[chosen tokens] = 0.15 * tokens; the variance
    # is p(1-p) * sum(len(word)^2) since a word's pieces go together.
    assert abs(chosen / tokens - 0.15) < 5 * math.sqrt(0.15 * 0.85 * squared_lengths) / tokens


def test_whole_word_pieces_after_special_tokens_start_a_new_word(tokenizer):
    collator = DataCollatorForPretraining(tokenizer, whole_word_mask=True, mlm_probability=1.0)
    piece = tokenizer.convert_tokens_to_ids("##ing")
    batch = collator([{"input_ids": [tokenizer.cls_token_id, piece, tokenizer.sep_token_id]}])
    assert batch["labels"].tolist() == [[-100, piece, -100]]


# -- padding, layout, extras -------------------------------------------------------


def test_padding_and_token_types(tokenizer):
    collator = DataCollatorForPretraining(tokenizer, pad_to_multiple_of=8)
    word = tokenizer.convert_tokens_to_ids("text")
    examples = [
        {"input_ids": [101, word, 102, word, word, 102], "token_type_ids": [0, 0, 0, 1, 1, 1], "next_sentence_label": 1},
        {"input_ids": torch.tensor([101, word, 102]), "token_type_ids": torch.tensor([0, 0, 0]), "next_sentence_label": 0},
    ]
    batch = collator(examples)
    assert batch["input_ids"].shape == (2, 8) and all(t.dtype == torch.long for t in batch.values())
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 1, 1, 1, 0, 0], [0] * 8]
    assert batch["attention_mask"].tolist() == [[1] * 6 + [0, 0], [1] * 3 + [0] * 5]
    assert batch["input_ids"][1, 3:].tolist() == [tokenizer.pad_token_id] * 5
    assert batch["next_sentence_label"].tolist() == [1, 0]


def test_same_randomness_same_batch_and_global_rng_resumes_exactly(tokenizer, real_examples):
    examples = real_examples[:16]
    seeded = lambda seed: DataCollatorForPretraining(tokenizer, generator=torch.Generator().manual_seed(seed))
    first = seeded(5)(examples)
    assert all(torch.equal(first[k], v) for k, v in seeded(5)(examples).items())
    assert not torch.equal(seeded(6)(examples)["labels"], first["labels"])

    # By default the global torch RNG drives the masks: restoring its state (what
    # Accelerate's load_state does) replays the same batch.
    collator = DataCollatorForPretraining(tokenizer)
    state = torch.get_rng_state()
    before = collator(examples)
    torch.set_rng_state(state)
    after = collator(examples)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not torch.equal(collator(examples)["labels"], before["labels"])  # fresh masks on the next draw

    # An explicit generator leaves the global stream alone.
    state = torch.get_rng_state()
    seeded(7)(examples)
    assert torch.equal(torch.get_rng_state(), state)


def test_as_a_dataloader_collate_fn(tokenizer, real_examples):
    dataset = datasets.Dataset.from_list(real_examples[:40])
    loader = DataLoader(dataset, batch_size=8, shuffle=True, collate_fn=DataCollatorForPretraining(tokenizer, pad_to_multiple_of=8))
    batches = list(loader)
    assert len(batches) == 5
    for batch in batches:
        assert batch["input_ids"].shape[1] % 8 == 0 and batch["next_sentence_label"].shape == (8,)
        assert (batch["labels"] != IGNORE_INDEX).any(dim=1).all()


def test_with_transformers_trainer(tokenizer, real_examples, tmp_path):
    from transformers import Trainer, TrainingArguments

    try:
        from scratchbert import ScratchBertConfig
        from scratchbert import ScratchBertForPreTraining as Model
    except ImportError:  # the model lands separately; transformers' BERT has the same signature
        from transformers import BertConfig as ScratchBertConfig
        from transformers import BertForPreTraining as Model
    config = ScratchBertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    torch.manual_seed(0)
    model = Model(config)
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=datasets.Dataset.from_list(real_examples[:24]),
        data_collator=DataCollatorForPretraining(tokenizer),
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(math.isfinite(loss) and loss > 0 for loss in losses)


# -- bad input -----------------------------------------------------------------------


def test_bad_input_gets_clear_errors(tokenizer):
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="mlm_probability"):
            DataCollatorForPretraining(tokenizer, mlm_probability=bad)
    with pytest.raises(ValueError, match="sum to at most 1"):
        DataCollatorForPretraining(tokenizer, mask_replace_prob=0.9, random_replace_prob=0.2)
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        DataCollatorForPretraining(tokenizer, pad_to_multiple_of=0)
    with pytest.raises(ValueError, match=r"\[PAD\] and a \[MASK\]"):
        DataCollatorForPretraining(types.SimpleNamespace(pad_token_id=0, mask_token_id=None))
    collator = DataCollatorForPretraining(tokenizer)
    with pytest.raises(ValueError, match="empty list"):
        collator([])
    with pytest.raises(ValueError, match="'input_ids'"):
        collator([{"ids": [101, 102]}])
    with pytest.raises(ValueError, match="non-empty 1-D"):
        collator([{"input_ids": []}])
    with pytest.raises(ValueError, match="all or none"):
        collator([{"input_ids": [101, 102], "next_sentence_label": 0}, {"input_ids": [101, 102]}])
    with pytest.raises(ValueError, match="outside the tokenizer's vocabulary of 30522"):
        collator([{"input_ids": [101, 40000, 102]}])


# -- properties ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(0, 30521), min_size=1, max_size=40), min_size=1, max_size=6),
    whole_word=st.booleans(),
    multiple=st.sampled_from([None, 1, 8]),
    probability=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**31),
)
def test_collation_properties(tokenizer, rows, whole_word, multiple, probability, seed):
    # The same special ids often: real rows carry [CLS], [SEP], [UNK] and [PAD].
    specials = tokenizer.all_special_ids
    rows = [[specials[i % len(specials)] if i % 7 == 0 else i for i in row] for row in rows]
    collator = DataCollatorForPretraining(
        tokenizer, mlm_probability=probability, whole_word_mask=whole_word, pad_to_multiple_of=multiple,
        generator=torch.Generator().manual_seed(seed),
    )
    batch = collator([{"input_ids": row} for row in rows])
    length = batch["input_ids"].shape[1]
    assert length >= max(map(len, rows)) and length % (multiple or 1) == 0
    original = padded_originals([{"input_ids": row} for row in rows], length, tokenizer.pad_token_id)
    special = torch.tensor(specials)
    candidate = batch["attention_mask"].bool() & ~torch.isin(original, special)
    labelled = batch["labels"] != IGNORE_INDEX
    assert not (labelled & ~candidate).any()
    assert torch.equal(batch["labels"][labelled], original[labelled])
    changed = batch["input_ids"] != original
    assert not (changed & ~labelled).any()
    new_values = batch["input_ids"][changed]
    assert ((new_values == tokenizer.mask_token_id) | ~torch.isin(new_values, special)).all()
    assert torch.equal(labelled.any(dim=1), candidate.any(dim=1))
    if whole_word:
        for ids, attention, row in zip(original.tolist(), batch["attention_mask"].tolist(), labelled.tolist()):
            for word in word_spans(ids, attention, tokenizer):
                assert len({row[position] for position in word}) == 1


def test_scratchbert_tokenizer_whole_words(real_examples):
    tokenization = pytest.importorskip("scratchbert.tokenization")
    documents = default_corpus_documents()[:20]
    tokenizer = tokenization.train_tokenizer(documents, vocab_size=600, show_progress=False)
    examples = build_pretraining_dataset(documents, tokenizer, max_seq_length=64).to_list()[:64]
    collator = DataCollatorForPretraining(tokenizer, whole_word_mask=True, generator=torch.Generator().manual_seed(0))
    batch = collator(examples)
    original = padded_originals(examples, batch["input_ids"].shape[1], tokenizer.pad_token_id)
    labelled = (batch["labels"] != IGNORE_INDEX).tolist()
    split_words = 0
    for ids, attention, row in zip(original.tolist(), batch["attention_mask"].tolist(), labelled):
        for word in word_spans(ids, attention, tokenizer):
            split_words += len({row[position] for position in word}) != 1
    assert split_words == 0
    assert sum(map(sum, labelled)) > 0.1 * int(batch["attention_mask"].sum())


def test_seeded_masks_belong_to_the_example_not_to_its_batch(tokenizer, real_examples):
    """The masks a run on N processes of batch B draws are those of one process with batch N * B:
    each example's masks come from (seed, epoch, its index) alone, whatever batch it is in and
    however far that batch is padded (examples of different lengths, so the paddings differ)."""
    examples = [
        {name: example[name][: 8 + 5 * n] for name in ("input_ids", "token_type_ids", "attention_mask")}
        for n, example in enumerate(real_examples[:12])
    ]
    items = list(enumerate(examples))
    collate = SeededCollator(DataCollatorForPretraining(tokenizer, whole_word_mask=True), seed=3)
    whole = collate(items)
    halves = [collate(items[:5]), collate(items[5:])]
    for row, (index, example) in enumerate(items):
        part, offset = (halves[0], row) if index < 5 else (halves[1], row - 5)
        length = len(example["input_ids"])
        for name in ("input_ids", "labels"):
            assert torch.equal(whole[name][row, :length], part[name][offset, :length]), (name, row)
    assert (whole["labels"] != IGNORE_INDEX).any()
    collate.epoch = 1  # another epoch: other masks of the same examples
    assert not torch.equal(collate(items)["labels"], whole["labels"])
