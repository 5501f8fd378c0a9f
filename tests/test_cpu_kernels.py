"""The CPU fast path is a swap of modules, off the model's reading path: one switch, same numbers.

`config.cpu_kernels` (default on) swaps `cpu_kernels.py`'s modules into the model; off, the
model is exactly what `modeling_scratchbert.py` writes: `nn.Linear`, three Q/K/V projections,
"sdpa" meaning `F.scaled_dot_product_attention`. Tolerance between the two: 1e-5 in fp32
(summation order of other GEMM kernels and of two batched GEMMs against SDPA).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import fake_clock, small_batch
from torch import nn

import scratchbert.cpu_kernels as cpu_kernels
from scratchbert import ScratchBertConfig, ScratchBertForMaskedLM, ScratchBertModel, cpu_gemm
from scratchbert.bert_padding import default_call_cost
from scratchbert.cpu_kernels import CpuSelfAttention
from scratchbert.modeling_scratchbert import ScratchBertSelfAttention

PACKAGE = Path(cpu_kernels.__file__).parent
FIELDS = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def masked_lm(**overrides) -> ScratchBertForMaskedLM:
    torch.manual_seed(0)
    return ScratchBertForMaskedLM(ScratchBertConfig(**{**FIELDS, **overrides}))


def module_types(model: nn.Module) -> set[type]:
    return {type(m) for m in model.modules()}


def test_the_switch_is_on_by_default_and_swaps_classes_not_parameters():
    model = masked_lm()
    assert model.config.cpu_kernels is True
    assert nn.Linear not in module_types(model) and ScratchBertSelfAttention not in module_types(model)
    assert {cpu_gemm.MeasuredLinear, CpuSelfAttention} <= module_types(model)
    assert model.bert.attention_call_cost is cpu_kernels.attention_call_cost
    parameters = {name: p for name, p in model.named_parameters()}
    keys = list(model.state_dict())

    assert model.use_cpu_kernels(False) is model
    assert model.config.cpu_kernels is False
    assert cpu_gemm.MeasuredLinear not in module_types(model) and CpuSelfAttention not in module_types(model)
    assert {nn.Linear, ScratchBertSelfAttention} <= module_types(model)
    assert model.bert.attention_call_cost is default_call_cost
    assert list(model.state_dict()) == keys
    assert all(p is parameters[name] for name, p in model.named_parameters())  # the same tensors, not copies


def test_switched_off_in_the_config_the_model_is_the_plain_one_and_stays_so_when_reloaded(tmp_path):
    model = masked_lm(cpu_kernels=False)
    assert cpu_gemm.MeasuredLinear not in module_types(model) and CpuSelfAttention not in module_types(model)
    model.save_pretrained(tmp_path)
    reloaded = ScratchBertForMaskedLM.from_pretrained(tmp_path)
    assert reloaded.config.cpu_kernels is False and CpuSelfAttention not in module_types(reloaded)
    turned_on = ScratchBertForMaskedLM.from_pretrained(tmp_path, cpu_kernels=True)
    assert CpuSelfAttention in module_types(turned_on)


@pytest.mark.parametrize("padded", [True, False], ids=["padding-free path", "full batch"])
@pytest.mark.parametrize("kernel", ["onednn", "mkl"])
def test_fast_path_equals_the_plain_model_forward_and_backward(monkeypatch, padded, kernel):
    monkeypatch.setenv("SCRATCHBERT_GEMM", kernel)
    monkeypatch.setattr(cpu_gemm, "MIN_FLOPS", 0)  # reroute even these tiny products
    monkeypatch.setattr(cpu_gemm, "BMM_ATTENTION_MAX_LENGTH", 128)  # and attend through two batched GEMMs
    monkeypatch.setattr(cpu_gemm, "DECISIONS", {})
    ids, mask = small_batch(padded)
    results = []
    for enabled in (False, True):
        model = masked_lm().use_cpu_kernels(enabled)
        logits = model(input_ids=ids, attention_mask=mask).logits
        (logits * mask[..., None]).square().mean().backward()
        grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        results.append((logits[mask.bool()].detach(), grads))
    (plain, plain_grads), (fast, fast_grads) = results
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=0)
    assert fast_grads.keys() == plain_grads.keys()
    for name in plain_grads:
        torch.testing.assert_close(fast_grads[name], plain_grads[name], atol=1e-5, rtol=0, msg=name)


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    """No kernel or attention decision carried in from another test."""
    for name in ("DECISIONS", "TRIALS", "ATTENTION_DECISIONS", "ATTENTION_TRIALS"):
        monkeypatch.setattr(cpu_gemm, name, {})


def test_sdpa_means_sdpa_in_the_plain_model(monkeypatch):
    """Plain: every attention call is F.scaled_dot_product_attention, short sequences too; fast: two batched GEMMs
    (where they are a candidate, with the trial on real calls skipped)."""
    monkeypatch.setattr(cpu_gemm, "CONFIRM_CALLS", 0)
    monkeypatch.setattr(cpu_gemm, "BMM_ATTENTION_MAX_LENGTH", 128)
    monkeypatch.setattr(cpu_gemm, "AMX_BF16", False)
    sdpa_calls, bmm_calls = [], []
    real_sdpa, real_bmm = F.scaled_dot_product_attention, cpu_kernels.bmm_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: sdpa_calls.append(1) or real_sdpa(*a, **k))
    monkeypatch.setattr(cpu_kernels, "bmm_attention", lambda *a: bmm_calls.append(1) or real_bmm(*a))
    ids, mask = small_batch(padded=False)
    model = masked_lm().eval()
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        model.use_cpu_kernels(False)(input_ids=ids, attention_mask=mask)
        assert len(sdpa_calls) == FIELDS["num_hidden_layers"] and not bmm_calls
        model.use_cpu_kernels(True)(input_ids=ids, attention_mask=mask)
        assert len(bmm_calls) == FIELDS["num_hidden_layers"] and len(sdpa_calls) == FIELDS["num_hidden_layers"]


@pytest.mark.parametrize("slower, decided", [("bmm", "sdpa"), ("sdpa", "bmm")])
def test_attention_takes_the_kernel_faster_on_real_calls(monkeypatch, slower, decided):
    """Two batched GEMMs against SDPA: the first calls of a length bucket alternate, the faster stays."""
    monkeypatch.setattr(cpu_gemm, "CONFIRM_CALLS", 3)
    monkeypatch.setattr(cpu_gemm, "BMM_ATTENTION_MAX_LENGTH", 128)
    monkeypatch.setattr(cpu_gemm, "AMX_BF16", False)
    calls = []
    real = {"bmm": cpu_kernels.bmm_attention, "sdpa": cpu_kernels.sdpa_attention}
    clock = fake_clock(monkeypatch, cpu_kernels)  # the load of the machine cannot reorder them

    def timed(kind):
        def attend(*args, **kwargs):
            calls.append(kind)
            clock.advance(0.02 if kind == slower else 0.001)
            return real[kind](*args, **kwargs)
        return attend

    monkeypatch.setattr(cpu_kernels, "bmm_attention", timed("bmm"))
    monkeypatch.setattr(cpu_kernels, "sdpa_attention", timed("sdpa"))
    layer = torch.nn.Module()  # the registry's functions read `is_causal` off the layer
    layer.is_causal = False
    query, key, value = (torch.randn(2, 4, 10, 8) for _ in range(3))
    reference, _ = real["sdpa"](layer, query, key, value, None)  # (B, S, A, D)
    for _ in range(8):
        with torch.no_grad():  # in inference: training keeps the candidate without a trial
            context, probs = cpu_kernels.sdpa_or_bmm_attention(layer, query, key, value, None)
        torch.testing.assert_close(context, reference, atol=1e-6, rtol=0)
        assert probs is None
    assert calls == ["bmm", "sdpa"] * 3 + [decided] * 2
    assert list(cpu_gemm.ATTENTION_DECISIONS.values()) == [decided] and cpu_gemm.ATTENTION_TRIALS == {}


def test_an_unknown_cpu_is_not_rerouted(monkeypatch):
    """torch cannot say what the CPU has: no bmm attention, no stacked Q/K/V, whatever the length."""
    monkeypatch.setattr(cpu_gemm, "AMX_BF16", False)
    monkeypatch.setattr(cpu_gemm, "BF16_UNITS", None)
    monkeypatch.setattr(cpu_gemm, "BMM_ATTENTION_MAX_LENGTH", 0)  # what an unknown CPU gets at import
    query = torch.zeros(2, 4, 8, 16)
    assert not cpu_gemm.use_bmm_attention(query) and not cpu_gemm.use_bmm_attention(query.bfloat16())
    assert not cpu_gemm.stack_qkv(torch.zeros(3, 32).bfloat16())


def imported_modules(path: Path, top_level_only: bool) -> set[str]:
    """The scratchbert modules `path` imports (relative imports), at module level only if asked."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    return {node.module for node in nodes if isinstance(node, ast.ImportFrom) and node.level and node.module}


