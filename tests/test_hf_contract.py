"""scratchbert behaves as transformers' own BERT wherever transformers' tools reach in (issue 76).

Every test puts scratchbert beside transformers' `BertModel` / `BertForMaskedLM` / `BertTokenizer`
on the same weights and inputs and asks the same question of both: activation checkpointing
(enabled, disabled, inspected, `every_n_layers`, under `Trainer`), the attention implementation
(chosen at load time, switched at run time, through the registry), output capture
(`output_hidden_states` as a flag or a selection, `output_attentions`, `_can_record_outputs`),
configs built field by field, the tokenizer's pair encodings and constructor, and the class
attributes transformers reads off a `PreTrainedModel`.

One deliberate difference, tested as such: under "sdpa", `output_attentions=True` returns real
attention maps (the call runs the written-out math), where BertModel warns and returns none.
"""

from __future__ import annotations

import itertools
import re

import pytest
import torch
import transformers
from conftest import enable_activation_checkpointing
from transformers import BertConfig, BertForMaskedLM, BertModel, BertTokenizer
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

import scratchbert.modeling_scratchbert as modeling
from scratchbert import ScratchBertConfig, ScratchBertForMaskedLM, ScratchBertForPreTraining, ScratchBertModel, ScratchBertTokenizer
from scratchbert.errors import ScratchBertError

TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
ATOL = 1e-5


@pytest.fixture(autouse=True)
def plain_gemm_kernels(monkeypatch):
    """torch's own GEMM calls, as transformers makes them (see tests/test_parity.py): the measured
    kernels sum in another order, ~1e-5 apart on MiniLM's hidden states."""
    monkeypatch.setenv("SCRATCHBERT_GEMM", "mkl")


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    """One random BertForMaskedLM, saved: both libraries load these weights."""
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("bert-mlm")
    BertForMaskedLM(BertConfig(**TINY)).save_pretrained(directory)
    return directory


def pair(ours_class, theirs_class, directory, **kwargs):
    return ours_class.from_pretrained(directory, **kwargs), theirs_class.from_pretrained(directory, **kwargs)


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Three rows, two of them padded (9, 6, 3 real tokens), sentence-pair token types."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, TINY["vocab_size"], (3, 9), generator=gen)
    attention_mask = torch.zeros_like(input_ids)
    for row, length in enumerate((9, 6, 3)):
        attention_mask[row, :length] = 1
    token_type_ids = (torch.arange(9) >= 5).long().expand(3, 9).contiguous()
    return dict(input_ids=input_ids * attention_mask, attention_mask=attention_mask, token_type_ids=token_type_ids)


def assert_close(name, ours, theirs, atol=ATOL, keep=None):
    assert ours.shape == theirs.shape, f"{name}: {tuple(ours.shape)} != {tuple(theirs.shape)}"
    if keep is not None:
        ours, theirs = ours[keep], theirs[keep]
    diff = (ours.detach() - theirs.detach()).abs().max().item()
    assert diff <= atol, f"{name}: max |diff| {diff:.3g} > {atol:g}"


# --- 1. activation (gradient) checkpointing -----------------------------------------------------
def checkpointing_flags(model) -> list[bool]:
    return [layer.gradient_checkpointing for layer in model.base_model.encoder.layer]


def test_layers_are_transformers_checkpointing_layers(mlm_dir):
    ours, theirs = pair(ScratchBertForMaskedLM, BertForMaskedLM, mlm_dir)
    assert all(isinstance(layer, GradientCheckpointingLayer) for layer in ours.bert.encoder.layer)
    assert not hasattr(ours.bert.encoder, "gradient_checkpointing")  # one mechanism: the layers'
    # the documented way to find the checkpointed blocks finds one in each
    for model in (ours, theirs):
        assert next(m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)) is model.base_model.encoder.layer[0]
        assert model.supports_gradient_checkpointing and not model.is_activation_checkpointing


