"""Shape and behaviour tests of every scratchbert model on a tiny configuration (fast)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import enable_activation_checkpointing, tiny_bert_config
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import scratchbert
from scratchbert import (
    ScratchBertConfig,
    ScratchBertForMaskedLM,
    ScratchBertForMultipleChoice,
    ScratchBertForNextSentencePrediction,
    ScratchBertForPreTraining,
    ScratchBertForQuestionAnswering,
    ScratchBertForSequenceClassification,
    ScratchBertForTokenClassification,
    ScratchBertModel,
    cpu_kernels,
)
from scratchbert.cpu_kernels import CpuSelfAttention
from scratchbert.errors import CorruptCheckpointError, ScratchBertError
from scratchbert.export import export_to_transformers_bert
from scratchbert.modeling_scratchbert import additive_attention_mask, eager_attention, eager_attention_forward, mean_pooling

VOCAB, HIDDEN, LAYERS, HEADS, SEQ = 99, 32, 2, 4, 9


def tiny_config(**overrides) -> ScratchBertConfig:
    return tiny_bert_config(**{"vocab_size": VOCAB, "intermediate_size": 37, "max_position_embeddings": 64, **overrides})


@pytest.fixture
def batch():
    """Three sequences of lengths 9, 6 and 3, two segments each, padded with 0s."""
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, VOCAB, (3, SEQ), generator=gen)
    attention_mask = torch.ones(3, SEQ, dtype=torch.long)
    attention_mask[1, 6:] = 0
    attention_mask[2, 3:] = 0
    input_ids = input_ids * attention_mask
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 4:] = 1
    token_type_ids = token_type_ids * attention_mask
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


# --- every head: shapes, losses -----------------------------------------------------------------
HEAD_CASES = [
    (ScratchBertModel, {}, {"last_hidden_state": (3, SEQ, HIDDEN), "pooler_output": (3, HIDDEN)}),
    (
        ScratchBertForPreTraining,
        {"labels": "mlm", "next_sentence_label": torch.tensor([0, 1, 0])},
        {"prediction_logits": (3, SEQ, VOCAB), "seq_relationship_logits": (3, 2)},
    ),
    (ScratchBertForMaskedLM, {"labels": "mlm"}, {"logits": (3, SEQ, VOCAB)}),
    (ScratchBertForNextSentencePrediction, {"labels": torch.tensor([1, 0, 1])}, {"logits": (3, 2)}),
    (ScratchBertForSequenceClassification, {"labels": torch.tensor([1, 0, 1])}, {"logits": (3, 2)}),
    (ScratchBertForTokenClassification, {"labels": "tags"}, {"logits": (3, SEQ, 2)}),
    (
        ScratchBertForQuestionAnswering,
        {"start_positions": torch.tensor([1, 2, 0]), "end_positions": torch.tensor([3, 4, 99])},
        {"start_logits": (3, SEQ), "end_logits": (3, SEQ)},
    ),
]


def _labels(kind, batch):
    if not isinstance(kind, str):
        return kind
    labels = torch.full_like(batch["input_ids"], -100)
    if kind == "mlm":
        labels[:, 2] = batch["input_ids"][:, 2]
    else:
        labels[batch["attention_mask"].bool()] = batch["input_ids"][batch["attention_mask"].bool()] % 2
    return labels


@pytest.mark.parametrize("model_class,label_kinds,shapes", HEAD_CASES, ids=lambda x: getattr(x, "__name__", ""))
def test_every_head_returns_shapes_and_a_finite_loss(model_class, label_kinds, shapes, batch):
    torch.manual_seed(0)
    model = model_class(tiny_config()).eval()
    out = model(**batch)
    for name, shape in shapes.items():
        assert tuple(out[name].shape) == shape, name
    if label_kinds:
        out = model(**batch, **{k: _labels(v, batch) for k, v in label_kinds.items()})
        assert out.loss.ndim == 0 and torch.isfinite(out.loss)
        out.loss.backward()
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad and p.grad is not None)


@pytest.mark.parametrize("model_class,label_kinds,shapes", HEAD_CASES, ids=lambda x: getattr(x, "__name__", ""))
def test_return_dict_false_or_config_return_dict_false_gives_the_tuple(model_class, label_kinds, shapes, batch):
    model = model_class(tiny_config()).eval()
    labels = {k: _labels(v, batch) for k, v in label_kinds.items()}
    expected = model(**batch, **labels, output_hidden_states=True).to_tuple()  # loss first, then the outputs
    by_argument = model(**batch, **labels, output_hidden_states=True, return_dict=False)
    model.config.return_dict = False  # the configuration's switch, which transformers' BERT honours too
    by_config = model(**batch, **labels, output_hidden_states=True)
    for got in (by_argument, by_config):
        assert type(got) is tuple
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert type(model(**batch, return_dict=True)) is not tuple  # an explicit True overrides the config


def test_trainer_finds_every_heads_label_columns():
    from transformers.utils import find_labels

    expected = {
        ScratchBertForPreTraining: ["labels", "next_sentence_label"],
        ScratchBertForQuestionAnswering: ["start_positions", "end_positions"],
        ScratchBertForMaskedLM: ["labels"],
        ScratchBertForNextSentencePrediction: ["labels"],
        ScratchBertForSequenceClassification: ["labels"],
        ScratchBertForTokenClassification: ["labels"],
        ScratchBertForMultipleChoice: ["labels"],
    }
    for model_class, labels in expected.items():
        assert find_labels(model_class) == labels, model_class.__name__


def test_multiple_choice_folds_choices_into_the_batch(batch):
    model = ScratchBertForMultipleChoice(tiny_config()).eval()
    choices = {k: torch.stack([v, v.flip(0)], dim=1) for k, v in batch.items()}  # (B, C=2, S)
    out = model(**choices, labels=torch.tensor([0, 1, 1]))
    assert out.logits.shape == (3, 2) and torch.isfinite(out.loss)
    # Each choice is scored independently: choice 1 of row 0 is choice 0 of row 2.
    torch.testing.assert_close(out.logits[0, 1], out.logits[2, 0], atol=1e-6, rtol=0)


def test_mlm_loss_ignores_minus_100_and_counts_only_labelled_positions(batch):
    model = ScratchBertForMaskedLM(tiny_config()).eval()
    labels = _labels("mlm", batch)
    out = model(**batch, labels=labels)
    logits = out.logits[:, 2]  # the only labelled column
    expected = torch.nn.functional.cross_entropy(logits, batch["input_ids"][:, 2])
    torch.testing.assert_close(out.loss, expected)
    # num_items_in_batch (Trainer's gradient accumulation) turns the mean into sum / count.
    summed = model(**batch, labels=labels, num_items_in_batch=6)
    torch.testing.assert_close(summed.loss, expected * 3 / 6)


@pytest.mark.parametrize(
    "num_labels,labels,problem_type",
    [
        (1, torch.tensor([0.5, -1.0, 2.0]), "regression"),
        (3, torch.tensor([0, 2, 1]), "single_label_classification"),
        (3, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]), "multi_label_classification"),
    ],
)
def test_sequence_classification_problem_types(num_labels, labels, problem_type, batch):
    model = ScratchBertForSequenceClassification(tiny_config(num_labels=num_labels)).eval()
    out = model(**batch, labels=labels)
    assert model.config.problem_type == problem_type
    logits = out.logits
    expected = {
        "regression": lambda: torch.nn.functional.mse_loss(logits.squeeze(-1), labels),
        "single_label_classification": lambda: torch.nn.functional.cross_entropy(logits, labels),
        "multi_label_classification": lambda: torch.nn.functional.binary_cross_entropy_with_logits(logits, labels),
    }[problem_type]()
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize("pooling", ["mean"])
def test_mean_pooling_classifier_reads_only_the_real_tokens(batch, pooling):
    torch.manual_seed(0)
    model = ScratchBertForSequenceClassification(tiny_config(classifier_pooling=pooling, num_labels=3)).eval()
    assert model.bert.pooler is None and not any("pooler" in key for key in model.state_dict())
    with torch.no_grad():
        logits = model(**batch).logits  # (3, 3)
        states = model.bert(**batch).last_hidden_state  # (3, S, H)
        lengths = batch["attention_mask"].sum(1).tolist()  # 9, 6, 3
        reduce = {"mean": lambda real: real.mean(0)}[pooling]
        by_hand = torch.stack([reduce(states[i, :n]) for i, n in enumerate(lengths)])  # (3, H)
        torch.testing.assert_close(logits, model.classifier(by_hand), atol=1e-6, rtol=0)
        # the padded positions play no part: the 3-token row alone gives the same logits
        alone = model(**{k: v[2:3, :3] for k, v in batch.items()}).logits
        torch.testing.assert_close(alone, logits[2:3], atol=1e-5, rtol=0)
        # and the padded path (vectors at padding) agrees with the padding-free one (zeros there)
        model.config.padding_free = False
        torch.testing.assert_close(model(**batch).logits, logits, atol=1e-5, rtol=0)
    empty = torch.zeros(1, 4, 2)
    pool = {"mean": mean_pooling}[pooling]
    assert torch.equal(pool(empty, torch.zeros(1, 4, dtype=torch.long)), torch.zeros(1, 2))  # a fully padded row: 0, not NaN


def test_max_pooling_is_no_longer_an_option():
    """Issue 75 removed "max": a config asking for it is refused when a model is built from it."""
    config = tiny_config(classifier_pooling="max")  # accepted field by field, as BertConfig is
    with pytest.raises(ScratchBertError, match=r"classifier_pooling='max': use \"cls\" .* or \"mean\""):
        ScratchBertForSequenceClassification(config)


def test_multiple_choice_reads_the_mean_of_each_pairs_real_tokens_when_told(batch, tmp_path):
    torch.manual_seed(0)
    model = ScratchBertForMultipleChoice(tiny_config(classifier_pooling="mean")).eval()
    assert model.bert.pooler is None and not any("pooler" in key for key in model.state_dict())
    choices = {name: tensor.unsqueeze(0) for name, tensor in batch.items()}  # one question, 3 choices: (1, 3, S)
    with torch.no_grad():
        logits = model(**choices).logits  # (1, 3)
        states = model.bert(**batch).last_hidden_state  # (3, S, H)
        by_hand = torch.stack([states[i, :n].mean(0) for i, n in enumerate(batch["attention_mask"].sum(1).tolist())])
        torch.testing.assert_close(logits, model.classifier(by_hand).view(1, 3), atol=1e-6, rtol=0)
    assert ScratchBertForMultipleChoice(tiny_config()).bert.pooler is not None  # BERT's [CLS] by default
    model.save_pretrained(tmp_path / "mc-mean")
    with pytest.raises(ScratchBertError, match=r"ScratchBertForMultipleChoice with classifier_pooling='mean'.*BertForMultipleChoice cannot express"):
        export_to_transformers_bert(tmp_path / "mc-mean", tmp_path / "bert-mc-mean")


def test_classifier_pooling_round_trips_through_save_and_the_auto_class(tmp_path, batch):
    from transformers import AutoModelForSequenceClassification

    model = ScratchBertForSequenceClassification(tiny_config(classifier_pooling="mean")).eval()
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["classifier_pooling"] == "mean"
    loaded, info = AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert isinstance(loaded, ScratchBertForSequenceClassification) and loaded.config.classifier_pooling == "mean"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(**batch).logits, model(**batch).logits, atol=0, rtol=0)
    assert ScratchBertConfig().classifier_pooling == "cls"  # BERT's, by default


def test_export_bert_refuses_a_mean_pooling_classifier_and_drops_the_key_otherwise(tmp_path):
    for pooling in ("mean",):
        ScratchBertForSequenceClassification(tiny_config(classifier_pooling=pooling)).save_pretrained(tmp_path / pooling)
        with pytest.raises(ScratchBertError, match=rf"classifier_pooling='{pooling}'.*BertForSequenceClassification cannot express.*export-onnx") as info:
            export_to_transformers_bert(tmp_path / pooling, tmp_path / f"bert-{pooling}")
        assert "\n" not in str(info.value) and not (tmp_path / f"bert-{pooling}").exists()
    ScratchBertForSequenceClassification(tiny_config()).save_pretrained(tmp_path / "cls")
    export_to_transformers_bert(tmp_path / "cls", tmp_path / "bert-cls")
    assert "classifier_pooling" not in json.loads((tmp_path / "bert-cls" / "config.json").read_text())
    # an encoder saved with the option is no classifier: it exports (BERT's heads pool [CLS] when fine-tuned)
    ScratchBertForMaskedLM(tiny_config(classifier_pooling="mean")).save_pretrained(tmp_path / "mlm")
    export_to_transformers_bert(tmp_path / "mlm", tmp_path / "bert-mlm")


# --- attention: the written-out math and the fused kernel ---------------------------------------
def test_eager_and_sdpa_attention_functions_agree_with_padding():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 7, 8, generator=gen) for _ in range(3))  # (B, A, S, D)
    keep = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    mask = additive_attention_mask(keep, torch.float32)
    eager, probs = eager_attention(q, k, v, mask, 0.0)
    module = torch.nn.Module()  # the registry's functions read `is_causal` (and `training`) off the layer
    module.is_causal = False
    fused, none = sdpa_attention_forward(module, q, k, v, mask, scaling=8**-0.5, dropout=0.0)  # (B, S, A, D)
    assert none is None
    torch.testing.assert_close(eager, fused.transpose(1, 2), atol=1e-6, rtol=0)
    registry_form, same_probs = eager_attention_forward(module, q, k, v, mask, scaling=8**-0.5)
    torch.testing.assert_close(registry_form, fused, atol=1e-6, rtol=0)
    assert torch.equal(same_probs, probs)
    # Padded keys get zero weight; every query's weights sum to one.
    assert probs[1, :, :, 4:].abs().max() == 0
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 7))


@pytest.mark.parametrize("autocast", [False, True])
def test_stacked_qkv_projection_equals_three_linear_layers(autocast, monkeypatch):
    """The CPU fast path's `project` multiplies once by the stacked (3H, H) weight: the same as query, key, value in turn."""
    torch.manual_seed(0)
    attention = ScratchBertModel(tiny_config()).encoder.layer[0].attention.self
    assert isinstance(attention, CpuSelfAttention)  # config.cpu_kernels is on by default
    x = torch.randn(3, SEQ, HIDDEN)
    calls = []
    monkeypatch.setattr(cpu_kernels, "stack_qkv", lambda x: calls.append(x.shape) or True)  # stack on any CPU
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        stacked = attention.project(x)
        assert calls == [x.shape]
        separate = (attention.query(x), attention.key(x), attention.value(x))
    for a, b in zip(stacked, separate):
        assert a.shape == (3, SEQ, HIDDEN) and a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=2e-2 if autocast else 1e-6, rtol=0)