def test_the_model_and_the_padding_planner_do_not_import_the_kernel_policy():
    """The reading path names no CPU kernel: modeling imports the switch only inside `use_cpu_kernels`."""
    assert not {"cpu_gemm", "cpu_kernels"} & imported_modules(PACKAGE / "modeling_scratchbert.py", top_level_only=True)
    assert not {"cpu_gemm", "cpu_kernels"} & imported_modules(PACKAGE / "bert_padding.py", top_level_only=False)
    source = (PACKAGE / "modeling_scratchbert.py").read_text()
    assert "linear(" not in source.replace("nn.Linear(", "")  # every layer reads self.dense(x)


def test_the_bare_encoder_and_every_head_get_the_switch():
    model = ScratchBertModel(ScratchBertConfig(**FIELDS))
    assert CpuSelfAttention in module_types(model)
    plain = ScratchBertModel(ScratchBertConfig(**FIELDS, cpu_kernels=False))
    assert CpuSelfAttention not in module_types(plain) and cpu_gemm.MeasuredLinear not in module_types(plain)


def test_print_model_names_the_swapped_kernels():
    fast, plain = repr(masked_lm()), repr(masked_lm(cpu_kernels=False))
    assert "(self): CpuSelfAttention(" in fast and "(intermediate): CpuIntermediate(" in fast
    assert "(query): MeasuredLinear(in_features=32, out_features=32, bias=True, kernel=measured (cpu_gemm.py))" in fast
    assert "(query): Linear(in_features=32, out_features=32, bias=True)" in plain
    assert not any(word in plain for word in ("Cpu", "Measured", "kernel="))