@pytest.mark.parametrize("every_n_layers", [1, 2, 3])
def test_enable_disable_and_every_n_layers_as_bert(mlm_dir, every_n_layers):
    ours, theirs = pair(ScratchBertForMaskedLM, BertForMaskedLM, mlm_dir)
    for model in (ours, theirs):
        model.activation_checkpointing_enable(every_n_layers=every_n_layers)
    assert checkpointing_flags(ours) == checkpointing_flags(theirs)
    assert checkpointing_flags(ours) == [i % every_n_layers == 0 for i in range(TINY["num_hidden_layers"])]
    assert ours.is_activation_checkpointing and theirs.is_activation_checkpointing
    assert ours.bert.gradient_checkpointing == theirs.bert.gradient_checkpointing
    for model in (ours, theirs):
        model.activation_checkpointing_disable()
    assert checkpointing_flags(ours) == checkpointing_flags(theirs) == [False] * TINY["num_hidden_layers"]
    assert not ours.is_activation_checkpointing and not theirs.is_activation_checkpointing


def mlm_gradients(model, inputs, labels) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(**inputs, labels=labels).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpointed_gradients_equal_plain_ones_and_berts(mlm_dir, use_reentrant):
    ours, theirs = pair(ScratchBertForMaskedLM, BertForMaskedLM, mlm_dir)
    inputs = batch()
    labels = torch.where(inputs["attention_mask"].bool(), inputs["input_ids"], -100)
    ours.train(), theirs.train()
    plain = mlm_gradients(ours, inputs, labels)
    for model in (ours, theirs):
        enable_activation_checkpointing(model, {"use_reentrant": use_reentrant})
    checkpointed, reference = mlm_gradients(ours, inputs, labels), mlm_gradients(theirs, inputs, labels)
    assert plain.keys() == checkpointed.keys() and len(plain) > 30
    for name in plain:
        assert_close(f"grad {name} (checkpointed vs plain)", checkpointed[name], plain[name], atol=1e-6)
        assert_close(f"grad {name} (vs BertForMaskedLM)", checkpointed[name], reference[name])


def test_trainer_with_gradient_checkpointing_takes_the_same_step(mlm_dir, tmp_path, fresh_accelerator_state):
    """One SGD step under `Trainer`: with checkpointing, without it, and transformers' BERT with it."""
    inputs = batch()
    labels = torch.where(inputs["attention_mask"].bool(), inputs["input_ids"], -100)
    rows = [{**{k: v[i] for k, v in inputs.items()}, "labels": labels[i]} for i in range(3)]

    def one_step(model_class, checkpointing: bool) -> dict[str, torch.Tensor]:
        model = model_class.from_pretrained(mlm_dir)
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / f"{model_class.__name__}-{checkpointing}"), max_steps=1, per_device_train_batch_size=3,
            learning_rate=0.5, optim="sgd", lr_scheduler_type="constant", gradient_checkpointing=checkpointing,
            report_to="none", save_strategy="no", use_cpu=True, dataloader_num_workers=0, seed=0,
        )
        transformers.Trainer(model=model, args=args, train_dataset=rows).train()
        assert model.is_activation_checkpointing == checkpointing
        return {name: p.detach().clone() for name, p in model.named_parameters()}

    checkpointed, plain = one_step(ScratchBertForMaskedLM, True), one_step(ScratchBertForMaskedLM, False)
    reference = one_step(BertForMaskedLM, True)
    start = dict(ScratchBertForMaskedLM.from_pretrained(mlm_dir).named_parameters())
    moved = [name for name in plain if not torch.equal(plain[name], start[name])]
    assert len(moved) > 30  # the step really changed the weights
    for name in plain:
        assert_close(f"{name} after a step (checkpointed vs plain)", checkpointed[name], plain[name], atol=1e-6)
        assert_close(f"{name} after a step (vs BertForMaskedLM)", checkpointed[name], reference[name])


