"""CPU-specific choices for BERT's matrix multiplies, each measured, each switchable.

How fast a CPU runs a matrix multiply depends on which kernel oneDNN (bf16) or MKL (fp32) picks
for its shape, and that differs between CPUs. This project has been measured on two kinds of
2-core machine, and they disagree (`python scripts/bench_gemm.py` and `python scripts/bench.py`
show which behaviour a machine has):

- **With AMX** (Intel; `amx_bf16` in `torch.cpu.get_capabilities()`; oneDNN runs bf16 GEMMs on
  AMX tiles, ~1.9 TFLOP/s on two cores): a bf16 `F.linear` with 768 outputs, bert-base's hidden
  size, runs at about half its usual throughput when its input has between roughly 700 and 1500
  rows. (M, 768) @ (768, 768): 1.2 TFLOP/s at 640 rows, 0.7 from 768 to 1472, 1.3-1.5 from 1536
  on; (M, 3072) @ (3072, 768) drops the same way from 704 to 1,280 rows. There, two threads do
  worse than one: oneDNN's split of the work between them, not the arithmetic, is at fault.
  Multiplying those rows in chunks of at most 640 puts every call back in the fast range (the
  encoder in bf16 ran 10-14% faster on 1,024- and 1,205-row batches). Stacking the query, key and
  value weights into one (3H, H) GEMM also paid there: 254 -> 230 ms on a bf16 8 x 128 batch.
- **Without AMX** (AMD EPYC with AVX-512 BF16, ~0.7 TFLOP/s on two cores): bf16 throughput is
  flat from 256 to 2,048 rows for every shape, so splitting rows only costs (5-8% per call), and
  three separate Q/K/V GEMMs ran as fast as or faster than the stacked one (2-5%, which also
  pays a weight concatenation per call). Attention over short sequences (L <= 128) ran faster as
  two batched GEMMs around a softmax than through `F.scaled_dot_product_attention`'s flash
  kernel (8 x 12 heads x 128 tokens, bf16: 3.7 vs 5.8 ms); from 512 tokens on, SDPA is faster.

Each choice below applies only where it was measured to help; set `AMX_BF16` or
`BMM_ATTENTION_MAX_LENGTH` by hand to try the other one on a new machine. Every path computes the
same dot products (results agree up to floating-point rounding).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _has_amx_bf16() -> bool:
    """Whether this CPU has AMX tiles for bf16 (oneDNN then runs bf16 GEMMs on them)."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)  # public since torch 2.6
    return bool(capabilities is not None and capabilities().get("amx_bf16", False))


AMX_BF16: bool = _has_amx_bf16()

# (in_features, out_features) -> (low, high): on AMX, a bf16 CPU GEMM of that shape with
# low < rows < high is split into chunks of at most `low` rows. Measured for bert-base's two
# 768-output projections (see the module docstring); fp16 was not measured.
SLOW_ROW_WINDOWS: dict[tuple[int, int], tuple[int, int]] = {(768, 768): (640, 1536), (3072, 768): (640, 1344)}

# Sequences up to this length attend through `bmm_attention`'s two batched GEMMs instead of SDPA on
# CPUs without AMX (0 turns it off). Measured on bert-base heads (D = 64), fp32 and bf16.
BMM_ATTENTION_MAX_LENGTH = 128


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the matrix multiply will run in: the autocast dtype when autocast is on."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def _amx_bf16_gemm(device: torch.device, dtype: torch.dtype) -> bool:
    return AMX_BF16 and device.type == "cpu" and dtype == torch.bfloat16


def window_chunks(rows: int, shape: tuple[int, int]) -> int:
    """How many chunks `SLOW_ROW_WINDOWS` splits `rows` into for a GEMM of shape (in, out); 1 = none."""
    window = SLOW_ROW_WINDOWS.get(shape)
    if window is None:
        return 1
    low, high = window
    return math.ceil(rows / low) if low < rows < high else 1


def row_chunks(rows: int, shape: tuple[int, int], device: torch.device, dtype: torch.dtype) -> int:
    """How many chunks to split `rows` into (1 = no split) for a GEMM of shape (in_features, out_features)."""
    return window_chunks(rows, shape) if _amx_bf16_gemm(device, dtype) else 1


def linear_chunked(x: torch.Tensor, layer: nn.Linear, chunks: int) -> torch.Tensor:
    """`layer(x)` for x (..., in_features) -> (..., out_features), its rows multiplied in `chunks` pieces.

    Differentiable (each chunk is an ordinary `F.linear`; the chunks are concatenated).
    """
    if chunks == 1:
        return layer(x)
    rows = x.numel() // x.size(-1)
    flat = x.reshape(rows, x.size(-1))  # (M, in)
    out = torch.cat([F.linear(part, layer.weight, layer.bias) for part in flat.chunk(chunks)])  # (M, out)
    return out.view(*x.shape[:-1], layer.out_features)


def linear_in_row_chunks(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """`layer(x)`, in row chunks where oneDNN's bf16 GEMM is slow on this CPU (see the module docstring)."""
    rows = x.numel() // x.size(-1)
    shape = (layer.in_features, layer.out_features)
    return linear_chunked(x, layer, row_chunks(rows, shape, x.device, _compute_dtype(x)))


def stack_qkv(x: torch.Tensor) -> bool:
    """Whether to compute queries, keys and values from one stacked (3H, H) GEMM for input `x`.

    Yes off the CPU (one wide kernel launch instead of three) and on AMX CPUs in bf16, where it
    measured faster; no on other CPUs, where three GEMMs measured as fast without the per-call
    weight concatenation.
    """
    return x.device.type != "cpu" or _amx_bf16_gemm(x.device, _compute_dtype(x))


def use_bmm_attention(query: torch.Tensor) -> bool:
    """Whether attention over query (..., L, D) should run as two batched GEMMs rather than SDPA."""
    return query.device.type == "cpu" and not AMX_BF16 and query.size(-2) <= BMM_ATTENTION_MAX_LENGTH
