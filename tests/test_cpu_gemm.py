"""cpu_gemm: the CPU-specific matrix-multiply choices give the same results as the plain ones.

Which choice runs depends on the CPU (`cpu_gemm.AMX_BF16`, `cpu_gemm.BF16_UNITS`); the tests set
each profile in turn (AMX; AVX-512 BF16 without AMX; no bf16 instructions), so every path is
checked on any machine.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import scratchbert.modeling_scratchbert as modeling
from scratchbert import ScratchBertConfig, ScratchBertModel, cpu_gemm
from scratchbert.bert_padding import CALL_COST, REDUCED_PRECISION_CALL_COST, default_call_cost

CPU = torch.device("cpu")


# (AMX_BF16, BF16_UNITS) of each kind of CPU the choices were measured on.
PROFILES = {"amx": (True, True), "avx512_bf16": (False, True), "no_bf16": (False, False)}


def set_profile(monkeypatch, name: str) -> None:
    """Behave as on that kind of CPU, whatever this machine has."""
    amx, units = PROFILES[name]
    monkeypatch.setattr(cpu_gemm, "AMX_BF16", amx)
    monkeypatch.setattr(cpu_gemm, "BF16_UNITS", units)


@pytest.fixture
def amx(monkeypatch):
    set_profile(monkeypatch, "amx")


@pytest.fixture
def no_amx(monkeypatch):
    set_profile(monkeypatch, "avx512_bf16")


@pytest.fixture
def no_bf16(monkeypatch):
    set_profile(monkeypatch, "no_bf16")


def test_cpu_detection_reads_torch_cpu_capabilities():
    capabilities = torch.cpu.get_capabilities()
    assert cpu_gemm._has_amx_bf16() is bool(capabilities.get("amx_bf16", False))
    units = bool(capabilities.get("amx_bf16", False) or capabilities.get("avx512_bf16", False))
    assert cpu_gemm._has_bf16_units() is units


@pytest.mark.parametrize(
    "rows, shape, dtype, device, chunks",
    [
        (1024, (768, 768), torch.bfloat16, CPU, 2),  # 8 x 128 tokens: in the window, two chunks of 512
        (1205, (3072, 768), torch.bfloat16, CPU, 2),
        (1400, (768, 768), torch.bfloat16, CPU, 3),  # chunks of at most 640 rows
        (1400, (3072, 768), torch.bfloat16, CPU, 1),  # this shape's window ends at 1,344 rows
        (1024, (768, 768), torch.float16, CPU, 1),  # fp16 was not measured: left alone
        (640, (768, 768), torch.bfloat16, CPU, 1),  # window bounds are exclusive
        (1536, (768, 768), torch.bfloat16, CPU, 1),
        (1024, (768, 768), torch.float32, CPU, 1),  # fp32 goes through MKL: no window
        (1024, (768, 3072), torch.bfloat16, CPU, 1),  # wide outputs: no window
        (1024, (768, 768), torch.bfloat16, torch.device("cuda"), 1),  # other devices are left alone
    ],
)
def test_row_chunks_on_amx_only_inside_the_measured_window(amx, rows, shape, dtype, device, chunks):
    assert cpu_gemm.row_chunks(rows, shape, device, dtype) == chunks


def test_no_row_chunks_without_amx(no_amx):
    assert cpu_gemm.window_chunks(1024, (768, 768)) == 2  # the window is still there to measure
    assert cpu_gemm.row_chunks(1024, (768, 768), CPU, torch.bfloat16) == 1  # but not applied


def count_linear_calls(monkeypatch) -> list[int]:
    calls = []
    original = F.linear

    def spy(x, weight, bias=None):
        calls.append(x.shape[0] if x.dim() == 2 else x.numel() // x.size(-1))
        return original(x, weight, bias)

    monkeypatch.setattr(F, "linear", spy)
    return calls


def test_bf16_chunks_give_the_unsplit_result(amx, monkeypatch):
    torch.manual_seed(0)
    layer = nn.Linear(3072, 768).to(torch.bfloat16)
    x = torch.randn(2, 512, 3072, dtype=torch.bfloat16)  # 1,024 rows
    calls = count_linear_calls(monkeypatch)
    chunked = cpu_gemm.linear(x, layer)
    assert calls == [512, 512]
    unsplit = layer(x)
    assert chunked.shape == (2, 512, 768) and chunked.dtype == torch.bfloat16
    # Same dot products; at most a bf16 rounding step apart if the kernel blocks K differently.
    torch.testing.assert_close(chunked, unsplit, rtol=1e-2, atol=1e-2)


def test_autocast_chunks_and_gradients(amx, monkeypatch):
    torch.manual_seed(0)
    layer = nn.Linear(768, 768)
    x = torch.randn(1205, 768, requires_grad=True)
    grads = []
    for split in (True, False):
        if not split:
            monkeypatch.setattr(cpu_gemm, "SLOW_ROW_WINDOWS", {})
        layer.zero_grad()
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = cpu_gemm.linear(x, layer)
        assert out.dtype == torch.bfloat16
        out.float().square().mean().backward()
        grads.append((out.detach().float(), x.grad.clone(), layer.weight.grad.clone()))
    for chunked, unsplit in zip(*grads):
        torch.testing.assert_close(chunked, unsplit, rtol=2e-2, atol=2e-2)


def test_fp32_and_cleared_windows_are_one_plain_call(amx, monkeypatch):
    layer = nn.Linear(768, 768)
    calls = count_linear_calls(monkeypatch)
    out = cpu_gemm.linear(torch.randn(1024, 768), layer)
    assert calls == [1024] and out.dtype == torch.float32
    monkeypatch.setattr(cpu_gemm, "SLOW_ROW_WINDOWS", {})
    calls.clear()
    cpu_gemm.linear(torch.randn(1024, 768, dtype=torch.bfloat16), layer.to(torch.bfloat16))
    assert calls == [1024]


def test_bert_base_width_layer_in_bf16_splits_its_narrow_gemms(amx, monkeypatch):
    """One bert-base-width layer on 8 x 128 tokens (1,024 rows): both add & norm projections split."""
    torch.manual_seed(0)
    config = ScratchBertConfig(vocab_size=500, num_hidden_layers=1, max_position_embeddings=128)
    model = ScratchBertModel(config, add_pooling_layer=False).eval().to(torch.bfloat16)
    ids = torch.randint(5, 500, (8, 128))
    with torch.no_grad():
        calls = count_linear_calls(monkeypatch)
        split = model(input_ids=ids).last_hidden_state
        assert calls.count(512) == 4  # attention output and feed-forward output, 2 chunks each
        assert calls.count(1024) == 2  # the stacked Q/K/V projection and the feed-forward input
        monkeypatch.setattr(cpu_gemm, "SLOW_ROW_WINDOWS", {})
        plain = model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(split.float(), plain.float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize(
    "profile, dtype, autocast, stacked",
    [
        ("amx", torch.bfloat16, False, True),  # bf16 weights on AMX: one (3H, H) GEMM
        ("amx", torch.float32, True, True),  # autocast computes in bf16: stacked too
        ("amx", torch.float32, False, False),  # fp32 (MKL): three GEMMs
        ("avx512_bf16", torch.bfloat16, False, False),  # no AMX: three GEMMs in every dtype
        ("avx512_bf16", torch.float32, True, False),
        ("no_bf16", torch.bfloat16, False, False),
    ],
)
def test_stack_qkv_where_it_measured_faster(monkeypatch, profile, dtype, autocast, stacked):
    set_profile(monkeypatch, profile)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        assert cpu_gemm.stack_qkv(torch.zeros(2, 4, dtype=dtype)) is stacked


@pytest.mark.parametrize(
    "profile, dtype, length, max_length, expected",
    [
        ("avx512_bf16", torch.float32, 128, 128, True),
        ("avx512_bf16", torch.bfloat16, 128, 128, True),
        ("avx512_bf16", torch.float32, 129, 128, False),  # long sequences: SDPA
        ("avx512_bf16", torch.float32, 16, 0, False),  # switched off
        ("amx", torch.float32, 16, 128, False),  # AMX CPUs: always SDPA
        ("no_bf16", torch.float32, 64, 128, True),
        ("no_bf16", torch.bfloat16, 64, 128, False),  # a bf16 bmm without bf16 units: SDPA instead
        ("avx512_bf16", torch.float16, 64, 128, False),  # fp16 was not measured: SDPA
    ],
)
def test_bmm_attention_only_for_short_sequences_where_it_measured_faster(monkeypatch, profile, dtype, length, max_length, expected):
    set_profile(monkeypatch, profile)
    monkeypatch.setattr(cpu_gemm, "BMM_ATTENTION_MAX_LENGTH", max_length)
    assert cpu_gemm.use_bmm_attention(torch.zeros(2, 3, length, 8, dtype=dtype)) is expected


def attention_inputs(dtype=torch.float32, requires_grad=False):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 4, 7, 16, generator=gen).to(dtype).requires_grad_(requires_grad) for _ in range(3))
    keep = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [0] * 7])  # full, padded, fully padded row
    return q, k, v, modeling.additive_attention_mask(keep, dtype)


@pytest.mark.parametrize("masked", [True, False])
def test_bmm_attention_equals_the_written_out_math_and_sdpa(masked):
    q, k, v, mask = attention_inputs()
    mask = mask if masked else None
    context = modeling.bmm_attention(q, k, v, mask, 0.0)
    reference, _ = modeling.eager_attention(q, k, v, mask, 0.0)
    assert context.shape == (3, 4, 7, 16) and torch.isfinite(context).all()
    torch.testing.assert_close(context, reference, atol=1e-6, rtol=0)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(context, fused, atol=1e-6, rtol=0)


def test_bmm_attention_gradients_and_bf16():
    q, k, v, mask = attention_inputs(requires_grad=True)
    grads = []
    for attend in (modeling.bmm_attention, lambda *a: modeling.eager_attention(*a)[0]):
        attend(q, k, v, mask, 0.0).square().sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    for ours, reference in zip(*grads):
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=0)

    q16, k16, v16, mask16 = attention_inputs(torch.bfloat16)
    context = modeling.bmm_attention(q16, k16, v16, mask16, 0.0)
    assert context.dtype == torch.bfloat16 and torch.isfinite(context).all()
    reference, _ = modeling.eager_attention(*(t.detach() for t in (q, k, v)), mask, 0.0)
    torch.testing.assert_close(context.float(), reference, atol=3e-2, rtol=0)


@pytest.mark.parametrize("padded", [True, False], ids=["padding-free path", "full batch"])
def test_model_outputs_and_gradients_agree_on_every_cpu_choice(monkeypatch, padded):
    """The same model under each CPU profile (AMX, AVX-512 BF16, no bf16; bmm attention or SDPA): 1e-5 in fp32."""
    torch.manual_seed(0)
    config = ScratchBertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=37, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = ScratchBertModel(config)
    ids = torch.randint(5, 99, (4, 12))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 8:] = 0
        mask[2, 3:] = 0
    results = []
    for profile, max_length in (("avx512_bf16", 128), ("avx512_bf16", 0), ("amx", 128), ("no_bf16", 128)):
        set_profile(monkeypatch, profile)
        monkeypatch.setattr(cpu_gemm, "BMM_ATTENTION_MAX_LENGTH", max_length)
        model.zero_grad()
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state * mask[..., None]
        hidden.square().sum().backward()
        results.append((hidden.detach(), model.encoder.layer[0].attention.self.query.weight.grad.clone()))
    for hidden, grad in results[1:]:
        torch.testing.assert_close(hidden, results[0][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(grad, results[0][1], atol=1e-5, rtol=0)


# ---- bf16 on a CPU without bf16 units: the fp32 kernel over bf16 values ----------------------
def spy_linear_dtypes(monkeypatch) -> list[torch.dtype]:
    """Record the dtype each `F.linear` call multiplies in."""
    dtypes = []
    original = F.linear

    def spy(x, weight, bias=None):
        dtypes.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else weight.dtype)
        return original(x, weight, bias)

    monkeypatch.setattr(F, "linear", spy)
    return dtypes


@pytest.mark.parametrize(
    "profile, dtype, autocast, kernel",
    [
        ("no_bf16", torch.bfloat16, False, torch.float32),  # bf16 weights: fp32 kernel
        ("no_bf16", torch.float32, True, torch.float32),  # bf16 autocast: fp32 kernel
        ("no_bf16", torch.float32, False, torch.float32),  # fp32 stays fp32
        ("avx512_bf16", torch.bfloat16, False, torch.bfloat16),  # bf16 units: oneDNN's bf16 kernel
        ("amx", torch.float32, True, torch.bfloat16),
    ],
)
def test_linear_runs_bf16_on_the_fp32_kernel_only_without_bf16_units(monkeypatch, profile, dtype, autocast, kernel):
    set_profile(monkeypatch, profile)
    layer = nn.Linear(16, 8).to(dtype)
    dtypes = spy_linear_dtypes(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = cpu_gemm.linear(torch.randn(5, 16, dtype=dtype), layer)
    assert dtypes == [kernel]
    assert out.dtype == (torch.bfloat16 if autocast or dtype == torch.bfloat16 else torch.float32)


def test_bf16_on_the_fp32_kernel_equals_a_bf16_gemm():
    """The same products of the same bf16 values: equal to the bf16 GEMM up to one bf16 rounding step."""
    torch.manual_seed(0)
    layer = nn.Linear(768, 3072)
    x = torch.randn(3, 40, 768)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        native = layer(x)
        emulated = cpu_gemm.linear_in_fp32(x, layer)
    # Exactly what the fp32 kernel gives on the bf16-rounded inputs.
    exact = F.linear(x.bfloat16().float(), layer.weight.bfloat16().float(), layer.bias.bfloat16().float())
    assert emulated.dtype == torch.bfloat16 and emulated.shape == (3, 40, 3072)
    torch.testing.assert_close(emulated, exact.bfloat16(), rtol=0, atol=0)
    # A bf16 GEMM sums in another order (and its output rounding): within bf16's resolution (2^-8 relative).
    torch.testing.assert_close(emulated.float(), native.float(), rtol=2**-7, atol=2e-2)
    layer16 = layer.to(torch.bfloat16)
    torch.testing.assert_close(cpu_gemm.linear_in_fp32(x.bfloat16(), layer16), emulated, rtol=0, atol=0)


def test_bf16_on_the_fp32_kernel_has_autocasts_gradients():
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)
    x = torch.randn(20, 64, requires_grad=True)
    grads = []
    for attend in (lambda: layer(x), lambda: cpu_gemm.linear_in_fp32(x, layer)):
        layer.zero_grad()
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attend()
        out.float().square().sum().backward()
        grads.append((x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone()))
    for emulated, native in zip(grads[1], grads[0]):
        assert emulated.dtype == torch.float32  # fp32 master gradients, as autocast gives
        torch.testing.assert_close(emulated, native, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("padded", [True, False], ids=["padding-free path", "full batch"])
def test_bf16_model_is_the_same_with_and_without_bf16_units(monkeypatch, padded):
    """bf16 weights and bf16 autocast: the no-bf16 profile (fp32 kernels) agrees with the native one to bf16 rounding."""
    torch.manual_seed(0)
    config = ScratchBertConfig(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
    model = ScratchBertModel(config).eval()
    ids = torch.randint(5, 99, (3, 20))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 12:] = 0
    keep = mask.bool()
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask).last_hidden_state[keep]
        for variant, autocast in ((model, True), (copy.deepcopy(model).to(torch.bfloat16), False)):
            outs = []
            for profile in ("avx512_bf16", "no_bf16"):
                set_profile(monkeypatch, profile)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    outs.append(variant(input_ids=ids, attention_mask=mask).last_hidden_state[keep].float())
            torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0.06)
            for out in outs:  # both within test_bf16's tolerance of the fp32 model
                assert ((out - reference).norm() / reference.norm()).item() <= 0.03


def test_bucket_plans_weigh_calls_as_fp32_where_bf16_runs_on_fp32_kernels(monkeypatch):
    cpu = torch.device("cpu")
    set_profile(monkeypatch, "no_bf16")
    assert default_call_cost(torch.bfloat16, cpu) == default_call_cost(torch.float32, cpu) == CALL_COST
    set_profile(monkeypatch, "avx512_bf16")
    assert default_call_cost(torch.bfloat16, cpu) == REDUCED_PRECISION_CALL_COST