# --- 2. attention implementations through transformers' registry --------------------------------
def test_attention_support_flags_are_berts():
    for flag in ("_supports_sdpa", "_supports_flash_attn", "_supports_flex_attn", "_supports_attention_backend"):
        assert getattr(ScratchBertModel, flag) is getattr(BertModel, flag) is True, flag
    assert ScratchBertModel._can_set_attn_implementation() and BertModel._can_set_attn_implementation()


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_each_implementation_at_load_time_matches_bert(mlm_dir, implementation):
    ours, theirs = pair(ScratchBertModel, BertModel, mlm_dir, attn_implementation=implementation)
    assert ours.config._attn_implementation == theirs.config._attn_implementation == implementation
    inputs = batch()
    keep = inputs["attention_mask"].bool()
    with torch.no_grad():
        a, b = ours.eval()(**inputs), theirs.eval()(**inputs)
    assert_close(f"{implementation} last_hidden_state", a.last_hidden_state, b.last_hidden_state, keep=keep)


@pytest.mark.slow  # flex attention compiles its kernel (about 10 s on 2 cores)
def test_flex_attention_matches_bert(mlm_dir):
    ours, theirs = pair(ScratchBertModel, BertModel, mlm_dir, attn_implementation="flex_attention")
    assert ours.config._attn_implementation == "flex_attention"
    inputs = batch()
    keep = inputs["attention_mask"].bool()
    with torch.no_grad():  # flex attention has no backward on the CPU
        a, b = ours.eval()(**inputs), theirs.eval()(**inputs)
    assert_close("flex last_hidden_state", a.last_hidden_state, b.last_hidden_state, keep=keep)


def test_flex_attention_is_accepted_and_builds_transformers_mask(mlm_dir, monkeypatch):
    """flex_attention loads (BertModel's answer), and its mask is the registry's own, not the additive one."""
    ours, theirs = pair(ScratchBertModel, BertModel, mlm_dir, attn_implementation="flex_attention")
    assert ours.config._attn_implementation == theirs.config._attn_implementation == "flex_attention"
    built = []
    monkeypatch.setattr(modeling, "create_bidirectional_mask", lambda *a, **k: built.append(a[0]._attn_implementation) or None)
    monkeypatch.setattr(ours.config, "_attn_implementation_internal", "eager", raising=False)
    with torch.no_grad():
        ours.eval()(**batch())
    assert built == []  # eager: the model's own additive mask
    ours.set_attn_implementation("flex_attention")
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "flex_attention", modeling.eager_attention_forward)
    with torch.no_grad():
        ours(**batch())
    assert built == ["flex_attention"]


def test_flash_attention_without_its_package_fails_as_for_bert(mlm_dir):
    errors = []
    for model_class in (ScratchBertModel, BertModel):
        with pytest.raises(ImportError) as info:
            model_class.from_pretrained(mlm_dir, attn_implementation="flash_attention_2")
        errors.append(str(info.value))
    assert errors[0] == errors[1]


@pytest.fixture
def counting_attention():
    """A custom entry in transformers' registry (as a Hub kernel would be), counting its calls."""
    calls = []

    def counting(module, query, key, value, attention_mask, **kwargs):
        calls.append(type(module).__name__)
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("counting_test", counting)
    yield calls
    ALL_ATTENTION_FUNCTIONS._global_mapping.pop("counting_test", None)


def test_set_attn_implementation_really_switches_through_the_registry(mlm_dir, counting_attention):
    ours, theirs = pair(ScratchBertModel, BertModel, mlm_dir)
    inputs = batch()
    keep = inputs["attention_mask"].bool()
    ours.config.padding_free = False  # the padded layout: one call per layer, as BertModel
    for model in (ours, theirs):
        model.eval().set_attn_implementation("counting_test")
        assert model.config._attn_implementation == "counting_test"
    with torch.no_grad():
        a, b = ours(**inputs), theirs(**inputs)
    assert counting_attention == ["ScratchBertSelfAttention" if "Scratch" in name else name for name in counting_attention]
    assert len(counting_attention) == 2 * TINY["num_hidden_layers"]
    assert_close("registry function", a.last_hidden_state, b.last_hidden_state, keep=keep)
    # back to eager: the written-out math, which returns the probabilities
    for model in (ours, theirs):
        model.set_attn_implementation("eager")
    with torch.no_grad():
        a, b = ours(**inputs, output_attentions=True), theirs(**inputs, output_attentions=True)
    assert len(counting_attention) == 2 * TINY["num_hidden_layers"]
    for i, (x, y) in enumerate(zip(a.attentions, b.attentions, strict=True)):
        assert_close(f"attentions[{i}] after switching to eager", x, y, atol=1e-6)


