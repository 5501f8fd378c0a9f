"""cpu_gemm: bf16 GEMMs in oneDNN's slow row window run in chunks, with the same results."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from scratchbert import ScratchBertConfig, ScratchBertModel, cpu_gemm

CPU = torch.device("cpu")


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
def test_row_chunks_only_inside_the_measured_window(rows, shape, dtype, device, chunks):
    assert cpu_gemm.row_chunks(rows, shape, device, dtype) == chunks


def count_linear_calls(monkeypatch) -> list[int]:
    calls = []
    original = F.linear

    def spy(x, weight, bias=None):
        calls.append(x.shape[0] if x.dim() == 2 else x.numel() // x.size(-1))
        return original(x, weight, bias)

    monkeypatch.setattr(F, "linear", spy)
    return calls


def test_bf16_chunks_give_the_unsplit_result(monkeypatch):
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


def test_autocast_chunks_and_gradients(monkeypatch):
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


def test_fp32_and_cleared_windows_are_one_plain_call(monkeypatch):
    layer = nn.Linear(768, 768)
    calls = count_linear_calls(monkeypatch)
    out = cpu_gemm.linear_in_row_chunks(torch.randn(1024, 768), layer)
    assert calls == [1024] and out.dtype == torch.float32
    monkeypatch.setattr(cpu_gemm, "SLOW_ROW_WINDOWS", {})
    calls.clear()
    cpu_gemm.linear_in_row_chunks(torch.randn(1024, 768, dtype=torch.bfloat16), layer.to(torch.bfloat16))
    assert calls == [1024]


def test_bert_base_width_layer_in_bf16_splits_its_narrow_gemms(monkeypatch):
    """One bert-base-width layer on 8 x 128 tokens (1,024 rows): both add & norm projections split."""
    torch.manual_seed(0)
    config = ScratchBertConfig(vocab_size=500, num_hidden_layers=1, max_position_embeddings=128)
    model = ScratchBertModel(config, add_pooling_layer=False).eval().to(torch.bfloat16)
    ids = torch.randint(5, 500, (8, 128))
    with torch.no_grad():
        calls = count_linear_calls(monkeypatch)
        split = model(input_ids=ids).last_hidden_state
        assert calls.count(512) == 4  # attention output and feed-forward output, 2 chunks each
        monkeypatch.setattr(cpu_gemm, "SLOW_ROW_WINDOWS", {})
        plain = model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(split.float(), plain.float(), rtol=0.05, atol=0.05)
