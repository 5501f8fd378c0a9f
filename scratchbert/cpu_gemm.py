"""CPU-specific choices for BERT's matrix multiplies, each measured, each switchable.

How fast a CPU runs a matrix multiply depends on which instructions it has and which kernel
oneDNN (bf16) or MKL (fp32) picks for the shape, and that differs between CPUs. This project
has been measured on three kinds of CPU, and they disagree, so each choice below applies only
on the kind of CPU where it measured faster:

- **With AMX** (Intel; `amx_bf16` in `torch.cpu.get_capabilities()`; oneDNN runs bf16 GEMMs on
  AMX tiles): a bf16 `F.linear` with 768 outputs, bert-base's hidden size, slows down when its
  input has between roughly 700 and 1,500 rows (`SLOW_ROW_WINDOWS`). There the rows are
  multiplied in chunks that fall outside the window (`linear_chunked`), and the query, key and
  value weights run as one stacked (3H, H) GEMM (`stack_qkv`).
- **With AVX-512 BF16, no AMX** (AMD EPYC Zen 4): bf16 throughput does not depend on the row
  count, so nothing is split and Q, K and V stay three GEMMs. Attention over short sequences
  (`BMM_ATTENTION_MAX_LENGTH`) runs as two batched GEMMs around a softmax (the model's
  `bmm_attention`) instead of `F.scaled_dot_product_attention`.
- **With no bf16 instructions at all** (AVX2 only, AMD EPYC Zen 3): torch's bf16 GEMM has no
  hardware to run on and is several times slower than fp32. So every bf16 linear layer runs on
  the fp32 kernel over bf16 values (`linear_in_fp32`): inputs and weights rounded to bf16
  exactly as a bf16 GEMM reads them, products and sums in fp32 (as oneDNN's bf16 kernels
  accumulate), the output rounded to bf16 -- a bf16 GEMM's result up to summation order, at
  fp32 speed. Attention in bf16 stays in SDPA, whose CPU kernel computes in fp32 inside; in
  fp32, short sequences use the two batched GEMMs.

The measurements behind each choice, and the commands that reproduce them (`python
scripts/bench_gemm.py`, `python scripts/bench.py`), are in docs/performance.md. Set `AMX_BF16`,
`BF16_UNITS` or `BMM_ATTENTION_MAX_LENGTH` by hand to try another choice on a new machine. Every
path computes the same dot products (results agree up to floating-point rounding).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _cpu_has(*features: str) -> bool:
    """Whether this CPU reports any of `features` in `torch.cpu.get_capabilities()`."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)  # public since torch 2.6
    return capabilities is not None and any(capabilities().get(name, False) for name in features)


def _has_amx_bf16() -> bool:
    """Whether this CPU has AMX tiles for bf16 (oneDNN then runs bf16 GEMMs on them)."""
    return _cpu_has("amx_bf16")


def _has_bf16_units() -> bool:
    """Whether this CPU has bf16 dot-product instructions (AMX tiles or AVX-512 BF16) for oneDNN's bf16 GEMMs."""
    return _cpu_has("amx_bf16", "avx512_bf16")


AMX_BF16: bool = _has_amx_bf16()
BF16_UNITS: bool = _has_bf16_units()

# (in_features, out_features) -> (low, high): on AMX, a bf16 CPU GEMM of that shape with
# low < rows < high is split into chunks of at most `low` rows. Measured for bert-base's two
# 768-output projections (see the module docstring); fp16 was not measured.
SLOW_ROW_WINDOWS: dict[tuple[int, int], tuple[int, int]] = {(768, 768): (640, 1536), (3072, 768): (640, 1344)}

# Sequences up to this length attend through `bmm_attention`'s two batched GEMMs instead of SDPA on
# CPUs without AMX, in fp32, and in bf16 where the CPU has bf16 units (0 turns it off). Measured on
# bert-base heads (D = 64): up to 128 tokens with AVX-512 BF16; on the AVX2-only CPU a bert-base
# forward on 8 x 128 tokens was 8% slower with it (the strided Q/K/V views need copies for `bmm`),
# even from 64 to 96 tokens, and attention alone 20-35% faster below 64.
BMM_ATTENTION_MAX_LENGTH = 128 if BF16_UNITS else 96


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the matrix multiply will run in: the autocast dtype when autocast is on."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def _amx_bf16_gemm(device: torch.device, dtype: torch.dtype) -> bool:
    return AMX_BF16 and device.type == "cpu" and dtype == torch.bfloat16


def bf16_in_fp32(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a bf16 matrix multiply on `device` runs on fp32 kernels: bf16 on a CPU with no bf16 units."""
    return device.type == "cpu" and dtype == torch.bfloat16 and not BF16_UNITS


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


def linear_in_fp32(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """A bf16 `layer(x)` computed by the fp32 kernel: (..., in_features) -> (..., out_features) in bf16.

    x, the weight and the bias are rounded to bf16 (what a bf16 GEMM reads; a no-op for bf16
    tensors), widened to fp32 (exact), multiplied and summed in fp32, and the output rounded to
    bf16. Works with bf16 weights and under bf16 autocast (switched off inside, so the fp32 kernel
    runs); differentiable, and the gradients pass through the same roundings as autocast's.
    """
    bf16 = torch.bfloat16

    def widen(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(bf16).float()

    with torch.autocast(x.device.type, enabled=False):
        out = F.linear(widen(x), widen(layer.weight), widen(layer.bias))  # (..., out) fp32
    return out.to(bf16)


def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """`layer(x)`, (..., in_features) -> (..., out_features), the way this CPU runs it fastest.

    bf16 on a CPU with no bf16 units: on the fp32 kernel (`linear_in_fp32`). bf16 on AMX: in row
    chunks where oneDNN's GEMM is slow for the row count. Otherwise, and off the CPU: `layer(x)`.
    """
    dtype = _compute_dtype(x)
    if bf16_in_fp32(x.device, dtype):
        return linear_in_fp32(x, layer)
    rows = x.numel() // x.size(-1)
    return linear_chunked(x, layer, row_chunks(rows, (layer.in_features, layer.out_features), x.device, dtype))


def stack_qkv(x: torch.Tensor) -> bool:
    """Whether to compute queries, keys and values from one stacked (3H, H) GEMM for input `x`.

    Yes off the CPU (one wide kernel launch instead of three) and on AMX CPUs in bf16, where it
    measured faster; no on other CPUs, where three GEMMs measured as fast without the per-call
    weight concatenation.
    """
    return x.device.type != "cpu" or _amx_bf16_gemm(x.device, _compute_dtype(x))


def use_bmm_attention(query: torch.Tensor) -> bool:
    """Whether attention over query (..., L, D) should run as two batched GEMMs rather than SDPA.

    On CPUs without AMX, for L <= `BMM_ATTENTION_MAX_LENGTH`, in fp32, and in bf16 only where the
    CPU has bf16 units (elsewhere a bf16 `bmm` is many times slower than SDPA's kernel).
    """
    if query.device.type != "cpu" or AMX_BF16 or query.size(-2) > BMM_ATTENTION_MAX_LENGTH:
        return False
    return query.dtype == torch.float32 or (query.dtype == torch.bfloat16 and BF16_UNITS)
