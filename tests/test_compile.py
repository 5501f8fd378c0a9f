"""torch.compile: the model compiles to one graph, with no graph break, that serves every batch shape.

Under a compiler the model takes the padded path (`bert_padding.is_tracing`), which decides
nothing from the mask's values, so `fullgraph=True` holds and `dynamic=True` needs no recompile
when the batch size or length changes. The fast tests compile with a backend that only counts
the graphs dynamo hands it (tracing is what can break or recompile); the slow one runs inductor.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from conftest import tiny_bert_config

from scratchbert import ScratchBertForMaskedLM, ScratchBertForSequenceClassification, ScratchBertModel
from scratchbert.onnx_export import example_batch

VOCAB = 99
# Batch sizes from 2 up (torch specialises sizes 0 and 1, so one sequence gets a graph of its own);
# lengths on both sides of the bmm-attention cut-off (`cpu_gemm.BMM_ATTENTION_MAX_LENGTH`, at most 128, on the CPU fast path);
# one batch with no padding at all.
SHAPES = [(3, 9), (5, 17), (2, 140), (7, 3), (4, 33)]


def batches():
    for i, (size, longest) in enumerate(SHAPES):
        lengths = (longest,) * size if i == 1 else tuple(max(1, longest - 3 * j) for j in range(size))
        yield example_batch(VOCAB, lengths, seed=i, segments=True)


def tiny(model_class, **config):
    torch.manual_seed(0)
    return model_class(tiny_bert_config(vocab_size=VOCAB, intermediate_size=37, max_position_embeddings=160, **config))


class GraphCounter:
    """A torch.compile backend that runs each graph as traced and counts them: one per (re)compile."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return graph_module.forward


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("model_class", [ScratchBertModel, ScratchBertForMaskedLM, ScratchBertForSequenceClassification])
def test_inference_compiles_once_without_graph_breaks_for_every_batch_shape(model_class):
    model = tiny(model_class).eval()
    counter = GraphCounter()
    compiled = torch.compile(model, backend=counter, dynamic=True, fullgraph=True)  # fullgraph: a break raises
    with torch.no_grad():
        for batch in batches():
            got, expected = compiled(**batch), model(**batch)  # eager: the padding-free path
            keep = batch["attention_mask"].bool()
            for name, value in expected.items():
                torch.testing.assert_close(
                    got[name][keep] if value.dim() == 3 else got[name], value[keep] if value.dim() == 3 else value, atol=1e-5, rtol=1e-4
                )
    assert counter.graphs == 1


def test_training_step_with_mlm_labels_compiles_once_without_graph_breaks():
    """Sparse MLM prediction picks rows by the labels' values; compiled, the head runs densely instead."""
    model = tiny(ScratchBertForMaskedLM, hidden_dropout_prob=0.1).train()
    counter = GraphCounter()
    compiled = torch.compile(model, backend=counter, dynamic=True, fullgraph=True)
    for batch in list(batches())[:3]:
        labels = torch.where(batch["attention_mask"].bool() & (batch["input_ids"] % 4 == 0), batch["input_ids"], -100)
        labels[:, 0] = batch["input_ids"][:, 0]
        compiled(**batch, labels=labels).loss.backward()
        model.eval()
        with torch.no_grad():  # without dropout, the compiled loss is the eager (sparse) one
            torch.testing.assert_close(compiled(**batch, labels=labels).loss, model(**batch, labels=labels).loss, atol=1e-5, rtol=1e-5)
        model.train()
    assert counter.graphs == 2  # one graph in training mode, one in eval mode; none per shape


def test_explain_reports_one_graph_and_no_break():
    explanation = torch._dynamo.explain(tiny(ScratchBertModel).eval())(**next(batches()))
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons


@pytest.mark.slow
def test_inductor_compiled_model_matches_eager_across_shapes():
    model = tiny(ScratchBertModel).eval()
    compiled = torch.compile(model, dynamic=True)
    with torch.no_grad():
        for batch in list(batches())[:3]:
            keep = batch["attention_mask"].bool()
            torch.testing.assert_close(compiled(**batch).last_hidden_state[keep], model(**batch).last_hidden_state[keep], atol=1e-5, rtol=1e-4)