def test_a_model_is_checked_and_swapped_once_when_built_whole(monkeypatch):
    """A task model's encoder leaves both steps to the task model: one size check, one swap of every module."""
    calls = []
    monkeypatch.setattr(ScratchBertConfig, "validate_sizes", lambda self: calls.append("validate_sizes"))
    swap = cpu_kernels.use_cpu_kernels
    monkeypatch.setattr(cpu_kernels, "use_cpu_kernels", lambda model, enabled=True: calls.append(type(model).__name__) or swap(model, enabled))
    for model_class in (ScratchBertModel, ScratchBertForMaskedLM):
        calls.clear()
        model = model_class(ScratchBertConfig(**FIELDS))
        assert calls == ["validate_sizes", model_class.__name__]
        assert nn.Linear not in module_types(model) and ScratchBertSelfAttention not in module_types(model)


@pytest.mark.skipif(not cpu_gemm.ONEDNN, reason="this torch has no oneDNN")
@pytest.mark.parametrize("padded", [True, False], ids=["padding-free path", "full batch"])
def test_inference_with_fused_gelu_and_residual_equals_the_plain_model(monkeypatch, padded):
    """In eval mode, with oneDNN chosen, every feed-forward GELU and residual add is fused: 1e-5 in fp32."""
    monkeypatch.setenv("SCRATCHBERT_GEMM", "onednn")
    monkeypatch.setattr(cpu_gemm, "MIN_FLOPS", 0)
    monkeypatch.setattr(cpu_gemm, "DECISIONS", {})
    fused_calls = []
    real = cpu_kernels.linear_post_op
    monkeypatch.setattr(cpu_kernels, "linear_post_op", lambda *a: fused_calls.append(a[2]) or real(*a))
    ids, mask = small_batch(padded)
    model = masked_lm().eval()
    with torch.no_grad():
        fast = model(input_ids=ids, attention_mask=mask).logits[mask.bool()]
        layers = FIELDS["num_hidden_layers"]
        assert sorted(fused_calls) == ["add"] * 2 * layers + ["gelu"] * layers
        plain = model.use_cpu_kernels(False)(input_ids=ids, attention_mask=mask).logits[mask.bool()]
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=0)