def test_model_outputs_agree_under_eager_and_sdpa(batch, tmp_path):
    torch.manual_seed(0)
    ScratchBertForPreTraining(tiny_config()).save_pretrained(tmp_path)
    eager = ScratchBertForPreTraining.from_pretrained(tmp_path, attn_implementation="eager").eval()
    sdpa = ScratchBertForPreTraining.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    a, b = eager(**batch), sdpa(**batch)
    torch.testing.assert_close(a.prediction_logits, b.prediction_logits, atol=1e-5, rtol=0)


def test_output_attentions_under_sdpa_returns_real_maps(batch):
    model = ScratchBertModel(tiny_config()).eval()
    assert model.config._attn_implementation == "sdpa"
    out = model(**batch, output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == LAYERS and len(out.hidden_states) == LAYERS + 1
    for probs in out.attentions:
        assert probs.shape == (3, HEADS, SEQ, SEQ)
        assert probs[2, :, :, 3:].abs().max() == 0  # row 2 has 3 real tokens
    # Asking for the maps (padded layout) does not change the result at the real tokens.
    plain = model(**batch)  # padding-free layout
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(out.last_hidden_state[real], plain.last_hidden_state[real], atol=1e-5, rtol=0)


def test_padding_does_not_change_real_token_outputs(batch):
    model = ScratchBertModel(tiny_config()).eval()
    short = {k: v[2:3, :3] for k, v in batch.items()}  # the 3-token row without its padding
    padded = {k: v[2:3] for k, v in batch.items()}
    torch.testing.assert_close(model(**short).last_hidden_state, model(**padded).last_hidden_state[:, :3], atol=1e-5, rtol=0)


def test_fully_padded_row_gives_no_nan(batch):
    batch["attention_mask"][2] = 0
    out = ScratchBertModel(tiny_config()).eval()(**batch)
    assert torch.isfinite(out.last_hidden_state).all()


def test_dropout_is_active_in_training_only(batch):
    model = ScratchBertModel(tiny_config(hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5))
    model.eval()
    torch.testing.assert_close(model(**batch).last_hidden_state, model(**batch).last_hidden_state)
    model.train()
    assert not torch.allclose(model(**batch).last_hidden_state, model(**batch).last_hidden_state)


def test_gradient_checkpointing_gives_the_same_gradients(batch):
    torch.manual_seed(0)
    model = ScratchBertForMaskedLM(tiny_config()).train()
    labels = _labels("mlm", batch)

    def grads():
        model.zero_grad()
        model(**batch, labels=labels).loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    enable_activation_checkpointing(model, {"use_reentrant": False})
    assert all(layer.gradient_checkpointing for layer in model.bert.encoder.layer)
    for a, b in zip(plain, grads()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


# --- tied embeddings ----------------------------------------------------------------------------
def test_mlm_decoder_is_tied_to_word_embeddings_and_stays_tied_after_resize(tmp_path):
    model = ScratchBertForPreTraining(tiny_config())
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    model.resize_token_embeddings(VOCAB + 7, mean_resizing=False)
    assert model.config.vocab_size == VOCAB + 7
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert model.cls.predictions.bias.shape == (VOCAB + 7,)
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    model.save_pretrained(tmp_path)
    reloaded = ScratchBertForPreTraining.from_pretrained(tmp_path)
    assert reloaded.get_output_embeddings().weight is reloaded.get_input_embeddings().weight
    torch.testing.assert_close(reloaded.get_input_embeddings().weight, model.get_input_embeddings().weight)


# --- clear errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change,message",
    [
        (lambda b: b.update(input_ids=b["input_ids"] + VOCAB), r"outside the vocabulary \[0, 99\)"),
        (lambda b: b.update(token_type_ids=b["token_type_ids"] * 2), r"type_vocab_size=2"),
        (lambda b: b.update(attention_mask=b["attention_mask"][:, :5]), r"attention_mask has shape \(3, 5\)"),
        (lambda b: b.update({k: v.repeat(1, 8) for k, v in b.items()}), r"longer than max_position_embeddings=64"),
        (lambda b: b.update(input_ids=b["input_ids"][0]), r"shape \(batch, sequence\)"),
    ],
    ids=["vocab", "token-type", "shape-mismatch", "too-long", "no-batch-dim"],
)
def test_bad_inputs_raise_clear_errors(change, message, batch):
    model = ScratchBertModel(tiny_config()).eval()
    change(batch)
    with pytest.raises(ValueError, match=message):
        model(**batch)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(hidden_size=30, num_attention_heads=4), r"hidden_size=30 is not divisible by num_attention_heads=4"),
        (dict(num_hidden_layers=0), r"num_hidden_layers=0: it must be a positive integer"),
        (dict(hidden_act="swishy"), r"hidden_act='swishy' is not a known activation"),
        (dict(hidden_dropout_prob=1.5), r"hidden_dropout_prob=1.5"),
        (dict(pad_token_id=500), r"pad_token_id=500 is outside the vocabulary"),
        (dict(classifier_pooling="sum"), r"classifier_pooling='sum': use \"cls\" .* or \"mean\""),
    ],
)
def test_config_is_validated_when_a_model_is_built_from_it(fields, message):
    config = tiny_config(**fields)  # accepted field by field, as BertConfig is
    with pytest.raises(ValueError, match=message) as info:
        ScratchBertModel(config)
    assert "\n" not in str(info.value)


