"""The padding-free path (scratchbert/bert_padding.py) and sparse MLM prediction.

The padded path is the reference: with `model.config.padding_free = False` the model runs the
plain (B, S, H) computation. The padding-free path must give the same hidden states at real
positions and the same gradients (1e-5 in fp32), zeros at padded positions, and must not be
used on batches without padding. Sparse MLM prediction must give the dense loss and gradients.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import transformers
from conftest import enable_activation_checkpointing

import scratchbert.bert_padding as bert_padding
import scratchbert.modeling_scratchbert as modeling
from scratchbert import (
    ScratchBertConfig,
    ScratchBertForMaskedLM,
    ScratchBertForPreTraining,
    ScratchBertForQuestionAnswering,
    ScratchBertForSequenceClassification,
    ScratchBertModel,
)
from scratchbert.bert_padding import labelled_tokens, pack_sequences, pad, plan_buckets, unpad

ATOL = 1e-5
TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
LENGTHS = (23, 17, 9, 4, 0, 23, 1)  # mixed lengths, two equal, a single token and a fully padded row


def tiny_config(attn_implementation: str = "sdpa", **overrides) -> ScratchBertConfig:
    config = ScratchBertConfig(**{**TINY, **overrides})
    config._attn_implementation = attn_implementation
    return config


def padded_inputs(lengths=LENGTHS, width=None, side="right", seed=0) -> dict[str, torch.Tensor]:
    """Random ids, sentence-pair token types, and a keep-mask with the given lengths."""
    gen = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    input_ids = torch.randint(5, TINY["vocab_size"], (len(lengths), width), generator=gen)
    attention_mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        if side == "right":
            attention_mask[row, :length] = 1
        else:
            attention_mask[row, width - length :] = 1
    token_type_ids = (torch.arange(width)[None, :] >= width // 2).long().expand_as(input_ids).contiguous()
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)  # [PAD] = 0 on padding
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


def assert_close(name: str, ours: torch.Tensor, reference: torch.Tensor, atol: float = ATOL) -> None:
    assert ours.shape == reference.shape, f"{name}: {tuple(ours.shape)} != {tuple(reference.shape)}"
    diff = (ours - reference).abs().max().item() if ours.numel() else 0.0
    assert diff <= atol, f"{name}: max |diff| {diff:.3g} > {atol:g}"


@pytest.fixture(params=[0, 2000, 10**9], ids=["bucket-per-length", "some-buckets", "one-bucket"])
def call_cost(request, monkeypatch):
    """Exercise every bucketing regime: one call per distinct length, a mix, everything in one call."""
    monkeypatch.setattr(bert_padding, "CALL_COST", request.param)
    return request.param


def run_both(model: ScratchBertModel, inputs, **kwargs):
    """The same forward of a bare encoder on the padding-free path and on the padded path."""
    model.config.padding_free = True
    packed = model(**inputs, **kwargs)
    model.config.padding_free = False
    padded = model(**inputs, **kwargs)
    model.config.padding_free = True
    return packed, padded


# --- equality with the padded path --------------------------------------------------------------
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_hidden_states_equal_the_padded_path_at_real_positions(attn_implementation, side, call_cost):
    torch.manual_seed(0)
    model = ScratchBertModel(tiny_config(attn_implementation)).eval()
    inputs = padded_inputs(side=side)
    keep = inputs["attention_mask"].bool()
    with torch.no_grad():
        packed, padded = run_both(model, inputs)
    assert torch.all(packed.last_hidden_state[~keep] == 0), "last_hidden_state is not zero at padded positions"
    assert_close("last_hidden_state", packed.last_hidden_state[keep], padded.last_hidden_state[keep])
    rows = keep[:, 0]  # the pooler reads position 0 ([CLS]), padding in left-padded or empty rows
    assert_close("pooler_output", packed.pooler_output[rows], padded.pooler_output[rows])


def test_gaps_inside_a_row_and_explicit_position_ids():
    """Any mask pattern works: each row's real tokens keep their order and see only each other."""
    torch.manual_seed(1)
    model = ScratchBertModel(tiny_config()).eval()
    inputs = padded_inputs(lengths=(12, 12, 12), width=12)
    inputs["attention_mask"][0, 3:6] = 0
    inputs["attention_mask"][2, ::2] = 0
    inputs["position_ids"] = torch.arange(12).flip(0)[None, :].expand(3, 12).contiguous()
    keep = inputs["attention_mask"].bool()
    with torch.no_grad():
        packed, padded = run_both(model, inputs)
    assert_close("last_hidden_state", packed.last_hidden_state[keep], padded.last_hidden_state[keep])


