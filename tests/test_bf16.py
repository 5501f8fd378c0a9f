"""bf16: inference and training under bf16 autocast and with bf16 weights, against fp32.

Stated tolerances, at real positions, against the same model in fp32:
- inference, bf16 autocast: relative error ||h - h32|| / ||h32|| <= 2%, every token's cosine
  similarity >= 0.999 (measured on all-MiniLM-L6-v2 and real text: 0.7% and 0.9999);
- inference, bf16 weights (`model.to(torch.bfloat16)`): relative error <= 3%, cosine >= 0.999
  (measured: 1.2% and 0.9998);
- training, either way: the loss within 1% relative, the gradient of all parameters within 3%
  relative error and cosine >= 0.999 (measured: 0.01% / 0.8% / 0.99997).
Fully padded rows (an all-zero attention mask row) never produce NaN or inf, on either path.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from test_padding_free import mlm_batch, padded_inputs, tiny_config

from scratchbert import ScratchBertForPreTraining, ScratchBertModel
from scratchbert.tokenization import tokenizer_from_vocab
from scratchbert.training.pretraining.examples import split_sentences

INFERENCE_REL = {"autocast": 0.02, "bf16 weights": 0.03}
MIN_COSINE = 0.999
TRAINING_LOSS_REL = 0.01
TRAINING_GRAD_REL = 0.03


def bf16_variants(model):
    """(name, model, context) for bf16 autocast on the fp32 model and for a bf16 copy of the weights."""
    yield "autocast", model, torch.autocast("cpu", dtype=torch.bfloat16)
    yield "bf16 weights", copy.deepcopy(model).to(torch.bfloat16), contextlib.nullcontext()


def assert_close_to_fp32(name: str, hidden: torch.Tensor, reference: torch.Tensor, keep: torch.Tensor, rel: float) -> None:
    hidden, reference = hidden.float()[keep], reference[keep]  # (real tokens, H)
    assert torch.isfinite(hidden).all(), f"{name}: NaN or inf"
    error = ((hidden - reference).norm() / reference.norm()).item()
    cosine = F.cosine_similarity(hidden, reference, dim=-1).min().item()
    assert error <= rel, f"{name}: relative error {error:.4f} > {rel}"
    assert cosine >= MIN_COSINE, f"{name}: a token's cosine similarity {cosine:.5f} < {MIN_COSINE}"


@pytest.mark.parametrize("padding_free", [True, False])
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_inference_matches_fp32_within_bf16_tolerance(attn_implementation, padding_free):
    torch.manual_seed(0)
    model = ScratchBertModel(tiny_config(attn_implementation)).eval()
    model.config.padding_free = padding_free
    inputs = padded_inputs()
    keep = inputs["attention_mask"].bool()
    with torch.no_grad():
        reference = model(**inputs).last_hidden_state
        for name, variant, context in bf16_variants(model):
            with context:
                out = variant(**inputs)
            assert_close_to_fp32(name, out.last_hidden_state, reference, keep, INFERENCE_REL[name])
            assert torch.isfinite(out.pooler_output).all()


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_real_weights_on_real_text(minilm_dir, bert_vocab_file, shared_data, attn_implementation):
    """all-MiniLM-L6-v2 (6 layers, real weights) on sentences of Moby-Dick, padded, one row all padding."""
    tokenizer = tokenizer_from_vocab(bert_vocab_file)
    text = (shared_data / "corpus" / "moby-dick.txt").read_text(encoding="utf-8")
    sentences = [s for s in split_sentences(text[20000:40000]) if len(s) > 20][:10]
    inputs = dict(tokenizer(sentences, padding=True, truncation=True, max_length=128, return_tensors="pt"))
    inputs["attention_mask"][3] = 0
    keep = inputs["attention_mask"].bool()
    model = ScratchBertModel.from_pretrained(minilm_dir, attn_implementation=attn_implementation).eval()
    with torch.no_grad():
        reference = model(**inputs).last_hidden_state
        for name, variant, context in bf16_variants(model):
            with context:
                out = variant(**inputs)
            assert_close_to_fp32(f"MiniLM {name}", out.last_hidden_state, reference, keep, INFERENCE_REL[name])


@pytest.mark.parametrize("padding_free", [True, False])
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_training_loss_and_gradients_match_fp32(attn_implementation, padding_free):
    torch.manual_seed(1)
    model = ScratchBertForPreTraining(tiny_config(attn_implementation, sparse_prediction=True)).train()  # dropout is 0: deterministic
    model.config.padding_free = padding_free
    inputs, labels = mlm_batch()
    inputs["attention_mask"][2] = 0  # a fully padded row ...
    labels[2] = -100  # ... carries no MLM label
    nsp = torch.tensor([0, 1, 0, 1, 1])

    def loss_and_gradient(variant, context):
        variant.zero_grad()
        with context:
            loss = variant(**inputs, labels=labels, next_sentence_label=nsp).loss
        loss.backward()
        grads = [p.grad.float().flatten() for p in variant.parameters() if p.grad is not None]
        return loss.detach().float(), torch.cat(grads)

    loss32, grad32 = loss_and_gradient(model, contextlib.nullcontext())
    for name, variant, context in bf16_variants(model):
        loss, grad = loss_and_gradient(variant, context)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), f"{name}: NaN or inf"
        assert (loss - loss32).abs() / loss32 <= TRAINING_LOSS_REL, f"{name}: loss {loss:.5f} vs fp32 {loss32:.5f}"
        error = ((grad - grad32).norm() / grad32.norm()).item()
        assert error <= TRAINING_GRAD_REL, f"{name}: gradient relative error {error:.4f}"
        assert F.cosine_similarity(grad, grad32, dim=0) >= MIN_COSINE


def test_bf16_weights_optimizer_step_stays_finite():
    torch.manual_seed(2)
    model = ScratchBertForPreTraining(tiny_config(sparse_prediction=True)).to(torch.bfloat16).train()  # as pretraining runs
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, labels = mlm_batch()
    inputs["attention_mask"][1] = 0
    labels[1] = -100
    for _ in range(3):
        loss = model(**inputs, labels=labels, next_sentence_label=torch.tensor([0, 1, 0, 1, 1])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("padding_free", [True, False])
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_fully_padded_rows_give_no_nan(attn_implementation, padding_free):
    """An all-zero mask row: the padded path's softmax over all-masked keys is uniform, not NaN."""
    torch.manual_seed(3)
    model = ScratchBertModel(tiny_config(attn_implementation)).train()
    model.config.padding_free = padding_free
    inputs = padded_inputs(lengths=(6, 0, 3, 0))
    for name, variant, context in bf16_variants(model):
        with context:
            out = variant(**inputs, output_hidden_states=True)
            (out.last_hidden_state.float().sum() + out.pooler_output.float().sum()).backward()
        assert all(torch.isfinite(h).all() for h in out.hidden_states), name
        assert torch.isfinite(out.pooler_output).all(), name
        assert all(torch.isfinite(p.grad).all() for p in variant.parameters() if p.grad is not None), name