def test_padding_free_path_runs_eager_and_sdpa_only(mlm_dir, counting_attention, monkeypatch):
    packings = []
    real = modeling.pack_sequences
    monkeypatch.setattr(modeling, "pack_sequences", lambda *a, **k: packings.append(1) or real(*a, **k))
    ours = ScratchBertModel.from_pretrained(mlm_dir).eval()
    with torch.no_grad():
        for implementation in ("sdpa", "eager", "counting_test"):
            ours.set_attn_implementation(implementation)
            ours(**batch())
    assert len(packings) == 2  # sdpa and eager packed; the registry's other functions get the padded layout
    assert len(counting_attention) == TINY["num_hidden_layers"]


# --- 3. output capture --------------------------------------------------------------------------
def test_recordable_outputs_are_berts():
    assert set(ScratchBertModel._can_record_outputs) == set(BertModel._can_record_outputs) - {"cross_attentions"}
    assert ScratchBertModel._can_record_outputs["hidden_states"] is modeling.ScratchBertLayer
    assert ScratchBertModel._can_record_outputs["attentions"] is modeling.ScratchBertSelfAttention


@pytest.mark.parametrize("selection", [True, [0, 2], [1], -1, [-1, 0], 3])
def test_hidden_state_selection_as_bert(minilm_dir, selection):
    ours, theirs = pair(ScratchBertModel, BertModel, minilm_dir)
    inputs = batch()
    with torch.no_grad():
        a, b = ours.eval()(**inputs, output_hidden_states=selection), theirs.eval()(**inputs, output_hidden_states=selection)
    assert len(a.hidden_states) == len(b.hidden_states)
    for i, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states)):
        assert (x is None) == (y is None), f"hidden_states[{i}]: {x is None} vs {y is None}"
        if x is not None:  # the padded layout: vectors at padding too, as BertModel's
            keep = inputs["attention_mask"].bool()
            assert_close(f"hidden_states[{i}] at real tokens", x, y, keep=keep)
            # at padding the CPU fast path's attention sums in another order (plain modules: exact)
            assert_close(f"hidden_states[{i}] at padding", x, y, atol=1e-4, keep=~keep)


def test_outputs_from_the_config_and_as_tuples_as_bert(mlm_dir):
    ours, theirs = pair(ScratchBertModel, BertModel, mlm_dir, attn_implementation="eager")
    inputs = batch()
    for model in (ours, theirs):
        model.eval().config.output_hidden_states = True
        model.config.output_attentions = True
    with torch.no_grad():
        a, b = ours(**inputs, return_dict=False), theirs(**inputs, return_dict=False)
    # BertModel's tuple ends with its decoder's cross-attentions, recorded with the attentions: () for an encoder
    assert b[4:] == ((),)
    assert isinstance(a, tuple) and [type(x) for x in a] == [type(x) for x in b[:4]]
    assert len(a[2]) == len(b[2]) == TINY["num_hidden_layers"] + 1 and len(a[3]) == len(b[3]) == TINY["num_hidden_layers"]
    for x, y in zip(a[2] + a[3], b[2] + b[3]):
        assert_close("recorded output", x, y)


def test_output_attentions_under_sdpa_returns_maps_where_bert_returns_none(mlm_dir):
    """The one deliberate difference: scratchbert runs the call's attention written out."""
    ours, theirs = pair(ScratchBertModel, BertModel, mlm_dir, attn_implementation="sdpa")
    eager = BertModel.from_pretrained(mlm_dir, attn_implementation="eager").eval()
    inputs = batch()
    with torch.no_grad():
        a, b, c = ours.eval()(**inputs, output_attentions=True), theirs.eval()(**inputs, output_attentions=True), eager(**inputs, output_attentions=True)
    assert b.attentions == ()
    for x, y in zip(a.attentions, c.attentions, strict=True):
        assert_close("sdpa attentions vs eager BertModel's", x, y, atol=1e-6)


