"""Each BERT concept, demonstrated on a tiny model with the real scratchbert code.

These are the tests the README's concept map points to where no other test shows the idea
directly. Each one states a property of BERT in its name and checks it on a model with
hidden size 32, 2 layers and 4 heads (random weights: the properties are architectural,
they hold whatever the weights).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_bert_config

from scratchbert import ScratchBertConfig, ScratchBertForPreTraining, ScratchBertModel
from scratchbert.modeling_scratchbert import IGNORE_INDEX, ScratchBertAddNorm, cross_entropy
from scratchbert.tokenization import train_tokenizer
from scratchbert.training.pretraining.masking import DataCollatorForPretraining

VOCAB, HIDDEN, LAYERS, HEADS, SEQ = 50, 32, 2, 4, 10
HEAD_DIM = HIDDEN // HEADS


def tiny_config(**overrides) -> ScratchBertConfig:
    return tiny_bert_config(**{"vocab_size": VOCAB, "intermediate_size": 64, "max_position_embeddings": 32, **overrides})


@pytest.fixture
def model() -> ScratchBertModel:
    torch.manual_seed(0)
    return ScratchBertModel(tiny_config()).eval()


@pytest.fixture
def pair():
    """One sentence pair: [CLS] a a a a [SEP] b b b [SEP], segment ids 0 then 1, no padding."""
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, VOCAB, (1, SEQ), generator=gen)
    input_ids[0, 0], input_ids[0, 5], input_ids[0, -1] = 2, 3, 3  # [CLS], [SEP], [SEP]
    token_type_ids = torch.tensor([[0] * 6 + [1] * 4])
    return dict(input_ids=input_ids, token_type_ids=token_type_ids)


# --------------------------------------------------------------------------------------
# Embeddings
# --------------------------------------------------------------------------------------


def test_input_vectors_are_word_plus_position_plus_segment_embeddings_then_layernorm(model, pair):
    embeddings = model.embeddings
    ids, types = pair["input_ids"], pair["token_type_ids"]
    positions = torch.arange(SEQ)[None]
    by_hand = F.layer_norm(
        embeddings.word_embeddings.weight[ids] + embeddings.position_embeddings.weight[positions] + embeddings.token_type_embeddings.weight[types],
        (HIDDEN,),
        embeddings.LayerNorm.weight,
        embeddings.LayerNorm.bias,
        eps=model.config.layer_norm_eps,
    )
    torch.testing.assert_close(embeddings(ids, types, positions), by_hand)


def test_segment_ids_tell_the_two_sentences_apart(model, pair):
    with torch.no_grad():
        as_pair = model(**pair).last_hidden_state
        one_segment = model(input_ids=pair["input_ids"]).last_hidden_state  # token_type_ids default to 0
        # At the embedding layer, only the positions whose segment changed are affected.
        embedded_pair = model.embeddings(pair["input_ids"], pair["token_type_ids"], torch.arange(SEQ)[None])
        embedded_one = model.embeddings(pair["input_ids"], torch.zeros_like(pair["token_type_ids"]), torch.arange(SEQ)[None])
    changed = (embedded_pair - embedded_one).abs().amax(-1)[0] > 0  # (S,)
    assert changed.tolist() == (pair["token_type_ids"][0] == 1).tolist()
    assert not torch.allclose(as_pair, one_segment)


def test_without_position_embeddings_bert_cannot_see_word_order(model, pair):
    order = torch.tensor([0, 3, 1, 2, 4, 5, 8, 6, 7, 9])  # shuffle the words inside each sentence
    shuffled = {name: tensor[:, order] for name, tensor in pair.items()}
    with torch.no_grad():
        # With positions: shuffling the words changes what each word's vector becomes.
        assert not torch.allclose(model(**shuffled).last_hidden_state, model(**pair).last_hidden_state[:, order], atol=1e-4)
        # Without them, self-attention is permutation-equivariant: the output is just shuffled too.
        model.embeddings.position_embeddings.weight.zero_()
        torch.testing.assert_close(model(**shuffled).last_hidden_state, model(**pair).last_hidden_state[:, order], atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------


def test_attention_weights_are_softmax_of_query_key_dot_products_over_sqrt_head_dim(model, pair):
    with torch.no_grad():
        out = model(**pair, output_attentions=True, output_hidden_states=True)
        x = out.hidden_states[0][0]  # (S, H): the input of layer 0
        attention = model.encoder.layer[0].attention.self
        q = attention.query(x).view(SEQ, HEADS, HEAD_DIM).transpose(0, 1)  # (A, S, D)
        k = attention.key(x).view(SEQ, HEADS, HEAD_DIM).transpose(0, 1)  # (A, S, D)
    expected = (q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)).softmax(-1)  # (A, S, S)
    torch.testing.assert_close(out.attentions[0][0], expected, atol=1e-6, rtol=1e-5)


def test_padded_positions_get_zero_attention_weight_in_every_layer_and_head(model):
    input_ids = torch.randint(5, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(2))
    attention_mask = torch.ones(2, SEQ, dtype=torch.long)
    attention_mask[1, 6:] = 0  # the second row has 6 real tokens and 4 padding
    with torch.no_grad():
        attentions = model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True).attentions
    assert len(attentions) == LAYERS
    for probs in attentions:  # (B, A, S, S)
        assert probs[1, :, :, 6:].abs().max().item() == 0.0  # exactly zero, not just small
        assert probs[0, :, :, 6:].min() > 0  # the unpadded row does attend there
        torch.testing.assert_close(probs[1, :, :6].sum(-1), torch.ones(HEADS, 6))  # real queries: weights sum to 1


def test_each_head_owns_its_slice_of_the_projections_and_of_the_concatenated_output(model, pair):
    layer = model.encoder.layer[0].attention.self
    with torch.no_grad():
        x = model(**pair, output_hidden_states=True).hidden_states[0]
        context, probs = layer(x, None, output_attentions=True)
        head = 2
        rows = slice(head * HEAD_DIM, (head + 1) * HEAD_DIM)
        layer.query.weight[rows] += torch.randn(HEAD_DIM, HIDDEN)  # change head 2's queries only
        layer.value.weight[rows] += torch.randn(HEAD_DIM, HIDDEN)  # and its values
        new_context, new_probs = layer(x, None, output_attentions=True)
    others = [h for h in range(HEADS) if h != head]
    torch.testing.assert_close(new_probs[:, others], probs[:, others])
    assert not torch.allclose(new_probs[:, head], probs[:, head])
    # Heads are concatenated in order: head h fills columns h*D .. (h+1)*D of the output.
    changed_columns = ((new_context - context).abs().amax(dim=(0, 1)) > 0).nonzero().flatten()
    assert changed_columns.tolist() == list(range(rows.start, rows.stop))


def test_attention_mixes_positions_but_the_feed_forward_block_does_not(model, pair):
    layer = model.encoder.layer[0]
    with torch.no_grad():
        x = model(**pair, output_hidden_states=True).hidden_states[0]
        nudged = x.clone()
        nudged[0, 3] += 1.0  # change one token's vector
        feed_forward = lambda h: layer.output(layer.intermediate(h), h)  # noqa: E731  (B, S, H) -> (B, S, H)
        ff_change = (feed_forward(nudged) - feed_forward(x)).abs().amax(-1)[0]  # (S,)
        attention_change = (layer.attention(nudged, None)[0] - layer.attention(x, None)[0]).abs().amax(-1)[0]
    assert ff_change[3] > 0 and ff_change[torch.arange(SEQ) != 3].max() == 0  # position-wise
    assert (attention_change > 1e-4).all()  # every token hears about the change


def test_add_and_norm_is_layernorm_of_residual_plus_projected_update():
    torch.manual_seed(0)
    block = ScratchBertAddNorm(tiny_config(), in_features=64).eval()
    update, residual = torch.randn(2, SEQ, 64), torch.randn(2, SEQ, HIDDEN)
    expected = F.layer_norm(residual + block.dense(update), (HIDDEN,), block.LayerNorm.weight, block.LayerNorm.bias, eps=1e-12)
    torch.testing.assert_close(block(update, residual), expected)
    with torch.no_grad():
        block.dense.weight.zero_()
        block.dense.bias.zero_()
    # With nothing to add, the block passes the (normalised) residual through: deep stacks start near identity paths.
    torch.testing.assert_close(block(update, residual), F.layer_norm(residual, (HIDDEN,), eps=1e-12))


def test_the_encoder_is_its_layers_applied_in_turn(model, pair):
    with torch.no_grad():
        out = model(**pair, output_hidden_states=True)
        assert len(out.hidden_states) == LAYERS + 1
        for index, layer in enumerate(model.encoder.layer):
            torch.testing.assert_close(layer(out.hidden_states[index], None)[0], out.hidden_states[index + 1])
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state)


# --------------------------------------------------------------------------------------
# Pooler and heads
# --------------------------------------------------------------------------------------


def test_pooler_reads_only_the_cls_position(model, pair):
    with torch.no_grad():
        hidden = model(**pair).last_hidden_state
        pooled = model.pooler(hidden)
        scrambled = hidden.clone()
        scrambled[:, 1:] = torch.randn_like(scrambled[:, 1:])
        torch.testing.assert_close(model.pooler(scrambled), pooled)
        torch.testing.assert_close(pooled, torch.tanh(model.pooler.dense(hidden[:, 0])))


def test_only_masked_positions_contribute_to_the_mlm_loss(pair):
    torch.manual_seed(0)
    model = ScratchBertForPreTraining(tiny_config()).eval()  # eval: dense (B, S, V) logits
    labels = torch.full_like(pair["input_ids"], IGNORE_INDEX)
    labels[0, [2, 7]] = pair["input_ids"][0, [2, 7]]
    out = model(**pair, labels=labels, next_sentence_label=torch.tensor([0]))
    out.prediction_logits.retain_grad()
    out.loss.backward()
    gradient_per_position = out.prediction_logits.grad.abs().amax(-1)[0]  # (S,)
    assert (gradient_per_position > 0).nonzero().flatten().tolist() == [2, 7]
    # The MLM part is the mean cross-entropy of exactly those two predictions.
    log_probs = out.prediction_logits.detach()[0].log_softmax(-1)
    mlm = -(log_probs[2, labels[0, 2]] + log_probs[7, labels[0, 7]]) / 2
    nsp = F.cross_entropy(out.seq_relationship_logits.detach(), torch.tensor([0]))
    torch.testing.assert_close(out.loss.detach(), mlm + nsp)


def test_nsp_reads_the_pooled_cls_vector_and_its_label_says_whether_b_follows_a(pair):
    torch.manual_seed(0)
    model = ScratchBertForPreTraining(tiny_config()).eval()
    with torch.no_grad():
        out = model(**pair)
        pooled = model.bert(**pair).pooler_output
        torch.testing.assert_close(out.seq_relationship_logits, model.cls.seq_relationship(pooled))
        labels = torch.full_like(pair["input_ids"], IGNORE_INDEX)
        labels[0, 4] = pair["input_ids"][0, 4]
        is_next = model(**pair, labels=labels, next_sentence_label=torch.tensor([0])).loss
        not_next = model(**pair, labels=labels, next_sentence_label=torch.tensor([1])).loss
    # Only the NSP term depends on the pair label: the two losses differ by exactly its change.
    log_probs = out.seq_relationship_logits.log_softmax(-1)[0]  # [IsNext, NotNext]
    torch.testing.assert_close(not_next - is_next, log_probs[0] - log_probs[1])


def test_mlm_decoder_scores_tokens_against_the_input_embedding_table(pair):
    torch.manual_seed(0)
    model = ScratchBertForPreTraining(tiny_config()).eval()
    with torch.no_grad():
        hidden = model.bert(**pair).last_hidden_state
        transformed = model.cls.predictions.transform(hidden)  # (B, S, H)
        expected = transformed @ model.bert.embeddings.word_embeddings.weight.T + model.cls.predictions.bias
        torch.testing.assert_close(model(**pair).prediction_logits, expected, atol=1e-5, rtol=1e-5)


def test_cross_entropy_ignores_minus_100_everywhere():
    logits = torch.randn(3, 5, 7)
    labels = torch.full((3, 5), IGNORE_INDEX)
    labels[1, 2] = 4
    torch.testing.assert_close(cross_entropy(logits, labels), -logits[1, 2].log_softmax(-1)[4])


# --------------------------------------------------------------------------------------
# Masking for pretraining
# --------------------------------------------------------------------------------------


def test_masking_chooses_15_percent_of_real_tokens_and_replaces_80_10_10():
    tokenizer = train_tokenizer(
        ["the cat sat on the mat", "a dog ran in the park", "birds fly over the sea"] * 3,
        vocab_size=60,
        min_frequency=1,
        show_progress=False,
    )
    special = set(tokenizer.all_special_ids)
    ordinary = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    gen = torch.Generator().manual_seed(0)
    rows, length = 256, 64
    examples = []
    for _ in range(rows):
        body = ordinary[torch.randint(len(ordinary), (length - 2,), generator=gen)].tolist()
        examples.append({"input_ids": [tokenizer.cls_token_id, *body, tokenizer.sep_token_id]})
    original = torch.tensor([example["input_ids"] for example in examples])

    batch = DataCollatorForPretraining(tokenizer, generator=torch.Generator().manual_seed(1))(examples)
    chosen = batch["labels"] != IGNORE_INDEX
    assert not chosen[:, 0].any() and not chosen[:, -1].any()  # [CLS] and [SEP] are never predicted
    assert torch.equal(batch["labels"][chosen], original[chosen])  # labels hold the original tokens
    assert torch.equal(batch["input_ids"][~chosen], original[~chosen])  # nothing else is touched

    def within(count: int, total: int, p: float) -> bool:  # 4.5 standard deviations: false alarm < 1e-5
        return abs(count - total * p) < 4.5 * math.sqrt(total * p * (1 - p))

    candidates, n = rows * (length - 2), int(chosen.sum())
    assert within(n, candidates, 0.15)
    corrupted = batch["input_ids"][chosen]
    masked = int((corrupted == tokenizer.mask_token_id).sum())
    kept = int((corrupted == original[chosen]).sum())
    # A random replacement equals the original with probability 1 / len(ordinary).
    p_kept = 0.1 + 0.1 / len(ordinary)
    assert within(masked, n, 0.8) and within(kept, n, p_kept) and within(n - masked - kept, n, 0.1 - 0.1 / len(ordinary))