# ---- other machines: a GPU, an ARM CPU ---------------------------------------------------------
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_off_the_cpu_nothing_reads_tensor_values_and_the_plain_calls_run(monkeypatch, training):
    """The meta device stands in for a GPU: reading a value raises there (as it would sync a GPU's host).

    With the fast path on and padding in the batch, the forward and backward run without reading
    a value: no all-real shortcut, no packed layout, no measurement; every linear is one `F.linear`
    (Q, K and V three of them, not stacked) and attention is SDPA, as in the plain model.
    """
    monkeypatch.setattr(cpu_gemm, "MIN_FLOPS", 0)
    monkeypatch.setattr(cpu_gemm, "BMM_ATTENTION_MAX_LENGTH", 128)
    monkeypatch.setattr(cpu_gemm, "measure", lambda gemm: pytest.fail("measured a product off the CPU"))
    model = masked_lm().to("meta").train(training)
    assert model.config.cpu_kernels and CpuSelfAttention in module_types(model)
    ids, mask = (t.to("meta") for t in small_batch(padded=True))
    linears, sdpa = [], []
    real_linear, real_sdpa = F.linear, F.scaled_dot_product_attention
    monkeypatch.setattr(F, "linear", lambda *a, **k: linears.append(a[1].shape) or real_linear(*a, **k))
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: sdpa.append(1) or real_sdpa(*a, **k))
    with torch.autocast("cpu", enabled=False):
        logits = model(input_ids=ids, attention_mask=mask).logits
    assert logits.shape == (4, 12, 99) and logits.device.type == "meta"
    if training:
        logits.sum().backward()
        assert model.bert.encoder.layer[0].attention.self.query.weight.grad.device.type == "meta"
    hidden = FIELDS["hidden_size"]
    # per layer: Q, K, V and the attention output (H x H), feed-forward up and down; then the MLM transform and decoder
    assert linears.count((hidden, hidden)) == 4 * FIELDS["num_hidden_layers"] + 1
    assert len(sdpa) == FIELDS["num_hidden_layers"]


ARM_CPU = r'''
import platform
platform.machine = lambda: "aarch64"  # before scratchbert reads it
import torch, torch.nn.functional as F
from scratchbert import ScratchBertConfig, ScratchBertForMaskedLM, cpu_gemm
assert cpu_gemm.CAPABILITIES is None and cpu_gemm.BF16_UNITS is None and not cpu_gemm.AMX_BF16
assert cpu_gemm.BMM_ATTENTION_MAX_LENGTH == 0
cpu_gemm.MIN_FLOPS = 0
def no_choice(*args):
    raise AssertionError("cpu_gemm chose a kernel on an unknown CPU")
cpu_gemm.choose = no_choice
config = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
torch.manual_seed(0)
fast = ScratchBertForMaskedLM(ScratchBertConfig(**config))
plain = ScratchBertForMaskedLM(ScratchBertConfig(**config, cpu_kernels=False))
plain.load_state_dict(fast.state_dict())
assert type(fast.bert.encoder.layer[0].intermediate.dense) is cpu_gemm.MeasuredLinear
ids = torch.randint(5, 99, (3, 10)); mask = torch.ones_like(ids); mask[1, 6:] = 0
for dtype in (torch.float32, torch.bfloat16):
    outs = []
    for model in (fast, plain):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            logits = model(input_ids=ids, attention_mask=mask).logits
        logits.float().square().mean().backward()
        outs.append((logits.detach(), model.bert.embeddings.word_embeddings.weight.grad.clone()))
    for a, b in zip(*outs):
        assert torch.equal(a, b), (dtype, (a.float() - b.float()).abs().max())
    model.eval()
    with torch.no_grad():
        assert torch.equal(fast.eval()(input_ids=ids, attention_mask=mask).logits, plain.eval()(input_ids=ids, attention_mask=mask).logits)
    fast.train(); plain.train()
assert cpu_gemm.DECISIONS == {} and cpu_gemm.TRIALS == {}, "measured on an unknown CPU"
print("ok: torch's own calls everywhere")
'''


def test_on_an_arm_cpu_every_call_is_torchs_own(tmp_path):
    """aarch64 (Apple silicon, Graviton): no MKL, another oneDNN build, kernels never measured there.

    Simulated in a fresh process that reports aarch64 before scratchbert is imported: the CPU is
    unknown, nothing is measured or rerouted, and outputs and gradients are bit-identical to the
    plain model's in fp32 and under bf16 autocast.
    """
    result = subprocess.run([sys.executable, "-c", ARM_CPU], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok: torch's own calls everywhere" in result.stdout