def test_heads_pass_capture_through(mlm_dir):
    ours, theirs = pair(ScratchBertForMaskedLM, BertForMaskedLM, mlm_dir)
    inputs = batch()
    with torch.no_grad():
        a, b = ours.eval()(**inputs, output_hidden_states=[0, -1]), theirs.eval()(**inputs, output_hidden_states=[0, -1])
    assert [h is None for h in a.hidden_states] == [h is None for h in b.hidden_states]
    assert_close("head hidden_states[-1]", a.hidden_states[-1], b.hidden_states[-1])


# --- 4. configs built field by field --------------------------------------------------------------
def test_config_is_built_field_by_field_and_checked_when_a_model_is_built():
    ours, theirs = ScratchBertConfig(hidden_size=32), BertConfig(hidden_size=32)  # 12 heads do not divide 32
    assert ours.hidden_size == theirs.hidden_size == 32
    for config, model_class in ((ours, ScratchBertModel), (theirs, BertModel)):
        with pytest.raises(ValueError) as info:
            model_class(config)
        assert "hidden" in str(info.value) and "\n" not in str(info.value)
    assert re.search(r"hidden_size=32 is not divisible by num_attention_heads=12.*choose a head count", str(
        pytest.raises(ValueError, ScratchBertModel, ours).value))
    for config in (ours, theirs):  # set the other fields, as transformers' utilities do
        config.num_attention_heads, config.num_hidden_layers, config.intermediate_size = 4, 2, 37
    assert ScratchBertModel(ours).config.head_dim == 8 and BertModel(theirs) is not None
    shared = set(ours.to_dict()) & set(theirs.to_dict()) - {"model_type", "architectures", "transformers_version", "auto_map"}
    assert {k: ours.to_dict()[k] for k in shared} == {k: theirs.to_dict()[k] for k in shared}


# --- 5. tokenizer pair encodings against BertTokenizer ------------------------------------------
@pytest.fixture(scope="module")
def tokenizers_pair(bert_vocab_file):
    return ScratchBertTokenizer(vocab=str(bert_vocab_file)), BertTokenizer(vocab=str(bert_vocab_file))


@pytest.fixture(scope="module")
def shared_pairs(shared_data) -> list[tuple[str, str]]:
    """1,000 pairs of neighbouring non-blank lines of Moby-Dick."""
    lines = [line.strip() for line in (shared_data / "corpus" / "moby-dick.txt").read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line][:2000]
    return list(zip(lines[0::2], lines[1::2]))[:1000]


def segment_views(encoding, index: int = 0) -> tuple:
    return encoding.sequence_ids(index), encoding.word_ids(index), encoding.tokens(index)


def test_pair_sequence_and_word_ids_equal_berts_untruncated(tokenizers_pair, shared_pairs):
    ours, theirs = tokenizers_pair
    firsts, seconds = map(list, zip(*shared_pairs))
    batched_ours, batched_theirs = ours(firsts, seconds), theirs(firsts, seconds)
    assert batched_ours["token_type_ids"] == batched_theirs["token_type_ids"]
    for i, (a, b) in enumerate(shared_pairs):
        single_ours, single_theirs = ours(a, b), theirs(a, b)
        assert segment_views(single_ours) == segment_views(single_theirs), (a, b)
        assert single_ours["token_type_ids"] == single_theirs["token_type_ids"]
        assert segment_views(batched_ours, i) == segment_views(batched_theirs, i), (a, b)
        assert 0 in single_ours.sequence_ids() and 1 in single_ours.sequence_ids()