def test_config_accepts_transformers_bert_config_files(tmp_path, rxnfp_dir, minilm_dir):
    minilm = ScratchBertConfig.from_pretrained(minilm_dir)  # model_type "bert"
    assert (minilm.hidden_size, minilm.num_hidden_layers, minilm.vocab_size) == (384, 6, 30522)
    rxnfp = ScratchBertConfig.from_pretrained(rxnfp_dir)  # no model_type at all
    assert (rxnfp.hidden_size, rxnfp.num_attention_heads, rxnfp.vocab_size) == (256, 4, 591)
    assert rxnfp.pad_token_id == 0 and rxnfp.model_type == "scratchbert"


def test_missing_and_corrupt_checkpoints_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        ScratchBertModel.from_pretrained(tmp_path / "nowhere")
    ScratchBertModel(tiny_config()).save_pretrained(tmp_path / "good")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text((tmp_path / "good" / "config.json").read_text())
    (corrupt / "model.safetensors").write_bytes((tmp_path / "good" / "model.safetensors").read_bytes()[:500])
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors is corrupt or incomplete \(SafetensorError: ") as info:
        ScratchBertModel.from_pretrained(corrupt)
    assert "\n" not in str(info.value)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo exploited > exploited.txt",))


def test_pickled_code_in_bin_weights_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ScratchBertModel(tiny_config()).save_pretrained(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "model.safetensors").unlink()
    torch.save({"embeddings.word_embeddings.weight": _Exploit()}, tmp_path / "ckpt" / "pytorch_model.bin")
    with pytest.raises(ValueError, match="weights_only=True"):
        ScratchBertModel.from_pretrained(tmp_path / "ckpt")
    assert not (tmp_path / "exploited.txt").exists()


# --- Hugging Face integration -------------------------------------------------------------------
def test_auto_classes_build_scratchbert_models(tmp_path):
    import transformers

    model = ScratchBertForPreTraining(tiny_config())
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "scratchbert"
    assert saved["auto_map"]["AutoModelForMaskedLM"] == "modeling_scratchbert.ScratchBertForMaskedLM"
    assert (tmp_path / "modeling_scratchbert.py").is_file() and (tmp_path / "configuration_scratchbert.py").is_file()
    for auto_name, target in scratchbert.AUTO_MAP.items():
        if auto_name == "AutoConfig":
            continue
        loaded = getattr(transformers, auto_name).from_pretrained(tmp_path)
        assert type(loaded).__name__ == target.split(".")[-1]