def test_inputs_embeds_are_packed_like_input_ids():
    """The padding-free path embeds only real tokens; with inputs_embeds it gathers the vectors."""
    torch.manual_seed(3)
    model = ScratchBertModel(tiny_config()).eval()
    inputs = padded_inputs()
    keep = inputs["attention_mask"].bool()
    with torch.no_grad():
        by_ids = model(**inputs).last_hidden_state
        embeds = {k: v for k, v in inputs.items() if k != "input_ids"}
        embeds["inputs_embeds"] = model.embeddings.word_embeddings(inputs["input_ids"])  # (B, S, H)
        packed, padded = run_both(model, embeds)
    assert_close("inputs_embeds vs input_ids", packed.last_hidden_state, by_ids)
    assert_close("inputs_embeds, padded path", packed.last_hidden_state[keep], padded.last_hidden_state[keep])


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_gradients_equal_the_padded_path(attn_implementation, call_cost):
    """Every parameter's gradient, through a loss on real positions and the pooled vector."""
    torch.manual_seed(2)
    model = ScratchBertForSequenceClassification(tiny_config(attn_implementation, num_labels=3))
    inputs = padded_inputs()
    keep = inputs["attention_mask"].bool()
    rows = keep[:, 0]  # rows whose position 0 ([CLS], read by the pooler) is a real token
    weights = torch.randn(*keep.shape, TINY["hidden_size"])

    def gradients(padding_free: bool) -> dict[str, torch.Tensor]:
        model.zero_grad()
        model.config.padding_free = padding_free
        out = model(**inputs)
        hidden = model.bert(**inputs).last_hidden_state  # the same computation again, read at every layer's end
        loss = (hidden * weights)[keep].mean() + out.logits[rows].square().mean()
        loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    packed, padded = gradients(True), gradients(False)
    assert packed.keys() == padded.keys() and len(packed) > 20
    for name in padded:
        assert_close(f"grad {name}", packed[name], padded[name])


def test_gradient_checkpointing_on_the_padding_free_path():
    torch.manual_seed(3)
    model = ScratchBertForSequenceClassification(tiny_config(num_labels=2))
    inputs = padded_inputs()
    labels = torch.tensor([0, 1, 1, 0, 1, 0, 1])

    def gradients() -> dict[str, torch.Tensor]:
        model.zero_grad()
        model(**inputs, labels=labels).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    model.train()
    plain = gradients()
    enable_activation_checkpointing(model)
    assert all(layer.gradient_checkpointing for layer in model.bert.encoder.layer)
    checkpointed = gradients()
    for name in plain:
        assert_close(f"grad {name}", checkpointed[name], plain[name])


def test_matches_transformers_bert_at_real_positions(tmp_path):
    """The padding-free path against transformers' own BertModel (padded), same weights."""
    torch.manual_seed(4)
    reference = transformers.BertModel(transformers.BertConfig(**TINY)).eval()
    reference.save_pretrained(tmp_path)
    ours = ScratchBertModel.from_pretrained(tmp_path).eval()
    inputs = padded_inputs(lengths=(23, 17, 9, 4, 23, 1))
    keep = inputs["attention_mask"].bool()
    with torch.no_grad():
        a, b = ours(**inputs), reference(**inputs)
    assert_close("last_hidden_state vs transformers", a.last_hidden_state[keep], b.last_hidden_state[keep])
    assert_close("pooler_output vs transformers", a.pooler_output, b.pooler_output)