def test_pair_ids_equal_berts_under_truncation(tokenizers_pair, shared_pairs):
    """max_length 24: where both keep the same tokens, every view is BertTokenizer's; where scratchbert
    keeps other lengths (BERT's reference rule, `reference_pair_lengths`), each kept token carries
    the sequence id, word id and token type it has in BertTokenizer's untruncated encoding."""
    ours, theirs = tokenizers_pair
    firsts, seconds = map(list, zip(*shared_pairs))
    batched = ours(firsts, seconds, truncation=True, max_length=24)
    same_lengths = 0
    for i, (a, b) in enumerate(shared_pairs):
        mine, reference = ours(a, b, truncation=True, max_length=24), theirs(a, b, truncation=True, max_length=24)
        assert segment_views(batched, i) == segment_views(mine) and batched["token_type_ids"][i] == mine["token_type_ids"]
        if mine.sequence_ids() == reference.sequence_ids():
            same_lengths += 1
            assert segment_views(mine) == segment_views(reference) and mine["token_type_ids"] == reference["token_type_ids"]
            continue
        full = theirs(a, b)
        kept = [(s, w, t, ty) for s, w, t, ty in zip(*segment_views(full), full["token_type_ids"])]
        expected = [entry for segment in (0, 1) for entry in [e for e in kept if e[0] == segment][: mine.sequence_ids().count(segment)]]
        got = [(s, w, t, ty) for s, w, t, ty in zip(*segment_views(mine), mine["token_type_ids"]) if s is not None]
        assert got == expected, (a, b)
    assert same_lengths > 500  # most pairs: the two truncation rules agree


def test_only_second_truncation_equals_berts(tokenizers_pair, shared_pairs):
    ours, theirs = tokenizers_pair
    short = [(a, b) for a, b in shared_pairs if len(a) < 40][:200]
    firsts, seconds = map(list, zip(*short))
    mine, reference = (t(firsts, seconds, truncation="only_second", max_length=32) for t in tokenizers_pair)
    for i in range(len(short)):
        assert segment_views(mine, i) == segment_views(reference, i)
    assert mine["token_type_ids"] == reference["token_type_ids"]


# --- 6. the tokenizer's constructor, BertTokenizer's arguments -------------------------------------
WORDPIECE_VOCAB = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "this", "is", "##s", "thi", "café", "cafe", "中", "文", "a"])}
TEXTS = ["this is thiss", "This IS a Café", "cafe café CAFÉ", "中文 this", "thi ##s [MASK] is", ""]


@pytest.mark.parametrize(
    "options",
    [{}, {"do_lower_case": False}, {"strip_accents": False}, {"strip_accents": True}, {"do_lower_case": False, "strip_accents": True}, {"tokenize_chinese_chars": False}],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults",
)
def test_constructor_with_a_vocab_dict_builds_berts_tokenizer(options):
    ours, theirs = ScratchBertTokenizer(vocab=WORDPIECE_VOCAB, **options), BertTokenizer(vocab=WORDPIECE_VOCAB, **options)
    assert len(ours) == len(theirs) == len(WORDPIECE_VOCAB)
    for text in TEXTS:
        assert ours.tokenize(text) == theirs.tokenize(text), text
        assert ours(text, "is a")["input_ids"] == theirs(text, "is a")["input_ids"], text
    assert [ours.init_kwargs.get(k) for k in options] == list(options.values())


def test_constructor_with_a_vocab_file_and_on_real_text(bert_vocab_file, shared_data):
    lines = [line for line in (shared_data / "corpus" / "moby-dick.txt").read_text(encoding="utf-8").splitlines() if line.strip()][:300]
    reference = BertTokenizer(vocab=str(bert_vocab_file))
    for ours in (ScratchBertTokenizer(vocab=str(bert_vocab_file)), ScratchBertTokenizer(vocab_file=str(bert_vocab_file))):
        assert len(ours) == len(reference) == 30522
        assert [ours.tokenize(line) for line in lines] == [reference.tokenize(line) for line in lines]
    assert ScratchBertTokenizer().get_vocab() == BertTokenizer().get_vocab()  # no vocabulary: the special tokens alone


def test_constructor_refuses_special_tokens_it_cannot_build():
    with pytest.raises(ScratchBertError, match=r"cls_token='<s>': ScratchBertTokenizer builds BERT's special tokens .*BertTokenizer") as info:
        ScratchBertTokenizer(vocab={**WORDPIECE_VOCAB, "<s>": 14}, cls_token="<s>")
    assert "\n" not in str(info.value)


