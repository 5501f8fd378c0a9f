"""`scratchbert.quantize_dynamic`: int8 inference on real weights and real text, the padding-free path, pipelines, bad input."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, pipeline

import scratchbert
from scratchbert import ScratchBertConfig, ScratchBertModel, quantize_dynamic
from scratchbert.errors import ScratchBertError
from scratchbert.ingestion import default_corpus_documents
from scratchbert.quantization import is_quantized
from scratchbert.tokenization import tokenizer_from_vocab


def real_sentences(count: int = 24) -> list[str]:
    """Sentences of the Python documentation every CPython carries (the embedded corpus), of mixed length."""
    sentences = []
    for document in default_corpus_documents():
        for line in document.split(". "):
            words = line.split()
            if 4 <= len(words) <= 60:
                sentences.append(" ".join(words))
        if len(sentences) >= count:
            break
    return sentences[:count]


def mean_pooled(model, batch) -> torch.Tensor:
    hidden = model(**batch).last_hidden_state  # (B, S, H)
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, S, 1)
    return (hidden * mask).sum(1) / mask.sum(1)  # (B, H)


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    tokenizer = tokenizer_from_vocab(minilm_dir / "vocab.txt")
    return ScratchBertModel.from_pretrained(minilm_dir).eval(), tokenizer


def test_int8_embeddings_of_real_text_keep_cosine_099_with_fp32(minilm, minilm_dir):
    fp32, tokenizer = minilm
    batch = tokenizer(real_sentences(), padding=True, truncation=True, max_length=128, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # mixed lengths: the padding-free path runs
    int8 = quantize_dynamic(ScratchBertModel.from_pretrained(minilm_dir))
    assert is_quantized(int8) and not int8.training
    with torch.inference_mode():
        reference, quantized = mean_pooled(fp32, batch), mean_pooled(int8, batch)
        int8.config.padding_free = False
        padded = mean_pooled(int8, batch)
    cosine = torch.nn.functional.cosine_similarity(reference, quantized)  # (B,)
    assert cosine.min() >= 0.99, cosine
    # The padding-free path and the padded one agree as far as int8 rounding lets them: their fp32 attention
    # kernels differ in the last bits, which can move a value across a rounding step of the next layer.
    assert torch.nn.functional.cosine_similarity(quantized, padded).min() >= 0.995
    assert torch.nn.functional.cosine_similarity(reference, padded).min() >= 0.99
    # Every encoder Linear is int8; the embeddings stay fp32.
    linears = [m for m in int8.encoder.modules() if isinstance(m, torch.nn.Linear)]
    assert not linears and int8.embeddings.word_embeddings.weight.dtype == torch.float32


def test_quantized_model_from_a_saved_folder_runs_in_a_pipeline(minilm, tmp_path):
    fp32, tokenizer = minilm
    fp32.save_pretrained(tmp_path / "minilm")
    tokenizer.save_pretrained(tmp_path / "minilm")
    model = quantize_dynamic(AutoModel.from_pretrained(tmp_path / "minilm"))  # the documented one-liner
    extract = pipeline("feature-extraction", model=model, tokenizer=tokenizer)
    features = torch.tensor(extract("a list is a mutable sequence.")[0])  # (S, H)
    with torch.inference_mode():
        reference = fp32(**tokenizer("a list is a mutable sequence.", return_tensors="pt")).last_hidden_state[0]
    assert features.shape == reference.shape
    assert torch.nn.functional.cosine_similarity(features.mean(0), reference.mean(0), dim=0) >= 0.99


def test_classifier_heads_keep_working_and_bad_input_is_one_clear_error():
    config = ScratchBertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, num_labels=3)
    torch.manual_seed(0)
    classifier = scratchbert.ScratchBertForSequenceClassification(config).eval()
    ids = torch.randint(5, 100, (4, 12))
    with torch.inference_mode():
        before = classifier(input_ids=ids).logits
        after = quantize_dynamic(classifier)(input_ids=ids).logits
    assert after.shape == before.shape == (4, 3) and torch.allclose(after, before, atol=0.05)
    with pytest.raises(ScratchBertError, match="already quantized"):
        quantize_dynamic(classifier)
    with pytest.raises(ScratchBertError, match="takes a scratchbert model, not Linear"):
        quantize_dynamic(torch.nn.Linear(2, 2))