# --- when the path is (not) taken ----------------------------------------------------------------
def count_packings(monkeypatch) -> list[int]:
    calls = []
    original = modeling.pack_sequences

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(modeling, "pack_sequences", spy)
    return calls


def test_batches_without_padding_take_the_plain_path(monkeypatch):
    calls = count_packings(monkeypatch)
    model = ScratchBertModel(tiny_config()).eval()
    inputs = padded_inputs(lengths=(10, 10, 10))
    with torch.no_grad():
        model(**inputs)
        model(input_ids=inputs["input_ids"])
    assert calls == []
    with torch.no_grad():
        model(**padded_inputs(lengths=(10, 7, 10)))
    assert calls == [1]


def test_recorded_hidden_states_are_the_padded_layouts_as_in_bert(monkeypatch):
    """output_hidden_states records every layer as BertModel does, at padded positions too: the padded path."""
    calls = count_packings(monkeypatch)
    torch.manual_seed(5)
    model = ScratchBertModel(tiny_config()).eval()
    inputs = padded_inputs()
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
        model.config.padding_free = False
        reference = model(**inputs, output_hidden_states=True)
    assert calls == []
    assert len(out.hidden_states) == TINY["num_hidden_layers"] + 1
    for a, b in zip(out.hidden_states, reference.hidden_states):
        assert torch.equal(a, b)
    model.config.padding_free = True
    with torch.no_grad():
        model(**inputs)
    assert calls == [1]  # without recording, the same batch is packed


def test_output_attentions_falls_back_to_the_padded_path(monkeypatch):
    calls = count_packings(monkeypatch)
    torch.manual_seed(5)
    model = ScratchBertModel(tiny_config()).eval()
    inputs = padded_inputs()
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
        model.config.padding_free = False
        reference = model(**inputs)
    assert calls == []
    assert len(out.attentions) == TINY["num_hidden_layers"]
    assert out.attentions[0].shape == (len(LENGTHS), TINY["num_attention_heads"], max(LENGTHS), max(LENGTHS))
    assert_close("last_hidden_state incl. padding", out.last_hidden_state, reference.last_hidden_state)


def test_fully_padded_rows_are_zero_and_finite():
    torch.manual_seed(6)
    model = ScratchBertModel(tiny_config()).eval()
    inputs = padded_inputs(lengths=(5, 0, 3))
    with torch.no_grad():
        out = model(**inputs)
        all_padding = model(**padded_inputs(lengths=(0, 0), width=6))
    assert torch.isfinite(out.last_hidden_state).all() and torch.isfinite(out.pooler_output).all()
    assert torch.all(out.last_hidden_state[1] == 0)
    assert torch.all(all_padding.last_hidden_state == 0) and torch.isfinite(all_padding.pooler_output).all()


def test_question_answering_gives_the_padded_paths_spans_on_the_padding_free_path(monkeypatch):
    """The span softmax reads every position, so padding gets the dtype's minimum on both layouts: the
    logits at real positions, the loss and its gradients are the padded path's (1e-5), and the head packs."""
    calls = count_packings(monkeypatch)
    torch.manual_seed(11)
    model = ScratchBertForQuestionAnswering(tiny_config())
    inputs = padded_inputs()  # lengths 23, 17, 9, 4, 0, 23, 1
    spans = dict(start_positions=torch.tensor([3, 0, 8, 2, 0, 30, 5]), end_positions=torch.tensor([5, 16, 8, 3, 0, 31, 0]))

    def run(padding_free: bool):
        model.config.padding_free = padding_free
        model.zero_grad()
        out = model(**inputs, **spans)
        out.loss.backward()
        return out, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    (packed, packed_grads), (padded, padded_grads) = run(True), run(False)
    assert calls == [1]
    keep = inputs["attention_mask"].bool()
    for name in ("start_logits", "end_logits"):
        assert_close(name, packed[name][keep], padded[name][keep])
        assert torch.all(packed[name][~keep] == torch.finfo(torch.float32).min) and torch.equal(packed[name][~keep], padded[name][~keep])
    assert torch.isfinite(packed.loss)
    assert_close("loss", packed.loss, padded.loss)
    for name in padded_grads:
        assert_close(f"grad {name}", packed_grads[name], padded_grads[name])