def test_constructed_tokenizer_saves_and_reloads_as_built(tmp_path):
    built = ScratchBertTokenizer(vocab=WORDPIECE_VOCAB, do_lower_case=False)
    built.save_pretrained(tmp_path)
    for loaded in (transformers.AutoTokenizer.from_pretrained(tmp_path), BertTokenizer.from_pretrained(tmp_path)):
        assert [loaded.tokenize(t) for t in TEXTS] == [built.tokenize(t) for t in TEXTS]


# --- beyond: the class attributes transformers reads off a PreTrainedModel --------------------------
def test_model_class_attributes_are_berts():
    assert ScratchBertModel.base_model_prefix == BertModel.base_model_prefix == "bert"
    assert ScratchBertModel.main_input_name == BertModel.main_input_name == "input_ids"
    assert ScratchBertModel.input_modalities == BertModel.input_modalities
    assert ScratchBertModel.supports_gradient_checkpointing is BertModel.supports_gradient_checkpointing is True
    assert ScratchBertModel._can_compile_fullgraph == BertModel._can_compile_fullgraph
    assert ScratchBertModel._tp_plan is None and BertModel._tp_plan is None  # neither declares tensor parallelism


def test_no_split_modules_name_berts_blocks_and_keep_them_whole(mlm_dir):
    from accelerate import infer_auto_device_map

    ours, theirs = pair(ScratchBertModel, BertModel, mlm_dir)
    assert ours._no_split_modules == {name.replace("Bert", "ScratchBert") for name in theirs._no_split_modules}
    assert all(hasattr(modeling, name) for name in ours._no_split_modules)
    size = sum(p.numel() * 4 for p in ours.parameters())
    device_map = infer_auto_device_map(ours, max_memory={0: size // 3, "cpu": 10 * size}, no_split_module_classes=list(ours._no_split_modules))
    for name in device_map:  # a layer or the embeddings is placed whole, never split
        assert not re.match(r"(embeddings|encoder\.layer\.\d+)\.", name), name


def test_tied_weights_declared_as_berts(mlm_dir):
    for ours_class, theirs_class in ((ScratchBertForMaskedLM, BertForMaskedLM), (ScratchBertForPreTraining, transformers.BertForPreTraining)):
        assert ours_class._tied_weights_keys == theirs_class._tied_weights_keys
    ours = ScratchBertForMaskedLM.from_pretrained(mlm_dir)
    theirs = BertForMaskedLM.from_pretrained(mlm_dir)
    assert ours.all_tied_weights_keys == theirs.all_tied_weights_keys
    assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight


def test_old_checkpoints_position_ids_load_without_a_report(tmp_path, mlm_dir):
    """`_keys_to_ignore_on_load_unexpected`: transformers 4's saved `embeddings.position_ids` buffer is dropped quietly."""
    from safetensors.torch import load_file, save_file

    state = load_file(mlm_dir / "model.safetensors")
    state["bert.embeddings.position_ids"] = torch.arange(TINY["max_position_embeddings"])[None, :]
    (tmp_path / "config.json").write_text((mlm_dir / "config.json").read_text())
    save_file(state, tmp_path / "model.safetensors")
    _, info = ScratchBertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"]


def test_no_decoder_cache_or_generation(mlm_dir):
    """BERT is an encoder: no cache, no generation, decoder configs refused; BertModel's decoder mode does not apply."""
    assert not ScratchBertForMaskedLM.can_generate()
    with pytest.raises(ScratchBertError, match="is_decoder=True"):
        ScratchBertConfig(is_decoder=True)
    import inspect

    assert not {"cache", "past_key_values", "use_cache", "encoder_hidden_states"} & set(inspect.signature(ScratchBertModel.forward).parameters)


def test_parameters_equal_berts_one_for_one(mlm_dir):
    ours, theirs = pair(ScratchBertForMaskedLM, BertForMaskedLM, mlm_dir)
    ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
    assert ours_state.keys() == theirs_state.keys()
    for key in itertools.islice(ours_state, None):
        assert torch.equal(ours_state[key], theirs_state[key]), key
