"""ONNX export: onnxruntime computes what scratchbert computes in PyTorch, for any batch shape.

Real MiniLM weights on real sentences through both exporters (torch.export and the TorchScript
tracer); the fill-mask and sequence-classification graphs on a tiny model; the errors a user
can meet (corrupt or missing weights, a checkpoint without the task's head).
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_bert_config
from test_parity import novel_sentences

from scratchbert import ScratchBertForMaskedLM, ScratchBertForSequenceClassification, ScratchBertModel, onnx_export
from scratchbert.errors import CorruptCheckpointError, ScratchBertError
from scratchbert.onnx_export import INPUT_NAMES, TOLERANCE, export_onnx

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install -e '.[test]')")
pytest.importorskip("onnxscript", reason="onnxscript (torch's dynamo ONNX exporter needs it) is not installed")

EXPORTERS = [pytest.param(True, id="dynamo"), pytest.param(False, id="torchscript")]
# The heads add no exporter-specific code, and a dynamo export takes seconds more: the default run
# checks them through TorchScript (MiniLM above covers torch.export), the slow run through both.
HEAD_EXPORTERS = [pytest.param(True, id="dynamo", marks=pytest.mark.slow), pytest.param(False, id="torchscript")]


def run_onnx(path, batch) -> torch.Tensor:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {name: batch[name].numpy() for name in INPUT_NAMES})
    return torch.from_numpy(out)


def max_diff_at_real_tokens(onnx_out, torch_out, attention_mask) -> float:
    return float((onnx_out - torch_out).abs()[attention_mask.bool()].max())


# --- real weights, real sentences -------------------------------------------------------------
@pytest.fixture(scope="module", params=EXPORTERS)
def minilm_onnx(request, minilm_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("minilm-onnx")
    result = export_onnx(minilm_dir, out, dynamo=request.param)
    return result, out


@pytest.fixture(scope="module")
def minilm_torch(minilm_dir):
    return ScratchBertModel.from_pretrained(minilm_dir, add_pooling_layer=False).eval()


def real_batches(tokenizer, sentences):
    """Real sentences as the batches users send: padded, full (no padding), single, 7 ragged ones."""

    def encode(*texts, **options):
        return dict(tokenizer(*texts, return_tensors="pt", truncation=True, **options))

    long_ones = [s for s in sentences if len(tokenizer.tokenize(s)) > 20][:3]
    return {
        "padded": encode(sentences[:4], padding=True),
        "full": encode(long_ones, padding="max_length", max_length=16),
        "single": encode(sentences[4:5]),
        "seven ragged": encode(sentences[5:12], padding=True),
        "pairs": encode(sentences[12:15], sentences[15:18], padding=True),
    }


def test_minilm_onnx_matches_pytorch_on_real_sentences(minilm_onnx, minilm_torch, shared_data):
    from transformers import AutoTokenizer

    result, out = minilm_onnx
    assert result.path == out / "model.onnx" and result.max_abs_diff is not None and result.max_abs_diff <= TOLERANCE
    tokenizer = AutoTokenizer.from_pretrained(out)  # the tokenizer files were copied beside the graph
    batches = real_batches(tokenizer, novel_sentences(shared_data, 18))
    assert bool(batches["full"]["attention_mask"].all()) and not bool(batches["padded"]["attention_mask"].all())
    assert batches["single"]["input_ids"].shape[0] == 1 and batches["seven ragged"]["input_ids"].shape[0] == 7
    assert (batches["pairs"]["token_type_ids"] == 1).any()
    for kind, batch in batches.items():
        with torch.no_grad():
            expected = minilm_torch(**batch).last_hidden_state  # eager: the padding-free path
        diff = max_diff_at_real_tokens(run_onnx(result.path, batch), expected, batch["attention_mask"])
        assert diff <= TOLERANCE, f"{kind}: onnxruntime differs from PyTorch by {diff:.2e}"


# --- the other tasks, on a tiny model -----------------------------------------------------------
def tiny_checkpoint(model_class, path, **config):
    torch.manual_seed(0)
    model_class(tiny_bert_config(vocab_size=99, intermediate_size=37, max_position_embeddings=64, **config)).save_pretrained(path)
    return path


@pytest.mark.parametrize("dynamo", HEAD_EXPORTERS)
def test_fill_mask_graph_gives_pytorchs_logits(tmp_path, dynamo):
    ckpt = tiny_checkpoint(ScratchBertForMaskedLM, tmp_path / "mlm")
    result = export_onnx(ckpt, tmp_path / "onnx", task="fill-mask", dynamo=dynamo)
    assert result.max_abs_diff <= TOLERANCE
    batch = onnx_export.example_batch(99, lengths=(5, 12, 1, 7, 12), seed=7, segments=True)  # a shape it never saw
    model = ScratchBertForMaskedLM.from_pretrained(ckpt).eval()
    with torch.no_grad():
        expected = model(**batch).logits  # (B, S, V)
    got = run_onnx(result.path, batch)
    assert got.shape == (5, 12, 99)
    assert max_diff_at_real_tokens(got, expected, batch["attention_mask"]) <= TOLERANCE


@pytest.mark.parametrize("dynamo", HEAD_EXPORTERS)
def test_sequence_classification_graph_gives_pytorchs_logits(tmp_path, dynamo):
    ckpt = tiny_checkpoint(ScratchBertForSequenceClassification, tmp_path / "cls", num_labels=3)
    result = export_onnx(ckpt, tmp_path / "onnx", task="sequence-classification", dynamo=dynamo)
    assert result.max_abs_diff <= TOLERANCE and (tmp_path / "onnx" / "config.json").is_file()
    batch = onnx_export.example_batch(99, lengths=(3, 10, 10, 6, 1, 9), seed=8)
    model = ScratchBertForSequenceClassification.from_pretrained(ckpt).eval()
    with torch.no_grad():
        expected = model(**batch).logits  # (B, 3)
    got = run_onnx(result.path, batch)
    assert got.shape == (6, 3)
    torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("pooling", ["mean"])  # "max" was removed (issue 75)
@pytest.mark.parametrize("dynamo", HEAD_EXPORTERS)
def test_a_mean_or_max_pooling_classifier_exports_and_pools_only_real_tokens(tmp_path, dynamo, pooling):
    """The graph records the padded computation, whose padded positions hold vectors: the pooling must leave them out."""
    ckpt = tiny_checkpoint(ScratchBertForSequenceClassification, tmp_path / pooling, num_labels=3, classifier_pooling=pooling)
    result = export_onnx(ckpt, tmp_path / "onnx", task="sequence-classification", dynamo=dynamo)
    assert result.max_abs_diff <= TOLERANCE
    batch = onnx_export.example_batch(99, lengths=(3, 10, 10, 6, 1, 9), seed=8)
    model = ScratchBertForSequenceClassification.from_pretrained(ckpt).eval()
    assert model.config.classifier_pooling == pooling
    got = run_onnx(result.path, batch)
    with torch.no_grad():
        torch.testing.assert_close(got, model(**batch).logits, atol=TOLERANCE, rtol=0)  # (B, 3)
        alone = model(**{name: tensor[4:5, :1] for name, tensor in batch.items()}).logits  # the 1-token row unpadded
    torch.testing.assert_close(got[4:5], alone, atol=TOLERANCE, rtol=0)


# --- errors a user can meet ---------------------------------------------------------------------
def test_truncated_or_missing_weights_give_one_line_errors(tmp_path):
    ckpt = tiny_checkpoint(ScratchBertModel, tmp_path / "ckpt")
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # a copy that stopped early
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors is corrupt or incomplete") as truncated:
        export_onnx(ckpt, tmp_path / "onnx")
    weights.unlink()
    with pytest.raises(ScratchBertError, match=r"has a config\.json but no weights \(model\.safetensors or pytorch_model\.bin\)") as missing:
        export_onnx(ckpt, tmp_path / "onnx")
    (ckpt / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no model in") as nothing:
        export_onnx(ckpt, tmp_path / "onnx")
    for error in (truncated, missing, nothing):
        assert "\n" not in str(error.value)
    assert not (tmp_path / "onnx" / "model.onnx").exists()


def test_a_checkpoint_without_the_tasks_head_is_refused(tmp_path):
    ckpt = tiny_checkpoint(ScratchBertModel, tmp_path / "encoder")
    with pytest.raises(ScratchBertError, match=r"no weights for classifier\.bias .*holds no sequence-classification head"):
        export_onnx(ckpt, tmp_path / "onnx", task="sequence-classification")
    with pytest.raises(ScratchBertError, match="task='summarisation' is not one scratchbert exports"):
        export_onnx(ckpt, tmp_path / "onnx", task="summarisation")


def test_a_graph_that_disagrees_with_pytorch_fails_and_without_onnxruntime_nothing_is_claimed(tmp_path, monkeypatch):
    ckpt = tiny_checkpoint(ScratchBertModel, tmp_path / "ckpt")
    monkeypatch.setattr(onnx_export, "TOLERANCE", -1.0)  # no graph can pass: the check must say so
    with pytest.raises(ScratchBertError, match="does not match PyTorch: onnxruntime's outputs differ by up to"):
        export_onnx(ckpt, tmp_path / "onnx", dynamo=False)
    monkeypatch.setattr(onnx_export, "onnxruntime_installed", lambda: False)
    result = export_onnx(ckpt, tmp_path / "onnx", dynamo=False)
    assert result.max_abs_diff is None and "not checked" in str(result)


def test_an_int8_graph_off_by_more_than_int8s_own_error_fails(tmp_path, monkeypatch):
    """The int8 check allows int8's own rounding noise, not a wrong graph: weight scales ten times too large must fail it."""
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install -e '.[test]')")
    from onnx import numpy_helper

    real_int8_graph = onnx_export.int8_graph

    def scales_too_large(model, layers):
        graph = real_int8_graph(model, layers)
        for tensor in graph.graph.initializer:
            if tensor.name.endswith("_scale"):  # a weight's scales per output channel
                tensor.CopyFrom(numpy_helper.from_array(10 * numpy_helper.to_array(tensor), tensor.name))
        return graph

    ckpt = tiny_checkpoint(ScratchBertForSequenceClassification, tmp_path / "ckpt")
    assert export_onnx(ckpt, tmp_path / "good", task="sequence-classification", dynamo=False, int8=True).int8
    monkeypatch.setattr(onnx_export, "int8_graph", scales_too_large)
    with pytest.raises(ScratchBertError, match="does not match PyTorch"):
        export_onnx(ckpt, tmp_path / "bad", task="sequence-classification", dynamo=False, int8=True)