def test_training_mode_with_dropout_runs_and_backpropagates():
    torch.manual_seed(7)
    model = ScratchBertForSequenceClassification(tiny_config(num_labels=2, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    model.train()
    out = model(**padded_inputs(), labels=torch.tensor([0, 1, 1, 0, 1, 0, 1]))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# --- the helpers' contracts ----------------------------------------------------------------------
def test_unpad_pad_round_trip_and_cu_seqlens():
    inputs = padded_inputs(side="left")
    mask = inputs["attention_mask"]
    x = torch.randn(*mask.shape, 5)
    for call_cost in (0, 10**9):  # equal-length buckets only (R = T), and one bucket with padded slots
        packed = pack_sequences(mask, tiny_config(), lambda keep: modeling.additive_attention_mask(keep, torch.float32), call_cost)
        rows = unpad(x, packed)
        assert packed.num_tokens == int(mask.sum()) and rows.shape == (packed.num_rows, 5)
        assert (packed.num_rows == packed.num_tokens) == (call_cost == 0)
        assert sum(b.num_seqs * b.length for b in packed.buckets) == packed.num_rows
        assert packed.cu_seqlens.tolist() == [0, *itertools.accumulate(LENGTHS)]
        assert packed.max_seqlen == max(LENGTHS)
        assert torch.equal(pad(rows, packed), x * mask[..., None])
        for bucket in packed.buckets:  # a bucket's rows view as (n, L): each sequence's tokens, in order
            grid = rows[bucket.rows].view(bucket.num_seqs, bucket.length, 5)
            for sequence in grid:
                matches = [b for b in range(len(LENGTHS)) if torch.equal(sequence[: LENGTHS[b]], x[b][mask[b].bool()])]
                assert matches, "a bucket row is not one sequence's tokens in order"


def brute_force_cost(lengths: list[int], token_cost: int, call_cost: int) -> float:
    """Cheapest cost over every way to cut the sorted, distinct lengths into contiguous runs."""
    distinct = sorted(set(n for n in lengths if n > 0), reverse=True)
    counts = [sum(1 for n in lengths if n == d) for d in distinct]
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=max(len(distinct) - 1, 0)):
        cost, start = 0, 0
        for i in range(len(distinct)):
            if i == len(distinct) - 1 or cuts[i]:
                cost += sum(counts[start : i + 1]) * distinct[start] * (token_cost + distinct[start]) + call_cost
                start = i + 1
        best = min(best, cost)
    return best


def test_plan_buckets_covers_every_sequence_once_at_the_lowest_cost():
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.choice([0, rng.randint(1, 40), rng.randint(1, 8)]) for _ in range(rng.randint(1, 9))]
        call_cost = rng.choice([0, 10, 100, 1000])
        token_cost = rng.choice([0, 5, 50])
        buckets = plan_buckets(lengths, token_cost, call_cost)
        members = [i for bucket in buckets for i in bucket]
        assert sorted(members) == [i for i, n in enumerate(lengths) if n > 0]
        for bucket in buckets:
            assert [lengths[i] for i in bucket] == sorted((lengths[i] for i in bucket), reverse=True)
        cost = sum(len(b) * lengths[b[0]] * (token_cost + lengths[b[0]]) + call_cost for b in buckets)
        if any(lengths):
            assert cost == brute_force_cost(lengths, token_cost, call_cost), (lengths, call_cost, buckets)
    assert plan_buckets([0, 0], 10) == []


