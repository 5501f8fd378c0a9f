"""cpu_gemm: the CPU-specific matrix-multiply choices give the same results as the plain ones.

Which choice runs depends on the CPU (`cpu_gemm.AMX_BF16`); the tests set it both ways, so every
path is checked on any machine.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import scratchbert.modeling_scratchbert as modeling
from scratchbert import ScratchBertConfig, ScratchBertModel, cpu_gemm

CPU = torch.device("cpu")


@pytest.fixture
def amx(monkeypatch):
    """Behave as on a CPU with AMX bf16 tiles, whatever this machine has."""
    monkeypatch.setattr(cpu_gemm, "AMX_BF16", True)


@pytest.fixture
def no_amx(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "AMX_BF16", False)


def test_amx_detection_reads_torch_cpu_capabilities():
    expected = bool(torch.cpu.get_capabilities().get("amx_bf16", False))
    assert cpu_gemm._has_amx_bf16() is expected


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
    chunked = cpu_gemm.linear_in_row_chunks(x, layer)
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
            out = cpu_gemm.linear_in_row_chunks(x, layer)
        assert out.dtype == torch.bfloat16
        out.float().square().mean().backward()
        grads.append((out.detach().float(), x.grad.clone(), layer.weight.grad.clone()))
    for chunked, unsplit in zip(*grads):
        torch.testing.assert_close(chunked, unsplit, rtol=2e-2, atol=2e-2)


def test_fp32_and_cleared_windows_are_one_plain_call(amx, monkeypatch):
    layer = nn.Linear(768, 768)
    calls = count_linear_calls(monkeypatch)
    out = cpu_gemm.linear_in_row_chunks(torch.randn(1024, 768), layer)
    assert calls == [1024] and out.dtype == torch.float32
    monkeypatch.setattr(cpu_gemm, "SLOW_ROW_WINDOWS", {})
    calls.clear()
    cpu_gemm.linear_in_row_chunks(torch.randn(1024, 768, dtype=torch.bfloat16), layer.to(torch.bfloat16))
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
    "has_amx, dtype, autocast, stacked",
    [
        (True, torch.bfloat16, False, True),  # bf16 weights on AMX: one (3H, H) GEMM
        (True, torch.float32, True, True),  # autocast computes in bf16: stacked too
        (True, torch.float32, False, False),  # fp32 (MKL): three GEMMs
        (False, torch.bfloat16, False, False),  # no AMX: three GEMMs in every dtype
        (False, torch.float32, True, False),
    ],
)
def test_stack_qkv_where_it_measured_faster(monkeypatch, has_amx, dtype, autocast, stacked):
    monkeypatch.setattr(cpu_gemm, "AMX_BF16", has_amx)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        assert cpu_gemm.stack_qkv(torch.zeros(2, 4, dtype=dtype)) is stacked


@pytest.mark.parametrize(
    "has_amx, length, max_length, expected",
    [(False, 128, 128, True), (False, 129, 128, False), (True, 16, 128, False), (False, 16, 0, False)],
)
def test_bmm_attention_only_for_short_sequences_without_amx(monkeypatch, has_amx, length, max_length, expected):
    monkeypatch.setattr(cpu_gemm, "AMX_BF16", has_amx)
    monkeypatch.setattr(cpu_gemm, "BMM_ATTENTION_MAX_LENGTH", max_length)
    assert cpu_gemm.use_bmm_attention(torch.zeros(2, 3, length, 8)) is expected


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
    """The same model under each CPU profile (AMX or not, bmm attention or SDPA): 1e-5 in fp32."""
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
    for has_amx, max_length in ((False, 128), (False, 0), (True, 128)):
        monkeypatch.setattr(cpu_gemm, "AMX_BF16", has_amx)
        monkeypatch.setattr(cpu_gemm, "BMM_ATTENTION_MAX_LENGTH", max_length)
        model.zero_grad()
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state * mask[..., None]
        hidden.square().sum().backward()
        results.append((hidden.detach(), model.encoder.layer[0].attention.self.query.weight.grad.clone()))
    for hidden, grad in results[1:]:
        torch.testing.assert_close(hidden, results[0][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(grad, results[0][1], atol=1e-5, rtol=0)