# --- sparse MLM prediction -----------------------------------------------------------------------
def mlm_batch(seed=0):
    inputs = padded_inputs(lengths=(23, 17, 9, 4, 23), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    chosen = (torch.rand(inputs["input_ids"].shape, generator=gen) < 0.15) & inputs["attention_mask"].bool()
    chosen[:, 1] = True
    labels = torch.where(chosen, inputs["input_ids"], torch.full_like(inputs["input_ids"], -100))
    return inputs, labels


def test_labelled_tokens_picks_the_labelled_rows_in_order():
    hidden = torch.randn(2, 4, 3)
    labels = torch.tensor([[-100, 7, -100, 8], [9, -100, -100, -100]])
    rows, targets = labelled_tokens(hidden, labels, ignore_index=-100)
    assert targets.tolist() == [7, 8, 9]
    assert torch.equal(rows, torch.stack([hidden[0, 1], hidden[0, 3], hidden[1, 0]]))


def test_sparse_mlm_loss_and_gradients_equal_the_dense_computation():
    torch.manual_seed(8)
    model = ScratchBertForPreTraining(tiny_config(sparse_prediction=True))
    inputs, labels = mlm_batch()
    nsp = torch.tensor([0, 1, 0, 1, 1])

    def step(training: bool):
        model.train(training)  # dropout is 0, so train and eval differ only by sparse prediction
        model.zero_grad()
        out = model(**inputs, labels=labels, next_sentence_label=nsp)
        out.loss.backward()
        return out, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    (sparse, sparse_grads), (dense, dense_grads) = step(True), step(False)
    num_labelled = int((labels != -100).sum())
    assert sparse.prediction_logits.shape == (num_labelled, TINY["vocab_size"])
    assert dense.prediction_logits.shape == (*labels.shape, TINY["vocab_size"])
    assert_close("loss", sparse.loss, dense.loss)
    assert_close("labelled logits", sparse.prediction_logits, dense.prediction_logits[labels != -100])
    for name in dense_grads:
        assert_close(f"grad {name}", sparse_grads[name], dense_grads[name])


def test_masked_lm_sparse_loss_with_num_items_in_batch():
    torch.manual_seed(9)
    model = ScratchBertForMaskedLM(tiny_config(sparse_prediction=True))
    inputs, labels = mlm_batch(seed=1)
    model.train()
    sparse = model(**inputs, labels=labels, num_items_in_batch=torch.tensor(50))
    model.eval()
    dense = model(**inputs, labels=labels, num_items_in_batch=torch.tensor(50))
    assert sparse.logits.shape == (int((labels != -100).sum()), TINY["vocab_size"])
    assert_close("loss", sparse.loss, dense.loss)


def test_logits_are_berts_shape_in_every_mode_unless_the_config_asks_for_sparse_prediction(tmp_path):
    """(B, S, V) as BertForMaskedLM, training with labels included; `sparse_prediction` is saved and
    gives (N, V) only in training with labels: a reloaded model scores every position in eval mode."""
    torch.manual_seed(10)
    inputs, labels = mlm_batch()
    dense_shape = (*inputs["input_ids"].shape, TINY["vocab_size"])
    model = ScratchBertForMaskedLM(tiny_config()).train()
    assert model(**inputs, labels=labels).logits.shape == dense_shape
    model.config.sparse_prediction = True
    model.save_pretrained(tmp_path)
    reloaded = ScratchBertForMaskedLM.from_pretrained(tmp_path)
    assert reloaded.config.sparse_prediction is True
    assert reloaded.train()(**inputs).logits.shape == dense_shape  # no labels
    assert reloaded(**inputs, labels=labels).logits.shape == (int((labels != -100).sum()), TINY["vocab_size"])
    assert reloaded.eval()(**inputs, labels=labels).logits.shape == dense_shape
